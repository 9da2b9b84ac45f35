"""Event-to-wake latency and wake throughput with many Works waiting.

Run from the repository root::

    python bench/waits.py [--waiting N] [--samples S] [--wakes W] [--producers P] [--dir DIR]
                          [--backend sqlite|postgres] [--url URL]

One runtime on a fresh database file with `SystemClock` and a python executor: each Work's first attempt
returns a `Waiting` outcome (it parks on ``go.*`` Events on its key), so N Works wait. Then:

* latency: S times, one at a time, publish a matching Event for a waiting Work and time until its
  continuation (attempt 2) has started in the executor: p50 and p99 (milliseconds);
* throughput: W matching Events for W other waiting Works published by P producers; wakes per second until
  every continuation has started, as a ratio to durable acceptance alone (W Events that match no route,
  published the same way, in the same run).

With ``--backend postgres`` the runtime's database is a fresh one on the server (bench/backend.py), and
raw psycopg commit-per-row inserts measured first in the same run are the baseline of every figure: the
latencies are also given in raw commits (how many commit-per-row transactions take as long), the rates
as ratios to the raw rate.

Figures are printed one per line; read ratios, not absolute times (this machine is shared).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import backend
import pg
import trio

import loom
from loom.plugins.python_executor import PythonExecutor

SCOPE = "bench"
CONFIG = loom.Config.from_dict(
    {
        "scopes": {
            SCOPE: {
                "bindings": {"py": {"executor": "python", "config": {"function": "job"}}},
                "routes": [
                    {"name": "jobs", "types": ["start.*", "go.*"], "create_work": True, "binding": "py"}
                ],
            }
        }
    }
)


class Jobs:
    """Attempt 1 waits on ``go.*``; attempt 2 (the continuation) records when it started."""

    def __init__(self) -> None:
        self.parked = 0
        self.all_parked = trio.Event()
        self.target = 0
        self.started: dict[str, float] = {}
        self.watch: dict[str, trio.Event] = {}

    async def job(self, request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        if request.attempt == 1:
            self.parked += 1
            if self.parked == self.target:
                self.all_parked.set()
            return loom.Waiting(wait=loom.WaitSpec(types=("go.*",)))
        self.started[request.work_id] = time.perf_counter()
        event = self.watch.pop(request.work_id, None)
        if event is not None:
            event.set()
        return loom.Completed()


def start(i: int) -> loom.EventIn:
    return loom.EventIn(
        source="bench", delivery_id=f"start-{i}", type="start.job", scope=SCOPE, key=f"job/{i}"
    )


def go(i: int) -> loom.EventIn:
    return loom.EventIn(source="bench", delivery_id=f"go-{i}", type="go.now", scope=SCOPE, key=f"job/{i}")


async def publish_all(rt: loom.Runtime, events: list[loom.EventIn], producers: int) -> None:
    queue = iter(events)

    async def producer() -> None:
        for event in queue:
            await rt.publish(event)

    async with trio.open_nursery() as nursery:
        for _ in range(producers):
            nursery.start_soon(producer)


def raw_baseline(run: backend.Backend, rows: int) -> float | None:
    """On PostgreSQL, raw psycopg commit-per-row inserts on a fresh database (rows/s); on SQLite none."""
    if run.cluster is None:
        return None
    rate = pg.raw_commit_per_row(run.cluster.create_database(), rows)
    print(f"raw psycopg commit-per-row inserts: {rate:,.0f} rows/s ({rows:,} rows)", flush=True)
    return rate


async def run(args: argparse.Namespace, location: str, raw: float | None) -> None:
    jobs = Jobs()
    executor = PythonExecutor()
    executor.register("job", jobs.job)
    jobs.target = args.waiting
    async with loom.open_runtime(location, config=CONFIG, plugins=[executor], load_entry_points=False) as rt:
        began = time.perf_counter()
        await publish_all(rt, [start(i) for i in range(args.waiting)], args.producers)
        await jobs.all_parked.wait()
        await rt.wait_idle()
        print(f"setup: {args.waiting} Works waiting after {time.perf_counter() - began:.1f} s")

        latencies: list[float] = []
        for i in range(args.samples):
            work = await rt.work_for_key(f"job/{i}")
            started = jobs.watch[work.id] = trio.Event()
            t0 = time.perf_counter()
            await rt.publish(go(i))
            await started.wait()
            latencies.append((jobs.started[work.id] - t0) * 1000)
        latencies.sort()
        p50 = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        # on PostgreSQL: how many raw commit-per-row transactions take as long
        commits = (
            f"; in raw psycopg commits: p50 {p50 / 1000 * raw:.1f}, p99 {p99 / 1000 * raw:.1f}" if raw else ""
        )
        print(
            f"event-to-continuation latency with {args.waiting} waiting: p50 {p50:.2f} ms"
            f"  p99 {p99:.2f} ms  ({args.samples} samples, one at a time){commits}"
        )

        first = args.samples
        wake_ids = [f"job/{i}" for i in range(first, first + args.wakes)]
        works = [(await rt.work_for_key(key)).id for key in wake_ids]
        done = trio.Event()
        remaining = {work_id for work_id in works}

        def watch(work_id: str) -> None:
            event = jobs.watch[work_id] = trio.Event()

            async def wait_one() -> None:
                await event.wait()
                remaining.discard(work_id)
                if not remaining:
                    done.set()

            nursery.start_soon(wait_one)

        async with trio.open_nursery() as nursery:
            for work_id in works:
                watch(work_id)
            t0 = time.perf_counter()
            await publish_all(rt, [go(i) for i in range(first, first + args.wakes)], args.producers)
            await done.wait()
            wake_seconds = time.perf_counter() - t0
        wakes_per_s = args.wakes / wake_seconds

        alone = [
            loom.EventIn(source="bench", delivery_id=f"alone-{i}", type="x.alone", scope=SCOPE)
            for i in range(args.wakes)
        ]
        t0 = time.perf_counter()
        await publish_all(rt, alone, args.producers)
        accept_per_s = args.wakes / (time.perf_counter() - t0)
        print(
            f"durable acceptance alone, {args.producers} producers: {accept_per_s:,.0f} events/s"
            + (f"  = {accept_per_s / raw:.2f}x raw commit-per-row" if raw else "")
        )
        print(
            f"wakes to started continuations, {args.producers} producers: {wakes_per_s:,.0f} wakes/s"
            f"  = {wakes_per_s / accept_per_s:.2f}x acceptance alone"
            + (f"  = {wakes_per_s / raw:.2f}x raw commit-per-row" if raw else "")
        )
        await rt.wait_idle()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--wakes", type=int, default=2_000)
    parser.add_argument("--producers", type=int, default=100)
    parser.add_argument("--dir", default=None)
    backend.add_options(parser)
    args = parser.parse_args()
    backend.check_options(parser, args)
    with backend.chosen(args, "loom-bench-") as chosen:
        if chosen.postgres:  # (on SQLite the first line is the setup's, as it always was)
            print(
                f"# {sys.platform}, python {sys.version.split()[0]}, {chosen.server()}, a fresh database; "
                "baseline: raw psycopg commit-per-row inserts measured in this run",
                flush=True,
            )
        raw = raw_baseline(chosen, args.wakes)  # rows: as many as the wakes
        trio.run(run, args, chosen.location("waits.db"), raw)


if __name__ == "__main__":
    main()
