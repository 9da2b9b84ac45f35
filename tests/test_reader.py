"""The read side on a file (loom/store/_reader.py): a read runs in the reader's own thread, a cancelled
read stops its query and leaves the connection usable, and reads still answer what is committed."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio

import loom
from loom.store import Reader, SQLiteStore
from loom.store._open import open_reader
from loom.store._postgres import PostgresStore
from loom.testing import T0_MS
from loom.testing.postgres import PostgresCluster

LONG = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
"""A query that never ends by itself (it counts forever)."""
SLEEP = ("SELECT pg_sleep(60)", ())
"""PostgreSQL's long query."""


async def opened(tmp_path: Path) -> Reader:
    db = str(tmp_path / "r.db")
    async with loom.open_runtime(db, clock=loom.ManualClock(start_ms=T0_MS), load_entry_points=False) as rt:
        await rt.publish(loom.EventIn(source="s", delivery_id="d-1", type="t.x", scope="s"))
    reader = Reader(SQLiteStore(path=db).reader_uri())
    await reader.open()
    return reader


async def cancelled_once_begun(begun: threading.Event, read: Callable[[], Awaitable[object]]) -> bool:
    """Run ``read``, cancelling it once the reader's thread sets ``begun``; whether the cancel ended it."""
    begun.clear()
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_once_running() -> None:
                assert await trio.to_thread.run_sync(begun.wait, 30)
                scope.cancel()

            nursery.start_soon(cancel_once_running)
            await read()
    return scope.cancelled_caught


async def test_a_cancelled_read_stops_its_query_and_the_reader_goes_on(tmp_path: Path) -> None:
    """A query running when its read is cancelled stops, and the reader answers the next read. Wrong
    implementations caught: a cancel that waits for the query (this one never ends: the test's time limit
    fails it), and a snapshot left open by its stop (the next read would fail to begin its own)."""
    reader = await opened(tmp_path)
    begun = threading.Event()

    def one(conn: sqlite3.Connection) -> object:
        begun.set()
        return conn.execute(LONG).fetchall()

    def snapshot(conn: sqlite3.Connection) -> object:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM events").fetchall()
        return one(conn)

    try:
        with trio.fail_after(30):  # (a guard: a cancel that does not stop the query never returns)
            for run in (one, snapshot):
                assert await cancelled_once_begun(begun, partial(reader._guarded, run))
                assert len(await reader.events_after(0, 10)) == 1
                assert len(await reader._snapshot([("SELECT 1", ())])) == 1
    finally:
        await reader.aclose()


async def test_a_cancelled_read_on_postgresql_stops_its_query_and_the_reader_goes_on(
    loom_postgres: PostgresCluster,
) -> None:
    """The same on PostgreSQL, where the server cancels the query. Here each read's queries reach the
    server only after the first cancel did (which the server drops: nothing runs yet). Wrong
    implementations caught: a cancel that waits for the query (60 s of sleep: the time limit fails it),
    and a cancel sent once."""
    url = loom_postgres.create_database(template=loom_postgres.migrated_template())
    reader = open_reader(PostgresStore(url=url), cast(Any, None))
    await reader.open()
    begun, sent = threading.Event(), threading.Event()
    read = reader._read  # type: ignore[attr-defined]
    raw = reader._raw  # type: ignore[attr-defined]
    cancel = raw.cancel_safe

    def reading(queries: list[tuple[str, tuple[Any, ...]]]) -> object:
        begun.set()
        assert sent.wait(30)
        return read(queries)

    def cancelling(*args: Any, **kwargs: Any) -> None:
        cancel(*args, **kwargs)
        sent.set()

    reader._read = reading  # type: ignore[attr-defined]
    raw.cancel_safe = cancelling
    try:
        with trio.fail_after(30):  # (a guard: a cancel that does not stop the query never returns)
            for queries in ([SLEEP], [("SELECT count(*) FROM events", ()), SLEEP]):
                sent.clear()
                assert await cancelled_once_begun(begun, partial(reader._snapshot, queries))
                assert await reader.events_after(0, 10) == []
                assert await reader._snapshot([("SELECT 1", ()), ("SELECT 2", ())]) == [[(1,)], [(2,)]]
    finally:
        await reader.aclose()
