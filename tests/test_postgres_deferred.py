"""Statements sent with the next one (PostgreSQL): a transaction's ``BEGIN``, the acceptance-order lock,
the commit's notification and the commit level wait for the next statement and go with it in one round
trip (`PostgresConnection.defer`, libpq's pipeline mode).

Catches: a deferred statement sent on its own (a round trip each: the counts below), one run after the
statement it must precede (the order test), one lost (a rollback before anything was sent leaves a
``BEGIN`` waiting, and a failed one must still fail what follows), and an error in a deferred statement
that vanishes instead of failing the statement it went with.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import trio

from loom import EventIn, ManualClock, NotFound, open_runtime
from loom.store import StorageActor, Tx, as_store
from loom.store._postgres import PostgresConnection
from loom.testing import T0_MS, raw
from loom.testing.internals import storage_of
from loom.testing.postgres import PostgresCluster


class Counted:
    """A psycopg connection that counts round trips: statements run outside a pipeline, and pipelines."""

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self._conn = conn
        self.trips = 0
        self.statements: list[str] = []
        self._inside = False

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        self.statements.append(sql.split()[0] + (" lock" if "advisory" in sql else ""))
        if not self._inside:
            self.trips += 1
        return self._conn.execute(sql, *args, **kwargs)

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        self.trips += 1
        self._inside = True
        try:
            with self._conn.pipeline():
                yield
        finally:
            self._inside = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@pytest.fixture
def url(loom_postgres: PostgresCluster) -> str:
    return loom_postgres.create_database(
        f"loom_defer_{uuid.uuid4().hex[:12]}", template=loom_postgres.migrated_template()
    )


@pytest.fixture
def conn(url: str) -> Iterator[PostgresConnection]:
    connection = PostgresConnection(psycopg.connect(url, autocommit=True))
    try:
        yield connection
    finally:
        connection.close()


def test_deferred_statements_run_in_order_with_the_next_one_in_one_round_trip(
    conn: PostgresConnection,
) -> None:
    counted = conn.raw = Counted(conn.raw)  # type: ignore[assignment]
    conn.defer("BEGIN")
    conn.defer("CREATE TEMPORARY TABLE steps (n INTEGER)")
    conn.defer("INSERT INTO steps VALUES (1)")
    assert conn.in_transaction, "a BEGIN waiting to be sent is a transaction to roll back"
    assert counted.trips == 0, "a deferred statement was sent on its own"
    row = conn.execute("SELECT count(*), max(n) FROM steps").fetchone()
    assert row == (1, 1), "the deferred statements did not run before the statement they went with"
    assert counted.trips == 1
    conn.execute("ROLLBACK")
    assert not conn.in_transaction


def test_an_error_in_a_deferred_statement_fails_the_statement_it_went_with(conn: PostgresConnection) -> None:
    conn.defer("BEGIN")
    conn.defer("SELECT no_such_function()")
    with pytest.raises(psycopg.errors.UndefinedFunction):
        conn.execute("SELECT 1")
    assert conn.in_transaction
    conn.execute("ROLLBACK")
    assert conn.execute("SELECT 2").fetchone() == (2,), "the connection is usable after the rollback"


def test_a_rollback_sends_a_waiting_begin_first_and_executemany_sends_what_waits(
    conn: PostgresConnection,
) -> None:
    conn.defer("BEGIN")
    conn.execute("ROLLBACK")  # with the BEGIN it rolls back: no warning, nothing left waiting
    assert not conn.in_transaction
    conn.defer("CREATE TEMPORARY TABLE rows_ (n INTEGER)")
    conn.executemany("INSERT INTO rows_ VALUES (?)", [(1,), (2,)])
    assert conn.execute("SELECT count(*) FROM rows_").fetchone() == (2,)


async def test_an_accepted_event_costs_three_round_trips(url: str) -> None:
    """One producer's publish on PostgreSQL: BEGIN, the order lock and the Event's insert in one round
    trip, the checkpoint's insert in a second, the notification and COMMIT in a third (the Event routes
    in its acceptance commit: no route matches it)."""
    async with open_runtime(url, clock=ManualClock(start_ms=T0_MS), load_entry_points=False) as rt:
        await rt.wait_idle()
        storage = storage_of(rt)
        counted = Counted(storage._conn.raw)
        storage._conn.raw = counted
        try:
            await rt.publish(EventIn(source="s", delivery_id="d-1", type="thing.done", scope="elsewhere"))
        finally:
            storage._conn.raw = counted._conn
        assert counted.statements == ["BEGIN", "SELECT lock", "INSERT", "INSERT", "SELECT", "COMMIT"]
        assert counted.trips == 3, counted.statements
    assert raw.query(url, "SELECT count(*) AS n FROM checkpoints")[0]["n"] == 1


async def test_a_batch_a_deferred_statement_fails_fails_as_a_whole(url: str, nursery: trio.Nursery) -> None:
    """A deferred statement that fails surfaces with the statement it went with: its request fails,
    nothing of it commits, and the next request runs."""
    actor: StorageActor = await nursery.start(StorageActor(as_store(url), ManualClock(start_ms=T0_MS)).run)

    def fails_later(tx: Tx, now_ms: int) -> None:
        tx.kv_put("t", "before", {"n": 1}, now_ms)
        tx.dialect.send_later(tx._conn, "SELECT 1 / 0")
        tx.kv_put("t", "after", {"n": 2}, now_ms)

    def put(tx: Tx, now_ms: int) -> None:
        tx.kv_put("t", "next", {"n": 3}, now_ms)

    with pytest.raises(psycopg.errors.DivisionByZero):
        await actor.submit(fails_later)
    await actor.submit(put)
    keys = [r["key"] for r in raw.query(url, "SELECT key FROM kv WHERE namespace = 't' ORDER BY key")]
    assert keys == ["next"]


async def test_a_prepared_statement_the_server_lost_fails_no_request_and_is_prepared_again(url: str) -> None:
    """psycopg prepares a statement after a few uses and keeps its name; when the server no longer has
    it (dropped here behind psycopg's back), the statement fails. Its batch runs again, after the
    ROLLBACK on which psycopg forgets what it prepared: the publish is accepted once, and the ones after
    it too. The batches run guarded (a request failed just before), where a request's own error is
    final. Catches: the driver's error handed to the publisher as the request's own (it is no
    `LoomError`: a node whose publish raised it stopped in a kill drill)."""
    async with open_runtime(url, clock=ManualClock(start_ms=T0_MS), load_entry_points=False) as rt:
        storage = storage_of(rt)

        def offer(i: int) -> EventIn:
            return EventIn(source="s", delivery_id=f"d-{i}", type="thing.done", scope="elsewhere")

        def fails(tx: Tx, now_ms: int) -> None:
            raise ValueError("a request's own error: the batches that follow run guarded")

        with pytest.raises(ValueError, match="own error"):
            await storage.submit(fails)
        for i in range(8):  # past psycopg's prepare threshold (5 uses); still guarded (32 batches)
            await rt.publish(offer(i))
        before = storage.stats.conflict_reruns

        def drop_behind_psycopgs_back(tx: Tx, now_ms: int) -> None:
            tx._conn.raw.pgconn.exec_(b"DEALLOCATE ALL")

        await storage.submit(drop_behind_psycopgs_back)
        accepted = [await rt.publish(offer(i)) for i in range(8, 11)]
        assert not any(event.duplicate for event in accepted)
        assert storage.stats.conflict_reruns > before, "the lost prepared statement was never met: no test"
    rows = raw.query(url, "SELECT count(*) AS n FROM events WHERE source = 's'")
    assert rows[0]["n"] == 11


async def test_a_read_whose_prepared_statements_the_server_lost_is_answered(url: str) -> None:
    """The same on the reads' own connection: a read naming a prepared statement the server lost runs
    again (psycopg forgot the name as it failed), and every later read is answered: a single statement,
    and a Work's five in one snapshot. Catches: the driver's error handed to the reader's caller (it is
    no `LoomError`)."""
    async with open_runtime(url, clock=ManualClock(start_ms=T0_MS), load_entry_points=False) as rt:
        await rt.publish(EventIn(source="s", delivery_id="d", type="thing.done", scope="elsewhere"))

        async def reads() -> None:
            assert len(await rt.events_newest(limit=5)) == 1
            with pytest.raises(NotFound):
                await rt.work("w-none")

        for _ in range(8):  # past psycopg's prepare threshold (5 uses)
            await reads()
        reader = rt._p.reader  # type: ignore[attr-defined]
        reader._raw.pgconn.exec_(b"DEALLOCATE ALL")  # behind psycopg's back
        for _ in range(3):
            await reads()
