"""Records for durable timers and the recurrence contract.

A timer's firing identity is (timer id, revision, fire_at): a re-armed or recreated timer
has a new one, so a stale firing request for an older identity does nothing.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .events import JSONObject
from .frozen import frozen_object, frozen_optional_object
from .reprs import with_instants
from .states import Lifecycle


class TimerState(enum.StrEnum):
    ARMED = "armed"
    FIRED = "fired"
    """A one-shot timer that fired (kept as a tombstone)."""
    CANCELLED = "cancelled"
    DISABLED = "disabled"
    """A causal refusal stopped it: no retry loop."""
    INVALID = "invalid"
    """Its recurrence policy is unknown or answered something core refuses."""


TIMER_LIFECYCLE = Lifecycle[TimerState](
    "timer",
    {
        # armed -> armed: a recurring timer moves to its next occurrence
        TimerState.ARMED: frozenset(
            {
                TimerState.ARMED,
                TimerState.FIRED,
                TimerState.CANCELLED,
                TimerState.DISABLED,
                TimerState.INVALID,
            }
        ),
        # an ended timer is armed again only as a new revision (a new firing identity)
        TimerState.FIRED: frozenset({TimerState.ARMED}),
        TimerState.CANCELLED: frozenset({TimerState.ARMED}),
        TimerState.DISABLED: frozenset({TimerState.ARMED}),
        TimerState.INVALID: frozenset({TimerState.ARMED}),
    },
)


class FiringResult(enum.StrEnum):
    ACCEPTED = "accepted"
    SKIPPED = "skipped"
    REFUSED = "refused"
    INVALID = "invalid"
    STALE = "stale"
    NOT_DUE = "not_due"
    TAKEN = "taken"
    """Another node (on a shared database) holds the timer and is firing it now: nothing was done
    here; asking again later finds its firing in the ledger."""


@attrs.frozen(kw_only=True)
class TimerSpec:
    """What to arm: when, the Event template to accept when it fires, and how it recurs.

    ``delivery_id`` (default: the timer id) is the one-shot firing's delivery identity;
    each occurrence of a recurring timer gets ``{delivery_id}@{occurrence_ms}`` or the
    identity its recurrence policy chooses.
    """

    id: str
    fire_at_ms: int
    source: str
    type: str
    scope: str
    key: str | None = None
    work_id: str | None = None
    payload: JSONObject = attrs.field(factory=dict, hash=False)
    delivery_id: str | None = None
    interval_ms: int | None = None
    recurrence: str | None = None
    spec: JSONObject | None = attrs.field(default=None, hash=False)


@with_instants
@attrs.frozen(kw_only=True)
class Timer:
    id: str
    revision: int
    state: TimerState
    fire_at_ms: int
    source: str
    type: str
    scope: str
    key: str | None
    work_id: str | None
    payload: JSONObject = attrs.field(hash=False, converter=frozen_object)
    delivery_id: str
    interval_ms: int | None
    recurrence: str | None
    spec: JSONObject | None = attrs.field(hash=False, converter=frozen_optional_object)
    parent_id: str | None
    """The arming authority's Event for a derived timer (``None``: a root timer)."""
    execution_id: str | None
    occurrences: int
    reason: str | None
    created_at_ms: int
    updated_at_ms: int


@attrs.frozen(kw_only=True)
class FireRequest:
    timer_id: str
    revision: int
    fire_at_ms: int


@with_instants
@attrs.frozen(kw_only=True)
class Firing:
    """One committed firing in the ledger (or a no-op answer: stale, not due)."""

    timer_id: str
    revision: int
    fire_at_ms: int
    result: FiringResult
    event_id: str | None
    next_fire_at_ms: int | None
    detail: str | None
    at_ms: int
    replay: bool = False


# -- the recurrence contract -------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Occurrence:
    """The occurrence to accept now. ``source`` and ``parent_id``, when given, must be the timer's."""

    occurrence_ms: int
    delivery_id: str
    payload: JSONObject = attrs.field(factory=dict, hash=False)
    source: str | None = None
    parent_id: str | None = None


@attrs.frozen(kw_only=True)
class Skip:
    """No occurrence now (recorded as ``skipped`` in the ledger)."""

    reason: str
    skipped: int = 1


@attrs.frozen(kw_only=True)
class Replacement:
    """The next arming of the same timer: after now, with a distinct identity."""

    fire_at_ms: int
    delivery_id: str


RecurrencePolicy = Callable[[Timer, int, Mapping[str, Any]], tuple[Occurrence | Skip, Replacement | None]]
