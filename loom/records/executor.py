"""The executor contract plugins implement.

``launch`` runs an attempt and returns its outcome; ``inject`` answers ``None`` (accepted
for delivery, never consumed), raises `NotAccepting` (definitely not delivered), or raises
anything else (ambiguous: retried with the same intent identity); ``interrupt`` stops the
attempt's process.

Optional methods (looked up on the executor; an executor without them cannot do that):

* ``resume(request, toolbelt) -> Outcome`` continues a parked attempt after its wake (``request.resumed``
  and the winner as ``request.trigger``); without it, ``launch`` is called.
* ``logs(execution_id, metadata, *, tail) -> Mapping[str, str]`` reads what an attempt wrote (its
  ``stdout`` and ``stderr``: the last ``tail`` bytes of each), from the ``metadata`` it pinned; it
  raises `NotFound` when they are gone. Without it, the executor keeps no logs of its attempts.
* ``recover(request, toolbelt, metadata) -> Outcome`` verifies an attempt whose lease expired, from the
  opaque ``metadata`` it pinned (``toolbelt.pin``), and observes it to its outcome. It must call
  ``toolbelt.adopt()`` once it has verified the process, before any other toolbelt call (the adoption
  replaces the old credentials with the recoverer's); a finished result may be returned at once. It
  raises `NotAdoptable` when it cannot verify: the attempt then fails and the retry policy applies.
* ``validate_config(config) -> None`` checks a binding's ``config`` (plain, not async) whenever a
  configuration naming the executor is loaded: at a runtime's open, at each reload (``loom serve``'s
  start and SIGHUP), by ``loom config check``. It raises `ConfigError` (its ``key`` the key of ``config``
  that is wrong, such as ``command``) or `InvalidRequest` (its ``field``), and the configuration is
  refused naming ``scopes.<scope>.bindings.<name>.config.<key>``. Without it, any JSON config loads, and
  a bad one is found by the attempts it fails.
* ``check_config(config) -> list[str]`` (plain, not async) what is wrong with a binding's ``config`` that
  does not refuse it (a name not registered yet): ``loom config check`` and ``loom serve``'s start
  report each line as a warning under the binding's key (`Runtime.check`).
* ``forget(execution_id, metadata) -> None`` removes what the executor keeps of an ended attempt (its
  logs, its files) once the ``attempt_logs`` retention passed; it must be idempotent (a crash before the
  runtime records it asks again). Without it, the executor keeps nothing loom asks it to remove.
* ``lingering() -> Collection[str]`` and ``end_lingering(execution_id, metadata, config) -> None``,
  together: at a runtime's start, the execution ids of attempts whose processes run unwatched on this
  machine (a loom that died left them), and the stop of what runs of one of them. The runtime asks the
  stop only for an attempt of its store, of this executor, that has ended (a running one is left to
  its recovery), with the ``metadata`` it pinned and its binding's ``config``; it must touch nothing
  that ``metadata`` does not name (another store's attempt may have the same id).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from .events import Event, EventIn
from .timers import Timer, TimerSpec
from .waits import WaitSpec
from .work import Lease, Outcome, RunRequest, Work


@attrs.frozen(kw_only=True)
class AttemptLogs:
    """What one attempt wrote (`Runtime.attempt_logs`): each stream's text (its end, when it is long)."""

    work_id: str
    attempt: int
    execution_id: str
    executor: str | None
    logs: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class GatedCall:
    """A toolbelt call as a call gate sees it, before it runs (``args`` is a detached copy)."""

    operation: str
    """``emit``, ``create_child``, ``arm_timer``, or an executor's own operation (`Toolbelt.gated`)."""
    args: Mapping[str, Any] = attrs.field(factory=dict, hash=False)
    work_id: str
    execution_id: str
    attempt: int
    scope: str
    kind: str | None


@attrs.frozen(kw_only=True)
class RefuseCall:
    """A gate's answer: refuse the call (it raises `CallRefused` with ``reason``; nothing changes)."""

    reason: str


@attrs.frozen(kw_only=True)
class WaitForCall:
    """A gate's answer: turn the call into a wait on ``wait`` (registered under the attempt's fence,
    exactly as a `Waiting` outcome is); the call raises `CallParked`."""

    wait: WaitSpec


GateAnswer = RefuseCall | WaitForCall | None
"""``None`` lets the call run."""


class Toolbelt(Protocol):
    """The fenced API a running execution uses; every call presents its lease."""

    @property
    def lease(self) -> Lease: ...

    async def emit(self, event: EventIn, *, cause_id: str | None = None) -> Event: ...

    async def create_child(self, name: str, *, keys: Sequence[str] = (), kind: str | None = None) -> Work: ...

    async def arm_timer(self, spec: TimerSpec) -> Timer: ...

    async def heartbeat(self) -> None: ...

    async def pin(self, metadata: Mapping[str, Any]) -> None: ...

    async def adopt(self) -> None: ...

    async def gated(self, operation: str, args: Mapping[str, Any] | None = None) -> None: ...


@runtime_checkable
class Executor(Protocol):
    capabilities: Collection[str]

    async def launch(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome: ...

    async def inject(self, execution_id: str, event: Event) -> None: ...

    async def interrupt(self, execution_id: str) -> None: ...
