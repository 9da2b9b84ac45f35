"""Commit notices: what a committed batch tells the actors (published only after COMMIT)."""

from __future__ import annotations

import attrs

from ._records import Event


@attrs.frozen(kw_only=True)
class EventAccepted:
    """A new Event was durably accepted (duplicates publish nothing)."""

    event: Event

    @property
    def event_id(self) -> str:
        return self.event.id


@attrs.frozen(kw_only=True)
class WorkChanged:
    """A Work's state, inputs or executions changed: its router may have something to do."""

    work_id: str


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
    status: str


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
