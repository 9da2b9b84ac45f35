"""`FakeExecutor`: a test executor whose capabilities a scenario sets, and whose launches,
injections and interrupts it controls and observes."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from .. import Completed, Event, Failed, NotAccepting, NotAdoptable, NotFound, RunRequest, Toolbelt, hookimpl
from ..records.work import Lease, Outcome


class InjectAnswer(enum.StrEnum):
    ACCEPT = "accept"
    NOT_ACCEPTING = "not_accepting"
    AMBIGUOUS = "ambiguous"


class RecoverAnswer(enum.StrEnum):
    """How the fake answers `recover` for a Work (`FakeExecutor.recover_answers`)."""

    ADOPT = "adopt"
    """It verifies the process: adopts the attempt, which then runs (finish it as a launch)."""
    NOT_ADOPTABLE = "not_adoptable"
    """It cannot verify the process (the default)."""


@attrs.define(eq=False)
class Launch:
    """One launch the fake saw; finish it with `FakeExecutor.finish`."""

    request: RunRequest
    toolbelt: Toolbelt
    lease: Lease
    """The lease as it was handed over (its token stays the attempt's old credential after a recovery)."""
    recovered: bool = False
    """Started by `recover` (an adoption), not by `launch`."""
    metadata: Mapping[str, Any] = attrs.Factory(dict)
    """What `recover` was given: the metadata the attempt pinned."""
    done: trio.Event = attrs.Factory(trio.Event)
    outcome: Outcome | None = None
    answered: bool = False
    """`finish` gave the outcome (which a test may make anything, to play a misbehaving executor)."""
    interrupted: bool = False
    cancelled: bool = False
    """The runtime stopped observing it (its lease was lost, or the runtime closed)."""


class FakeExecutor:
    """Executor ``fake``: launches block until the scenario finishes them (or finish at once
    when ``auto_complete`` is set)."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.capabilities: set[str] = set()
        self.auto_complete = False
        self.launches: list[Launch] = []
        self.injected: list[tuple[str, str]] = []
        self.interrupted: list[str] = []
        self.inject_answers: list[InjectAnswer] = []
        self.launch_gates: dict[str, trio.Event] = {}
        """Launches of these Work ids block until their event is set."""
        self.inject_gate: trio.Event | None = None
        """When set, every inject blocks on it (an acknowledgement in flight)."""
        self.on_inject: Callable[[str, Event], Awaitable[None]] | None = None
        self.recover_answers: dict[str, RecoverAnswer | Outcome] = {}
        """By Work id: how `recover` answers (an `Outcome`: the attempt already finished with it)."""
        self.pin: dict[str, Any] | None = None
        """When set, every launch pins this metadata (with ``"work"`` and ``"attempt"`` added) first."""
        self.recover_gates: dict[str, trio.Event] = {}
        """Recoveries of these Work ids verify only once their event is set."""
        self.recovered: list[tuple[str, RecoverAnswer | Outcome]] = []
        """Every `recover` call: the execution id and the answer given."""
        self._launched = trio.Event()

    @hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        return {self.name: self}

    async def launch(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        if self.pin is not None:
            await toolbelt.pin({**self.pin, "work": request.work_id, "attempt": request.attempt})
        launch = Launch(request, toolbelt, toolbelt.lease)
        self.launches.append(launch)
        self._signal()
        gate = self.launch_gates.get(request.work_id)
        if gate is not None:
            await gate.wait()
        return await self._observe(launch)

    async def _observe(self, launch: Launch) -> Outcome:
        if self.auto_complete:
            return Completed()
        try:
            await launch.done.wait()
        except trio.Cancelled:
            launch.cancelled = True
            raise
        if launch.answered:
            return launch.outcome  # type: ignore[return-value]  # whatever the test said, as it is
        return Failed(error="interrupted")

    async def recover(self, request: RunRequest, toolbelt: Toolbelt, metadata: Mapping[str, Any]) -> Outcome:
        """Answer as `recover_answers` says for the Work (`RecoverAnswer.NOT_ADOPTABLE` by default)."""
        answer = self.recover_answers.get(request.work_id, RecoverAnswer.NOT_ADOPTABLE)
        self.recovered.append((request.execution_id, answer))
        self._signal()
        gate = self.recover_gates.get(request.work_id)
        if gate is not None:
            await gate.wait()
        if answer is RecoverAnswer.NOT_ADOPTABLE:
            raise NotAdoptable(f"fake executor: cannot verify execution {request.execution_id}")
        if not isinstance(answer, RecoverAnswer):
            return answer  # a finished detached result: it commits under the recoverer's lease
        await toolbelt.adopt()
        launch = Launch(request, toolbelt, toolbelt.lease, recovered=True, metadata=dict(metadata))
        self.launches.append(launch)
        self._signal()
        return await self._observe(launch)

    async def next_launch(self) -> None:
        """Return at the next launch (or inject/interrupt call) the fake sees."""
        await self._launched.wait()

    def launch_signal(self) -> trio.Event:
        """An event set at the next launch (or inject/interrupt call): take it before looking at what
        has launched, so a launch in between is never missed."""
        return self._launched

    def _signal(self) -> None:
        launched, self._launched = self._launched, trio.Event()
        launched.set()

    def running(self, work_id: str) -> Launch:
        """The unfinished launch of ``work_id`` (the most recent)."""
        for launch in reversed(self.launches):
            if launch.request.work_id == work_id and not launch.done.is_set() and not launch.cancelled:
                return launch
        raise NotFound(f"fake executor: no running launch for work {work_id}")

    def launches_of(self, work_id: str) -> list[Launch]:
        return [launch for launch in self.launches if launch.request.work_id == work_id]

    def finish(self, work_id: str, outcome: Outcome) -> Launch:
        launch = self.running(work_id)
        launch.outcome = outcome
        launch.answered = True
        launch.done.set()
        return launch

    async def inject(self, execution_id: str, event: Event) -> None:
        if self.on_inject is not None:
            await self.on_inject(execution_id, event)
        if self.inject_gate is not None:
            await self.inject_gate.wait()
        self._signal()
        answer = self.inject_answers.pop(0) if self.inject_answers else InjectAnswer.ACCEPT
        if answer is InjectAnswer.NOT_ACCEPTING:
            raise NotAccepting(f"fake executor: execution {execution_id} does not accept input")
        if answer is InjectAnswer.AMBIGUOUS:
            raise ConnectionError(f"fake executor: lost the answer for execution {execution_id}")
        self.injected.append((execution_id, event.id))

    async def interrupt(self, execution_id: str) -> None:
        self.interrupted.append(execution_id)
        self._signal()
        for launch in self.launches:
            if launch.request.execution_id == execution_id and not launch.done.is_set():
                launch.interrupted = True
                launch.done.set()
