"""Durable acceptance throughput, as ratios to raw sqlite3 measured in the same run.

Run from the repository root::

    python bench/accept.py [--events N] [--serial-events M] [--rounds R] [--dir DIR]
                           [--synchronous FULL|NORMAL] [--backend sqlite|postgres] [--url URL]

Every figure is measured on fresh database files in one temporary directory created under
``--dir`` (default: the system temp dir), so all of them share one disk. With ``--backend postgres`` every figure is taken on PostgreSQL
instead (fresh databases on the server at ``--url``, or on a throwaway cluster with ``fsync`` on), the
raw baselines through psycopg. See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import attrs
import pg
import trio

import loom
from loom.store import SQLiteStore, Store, as_store
from loom.testing import raw
from loom.testing.internals import storage_of

PRODUCERS = 100
RAW_BATCH = 500
MANY_PRODUCERS = 10
"""Producers of the ``publish_many`` figure, each offering `MANY_BATCH` Events per call."""
MANY_BATCH = 100

# The same row shape and uniqueness rules as loom's events table.
RAW_SCHEMA = """
CREATE TABLE events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE,
    source         TEXT NOT NULL,
    delivery_id    TEXT NOT NULL,
    type           TEXT NOT NULL,
    scope          TEXT NOT NULL,
    payload        TEXT NOT NULL,
    root_id        TEXT NOT NULL,
    depth          INTEGER NOT NULL,
    accepted_at_ms INTEGER NOT NULL,
    UNIQUE (source, delivery_id)
)
"""
RAW_INSERT = (
    "INSERT INTO events (id, source, delivery_id, type, scope, payload, root_id, depth, accepted_at_ms)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)"
)


def raw_row(i: int) -> tuple[object, ...]:
    event_id = f"ev_{i:012d}"
    return (
        event_id,
        "bench",
        f"d-{i}",
        "bench.event",
        "bench",
        f'{{"n":{i}}}',
        event_id,
        time.time_ns() // 10**6,
    )


def open_raw(path: Path, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute(RAW_SCHEMA)
    return conn


def raw_commit_per_row(path: Path, rows: int, synchronous: str) -> float:
    conn = open_raw(path, synchronous)
    try:
        start = time.perf_counter()
        for i in range(rows):
            conn.execute("BEGIN")
            conn.execute(RAW_INSERT, raw_row(i))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == rows
    finally:
        conn.close()
    return rows / elapsed


def raw_batched(path: Path, rows: int, synchronous: str) -> float:
    conn = open_raw(path, synchronous)
    try:
        start = time.perf_counter()
        for first in range(0, rows, RAW_BATCH):
            conn.execute("BEGIN")
            for i in range(first, min(first + RAW_BATCH, rows)):
                conn.execute(RAW_INSERT, raw_row(i))
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == rows
    finally:
        conn.close()
    return rows / elapsed


def offer(i: int) -> loom.EventIn:
    return loom.EventIn(
        source="bench", delivery_id=f"d-{i}", type="bench.event", scope="bench", payload={"n": i}
    )


async def loom_acceptance(store: Store, events: int, producers: int, batch: int = 1) -> tuple[float, str]:
    """Publish ``events`` distinct Events from ``producers`` concurrent tasks, one by one (``rt.publish``)
    or ``batch`` per call (``rt.publish_many``); return events/s."""
    async with loom.open_runtime(store, clock=loom.SystemClock(), load_entry_points=False) as rt:

        async def produce(first: int) -> None:
            mine = range(first, events, producers)
            if batch == 1:
                for i in mine:
                    accepted = await rt.publish(offer(i))
                    assert not accepted.duplicate
                return
            for at in range(0, len(mine), batch):
                answers = await rt.publish_many([offer(i) for i in mine[at : at + batch]])
                assert all(isinstance(a, loom.Event) and not a.duplicate for a in answers), answers

        start, cpu = time.perf_counter(), time.process_time()
        async with trio.open_nursery() as nursery:
            for p in range(producers):
                nursery.start_soon(produce, p)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu  # every thread of the process: the trio side and the storage worker
        stats = attrs.evolve(storage_of(rt).stats)  # the figures of the publishing phase alone
    (row,) = raw.query(store, "SELECT count(*) AS n FROM events")
    assert row["n"] == events, f"every Event was stored once, got {row['n']} of {events}"
    detail = (
        f"{stats.batches} batches, mean {stats.requests / stats.batches:.1f} per batch, largest {stats.largest_batch}"
        f"; {cpu / events * 1e6:.0f} us of CPU per event"
    )
    return events / elapsed, detail


@attrs.frozen
class Round:
    """One measurement of every figure, taken back to back on fresh files."""

    raw_row: float
    raw_batch: float
    loom_1: float
    loom_100: float
    loom_many: float
    detail_1: str
    detail_100: str
    detail_many: str


def one_round(tmp: Path, n: int, args: argparse.Namespace) -> Round:
    sync = args.synchronous
    if args.cluster is not None:  # PostgreSQL: fresh databases on one server
        new = args.cluster.create_database
        raw_row = pg.raw_commit_per_row(new(), args.serial_events)
        raw_batch = pg.raw_batched(new(), args.events, RAW_BATCH)
        loom_1, detail_1 = trio.run(loom_acceptance, as_store(new()), args.serial_events, 1)
        loom_100, detail_100 = trio.run(loom_acceptance, as_store(new()), args.events, PRODUCERS)
        many = trio.run(loom_acceptance, as_store(new()), args.events, MANY_PRODUCERS, MANY_BATCH)
        return Round(raw_row, raw_batch, loom_1, loom_100, many[0], detail_1, detail_100, many[1])
    raw_row = raw_commit_per_row(tmp / f"raw-row-{n}.db", args.serial_events, sync)
    raw_batch = raw_batched(tmp / f"raw-batch-{n}.db", args.events, sync)
    store_1 = SQLiteStore(path=str(tmp / f"loom-1-{n}.db"), synchronous=sync)
    loom_1, detail_1 = trio.run(loom_acceptance, store_1, args.serial_events, 1)
    store_100 = SQLiteStore(path=str(tmp / f"loom-100-{n}.db"), synchronous=sync)
    loom_100, detail_100 = trio.run(loom_acceptance, store_100, args.events, PRODUCERS)
    store_many = SQLiteStore(path=str(tmp / f"loom-many-{n}.db"), synchronous=sync)
    many = trio.run(loom_acceptance, store_many, args.events, MANY_PRODUCERS, MANY_BATCH)
    for name in os.listdir(tmp):
        (tmp / name).unlink()
    return Round(raw_row, raw_batch, loom_1, loom_100, many[0], detail_1, detail_100, many[1])


def spread(values: list[float], fmt: str) -> str:
    """The median, and the range when there are several rounds."""
    middle = format(statistics.median(values), fmt)
    if len(values) == 1:
        return middle
    return f"{middle} (rounds: {format(min(values), fmt)} to {format(max(values), fmt)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--events",
        type=int,
        default=10_000,
        help="events for the batched and 100-producer figures (default 10000)",
    )
    parser.add_argument(
        "--serial-events",
        type=int,
        default=500,
        help="events for the commit-per-row and 1-producer figures (default 500)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="measure every figure this many times, interleaved; report medians (default 3)",
    )
    parser.add_argument(
        "--dir", default=None, help="put the temporary database directory here (the disk under test)"
    )
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    parser.add_argument("--backend", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument(
        "--url", default=None, help="with --backend postgres: the server (default: a throwaway one)"
    )
    args = parser.parse_args(argv)
    if args.events < PRODUCERS or args.serial_events < 1 or args.rounds < 1:
        parser.error(f"--events must be at least {PRODUCERS}, --serial-events and --rounds at least 1")

    if args.backend == "postgres":
        with pg.server(args.url) as cluster:
            args.cluster = cluster
            return report(args, Path(), "raw psycopg", "PostgreSQL (fsync on, synchronous_commit on)")
    args.cluster = None
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-", dir=args.dir))
    try:
        return report(args, tmp, "raw sqlite3", f"WAL, synchronous={args.synchronous}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def report(args: argparse.Namespace, tmp: Path, baseline: str, how: str) -> int:
    print(
        f"# {sys.platform}, python {sys.version.split()[0]}, "
        f"{f'sqlite {sqlite3.sqlite_version}, ' if args.cluster is None else ''}"
        f"{how}, {args.rounds} rounds, databases in {tmp if args.cluster is None else 'PostgreSQL'}",
        flush=True,
    )
    rounds = [one_round(tmp, n, args) for n in range(args.rounds)]
    rate = ",.0f"
    print(
        f"{baseline} commit-per-row inserts ({how}): "
        f"{spread([r.raw_row for r in rounds], rate)} rows/s ({args.serial_events:,} rows)"
    )
    print(
        f"{baseline} batched inserts, {RAW_BATCH} rows per commit ({how}): "
        f"{spread([r.raw_batch for r in rounds], rate)} rows/s ({args.events:,} rows)"
    )
    print(
        f"loom durable acceptance, 1 producer: {spread([r.loom_1 for r in rounds], rate)} events/s "
        f"({args.serial_events:,} events; last round: {rounds[-1].detail_1})"
    )
    print(
        f"loom durable acceptance, {PRODUCERS} producers: {spread([r.loom_100 for r in rounds], rate)} "
        f"events/s ({args.events:,} events; last round: {rounds[-1].detail_100})"
    )
    print(
        f"loom durable acceptance, publish_many of {MANY_BATCH} Events from {MANY_PRODUCERS} producers: "
        f"{spread([r.loom_many for r in rounds], rate)} events/s ({args.events:,} events; last round: "
        f"{rounds[-1].detail_many})"
    )
    # Ratios are taken within each round (figures measured back to back), then the median.
    print(f"ratio loom-1/raw-commit-per-row: {spread([r.loom_1 / r.raw_row for r in rounds], '.2f')}")
    print(
        f"ratio loom-{PRODUCERS}/raw-commit-per-row: "
        f"{spread([r.loom_100 / r.raw_row for r in rounds], '.2f')}"
    )
    print(f"ratio loom-{PRODUCERS}/raw-batched: {spread([r.loom_100 / r.raw_batch for r in rounds], '.2f')}")
    print(f"ratio loom-many/raw-batched: {spread([r.loom_many / r.raw_batch for r in rounds], '.2f')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
