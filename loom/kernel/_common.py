"""Small reads every kernel module needs: a Work or an Event that must exist."""

from __future__ import annotations

from ..records.errors import NotFound
from ..records.events import Event
from ..records.work import Work
from ..store import Tx


def require_work(tx: Tx, work_id: str) -> Work:
    """The Work, or `NotFound` naming the id."""
    work = tx.work(work_id)
    if work is None:
        raise NotFound(f"no work with id {work_id!r}")
    return work


def require_event(tx: Tx, event_id: str) -> Event:
    """An Event the store itself refers to (an input, a trigger): its absence is an invariant violation."""
    event = tx.event(event_id)
    assert event is not None, f"event {event_id} vanished"
    return event
