"""The admission part of `Tx`: the ready queue, Work a pass passed over, and capacity pools.

A Work in the ready queue has a ``ready_seq`` (its place in readiness order: the tail when it joined)
and ``blocked`` says why the admission pass passed over it (``None``: the pass looks at it). Which Work
belongs in the queue is the kernel's rule (`kernel.admission`); this part only stores and finds it, and
records what the rule needs to know: which Works a request touched, and which pools an ended attempt
freed a slot in.
"""

from __future__ import annotations

import attrs

from ..records.work import CAPACITY_STATES, ExecutionState, InputState, RetryState, Work, WorkState
from . import _sql
from ._dialect import SQLITE
from ._tx_base import MISSING, PATCHED_READS, TxBase

_COUNTED = _sql._sql_set(CAPACITY_STATES)
_LIVE = _sql.LIVE


@attrs.frozen
class AdmissionFacts:
    """What decides whether a Work belongs in the ready queue, read in one query."""

    state: WorkState
    held: bool
    retry: RetryState | None
    execution_state: ExecutionState | None
    has_pending: bool
    ready_seq: int | None
    blocked: str | None
    scope: str
    updated_at_ms: int

    @classmethod
    def told(
        cls,
        work: Work,
        state: WorkState,
        place: QueuePlace,
        now_ms: int,
        *,
        live: ExecutionState | None,
        pending: bool,
    ) -> AdmissionFacts:
        """The facts of ``work`` (as read) once a procedure moved it to ``state`` at ``now_ms``, with
        ``live`` its live attempt's state (for a procedure to tell: `TxBase.known`)."""
        return cls(
            state=state,
            held=work.held,
            retry=work.retry,
            execution_state=live,
            has_pending=pending,
            ready_seq=place.ready_seq,
            blocked=place.blocked,
            scope=work.scope,
            updated_at_ms=now_ms,
        )


@attrs.frozen
class QueuePlace:
    """A Work's place in the ready queue, as `AdmissionFacts` holds it, and when it took it."""

    ready_seq: int | None
    ready_at_ms: int | None
    blocked: str | None


_FACTS = (
    "SELECT w.state, w.held, w.retry, w.ready_seq, w.blocked, w.scope, w.updated_at_ms,"
    f" (SELECT x.state FROM executions x WHERE x.work_id = w.id AND x.state IN {_LIVE}),"
    " EXISTS (SELECT 1 FROM work_inputs i WHERE i.work_id = w.id"
    f" AND i.state = '{InputState.PENDING.value}')"
    " FROM works w WHERE w.id = ?"
)
_QUEUE_PLACE = "SELECT ready_seq, ready_at_ms, blocked FROM works WHERE id = ?"
PATCHED_READS.update((_FACTS, _QUEUE_PLACE, _sql.work_with_parts(SQLITE.json_pairs)))
# (the facts here, and `Tx.work`'s read, are patched; a bump writes no part of the queue place)


class AdmissionTx(TxBase):
    def admission_facts(self, work_id: str) -> AdmissionFacts | None:
        """What decides whether ``work_id`` belongs in the ready queue; a repeated read with no write
        between is answered from the first (`recall`: a start that declined, then the settle hook)."""
        known = self.recall("facts", work_id)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._one(_FACTS, (work_id,))
        if row is None:
            return self.keep("facts", work_id, None)  # type: ignore[no-any-return]
        if work_id in self._bumps:
            row = self.patched(work_id, row, None, 6, 0)
        facts = AdmissionFacts(
            state=WorkState(row[0]),
            held=bool(row[1]),
            retry=RetryState(row[2]) if row[2] else None,
            ready_seq=row[3],
            blocked=row[4],
            scope=row[5],
            updated_at_ms=row[6],
            execution_state=ExecutionState(row[7]) if row[7] else None,
            has_pending=bool(row[8]),
        )
        return self.keep("facts", work_id, facts)  # type: ignore[no-any-return]

    def kept_queue_place(self, work_id: str) -> QueuePlace | None:
        """The Work's place in the ready queue as this transaction keeps it (read with the Work, or
        told), without reading it; ``None`` if it keeps none."""
        known = self.recall("place", work_id)
        return None if known is MISSING else known

    def queue_place(self, work_id: str) -> QueuePlace:
        """Where a Work stands in the ready queue (all ``None``: it is not in it, or there is no such Work);
        answered from the Work's read, while no row changed since (`Tx.work`)."""
        known = self.kept_queue_place(work_id)
        if known is not None:
            return known
        row = self._one(_QUEUE_PLACE, (work_id,))
        return QueuePlace(*row) if row is not None else QueuePlace(None, None, None)

    def mark_changed(self, work_id: str, now_ms: int) -> None:
        """Record that a Work changed at ``now_ms`` (its place in the order of last change)."""
        if self._bumps:
            self._flush_bumps()  # a bump that waits writes the time too (`TxBase.bump_work`)
        self._to_carry.work_written(work_id)
        self._conn.execute("UPDATE works SET updated_at_ms = ? WHERE id = ?", (now_ms, work_id))

    def enqueue_work(self, work_id: str, now_ms: int) -> None:
        """Put a Work at the tail of the ready queue (behind every Work in it now)."""
        self._to_carry.work_written(work_id)
        self._conn.execute(
            "UPDATE works SET ready_seq = (SELECT coalesce(max(ready_seq), 0) + 1 FROM works"
            " WHERE ready_seq IS NOT NULL), ready_at_ms = ?, blocked = NULL WHERE id = ?",
            (now_ms, work_id),
        )

    def dequeue_work(self, work_id: str) -> None:
        self._to_carry.work_written(work_id)
        self._conn.execute(
            "UPDATE works SET ready_seq = NULL, ready_at_ms = NULL, blocked = NULL WHERE id = ?", (work_id,)
        )

    def block_work(self, work_id: str, blocked: str | None) -> None:
        """Record why the admission pass passed over a queued Work (``None``: it looks again)."""
        self._to_carry.work_written(work_id)
        self._conn.execute("UPDATE works SET blocked = ? WHERE id = ?", (blocked, work_id))

    def admission_page(self, limit: int) -> list[tuple[str, int]]:
        """(id, ready_seq) of up to ``limit`` queued Works the pass looks at, head first. On a shared
        database the rows are locked until the transaction ends, skipping those another node holds."""
        rows = self._all(
            "SELECT id, ready_seq FROM works WHERE ready_seq IS NOT NULL AND blocked IS NULL"
            f" ORDER BY ready_seq, id LIMIT ?{self.dialect.skip_locked}",
            (limit,),
        )
        return [(r[0], r[1]) for r in rows]

    def unblock(self, blocked: str, limit: int) -> list[str]:
        """Let the pass look again at the first ``limit`` Works passed over for ``blocked``, in
        readiness order."""
        rows = self._all(
            "SELECT id FROM works WHERE blocked = ? ORDER BY ready_seq, id LIMIT ?", (blocked, limit)
        )
        for (work_id,) in rows:
            self._to_carry.work_written(work_id)
            self._conn.execute("UPDATE works SET blocked = NULL WHERE id = ?", (work_id,))
        return [r[0] for r in rows]

    def unblock_all(self) -> int:
        self._to_carry.lose_works()
        cur = self._conn.execute("UPDATE works SET blocked = NULL WHERE blocked IS NOT NULL")
        return int(cur.rowcount)

    def blocked_count(self, blocked: str) -> int:
        row = self._one("SELECT count(*) FROM works WHERE blocked = ?", (blocked,))
        return int(row[0]) if row else 0

    def lock_pool(self, pool: str) -> None:
        """Serialise claims and freed slots of one capacity pool until this transaction ends (a shared
        database: two nodes must not both take a pool's last slot). The acceptance-order lock comes
        first: transactions that need both (most do) then take them in one order, and two pools' locks
        are never waited for by two nodes at once (both deadlocked between nodes under load)."""
        if self.dialect.pool_lock is not None:
            self._ordered()
            self._conn.execute(self.dialect.pool_lock, (f"pool:{pool}",))

    def pool_running(self, pool: str) -> int:
        """Attempts counting against ``pool`` now."""
        row = self._one(
            f"SELECT count(*) FROM executions WHERE pool = ? AND pool IS NOT NULL AND state IN {_COUNTED}",
            (pool,),
        )
        return int(row[0]) if row else 0
