"""Retention and compaction: what each row costs, a database that stays small while Events and Works
run through it for days, and acceptance while compaction runs, in one run on SQLite files.

Run from the repository root::

    python bench/retention.py                                   # defaults: about 3 minutes on 2 cores
    python bench/retention.py --events 1000000 --works 100000 --days 4   # the full figure (about 25 minutes)
    python bench/retention.py [--days D] [--producers P] [--accept N] [--dir DIR]

1. **Sizing.** Bytes per routed Event (a 100-byte payload), per finished Work (its one Event and
   attempt), per armed timer, per tombstone, per ended attempt: the growth of the tables and indexes that
   hold each (SQLite's ``dbstat``), divided by the rows added. docs/operations.md quotes them.
2. **Steady state.** With retention of one hour (``works``, ``events``, ``timers`` and ``dedup``) on the
   test clock, ``--events`` Events (one per Work, the rest unmatched noise) and ``--works`` Works run
   through over ``--days`` simulated days: each simulated 10 minutes their Events are published and
   routed, the Works run an attempt each and complete, and a compaction sweep runs (as the compaction
   actor's would). After the first simulated two hours, the rows and bytes of the database at their
   highest must stay under the bound this script writes down (`bound`): the rows that arrive in the
   retention plus two sweep intervals, three times over, and as many bytes as those rows cost at the
   measured sizes plus 4 MiB (the schema, the write-ahead log's share, free pages not given back yet).
   The size without compaction, everything kept, is given beside it.
3. **Acceptance while compaction runs.** ``--producers`` tasks publish ``--accept`` Events into a
   store holding a backlog of expired history (``--works`` finished Works and their Events), alone, and
   while a compaction sweep removes that backlog; the ratio must be at least 0.8.

Exit status 1 if a bound or the ratio is not met. See bench/README.md.
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
from collections.abc import Iterable
from pathlib import Path

import trio

import loom
from loom import Completed, Config, EventIn, ManualClock, Runtime, open_runtime
from loom.records.timers import TimerSpec

HOUR_MS = 3_600_000
STEP_MS = 10 * 60_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WARMUP_MS = 2 * HOUR_MS
PAYLOAD = {"note": "x" * 90}
FIXED_BYTES = 4 << 20
MIN_RATIO = 0.8
CONFIG = Config.from_dict(
    {
        "retention": {"works": "1h", "events": "1h", "timers": "1h", "dedup": "1h", "diagnostics": "1h"},
        "scopes": {"shop": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]}},
    }
)


def noise(n: int) -> EventIn:
    return EventIn(source="bench", delivery_id=f"n-{n}", type="noise.tick", scope="shop", payload=PAYLOAD)


def order(n: int) -> EventIn:
    return EventIn(source="bench", delivery_id=f"w-{n}", type="order.placed", scope="shop", key=f"o/{n}",
                   payload=PAYLOAD)  # fmt: skip


async def publish_all(rt: Runtime, events: Iterable[EventIn], producers: int) -> None:
    queue = list(events)

    async def producer() -> None:
        while queue:
            await rt.publish(queue.pop())

    async with trio.open_nursery() as nursery:
        for _ in range(producers):
            nursery.start_soon(producer)


async def run_works(rt: Runtime) -> int:
    """Route what was published, then run one attempt of each ready Work to its completion."""
    while (await rt.poll(limit=1000)).routed:
        pass
    done = 0
    while leases := await rt.admit(limit=500, owner="bench"):
        async with trio.open_nursery() as nursery:
            for lease in leases:
                nursery.start_soon(rt.complete, lease, Completed())
        done += len(leases)
    return done


def table_bytes(path: str) -> dict[str, int]:
    """Bytes of each table with its indexes (``dbstat``)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = dict(
            conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')")
        )
        sizes: dict[str, int] = {}
        for name, size in conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"):
            owner = tables.get(name, name)
            sizes[owner] = sizes.get(owner, 0) + int(size)
        return sizes
    finally:
        conn.close()


def file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


# -- 1. sizing ---------------------------------------------------------------------------------------------


async def sizing(path: str, n: int) -> dict[str, float]:
    clock = ManualClock(start_ms=T0)
    per: dict[str, float] = {}
    keep = Config.from_dict(
        {**CONFIG.to_dict(), "retention": {"works": "1h", "events": "1h", "dedup": "forever"}}
    )
    async with open_runtime(path, clock=clock, config=keep, actors=()) as rt:
        before = table_bytes(path)
        await publish_all(rt, (noise(i) for i in range(n)), 50)
        await run_works(rt)
        after = table_bytes(path)
        per["Event"] = _grown(before, after, ("events", "checkpoints")) / n
        before = after
        await publish_all(rt, (order(i) for i in range(n)), 50)
        await run_works(rt)
        after = table_bytes(path)
        everything = ("events", "checkpoints", "works", "work_keys", "work_inputs", "executions")
        per["Work"] = _grown(before, after, everything) / n
        per["attempt"] = _grown(before, after, ("executions",)) / n
        before = after
        for i in range(0, n, 500):
            async with trio.open_nursery() as nursery:
                for j in range(i, min(i + 500, n)):
                    spec = TimerSpec(
                        id=f"t-{j}", fire_at_ms=T0 + 100 * HOUR_MS, source="bench", type="t", scope="shop"
                    )
                    nursery.start_soon(rt.arm, spec)
        per["timer"] = _grown(before, table_bytes(path), ("timers",)) / n
        clock.advance(2 * HOUR_MS)
        await rt.compact()
        per["tombstone"] = table_bytes(path).get("event_tombstones", 0) / (2 * n)
    return per


def _grown(before: dict[str, int], after: dict[str, int], tables: Iterable[str]) -> int:
    return sum(after.get(t, 0) - before.get(t, 0) for t in tables)


# -- 2. steady state ---------------------------------------------------------------------------------------


def bound(events_per_step: float, works_per_step: float, per: dict[str, float]) -> tuple[int, int]:
    """The most rows and bytes the database may hold: what arrives in the retention (one hour) plus two
    sweep intervals, three times over, at the measured sizes, plus `FIXED_BYTES`."""
    steps = (HOUR_MS + 2 * STEP_MS) / STEP_MS
    noise_rows = (events_per_step - works_per_step) * steps
    work_rows = works_per_step * steps
    # an Event is its row, its checkpoint and its tombstone; a Work adds its key, input and attempt
    rows = 3 * (noise_rows * 3 + work_rows * 6)
    size = 3 * (noise_rows * (per["Event"] + per["tombstone"]) + work_rows * (per["Work"] + per["tombstone"]))
    return int(rows), int(size) + FIXED_BYTES


async def steady(path: str, events: int, works: int, days: float, producers: int) -> dict[str, int]:
    clock = ManualClock(start_ms=T0)
    steps = int(days * 24 * HOUR_MS / STEP_MS)
    top = {"rows": 0, "bytes": 0, "steps": steps, "removed": 0}
    noise_total = events - works
    async with open_runtime(path, clock=clock, config=CONFIG, actors=()) as rt:
        for step in range(steps):
            w0, w1 = works * step // steps, works * (step + 1) // steps
            n0, n1 = noise_total * step // steps, noise_total * (step + 1) // steps
            await publish_all(
                rt, [*(order(i) for i in range(w0, w1)), *(noise(i) for i in range(n0, n1))], producers
            )
            await run_works(rt)
            clock.advance(STEP_MS)
            top["removed"] += (await rt.compact()).removed
            if clock.now_ms() - T0 >= WARMUP_MS:
                size = await rt.store_size()
                top["rows"] = max(top["rows"], sum(size.rows.values()))
                top["bytes"] = max(top["bytes"], file_bytes(path))
    return top


# -- 3. acceptance while compaction runs -------------------------------------------------------------------


async def backlog(path: str, works: int, producers: int) -> None:
    clock = ManualClock(start_ms=T0)
    async with open_runtime(path, clock=clock, config=CONFIG, actors=()) as rt:
        for i in range(0, works, 5_000):
            await publish_all(rt, (order(j) for j in range(i, min(i + 5_000, works))), producers)
            await publish_all(rt, (noise(j) for j in range(i, min(i + 5_000, works))), producers)
            await run_works(rt)


async def accept(path: str, n: int, producers: int, *, compacting: bool) -> tuple[float, int]:
    """Events per second accepted by ``producers`` tasks, and the rows a compaction sweep running
    meanwhile removed (sweeps follow each other until the publishing ends)."""
    clock = ManualClock(start_ms=T0 + 2 * HOUR_MS)
    async with open_runtime(path, clock=clock, config=CONFIG, actors=()) as rt:
        before = sum((await rt.store_size()).rows.values())
        fresh = (EventIn(source="load", delivery_id=f"l-{i}", type="noise.tick", scope="shop", payload=PAYLOAD)
                 for i in range(n))  # fmt: skip
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            if compacting:

                async def sweeps() -> None:
                    while True:
                        await rt.compact()
                        await trio.sleep(0.01)

                nursery.start_soon(sweeps)
            await publish_all(rt, fresh, producers)
            seconds = time.perf_counter() - started
            nursery.cancel_scope.cancel()
        grown = sum((await rt.store_size()).rows.values()) - before
    return n / seconds, max(0, 2 * n - grown)  # each new Event is its row and its checkpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="Events through the steady state")
    parser.add_argument("--works", type=int, default=10_000, help="Works through the steady state")
    parser.add_argument("--days", type=float, default=2.0, help="simulated days (default 2)")
    parser.add_argument("--producers", type=int, default=100, help="concurrent publishers (default 100)")
    parser.add_argument("--accept", type=int, default=20_000, help="Events published for the ratio")
    parser.add_argument("--size", type=int, default=2_000, help="rows of each kind for the sizing")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the acceptance ratio (default 3)")
    parser.add_argument("--dir", default=None, help="where to put the temporary directory")
    parser.add_argument(
        "--only", choices=("sizing", "steady", "acceptance"), help="run only this figure (default: all three)"
    )
    args = parser.parse_args(argv)
    if args.works < 1 or args.events < args.works:
        parser.error("--events must be at least --works, and --works at least 1")
    root = Path(tempfile.mkdtemp(prefix="loom-bench-retention-", dir=args.dir))
    ok = True
    try:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, loom {loom.__version__}, {root}"
        )
        per = trio.run(sizing, str(root / "sizing.db"), args.size)
        print("bytes per row: " + ", ".join(f"{kind} {size:.0f}" for kind, size in per.items()))
        if args.only in (None, "steady"):
            ok = ok and run_steady(args, root, per)
        if args.only in (None, "acceptance"):
            ok = ok and run_acceptance(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


def run_steady(args: argparse.Namespace, root: Path, per: dict[str, float]) -> bool:
    started = time.perf_counter()
    top = trio.run(steady, str(root / "steady.db"), args.events, args.works, args.days, args.producers)
    steps = top["steps"]
    rows_bound, bytes_bound = bound(args.events / steps, args.works / steps, per)
    kept = args.events * (per["Event"] + per["tombstone"]) + args.works * per["Work"]
    print(
        f"steady state: {args.events:,} Events and {args.works:,} Works over {args.days:g} simulated days "
        f"(retention 1h, a sweep each 10 min) in {time.perf_counter() - started:.0f} s: at most "
        f"{top['rows']:,} rows (bound {rows_bound:,}) and {top['bytes'] / 2**20:.1f} MiB "
        f"(bound {bytes_bound / 2**20:.1f} MiB); keeping everything would take about "
        f"{kept / 2**20:.0f} MiB ({kept / max(top['bytes'], 1):.0f}x); {top['removed']:,} rows removed"
    )
    return bool(top["rows"] <= rows_bound and top["bytes"] <= bytes_bound)


def run_acceptance(args: argparse.Namespace, root: Path) -> bool:
    base = str(root / "backlog.db")
    trio.run(backlog, base, args.works, args.producers)
    ratios, alone, busy, removed = [], [], [], 0
    for round_ in range(args.rounds):
        rates = {}
        for compacting in (False, True):
            copy = str(root / f"round-{round_}-{compacting}.db")
            for suffix in ("", "-wal"):
                if os.path.exists(base + suffix):
                    shutil.copy(base + suffix, copy + suffix)
            rates[compacting], gone = trio.run(
                lambda c=copy, on=compacting: accept(c, args.accept, args.producers, compacting=on)
            )
            removed = max(removed, gone if compacting else 0)
        alone.append(rates[False])
        busy.append(rates[True])
        ratios.append(rates[True] / rates[False])
    ratio = statistics.median(ratios)
    print(
        f"acceptance, {args.producers} producers: {statistics.median(alone):,.0f}/s alone, "
        f"{statistics.median(busy):,.0f}/s while compaction swept a {args.works:,}-Work backlog "
        f"(up to {removed:,} rows removed meanwhile): ratio {ratio:.2f}, median of {args.rounds} rounds "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}; at least {MIN_RATIO})"
    )
    return bool(ratio >= MIN_RATIO)


if __name__ == "__main__":
    sys.exit(main())
