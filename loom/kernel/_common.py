"""Small reads every kernel module needs (a Work or an Event that must exist), and the barrier."""

from __future__ import annotations

from ..records.core_events import CORE_SOURCE, RETRY_DUE
from ..records.errors import NotFound
from ..records.events import Event
from ..records.ids import stable_id
from ..records.work import Work
from ..store import Tx


def require_work(tx: Tx, work_id: str) -> Work:
    """The Work, or `NotFound` naming the id."""
    work = tx.work(work_id)
    if work is None:
        raise NotFound(f"no work with id {work_id!r}")
    return work


def new_work_id(tx: Tx, proposed: str) -> str:
    """The id a new Work takes: ``proposed``, unless compaction removed a Work of that id (its key or
    name may come back after its retention). Then the first incarnation of it never used, so nothing
    the removed Work left (the tombstones of its Events, whose identities derive from its id) answers
    for the new one."""
    candidate, n = proposed, 0
    while tx.work_removed(candidate) or (n and tx.work(candidate) is not None):
        n += 1
        candidate = stable_id("wk", proposed, "incarnation", str(n))
    return candidate


def require_event(tx: Tx, event_id: str) -> Event:
    """An Event the store itself refers to (an input, a trigger): its absence is an invariant violation."""
    event = tx.event(event_id)
    assert event is not None, f"event {event_id} vanished"
    return event


def barrier_in_tx(tx: Tx, now_ms: int) -> None:
    """A procedure that does nothing: its answer comes after every earlier commit's notices were
    handed out (a quiescence check's round trip)."""


def origin_of(tx: Tx, trigger: Event | None) -> Event | None:
    """`RunRequest.origin`: for an attempt a retry started (its trigger a ``core.retry.due`` Event), the
    Event the failed attempt descended from, back through earlier retries (its trigger; after a wait,
    the wake's bridge, whose payload names the winner). ``None`` for any other attempt, or once
    compaction removed it."""
    found = trigger
    while found is not None and found.source == CORE_SOURCE and found.type == RETRY_DUE and found.parent_id:
        found = tx.event(found.parent_id)
    return found if found is not trigger else None
