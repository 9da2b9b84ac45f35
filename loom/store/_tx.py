"""`Tx`: the typed data-access object a kernel procedure runs against. SQL lives here.

A `Tx` wraps one DB-API connection inside an open transaction (the storage actor
opened it). Procedures call its methods and record commit notices with `notify`;
the notices reach the actors only after the batch commits.

Every state write goes through a ``set_*_state`` method that checks the record's lifecycle
(`loom.records.states`) and writes with a compare-and-set on the state it read, so an
illegal or stale transition raises `IllegalTransition` and writes nothing. A Work's move that waits
(`Tx.move_later`) is checked when it is made, and its compare-and-set, on the state in the database,
goes with the Work's next write.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..records.events import DiagnosticKind, Event, KVEntry
from ..records.notices import WorkSettled
from ..records.timers import Timer, TimerState
from ..records.work import WORK_LIFECYCLE, Checkpoint, Work, WorkState
from . import _sql
from ._tx_admission import AdmissionTx, QueuePlace
from ._tx_base import MISSING
from ._tx_budgets import BudgetsTx
from ._tx_causal import CausalTx
from ._tx_compaction import CompactionTx
from ._tx_executions import ExecutionsTx
from ._tx_inputs import InputsTx
from ._tx_subscriptions import SubscriptionsTx
from ._tx_timers import TimersTx
from ._tx_tombstones import TombstonesTx
from ._tx_waits import WaitsTx

_LIVE = _sql.LIVE
_EVENT_WIDTH = len(_sql.EVENT_COLUMNS.split(","))
_WORK_FIELDS = frozenset(
    {
        "held",
        "hold_reason",
        "attempts",
        "started",
        "release_once",
        "failures",
        "retry",
        "retry_timer_id",
        "budget_hold",
    }
)


class Tx(
    ExecutionsTx,
    InputsTx,
    WaitsTx,
    TimersTx,
    BudgetsTx,
    CausalTx,
    SubscriptionsTx,
    AdmissionTx,
    CompactionTx,
    TombstonesTx,
):
    """The data-access object of one open transaction (see the module docstring)."""

    # -- events -----------------------------------------------------------

    def insert_event(
        self,
        *,
        id: str,
        source: str,
        delivery_id: str,
        type: str,
        scope: str,
        key: str | None,
        work_id: str | None,
        execution_id: str | None,
        payload_json: str,
        parent_id: str | None,
        cause_id: str | None,
        root_id: str,
        depth: int,
        accepted_at_ms: int,
        if_new: bool = False,
    ) -> int | None:
        """Insert an immutable Event; return its sequence (strictly increasing). With ``if_new``: only if
        no Event or tombstone holds its delivery identity (``None``: one does; `_sql.INSERT_NEW_EVENT`)."""
        self._ordered()
        kept = self._caching and self._reads_current()
        params = (
            id,
            source,
            delivery_id,
            type,
            scope,
            key,
            work_id,
            execution_id,
            payload_json,
            parent_id,
            cause_id,
            root_id,
            depth,
            accepted_at_ms,
            *((source, delivery_id, source, delivery_id) if if_new else ()),
        )
        if self.dialect.seq_by_rowid:
            cur = self._conn.execute(_sql.INSERT_NEW_EVENT if if_new else _sql.INSERT_EVENT, params)
            inserted: int | None = cur.lastrowid if cur.rowcount == 1 else None
        else:
            row = self._conn.execute(
                _sql.INSERT_NEW_EVENT_RETURNING if if_new else _sql.INSERT_EVENT_RETURNING, params
            ).fetchone()
            inserted = None if row is None else row[0]
        if inserted is None:
            assert if_new, "an insert returned no sequence"
            return None
        seq = int(inserted)
        if self._kept is not None:  # (its routing may make it a Work's input: `ToCarry.routed`)
            self._to_carry.sizes[id] = len(payload_json)
        if kept:
            # a new Event changes no record `recall` keeps (an Event's own routing is read only once
            # it exists): what was read before it still answers
            self._reads_at = self.dialect.changes(self._conn)
        if self._max_seq is not None:
            self._max_seq = max(self._max_seq, seq)
        return seq

    def event(self, event_id: str) -> Event | None:
        """An Event by id; a repeated read is answered from the first, on every backend: an Event row
        never changes, and is removed only by compaction, long after it was routed and its inputs
        consumed (a removal this transaction makes forgets it)."""
        known: Event | None = self._events.get(event_id)
        if known is not None:
            return known
        row = self._one(_sql.EVENT_BY_ID, (event_id,))
        if row is None:
            return None
        event = self._events[event_id] = _sql.event_from_row(row)
        return event

    def accepted(self, event: Event) -> None:
        """``event`` was inserted by this transaction: a read of it, and of its routing (none until
        `insert_checkpoint` writes it), is answered from here, on every backend: no other transaction
        sees the row before this one commits, so none can have routed it (or removed it) meanwhile."""
        self._events[event.id] = event
        self._unrouted.add(event.id)

    def event_by_delivery(self, source: str, delivery_id: str) -> Event | None:
        row = self._one(_sql.EVENT_BY_DELIVERY, (source, delivery_id))
        return _sql.event_from_row(row) if row else None

    def delivery(self, source: str, delivery_id: str) -> Event | tuple[int, int] | None:
        """What a delivery identity was accepted as, in one query: the Event, else a removed Event's
        tombstone (its sequence and acceptance time), else ``None``."""
        row = self._one(_sql.DELIVERY, (source, delivery_id, source, delivery_id))
        assert row is not None
        if row[0] is not None:
            return _sql.event_from_row(row)
        if row[_EVENT_WIDTH] is not None:
            return int(row[_EVENT_WIDTH]), int(row[_EVENT_WIDTH + 1])
        return None

    def unrouted_events(self, after_seq: int, limit: int) -> list[Event]:
        """Events above ``after_seq`` without a routing checkpoint, in acceptance order."""
        return [_sql.event_from_row(r) for r in self._all(_sql.UNROUTED_EVENTS, (after_seq, limit))]

    def first_unrouted_seq(self, after_seq: int, through_seq: int) -> int | None:
        """The sequence of the first Event in (``after_seq``, ``through_seq``] without a routing
        checkpoint (``None``: every one there is routed)."""
        row = self._one(_sql.FIRST_UNROUTED, (after_seq, through_seq))
        return int(row[0]) if row else None

    def max_seq(self) -> int:
        if self._max_seq is not None and self._caching and not self.dialect.shared:
            return self._max_seq
        row = self._one("SELECT coalesce(max(seq), 0) FROM events")
        assert row is not None
        self._max_seq = int(row[0])
        return self._max_seq

    def routed_through(self, watermark: int, wanted: int, window: int) -> int:
        """A sequence at or above the routing ``watermark`` up to which every Event has its checkpoint,
        found as far as ``wanted`` if it can be: this transaction reads on from what it knows routed
        until it reaches ``wanted`` or finds an unrouted Event, at most ``window`` Events in all (a
        watermark far behind costs a transaction a bounded read, as `unrouted.raise_watermark_in_tx`
        does; the searches go on from what was found). Each checkpoint it writes right after what it
        knows moves that on, so a search for unrouted Events starts there. A rollback, a replay or a
        removal forgets it. On a shared database, where other nodes route meanwhile, the watermark
        alone."""
        if not self._caching or self.dialect.shared:
            return watermark
        if self._routed_through is None or self._routed_through < watermark:
            self._routed_through, self._unrouted_at = watermark, None
        if self._scan_left is None:
            self._scan_left = window
        if self._routed_through < wanted and self._unrouted_at is None and self._scan_left > 0:
            through = min(self.max_seq(), self._routed_through + self._scan_left)
            if through > self._routed_through:
                self._scan_left -= through - self._routed_through
                first = self.first_unrouted_seq(self._routed_through, through)
                if first is None:
                    self._routed_through = through
                else:
                    self._routed_through, self._unrouted_at = first - 1, first
        return self._routed_through

    # -- namespaced KV ----------------------------------------------------

    def kv_put(self, namespace: str, key: str, value: dict[str, Any], now_ms: int) -> None:
        """Write a KV entry; on a database alone, reads of it (here and in the transactions after this
        one) answer what was written, as a read would give it back (`kv_get`)."""
        self._kv.pop((namespace, key), None)
        self._to_carry.kv_written.add((namespace, key))
        row = (namespace, key, json.dumps(value, sort_keys=True, separators=(",", ":")), now_ms)
        self._conn.execute(
            "INSERT INTO kv (namespace, key, value, updated_at_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
            " updated_at_ms = excluded.updated_at_ms",
            row,
        )
        if self._caching:
            self._kv[namespace, key] = _sql.kv_from_row(row)

    def kv_get(self, namespace: str, key: str, *, for_update: bool = False) -> KVEntry | None:
        """A KV entry; ``for_update`` locks it until this transaction ends (another node's writer waits),
        after the order lock (`_ordered`), which every writer of order takes first. On a database alone a
        repeated read is answered from the first until the entry is written (`Carried.kv`)."""
        entry_key = (namespace, key)
        if entry_key in self._kv:
            return self._kv[entry_key]  # type: ignore[no-any-return]
        kept = self._kept
        if kept is not None and entry_key in kept.kv and entry_key not in self._to_carry.kv_written:
            return kept.kv[entry_key]  # type: ignore[no-any-return]
        if for_update:
            self._ordered()
        row = self._one(_sql.KV_GET + (self.dialect.for_update if for_update else ""), (namespace, key))
        entry = _sql.kv_from_row(row) if row else None
        if self._caching:
            self._kv[namespace, key] = entry
        return entry

    def kv_list(self, namespace: str, limit: int = 1000) -> list[KVEntry]:
        return [_sql.kv_from_row(r) for r in self._all(_sql.KV_LIST, (namespace, limit))]

    # -- diagnostics ------------------------------------------------------

    def add_diagnostic(
        self, kind: DiagnosticKind, subject: str, message: str, detail: dict[str, Any], now_ms: int
    ) -> int:
        row = self._one(
            "INSERT INTO diagnostics (kind, subject, message, detail, at_ms) VALUES (?, ?, ?, ?, ?) RETURNING id",
            (kind.value, subject, message, json.dumps(detail, sort_keys=True), now_ms),
        )
        assert row is not None
        return int(row[0])

    # -- Work ---------------------------------------------------------------

    def work(self, work_id: str) -> Work | None:
        known = self.recall("work", work_id)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._one(_sql.work_with_parts(self.dialect.json_pairs), (work_id,))
        if row is None:
            return self.keep("work", work_id, None)  # type: ignore[no-any-return]
        if work_id in self._bumps:
            row = self.patched(work_id, row, _sql.WORK_REVISION, _sql.WORK_UPDATED, _sql.WORK_STATE)
        work = _sql.work_from_parts(row, self.pending_of(work_id))
        at = _sql.WORK_QUEUE_PLACE
        self.keep("place", work_id, QueuePlace(row[at], row[at + 1], work.blocked))
        return self.keep("work", work_id, work)  # type: ignore[no-any-return]

    def kept_work(self, work_id: str) -> Work | None:
        """The Work as this transaction keeps it (read, or told, with no row changed since), without
        reading it; ``None`` if it keeps none."""
        known = self.recall("work", work_id)
        return None if known is MISSING else known

    def work_scope_kind(self, work_id: str) -> tuple[str, str | None] | None:
        """A Work's scope and kind alone (its whole row and its pending inputs are read only when needed)."""
        known = self.recall("work", work_id)
        if known is not MISSING:
            return None if known is None else (known.scope, known.kind)
        row = self._one("SELECT scope, kind FROM works WHERE id = ?", (work_id,))
        return (row[0], row[1]) if row else None

    def insert_work(
        self,
        *,
        id: str,
        scope: str,
        kind: str | None,
        parent_id: str | None,
        predecessor_id: str | None,
        generation: int,
        now_ms: int,
    ) -> Work:
        """Insert a new Work, ready, with no key, input or attempt yet; return it as a read would."""
        self._ordered()  # (shared: before the row, which racing nodes would otherwise deadlock on)
        self._conn.execute(
            "INSERT INTO works (id, scope, kind, state, revision, parent_id, predecessor_id, generation,"
            " created_at_ms, updated_at_ms) VALUES (?, ?, ?, 'ready', 1, ?, ?, ?, ?, ?)",
            (id, scope, kind, parent_id, predecessor_id, generation, now_ms, now_ms),
        )
        self.inserted(id)
        self.touch(id)
        if self._caching:
            self._pending[id] = ((), None)  # (no input yet: `add_input` goes on from here)
        row = (id, scope, kind, WorkState.READY.value, 1, 0, None, parent_id, predecessor_id, generation)
        return _sql.work_from_row((*row, 0, 0, now_ms, 0, 0, None, None, now_ms), (), (), None, None)

    def update_work(self, work_id: str, now_ms: int, **fields: Any) -> int:
        """Set non-state ``fields`` on a Work and bump its revision; return the new revision."""
        unknown = set(fields) - _WORK_FIELDS
        assert not unknown, f"update_work: unknown fields {unknown} (states go through set_work_state)"
        sets = "".join(f"{name} = ?, " for name in fields)
        if work_id in self._moves:
            self._flush_bumps()  # (a state that waits goes first: `move_later`)
        bumps, told, _ = self._bumped(work_id)  # (bumps that waited go with it: `bump_work`)
        row = self._one_work(
            f"UPDATE works SET {sets}revision = revision + ?, updated_at_ms = ? WHERE id = ? RETURNING revision",
            (*fields.values(), 1 + bumps, now_ms, work_id),
        )
        self._check_revision(work_id, row, None if told is None else told + 1)
        self.touch(work_id)
        assert row is not None
        return int(row[0])

    def set_work_state(self, work: Work, new: WorkState, now_ms: int, **fields: Any) -> int:
        """Move ``work`` from the state it was read in to ``new`` (checked against its lifecycle), with
        other ``fields``; bump its revision and return it."""
        WORK_LIFECYCLE.check(work.id, work.state, new)
        unknown = set(fields) - _WORK_FIELDS
        assert not unknown, f"set_work_state: unknown fields {unknown}"
        sets = "".join(f"{name} = ?, " for name in fields)
        bumps, told, state = self._bumped(work.id)  # (with a move that waited: `move_later`)
        row = self._one_work(
            f"UPDATE works SET state = ?, {sets}revision = revision + ?, updated_at_ms = ?"
            " WHERE id = ? AND state = ? RETURNING revision",
            (new.value, *fields.values(), 1 + bumps, now_ms, work.id, state or work.state.value),
        )
        self._written(0 if row is None else 1, f"work {work.id}", state or work.state, new)
        self._check_revision(work.id, row, None if told is None else told + 1)
        self.touch(work.id)
        if new.terminal:
            self.notify(WorkSettled(work_id=work.id))
        assert row is not None
        return int(row[0])

    def move_later(self, work: Work, new: WorkState, now_ms: int) -> int:
        """`set_work_state` with no other fields, whose write may wait as a revision bump does (`TxBase.
        bump_work`): inside `holding` or a storage batch, on a database alone, it goes with the Work's
        next write (a wake's move to ready and the claim that follows are one statement), or with the
        bumps that wait for others. ``work`` is as this transaction reads it now: the revision it
        reaches is checked when it is written, and a read of the Work's row meanwhile answers it."""
        if new.terminal or not ((self._holding or self.batched) and self._caching):
            return self.set_work_state(work, new, now_ms)
        WORK_LIFECYCLE.check(work.id, work.state, new)
        state = self._moves[work.id][0] if work.id in self._moves else work.state.value
        revision = self.bump_work(work.id, work.revision, now_ms)
        self._moves[work.id] = (state, new.value)
        return revision

    def successor_of(self, work_id: str) -> str | None:
        row = self._one(
            "SELECT id FROM works WHERE predecessor_id = ? ORDER BY created_at_ms DESC, id", (work_id,)
        )
        return str(row[0]) if row else None

    # -- keys ---------------------------------------------------------------

    def key_owner(self, key: str) -> str | None:
        """The Work ``key`` is attached to; a repeated read is answered from the first, and on a
        database alone an owner an earlier transaction committed is too (`TxBase.committed`). A key is
        attached once and detached only when compaction removes its Work, so an owner found stays the
        owner on every backend; that a key has none is kept on a database alone (on a shared one
        another node may attach it meanwhile), by this transaction only."""
        if key in self._key_owners:
            return self._key_owners[key]
        if self._kept is not None and key in self._kept.owners:  # (committed earlier: `TxBase.committed`)
            committed = self._key_owners[key] = self._kept.owners[key]
            return committed
        row = self._one("SELECT work_id FROM work_keys WHERE key = ?", (key,))
        owner = str(row[0]) if row else None
        if owner is not None or self._caching:
            self._key_owners[key] = owner
        return owner

    def attach_key(self, key: str, work_id: str, seq: int, now_ms: int) -> None:
        self._conn.execute(
            "INSERT INTO work_keys (key, work_id, attached_seq, attached_at_ms) VALUES (?, ?, ?, ?)",
            (key, work_id, seq, now_ms),
        )
        self._key_owners[key] = work_id
        self._to_carry.work_written(work_id)

    # -- routing checkpoints --------------------------------------------------

    def checkpoint(self, event_id: str) -> Checkpoint | None:
        known = self.recall("checkpoint", event_id)  # (one this transaction wrote: `TxBase.hold`)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._one(_sql.CHECKPOINT_BY_EVENT, (event_id,))
        return _sql.checkpoint_from_row(row) if row else None

    def event_to_route(self, event_id: str) -> tuple[Event, Checkpoint | None] | None:
        """An Event and its routing checkpoint (``None`` while unrouted), in one query; ``None``
        without such an Event."""
        if event_id in self._unrouted:
            return self._events[event_id], None  # accepted here, routed nowhere yet
        known = self.recall("event_to_route", event_id)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._one(_sql.EVENT_TO_ROUTE, (event_id,))
        if row is None:
            return None
        width = _EVENT_WIDTH
        checkpoint = _sql.checkpoint_from_row(row[width:]) if row[width] is not None else None
        return self.keep("event_to_route", event_id, (_sql.event_from_row(row), checkpoint))  # type: ignore[no-any-return]

    def insert_checkpoint(self, cp: Checkpoint) -> None:
        self._ordered()  # its commit_seq is the Work's history order
        self._unrouted.discard(cp.event_id)
        if cp.work_id is not None and cp.event_id in self._to_carry.sizes:  # (a database alone only)
            self._to_carry.routed[cp.event_id] = (cp, self._to_carry.sizes[cp.event_id])
        self._conn.execute(
            "INSERT INTO checkpoints (event_id, seq, status, work_id, route, route_scope, policy,"
            " effective_policy, fallback_reason, reason, generation, at_ms, commit_seq)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
            " (SELECT coalesce(max(commit_seq), 0) + 1 FROM checkpoints))",
            (
                cp.event_id,
                cp.seq,
                cp.status.value,
                cp.work_id,
                cp.route,
                cp.route_scope,
                cp.policy.value if cp.policy else None,
                cp.effective_policy.value if cp.effective_policy else None,
                cp.fallback_reason,
                cp.reason,
                cp.generation,
                cp.at_ms,
            ),
        )
        if self._routed_through is not None and cp.seq == self._routed_through + 1:
            self._routed_through = cp.seq  # written: the Event is routed
            if self._unrouted_at == cp.seq:
                self._unrouted_at = None  # what stopped the search is routed now: it may read on

    def earlier_unrouted_for(
        self, work_id: str, scope: str, keys: Sequence[str], before_seq: int, *, after_seq: int = 0
    ) -> list[Event]:
        """Unrouted Events between ``after_seq`` and ``before_seq`` (both excluded) that resolve to
        ``work_id`` (explicitly, or by ``keys`` in its ``scope``: an Event of another scope never goes
        to it). ``after_seq``: the routing watermark, at or below which every Event is routed, so the
        search reads the Work's Events not yet known routed, not its whole history."""
        if after_seq + 1 >= before_seq:
            return []  # nothing was accepted between them: every Event before is known routed
        # one indexed probe per key and one for the explicit id
        unrouted = " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.seq = e.seq)"
        found: dict[str, tuple[Any, ...]] = {}
        probes: list[tuple[str, tuple[str, ...]]] = [("e.work_id = ?", (work_id,))]
        probes += [("e.key = ? AND e.scope = ?", (key, scope)) for key in dict.fromkeys(keys)]
        for where, values in probes:
            for row in self._all(
                f"SELECT {_sql.EVENT_COLUMNS} FROM events e WHERE {where} AND e.seq > ? AND e.seq < ?{unrouted}",
                (*values, after_seq, before_seq),
            ):
                found[row[0]] = row
        return sorted((_sql.event_from_row(r) for r in found.values()), key=lambda e: e.seq)

    # -- inputs ---------------------------------------------------------------

    def armed_timers_of_work(self, work_id: str) -> list[Timer]:
        """Armed timers that an attempt of ``work_id`` armed (deadlines and derived timers)."""
        rows = self._all(
            f"{_sql.TIMER_SELECT} t WHERE t.state = '{TimerState.ARMED.value}' AND t.execution_id IN"
            " (SELECT id FROM executions WHERE work_id = ?) ORDER BY t.id",
            (work_id,),
        )
        return [_sql.timer_from_row(r) for r in rows]

    # -- replays ----------------------------------------------------------------

    def replace_checkpoint(self, cp: Checkpoint, replay_id: str, now_ms: int) -> None:
        """Move an Event's checkpoint to the replaced history, making the Event unrouted again."""
        self._conn.execute(
            "INSERT INTO replaced_checkpoints (event_id, replay_id, status, work_id, route, reason, at_ms,"
            " replaced_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (cp.event_id, replay_id, cp.status.value, cp.work_id, cp.route, cp.reason, cp.at_ms, now_ms),
        )
        self._conn.execute("DELETE FROM checkpoints WHERE seq = ?", (cp.seq,))
        self._to_carry.lose_routed(self._kept)
        self._routed_through = None
