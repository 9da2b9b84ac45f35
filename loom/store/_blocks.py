"""The blocks of a transaction: `TxBase.savepoint`'s (`Savepoint`), and those that are no savepoints:
`TxBase.holding`'s, and `TxBase.savepoint`'s in a transaction run unguarded (`Unguarded`, and the
`RunGuarded` it raises)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._tx_base import TxBase


class RunGuarded(BaseException):
    """A transaction run without savepoints met an exception a savepoint would have undone: it is
    rolled back whole and runs again with them (`StorageActor`). A `BaseException`, so that no
    ``except Exception`` of a procedure mistakes it for the failure it stands for."""


class _Block:
    """A block of a transaction's (a context manager of its own: it runs for every request or every
    routed Event, so it costs less than a generator's)."""

    __slots__ = ("_tx",)

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx

    def __enter__(self) -> None:
        return None


class Unguarded(_Block):
    """`TxBase.savepoint` in a transaction run unguarded: nothing to undo while every step succeeds
    (most batches), and no statement spent on it; a step that fails stops the transaction, which the
    storage actor rolls back and runs again guarded, so what commits is what guarded savepoints
    would have committed (procedures depend only on the database, the time and their arguments)."""

    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Exception) and not self._tx.is_storage_failure(exc):
            raise RunGuarded from exc


class Holding(_Block):
    """`TxBase.holding`'s block."""

    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        tx = self._tx
        try:
            if kind is None and tx._bumps and not tx.batched:
                tx._flush_bumps()
        finally:
            tx._holding = False
            if not tx.batched:
                tx._bumps.clear()  # (after an exception: undone with the block's other writes)
                tx._moves.clear()
            tx._drop_held()


class Savepoint:
    """`TxBase.savepoint`: a context manager of its own (it runs for every request and every routed
    Event, so it costs less than a generator's)."""

    __slots__ = ("_depth", "_freed", "_mark", "_name", "_touched", "_tx")

    def __init__(self, tx: TxBase) -> None:
        self._tx = tx

    def __enter__(self) -> None:
        tx = self._tx
        self._depth = depth = tx._savepoints
        self._name = f"nested_{depth}"
        self._mark = len(tx.notices)
        self._freed = len(tx.freed_pools)
        self._touched = len(tx.touched)
        if tx._bumps:
            tx._flush_bumps()  # a rollback undoes only what the block wrote
        tx._conn.execute(f"SAVEPOINT {self._name}")
        tx._savepoints += 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        tx = self._tx
        try:
            if exc is None:
                tx._conn.execute(f"RELEASE {self._name}")
            elif not tx.is_storage_failure(exc):
                tx._conn.execute(f"ROLLBACK TO {self._name}")
                tx._conn.execute(f"RELEASE {self._name}")
                tx._reads.clear()  # what it read may have been its own writes, now undone
                tx._drop_held()
                tx._bumps.clear()
                tx._moves.clear()
                tx._own.clear()  # and what it inserted may be gone
                tx._events.clear()
                tx._unrouted.clear()
                tx._kv.clear()
                tx._pending.clear()
                tx._inputs.clear()
                tx._key_owners.clear()
                tx._to_carry.rolled_back()
                tx._waits_on_key.clear()
                # "none exists" is read again: it may have undone a removal
                tx._waits_exist = tx._open_intents = tx._pinned_roots = tx._wait_subscriptions = None
                tx._removed_works = None
                tx._states_later.clear()  # (each is written before its procedure returns)
                tx._untaken = None
                tx._timer_rows.clear()
                tx._routed_through = tx._max_seq = None
                del tx.notices[self._mark :]
                del tx.freed_pools[self._freed :]
                for work_id in list(tx.touched)[self._touched :]:  # what it touched was undone too
                    del tx.touched[work_id]
                if tx._ordered_at is not None and tx._ordered_at > self._depth:
                    tx._ordered_at = None  # a lock taken inside a savepoint goes with its rollback
        finally:
            tx._savepoints -= 1
