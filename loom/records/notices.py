"""Commit notices: what a committed batch tells the actors and watchers (published only after COMMIT).

Notices are hints, never the truth: durable state is. A watcher that falls behind gets `Lagged`
and rereads what it needs from the store. `Runtime.watch` hands them to embedders as they are.
"""

from __future__ import annotations

import attrs

from .compaction import CompactionReport
from .events import Event
from .timers import FiringResult
from .work import CheckpointStatus


@attrs.frozen(kw_only=True)
class EventAccepted:
    """A new Event was durably accepted (duplicates publish nothing)."""

    event: Event

    @property
    def event_id(self) -> str:
        return self.event.id


@attrs.frozen(kw_only=True)
class EventReplayed:
    """An operator replayed an unrouted Event: it awaits routing again."""

    event: Event


@attrs.frozen(kw_only=True)
class WorkChanged:
    """A Work's state, inputs or executions changed: its router may have something to do."""

    work_id: str


@attrs.frozen(kw_only=True)
class WorkSettled:
    """A Work's outcome is settled: it became terminal (completed, failed, cancelled), or its retry
    budget is spent so that no attempt follows by itself. Waiters for its result wake
    (`Runtime.wait_for`)."""

    work_id: str


@attrs.frozen(kw_only=True)
class AttemptFailed:
    """An attempt failed (its outcome, a deadline, or a recovery that could not adopt it).
    ``retry_at_ms``: when its retry timer starts the next attempt (``None``: no automatic retry follows:
    the retry budget is spent, or the Work is standing and waits for its next input)."""

    work_id: str
    execution_id: str
    attempt: int
    error: str
    failures: int
    retry_at_ms: int | None
    then: str
    """What happens next, in words (``retry at ...``, ``held: ...``, ``failed``, ``waits for input``)."""


@attrs.frozen(kw_only=True)
class WorkReady:
    """A Work joined the ready queue, or the admission pass may look at it again (a capacity slot freed,
    the configuration changed): the starter makes a pass. ``work_id`` is ``None`` when several Works
    changed at once."""

    work_id: str | None


@attrs.frozen(kw_only=True)
class IntentPending:
    """An inject or interrupt intent awaits dispatch to its executor."""

    intent_id: str
    work_id: str


@attrs.frozen(kw_only=True)
class ExecutionFenced:
    """An attempt lost its authority by a control (cancel): its executor should stop it."""

    execution_id: str
    work_id: str


@attrs.frozen(kw_only=True)
class EventRouted:
    """An Event got its routing checkpoint."""

    event_id: str
    work_id: str | None
    status: CheckpointStatus


@attrs.frozen(kw_only=True)
class TimerArmed:
    """A timer identity was armed (or moved to its next occurrence)."""

    timer_id: str
    revision: int
    fire_at_ms: int


@attrs.frozen(kw_only=True)
class TimerCancelled:
    """A timer left the armed set (cancelled, disabled or invalid)."""

    timer_id: str


@attrs.frozen(kw_only=True)
class TimerFired:
    """A firing was written to a timer's ledger (accepted, skipped, refused or invalid); a repeated
    request answered from the ledger publishes nothing."""

    timer_id: str
    revision: int
    fire_at_ms: int
    result: FiringResult


@attrs.frozen(kw_only=True)
class LeaseRecovered:
    """An attempt whose lease expired was claimed at a higher epoch: relaunched (never handed to its
    executor) or being recovered through its executor."""

    execution_id: str
    work_id: str
    epoch: int
    relaunch: bool


@attrs.frozen(kw_only=True)
class AttemptStarted:
    """An attempt was claimed and starts (or a parked one resumes: ``resumed``). ``ready_at_ms``: when
    its Work joined the ready queue (``None``: it started in the commit that made it ready);
    ``trigger_accepted_at_ms``: when the Event that triggers it was accepted (``None``: it has no
    trigger)."""

    execution_id: str
    work_id: str
    attempt: int
    at_ms: int
    ready_at_ms: int | None
    trigger_accepted_at_ms: int | None
    resumed: bool = False


@attrs.frozen(kw_only=True)
class AttemptEnded:
    """An attempt ended, or parked on a wait: ``outcome`` is the state it ended in (``completed``,
    ``handoff``, ``failed``, ``cancelled``, ``waited``, ``parked``), or for some failures and
    cancellations what ended it: ``not_adoptable`` (its executor could not verify it after its lease
    expired), ``timed_out`` (its execution deadline) or ``interrupted``."""

    execution_id: str
    work_id: str
    attempt: int
    outcome: str


@attrs.frozen(kw_only=True)
class LeaseExpiry:
    """A lease now expires at ``expires_at_ms``: taken, renewed, recovered, or released by a clean close
    (``execution_id`` is ``None`` when several were released at once). The lease recoverer wakes for
    the earliest."""

    execution_id: str | None
    expires_at_ms: int


@attrs.frozen(kw_only=True)
class SubscriptionChanged:
    """A subscription was declared, installed or rearmed: a reconcile pass has something to do.

    ``source_key`` is what the reconciler watches for it from now on."""

    namespace: str
    id: str
    source_key: str


@attrs.frozen(kw_only=True)
class StoreChanged:
    """Another node committed to the shared database (heard through PostgreSQL LISTEN/NOTIFY), or the
    periodic safety check came round (``check``). It names what changed; each actor reads what it
    needs from its own cursor in the store."""

    origin: str = ""
    """The node that committed (the random name its storage actor drew), or ``""`` for a check."""
    events_through: int = 0
    """The highest Event sequence it accepted (``0``: none)."""
    unrouted: bool = False
    """It runs no router: its Events wait for another node's (a publisher that only accepts)."""
    timer_due_ms: int | None = None
    """The earliest deadline among the timers it armed (``None``: it armed none)."""
    lease_expiry_ms: int | None = None
    """The earliest expiry among the leases it took, renewed or released (``None``: none)."""
    work_ready: bool = False
    """A Work joined the ready queue, or a capacity slot freed: an admission pass may start something."""
    routed: bool = False
    """Events got their routing checkpoints (a step waiting for one may go on)."""
    intents: bool = False
    """Inject or interrupt intents await dispatch."""
    subscription_keys: tuple[str, ...] = ()
    """Source keys of subscriptions it declared, installed or rearmed (their new Events need aliases)."""
    fenced: tuple[str, ...] = ()
    """Attempts a control fenced (a cancel): the node running one stops it."""
    settled: tuple[str, ...] = ()
    """Works whose outcome it settled (`WorkSettled`): a waiter for one of their results reads it."""
    everything: bool = False
    """Notifications may have been missed (this node's listener reconnected, or a commit changed more
    than a payload names): each actor catches up as after `Lagged`."""
    check: bool = False
    """Nothing was heard: the periodic safety check. Each actor reads from its cursor whatever it could
    have missed (a cheap, bounded read: never everything)."""


@attrs.frozen(kw_only=True)
class Committed:
    """A batch committed (the last notice of every batch, even one that changed nothing else).

    ``batch`` counts the storage actor's batches since it started; ``at_ms`` is the batch's clock.
    ``requests`` is how many requests the batch held and ``seconds`` how long its thread hop took,
    from ``BEGIN`` to ``COMMIT`` (monotonic time, for metrics: never business time).
    """

    batch: int
    at_ms: int
    requests: int = 0
    seconds: float = 0.0


@attrs.frozen(kw_only=True)
class Compacted:
    """A compaction pass removed what its retention let go (``report``: how much, of what)."""

    report: CompactionReport


@attrs.frozen(kw_only=True)
class Lagged:
    """This watcher fell behind and missed notices: reread what it needs from the store."""


Notice = (
    EventAccepted
    | EventReplayed
    | WorkChanged
    | WorkSettled
    | AttemptFailed
    | WorkReady
    | IntentPending
    | ExecutionFenced
    | EventRouted
    | TimerArmed
    | TimerCancelled
    | TimerFired
    | LeaseRecovered
    | AttemptStarted
    | AttemptEnded
    | LeaseExpiry
    | SubscriptionChanged
    | StoreChanged
    | Committed
    | Compacted
    | Lagged
)
