"""The inputs part of `Tx`: a Work's inputs, and its pending ones as this transaction knows them.

A standing Work's pending inputs can be many (Events queue while its attempt runs), and routing reads
the Work for every Event it routes to it: read each time, they would cost in proportion to the queue,
so a burst of Events would cost its square. A transaction alone on the database reads them once and
keeps them (`pending_of`): an input added after the newest pending one is appended, and anything else
that moves an input out of pending, or adds one out of order, forgets the Work's (read again when
asked). A savepoint rolled back forgets them all.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..records.errors import IllegalTransition
from ..records.events import Event
from ..records.work import INPUT_LIFECYCLE, Checkpoint, InputState
from . import _sql
from ._carried import Pending
from ._tx_base import MISSING, TxBase

_EVENTS_PER_READ = 512
_EVENT_WIDTH = len(_sql.EVENT_COLUMNS.split(","))


_REBUILT = 32
"""The longest pending list a consumption rebuilds without the input it took (`InputsTx._left_pending`)."""


def _lists_of(ids: list[str]) -> Iterator[tuple[str, ...]]:
    """``ids`` in lists of at most `_EVENTS_PER_READ`, each `_padded`."""
    for first in range(0, len(ids), _EVENTS_PER_READ):
        yield _padded(ids[first : first + _EVENTS_PER_READ])


def _padded(ids: list[str]) -> tuple[str, ...]:
    """``ids`` filled up to a power of two with the last one, so that few query texts of a list of
    them ever take the statement cache."""
    return tuple(ids + ids[-1:] * ((1 << (len(ids) - 1).bit_length()) - len(ids)))


class InputsTx(TxBase):
    def pending_of(self, work_id: str) -> tuple[str, ...]:
        """The Work's pending inputs' Event ids, in acceptance order (see the module docstring)."""
        kept = self._known_pending(work_id)
        if kept is not None:
            return kept[0]
        rows = self._all(_sql.WORK_PENDING_SEQ, (work_id,))
        pending = tuple(row[0] for row in rows)
        if self._caching:
            self._pending[work_id] = (pending, rows[-1][1] if rows else None)
        return pending

    def _known_pending(self, work_id: str) -> Pending | None:
        """The Work's pending inputs as this transaction keeps them, or else as an earlier commit left
        them (`Carried.pending`), with none written since; ``None``: not kept."""
        kept = self._pending.get(work_id)
        if kept is None and self._kept is not None and not self._inputs_lost:
            if work_id not in self._inputs_changed and (kept := self._kept.pending.get(work_id)) is not None:
                self._pending[work_id] = kept
        return kept

    def pending_inputs(self, work_id: str) -> list[str]:
        return list(self.pending_of(work_id))

    def input_events(self, event_ids: Sequence[str]) -> list[Event]:
        """The Events ``event_ids`` name, in that order, each of which must exist (an attempt's inputs):
        those not read yet in this transaction are read in one query per `_EVENTS_PER_READ` (an Event
        row never changes, and is kept as `Tx.event` keeps it). The query's list of ids is filled up to
        a power of two with its last id, so few query texts ever take the statement cache."""
        missing = [event_id for event_id in dict.fromkeys(event_ids) if event_id not in self._events]
        if missing and self._kept is not None and not self._to_carry.routed_lost:  # (`routed_input`)
            missing = [event_id for event_id in missing if self._take_routed(event_id) is None]
        for ids in _lists_of(missing):
            sql = f"SELECT {_sql.EVENT_COLUMNS} FROM events WHERE id IN ({', '.join('?' * len(ids))})"
            for row in self._all(sql, ids):
                self._events[row[0]] = _sql.event_from_row(row)
        found = [self._events.get(event_id) for event_id in event_ids]
        lost = [event_id for event_id, event in zip(event_ids, found, strict=True) if event is None]
        assert not lost, f"input events {lost} vanished"  # an invariant: inputs outlive their attempts
        return found  # type: ignore[return-value]

    def input_checkpoints(self, event_ids: Sequence[str]) -> Iterator[tuple[str, Checkpoint | None]]:
        """Each of ``event_ids`` (a Work's pending inputs) with its routing checkpoint, in that order, as
        the caller asks for the next: one this transaction holds is answered (`recall`); from the first
        it does not, they are read with their Events, `_EVENTS_PER_READ` at a time as the caller goes
        on, and the Events kept for the claim that follows (`input_events`: an Event row never changes)."""
        read: dict[str, Checkpoint | None] = {}
        for at, event_id in enumerate(event_ids):
            if not read:
                known = self.recall("checkpoint", event_id)
                if known is MISSING:
                    known = self.routed_input(event_id)
                if known is not MISSING:
                    yield event_id, known
                    continue
            if event_id not in read:
                ids = list(dict.fromkeys(event_ids[at : at + _EVENTS_PER_READ]))
                read.update(dict.fromkeys(ids))  # (an Event not found has no checkpoint either)
                padded = _padded(ids)
                sql = _sql.EVENTS_TO_ROUTE.format(ids=", ".join("?" * len(padded)))
                for row in self._all(sql, padded):
                    event = self._events.setdefault(row[0], _sql.event_from_row(row))
                    tail = row[_EVENT_WIDTH:]
                    read[event.id] = _sql.checkpoint_from_row(tail) if tail[0] is not None else None
            yield event_id, read[event_id]

    def routed_input(self, event_id: str) -> Checkpoint | Any:
        """The checkpoint that routed the Event ``event_id`` to a Work, when this transaction wrote it
        or an earlier one committed it with the Event (`Carried.routed`: a database alone only), the
        Event kept for the claim that follows (`input_events`); `MISSING` otherwise. An Event row never
        changes, and its checkpoint only by a replay or compaction (`ToCarry.lose_routed`)."""
        if self._kept is None or self._to_carry.routed_lost:
            return MISSING
        if event_id in self._to_carry.routed:
            return self._to_carry.routed[event_id][0]
        kept = self._take_routed(event_id)
        return MISSING if kept is None else kept[1]

    def _take_routed(self, event_id: str) -> tuple[Event, Checkpoint] | None:
        """The Event ``event_id`` and the checkpoint that routed it, as an earlier commit kept them
        (`Carried.take_routed`), the Event put with those this transaction knows; ``None``: not kept."""
        assert self._kept is not None
        kept = self._kept.take_routed(event_id)
        if kept is not None:
            self._events.setdefault(event_id, kept[0])
        return kept

    def add_input(self, work_id: str, event_id: str, seq: int) -> None:
        """Add an Event to a Work's inputs, pending, unless it is one of them already (in any state);
        one this transaction inserted is not looked for again (a wake adds the Event that won it,
        which its routing added just before)."""
        if (work_id, event_id) in self._inputs:
            self.touch(work_id)
            return
        self._known_pending(work_id)  # (what is kept goes on from here, or else is forgotten)
        cur = self._conn.execute(
            "INSERT INTO work_inputs (work_id, event_id, seq, state) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (work_id, event_id, seq, InputState.PENDING.value),
        )
        self.touch(work_id)
        if cur.rowcount == 1:
            self._inputs.add((work_id, event_id))
            self._inputs_changed.add(work_id)
        kept = self._pending.get(work_id)
        if kept is None or cur.rowcount != 1:
            return  # none kept, or the input was there already (pending or not: nothing changed)
        pending, newest = kept
        if newest is None or seq > newest:
            self._pending[work_id] = ((*pending, event_id), seq)
        else:
            del self._pending[work_id]

    def _left_pending(self, work_id: str, event_id: str) -> None:
        """The input ``event_id`` of ``work_id`` is pending no longer: what is kept of the Work's pending
        inputs goes on without it (the newest sequence kept stays an upper bound: `add_input`), or, a
        list longer than `_REBUILT`, is read again when asked for (an attempt that takes hundreds
        consumes them one by one: rebuilding the list at each would cost their square)."""
        kept = self._known_pending(work_id)
        self._inputs_changed.add(work_id)
        if kept is None:
            return
        if len(kept[0]) > _REBUILT:
            del self._pending[work_id]
            return
        left = tuple(pending for pending in kept[0] if pending != event_id)
        self._pending[work_id] = (left, kept[1] if left else None)

    def input_state(self, work_id: str, event_id: str) -> InputState | None:
        row = self._one(
            "SELECT state FROM work_inputs WHERE work_id = ? AND event_id = ?", (work_id, event_id)
        )
        return InputState(row[0]) if row else None

    def consume_if_pending(self, work_id: str, event_id: str, execution_id: str) -> bool:
        """Mark an input consumed by ``execution_id`` if it is pending (the one move out of pending
        its lifecycle allows here), in one statement; whether it was."""
        cur = self._conn.execute(
            "UPDATE work_inputs SET state = ?, execution_id = ? WHERE work_id = ? AND event_id = ? AND state = ?",
            (InputState.CONSUMED.value, execution_id, work_id, event_id, InputState.PENDING.value),
        )
        if cur.rowcount != 1:
            return False
        self._left_pending(work_id, event_id)
        self.touch(work_id)
        return True

    def consume_input(self, work_id: str, event_id: str, execution_id: str) -> None:
        """Mark a pending input consumed by ``execution_id`` (checked against the input lifecycle)."""
        self._leave_pending(work_id, event_id, InputState.CONSUMED, execution_id)

    def drop_input(self, work_id: str, event_id: str) -> None:
        """Mark a pending input dropped (a ``drop`` error fallback), checked against the input lifecycle."""
        self._leave_pending(work_id, event_id, InputState.DROPPED, None)

    def _leave_pending(self, work_id: str, event_id: str, new: InputState, execution_id: str | None) -> None:
        state = self.input_state(work_id, event_id)
        if state is None:
            raise IllegalTransition(f"input {event_id} of work {work_id}: no such input")
        INPUT_LIFECYCLE.check(f"{event_id} of work {work_id}", state, new)
        cur = self._conn.execute(
            "UPDATE work_inputs SET state = ?, execution_id = coalesce(?, execution_id)"
            " WHERE work_id = ? AND event_id = ? AND state = ?",
            (new.value, execution_id, work_id, event_id, state.value),
        )
        self._written(cur, f"input {event_id}", state, new)
        self._left_pending(work_id, event_id)
        self.touch(work_id)
