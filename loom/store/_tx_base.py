"""`TxBase`: the plumbing every part of `Tx` shares (the connection, its dialect, notices, savepoints)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..records.errors import IllegalTransition
from ..records.notices import Notice
from ..records.work import ExecutionState
from ._blocks import Holding, Savepoint, Unguarded
from ._carried import KEPT, OF_WORK, Carried, Lazy, NoneKnown, Pending, ToCarry
from ._carried import MISSING as MISSING
from ._dialect import SQLITE, Connection, Cursor, Dialect, RowConflict

Params = Sequence[Any]


PATCHED_READS: set[str] = set()
"""Reads of one Work's row by its id that answer what bumps waiting for it will write (`TxBase.patched`)
rather than have them written first (`TxBase.bump_work`)."""

_BUMP = "UPDATE works SET revision = revision + ?, updated_at_ms = ? WHERE id = ? RETURNING revision"
_BUMPS = (
    "UPDATE works SET revision = works.revision + b.n, updated_at_ms = b.at_ms FROM (SELECT"
    " json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS n, json_extract(value, '$[2]')"
    " AS at_ms FROM json_each(?)) AS b WHERE works.id = b.id RETURNING works.id, works.revision"
)
_MOVE = (
    "UPDATE works SET state = ?, revision = revision + ?, updated_at_ms = ? WHERE id = ? AND state = ?"
    " RETURNING revision"
)
"""The revision bumps that wait (`TxBase.bump_work`) for one Work, and for several in one statement
(a JSON list of ``[work id, how many, time]``; a database alone only, where bumps wait); with a
state move that waits (`Tx.move_later`), for one Work."""

_OWN_KINDS = frozenset({"work", "facts", "execution", "execution_state", "execution_token", "segment_clock"})
"""What `TxBase.recall` keeps of a Work (by its id) or an attempt (by its id) this transaction inserted."""


class TxBase:
    def __init__(
        self,
        conn: Connection,
        dialect: Dialect = SQLITE,
        *,
        guarded: bool = True,
        kept: Carried | None = None,
    ) -> None:
        self._conn = conn
        self.dialect = dialect
        self._guarded = guarded
        """Each `savepoint` is a real one; else the batch runs without savepoints (see `Unguarded`,
        made for each block: one kept here would be a cycle, and a transaction's notices and records
        would wait for the collector to go)."""
        self.notices: list[Notice] = []
        self.touched: dict[str, bool] = {}
        """Works whose state, inputs or attempts this transaction changed, in the order first touched
        (the kernel settles their place in the ready queue: `kernel.admission.settle_in_tx`); ``True``:
        only the fence of its live attempt changed (`touch`)."""
        self.freed_pools: list[str] = []
        """Capacity pools in which an attempt stopped counting (a slot may be free)."""
        self._states_later: dict[str, ExecutionState] = {}
        """Attempts whose move between running states waits for the next write of their state, by id:
        the state their row still holds (`ExecutionsTx.set_execution_state_later`)."""
        self._savepoints = 0
        self._ordered_at: int | None = None
        """The savepoint depth at which this transaction took the acceptance-order lock."""
        self._reads: dict[tuple[str, str], Any] = {}
        """Records this transaction read since it last changed a row (`recall`)."""
        self._reads_at = -1
        self._held: dict[tuple[str, str], Any] = {}
        self._held_of: dict[str, list[tuple[str, str]]] = {}
        """Records told of a Work (`hold`) that answer through writes to other Works' rows, each until
        its own Work is touched, by the Work they are of; only while `holding`."""
        self._holding = False
        self._bumps: dict[str, tuple[int, int, int]] = {}
        """Revision bumps that wait (`bump_work`), by Work: how many, the time of the last, and the
        revision they reach."""
        self._moves: dict[str, tuple[str, str]] = {}
        """State moves that wait (`Tx.move_later`), by Work: its state in the database, and the state
        told; each goes with a bump in `_bumps`."""
        self.batched = False
        """Set by the storage actor for its batches: bumps wait past their `holding` block, for the
        requests after it too, until `write_bumps` before the COMMIT (a hot Work's routings in one
        batch, and its attempt's end, are one write)."""
        self._caching = dialect.caches_reads
        self._own: set[str] = set()
        """Works and attempts this transaction inserted: nobody else sees them before it commits, so
        what it read of them (`recall`) answers on a shared database too, while it changes no row."""
        self._events: dict[str, Any] = {}
        """Events this transaction accepted or read (`Tx.event`): an Event row never changes, so they
        stay true until a savepoint rolled back (it may have undone an insert) or an Event is removed."""
        self._unrouted: set[str] = set()
        """Events this transaction accepted that have no routing checkpoint yet (`Tx.event_to_route`)."""
        self._kv: dict[tuple[str, str], Any] = {}
        """KV entries this transaction read and has not written since (`Tx.kv_get`)."""
        self._pending: dict[str, Pending] = {}
        """Works' pending inputs as this transaction read and wrote them, each with the newest one's
        sequence (`InputsTx.pending_of`)."""
        self._inputs_changed: set[str] = set()
        """Works whose inputs this transaction wrote (`InputsTx`; savepoints rolled back included): what
        earlier transactions committed of them no longer answers (`Carried.pending`)."""
        self._inputs_lost = False
        """Compaction removed inputs of any Work in this transaction: none committed earlier answers."""
        self._inputs: set[tuple[str, str]] = set()
        """Inputs (Work, Event) this transaction inserted (`InputsTx.add_input`): only compaction
        removes one, and forgets them all."""
        self._waits_on_key: dict[str, tuple[Any, ...]] = {}
        """Open waits watching a key, as this transaction read them, until it writes a wait
        (`WaitsTx.open_waits_on_key`)."""
        self._waits_exist: list[bool] | None = None
        """Whether any wait may be open, and whether any woken wait's continuation may not have started
        (`WaitsTx.waits_exist`): read once (a database alone only), then only ever set by its writes."""
        self._untaken: dict[str, dict[str, Any]] | None = None
        """The woken waits whose continuation has not started, by Work and wait id, when this transaction
        read that there were none and then made each itself (`WaitsTx.untaken_wake`; a database alone
        only). ``None``: unknown, they are read."""
        self._pinned_roots: bool | None = None
        """Whether a root may have pinned causal limits (`Tx.roots_pinned`): read once (a database alone
        only), then only ever set by this transaction's pins."""
        self._open_intents: bool | None = None
        """Whether an intent may be open (`ExecutionsTx.open_intents_exist`): read once (a database
        alone only), then only ever set by this transaction's writes."""
        self._removed_works: bool | None = None
        """Whether compaction may have removed a Work whose id is still taken (`Tx.work_removed`): read
        once (a database alone only), then only ever set by this transaction's removals."""
        self._wait_subscriptions: bool | None = None
        """Whether a wait may have declared a subscription (`SubscriptionsTx.end_subscriptions_of_wait`):
        read once (a database alone only), then only ever set by this transaction's writes."""
        self._timer_rows: dict[str, tuple[Any, ...]] = {}
        """Timers' rows as the due head read them whole, each until this transaction writes that timer
        (`TimersTx.due_head`: on a shared database it holds their locks)."""
        self._routed_through: int | None = None
        """Every Event up to this sequence has its routing checkpoint, as this transaction knows
        (`Tx.routed_through`; a database alone only): moved by the checkpoints it writes in order."""
        self._scan_left: int | None = None
        """How many more Events `Tx.routed_through` may read in this transaction."""
        self._unrouted_at: int | None = None
        """The unrouted Event that stopped `Tx.routed_through`'s search, until it is routed."""
        self._max_seq: int | None = None
        """The newest Event's sequence, as this transaction read or wrote it (`Tx.max_seq`)."""
        self._kept = kept if dialect.caches_reads else None
        """What earlier transactions committed (`Carried`: the storage actor's, on a database alone), which
        answers reads here; `committed` adds what this one knows."""
        self._key_owners: dict[str, str | None] = {}
        """Keys this transaction read the owner of, or attached (`Tx.key_owner`): a key is attached once
        and detached only when compaction removes its Work, which forgets them all."""
        self._to_carry = ToCarry()
        if self._kept is not None:
            self._take_facts(self._kept)

    def _take_facts(self, kept: Carried) -> None:
        """Start from what the last commit knew of the whole database (a database alone: nobody wrote
        it since): the newest Event's sequence, how far every Event is routed, and what there is none
        of (`NoneKnown`), each as it would have gone on knowing it."""
        self._max_seq, self._routed_through = kept.max_seq, kept.routed_through
        waits, intents, roots, subscriptions, removed = kept.none
        if waits:
            self._waits_exist, self._untaken = [False, False], {}
        self._open_intents = False if intents else None
        self._pinned_roots = False if roots else None
        self._wait_subscriptions = False if subscriptions else None
        self._removed_works = False if removed else None

    def _none_known(self) -> NoneKnown:
        """What this transaction knows there is none of, at its commit (`Carried.none`)."""
        return (
            self._waits_exist == [False, False],
            self._open_intents is False,
            self._pinned_roots is False,
            self._wait_subscriptions is False,
            self._removed_works is False,
        )

    def committed(self) -> None:
        """This transaction committed: the keys' owners it read or attached, the pending inputs it knows
        (each as of this commit: every write of them told it), the Events it routed to a Work, the
        attempts it inserted or read and the Works it knows answer later transactions (`Carried`, which
        bounds them); what it knew no longer of a Work or an attempt whose row it wrote is forgotten."""
        kept = self._kept
        if kept is not None:
            self._carry(kept)
        # what it kept for its own reads goes now: some of it refers back to it (a record made on
        # demand from what it knows), a cycle that would keep the whole batch until the collector ran
        self._reads.clear()
        self._held.clear()
        self._to_carry.of_works.clear()

    def _carry(self, kept: Carried) -> None:
        if len(kept.owners) > KEPT:
            kept.owners.clear()
        kept.owners.update((key, owner) for key, owner in self._key_owners.items() if owner is not None)
        if self._inputs_lost:
            kept.forget_pending()
        for work_id in self._inputs_changed:
            kept.forget_pending(work_id)
        for work_id, pending in self._pending.items():
            kept.keep_pending(work_id, pending)
        self._to_carry.commit(kept, self._events, self._kv)
        kept.max_seq, kept.routed_through, kept.none = self._max_seq, self._routed_through, self._none_known()

    def savepoint(self) -> Savepoint | Unguarded:
        """Run a block atomically inside the transaction: an exception undoes only its effects
        (and its notices), then propagates. In a transaction that runs unguarded, the exception stops
        the whole transaction instead (`RunGuarded`), which runs again guarded."""
        return Savepoint(self) if self._guarded else Unguarded(self)

    def is_storage_failure(self, exc: BaseException) -> bool:
        """The store failed (I/O, a full disk, a lost connection) or another writer raced this batch:
        not the request's own error, so it is never caught as one."""
        return (
            isinstance(exc, RowConflict)
            or self.dialect.is_storage_failure(exc)
            or self.dialect.is_conflict(exc)
        )

    def _ordered(self) -> None:
        """Take the acceptance-order lock (on a shared database) before allocating a sequence that
        readers follow, so that sequence order is commit order (docs/backends.md)."""
        if self._ordered_at is None and self.dialect.order_lock is not None:
            self.dialect.send_later(self._conn, self.dialect.order_lock)  # sent with what needs it
            self._ordered_at = self._savepoints

    def _written(self, cursor: Cursor | int, what: str, old: object, new: object) -> None:
        """A compare-and-set wrote nothing (``cursor``: the statement's, or the count of rows it
        wrote): the record was not in the state it was read in. Alone on the database that is a
        stale read; on a shared one another node changed the row since this transaction read it, and
        the batch runs again."""
        if (cursor if isinstance(cursor, int) else cursor.rowcount) != 1:
            if self.dialect.shared:
                raise RowConflict(f"{what}: {old} -> {new} raced another writer")
            raise IllegalTransition(f"{what}: {old} -> {new} found it no longer {old} (a stale read)")

    # -- plumbing ---------------------------------------------------------

    def recall(self, kind: str, key: str) -> Any:
        """A record of ``kind`` read by ``key`` earlier in this transaction, if no row changed since (the
        connection's count of changed rows has not moved; a savepoint rolled back forgets every one);
        `MISSING` otherwise. Records are immutable, so what was read is what a read would answer now.
        A read that misses keeps its answer with `keep`. What `hold` holds answers too, and a Work's
        records (`OF_WORK`) answer until a write of its row or parts (`ToCarry`), and as an earlier
        commit knew them (`Carried.of_works`) if this transaction wrote none."""
        if not (self._caching or (kind in _OWN_KINDS and key in self._own)):  # (`_keeps`, inline)
            return MISSING
        if kind in OF_WORK:  # (a Work's records: the most asked for)
            records = self._to_carry.of_works.get(key)
            record = MISSING if records is None else records.get(kind, MISSING)
            if record is MISSING and (kept := self._kept) is not None:  # (as an earlier commit knew it)
                to_carry = self._to_carry
                if not to_carry.works_lost and key not in to_carry.works_written:
                    records = kept.of_works.get(key)
                    record = MISSING if records is None else records.get(kind, MISSING)
            if record is not MISSING:
                if type(record) is Lazy:
                    assert records is not None
                    record = records[kind] = record.make()  # (a kept one too: any makes the same)
                return record
        if self._reads_current():
            record = self._reads.get((kind, key), MISSING)
            if type(record) is Lazy:
                record = self._reads[kind, key] = record.make()
            if record is not MISSING:
                return record
        return self._held.get((kind, key), MISSING) if self._held else MISSING

    def keep(self, kind: str, key: str, record: Any) -> Any:
        """Keep what a read just answered (right after `recall` missed: no row changed between)."""
        if self._caching or (kind in _OWN_KINDS and key in self._own):  # (`_keeps`, inline)
            self._reads[kind, key] = record
            if kind in OF_WORK:  # (`ToCarry.tell`, inline: its most frequent caller)
                if (known := self._to_carry.of_works.get(key)) is None:
                    self._to_carry.of_works[key] = {kind: record}
                else:
                    known[kind] = record
        return record

    def known(self, kind: str, key: str, record: Any) -> None:
        """``record`` is what a read of ``kind`` by ``key`` would answer now: the caller made it from the
        record it read and what it wrote since. Reads answer it (`recall`) until a row changes again
        (a Work's record, `OF_WORK`: until a write of its row or parts)."""
        if self._keeps(kind, key):
            self._reads_current()
            self._reads[kind, key] = record
            if kind in OF_WORK:
                self._to_carry.tell(kind, key, record)

    def hold(self, work_id: str, kind: str, key: str, record: Any) -> None:
        """``record`` is what a read of ``kind`` by ``key`` would answer now, and is of the Work
        ``work_id`` (its row, facts or place, or its input's checkpoint): while `holding` (else this does
        nothing), `recall` answers it through writes to other Works' rows too, until ``work_id`` is
        touched (`touch`: a routing's writes to a Work go with one) or a savepoint rolls back."""
        if self._holding and self._keeps(kind, key):
            self._held[kind, key] = record
            self._held_of.setdefault(work_id, []).append((kind, key))

    def holding(self) -> Holding:
        """Keep what `hold` is told for the block: a routing (or a batch of them), the starts that
        follow it and the settling after them."""
        self._holding = True
        return Holding(self)

    def bump_work(self, work_id: str, revision: int, now_ms: int) -> int:
        """Bump the revision of the Work ``work_id``, read at ``revision``, and its time of last change
        (as `Tx.update_work` with no fields); return the new revision. Inside `holding` or a storage
        batch (`batched`), on a database alone, the write waits: it goes with the Work's next write
        (`Tx.set_work_state`, `Tx.update_work`: a routing's bump and the start that follows are one
        statement; `_one_work`), or before any other statement on ``works`` (but the reads of one
        Work's row in `PATCHED_READS`), a savepoint, or the block's end (the batch's COMMIT when
        batched), all that wait in one statement. What this transaction kept is forgotten as at any
        write; the caller tells what it knows after it."""
        if not ((self._holding or self.batched) and self._caching):
            row = self._one(_BUMP, (1, now_ms, work_id))
            self.touch(work_id)
            assert row is not None
            return int(row[0])
        count = self._bumps[work_id][0] if work_id in self._bumps else 0
        self._bumps[work_id] = (count + 1, now_ms, revision + 1)
        self._reads.clear()
        self.touch(work_id)
        return revision + 1

    def _bumped(self, work_id: str) -> tuple[int, int | None, str | None]:
        """Take the bumps waiting for ``work_id``: how many, the revision they reach (``None``: none),
        and the Work's state in the database where a move waits with them (`Tx.move_later`)."""
        if work_id in self._bumps:
            count, _, revision = self._bumps.pop(work_id)
            return count, revision, self._moves.pop(work_id)[0] if work_id in self._moves else None
        return 0, None, None

    def patched(
        self, work_id: str, row: tuple[Any, ...], revision_at: int | None, updated_at: int, state_at: int
    ) -> tuple[Any, ...]:
        """The row of the Work ``work_id`` a read in `PATCHED_READS` answered, with what the bumps and
        the move that wait for it will write (`bump_work`, `Tx.move_later`): ``revision_at`` (``None``:
        not read), ``updated_at`` and ``state_at`` index its revision, time of last change and state."""
        count, now_ms, revision = self._bumps[work_id]
        patched = list(row)
        patched[updated_at] = now_ms
        if work_id in self._moves:
            patched[state_at] = self._moves[work_id][1]
        if revision_at is not None:
            patched[revision_at] += count
            self._check_revision(work_id, (patched[revision_at],), revision)
        return tuple(patched)

    def write_bumps(self) -> None:
        """Write the revision bumps that wait (`bump_work`): before a batch's COMMIT."""
        if self._bumps:
            self._flush_bumps()

    def _flush_bumps(self) -> None:
        """Write the revision bumps that wait (`bump_work`), in one statement (a Work's with a move
        that waits, `Tx.move_later`, in one of its own). What this transaction keeps stays: each was
        kept after the bumps (`bump_work` forgot the rest), and a read of the Work's row meanwhile
        either wrote them first or answered what they write (`patched`), so it tells what they write."""
        bumps, self._bumps = self._bumps, {}
        moves, self._moves = self._moves, {}
        self._reads_current()
        for work_id, (state, new) in moves.items():
            count, now_ms, revision = bumps.pop(work_id)
            row = self._one_work(_MOVE, (new, count, now_ms, work_id, state))
            self._written(0 if row is None else 1, f"work {work_id}", state, new)
            self._check_revision(work_id, row, revision)
        if len(bumps) == 1:
            ((work_id, (count, now_ms, revision)),) = bumps.items()
            row = self._one_work(_BUMP, (count, now_ms, work_id))
            self._check_revision(work_id, row, revision)
        elif bumps:
            listed = json.dumps([[work_id, count, now_ms] for work_id, (count, now_ms, _) in bumps.items()])
            reached = dict(self._all(_BUMPS, (listed,)))  # (none waits now: `_all` writes none first)
            for work_id, (_, _, revision) in bumps.items():
                self._check_revision(work_id, (reached[work_id],) if work_id in reached else None, revision)
        self._reads_at = self.dialect.changes(self._conn)

    def _check_revision(self, work_id: str, row: tuple[Any, ...] | None, revision: int | None) -> None:
        """A write that took deferred bumps reached the revision they were told (else the Work was
        read stale when it was bumped)."""
        if revision is not None and (row is None or row[0] != revision):
            found = "no such work" if row is None else f"revision {row[0]}"
            raise IllegalTransition(f"work {work_id}: {found} where {revision} was told (a stale read)")

    def _drop_held(self, work_id: str | None = None) -> None:
        """Forget what was held of ``work_id`` (``None``: of every Work)."""
        if work_id is None:
            self._held.clear()
            self._held_of.clear()
        else:
            for held in self._held_of.pop(work_id, ()):
                self._held.pop(held, None)

    def known_lazily(self, kind: str, key: str, make: Callable[[], Any], *, pure: bool = False) -> None:
        """`known`, with the record made by ``make`` only if a read asks for it before a row changes
        (most such records are never read: making each would cost more than the reads it saves), or,
        of a Work, before its Work is written; ``pure`` (``make`` asks nothing of this transaction), in
        the transactions after its commit too (`Carried.of_works`). ``make`` depends only on what this
        transaction knows of that Work, which no read changes, nor a write of another Work."""
        if self._keeps(kind, key):
            self._reads_current()
            self._reads[kind, key] = lazy = Lazy(make, pure)
            if kind in OF_WORK:
                self._to_carry.tell(kind, key, lazy)

    def _keeps(self, kind: str, key: str) -> bool:
        """Whether a record of ``kind`` by ``key`` may be kept: always alone on the database; on a shared
        one, a Work's or an attempt's that this transaction inserted (`_own`)."""
        return self._caching or (kind in _OWN_KINDS and key in self._own)

    def inserted(self, record_id: str) -> None:
        """This transaction inserted the Work or attempt ``record_id`` (see `_own`)."""
        self._own.add(record_id)

    def _reads_current(self) -> bool:
        """Whether the records kept still answer: no row changed since they were kept. When one did,
        they are forgotten, and what is kept from now on is kept at the new count."""
        changes = self.dialect.changes(self._conn)
        if changes == self._reads_at:
            return True
        self._reads.clear()
        self._reads_at = changes
        return False

    def _one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        if self._bumps and "works" in sql and sql not in PATCHED_READS:
            self._flush_bumps()
        row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        return row

    def _one_work(self, sql: str, params: Params) -> tuple[Any, ...] | None:
        """`_one` for a write of one Work's row by its id that took the bumps waiting for that Work
        (`_bumped`): the bumps of other Works wait on (`bump_work`)."""
        row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        return row

    def _all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        if self._bumps and "works" in sql and sql not in PATCHED_READS:
            self._flush_bumps()
        rows: list[tuple[Any, ...]] = self._conn.execute(sql, params).fetchall()
        return rows

    def notify(self, notice: Notice) -> None:
        """Queue a notice for publication after this batch commits."""
        self.notices.append(notice)

    def touch(self, work_id: str, *, fence_only: bool = False) -> None:
        """Note that a Work's state, inputs or attempts changed (see ``touched``): what this transaction
        knows of it no longer answers (`ToCarry.work_written`). ``fence_only``: its live attempt took a
        new fence (a lease recovered), so whether it can start did not change, unless another write of
        this transaction changes it."""
        if not fence_only:
            self.touched[work_id] = False
        elif work_id not in self.touched:
            self.touched[work_id] = True
        to_carry = self._to_carry
        to_carry.works_written.add(work_id)  # (`ToCarry.work_written`, inline: a hot path)
        to_carry.of_works.pop(work_id, None)
        if self._held_of:
            self._drop_held(work_id)
