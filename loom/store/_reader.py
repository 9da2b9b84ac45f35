"""The read side: queries on a read-only connection of their own, in a thread of their own.

Reads never block the writer (WAL) and a cancelled read interrupts its query. Each read is one hand-off
to the reader's thread and one back (`WorkerThread`, as the storage actor's): sqlite-anyio, which this
side used before, made four per query (a cursor, its execute, its fetch and its close, each through
anyio's worker threads), 730 against 110 us per read here (bench/README.md, (14)). A
``:memory:`` database has no second connection, so its reads go through the storage actor instead
(`ActorReader`); both readers offer the same methods, mirroring `Tx`.

A read that fails in the store (a corrupt page, an I/O error), or finds the file deleted or replaced
since it was opened, raises `StorageError` (a closed reader `StorageClosed`): what the store answers
is never mistaken for a fault of loom's, and never read from a file that is no longer the database.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes, urlsplit

import trio

from ..records.budgets import BudgetLedger
from ..records.compaction import StoreSize
from ..records.errors import StorageClosed, StorageError
from ..records.events import Diagnostic, Event, KVEntry
from ..records.subscriptions import Subscription
from ..records.timers import Firing, Timer
from ..records.waits import Wait
from ..records.work import Checkpoint, Execution, Intent, Work
from . import _sql
from ._actor import StorageActor
from ._browse import BrowseReads
from ._dialect import SQLITE
from ._sqlite import note_corrupt
from ._thread import WorkerThread
from ._tx import Tx
from ._tx_budgets import LEDGER_COLUMNS, ledger_from_row
from ._tx_compaction import TABLES
from ._tx_subscriptions import SUBSCRIPTION_SELECT, subscription_from_row
from ._tx_waits import WAIT_SELECT, wait_from_row

Rows = list[tuple[Any, ...]]
T = TypeVar("T")


def _file_of(uri: str) -> str | None:
    """The file a ``file:`` URI names, as the path it was made from (`SQLiteStore.reader_uri` quotes
    the file name's bytes: a name that is not UTF-8 comes back byte for byte)."""
    parts = urlsplit(uri)
    return os.fsdecode(unquote_to_bytes(parts.path)) if parts.scheme == "file" and parts.path else None


PROGRESS_STEPS = 10_000
"""How many of SQLite's virtual machine steps a read runs between two looks at whether it was cancelled
(``set_progress_handler``): a cancelled read stops within about a millisecond of work."""


def _newest(sql: str, params: tuple[Any, ...], newest: int | None) -> tuple[str, tuple[Any, ...]]:
    """``sql`` (ending ``ORDER BY <column>``) as it is, or for its last ``newest`` rows, newest first."""
    if newest is None:
        return sql, params
    return f"{sql} DESC LIMIT ?", (*params, newest)


class Reader(BrowseReads):
    """Read-only queries on a file database, on one connection in a thread of the reader's own.

    One read runs at a time (the lock), and closing takes the lock too: a read that races the close
    either finishes first or finds the store closed (`StorageClosed`), never a connection closed under
    its query. A read cancelled while its query runs stops it (the connection's progress handler sees
    the read's cancel and aborts the statement within `PROGRESS_STEPS` steps, from its first ones if
    the cancel came first) and ends with the cancellation once the thread has let go of the
    connection.
    """

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()
        self._thread = WorkerThread("loom reader")
        self._stop = threading.Event()
        """Set when the read in progress is cancelled (`_progress` aborts its statement)."""
        self._path = _file_of(uri)
        self._identity: tuple[int, int] | None = None

    async def open(self) -> None:
        """Connect, and note the file's identity (`_check_file`). A failure, SQLite's or the OS's,
        leaves nothing open (no connection, no thread) and raises `StorageError` naming the file."""
        try:
            self._conn, self._identity = await self._thread.run_sync(self._connect_file)
        except BaseException as exc:
            self._thread.stop()
            if isinstance(exc, (sqlite3.Error, OSError)) and not isinstance(exc, StorageError):
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise StorageError(f"cannot open a reader on {self._path or self._uri}: {reason}") from exc
            raise

    def _check_file(self) -> None:
        if self._path is None or self._identity is None:
            return
        try:
            info = os.stat(self._path)
        except FileNotFoundError:
            raise StorageError(f"the database file {self._path} was deleted while loom had it open") from None
        except OSError as exc:
            raise StorageError(
                f"cannot look at the database file {self._path}: {exc.strerror or exc}"
            ) from None
        if (info.st_dev, info.st_ino) != self._identity:
            raise StorageError(f"the database file {self._path} was replaced while loom had it open")

    def _connect_file(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        """In the reader's thread: the connection and the identity (device, inode) of its file, or
        nothing open if either fails."""
        conn = sqlite3.connect(self._uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            conn.set_progress_handler(self._progress, PROGRESS_STEPS)
            if self._path is None:
                return conn, None
            info = os.stat(self._path)
        except BaseException:
            conn.close()
            raise
        return conn, (info.st_dev, info.st_ino)

    def _progress(self) -> int:
        """SQLite asks, every `PROGRESS_STEPS` steps of a statement: nonzero aborts it (cancelled)."""
        return 1 if self._stop.is_set() else 0

    async def _guarded(self, run: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``run`` on the connection in the reader's thread, one read at a time; the store's failures
        as `StorageError`."""
        if self._conn is None:
            raise StorageClosed("the store is closed: reads end with the runtime")
        async with self._lock:
            conn = self._conn
            if conn is None:
                raise StorageClosed("the store is closed: reads end with the runtime")
            self._check_file()
            self._stop.clear()
            try:
                return await self._thread.run_sync(self._in_thread, run, conn, interrupt=self._stop.set)
            except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
                if self._conn is None:
                    raise StorageClosed("the store is closed: reads end with the runtime") from None
                raise  # a fault in loom's own query
            except sqlite3.Error as exc:
                note_corrupt(self._path, exc)
                raise StorageError(f"reading {self._path or 'the store'} failed: {exc}") from exc

    def _in_thread(self, run: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        """In the reader's thread: ``run`` (stopped by `_progress` once cancelled, even before it began);
        a read transaction it left open (a snapshot stopped half-way) is ended, whatever happened."""
        try:
            return run(conn)
        finally:
            if conn.in_transaction:
                self._stop.clear()  # (the progress handler would stop the ROLLBACK too)
                conn.execute("ROLLBACK")

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None  # reads from now on are refused
        if conn is not None:
            with trio.CancelScope(shield=True):
                async with self._lock:  # the read in progress (if any) ends first
                    await self._thread.run_sync(conn.close)
        self._thread.stop()

    async def _all(self, sql: str, params: tuple[Any, ...]) -> Rows:
        def query(conn: sqlite3.Connection) -> Rows:
            return conn.execute(sql, params).fetchall()

        return await self._guarded(query)

    async def _snapshot(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[Rows]:
        """Several queries in one read transaction: one consistent snapshot."""

        def snapshot(conn: sqlite3.Connection) -> list[Rows]:
            conn.execute("BEGIN")
            out = [conn.execute(sql, params).fetchall() for sql, params in queries]
            conn.execute("COMMIT")
            return out

        return await self._guarded(snapshot)

    async def event(self, event_id: str) -> Event | None:
        rows = await self._all(_sql.EVENT_BY_ID, (event_id,))
        return _sql.event_from_row(rows[0]) if rows else None

    async def event_by_delivery(self, source: str, delivery_id: str) -> Event | None:
        rows = await self._all(_sql.EVENT_BY_DELIVERY, (source, delivery_id))
        return _sql.event_from_row(rows[0]) if rows else None

    async def events_after(self, seq: int, limit: int, type: str | None = None) -> list[Event]:
        if type is not None:
            rows = await self._all(_sql.EVENTS_OF_TYPE_AFTER, (type, seq, limit))
            return [_sql.event_from_row(r) for r in rows]
        return [_sql.event_from_row(r) for r in await self._all(_sql.EVENTS_AFTER, (seq, limit))]

    async def events_of_root(
        self, root_id: str, after_seq: int, limit: int, type: str | None = None
    ) -> list[Event]:
        args = (type, type, after_seq)
        rows = await self._all(_sql.EVENTS_OF_ROOT, (root_id, *args, root_id, *args, limit))
        return [_sql.event_from_row(r) for r in rows]

    async def unrouted_events(self, after_seq: int, limit: int) -> list[Event]:
        return [_sql.event_from_row(r) for r in await self._all(_sql.UNROUTED_EVENTS, (after_seq, limit))]

    async def kv_get(self, namespace: str, key: str) -> KVEntry | None:
        rows = await self._all(_sql.KV_GET, (namespace, key))
        return _sql.kv_from_row(rows[0]) if rows else None

    async def kv_list(self, namespace: str, limit: int = 1000) -> list[KVEntry]:
        return [_sql.kv_from_row(r) for r in await self._all(_sql.KV_LIST, (namespace, limit))]

    async def ledgers(self, budget: str | None, subject: str | None, limit: int) -> list[BudgetLedger]:
        rows = await self._all(
            f"SELECT {LEDGER_COLUMNS} FROM budget_ledgers WHERE (CAST(? AS TEXT) IS NULL OR budget = ?)"
            ' AND (CAST(? AS TEXT) IS NULL OR subject = ?) ORDER BY budget, subject, "window" LIMIT ?',
            (budget, budget, subject, subject, limit),
        )
        return [ledger_from_row(r) for r in rows]

    async def bucket_count(self, root_id: str, minute: int) -> int:
        rows = await self._all(_sql.BUCKET_COUNT, (root_id, minute))
        return int(rows[0][0]) if rows else 0

    async def work(self, work_id: str) -> Work | None:
        row, keys, pending, live, wait = await self._snapshot(
            [
                (_sql.WORK_BY_ID, (work_id,)),
                (_sql.WORK_KEYS, (work_id,)),
                (_sql.WORK_PENDING, (work_id,)),
                (_sql.WORK_LIVE_EXECUTION, (work_id,)),
                (_sql.WORK_OPEN_WAIT, (work_id,)),
            ]
        )
        if not row:
            return None
        return _sql.work_from_row(
            row[0],
            tuple(r[0] for r in keys),
            tuple(r[0] for r in pending),
            live[0] if live else None,
            wait[0][0] if wait else None,
        )

    async def works(
        self, *, state: str | None, after_id: str, limit: int, scope: str | None = None
    ) -> list[Work]:
        """Works in id order after ``after_id``; ``scope``: that scope and the scopes below it."""
        where = "id > ?"
        params: tuple[Any, ...] = (after_id,)
        if state is not None:
            where += " AND state = ?"
            params += (state,)
        if scope is not None:
            where += " AND (scope = ? OR substr(scope, 1, ?) = ?)"
            params += (scope, len(scope) + 1, scope + "/")
        # one snapshot of five queries for the whole page, however long it is
        page = f"SELECT id FROM works WHERE {where} ORDER BY id LIMIT ?"
        return await self._works_of_page(page, (*params, limit), "id")

    async def key_owner(self, key: str) -> str | None:
        rows = await self._all(_sql.KEY_OWNER, (key,))
        return str(rows[0][0]) if rows else None

    async def checkpoint(self, event_id: str) -> Checkpoint | None:
        rows = await self._all(_sql.CHECKPOINT_BY_EVENT, (event_id,))
        return _sql.checkpoint_from_row(rows[0]) if rows else None

    async def checkpoints_of_work(self, work_id: str, newest: int | None = None) -> list[Checkpoint]:
        """The Work's checkpoints in commit order; ``newest``: only the last so many (one bounded read
        of the index, however many it has)."""
        rows = await self._all(*_newest(_sql.CHECKPOINTS_OF_WORK, (work_id,), newest))
        return [_sql.checkpoint_from_row(r) for r in (rows if newest is None else reversed(rows))]

    async def execution(self, execution_id: str) -> Execution | None:
        rows = await self._all(_sql.EXECUTION_BY_ID, (execution_id,))
        return _sql.execution_from_row(rows[0]) if rows else None

    async def executions_of_work(self, work_id: str, newest: int | None = None) -> list[Execution]:
        sql = f"{_sql.EXECUTION_SELECT} WHERE work_id = ? ORDER BY attempt"
        rows = await self._all(*_newest(sql, (work_id,), newest))
        return [_sql.execution_from_row(r) for r in (rows if newest is None else reversed(rows))]

    async def intents_of_execution(self, execution_id: str) -> list[Intent]:
        rows = await self._all(f"{_sql.INTENT_SELECT} WHERE execution_id = ? ORDER BY id", (execution_id,))
        return [_sql.intent_from_row(r) for r in rows]

    async def open_intents(self, work_id: str | None, limit: int) -> list[Intent]:
        rows = await self._all(
            f"{_sql.INTENT_SELECT} WHERE (CAST(? AS TEXT) IS NULL OR work_id = ?) AND status IN {_sql.OPEN_INTENTS}"
            " ORDER BY id LIMIT ?",
            (work_id, work_id, limit),
        )
        return [_sql.intent_from_row(r) for r in rows]

    async def gauges(self, now_ms: int, cap: int, window: int) -> dict[str, int | None]:
        """Figures for alerts, each from one bounded indexed read in one snapshot: Works by state and
        the ready queue (counted up to ``cap``), armed and overdue timers (up to ``cap``), the earliest
        armed timer's time, and unrouted Events among the last ``window`` accepted."""
        states = ("ready", "running", "waiting", "completed", "cancelled", "failed")
        queries: list[tuple[str, tuple[Any, ...]]] = [
            (_sql.COUNT_WORKS_IN_STATE, (state, cap)) for state in states
        ]
        queries += [
            (_sql.COUNT_READY, (cap,)),
            (_sql.COUNT_ARMED_TIMERS, (cap,)),
            (_sql.COUNT_OVERDUE_TIMERS, (now_ms, cap)),
            (_sql.EARLIEST_ARMED_TIMER, ()),
            (_sql.COUNT_RECENT_UNROUTED, (window, cap)),
        ]
        rows = await self._snapshot(queries)
        figures: dict[str, int | None] = {
            f"works_{state}": int(r[0][0]) for state, r in zip(states, rows, strict=False)
        }
        ready, armed, overdue, earliest, unrouted = rows[len(states) :]
        figures |= {
            "ready": int(ready[0][0]),
            "timers_armed": int(armed[0][0]),
            "timers_overdue": int(overdue[0][0]),
            "earliest_timer_ms": None if earliest[0][0] is None else int(earliest[0][0]),
            "unrouted": int(unrouted[0][0]),
        }
        return figures

    async def diagnostics(
        self, kind: str | None, subject: str | None, limit: int, after_id: int = 0
    ) -> list[Diagnostic]:
        rows = await self._all(_sql.DIAGNOSTICS, (kind, kind, subject, subject, after_id, limit))
        return [_sql.diagnostic_from_row(r) for r in rows]

    async def diagnostics_about(self, subject: str, limit: int) -> list[Diagnostic]:
        """The subject's latest diagnostics, newest first."""
        rows = await self._all(_sql.DIAGNOSTICS_ABOUT, (subject, limit))
        return [_sql.diagnostic_from_row(r) for r in rows]

    async def timer(self, timer_id: str) -> Timer | None:
        rows = await self._all(_sql.TIMER_BY_ID, (timer_id,))
        return _sql.timer_from_row(rows[0]) if rows else None

    async def timers(
        self, *, state: str | None, after_id: str, limit: int, work_id: str | None = None
    ) -> list[Timer]:
        """Timers in id order after ``after_id``; ``work_id``: those that name the Work or that its
        attempts armed (deadlines, derived timers)."""
        rows = await self._all(
            f"{_sql.TIMER_SELECT} WHERE (CAST(? AS TEXT) IS NULL OR state = ?) AND id > ?"
            " AND (CAST(? AS TEXT) IS NULL OR work_id = ?"
            " OR execution_id IN (SELECT id FROM executions WHERE work_id = ?)) ORDER BY id LIMIT ?",
            (state, state, after_id, work_id, work_id, work_id, limit),
        )
        return [_sql.timer_from_row(r) for r in rows]

    async def waits_of_work(self, work_id: str) -> list[Wait]:
        rows = await self._all(f"{WAIT_SELECT} WHERE work_id = ? ORDER BY attempt, epoch, id", (work_id,))
        return [wait_from_row(r) for r in rows]

    async def wait(self, wait_id: str) -> Wait | None:
        rows = await self._all(f"{WAIT_SELECT} WHERE id = ?", (wait_id,))
        return wait_from_row(rows[0]) if rows else None

    async def subscriptions_of_work(self, work_id: str) -> list[Subscription]:
        rows = await self._all(f"{SUBSCRIPTION_SELECT} WHERE work_id = ? ORDER BY namespace, id", (work_id,))
        return [subscription_from_row(r) for r in rows]

    async def subscription(self, namespace: str, id: str) -> Subscription | None:
        rows = await self._all(f"{SUBSCRIPTION_SELECT} WHERE namespace = ? AND id = ?", (namespace, id))
        return subscription_from_row(rows[0]) if rows else None

    async def firings_of_timer(self, timer_id: str, newest: int | None = None) -> list[Firing]:
        rows = await self._all(*_newest(_sql.FIRINGS_OF_TIMER, (timer_id,), newest))
        return [_sql.firing_from_row(r) for r in (rows if newest is None else reversed(rows))]

    size_sql = SQLITE.size_sql

    async def store_size(self) -> StoreSize:
        """Rows per table and the database's bytes, in one snapshot (a count of every row: seconds on
        tables of many millions; the metrics read it at most once a minute)."""
        queries: list[tuple[str, tuple[Any, ...]]] = [(f"SELECT count(*) FROM {t}", ()) for t in TABLES]
        found = await self._snapshot([*queries, (self.size_sql, ())])
        size = found[-1][0]
        return StoreSize(
            rows={table: int(rows[0][0]) for table, rows in zip(TABLES, found, strict=False)},
            bytes=int(size[0]),
            free_bytes=int(size[1]),
        )


class ActorReader(Reader):
    """The same reads, served by the storage actor through `Tx` (for ``:memory:``)."""

    def __init__(self, storage: StorageActor) -> None:
        super().__init__(":memory:")
        self._storage = storage
        self.size_sql = storage.store.dialect.size_sql

    async def open(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def _all(self, sql: str, params: tuple[Any, ...]) -> Rows:
        def read(tx: Tx, now_ms: int) -> Rows:
            return tx._all(sql, params)

        return await self._storage.read(read)

    async def _snapshot(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[Rows]:
        def read(tx: Tx, now_ms: int) -> list[Rows]:
            return [tx._all(sql, params) for sql, params in queries]

        return await self._storage.read(read)
