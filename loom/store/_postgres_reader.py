"""The read side on PostgreSQL: `PostgresReader`, the same reads as `Reader` on a connection of their own."""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
import psycopg.errors
import trio

from ..records.errors import StorageClosed, StorageError, StorageUnavailable
from ._postgres import POSTGRES, PostgresConnection, PostgresStore
from ._reader import Reader, Rows

log = logging.getLogger("loom.storage")

CANCEL_EVERY_S = 0.05
"""How often a cancelled read asks the server again to cancel its query, until its call is over."""


class PostgresReader(Reader):
    """The same reads on a connection of their own, in a thread of the reader's own (`WorkerThread`: one
    hand-off there and back per read), one read at a time (see `_read` for failures).

    A read cancelled while its query runs stops it: the cancel asks the server to cancel the
    connection's query (``cancel_safe``, from a thread of its own: it opens a connection to the
    server), again every `CANCEL_EVERY_S` until the read's call is over (a cancel that reaches the
    server between two statements is dropped there), and the read ends with the cancellation once the
    call has let go of the connection. The next read waits for the canceller to be done, so no cancel
    meant for one read reaches another."""

    size_sql = POSTGRES.size_sql

    def __init__(self, store: PostgresStore) -> None:
        super().__init__(store.describe())
        self._store = store
        self._raw: psycopg.Connection[tuple[Any, ...]] | None = None
        self._open = False
        self._over = threading.Event()
        """Set when the read in progress is over (its canceller, if any, stops)."""
        self._canceller: threading.Thread | None = None

    async def open(self) -> None:
        try:
            self._raw = await self._thread.run_sync(self._connect)
        except BaseException:
            self._thread.stop()
            raise
        self._open = True

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        return self._store.connect(application_name="loom reader")

    async def aclose(self) -> None:
        self._open = False  # reads from now on are refused
        with trio.CancelScope(shield=True):
            async with self._lock:  # the read in progress (if any) ends first
                await self._thread.run_sync(self._close)
        self._thread.stop()

    def _close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()

    async def _all(self, sql: str, params: tuple[Any, ...]) -> Rows:
        return (await self._snapshot([(sql, params)]))[0]

    async def _snapshot(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[Rows]:
        if not self._open:
            raise StorageClosed("the store is closed: reads end with the runtime")
        async with self._lock:
            self._over.clear()
            try:
                return await self._thread.run_sync(self._read_to_end, queries, interrupt=self._cancel)
            finally:
                if (canceller := self._canceller) is not None:
                    self._canceller = None
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(canceller.join)

    def _read_to_end(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[Rows]:
        try:
            return self._read(queries)
        finally:
            self._over.set()

    def _cancel(self) -> None:
        """The read in progress was cancelled (called from the loop's thread, while its call runs)."""
        raw = self._raw
        if raw is not None and self._canceller is None:
            self._canceller = threading.Thread(
                target=self._cancel_until_over, args=(raw,), name="loom reader cancel", daemon=True
            )
            self._canceller.start()

    def _cancel_until_over(self, raw: psycopg.Connection[tuple[Any, ...]]) -> None:
        while True:
            try:
                raw.cancel_safe(timeout=CANCEL_EVERY_S * 10)
            except psycopg.Error as exc:  # the read fails or ends by itself all the same
                log.warning("could not cancel a read on %s: %s", self._store.describe(), exc)
            if self._over.wait(CANCEL_EVERY_S):
                return

    def _read(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[Rows]:
        # A read changes nothing: one that finds its connection gone (a server restart since the last
        # read) connects again, and one that named a prepared statement the server lost (psycopg forgot
        # it as it failed, all of them at a snapshot's rollback) runs again, once, before it fails.
        for retry in (True, False):
            if not self._open:
                raise StorageClosed("the store is closed: reads end with the runtime")
            if self._raw is None or self._raw.closed:
                self._raw = self._connect()
            try:
                return self._read_once(self._raw, queries)
            except psycopg.Error as exc:
                if POSTGRES.is_disconnect(exc) or self._raw.closed or self._raw.broken:
                    self._raw.close()
                    self._raw = None
                    if retry:
                        continue
                    raise StorageUnavailable(f"reading {self._store.describe()} failed: {exc}") from exc
                lost = isinstance(exc, psycopg.errors.InvalidSqlStatementName)
                if lost and retry:
                    continue
                if isinstance(exc, psycopg.errors.QueryCanceled) and self._canceller is None and retry:
                    continue  # a cancel meant for an earlier read, cancelled as it ended: run once more
                if lost or POSTGRES.is_storage_failure(exc):
                    raise StorageError(f"reading {self._store.describe()} failed: {exc}") from exc
                raise
        raise AssertionError("unreachable")

    @staticmethod
    def _read_once(
        raw: psycopg.Connection[tuple[Any, ...]], queries: list[tuple[str, tuple[Any, ...]]]
    ) -> list[Rows]:
        conn = PostgresConnection(raw)
        if len(queries) == 1:
            sql, params = queries[0]
            return [conn.execute(sql, params).fetchall()]
        with raw.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return [conn.execute(sql, params).fetchall() for sql, params in queries]
