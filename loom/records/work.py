"""Records for Work, routing decisions, executions, leases and outcomes.

States are `StrEnum`s with explicit transition tables; an illegal transition raises.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Mapping
from typing import Any

import attrs

from .events import Event, JSONObject
from .frozen import freeze, frozen_object, frozen_optional_object
from .reprs import with_instants
from .states import Lifecycle
from .waits import Waiting


class Capability(enum.StrEnum):
    """An executor capability that a binding may pin."""

    INJECT = "inject"
    INTERRUPT = "interrupt"
    RESUME = "resume"
    ADOPT = "adopt"


class Policy(enum.StrEnum):
    """What a route does with an Event for Work that has a running attempt."""

    QUEUE = "queue"
    INJECT = "inject"
    INTERRUPT = "interrupt"
    DROP = "drop"

    @property
    def capability(self) -> Capability | None:
        """The executor capability this policy needs, if any."""
        if self is Policy.INJECT:
            return Capability.INJECT
        if self is Policy.INTERRUPT:
            return Capability.INTERRUPT
        return None

    @property
    def is_terminal(self) -> bool:
        """Queue and drop need no capability, so a fallback chain ends at them."""
        return self.capability is None


class WorkState(enum.StrEnum):
    READY = "ready"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return WORK_LIFECYCLE.terminal(self)


WORK_LIFECYCLE = Lifecycle[WorkState](
    "work",
    {
        WorkState.READY: frozenset(
            {WorkState.RUNNING, WorkState.COMPLETED, WorkState.CANCELLED, WorkState.FAILED}
        ),
        WorkState.RUNNING: frozenset(
            {WorkState.READY, WorkState.WAITING, WorkState.COMPLETED, WorkState.CANCELLED, WorkState.FAILED}
        ),
        WorkState.WAITING: frozenset({WorkState.READY, WorkState.RUNNING, WorkState.CANCELLED}),
        WorkState.COMPLETED: frozenset(),
        WorkState.CANCELLED: frozenset(),
        WorkState.FAILED: frozenset(),
    },
)


class ExecutionState(enum.StrEnum):
    RUNNING = "running"
    STOPPING = "stopping"
    """Fenced by an interrupt: no authority, but the process may still be stopping."""
    COMPLETED = "completed"
    HANDOFF = "handoff"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PARKED = "parked"
    """Waiting with a resume-capable binding: no authority; the same attempt resumes at a higher epoch."""
    WAITED = "waited"
    """Ended on a wait without resume: attempt N+1 continues with the winner."""
    RECOVERING = "recovering"
    """Its lease expired; a recoverer holds recovery-in-progress authority at a higher epoch while the
    executor verifies (adopts) the process, or says it cannot."""

    @property
    def terminal(self) -> bool:
        return EXECUTION_LIFECYCLE.terminal(self)


LIVE_EXECUTION_STATES = (
    ExecutionState.RUNNING,
    ExecutionState.STOPPING,
    ExecutionState.PARKED,
    ExecutionState.RECOVERING,
)
"""The nonterminal attempt states: at most one attempt per Work is in one of them."""

CAPACITY_STATES = (ExecutionState.RUNNING, ExecutionState.STOPPING, ExecutionState.RECOVERING)
"""The attempts that run, or may still be running: what a scope's ``capacity`` counts. A parked attempt
does not run (it waits, with no authority), so it holds no slot; its resume needs one like any start."""

EXECUTION_LIFECYCLE = Lifecycle[ExecutionState](
    "execution",
    {
        ExecutionState.RUNNING: frozenset(
            {
                ExecutionState.RUNNING,  # relaunched at a higher epoch: its lease expired before it was handed
                ExecutionState.STOPPING,
                ExecutionState.COMPLETED,
                ExecutionState.HANDOFF,
                ExecutionState.FAILED,
                ExecutionState.CANCELLED,
                ExecutionState.PARKED,
                ExecutionState.WAITED,
                ExecutionState.RECOVERING,
            }
        ),
        ExecutionState.RECOVERING: frozenset(
            {
                ExecutionState.RUNNING,  # adopted, or relaunched (nothing was ever handed to the executor)
                ExecutionState.RECOVERING,  # a recovery that lost its own lease is recovered again
                ExecutionState.FAILED,  # not adoptable: failed under the new fence
                ExecutionState.CANCELLED,
            }
        ),
        ExecutionState.STOPPING: frozenset({ExecutionState.CANCELLED}),
        ExecutionState.PARKED: frozenset({ExecutionState.RUNNING, ExecutionState.CANCELLED}),
        ExecutionState.WAITED: frozenset(),
        ExecutionState.COMPLETED: frozenset(),
        ExecutionState.HANDOFF: frozenset(),
        ExecutionState.FAILED: frozenset(),
        ExecutionState.CANCELLED: frozenset(),
    },
)


class RetryState(enum.StrEnum):
    """Why a ready Work may not start its next attempt yet (eligibility)."""

    BACKOFF = "backoff"
    EXHAUSTED = "exhausted"


class CheckpointStatus(enum.StrEnum):
    ROUTED = "routed"
    UNMATCHED = "unmatched"
    DROP = "drop"
    TERMINAL = "terminal"
    UNROUTED = "unrouted"
    """Routing stopped with a diagnostic (handler error, key owned by another Work, contradiction)."""


class InputState(enum.StrEnum):
    PENDING = "pending"
    CONSUMED = "consumed"
    DROPPED = "dropped"
    """Dropped by a route's ``drop`` error fallback after its inject or interrupt stayed ambiguous."""


INPUT_LIFECYCLE = Lifecycle[InputState](
    "input",
    {
        InputState.PENDING: frozenset({InputState.CONSUMED, InputState.DROPPED}),
        InputState.CONSUMED: frozenset(),
        InputState.DROPPED: frozenset(),
    },
)


class IntentKind(enum.StrEnum):
    INJECT = "inject"
    INTERRUPT = "interrupt"


class IntentStatus(enum.StrEnum):
    PENDING = "pending"
    DISPATCHING = "dispatching"
    """Dispatch attempted; the executor's answer is in flight or was ambiguous."""
    ACCEPTED = "accepted"
    NOT_ACCEPTING = "not_accepting"
    CONSUMED = "consumed"
    STALE = "stale"
    DONE = "done"
    GAVE_UP = "gave_up"
    """Every dispatch stayed ambiguous: the intent ended in its fallback, with a diagnostic."""


OPEN_INTENT_STATUSES = (IntentStatus.PENDING, IntentStatus.DISPATCHING)
"""Intents still to be dispatched (or dispatched again, after an ambiguous answer)."""

INTENT_LIFECYCLE = Lifecycle[IntentStatus](
    "intent",
    {
        IntentStatus.PENDING: frozenset({IntentStatus.DISPATCHING, IntentStatus.STALE}),
        IntentStatus.DISPATCHING: frozenset(
            {
                IntentStatus.DISPATCHING,  # an ambiguous answer: the same intent is tried again
                IntentStatus.ACCEPTED,
                IntentStatus.NOT_ACCEPTING,
                IntentStatus.CONSUMED,
                IntentStatus.STALE,
                IntentStatus.DONE,
                IntentStatus.GAVE_UP,
            }
        ),
        IntentStatus.ACCEPTED: frozenset({IntentStatus.CONSUMED}),
        IntentStatus.NOT_ACCEPTING: frozenset(),
        IntentStatus.CONSUMED: frozenset(),
        IntentStatus.STALE: frozenset(),
        IntentStatus.DONE: frozenset(),
        IntentStatus.GAVE_UP: frozenset(),
    },
)


# -- routing decisions (what a route handler returns) -------------------------


@attrs.frozen(kw_only=True)
class Deliver:
    """Route the Event to a Work: an existing one (``work_id``) or a new one (``create``).

    ``work_id`` is the stable proposed id when creating, so a re-evaluation after a
    revision conflict proposes the same id. ``attach_keys`` are added to the Work
    (never removed or transferred).
    """

    work_id: str
    create: bool = False
    attach_keys: tuple[str, ...] = ()
    kind: str | None = None


@attrs.frozen(kw_only=True)
class Drop:
    reason: str


@attrs.frozen(kw_only=True)
class Unmatched:
    reason: str = "no route matched"


Decision = Deliver | Drop | Unmatched


# -- snapshots ------------------------------------------------------------------


@with_instants
@attrs.frozen(kw_only=True)
class Work:
    """A frozen snapshot of one Work."""

    id: str
    scope: str
    kind: str | None
    state: WorkState
    revision: int
    keys: tuple[str, ...]
    held: bool
    hold_reason: str | None
    parent_id: str | None
    predecessor_id: str | None
    generation: int
    created_at_ms: int
    updated_at_ms: int
    """When it last changed: its state, hold, keys' history, inputs or attempts (the commit's time)."""
    attempts: int
    current_execution_id: str | None
    pending_inputs: tuple[str, ...]
    started: bool = False
    """Whether any attempt was ever claimed (start gates hold only the first start)."""
    released: bool = False
    """An operator released a hold: the next start goes through the start gates once."""
    execution_state: ExecutionState | None = None
    """The state of its nonterminal attempt (``None``: it has none)."""
    wait_id: str | None = None
    """Its active or blocked wait (``None``: it waits for nothing)."""
    failures: int = 0
    """Consecutive failed attempts counted by the retry policy (apart from the attempt number)."""
    retry: RetryState | None = None
    """``backoff``: waiting for its retry timer; ``exhausted``: no automatic retry is left."""
    blocked: str | None = None
    """Why the admission pass passes it over while it is ready: ``capacity:<scope>`` (it waits for a
    slot of that pool) or ``start:<reason>`` (nothing here can start it; a ``start_failed`` diagnostic
    says the same). ``None``: nothing keeps it back."""


_WORK_FIELDS = tuple(field.name for field in attrs.fields(Work))
_WORK_VALUES = operator.attrgetter(*_WORK_FIELDS)


def work_with(work: Work, **changes: Any) -> Work:
    """``attrs.evolve(work, **changes)``, its fields read in one call: the hot paths tell their
    transaction a Work as they wrote it (a claim, an end, a routing, a wake) several times per item."""
    fields = dict(zip(_WORK_FIELDS, _WORK_VALUES(work), strict=True))
    fields.update(changes)
    return Work(**fields)


@with_instants
@attrs.frozen(kw_only=True)
class Checkpoint:
    event_id: str
    seq: int
    status: CheckpointStatus
    work_id: str | None
    route: str | None
    route_scope: str | None
    policy: Policy | None
    effective_policy: Policy | None
    fallback_reason: str | None
    reason: str | None
    generation: int | None
    at_ms: int


@with_instants
@attrs.frozen(kw_only=True)
class Execution:
    id: str
    work_id: str
    attempt: int
    state: ExecutionState
    epoch: int
    owner: str | None
    expires_at_ms: int | None
    trigger_id: str | None
    inputs: tuple[str, ...]
    binding: str | None
    executor: str | None
    capabilities: frozenset[str]
    generation: int
    outcome: JSONObject | None = attrs.field(hash=False, converter=frozen_optional_object)
    interrupt_event_id: str | None
    created_at_ms: int
    ended_at_ms: int | None
    segment: int = 1
    """The active segment; a deadline for an older segment is stale."""
    budget_ms: int | None = None
    """The execution timeout: active time only (a wait pauses it)."""
    used_ms: int = 0
    """Active time spent in ended segments."""
    watermark: int = 0
    """The highest sequence this attempt has been handed (its acknowledged observation watermark)."""
    authority_id: str | None = None
    """The Event its derived actions descend from: its trigger, or the wake bridge of a continuation."""
    handed_at_ms: int | None = None
    """When its current segment was handed to the executor (``None``: never; a recovery relaunches it)."""
    metadata: JSONObject | None = attrs.field(default=None, hash=False, converter=frozen_optional_object)
    """Opaque executor metadata pinned with the segment (a process id, a handle), given to `recover`."""
    retry_policy: JSONObject | None = attrs.field(default=None, hash=False, converter=frozen_optional_object)
    """The retry budget pinned at its claim (its Work kind's, in the configuration generation then)."""
    binding_config: JSONObject | None = attrs.field(
        default=None, hash=False, converter=frozen_optional_object
    )
    """The binding's configuration the attempt was launched with (a relaunch after recovery gets it again)."""
    pool: str | None = None
    """The capacity pool it was admitted under (the scope whose ``capacity`` it counts against while it
    runs; ``None``: no capacity applies)."""


@attrs.frozen(kw_only=True)
class Intent:
    id: str
    kind: IntentKind
    work_id: str
    event_id: str
    execution_id: str
    epoch: int
    status: IntentStatus
    attempts: int
    next_attempt_ms: int | None = None
    """After an ambiguous dispatch: when the same intent is tried again (``None``: not scheduled)."""
    error_fallback: Policy | None = None
    """What an inject whose dispatch stays ambiguous falls back to (``None``: its input stays pending)."""


@attrs.frozen(kw_only=True)
class RunRequest:
    """What an executor is asked to run: the trigger and the ordered inputs."""

    work_id: str
    execution_id: str
    attempt: int
    scope: str
    kind: str | None
    trigger: Event | None
    inputs: tuple[Event, ...]
    binding: str | None
    config: JSONObject = attrs.field(factory=dict, hash=False, converter=frozen_object)
    executor: str | None = None
    """The executor that runs it (the binding's, pinned at the attempt's first claim)."""
    resumed: bool = False
    """The same attempt continues after a wait, at a higher epoch; ``trigger`` is the wait's winner."""
    origin: Event | None = None
    """For a retry (``trigger`` is ``core.retry.due``): the Event the failed attempt was about (its
    trigger), back through earlier retries. ``None`` for any other attempt."""


@attrs.frozen(kw_only=True)
class Lease:
    """Fenced authority over one attempt: every call presents the token, epoch and attempt."""

    execution_id: str
    work_id: str
    attempt: int
    epoch: int
    token: str
    owner: str
    expires_at_ms: int
    request: RunRequest


@attrs.frozen(kw_only=True)
class Recovery:
    """An expired attempt claimed for recovery: the recoverer's lease over the same attempt at a higher
    epoch (with a new token), and what it must do with it.

    ``relaunch``: nothing was ever handed to the executor, so the attempt simply runs again under this
    lease (it is ``running``). Otherwise it is ``recovering``: the process must be verified from the
    pinned ``metadata`` and then adopted (`Runtime.adopt`), or declared not adoptable
    (`Runtime.not_adoptable`); left alone, the recovery lease expires and it is recovered again.
    """

    lease: Lease
    relaunch: bool
    metadata: Mapping[str, Any] = attrs.field(factory=dict, hash=False)


# -- outcomes -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Completed:
    """The attempt completed. ``value``: its result, any JSON value (at most `MAX_VALUE_BYTES` as JSON),
    which the Work's outcome carries (`Runtime.result`)."""

    consumed_inputs: tuple[str, ...] = ()
    usage: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    value: Any = attrs.field(default=None, hash=False, converter=freeze)


@attrs.frozen(kw_only=True)
class Handoff:
    """The attempt hands back: the Work waits idle for its next input."""

    consumed_inputs: tuple[str, ...] = ()
    usage: Mapping[str, float] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class Failed:
    """The attempt failed. ``retry_after_ms``: wait for a known reset (plus two minutes); ``rate_limited``
    without it: 30 minutes; ``retryable=False``: no automatic retry (held as when the budget is spent)."""

    error: str
    retry_after_ms: int | None = None
    rate_limited: bool = False
    retryable: bool = True
    consumed_inputs: tuple[str, ...] = ()
    usage: Mapping[str, float] = attrs.field(factory=dict, hash=False)


Outcome = Completed | Handoff | Failed | Waiting


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": type(outcome).__name__.lower(),
        "consumed_inputs": list(outcome.consumed_inputs),
        "usage": dict(outcome.usage),
    }
    if isinstance(outcome, Failed):
        data["error"] = outcome.error
        data["retry_after_ms"] = outcome.retry_after_ms
        data["rate_limited"] = outcome.rate_limited
        if not outcome.retryable:
            data["retryable"] = False
    if isinstance(outcome, Waiting):
        data["artifacts"] = list(outcome.artifacts)
    if isinstance(outcome, Completed) and outcome.value is not None:
        data["value"] = outcome.value
    return data
