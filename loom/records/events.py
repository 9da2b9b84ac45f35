"""Frozen records and enums shared by every layer.

Records are pure data: ``@attrs.frozen(kw_only=True)``; change one with ``attrs.evolve``.
Validation of untrusted input lives in `validation`.
"""

from __future__ import annotations

import datetime
import enum
from typing import Any

import attrs

from .frozen import frozen_object
from .reprs import with_instants

JSONObject = dict[str, Any]


class RejectionReason(enum.StrEnum):
    DEPTH_LIMIT = "depth_limit"
    RATE_LIMIT = "rate_limit"


@attrs.frozen(kw_only=True)
class EventIn:
    """An Event as offered to acceptance (untrusted until validated)."""

    source: str
    delivery_id: str
    type: str
    scope: str
    key: str | None = None
    work_id: str | None = None
    payload: JSONObject = attrs.field(factory=dict, hash=False)


@with_instants
@attrs.frozen(kw_only=True)
class Event:
    """An accepted, immutable Event with its durable sequence and causal position."""

    id: str
    seq: int
    source: str
    delivery_id: str
    type: str
    scope: str
    key: str | None
    work_id: str | None
    execution_id: str | None
    payload: JSONObject = attrs.field(hash=False, converter=frozen_object)
    parent_id: str | None
    cause_id: str | None
    root_id: str
    depth: int
    accepted_at_ms: int
    duplicate: bool = False
    """True when this acceptance found an earlier Event with the same (source, delivery_id)."""
    compacted: bool = False
    """True when the earlier Event was removed by compaction and only its tombstone answered: ``id``,
    ``seq``, ``source``, ``delivery_id`` and ``accepted_at_ms`` are the original's, the other fields
    repeat this delivery (docs/operations.md, "Retention")."""

    @property
    def is_root(self) -> bool:
        return self.parent_id is None


@attrs.frozen(kw_only=True)
class CausalRejection:
    """The redacted diagnostic a causal refusal commits (never the payload)."""

    reason: RejectionReason
    root_id: str
    depth: int
    limit: int
    """The depth limit in force for the chain."""
    budget: int
    """The per-minute limit of the root that refused (``per_minute``)."""
    minute: int
    """The UTC minute (``floor(unix seconds / 60)``) the refusal was counted in: the rate window."""
    source: str
    delivery_id: str
    type: str
    parent_id: str
    cause_id: str | None
    work_id: str | None
    execution_id: str | None
    at_ms: int
    observed: int | None = None
    """What was counted against the limit: the chain's depth, or the derived Events the root already
    accepted in ``minute`` (``None`` in a rejection recorded before loom kept it)."""

    def describe(self) -> str:
        """One line naming the limit, the figure observed against it and, for the rate, the window."""
        if self.reason is RejectionReason.DEPTH_LIMIT:
            return (
                f"causal bounds refused {self.source}/{self.delivery_id}: its chain would reach depth "
                f"{self.depth}, over the limit of {self.limit} (depth_limit, root {self.root_id})"
            )
        start = datetime.datetime.fromtimestamp(self.minute * 60, tz=datetime.UTC)
        observed = self.budget if self.observed is None else self.observed
        return (
            f"causal bounds refused {self.source}/{self.delivery_id}: root {self.root_id} already "
            f"accepted {observed} derived events in UTC minute {self.minute} "
            f"({start:%Y-%m-%dT%H:%M}Z, a fixed one-minute window), at its limit of {self.budget} "
            "per minute (rate_limit)"
        )


class DiagnosticKind(enum.StrEnum):
    """What a durable diagnostic is about; each is passed explicitly where it is written."""

    HANDLER_ERROR = "handler_error"
    """A route handler raised or answered something that is not a decision."""
    OWNED_BY_OTHER = "owned_by_other"
    """A decision would attach a key another Work owns: every effect was aborted."""
    CONTRADICTION = "contradiction"
    """The Event's explicit target and the decision disagree (Work, scope or key)."""
    UNKNOWN_WORK = "unknown_work"
    """A decision names a Work that does not exist and does not create it."""
    UNSUPPORTED_CAPABILITY = "unsupported_capability"
    """An inject or interrupt against an attempt without that capability, and no fallback."""
    CAUSAL_REJECTION = "causal_rejection"
    """The causal bounds refused an Event the runtime itself derived (a successor's record)."""
    DISPATCH_GAVE_UP = "dispatch_gave_up"
    """An intent's dispatch stayed ambiguous through every retry."""
    INVALID_TIMER = "invalid_timer"
    """A timer's recurrence or template cannot fire; it left the due set."""
    POLL_ITEM_FAILED = "poll_item_failed"
    """One item of a bounded host pass failed; the pass went on."""
    ROUTING_FAILED = "routing_failed"
    """Applying a route decision failed (or kept conflicting): the Event stays unrouted for replay."""
    EXECUTOR_FAILED = "executor_failed"
    """An executor raised, or answered something that is not an outcome: the attempt failed."""
    INTERRUPT_FAILED = "interrupt_failed"
    """An executor's interrupt raised while stopping an attempt that lost its authority."""
    GATE_FAILED = "gate_failed"
    """A start gate raised or answered something that is not a reason: the Work was held."""
    START_FAILED = "start_failed"
    """Starting an attempt failed for a reason that is not a conflict: the Work was held."""
    WAIT_BLOCKED = "wait_blocked"
    """The causal limits refused a wake (or a wait's timeout): the Work is held until released."""
    RETRY_EXHAUSTED = "retry_exhausted"
    """A Work's retry budget is spent: it is held (or failed) with the reason."""
    RECOVERY_FAILED = "recovery_failed"
    """An expired attempt could not be adopted by its executor: it failed under the new fence."""
    REPLAYED = "replayed"
    """An operator replayed an Event that had stayed unrouted: it is routed again, in order."""
    ALIAS_REFUSED = "alias_refused"
    """A subscription's alias was refused (the causal limits, or acceptance): checkpointed past it."""
    ALIAS_UNAUTHORIZED = "alias_unauthorized"
    """A cross-scope subscription is not authorised: it publishes nothing until an answer allows it."""
    COMPACTION_FAILED = "compaction_failed"
    """A compaction pass failed for a reason that is not the store's: nothing of it was removed."""
    FORGET_FAILED = "forget_failed"
    """An executor raised while forgetting an ended attempt's logs: what it kept may be left behind."""
    SUBSCRIPTION_FAILED = "subscription_failed"
    """An alias filter or authoriser raised, answered nonsense, or is not registered: the subscription
    was skipped this pass (nothing checkpointed), the others went on."""


@with_instants
@attrs.frozen(kw_only=True)
class Diagnostic:
    """A durable, safe diagnostic (never a payload): what went wrong with which subject."""

    id: int
    kind: str
    subject: str
    message: str
    detail: JSONObject = attrs.field(hash=False, converter=frozen_object)
    at_ms: int


@attrs.frozen(kw_only=True)
class KVEntry:
    namespace: str
    key: str
    value: JSONObject = attrs.field(hash=False, converter=frozen_object)
    updated_at_ms: int
