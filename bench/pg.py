"""What the benchmarks share on PostgreSQL: a server to measure on, and the raw psycopg baseline.

`server(url)` is the server at ``url``, or (``url`` empty) a throwaway cluster started with
``initdb`` in a temporary directory with ``fsync`` on (a commit is as durable as on a real server),
stopped at the end. `raw_commit_per_row` inserts rows shaped like loom's events, one transaction
per row, through psycopg, and `raw_batched` the same rows ``batch`` per transaction: the baselines
every PostgreSQL figure is a ratio to. `describe` names the server for a run's header line.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from loom.testing.postgres import DURABLE_SETTINGS, PostgresCluster

RAW_SCHEMA = """
CREATE TABLE raw_events (
    seq            BIGSERIAL PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE,
    source         TEXT NOT NULL,
    delivery_id    TEXT NOT NULL,
    type           TEXT NOT NULL,
    scope          TEXT NOT NULL,
    payload        TEXT NOT NULL,
    root_id        TEXT NOT NULL,
    depth          BIGINT NOT NULL,
    accepted_at_ms BIGINT NOT NULL,
    UNIQUE (source, delivery_id)
)
"""
RAW_INSERT = (
    "INSERT INTO raw_events (id, source, delivery_id, type, scope, payload, root_id, depth, accepted_at_ms)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, 0, %s)"
)


@contextmanager
def server(url: str | None) -> Iterator[PostgresCluster]:
    cluster = PostgresCluster.external(url) if url else PostgresCluster.start(settings=DURABLE_SETTINGS)
    try:
        yield cluster
    finally:
        cluster.stop()


def describe(cluster: PostgresCluster) -> str:
    """The server as a header line names it: its version and the settings a commit's durability rests
    on (read from the server: an external one may run with ``fsync`` off)."""
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('server_version'), current_setting('fsync'),"
            " current_setting('synchronous_commit')"
        ).fetchone()
    assert row is not None
    version, fsync, synchronous_commit = row
    return (
        f"PostgreSQL {str(version).split()[0]} (fsync {fsync}, synchronous_commit {synchronous_commit}), "
        f"psycopg {psycopg.__version__}"
    )


def raw_commit_per_row(url: str, rows: int) -> float:
    """Rows per second, one INSERT and one COMMIT per row, on a fresh table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        start = time.perf_counter()
        for i in range(rows):
            event_id = f"ev_{i:012d}"
            with conn.transaction():
                conn.execute(
                    RAW_INSERT,
                    (event_id, "bench", f"d-{i}", "bench.event", "bench", f'{{"n":{i}}}', event_id, i),
                )
        elapsed = time.perf_counter() - start
        row = conn.execute("SELECT count(*) FROM raw_events").fetchone()
        assert row is not None
        assert row[0] == rows
    return rows / elapsed


def raw_batched(url: str, rows: int, batch: int) -> float:
    """Rows per second, ``batch`` INSERTs per COMMIT, on a fresh table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA)
        start = time.perf_counter()
        for first in range(0, rows, batch):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(
                    RAW_INSERT,
                    [
                        (
                            f"ev_{i:012d}",
                            "bench",
                            f"d-{i}",
                            "bench.event",
                            "bench",
                            f'{{"n":{i}}}',
                            f"ev_{i:012d}",
                            i,
                        )
                        for i in range(first, min(first + batch, rows))
                    ],
                )
        elapsed = time.perf_counter() - start
        row = conn.execute("SELECT count(*) FROM raw_events").fetchone()
        assert row is not None
        assert row[0] == rows
    return rows / elapsed
