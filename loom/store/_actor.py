"""The storage actor: one write connection, group commit.

Callers ``await storage.submit(procedure, *args)``. The actor drains its mailbox into
a batch and runs the whole batch in one worker-thread hop::

    BEGIN IMMEDIATE                    -- SQLite; PostgreSQL: BEGIN (read committed)
      procedure(tx, now_ms, *args)     -- per request
    COMMIT

A batch runs unguarded first: no savepoint around a request (nor around any step a procedure runs in
one). Most batches fail nowhere, and their savepoints would be statements spent for nothing. When a
request (or a step of one) fails, the transaction is rolled back whole and the batch runs again
guarded, each request in a savepoint of its own (``SAVEPOINT r; procedure(...); RELEASE r``, or
``ROLLBACK TO r``: that request's own error undoes only its own effects); the batches after it run
guarded too, until `GUARDED_BATCHES` have run without such a failure being met unguarded. What commits
is the same either way: a procedure depends only on the database, the time and its arguments.

Only after COMMIT succeeds does it reply to every caller and publish the batch's
notices. A storage failure (I/O error, disk full, a failed commit, a lost connection)
fails the whole batch explicitly to every caller. The batch is shielded from
cancellation: a caller cancelled while its batch runs still has its work committed or
not as a unit.

After each request's procedure the ``settle`` hook (the kernel's `admission.settle_in_tx`, given
by the runtime) brings the ready queue up to date with the Works the request touched, inside the
request's own savepoint.

On a shared database (PostgreSQL) each batch also tells the other nodes, in one small
notification sent with its COMMIT, what it changed (`_notify`); the actor listens for theirs on a
connection of its own and hands each to its feeds as a `StoreChanged` notice, and every
``check_ms`` of the clock it hands them a check (the actors read from their cursors what a
notification could not carry). Two more things can happen. Another node's batch can
race this one (a deadlock, a unique key both inserted, a row changed under a
compare-and-set): the batch is rolled back whole and run again, a bounded number of
times, on what the other node committed. And the connection can drop (a database
restart): the batch in flight fails as `StorageUnavailable`, and the actor reconnects
with backoff before it runs the next one; requests wait in the bounded mailbox meanwhile.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import trio

from ..records.clock import Clock
from ..records.errors import StorageClosed, StorageError, StorageUnavailable
from ..records.notices import Committed, Notice, StoreChanged
from ._batch import (
    CONFLICT_RETRIES,
    Conflict,
    CrashPoint,
    FaultHook,
    Procedure,
    Request,
    Resync,
    StorageFailure,
    StorageStats,
    one_by_one,
)
from ._blocks import RunGuarded
from ._carried import Carried
from ._dialect import RowConflict, Store
from ._feed import Notices
from ._notify import summarize
from ._thread import WorkerThread
from ._tx import Tx

log = logging.getLogger("loom.storage")

GUARDED_BATCHES = 32
"""After a batch that had to run again guarded, how many batches run guarded from the start (a request
that fails once tends to come with others: each would cost an unguarded run for nothing)."""

P = ParamSpec("P")
R = TypeVar("R")


class StorageActor(Notices):
    def __init__(
        self,
        store: Store,
        clock: Clock,
        *,
        max_batch: int = 512,
        mailbox_size: int = 2048,
        fault: FaultHook | None = None,
        settle: Callable[[Tx, int], None] | None = None,
        check_ms: int = 1000,
        on_open: Callable[[Tx, int], object] | None = None,
    ) -> None:
        self.store = store
        self._clock = clock
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[Request](mailbox_size)
        self._fault = fault
        self._settle = settle
        self._check_ms = check_ms
        self._on_open = on_open
        super().__init__(secrets.token_hex(8))
        self.routing = False
        """Whether a router routes this runtime's Events (if not, its commits ask other nodes to)."""
        self._conn: Any = None
        self._dialect = store.dialect
        self._kept: Carried | None = Carried() if store.dialect.caches_reads else None
        """What committed transactions knew that later ones may take (`TxBase.committed`): a database
        alone only, where no one else writes it, and only while this actor's writer is the only one
        open on its file (`WriterConnection.alone`)."""
        self._kept_at: int | None = None
        # one thread of the actor's own for every blocking call (`WorkerThread`: a hand-off each way)
        self._thread = WorkerThread("loom storage")
        self._guarded = 0
        """How many more batches run guarded from the start (see the module's docstring)."""
        self._running = False
        self.stats = StorageStats()

    # -- public -----------------------------------------------------------

    async def submit(self, proc: Procedure[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``proc(tx, now_ms, *args, **kwargs)`` in the next batch; return its result after COMMIT."""
        return await self._submit(Request(proc, args, kwargs))  # type: ignore[no-any-return]

    async def read(self, proc: Procedure[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`submit` for a procedure that only reads: a batch made of reads alone commits nothing, so it
        publishes no notice (not even `Committed`): a watcher that reads the store at each notice
        (through a ``:memory:`` runtime's reader) waits for the next change instead of waking itself."""
        return await self._submit(Request(proc, args, kwargs, read=True))  # type: ignore[no-any-return]

    async def submit_relaxed(self, proc: Procedure[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`submit` for a procedure whose writes nobody loses anything by if a power loss takes them
        back (a fairness cursor: a lost move only makes the next call start where an earlier one
        did). A batch made of such requests (and reads) alone commits without waiting for the disk:
        its commit survives a process kill, not a power loss, and the next full commit makes it
        durable with everything before it. A batch holding any other write waits for the disk as
        always; so does one whose ``settle`` hook finds anything to settle (it runs again, in full)."""
        return await self._submit(Request(proc, args, kwargs, relaxed=True))  # type: ignore[no-any-return]

    async def _submit(self, request: Request) -> Any:
        if not self._running:
            # a caller being cancelled at shutdown sees its cancellation, not a closed store
            await trio.lowlevel.checkpoint_if_cancelled()
            raise StorageClosed("the storage actor is not running")
        try:
            # A mailbox with room takes the request without a pass of the loop (``send`` yields once
            # before and once after): the wait for its answer below is this call's checkpoint. A
            # caller already cancelled sends nothing, as ``send`` would not.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                self._send.send_nowait(request)
            except trio.WouldBlock:
                await self._send.send(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await trio.lowlevel.checkpoint_if_cancelled()
            raise StorageClosed("the storage actor stopped") from None
        await request.done.wait()
        if request.ok:
            return request.value
        assert request.error is not None
        if isinstance(request.error, StorageClosed):
            await trio.lowlevel.checkpoint_if_cancelled()
        raise request.error

    @property
    def running(self) -> bool:
        """Whether the actor takes requests (it started and has not stopped)."""
        return self._running

    @property
    def shared(self) -> bool:
        """Whether other runtimes (nodes) may write the same database."""
        return self._dialect.shared

    @property
    def check_ms(self) -> int:
        """How often (clock time) the actors of a shared database look at the store again from their
        cursors, whatever they heard."""
        return self._check_ms

    async def _check(self) -> None:
        """A shared database: every ``check_ms`` of the clock, the actors look at the store again from
        their cursors (a safety net under the notifications, never a rescan of everything)."""
        while True:
            await self._clock.sleep_until(self._clock.now_ms() + self._check_ms)
            self.announce(StoreChanged(check=True))

    # -- the actor --------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[StorageActor] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._run(task_status)
        finally:
            self._thread.stop()  # its last call is over: nothing of the actor runs there any more

    async def _run(self, task_status: trio.TaskStatus[StorageActor]) -> None:
        self._conn = await self._thread.run_sync(self.store.open_writer)
        if self._on_open is not None:
            await self._thread.run_sync(self._open_with, self._on_open)
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                listen = getattr(self.store, "listen", None) if self._dialect.shared else None
                if listen is not None:
                    await nursery.start(listen, self._heard)
                    nursery.start_soon(self._check)
                task_status.started(self)
                await self._serve()
        finally:
            self._running = False
            self._fail_pending(StorageClosed("the storage actor stopped"))
            self._receive.close()
            with trio.CancelScope(shield=True):
                await self._close()

    def _open_with(self, proc: Callable[[Tx, int], object]) -> None:
        """Run ``proc`` in a transaction of its own once the store is open, before any request (as a
        migration is): it is no batch, and nobody hears its notices."""
        tx = Tx(self._conn, self._dialect)
        self._conn.execute(self._dialect.begin)
        try:
            proc(tx, self._clock.now_ms())
            self._conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            self.store.close_writer(self._conn)
            self._conn = None
            raise

    async def _serve(self) -> None:
        batch_no = 0
        while True:
            batch = [await self._receive.receive()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            reads = all(request.read for request in batch)
            if not reads:
                batch_no += 1
            if self._conn is None:
                with trio.CancelScope(shield=True):
                    await self._reconnect()
            # reads alone commit nothing: no batch number, no crash point, no notice (not even
            # `Committed`: a watcher that reads at each notice is not woken by its own reads). The
            # batch is shielded: its one wait, for the thread, is (`WorkerThread.run_sync`), and a
            # cancel is delivered at the next batch's receive, once every caller has its answer.
            await self._run_batch(batch, None if reads else batch_no)

    async def _reconnect(self) -> None:
        """Open the connection again after it was lost, waiting longer after each failure; requests
        wait in the mailbox meanwhile (a caller may cancel its own)."""
        delays = self.store.reconnect_delays()
        attempt = 0
        while True:
            try:
                self._conn = await self._thread.run_sync(self.store.open_writer)
            except StorageError as exc:
                delay = delays[min(attempt, len(delays) - 1)]
                log.warning(
                    "reconnecting to %s failed (%s); next try in %.2fs", self.store.describe(), exc, delay
                )
                attempt += 1
                await trio.sleep(delay)
            else:
                log.warning("reconnected to %s", self.store.describe())
                return

    async def _run_batch(self, batch: list[Request], batch_no: int | None) -> None:
        now_ms = self._clock.now_ms()
        started = trio.current_time()
        try:
            notices, relaxed = await self._thread.run_sync(
                self._execute_until_settled, batch, now_ms, batch_no
            )
        except StorageFailure as failure:
            self.stats.failed_batches += 1
            others = f"this request and {len(batch) - 1} others in its batch"
            for request in batch:
                request.ok = False
                request.value = None
                if failure.lost:
                    request.error = StorageUnavailable(
                        f"the connection to {self.store.describe()} was lost; {others} "
                        f"{'may or may not have' if failure.in_commit else 'were not'} committed "
                        f"(the storage actor reconnects): {failure.cause}"
                    )
                else:
                    request.error = failure.kind(
                        f"storage failed; {others} were not committed: {failure.cause}"
                    )
                request.error.__cause__ = failure.cause
                request.done.set()
            return
        except BaseException as exc:
            # A crash point, or a failure the actor cannot recover from (ROLLBACK failed, an
            # unexpected error at COMMIT). A result set before the crash is no acknowledgement.
            self._running = False
            where = "at a fault point" if isinstance(exc, CrashPoint) else f"on {exc!r}"
            for request in batch:
                request.ok = False
                request.value = None
                request.error = StorageClosed(f"the storage actor crashed {where} (batch {batch_no})")
                request.done.set()
            raise
        for request in batch:
            request.done.set()
        if batch_no is None:
            self.stats.reads += len(batch)
            return  # reads alone: nothing was committed, nothing to tell
        if relaxed:
            self.stats.relaxed_batches += 1
        self.stats.batches += 1
        self.stats.requests += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        seconds = trio.current_time() - started
        self._committed(
            notices, Committed(batch=batch_no, at_ms=now_ms, requests=len(batch), seconds=seconds)
        )

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
                    if len(batch) > 1:  # (each request alone, with its own retries)
                        where = self.store.describe()
                        return one_by_one(
                            self._execute_until_settled, batch, now_ms, batch_no, self.stats, where
                        ), False
                    raise StorageFailure(conflict.cause) from conflict.cause
                self.stats.conflict_reruns += 1
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
        kept = self._kept
        if kept is not None:
            alone = conn.alone()
            if alone is None or alone != self._kept_at:
                kept.clear()  # (another writer opened meanwhile may have written what it holds)
                self._kept_at, kept = alone, kept if alone is not None else None
        tx = Tx(conn, dialect, guarded=guarded, kept=kept)
        tx.batched = True
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
            tx.write_bumps()
            if dialect.notify is not None:
                payload = summarize(tx.notices, self.origin, routing=self.routing)
                if payload is not None:
                    dialect.send_later(conn, dialect.notify, (payload,))  # it goes with the COMMIT
            if self._fault is not None and batch_no is not None:
                self._fault("before_commit", batch_no)
            in_commit = True
            conn.execute("COMMIT")
            tx.committed()
        except CrashPoint:
            self._abandon()
            raise
        except Exception as exc:
            if in_commit and self._kept is not None:
                self._kept.clear()  # (a COMMIT that failed may have landed: nothing carried answers)
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

    def _fail_pending(self, error: BaseException) -> None:
        while True:
            try:
                request = self._receive.receive_nowait()
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                break
            request.error = error
            request.done.set()
        self._close_feeds()

    async def _close(self) -> None:
        """A clean close (the backend folds in what it must first: SQLite's write-ahead log)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._thread.run_sync(self.store.close_writer, conn)
