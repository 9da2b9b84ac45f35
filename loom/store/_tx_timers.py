"""The timer half of `Tx`: timers, their lifecycle-checked state writes, the due index and the ledger."""

from __future__ import annotations

import json

from ..records.errors import IllegalTransition
from ..records.timers import TIMER_LIFECYCLE, Firing, Timer, TimerState
from . import _sql
from ._tx_base import TxBase

_REPLACE_TIMER = ", ".join(
    f"{column} = excluded.{column}"
    for column in (*_sql.TIMER_COLUMNS.replace(" ", "").split(","), "armed_seq")
    if column != "id"
)
NEXT_ARMED_SEQ = "(SELECT coalesce(max(armed_seq), 0) + 1 FROM timers)"
"""An arming's place among the timers due at one instant: after every timer armed before it (a timer
armed again moves after them too; a recurring timer's next occurrence keeps its place)."""


class TimersTx(TxBase):
    # -- timers -------------------------------------------------------------------

    def timer(self, timer_id: str) -> Timer | None:
        """The timer as it is now: its row as the due head read it, if this transaction has not written
        the timer since (`due_head`), else a read."""
        row = self._timer_rows.get(timer_id) or self._one(_sql.TIMER_BY_ID, (timer_id,))
        return _sql.timer_from_row(row) if row else None

    def timer_or_removed(self, timer_id: str) -> tuple[Timer | None, int | None]:
        """`timer`, and when there is no such timer the revision of the one compaction removed under its
        id (its ``removed_timers`` tombstone; ``None``: none was), in one query (what arming asks)."""
        kept = self._timer_rows.get(timer_id)
        if kept is not None:
            return _sql.timer_from_row(kept), None
        row = self._one(_sql.TIMER_OR_REMOVED, (timer_id, timer_id))
        assert row is not None
        width = len(row) - 1
        if row[0] is not None:
            return _sql.timer_from_row(row[:width]), None
        return None, None if row[width] is None else int(row[width])

    def put_timer(self, timer: Timer, previous: Timer | None) -> None:
        """Insert a new timer, or replace ``previous`` (arming again, recreating under a new revision)."""
        if previous is not None:
            TIMER_LIFECYCLE.check(previous.id, previous.state, timer.state)
        elif timer.state is not TimerState.ARMED:
            raise IllegalTransition(f"timer {timer.id}: a new timer starts armed, not {timer.state}")
        self._timer_rows.pop(timer.id, None)
        self._conn.execute(
            f"INSERT INTO timers ({_sql.TIMER_COLUMNS}, armed_seq)"
            f" VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {NEXT_ARMED_SEQ})"
            f" ON CONFLICT (id) DO UPDATE SET {_REPLACE_TIMER}",
            (
                timer.id,
                timer.revision,
                timer.state.value,
                timer.fire_at_ms,
                timer.source,
                timer.type,
                timer.scope,
                timer.key,
                timer.work_id,
                json.dumps(timer.payload, sort_keys=True),
                timer.delivery_id,
                timer.interval_ms,
                timer.recurrence,
                json.dumps(timer.spec, sort_keys=True) if timer.spec is not None else None,
                timer.parent_id,
                timer.execution_id,
                timer.occurrences,
                timer.reason,
                timer.created_at_ms,
                timer.updated_at_ms,
            ),
        )

    def set_timer_state(
        self, timer: Timer, new: TimerState, reason: str | None, now_ms: int, *, fired: bool = False
    ) -> None:
        """Move ``timer`` from the state it was read in to ``new`` (checked against its lifecycle);
        ``fired``: the move is an occurrence's firing, counted in ``occurrences`` by the same statement."""
        TIMER_LIFECYCLE.check(timer.id, timer.state, new)
        self._timer_rows.pop(timer.id, None)
        cur = self._conn.execute(
            "UPDATE timers SET state = ?, reason = ?, updated_at_ms = ?, occurrences = occurrences + ?"
            " WHERE id = ? AND state = ? AND revision = ?",
            (new.value, reason, now_ms, int(fired), timer.id, timer.state.value, timer.revision),
        )
        self._written(cur, f"timer {timer.id}", timer.state, new)

    def rearm_timer(self, timer: Timer, fire_at_ms: int, now_ms: int) -> None:
        """Move a recurring timer to its next occurrence (same id and revision, a new firing identity)."""
        TIMER_LIFECYCLE.check(timer.id, timer.state, TimerState.ARMED)
        self._timer_rows.pop(timer.id, None)
        self._conn.execute(
            "UPDATE timers SET fire_at_ms = ?, occurrences = occurrences + 1, updated_at_ms = ? WHERE id = ?",
            (fire_at_ms, now_ms, timer.id),
        )

    def armed_timers(self, after_id: str, limit: int) -> list[tuple[str, int, int]]:
        """(id, revision, fire_at) of armed timers, by id (the timer service's rebuild)."""
        rows = self._all(
            f"SELECT id, revision, fire_at_ms FROM timers WHERE state = '{TimerState.ARMED.value}' AND id > ?"
            " ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def due_timers(
        self, now_ms: int, after: tuple[int, int, str], limit: int, *, wrapped: bool
    ) -> list[tuple[str, int, int, int]]:
        """(id, revision, fire_at, armed_seq) of armed timers due at ``now_ms``, in due order (due time,
        then the order they were armed): those after ``after`` (or, once ``wrapped``, those up to it).
        An indexed range: the cost follows ``limit``, not the table."""
        op = "<=" if wrapped else ">"
        rows = self._all(
            f"SELECT id, revision, fire_at_ms, armed_seq FROM timers{self.dialect.due_hint}"
            f" WHERE state = 'armed' AND fire_at_ms <= ? AND (fire_at_ms, armed_seq, id) {op} (?, ?, ?)"
            " ORDER BY fire_at_ms, armed_seq, id LIMIT ?",  # 'armed': the partial index's own predicate
            (now_ms, *after, limit),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def due_head(self, now_ms: int, limit: int) -> list[tuple[str, int, int]]:
        """(id, revision, fire_at) of up to ``limit`` armed timers due at ``now_ms``, earliest first. On a
        shared database the rows are locked until the transaction ends, skipping those another node's
        firing holds: nodes divide the due timers. The transaction keeps each row whole, and `timer`
        answers it until the transaction writes that timer or rolls a savepoint back (a firing pass reads
        each of them next: one query for the page instead of one per timer); nobody else can change it
        meanwhile: alone on its database, nobody else writes, and on a shared one this transaction holds
        the row's lock (which also answers `take_timer`)."""
        rows = self._all(
            f"SELECT {_sql.TIMER_COLUMNS} FROM timers{self.dialect.due_hint}"
            " WHERE state = 'armed' AND fire_at_ms <= ? ORDER BY fire_at_ms, armed_seq, id"
            f" LIMIT ?{self.dialect.skip_locked}",
            (now_ms, limit),
        )
        self._timer_rows.update((r[0], r) for r in rows)
        return [(r[0], r[1], r[3]) for r in rows]

    def next_armed(self, limit: int) -> list[tuple[str, int]]:
        """(id, fire_at) of the ``limit`` earliest armed timers (an indexed range: the next deadlines)."""
        rows = self._all(
            f"SELECT id, fire_at_ms FROM timers{self.dialect.due_hint}"
            " WHERE state = 'armed' ORDER BY fire_at_ms, armed_seq, id LIMIT ?",
            (limit,),
        )
        return [(r[0], r[1]) for r in rows]

    def take_timer(self, timer_id: str) -> bool:
        """Lock the timer's row until this transaction ends, so that only one node fires it; ``False``:
        another node holds it now (the row is skipped, not waited for). Alone on the database
        (SQLite) there is nobody to divide with."""
        if not self.dialect.skip_locked or timer_id in self._timer_rows:
            return True  # alone, or the due head locked its row in this transaction (`due_head`)
        if self._one(f"SELECT id FROM timers WHERE id = ?{self.dialect.skip_locked}", (timer_id,)):
            return True
        # not locked by us: either someone else holds it, or it does not exist (then nobody does)
        return self._one("SELECT id FROM timers WHERE id = ?", (timer_id,)) is None

    def firing(self, timer_id: str, revision: int, fire_at_ms: int) -> Firing | None:
        row = self._one(
            f"SELECT {_sql.FIRING_COLUMNS} FROM timer_firings WHERE timer_id = ? AND revision = ? AND fire_at_ms = ?",
            (timer_id, revision, fire_at_ms),
        )
        return _sql.firing_from_row(row) if row else None

    def insert_firing(self, firing: Firing) -> None:
        """Add a firing to its timer's ledger, numbered after every firing of that timer committed
        before it (``commit_seq``): the ledger is read in that order. A timer's firings are serialised
        by its row lock (`take_timer`), and the unique (timer, number) index refuses a racing one."""
        self._conn.execute(
            f"INSERT INTO timer_firings ({_sql.FIRING_COLUMNS}, commit_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?,"
            " (SELECT coalesce(max(commit_seq), 0) + 1 FROM timer_firings WHERE timer_id = ?))",
            (
                firing.timer_id,
                firing.revision,
                firing.fire_at_ms,
                firing.result.value,
                firing.event_id,
                firing.next_fire_at_ms,
                firing.detail,
                firing.at_ms,
                firing.timer_id,
            ),
        )
