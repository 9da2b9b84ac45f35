"""The python executor: runs async callables an embedder registers by name.

A binding ``{executor = "python", config = {function = "name"}}`` runs the callable
``name(request, toolbelt) -> Outcome``. It supports inject (inputs arrive on
`inbox(execution_id)`) and interrupt (the call is cancelled).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from ..records.errors import InvalidRequest, NotAccepting
from ..records.events import Event
from ..records.executor import Toolbelt
from ..records.work import Failed, Outcome, RunRequest
from ._manager import hookimpl

Function = Callable[[RunRequest, Toolbelt], Awaitable[Outcome]]


INBOX_SIZE = 1000
"""Injected inputs a running call may leave unread before `inject` answers `NotAccepting`."""


@attrs.define(eq=False)
class _Running:
    scope: trio.CancelScope
    finished: trio.Event = attrs.Factory(trio.Event)
    send: trio.MemorySendChannel[Event] | None = None
    receive: trio.MemoryReceiveChannel[Event] | None = None

    def inbox(self) -> tuple[trio.MemorySendChannel[Event], trio.MemoryReceiveChannel[Event]]:
        """The call's inbox, made at its first use (most calls never have one)."""
        if self.send is None or self.receive is None:
            self.send, self.receive = trio.open_memory_channel[Event](INBOX_SIZE)
        return self.send, self.receive


class PythonExecutor:
    """Register with ``plugins=[executor]``; it offers itself as executor ``name``."""

    capabilities = frozenset({"inject", "interrupt"})

    def __init__(self, name: str = "python") -> None:
        self.name = name
        self._functions: dict[str, Function] = {}
        self._running: dict[str, _Running] = {}

    def register(self, name: str, function: Function) -> None:
        if not name:
            raise InvalidRequest("PythonExecutor.register: name must be non-empty")
        self._functions[name] = function

    def function(self, name: str) -> Callable[[Function], Function]:
        """Decorator form of `register`."""

        def decorate(function: Function) -> Function:
            self.register(name, function)
            return function

        return decorate

    @hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        return {self.name: self}

    def check_config(self, config: Mapping[str, Any]) -> list[str]:
        """What `loom config check` (and ``loom serve`` at its start) reports of a binding's ``config``:
        a ``function`` that names no function registered here. Not a refusal: a node may route Work
        it never runs, and a function may be registered after the runtime opened."""
        name = config.get("function")
        known = ", ".join(repr(n) for n in sorted(self._functions)) or "none"
        if not isinstance(name, str) or not name:
            return [f"function: names no function of the python executor (registered: {known})"]
        if name not in self._functions:
            return [
                f"function: no function is registered as {name!r} (registered: {known}): every attempt fails"
            ]
        return []

    def inbox(self, execution_id: str) -> trio.MemoryReceiveChannel[Event]:
        """Injected inputs of a running execution, in dispatch order."""
        running = self._running.get(execution_id)
        if running is None:
            raise NotAccepting(f"execution {execution_id} is not running in this executor")
        return running.inbox()[1]

    async def launch(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        name = request.config.get("function")
        function = self._functions.get(name) if isinstance(name, str) else None
        if function is None:
            return Failed(error=f"python executor: no function registered as {name!r}")
        running = _Running(trio.CancelScope())
        self._running[request.execution_id] = running
        try:
            with running.scope:
                return await function(request, toolbelt)
            return Failed(error="interrupted")
        finally:
            del self._running[request.execution_id]
            if running.send is not None:
                running.send.close()
            running.finished.set()

    async def inject(self, execution_id: str, event: Event) -> None:
        running = self._running.get(execution_id)
        if running is None:
            raise NotAccepting(f"execution {execution_id} is not running in this executor")
        try:
            running.inbox()[0].send_nowait(event)
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            raise NotAccepting(f"execution {execution_id} does not accept input now") from None

    async def interrupt(self, execution_id: str) -> None:
        """Cancel the call and return once it has stopped: no replacement overlaps it."""
        running = self._running.get(execution_id)
        if running is not None:
            running.scope.cancel()
            await running.finished.wait()
