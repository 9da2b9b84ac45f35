"""What committed transactions knew that the transactions after them may take (`Carried`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

KEPT = 100_000
"""How many keys' owners, and how many Works' pending inputs, the storage actor keeps across
transactions (`TxBase.committed`)."""

KEPT_INPUTS = 250_000
"""How many pending inputs, over every Work, the storage actor keeps across transactions."""

KEPT_ROUTED = 10_000
"""How many routed inputs (an Event with its routing checkpoint) the storage actor keeps across
transactions."""

KEPT_ROUTED_BYTES = 4 << 20
"""How much payload text, over every routed input kept, the storage actor keeps across transactions."""

KEPT_ATTEMPTS = 10_000
"""How many attempts' rows the storage actor keeps across transactions."""

KEPT_KV = 1_000
"""How many KV entries (or their absence) the storage actor keeps across transactions."""

KEPT_OF_WORKS = 10_000
"""How many Works' records (a Work, its queue place, its admission facts) the storage actor keeps
across transactions."""

OF_WORK = frozenset({"work", "place", "facts"})
"""The kinds of record of one Work, by its id, that stay true until a write of that Work's row or parts
tells its transaction so (`ToCarry.work_written`), and that `Carried.of_works` keeps."""

NoneKnown = tuple[bool, bool, bool, bool, bool]
"""What a transaction knows there is none of, and tells the next (`Carried.none`): waits open or woken
and not taken (`WaitsTx.waits_exist`), open intents (`ExecutionsTx.open_intents_exist`), roots with
pinned limits (`Tx.roots_pinned`), waits' subscriptions (`SubscriptionsTx.wait_subscriptions_exist`),
Works removed by compaction whose ids are still taken (`Tx.work_removed`). Each is read once, and only
ever made true again by the writes that make one."""
NOTHING_KNOWN: NoneKnown = (False, False, False, False, False)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
"""`TxBase.recall` found nothing it may answer."""


class Lazy:
    """A record `TxBase.known_lazily` was told how to make: made at the first read that asks for it.
    ``pure``: ``make`` depends on nothing but what it holds (not on its transaction), so that a record
    of a Work may be made in a later transaction too (`Carried.of_works`)."""

    __slots__ = ("make", "pure")

    def __init__(self, make: Callable[[], Any], pure: bool) -> None:
        self.make, self.pure = make, pure


Pending = tuple[tuple[str, ...], int | None]
"""A Work's pending inputs' Event ids in acceptance order, and the newest one's sequence (at least)."""


class Carried:
    """What committed transactions knew that the transactions after them may take (the storage actor
    keeps it, on a database alone only, while its writer is the only one on the file): keys' owners (a
    key is attached once, and detached only when compaction removes its Work), Works' pending inputs
    (written only through `InputsTx`, and compaction, which tell what they change), routed inputs (an
    Event never changes; its checkpoint only by a replay or compaction, which forget them), attempts'
    rows (every write of `executions` tells which) and KV entries (every write of ``kv`` tells which);
    and what the last commit knew of the whole database (`max_seq`, `routed_through`, `none`). A failed
    COMMIT forgets all of it."""

    __slots__ = (
        "attempts",
        "inputs",
        "kv",
        "max_seq",
        "none",
        "of_works",
        "owners",
        "pending",
        "routed",
        "routed_bytes",
        "routed_through",
    )

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}
        self.pending: dict[str, Pending] = {}
        self.inputs = 0
        """How many pending inputs `pending` holds, over every Work."""
        self.routed: dict[str, tuple[Any, Any, int]] = {}
        """Events a committed transaction accepted and routed to a Work as input, each with its
        checkpoint and its payload text's length, by id, until a claim takes them (`take_routed`)."""
        self.routed_bytes = 0
        """The payload text `routed` holds, over every Event."""
        self.attempts: dict[str, tuple[Any, ...]] = {}
        """Attempts a committed transaction inserted or read (after its last write of them), each as a
        read gives its row, by id, until a transaction writes the row."""
        self.kv: dict[tuple[str, str], Any] = {}
        """KV entries as committed transactions read them (``None``: none), by namespace and key, until
        a transaction writes the entry (`Tx.kv_get`)."""
        self.max_seq: int | None = None
        """The newest Event's sequence, as the last commit knew it (`Tx.max_seq`; ``None``: unknown)."""
        self.routed_through: int | None = None
        """Every Event up to this sequence had its routing checkpoint at the last commit, as it knew
        (`Tx.routed_through`; ``None``: unknown)."""
        self.none: NoneKnown = NOTHING_KNOWN
        """What the last commit knew there was none of (`NoneKnown`): it read so, and wrote none since."""
        self.of_works: dict[str, dict[str, Any]] = {}
        """Records of Works (`OF_WORK`), by Work id and kind, as committed transactions knew them at
        their commit, until a transaction writes that Work's row or parts (`ToCarry.work_written`)."""

    def clear(self) -> None:
        self.owners.clear()
        self.of_works.clear()
        self.forget_pending()
        self.forget_routed()
        self.attempts.clear()
        self.kv.clear()
        self.max_seq = self.routed_through = None
        self.none = NOTHING_KNOWN

    def forget_pending(self, work_id: str | None = None) -> None:
        """Forget the pending inputs kept of ``work_id`` (``None``: of every Work)."""
        if work_id is None:
            self.pending.clear()
            self.inputs = 0
        elif (dropped := self.pending.pop(work_id, None)) is not None:
            self.inputs -= len(dropped[0])

    def keep_pending(self, work_id: str, pending: Pending) -> None:
        """Keep ``pending`` as the pending inputs of ``work_id`` (at most `KEPT` Works and `KEPT_INPUTS`
        inputs are kept: past either, everything kept is forgotten first)."""
        self.forget_pending(work_id)
        if len(pending[0]) > KEPT_INPUTS:
            return  # (read again when asked for)
        if len(self.pending) >= KEPT or self.inputs + len(pending[0]) > KEPT_INPUTS:
            self.forget_pending()
        self.pending[work_id] = pending
        self.inputs += len(pending[0])

    def keep_routed(self, event: Any, checkpoint: Any, size: int) -> None:
        """Keep ``event`` (its payload text ``size`` long) and the checkpoint that routed it to a Work
        (at most `KEPT_ROUTED` Events and `KEPT_ROUTED_BYTES` of payload: past either, everything kept
        is forgotten first)."""
        if size > KEPT_ROUTED_BYTES:
            return
        if len(self.routed) >= KEPT_ROUTED or self.routed_bytes + size > KEPT_ROUTED_BYTES:
            self.forget_routed()
        self.routed[event.id] = (event, checkpoint, size)
        self.routed_bytes += size

    def take_routed(self, event_id: str) -> tuple[Any, Any] | None:
        """The Event ``event_id`` and its checkpoint, if kept; forgotten from here on (an input is
        claimed once, mostly)."""
        kept = self.routed.pop(event_id, None)
        if kept is None:
            return None
        self.routed_bytes -= kept[2]
        return kept[0], kept[1]

    def forget_routed(self) -> None:
        self.routed.clear()
        self.routed_bytes = 0

    def keep_attempt(self, execution_id: str, row: tuple[Any, ...]) -> None:
        """Keep ``row``, an attempt's as `ExecutionsTx.execution` reads it (at most `KEPT_ATTEMPTS`:
        past it, every attempt kept is forgotten first)."""
        if len(self.attempts) >= KEPT_ATTEMPTS:
            self.attempts.clear()
        self.attempts[execution_id] = row


class ToCarry:
    """What one transaction will tell `Carried` at its commit (`TxBase.committed`), on a database alone:
    the payload text's length of each Event it inserted and the checkpoints routing one of them to a
    Work (`InputsTx.routed_input`); the attempts it inserted or read, as a read would give their rows,
    and those whose rows it changed (`ExecutionsTx.execution`); the KV entries it wrote (`Tx.kv_get`); the
    records of Works it knows, and the Works whose rows or parts it wrote (`TxBase.recall`).

    The records of Works answer this transaction's reads too, through its writes of other Works: a
    Work's record (`OF_WORK`) is read from its row and its parts (keys, live attempt, open wait,
    pending inputs, place in the ready queue), and every statement that writes one of them tells
    which Work (`work_written`; `lose_works` for one naming none), checked by
    ``tests/test_tx_works_statements.py``."""

    __slots__ = (
        "attempts",
        "attempts_changed",
        "attempts_lost",
        "kv_written",
        "of_works",
        "routed",
        "routed_lost",
        "sizes",
        "works_lost",
        "works_written",
    )

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.routed: dict[str, tuple[Any, int]] = {}
        self.routed_lost = False
        """A checkpoint was replaced or removed: none kept answers any more."""
        self.attempts: dict[str, tuple[Any, ...]] = {}
        self.attempts_changed: set[str] = set()
        self.attempts_lost = False
        """Attempts' rows were written by a statement naming no one attempt: none kept answers."""
        self.kv_written: set[tuple[str, str]] = set()
        """The KV entries it wrote (`Tx.kv_put`, `kv_delete`): what was kept of them no longer answers."""
        self.of_works: dict[str, dict[str, Any]] = {}
        """Records of Works (`OF_WORK`) as a read would answer them now, by Work id and kind: read, or
        told (`TxBase.known`), each until its Work is written."""
        self.works_written: set[str] = set()
        """Works whose row or parts it wrote (savepoints rolled back included): what earlier commits
        kept of them no longer answers."""
        self.works_lost = False
        """A statement naming no one Work wrote Works' rows or parts: nothing kept earlier answers."""

    def work_written(self, work_id: str) -> None:
        """A statement wrote the row or a part of the Work ``work_id``: what is known of it no longer
        answers (the caller may tell what it knows after it)."""
        self.works_written.add(work_id)
        self.of_works.pop(work_id, None)

    def tell(self, kind: str, work_id: str, record: Any) -> None:
        """``record`` (of `OF_WORK`) is what a read of the Work ``work_id`` would answer now."""
        known = self.of_works.get(work_id)
        if known is None:
            self.of_works[work_id] = {kind: record}
        else:
            known[kind] = record

    def lose_works(self) -> None:
        self.works_lost, self.of_works = True, {}

    def lose_routed(self, carried: Carried | None) -> None:
        self.routed_lost, self.routed = True, {}
        if carried is not None:
            carried.forget_routed()

    def changed_attempt(self, execution_id: str) -> None:
        """The attempt's row was written: what was kept of it no longer answers."""
        self.attempts_changed.add(execution_id)
        self.attempts.pop(execution_id, None)

    def lose_attempts(self) -> None:
        self.attempts_lost, self.attempts = True, {}

    def rolled_back(self) -> None:
        """A savepoint rolled back: what it wrote may be undone (what it changed stays changed)."""
        self.routed.clear()
        self.attempts.clear()
        self.of_works.clear()

    def commit(self, carried: Carried, events: dict[str, Any], kv: dict[tuple[str, str], Any]) -> None:
        for event_id, (checkpoint, size) in () if self.routed_lost else self.routed.items():
            if event_id in events:
                carried.keep_routed(events[event_id], checkpoint, size)
        if self.attempts_lost:
            carried.attempts.clear()
        for execution_id in self.attempts_changed:
            carried.attempts.pop(execution_id, None)
        for execution_id, row in self.attempts.items():
            carried.keep_attempt(execution_id, row)
        for entry in self.kv_written:
            carried.kv.pop(entry, None)
        if kv and len(kv) <= KEPT_KV:
            if len(carried.kv) + len(kv) > KEPT_KV:
                carried.kv.clear()
            carried.kv.update(kv)
        of_works = carried.of_works
        if self.works_lost:
            of_works.clear()
        for work_id in self.works_written:
            of_works.pop(work_id, None)
        if len(of_works) + len(self.of_works) > KEPT_OF_WORKS:
            of_works.clear()
        for work_id, records in self.of_works.items():
            work = records.get("work")
            if type(work) is Lazy and not work.pure:  # (one that asks its transaction goes with it)
                records = {kind: record for kind, record in records.items() if kind != "work"}
                if not records:
                    continue
            if (kept := of_works.get(work_id)) is None:
                of_works[work_id] = records
            else:  # (a Work not written here: what this one read adds to what was kept)
                kept.update(records)
