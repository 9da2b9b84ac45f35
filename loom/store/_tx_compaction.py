"""The compaction part of `Tx`: pages of what ended, in the order it ended; the facts that say whether
something still refers to a row; the removals with their tombstones; and the sizes of the tables.

Which row may go is the kernel's rule (`kernel.compaction`): this part only finds candidates, reports
what refers to them and removes them, child rows first (foreign keys are on). On a shared database a
page locks the rows it returns and skips those another node's pass holds, so nodes divide the work
and each row is removed once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..records.subscriptions import SubscriptionState
from ..records.waits import WaitState
from ..records.work import InputState
from . import _sql
from ._tx_base import TxBase

_TERMINAL_WORK = "('completed', 'cancelled', 'failed')"  # the works_ended index's own predicate
_OPEN_WAITS = f"('{WaitState.ACTIVE.value}', '{WaitState.BLOCKED.value}')"
_OPEN_SUBS = (
    f"('{SubscriptionState.PENDING.value}', '{SubscriptionState.ACTIVE.value}',"
    f" '{SubscriptionState.DISABLED.value}')"
)
_OPEN_INTENTS = _sql.OPEN_INTENTS
_LIVE = _sql.LIVE
_PENDING = InputState.PENDING.value

TABLES = (
    "events",
    "event_tombstones",
    "checkpoints",
    "works",
    "work_keys",
    "work_inputs",
    "executions",
    "intents",
    "waits",
    "subscriptions",
    "timers",
    "timer_firings",
    "diagnostics",
    "budget_ledgers",
    "causal_buckets",
    "causal_roots",
    "removed_works",
    "removed_timers",
)
"""The tables whose rows the size metrics count."""


@attrs.frozen
class EventRow:
    """A routed Event as compaction sees it (no payload)."""

    seq: int
    id: str
    source: str
    delivery_id: str
    type: str
    scope: str
    key: str | None
    root_id: str
    accepted_at_ms: int
    routed_at_ms: int
    status: str


@attrs.frozen
class EventRefs:
    """What still refers to an Event (each ``True`` keeps it)."""

    pending_input: bool
    trigger: bool
    live_authority: bool
    open_intent: bool
    timer_parent: bool
    untaken_bridge: bool
    open_wait: bool
    """An open wait watches its key and has not looked past it (``after_seq`` below it)."""
    live_attempt: bool
    """The Work owning its key has a live attempt that may still wait on it (watermark below it)."""
    next_attempt: bool
    """The Work owning its key may start an attempt that waits on it: its pending input is all older
    (an attempt's watermark is the newest input it is claimed with)."""
    open_subscription: bool
    """An open subscription on its scope and key has not decided it yet (checkpoint below it)."""
    open_timeout: bool
    """It is the accepted timeout of a wait still open."""


@attrs.frozen
class WorkRefs:
    """What keeps a finished Work (each ``True`` keeps it)."""

    live_attempt: bool
    children: bool
    successor: bool
    live_parent: bool
    armed_timer: bool
    open_subscription: bool
    logs_kept: bool
    """An attempt of it whose executor has not forgotten its logs yet."""
    unrouted: bool
    """An Event not routed yet names it, or one of its keys."""


@attrs.frozen
class AttemptRow:
    id: str
    work_id: str
    attempt: int
    ended_at_ms: int
    executor: str | None
    logs_removed: bool
    scope: str
    latest: int
    """The Work's latest attempt number."""


@attrs.frozen
class AttemptRefs:
    open_wait: bool
    """A wait of it is open, or woken and its continuation not started yet."""
    work_waiting: bool
    """Its Work has an open wait (whose scan excludes the Events of every attempt of the Work)."""
    timer: bool
    """A timer row (any state) names it as the attempt that armed it."""
    open_intent: bool


class CompactionTx(TxBase):
    # -- candidates, in the order they ended ---------------------------------------------------------

    def ended_attempts(self, after: tuple[int, str], before_ms: int, limit: int) -> list[AttemptRow]:
        rows = self._all(
            "SELECT x.id, x.work_id, x.attempt, x.ended_at_ms, x.executor, x.logs_removed_at_ms,"
            " (SELECT w.scope FROM works w WHERE w.id = x.work_id),"
            " (SELECT w.attempts FROM works w WHERE w.id = x.work_id)"
            " FROM executions x WHERE x.ended_at_ms IS NOT NULL AND x.ended_at_ms <= ?"
            " AND (x.ended_at_ms, x.id) > (?, ?) ORDER BY x.ended_at_ms, x.id"
            f" LIMIT ?{self.dialect.skip_locked}",
            (before_ms, after[0], after[1], limit),
        )
        return [
            AttemptRow(
                id=r[0],
                work_id=r[1],
                attempt=r[2],
                ended_at_ms=r[3],
                executor=r[4],
                logs_removed=r[5] is not None,
                scope=r[6],
                latest=r[7],
            )
            for r in rows
        ]

    def ended_works(self, after: tuple[int, str], before_ms: int, limit: int) -> list[tuple[str, str, int]]:
        """(id, scope, ended_at) of finished Works that ended by ``before_ms``, after ``after``."""
        rows = self._all(
            f"SELECT id, scope, updated_at_ms FROM works WHERE state IN {_TERMINAL_WORK}"
            " AND updated_at_ms <= ? AND (updated_at_ms, id) > (?, ?) ORDER BY updated_at_ms, id"
            f" LIMIT ?{self.dialect.skip_locked}",
            (before_ms, after[0], after[1], limit),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def ended_timers(
        self, after: tuple[int, str], before_ms: int, limit: int
    ) -> list[tuple[str, int, str, int]]:
        """(id, revision, scope, ended_at) of timers no longer armed that ended by ``before_ms``."""
        rows = self._all(
            "SELECT id, revision, scope, updated_at_ms FROM timers WHERE state != 'armed'"
            " AND updated_at_ms <= ? AND (updated_at_ms, id) > (?, ?) ORDER BY updated_at_ms, id"
            f" LIMIT ?{self.dialect.skip_locked}",
            (before_ms, after[0], after[1], limit),
        )
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def armed_firings(self, after: tuple[str, int, int], limit: int) -> list[tuple[str, int, int, int, str]]:
        """(timer_id, revision, fire_at, at_ms, scope) of ledger entries of timers still armed (a
        recurring timer's past firings, an earlier revision's), in ledger order after ``after``."""
        rows = self._all(
            "SELECT f.timer_id, f.revision, f.fire_at_ms, f.at_ms, t.scope FROM timer_firings f"
            " JOIN timers t ON t.id = f.timer_id WHERE t.state = 'armed'"
            " AND (f.timer_id, f.revision, f.fire_at_ms) > (?, ?, ?)"
            " ORDER BY f.timer_id, f.revision, f.fire_at_ms LIMIT ?",
            (*after, limit),
        )
        return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    def routed_events(self, after_seq: int, upto_seq: int, limit: int) -> list[EventRow]:
        """Events with a routing checkpoint in ``(after_seq, upto_seq]``, in sequence order."""
        rows = self._all(
            "SELECT e.seq, e.id, e.source, e.delivery_id, e.type, e.scope, e.key, e.root_id, e.accepted_at_ms,"
            " (SELECT c.at_ms FROM checkpoints c WHERE c.seq = e.seq),"
            " (SELECT c.status FROM checkpoints c WHERE c.seq = e.seq)"
            " FROM events e WHERE e.seq > ? AND e.seq <= ? ORDER BY e.seq"
            f" LIMIT ?{self.dialect.skip_locked}",
            (after_seq, upto_seq, limit),
        )
        return [
            EventRow(
                seq=r[0],
                id=r[1],
                source=r[2],
                delivery_id=r[3],
                type=r[4],
                scope=r[5],
                key=r[6],
                root_id=r[7],
                accepted_at_ms=r[8],
                routed_at_ms=r[9] if r[9] is not None else -1,
                status=r[10] or "",
            )
            for r in rows
        ]

    def ended_ledgers(self, after: tuple[str, str, str], limit: int) -> list[tuple[str, str, str]]:
        """(budget, subject, window) of ledgers of a bounded window (a day or a week), in key order."""
        rows = self._all(
            'SELECT budget, subject, "window" FROM budget_ledgers WHERE "window" != \'life\''
            ' AND (budget, subject, "window") > (?, ?, ?) ORDER BY budget, subject, "window" LIMIT ?',
            (*after, limit),
        )
        return [(r[0], r[1], r[2]) for r in rows]

    def attempts_with_logs(
        self, after: tuple[int, str], before_ms: int, limit: int
    ) -> list[tuple[str, str, str, Any, int, str]]:
        """(id, work_id, executor, metadata, ended_at, scope) of ended attempts whose executor has not
        forgotten their logs, ended by ``before_ms``, after ``after``."""
        rows = self._all(
            "SELECT x.id, x.work_id, x.executor, x.metadata, x.ended_at_ms,"
            " (SELECT w.scope FROM works w WHERE w.id = x.work_id) FROM executions x"
            " WHERE x.ended_at_ms IS NOT NULL AND x.ended_at_ms <= ? AND (x.ended_at_ms, x.id) > (?, ?)"
            " AND x.executor IS NOT NULL AND x.logs_removed_at_ms IS NULL"
            " ORDER BY x.ended_at_ms, x.id LIMIT ?",
            (before_ms, after[0], after[1], limit),
        )
        return [(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows]

    # -- what refers to a row ----------------------------------------------------------------------------

    def event_refs(self, event: EventRow) -> EventRefs:
        key = event.key
        row = self._one(
            "SELECT"
            f" EXISTS (SELECT 1 FROM work_inputs WHERE event_id = ? AND state = '{_PENDING}'),"
            " EXISTS (SELECT 1 FROM executions WHERE trigger_id = ?),"
            f" EXISTS (SELECT 1 FROM executions WHERE authority_id = ? AND state IN {_LIVE}),"
            f" EXISTS (SELECT 1 FROM intents WHERE event_id = ? AND status IN {_OPEN_INTENTS}),"
            " EXISTS (SELECT 1 FROM timers WHERE parent_id = ?),"
            " EXISTS (SELECT 1 FROM waits WHERE bridge_event_id = ? AND state = 'woken' AND taken_at_ms IS NULL),"
            f" EXISTS (SELECT 1 FROM wait_keys k JOIN waits w ON w.id = k.wait_id WHERE k.key = ?"
            f" AND w.state IN {_OPEN_WAITS} AND w.after_seq < ?),"
            " EXISTS (SELECT 1 FROM work_keys o JOIN executions x ON x.work_id = o.work_id WHERE o.key = ?"
            f" AND x.state IN {_LIVE} AND x.watermark < ?),"
            " EXISTS (SELECT 1 FROM subscriptions WHERE source_key = ? AND source_scope = ?"
            f" AND state IN {_OPEN_SUBS} AND checkpoint_seq < ?),"
            " EXISTS (SELECT 1 FROM work_keys o WHERE o.key = ? AND (SELECT max(i.seq) FROM work_inputs i"
            f" WHERE i.work_id = o.work_id AND i.state = '{_PENDING}') < ?)",
            (
                event.id,
                event.id,
                event.id,
                event.id,
                event.id,
                event.id,
                key,
                event.seq,
                key,
                event.seq,
                key,
                event.scope,
                event.seq,
                key,
                event.seq,
            ),
        )
        assert row is not None
        return EventRefs(
            pending_input=bool(row[0]),
            trigger=bool(row[1]),
            live_authority=bool(row[2]),
            open_intent=bool(row[3]),
            timer_parent=bool(row[4]),
            untaken_bridge=bool(row[5]),
            open_wait=bool(row[6]),
            live_attempt=bool(row[7]),
            open_subscription=bool(row[8]),
            next_attempt=bool(row[9]),
            open_timeout=False,
        )

    def wait_open(self, wait_id: str) -> bool:
        row = self._one(f"SELECT 1 FROM waits WHERE id = ? AND state IN {_OPEN_WAITS}", (wait_id,))
        return row is not None

    def work_refs(self, work_id: str, keys: Sequence[str], watermark: int) -> WorkRefs:
        row = self._one(
            "SELECT"
            f" EXISTS (SELECT 1 FROM executions WHERE work_id = ? AND state IN {_LIVE}),"
            " EXISTS (SELECT 1 FROM works WHERE parent_id = ?),"
            " EXISTS (SELECT 1 FROM works WHERE predecessor_id = ?),"
            f" EXISTS (SELECT 1 FROM works p JOIN works c ON c.parent_id = p.id WHERE c.id = ?"
            f" AND p.state NOT IN {_TERMINAL_WORK}),"
            " EXISTS (SELECT 1 FROM timers WHERE work_id = ? AND state = 'armed'),"
            " EXISTS (SELECT 1 FROM timers WHERE state = 'armed' AND execution_id IN"
            " (SELECT id FROM executions WHERE work_id = ?)),"
            f" EXISTS (SELECT 1 FROM subscriptions WHERE work_id = ? AND state IN {_OPEN_SUBS}),"
            " EXISTS (SELECT 1 FROM executions WHERE work_id = ? AND executor IS NOT NULL"
            " AND logs_removed_at_ms IS NULL)",
            (work_id,) * 8,
        )
        assert row is not None
        return WorkRefs(
            live_attempt=bool(row[0]),
            children=bool(row[1]),
            successor=bool(row[2]),
            live_parent=bool(row[3]),
            armed_timer=bool(row[4]) or bool(row[5]),
            open_subscription=bool(row[6]),
            logs_kept=bool(row[7]),
            unrouted=self._unrouted_for(work_id, keys, watermark),
        )

    def _unrouted_for(self, work_id: str, keys: Sequence[str], watermark: int) -> bool:
        """An Event above the routing watermark without a checkpoint names the Work or one of its keys
        (every Event at or below the watermark is routed)."""
        unrouted = " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.seq = e.seq) LIMIT 1"
        if self._one(
            f"SELECT 1 FROM events e WHERE e.work_id = ? AND e.seq > ?{unrouted}", (work_id, watermark)
        ):
            return True
        return any(
            self._one(f"SELECT 1 FROM events e WHERE e.key = ? AND e.seq > ?{unrouted}", (key, watermark))
            for key in keys
        )

    def attempt_refs(self, execution_id: str, work_id: str) -> AttemptRefs:
        row = self._one(
            "SELECT"
            f" EXISTS (SELECT 1 FROM waits WHERE execution_id = ? AND (state IN {_OPEN_WAITS}"
            " OR (state = 'woken' AND taken_at_ms IS NULL))),"
            f" EXISTS (SELECT 1 FROM waits WHERE work_id = ? AND state IN {_OPEN_WAITS}),"
            " EXISTS (SELECT 1 FROM timers WHERE execution_id = ?),"
            f" EXISTS (SELECT 1 FROM intents WHERE execution_id = ? AND status IN {_OPEN_INTENTS})",
            (execution_id, work_id, execution_id, execution_id),
        )
        assert row is not None
        return AttemptRefs(
            open_wait=bool(row[0]), work_waiting=bool(row[1]), timer=bool(row[2]), open_intent=bool(row[3])
        )

    # -- removals ------------------------------------------------------------------------------------------

    def remove_attempt(self, execution_id: str) -> None:
        """An ended attempt and what hangs on it: its waits (with their keys and the subscriptions they
        declared) and its intents."""
        waits = "SELECT id FROM waits WHERE execution_id = ?"
        self._conn.execute(f"DELETE FROM subscriptions WHERE wait_id IN ({waits})", (execution_id,))
        self._waits_on_key.clear()
        self._untaken = None  # (its wakes go with it)
        self._conn.execute(f"DELETE FROM wait_keys WHERE wait_id IN ({waits})", (execution_id,))
        self._conn.execute("DELETE FROM waits WHERE execution_id = ?", (execution_id,))
        self._conn.execute("DELETE FROM intents WHERE execution_id = ?", (execution_id,))
        self._to_carry.changed_attempt(execution_id)
        self._to_carry.lose_works()  # (an ended attempt is no Work's part; its waits, ended, neither)
        self._conn.execute("DELETE FROM executions WHERE id = ?", (execution_id,))

    def remove_work(self, work_id: str, now_ms: int) -> int:
        """A finished Work and everything that is its own: subscriptions, waits, intents, inputs,
        attempts, per-Work budget ledgers, keys. Its Events stay (their own retention) and their
        checkpoints no longer name it. A tombstone keeps its id from being reused. Returns how many
        attempts went with it."""
        self.write_bumps()  # (none waits for an ended Work; nor, then, for one removed)
        waits = "SELECT id FROM waits WHERE work_id = ?"
        conn = self._conn
        conn.execute("DELETE FROM subscriptions WHERE work_id = ?", (work_id,))
        conn.execute(f"DELETE FROM subscriptions WHERE wait_id IN ({waits})", (work_id,))
        self._waits_on_key.clear()
        self._untaken = None  # (its wakes go with it)
        conn.execute(f"DELETE FROM wait_keys WHERE wait_id IN ({waits})", (work_id,))
        conn.execute("DELETE FROM waits WHERE work_id = ?", (work_id,))
        conn.execute("DELETE FROM intents WHERE work_id = ?", (work_id,))
        conn.execute("DELETE FROM work_inputs WHERE work_id = ?", (work_id,))
        self._pending.pop(work_id, None)
        self._inputs_changed.add(work_id)
        self._to_carry.work_written(work_id)
        self._inputs.clear()
        conn.execute("UPDATE checkpoints SET work_id = NULL WHERE work_id = ?", (work_id,))
        self._to_carry.lose_routed(self._kept)
        self._to_carry.lose_attempts()
        attempts = conn.execute("DELETE FROM executions WHERE work_id = ?", (work_id,)).rowcount
        conn.execute("DELETE FROM budget_ledgers WHERE subject = ?", (work_id,))
        conn.execute("DELETE FROM work_keys WHERE work_id = ?", (work_id,))
        self._key_owners.clear()
        if self._kept is not None:
            self._kept.owners.clear()
        conn.execute("DELETE FROM works WHERE id = ?", (work_id,))
        conn.execute(
            "INSERT INTO removed_works (id, removed_at_ms) VALUES (?, ?)"
            " ON CONFLICT (id) DO UPDATE SET removed_at_ms = excluded.removed_at_ms",
            (work_id, now_ms),
        )
        if self._removed_works is not None:
            self._removed_works = True
        return int(attempts)

    def remove_timer(self, timer_id: str, revision: int, now_ms: int) -> int:
        """An ended timer and its ledger; a tombstone keeps its last revision (arming it again goes on
        from there). Returns how many ledger entries went with it."""
        firings = self._conn.execute("DELETE FROM timer_firings WHERE timer_id = ?", (timer_id,)).rowcount
        self._timer_rows.pop(timer_id, None)
        self._conn.execute("DELETE FROM timers WHERE id = ?", (timer_id,))
        self._conn.execute(
            "INSERT INTO removed_timers (id, revision, removed_at_ms) VALUES (?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET revision = excluded.revision, removed_at_ms = excluded.removed_at_ms",
            (timer_id, revision, now_ms),
        )
        return int(firings)

    def remove_firings(self, keys: Sequence[tuple[str, int, int]]) -> None:
        self._conn.executemany(
            "DELETE FROM timer_firings WHERE timer_id = ? AND revision = ? AND fire_at_ms = ?", keys
        )

    def remove_event(self, event: EventRow, *, tombstone: bool) -> None:
        """A routed Event with its checkpoint, ended intents, consumed inputs and replay history; its
        tombstone keeps its delivery identity and sequence. Its root's pinned causal limits go with the
        last Event of the root."""
        conn = self._conn
        conn.execute("DELETE FROM intents WHERE event_id = ?", (event.id,))
        conn.execute("DELETE FROM work_inputs WHERE event_id = ?", (event.id,))
        self._pending.clear()  # the Event's inputs are consumed ones: forgotten all the same
        self._inputs_lost = True
        self._inputs.clear()
        self._to_carry.lose_works()  # (its inputs are consumed ones, no Work's part: all the same)
        conn.execute(
            "DELETE FROM replaced_checkpoints WHERE event_id = ? OR replay_id = ?", (event.id, event.id)
        )
        conn.execute("DELETE FROM checkpoints WHERE seq = ?", (event.seq,))
        self._to_carry.lose_routed(self._kept)
        conn.execute("DELETE FROM events WHERE seq = ?", (event.seq,))
        self._routed_through = self._max_seq = None
        self._events.pop(event.id, None)
        self._unrouted.discard(event.id)
        if tombstone:
            conn.execute(
                "INSERT INTO event_tombstones (seq, source, delivery_id, accepted_at_ms) VALUES (?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (event.seq, event.source, event.delivery_id, event.accepted_at_ms),
            )
        if (  # a root is found by its id, an Event derived from it by the root's index (``events_root``)
            self._one("SELECT 1 FROM events WHERE id = ?", (event.root_id,)) is None
            and self._one(
                "SELECT 1 FROM events WHERE root_id = ? AND root_id != id LIMIT 1", (event.root_id,)
            )
            is None
        ):
            conn.execute("DELETE FROM causal_roots WHERE root_id = ?", (event.root_id,))

    def remove_ledger(self, budget: str, subject: str, window: str) -> None:
        self._conn.execute(
            'DELETE FROM budget_ledgers WHERE budget = ? AND subject = ? AND "window" = ?',
            (budget, subject, window),
        )

    def mark_logs_removed(self, execution_ids: Sequence[str], now_ms: int) -> None:
        for execution_id in execution_ids:  # (a column no read of an attempt names: told all the same)
            self._to_carry.changed_attempt(execution_id)
        self._conn.executemany(
            "UPDATE executions SET logs_removed_at_ms = ? WHERE id = ? AND logs_removed_at_ms IS NULL",
            [(now_ms, i) for i in execution_ids],
        )
