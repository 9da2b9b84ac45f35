"""The blocks of a transaction that are no savepoints: `TxBase.holding`'s, and `TxBase.savepoint`'s in a
transaction run unguarded (`Unguarded`, and the `RunGuarded` it raises)."""

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
