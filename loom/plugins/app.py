"""`App`: your Python code for loom, registered with decorators, and the same object embedded or served.

::

    app = loom.App()

    @app.function("charge")                  # a binding { executor = "python", config = { function = "charge" } }
    async def charge(request, toolbelt):
        return {"charged": request.trigger.payload["total"]}   # the attempt completes with this value

    @app.executor("billing")                 # an executor of your own (the `loom.Executor` protocol)
    class Billing: ...

Embedded: ``open_runtime("loom.db", config=..., plugins=[app])``. Served: ``loom serve --app
module:app`` (or ``app = "module:app"`` in loom.toml) imports the module and registers the same
object, so its functions run under the same leases, fencing, retries, waits and recovery in both.

A function is ``async def f(request, toolbelt)`` or a plain ``def f(request, toolbelt)`` (run in a worker
thread; it cannot be interrupted, so an interrupt waits for it to return). It returns an outcome
(`Completed`, `Failed`, `Handoff`, `Waiting`) or any JSON value, which completes the attempt with it as
its result (``None`` too). An exception fails the attempt with its reason (logged with its traceback,
and a diagnostic), and the retry policy applies. A process that dies in the middle of a function takes
the function with it: the attempt is recovered as not adoptable and retried under its policy.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar, cast

import trio

from ..config import Config
from ..records.errors import InvalidRequest, StaleAuthority
from ..records.executor import Toolbelt
from ..records.waits import Waiting
from ..records.work import Completed, Failed, Handoff, Outcome, RunRequest
from ._manager import hookimpl
from .python_executor import Function, PythonExecutor

T = TypeVar("T")

PYTHON = "python"


def _outcome_of(answer: object) -> Outcome:
    if isinstance(answer, Completed | Failed | Handoff | Waiting):
        return answer
    return Completed(value=answer)


def _adapt(function: Callable[..., Any]) -> Function:
    """``function`` as the python executor runs it: async, answering an outcome."""
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def run_async(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
            return _outcome_of(await function(request, toolbelt))

        return run_async

    @functools.wraps(function)
    async def run_in_thread(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        threaded = cast(Toolbelt, _FromThread(toolbelt))
        return _outcome_of(await trio.to_thread.run_sync(function, request, threaded))

    return run_in_thread


class _FromThread:
    """The toolbelt as a plain ``def`` function sees it, in its worker thread. Each async method,
    called there, runs in trio's thread and answers its result: ``toolbelt.emit(event)`` emits (the
    toolbelt's own would answer a coroutine that never runs, emitting nothing). Called in trio's
    thread, as ``trio.from_thread.run(toolbelt.emit, event)`` calls it, it answers the coroutine."""

    def __init__(self, toolbelt: Toolbelt) -> None:
        self._toolbelt = toolbelt

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._toolbelt, name)
        if not inspect.iscoroutinefunction(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            if trio.lowlevel.in_trio_run():
                return value(*args, **kwargs)
            try:
                return trio.from_thread.run(functools.partial(value, *args, **kwargs))
            except trio.Cancelled:
                # the call runs in the attempt's task, whose observation stopped: the attempt was
                # cancelled, parked, lost its lease or its runtime is closing. Its function is told
                # as the fence would tell it (a Cancelled is no exception it could catch as one)
                raise StaleAuthority(
                    f"toolbelt.{name}: this attempt was stopped (cancelled, parked, its lease lost, or"
                    " its runtime closing): it can no longer act"
                ) from None

        return call


def _unused(call: str, name: str, registered: Collection[str]) -> None:
    """Two registrations under one name would leave one of them never run, in silence."""
    if name in registered:
        raise InvalidRequest(
            f"{call}: something is registered under {name!r} already: give each its own name"
        )


def _name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest(f"App.{kind}: the name must be a non-empty string, got {name!r}", field="name")
    return name


class App:
    """Python code for loom (see the module): functions for the ``python`` executor, executors, route
    handlers, start and call gates, registered by name with decorators. Give it to
    ``open_runtime(plugins=[app])``, or serve it with ``loom serve --app module:app``.

    ``config``: the configuration ``loom serve --app`` uses when it finds no configuration file
    (``--config``, ``LOOM_CONFIG``, ``./loom.toml``)."""

    def __init__(self, *, config: Config | None = None, python_executor: str = PYTHON) -> None:
        if config is not None and not isinstance(config, Config):
            raise InvalidRequest(
                f"App: config must be a loom.Config, got {type(config).__name__}", field="config"
            )
        self.config = config
        self._python = PythonExecutor(_name("python_executor", python_executor))
        self._executors: dict[str, Any] = {}
        self._handlers: dict[str, Any] = {}
        self._start_gates: dict[str, Any] = {}
        self._call_gates: dict[str, Any] = {}

    @property
    def functions(self) -> tuple[str, ...]:
        """The names of the registered functions."""
        return tuple(sorted(self._python._functions))

    @property
    def python(self) -> PythonExecutor:
        """The executor that runs the functions (its ``inbox`` holds a running attempt's injected input)."""
        return self._python

    def function(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Register a function under ``name``, for bindings ``{executor = "python", config = {function =
        "<name>"}}``; returns the function unchanged."""
        name = _name("function", name)

        def register(function: Callable[..., T]) -> Callable[..., T]:
            if not callable(function):
                raise InvalidRequest(
                    f"App.function({name!r}): {function!r} is not callable", field="function"
                )
            _unused(f"App.function({name!r})", name, self.functions)
            self._python.register(name, _adapt(function))
            return function

        return register

    def executor(self, name: str) -> Callable[[T], T]:
        """Register an executor (an object with ``launch``, ``inject``, ``interrupt`` and
        ``capabilities``; a class is instantiated with no arguments) under ``name``."""
        name = _name("executor", name)

        def register(executor: T) -> T:
            instance = executor() if isinstance(executor, type) else executor
            missing = [
                m for m in ("launch", "inject", "interrupt", "capabilities") if not hasattr(instance, m)
            ]
            if missing:
                raise InvalidRequest(
                    f"App.executor({name!r}): {type(instance).__name__} has no {', '.join(missing)}"
                    " (see loom.Executor)",
                    field="executor",
                )
            _unused(f"App.executor({name!r})", name, self._executors)
            self._executors[name] = instance
            return executor

        return register

    def route_handler(self, name: str, *, pure: bool = False) -> Callable[[T], T]:
        """Register a route handler ``(event, scope, work, route) -> Deliver | Drop | Unmatched``.

        ``pure``: it is a pure function of its arguments (synchronous, no I/O), so loom may decide it
        inside the routing transaction, a batch of Events per commit (docs/plugins.md)."""
        register = self._register("route_handler", self._handlers, name)
        if not pure:
            return register

        def register_pure(item: T) -> T:
            registered = register(item)
            registered.pure = True  # type: ignore[attr-defined]
            return registered

        return register_pure

    def start_gate(self, name: str) -> Callable[[T], T]:
        """Register a start gate, asked before a Work's first attempt."""
        return self._register("start_gate", self._start_gates, name)

    def call_gate(self, name: str) -> Callable[[T], T]:
        """Register a call gate ``(GatedCall) -> None | RefuseCall | WaitForCall``."""
        return self._register("call_gate", self._call_gates, name)

    def _register(self, kind: str, table: dict[str, Any], name: str) -> Callable[[T], T]:
        name = _name(kind, name)

        def register(item: T) -> T:
            if not callable(item):
                raise InvalidRequest(f"App.{kind}({name!r}): {item!r} is not callable", field=kind)
            _unused(f"App.{kind}({name!r})", name, table)
            table[name] = item
            return item

        return register

    # -- what the plugin manager asks --------------------------------------------------------------------

    @hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        offered: dict[str, Any] = {self._python.name: self._python} if self._python._functions else {}
        return {**offered, **self._executors}

    @hookimpl
    def loom_route_handlers(self) -> Mapping[str, Any]:
        return dict(self._handlers)

    @hookimpl
    def loom_start_gates(self) -> Mapping[str, Any]:
        return dict(self._start_gates)

    @hookimpl
    def loom_call_gates(self) -> Mapping[str, Any]:
        return dict(self._call_gates)

    def __repr__(self) -> str:
        parts = [f"functions={list(self.functions)}"] if self.functions else []
        parts += [f"executors={sorted(self._executors)}"] if self._executors else []
        return f"App({', '.join(parts)})"
