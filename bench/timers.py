"""Durable timers: firing throughput, bounded ``due`` latency, memory per armed timer and the start of a
runtime with many pending timers, as ratios to raw sqlite3 (or raw psycopg) measured in the same run.

Run from the repository root::

    python bench/timers.py [--small] [--fire N] [--poll N] [--armed N] [--dir DIR] [--synchronous FULL|NORMAL]
                           [--backend sqlite|postgres] [--url URL]

Every figure uses fresh database files in one temporary directory created under ``--dir`` (default: the
system temp dir), so all of them share one disk. With ``--backend postgres`` every figure uses a fresh
database on the server instead (bench/backend.py), and the raw baselines (the same writes and reads)
go through psycopg. Business time is a `ManualClock`, so "due" is exact and no figure waits on the wall
clock. See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

import attrs
import backend
import pg
import trio
import trio.testing

import loom
from loom.kernel.timers import arm_in_tx
from loom.records.notices import EventAccepted
from loom.records.timers import Timer, TimerSpec, TimerState
from loom.store import Store, Tx
from loom.testing import raw
from loom.testing.internals import storage_of, timer_actor_of

SCOPE = "bench"
SOURCE = "bench-timer"
HOUR_MS = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
RAW_BATCH = 500
ARM_CHUNK = 1_000  # timers armed per storage procedure (one request, one savepoint)
INSERT_CHUNK = 10_000  # timer rows written per storage procedure when filling a big table
DUE_CALLS = 1_000  # a p99 of 200 calls would be their second slowest: one hiccup of a shared machine
POLL_LIMIT = 100
DUE_NOW = 1_000  # with --armed N, this many are due and the rest lie in the future
# On PostgreSQL a runtime looks at the store again every ``resync_ms`` of business time (a safety net
# under the other nodes' notifications), and its timer actor would find the rows written without
# notices. No other node shares these databases: where a figure needs the timer actor not to know of
# them, the check is put beyond every move of the clock (SQLite has none).
NO_RESYNC_MS = 24 * HOUR_MS


def spec(i: int, fire_at_ms: int) -> TimerSpec:
    return TimerSpec(id=f"t-{i:08d}", fire_at_ms=fire_at_ms, source=SOURCE, type="bench.tick", scope=SCOPE)


def timer_row(i: int, fire_at_ms: int, now_ms: int) -> Timer:
    """An armed timer exactly as `arm_in_tx` would store it (without its notice)."""
    return Timer(
        id=f"t-{i:08d}",
        revision=1,
        state=TimerState.ARMED,
        fire_at_ms=fire_at_ms,
        source=SOURCE,
        type="bench.tick",
        scope=SCOPE,
        key=None,
        work_id=None,
        payload={},
        delivery_id=f"t-{i:08d}",
        interval_ms=None,
        recurrence=None,
        spec=None,
        parent_id=None,
        execution_id=None,
        occurrences=0,
        reason=None,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )


def arm_many_in_tx(tx: Tx, now_ms: int, first: int, count: int, fire_at_ms: int) -> None:
    """Arm ``count`` timers through the kernel (each with its ``TimerArmed`` notice)."""
    for i in range(first, first + count):
        arm_in_tx(tx, now_ms, spec(i, fire_at_ms))


def put_many_in_tx(tx: Tx, now_ms: int, first: int, count: int, fire_at: Callable[[int], int]) -> None:
    """Write armed timer rows without notices: the running timer actor does not hear of them."""
    for i in range(first, first + count):
        tx.put_timer(timer_row(i, fire_at(i), now_ms), None)


def _noop(tx: Tx, now_ms: int) -> None:
    return None


# -- raw baselines (sqlite3 or psycopg) ------------------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE timers (id TEXT PRIMARY KEY, revision INTEGER NOT NULL, state TEXT NOT NULL,
    fire_at_ms INTEGER NOT NULL, payload TEXT NOT NULL, delivery_id TEXT NOT NULL);
CREATE INDEX timers_due ON timers (fire_at_ms, id) WHERE state = 'armed';
CREATE TABLE events (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, source TEXT NOT NULL,
    delivery_id TEXT NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL, accepted_at_ms INTEGER NOT NULL,
    UNIQUE (source, delivery_id));
CREATE TABLE timer_firings (timer_id TEXT NOT NULL, revision INTEGER NOT NULL, fire_at_ms INTEGER NOT NULL,
    result TEXT NOT NULL, event_id TEXT, at_ms INTEGER NOT NULL, PRIMARY KEY (timer_id, revision, fire_at_ms));
"""


def raw_schema(postgres: bool) -> str:
    """The raw tables in the backend's types (PostgreSQL: 64-bit integers, a sequence for ``seq``)."""
    if not postgres:
        return RAW_SCHEMA
    return RAW_SCHEMA.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY").replace(
        "INTEGER", "BIGINT"
    )


def open_raw(location: str, synchronous: str, timers: int) -> backend.RawConnection:
    conn = backend.RawConnection(location)
    if not conn.postgres:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.script(raw_schema(conn.postgres))
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO timers VALUES (?, 1, 'armed', ?, '{}', ?)",
        ((f"t-{i:08d}", T0, f"t-{i:08d}") for i in range(timers)),
    )
    conn.execute("COMMIT")
    return conn


def raw_fire(conn: backend.RawConnection, i: int) -> None:
    """What one firing writes at the least: its Event, its ledger entry, the timer's new state."""
    timer_id = f"t-{i:08d}"
    conn.execute(
        "INSERT INTO events (id, source, delivery_id, type, payload, accepted_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
        (f"ev-{i}", SOURCE, timer_id, "bench.tick", f'{{"timer":"{timer_id}"}}', T0),
    )
    conn.execute(
        "INSERT INTO timer_firings VALUES (?, 1, ?, 'accepted', ?, ?)", (timer_id, T0, f"ev-{i}", T0)
    )
    conn.execute("UPDATE timers SET state = 'fired' WHERE id = ?", (timer_id,))


def raw_fires(location: str, n: int, per_commit: int, synchronous: str) -> float:
    conn = open_raw(location, synchronous, n)
    try:
        start = time.perf_counter()
        for first in range(0, n, per_commit):
            conn.execute("BEGIN")
            for i in range(first, min(first + per_commit, n)):
                raw_fire(conn, i)
            conn.execute("COMMIT")
        elapsed = time.perf_counter() - start
        assert conn.execute("SELECT count(*) FROM timer_firings") == [(n,)]
    finally:
        conn.close()
    return n / elapsed


# -- loom figures ----------------------------------------------------------------------------------


@attrs.frozen
class FireFigure:
    rate: float
    detail: str


async def fire_through_actor(store: Store, n: int) -> FireFigure:
    """Arm ``n`` timers for T0 + 1 h through the kernel, then move the clock there: the timer actor
    fires all of them; timed until the last firing has committed."""
    clock = loom.ManualClock(start_ms=T0)
    async with loom.open_runtime(store, clock=clock, load_entry_points=False) as rt:
        start = time.perf_counter()
        for first in range(0, n, ARM_CHUNK):
            await storage_of(rt).submit(arm_many_in_tx, first, min(ARM_CHUNK, n - first), T0 + HOUR_MS)
        arm_s = time.perf_counter() - start
        await storage_of(rt).submit(_noop)  # every arm notice has been handed out ...
        await trio.testing.wait_all_tasks_blocked()  # ... and taken in by the timer actor
        assert timer_actor_of(rt).next_due_ms == T0 + HOUR_MS
        feed = storage_of(rt).feed(capacity=1_000_000)
        before = attrs.evolve(storage_of(rt).stats)
        fired = 0
        start = time.perf_counter()
        clock.set(T0 + HOUR_MS)
        while fired < n:
            batch = await feed.next_batch()
            assert batch, "the feed lagged; enlarge its capacity"
            fired += sum(1 for x in batch if isinstance(x, EventAccepted) and x.event.source == SOURCE)
        elapsed = time.perf_counter() - start
        storage_of(rt).unsubscribe(feed)
        stats = storage_of(rt).stats
        batches = stats.batches - before.batches
        requests = stats.requests - before.requests
    check_fired(store, n)
    detail = (
        f"{n:,} timers; arming them through arm_in_tx in {ARM_CHUNK}-timer procedures took {arm_s:.1f} s; "
        f"{batches:,} commits while firing, mean {requests / max(batches, 1):.1f} requests per commit"
    )
    return FireFigure(n / elapsed, detail)


async def fire_through_poll(store: Store, n: int) -> FireFigure:
    """Write ``n`` due timers without notices (the timer actor never hears of them) and fire them with
    ``rt.poll(limit=100)`` passes until one fires nothing."""
    clock = loom.ManualClock(start_ms=T0)
    async with loom.open_runtime(store, clock=clock, load_entry_points=False, resync_ms=NO_RESYNC_MS) as rt:
        for first in range(0, n, INSERT_CHUNK):
            await storage_of(rt).submit(put_many_in_tx, first, min(INSERT_CHUNK, n - first), lambda i: T0)
        assert timer_actor_of(rt).next_due_ms is None, "the timer actor heard of none of them"
        before = attrs.evolve(storage_of(rt).stats)
        passes = fired = 0
        start = time.perf_counter()
        while report := (await rt.poll(limit=POLL_LIMIT)).firings:
            passes += 1
            fired += len(report)
        elapsed = time.perf_counter() - start
        assert fired == n, (fired, n)
        batches = storage_of(rt).stats.batches - before.batches
    check_fired(store, n)
    return FireFigure(n / elapsed, f"{n:,} timers, {passes:,} passes, {batches:,} commits")


def check_fired(store: Store, n: int) -> None:
    """Each timer fired once: as many accepted firings in the ledger, and Events, as timers."""
    fired = raw.query(store, "SELECT count(*) AS n FROM timer_firings WHERE result = 'accepted'")[0]["n"]
    events = raw.query(store, "SELECT count(*) AS n FROM events WHERE source = ?", (SOURCE,))[0]["n"]
    assert (fired, events) == (n, n), f"each timer fired once: {(fired, events)} for {n}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def raw_due_latencies(location: str, now_ms: int) -> list[float]:
    """The due query alone, on its own connection to the same database (the cursor advancing as loom's
    does; SQLite is told to walk the due index, as loom tells it)."""
    conn = backend.RawConnection(location)
    indexed = "" if conn.postgres else " INDEXED BY timers_due"
    try:
        cursor: tuple[int, str] = (-1, "")
        out = []
        for _ in range(DUE_CALLS):
            start = time.perf_counter()
            rows = conn.execute(
                f"SELECT id, revision, fire_at_ms FROM timers{indexed} WHERE state = 'armed'"
                " AND fire_at_ms <= ? AND (fire_at_ms, id) > (?, ?) ORDER BY fire_at_ms, id LIMIT ?",
                (now_ms, *cursor, POLL_LIMIT),
            )
            out.append(time.perf_counter() - start)
            cursor = (rows[-1][2], rows[-1][0]) if len(rows) == POLL_LIMIT else (-1, "")
    finally:
        conn.close()
    return out


@attrs.frozen
class BigFigures:
    fill_s: float
    due_some: list[float]
    raw_due_some: list[float]
    due_all: list[float]
    raw_due_all: list[float]
    raw_scan_s: float
    startup_s: float
    actor_bytes: float
    """Memory a whole opened runtime holds, divided by the number of armed timers."""


async def big_table(store: Store, n: int) -> BigFigures:
    """``n`` armed timers: ``due(100)`` latency with a few and with all due, then the rebuild."""
    due_now = min(DUE_NOW, n // 10)

    def fire_at(i: int) -> int:
        return T0 - 1 if i % (n // due_now) == 0 else T0 + HOUR_MS + i

    clock = loom.ManualClock(start_ms=T0)
    location = raw.location(store)
    async with loom.open_runtime(store, clock=clock, load_entry_points=False, resync_ms=NO_RESYNC_MS) as rt:
        start = time.perf_counter()
        for first in range(0, n, INSERT_CHUNK):
            await storage_of(rt).submit(put_many_in_tx, first, min(INSERT_CHUNK, n - first), fire_at)
        fill_s = time.perf_counter() - start
        # the written rows raised no notice: the timer actor holds none of them and fires nothing
        due_some = await due_latencies(rt, due_now)
        raw_due_some = raw_due_latencies(location, T0)
        clock.set(T0 + 2 * HOUR_MS)
        due_all = await due_latencies(rt, POLL_LIMIT)
        raw_due_all = raw_due_latencies(location, T0 + 2 * HOUR_MS)
        assert timer_actor_of(rt).next_due_ms is None

    conn = backend.RawConnection(location)
    try:
        start = time.perf_counter()
        rows = conn.execute("SELECT id, revision, fire_at_ms FROM timers WHERE state = 'armed' ORDER BY id")
        raw_scan_s = time.perf_counter() - start
        assert len(rows) == n
        del rows
    finally:
        conn.close()

    # A restart: open_runtime starts the timer actor, which reads the one earliest deadline. The clock
    # is before every deadline, so nothing fires while we look; the memory the opening keeps (the
    # runtime's own, whatever the number of timers) is measured under tracemalloc in a second opening.
    early = loom.ManualClock(start_ms=T0 - HOUR_MS)
    gc.collect()
    start = time.perf_counter()
    async with loom.open_runtime(store, clock=early, load_entry_points=False) as rt:
        startup_s = time.perf_counter() - start
        assert timer_actor_of(rt).next_due_ms == T0 - 1
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    async with loom.open_runtime(store, clock=early, load_entry_points=False) as rt:
        await rt.wait_idle()
        actor_bytes = (tracemalloc.get_traced_memory()[0] - base) / n
    tracemalloc.stop()
    return BigFigures(
        fill_s, due_some, raw_due_some, due_all, raw_due_all, raw_scan_s, startup_s, actor_bytes
    )


async def due_latencies(rt: loom.Runtime, expect: int) -> list[float]:
    out = []
    for _ in range(DUE_CALLS):
        start = time.perf_counter()
        requests = await rt.due(POLL_LIMIT)
        out.append(time.perf_counter() - start)
        assert 0 < len(requests) <= min(expect, POLL_LIMIT)
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run: 5k fired, 2k polled, 50k armed")
    parser.add_argument(
        "--fire", type=int, default=None, help="timers fired by the timer actor (default 100000)"
    )
    parser.add_argument(
        "--poll", type=int, default=None, help="timers fired by rt.poll passes (default 20000)"
    )
    parser.add_argument(
        "--armed", type=int, default=None, help="armed timers for due/rebuild (default 1000000)"
    )
    parser.add_argument("--serial", type=int, default=2_000, help="raw one-per-commit firings (default 2000)")
    parser.add_argument(
        "--dir", default=None, help="put the temporary database directory here (the disk under test)"
    )
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    backend.add_options(parser)
    args = parser.parse_args(argv)
    backend.check_options(parser, args)
    fire_n = args.fire or (5_000 if args.small else 100_000)
    poll_n = args.poll or (2_000 if args.small else 20_000)
    armed_n = args.armed or (50_000 if args.small else 1_000_000)
    if min(fire_n, poll_n, args.serial) < 1 or armed_n < 10 * POLL_LIMIT:
        parser.error(f"sizes must be positive and --armed at least {10 * POLL_LIMIT}")
    with backend.chosen(args, "loom-bench-timers-") as run:
        report(run, args, fire_n, poll_n, armed_n)
    return 0


def report(run: backend.Backend, args: argparse.Namespace, fire_n: int, poll_n: int, armed_n: int) -> None:
    """Measure and print every figure on ``run``'s backend."""
    sync = args.synchronous
    rate = ",.0f"
    if run.postgres:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, {run.server()}, a fresh database per "
            "figure; baseline: the same writes and reads through raw psycopg, measured in this run",
            flush=True,
        )
    else:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
            f"synchronous={sync}, databases in {run.tmp}",
            flush=True,
        )
    driver = "raw psycopg" if run.postgres else "raw sqlite3"
    raw_one = raw_fires(run.location("raw-one.db"), args.serial, 1, sync)
    print(
        f"{driver} firing writes (event + ledger + timer update), one firing per commit: "
        f"{raw_one:{rate}} firings/s ({args.serial:,})",
        flush=True,
    )
    raw_batch = raw_fires(run.location("raw-batch.db"), fire_n, RAW_BATCH, sync)
    print(
        f"{driver} firing writes, {RAW_BATCH} firings per commit: {raw_batch:{rate}} firings/s ({fire_n:,})",
        flush=True,
    )

    actor = trio.run(fire_through_actor, run.store("actor.db"), fire_n)
    print(
        f"loom timers fired through the timer actor, all due at once: {actor.rate:{rate}} timers/s "
        f"({actor.detail})",
        flush=True,
    )
    print(
        f"ratio actor/raw-one-per-commit: {actor.rate / raw_one:.2f}; "
        f"ratio actor/raw-batched: {actor.rate / raw_batch:.3f}",
        flush=True,
    )
    poll = trio.run(fire_through_poll, run.store("poll.db"), poll_n)
    print(
        f"loom timers fired through rt.poll(limit={POLL_LIMIT}) passes (timer actor idle): "
        f"{poll.rate:{rate}} timers/s ({poll.detail}); ratio poll/raw-one-per-commit: "
        f"{poll.rate / raw_one:.2f}",
        flush=True,
    )

    raw_fill = None
    if run.postgres:  # the fill's baseline: the same number of rows through psycopg, as many per commit
        raw_fill = pg.raw_batched(run.location("raw-fill"), armed_n, INSERT_CHUNK)
        print(
            f"raw psycopg batched inserts, {INSERT_CHUNK:,} rows per commit: {raw_fill:{rate}} rows/s "
            f"({armed_n:,} rows)",
            flush=True,
        )
    big = trio.run(big_table, run.store("big.db"), armed_n)
    due_now = min(DUE_NOW, armed_n // 10)
    fill_rate = armed_n / big.fill_s
    print(
        f"filling {armed_n:,} armed timer rows through the storage actor ({INSERT_CHUNK:,} per procedure): "
        f"{big.fill_s:.1f} s ({fill_rate:{rate}} rows/s)"
        + (f"; ratio fill/raw-batched-inserts: {fill_rate / raw_fill:.2f}" if raw_fill else ""),
        flush=True,
    )
    for label, loom_s, raw_s in (
        (f"{due_now:,} of {armed_n:,} armed due", big.due_some, big.raw_due_some),
        (f"all {armed_n:,} armed due", big.due_all, big.raw_due_all),
    ):
        print(
            f"loom rt.due({POLL_LIMIT}), {label}: median {ms(statistics.median(loom_s))}, "
            f"p99 {ms(percentile(loom_s, 0.99))} ({DUE_CALLS:,} calls; each commits its cursor, relaxed); "
            f"raw due query alone: median {ms(statistics.median(raw_s))}, p99 {ms(percentile(raw_s, 0.99))}; "
            f"ratio of medians {statistics.median(loom_s) / statistics.median(raw_s):.1f}",
            flush=True,
        )
    print(
        f"memory a runtime holds with {armed_n:,} armed timers, whole runtime, per timer: "
        f"{big.actor_bytes:.1f} bytes (the timer actor keeps one deadline; the store keeps the timers)",
        flush=True,
    )
    print(
        f"{driver} scan of {armed_n:,} armed timers (id, revision, fire_at): {big.raw_scan_s:.2f} s",
        flush=True,
    )
    print(
        f"open_runtime startup with {armed_n:,} pending timers (store open, migrations check, actors "
        f"started, the earliest deadline read): {big.startup_s:.2f} s "
        f"(ratio to the raw scan {big.startup_s / big.raw_scan_s:.2f})",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
