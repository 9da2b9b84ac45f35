"""The `Driver` protocol the shared scenarios drive, and `RuntimeDriver`, loom's own.

A driver hides how a runtime is opened and reopened: the same scenario runs against
SQLite ``:memory:`` and against a file that is closed and reopened between steps.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Protocol

import trio

from .. import (
    CausalRejection,
    Checkpoint,
    Config,
    Event,
    EventIn,
    ManualClock,
    Runtime,
    hookimpl,
    open_runtime,
)
from ..runtime import ACTORS, DEFAULT_LEASE_MS, DEFAULT_RESYNC_MS
from ..runtime._open import unwrapped
from ..store import FaultHook
from ._fake import FakeExecutor
from ._scenario import ScenarioFailure

Handler = Callable[..., Any]

STALL_SECONDS = 20.0

Check = Callable[[], Awaitable[bool] | bool]
"""A condition a test waits for: a function answering whether it holds, plain or async."""
"""A wait that sees no progress this long (real time) fails the scenario as stalled."""


class ScenarioHandlers:
    """Route handler ``scenario``: dispatches to ``table[route.config["fn"]]``, set by scenarios."""

    def __init__(self) -> None:
        self.table: dict[str, Handler] = {}
        self._called = trio.Event()

    @hookimpl
    def loom_route_handlers(self) -> Mapping[str, Any]:
        return {"scenario": self._dispatch}

    def call_signal(self) -> trio.Event:
        """An event set when a handler has run (a plain one returned, an async one reached its first
        wait or its end): take it before looking at what handlers saw, so a call in between is never
        missed. A handler's reads commit nothing, so no notice tells a waiter about them."""
        return self._called

    def _signal(self) -> None:
        called, self._called = self._called, trio.Event()
        called.set()

    def _dispatch(self, event: Event, scope: str, work: Any, route: Any) -> Any:
        name = route.route.config.get("fn")
        handler = self.table.get(name) if isinstance(name, str) else None
        if handler is None:
            raise LookupError(f"scenario handler {name!r} is not set")
        try:
            result = handler(event, scope, work, route)
        except BaseException:
            self._signal()
            raise
        if inspect.isawaitable(result):
            return self._signalled(result)
        self._signal()
        return result

    async def _signalled(self, awaitable: Awaitable[Any]) -> Any:
        # set now, seen once this task waits: by then the handler has run up to its first wait
        self._signal()
        try:
            return await awaitable
        finally:
            self._signal()


T0_MS = 1_767_225_600_000
"""2026-01-01T00:00:00Z: where every scenario's ManualClock starts."""


class Driver(Protocol):
    """What a shared scenario needs from a runtime under test.

    ``runtime`` offers the `Runtime` host API; ``fake`` is the test executor ``fake`` and
    ``handlers`` the table behind route handler ``scenario``.
    """

    clock: ManualClock
    fake: FakeExecutor
    handlers: ScenarioHandlers

    @property
    def runtime(self) -> Runtime: ...

    async def configure(self, config: Config) -> Config:
        """Put ``config`` in force as the next generation (kept across reopens)."""
        ...

    async def settle(self) -> None:
        """Wait until no routing, start or dispatch work is in flight."""
        ...

    async def until(self, check: Check, what: str) -> None:
        """Wait, on commits and launches (never on a timer), until ``check()`` holds."""
        ...

    async def publish(self, event: EventIn) -> Event:
        """Durably accept an external root Event."""
        ...

    async def derive(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        """Accept an Event derived from trusted authority ``parent_id``; raise CausalRefused when refused."""
        ...

    async def event(self, event_id: str) -> Event: ...

    async def events_of_root(self, root_id: str) -> list[Event]: ...

    async def causal_rejections(self) -> list[CausalRejection]: ...

    async def reopen(self) -> None:
        """Close and reopen the store (a no-op where the store does not survive a close)."""
        ...


class RuntimeDriver:
    """Drives a real `Runtime`, optionally on a file it can close and reopen.

    Use as ``async with RuntimeDriver.open(path_or_memory) as driver:``; the runtime runs
    in a background task so `reopen` can stop it and start a new one on the same file.
    ``settle`` and ``until`` use the runtime's public quiescence and notices only.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        store: str,
        *,
        clock: ManualClock | None = None,
        config: Config | None = None,
        plugins: Iterable[object] = (),
        fault: FaultHook | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        actors: Iterable[str] = ACTORS,
        resync_ms: int = DEFAULT_RESYNC_MS,
        stall_s: float = STALL_SECONDS,
    ) -> None:
        self._nursery = nursery
        self.stall_s = stall_s
        self.fault = fault
        self.resync_ms = resync_ms
        self.actors = tuple(actors)
        self.lease_ms = lease_ms
        self.store = store
        self.clock = clock if clock is not None else ManualClock(start_ms=T0_MS)
        self.config = config if config is not None else Config()
        self.fake = FakeExecutor()
        self.handlers = ScenarioHandlers()
        self.plugins = (self.fake, self.handlers, *plugins)
        self._rt: Runtime | None = None
        self._stop: trio.CancelScope | None = None
        self._stopped: trio.Event | None = None
        self.reopens = 0

    @property
    def reopenable(self) -> bool:
        return self.store != ":memory:"

    @property
    def runtime(self) -> Runtime:
        assert self._rt is not None, "the driver's runtime is not running"
        return self._rt

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        store: str,
        *,
        clock: ManualClock | None = None,
        start_ms: int | None = None,
        config: Config | None = None,
        plugins: Iterable[object] = (),
        fault: FaultHook | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        actors: Iterable[str] = ACTORS,
        resync_ms: int = DEFAULT_RESYNC_MS,
        stall_s: float = STALL_SECONDS,
    ) -> AsyncIterator[RuntimeDriver]:
        """A started driver on ``store`` (a path or ``":memory:"``), stopped on the way out.

        ``start_ms`` starts a fresh `ManualClock` there (default: `T0_MS`) unless ``clock`` is given;
        ``actors`` picks the background actors as `open_runtime` does (every reopen starts the same).
        ``stall_s``: how long `settle` and `until` wait without the condition before they fail the
        scenario (a negative control that expects a stall can make it short).
        """
        if clock is None:
            clock = ManualClock(start_ms=T0_MS if start_ms is None else start_ms)
        # (a lone exception, the test's own assertion or the crash point that stopped the runtime,
        # comes out as itself, as from `open_runtime`)
        async with unwrapped(), trio.open_nursery() as nursery:
            driver = cls(
                nursery,
                store,
                clock=clock,
                config=config,
                plugins=plugins,
                fault=fault,
                lease_ms=lease_ms,
                actors=actors,
                resync_ms=resync_ms,
                stall_s=stall_s,
            )
            await driver.start()
            try:
                yield driver
            finally:
                await driver.stop()

    async def start(self) -> None:
        self._rt = await self._nursery.start(self._serve)

    async def _serve(self, *, task_status: trio.TaskStatus[Runtime]) -> None:
        stopped = self._stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                self._stop = scope
                async with open_runtime(
                    self.store,
                    clock=self.clock,
                    config=self.config,
                    plugins=self.plugins,
                    load_entry_points=False,
                    fault=self.fault,
                    lease_ms=self.lease_ms,
                    actors=self.actors,
                    resync_ms=self.resync_ms,
                ) as rt:
                    task_status.started(rt)
                    await trio.sleep_forever()
        finally:
            stopped.set()

    async def stop(self) -> None:
        if self._stop is not None and self._stopped is not None:
            self._stop.cancel()
            await self._stopped.wait()
        self._rt = None

    async def reopen(self) -> None:
        if not self.reopenable:
            return
        await self.stop()
        await self.start()
        self.reopens += 1

    # -- the Driver protocol ---------------------------------------------

    async def configure(self, config: Config) -> Config:
        self.config = self.runtime.reload(config)
        return self.config

    async def settle(self) -> None:
        with trio.move_on_after(self.stall_s) as scope:
            await self.runtime.wait_idle()
        if scope.cancelled_caught:
            raise ScenarioFailure("the runtime did not settle: work stayed in flight")

    async def until(self, check: Check, what: str) -> None:
        async with self.runtime.watch() as notices:
            with trio.move_on_after(self.stall_s) as scope:
                while True:
                    launched = self.fake.launch_signal()  # before the check: a launch after it is seen
                    handled = self.handlers.call_signal()  # likewise a route handler's call
                    if await _holds(check):
                        break
                    async with trio.open_nursery() as nursery:

                        async def on_commit() -> None:
                            await notices.__anext__()
                            nursery.cancel_scope.cancel()

                        nursery.start_soon(on_commit)
                        nursery.start_soon(_cancel_when_set, launched, nursery.cancel_scope)
                        nursery.start_soon(_cancel_when_set, handled, nursery.cancel_scope)
            if scope.cancelled_caught:
                raise ScenarioFailure(f"timed out waiting for {what}")

    async def publish(self, event: EventIn) -> Event:
        return await self.runtime.publish(event)

    async def derive(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        return await self.runtime.publish_derived(event, parent_id=parent_id, cause_id=cause_id)

    async def event(self, event_id: str) -> Event:
        return await self.runtime.event(event_id)

    async def events_of_root(self, root_id: str) -> list[Event]:
        return await self.runtime.events(root_id=root_id, limit=100_000)

    async def causal_rejections(self) -> list[CausalRejection]:
        return await self.runtime.causal_rejections(limit=100_000)


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _holds(check: Check) -> bool:
    """What ``check`` answers now, awaited when it is async."""
    answer = check()
    return bool(await answer) if inspect.isawaitable(answer) else bool(answer)


async def until_committed(rt: Runtime, check: Check, what: str, *, stall_s: float = STALL_SECONDS) -> None:
    """Wait on ``rt``'s commits (never on a timer) until ``check()`` holds; fail with
    `ScenarioFailure` naming ``what`` if ``stall_s`` pass without it."""
    async with rt.watch() as notices:
        with trio.move_on_after(stall_s) as scope:
            while not await _holds(check):
                await notices.__anext__()
        if scope.cancelled_caught:
            raise ScenarioFailure(f"timed out waiting for {what}")


async def wait_routed(driver: Driver, *events: Event) -> list[Checkpoint]:
    """Wait (on commits, never a timer) until every Event has its routing checkpoint; return them."""

    async def check() -> bool:
        return all([await driver.runtime.checkpoint(e.id) is not None for e in events])

    await driver.until(check, f"events {[e.delivery_id for e in events]} to be routed")
    checkpoints = [await driver.runtime.checkpoint(e.id) for e in events]
    return [cp for cp in checkpoints if cp is not None]
