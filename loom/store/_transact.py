"""The storage actor's side of a batch that runs in its worker thread: one transaction around the batch's
requests (each in a savepoint of its own once the batch runs guarded), the commit, and what a failure
there means (a race with another node runs the batch again, a storage failure fails it, a crash point
drops the connection as a killed process would). `StorageActor` (`_actor.py`) hands batches to it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from ..records.notices import Notice
from ._batch import (
    CONFLICT_RETRIES,
    Conflict,
    CrashPoint,
    FaultHook,
    Request,
    Resync,
    StorageFailure,
    StorageStats,
)
from ._dialect import Dialect, RowConflict, Store
from ._notify import summarize
from ._tx import Tx
from ._tx_base import RunGuarded

GUARDED_BATCHES = 32
"""After a batch that had to run again guarded, how many batches run guarded from the start (a request
that fails once tends to come with others: each would cost an unguarded run for nothing)."""


class Transactions:
    """Runs batches on the write connection, in the worker thread (`StorageActor` holds the state)."""

    store: Store
    stats: StorageStats
    origin: str
    routing: bool
    _conn: Any
    _dialect: Dialect
    _guarded: int
    _fault: FaultHook | None
    _settle: Callable[[Tx, int], None] | None

    def _execute_until_settled(
        self, batch: list[Request], now_ms: int, batch_no: int | None
    ) -> tuple[list[Notice], bool]:
        """Run the batch; one that raced another node runs again (after a short random pause), and a
        relaxed one that turned out to settle something runs again in full. Also says whether the
        batch committed relaxed."""
        relaxed = batch_no is not None and all(request.read or request.relaxed for request in batch)
        guarded = self._guarded > 0
        self._guarded -= guarded
        attempt = 0
        while True:
            if self._conn is None:  # a rollback before this run lost the connection (`_rollback`)
                lost = ConnectionError("the connection was lost while the batch was rolled back to run again")
                raise StorageFailure(lost, lost=True)
            try:
                return self._execute(batch, now_ms, batch_no, relaxed, guarded), relaxed
            except Resync:
                relaxed = False
            except RunGuarded:
                guarded = True
                self._guarded = GUARDED_BATCHES
                self.stats.guarded_reruns += 1
            except Conflict as conflict:
                if attempt == CONFLICT_RETRIES:
                    raise StorageFailure(conflict.cause) from conflict.cause
                time.sleep(random.uniform(0, min(0.002 * 2**attempt, 0.1)))
                attempt += 1

    def _execute(
        self, batch: list[Request], now_ms: int, batch_no: int | None, relaxed: bool, guarded: bool
    ) -> list[Notice]:
        conn = self._conn
        assert conn is not None
        if not relaxed:
            return self._transact(conn, batch, now_ms, batch_no, relaxed, guarded)
        try:
            self.store.relax(conn, True)
        except Exception as exc:
            if self._dialect.is_storage_failure(exc):
                raise self._failure(exc, in_commit=False) from exc
            raise
        try:
            return self._transact(conn, batch, now_ms, batch_no, relaxed, guarded)
        finally:
            if self._conn is conn:
                try:
                    self.store.relax(conn, False)
                except BaseException:
                    # every later commit would skip the disk: stop rather than run on so
                    self._abandon()
                    raise

    def _transact(
        self,
        conn: Any,
        batch: list[Request],
        now_ms: int,
        batch_no: int | None,
        relaxed: bool,
        guarded: bool,
    ) -> list[Notice]:
        dialect = self._dialect
        tx = Tx(conn, dialect, guarded=guarded)
        try:
            dialect.send_later(conn, dialect.begin)
        except Exception as exc:
            if tx.is_storage_failure(exc):
                raise self._failure(exc, in_commit=False) from exc
            raise
        in_commit = False
        try:
            for request in batch:
                request.ok, request.value, request.error = False, None, None
                try:
                    with tx.savepoint():
                        request.value = request.proc(tx, now_ms, *request.args, **request.kwargs)
                        if relaxed and (tx.touched or tx.freed_pools):
                            raise Resync  # the settle hook would write what must reach the disk
                        if self._settle is not None:
                            self._settle(tx, now_ms)
                    request.ok = True
                except Exception as exc:
                    if tx.is_storage_failure(exc):
                        raise
                    request.error = exc
            if dialect.notify is not None:
                payload = summarize(tx.notices, self.origin, routing=self.routing)
                if payload is not None:
                    dialect.send_later(conn, dialect.notify, (payload,))  # it goes with the COMMIT
            if self._fault is not None and batch_no is not None:
                self._fault("before_commit", batch_no)
            in_commit = True
            conn.execute("COMMIT")
        except CrashPoint:
            self._abandon()
            raise
        except Exception as exc:
            self._rollback()
            if tx.is_storage_failure(exc):
                if (dialect.is_conflict(exc) and not in_commit) or isinstance(exc, RowConflict):
                    raise Conflict(exc) from exc
                raise self._failure(exc, in_commit=in_commit) from exc
            raise
        except BaseException:
            self._rollback()
            raise
        if self._fault is not None and batch_no is not None:
            try:
                self._fault("after_commit", batch_no)
            except CrashPoint:
                self._abandon()
                raise
        return tx.notices

    def _failure(self, exc: BaseException, *, in_commit: bool) -> StorageFailure:
        """A storage failure; one that lost the connection drops it, to be opened again."""
        lost = self._dialect.is_disconnect(exc) and bool(self.store.reconnect_delays())
        if lost:
            self._abandon()
        return StorageFailure(exc, lost=lost, in_commit=in_commit)

    def _rollback(self) -> None:
        if self._conn is None:
            return
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except Exception as exc:
                # The connection is unusable: drop it; a shared database is reconnected to, a
                # file stops the runtime rather than run on a half state.
                self._abandon()
                if self._dialect.is_disconnect(exc) and self.store.reconnect_delays():
                    return
                raise

    def _abandon(self) -> None:
        """Drop the connection as a killed process would: no commit, no cleanup."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception:
                pass  # it was already broken: dropping it is all that is left to do
