"""The executor contract plugins implement.

``launch`` runs an attempt and returns its outcome; ``inject`` answers ``None`` (accepted
for delivery, never consumed), raises `NotAccepting` (definitely not delivered), or raises
anything else (ambiguous: retried with the same intent identity); ``interrupt`` stops the
attempt's process.

Two optional methods (looked up on the executor; an executor without them cannot do that):

* ``resume(request, toolbelt) -> Outcome`` continues a parked attempt after its wake (``request.resumed``
  and the winner as ``request.trigger``); without it, ``launch`` is called.
* ``recover(request, toolbelt, metadata) -> Outcome`` verifies an attempt whose lease expired, from the
  opaque ``metadata`` it pinned (``toolbelt.pin``), and observes it to its outcome. It must call
  ``toolbelt.adopt()`` once it has verified the process, before any other toolbelt call (the adoption
  replaces the old credentials with the recoverer's); a finished result may be returned at once. It
  raises `NotAdoptable` when it cannot verify: the attempt then fails and the retry policy applies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .events import Event, EventIn
from .timers import Timer, TimerSpec
from .work import Lease, Outcome, RunRequest, Work


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


@runtime_checkable
class Executor(Protocol):
    capabilities: Collection[str]

    async def launch(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome: ...

    async def inject(self, execution_id: str, event: Event) -> None: ...

    async def interrupt(self, execution_id: str) -> None: ...
