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

A request that finds the actor quiet (its last batch was one request, nobody waited behind it, and
nothing waits or runs now: one caller publishing one request after another) runs as a batch of its own
in the caller's task, where the actor would have run it alone all the same: that spares two passes of
the trio loop (the actor's task woken, then the caller's), most of what one producer's publish costs
beside its commit. Under load the mailbox gathers requests as before, and the next batch takes them all.

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
import secrets
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import attrs
import outcome
import trio

from ..records.clock import Clock
from ..records.errors import StorageClosed, StorageError, StorageUnavailable
from ..records.notices import Committed, Notice, StoreChanged
from ._batch import CrashPoint, FaultHook, Procedure, Request, StorageFailure, StorageStats
from ._dialect import Store
from ._feed import Notices
from ._thread import WorkerThread
from ._transact import GUARDED_BATCHES as GUARDED_BATCHES
from ._transact import Transactions
from ._tx import Tx

log = logging.getLogger("loom.storage")

P = ParamSpec("P")
R = TypeVar("R")


@attrs.frozen
class _InFlight:
    """A batch handed to the worker thread, until its answer is taken (`StorageActor._landed`)."""

    batch: list[Request]
    batch_no: int | None
    now_ms: int
    started: float


class StorageActor(Transactions, Notices):
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
        # one thread of the actor's own for every blocking call (`WorkerThread`: a hand-off each way)
        self._thread = WorkerThread("loom storage")
        self._guarded = 0
        """How many more batches run guarded from the start (see the module's docstring)."""
        self._running = False
        self.stats = StorageStats()
        self._batch_no = 0
        self._in_batch = False
        """A batch runs (in the actor's task, or alone in its caller's): one at a time."""
        self._batch_over = trio.Event()
        """Set when a batch ends (a task that waits for one makes a fresh one first)."""
        self._quiet = True
        """The last batch was one request, and none waited when it ended: the next may run alone."""
        self._crash: BaseException | None = None
        """What stopped a batch run in its caller's task: the actor's task raises it (`_run_alone`)."""
        self._wake = trio.Event()
        """Set when a request enters the mailbox or a batch ends: the actor's task looks again."""
        self._handed: _InFlight | None = None
        """A batch run alone whose caller was cancelled while it ran: the actor's task answers it."""

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
            if self._quiet and not self._in_batch and self._conn is not None and not self._waiting():
                return await self._run_alone(request)
            try:
                self._send.send_nowait(request)
            except trio.WouldBlock:
                await self._send.send(request)
            self._wake.set()
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

    def _waiting(self) -> bool:
        return self._receive.statistics().current_buffer_used > 0

    async def _run_alone(self, request: Request) -> Any:
        """Run ``request`` as a batch of its own in the caller's task (see the module docstring), as the
        actor's task would, numbered in turn. A caller cancelled meanwhile leaves at once, as one
        waiting in the mailbox would: its batch goes on, and the actor's task answers it
        (``_handed``). A crash stops the actor all the same: its task raises it (`_serve`), and the
        caller gets `StorageClosed`, as every request of the batch would."""
        self._in_batch = True
        batch_no = None
        if not request.read:
            self._batch_no += 1
            batch_no = self._batch_no
        flight = self._take_off([request], batch_no)
        try:
            answer = await self._thread.answer()
        except BaseException:  # cancelled: the call goes on without this caller
            self._handed = flight
            self._wake.set()
            self._batch_over.set()
            raise
        try:
            self._landed(flight, answer)
        except BaseException as exc:
            self._crash = exc  # `_landed` stopped the actor and answered the request
        finally:
            self._batch_ended(1)
        if request.ok:
            return request.value
        assert request.error is not None
        raise request.error

    async def _land_handed(self) -> None:
        """Answer the batch a cancelled caller left in flight (`_run_alone`)."""
        flight, self._handed = self._handed, None
        assert flight is not None
        try:
            with trio.CancelScope(shield=True):
                answer = await self._thread.answer()
            self._landed(flight, answer)
        finally:
            self._batch_ended(len(flight.batch))

    def _batch_ended(self, requests: int) -> None:
        self._in_batch = False
        waiting = self._waiting()
        self._quiet = requests == 1 and not waiting
        self._batch_over.set()
        if waiting or self._crash is not None:
            self._wake.set()  # the actor's task takes what waits (or stops); else it sleeps on

    async def _no_batch_running(self) -> None:
        while self._in_batch:
            if self._handed is not None:
                await self._land_handed()
                continue
            self._batch_over = trio.Event()
            await self._batch_over.wait()

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
                await self._no_batch_running()  # a caller's own batch ends before the connection closes
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
        while True:
            # requests stay in the mailbox (its room is the backpressure) until a batch can take them:
            # none runs, not even one a caller runs alone (`_run_alone`)
            while True:
                if self._crash is not None:
                    raise self._crash  # a batch run alone stopped the actor
                if self._handed is not None:
                    await self._land_handed()
                elif not self._in_batch and self._waiting():
                    break
                else:
                    self._wake = trio.Event()
                    await self._wake.wait()
            batch = [self._receive.receive_nowait()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            reads = all(request.read for request in batch)
            if not reads:
                self._batch_no += 1
            batch_no = self._batch_no
            self._in_batch = True
            try:
                with trio.CancelScope(shield=True):
                    if self._conn is None:
                        await self._reconnect()
                    # reads alone commit nothing: no batch number, no crash point, no notice (not even
                    # `Committed`: a watcher that reads at each notice is not woken by its own reads)
                    await self._run_batch(batch, None if reads else batch_no)
            finally:
                self._batch_ended(len(batch))

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
        """Run a batch in the worker thread and answer its requests (the caller shields it)."""
        flight = self._take_off(batch, batch_no)
        self._landed(flight, await self._thread.answer())

    def _take_off(self, batch: list[Request], batch_no: int | None) -> _InFlight:
        now_ms = self._clock.now_ms()
        self._thread.start(self._execute_until_settled, batch, now_ms, batch_no)
        return _InFlight(batch, batch_no, now_ms, trio.current_time())

    def _landed(self, flight: _InFlight, answer: outcome.Outcome[tuple[list[Notice], bool]]) -> None:
        """Answer a batch's requests from what its run in the thread did, and tell what it committed."""
        batch, batch_no, now_ms, started = flight.batch, flight.batch_no, flight.now_ms, flight.started
        try:
            notices, relaxed = answer.unwrap()
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
                    request.error = StorageError(
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
