"""Event-to-wake latency and wake throughput with many Works waiting.

Run from the repository root::

    python bench/waits.py [--waiting N] [--samples S] [--wakes W] [--producers P] [--background RATE]
                          [--timers T] [--dir DIR] [--backend sqlite|postgres] [--url URL]

One runtime on a fresh database file with `SystemClock` and a python executor: each Work's first attempt
returns a `Waiting` outcome (it parks on ``go.*`` Events on its key), so N Works wait. Then:

* latency: S times, one at a time, publish a matching Event for a waiting Work and time until its
  continuation (attempt 2) has started in the executor: p50 and p99 (milliseconds), while a background
  load of RATE Events per second (``--background``, default 1000; Events that match no route, published
  at an even pace by 10 tasks) runs;
* lateness: under the same background load, T timers (``--timers``, default 200) due 20 ms apart, each
  firing an Event that a route gives to fresh Work: the time from each one's due time to its function's
  start (p50, p99);
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
                "bindings": {
                    "py": {"executor": "python", "config": {"function": "job"}},
                    "tick": {"executor": "python", "config": {"function": "tick"}},
                },
                "routes": [
                    {"name": "jobs", "types": ["start.*", "go.*"], "create_work": True, "binding": "py"},
                    {"name": "ticks", "types": ["tick.*"], "handler": "fresh", "binding": "tick"},
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


class Ticks:
    """The lateness timers' function: records how late each started, in milliseconds."""

    def __init__(self) -> None:
        self.late_ms: list[float] = []
        self.target = 0
        self.all_started = trio.Event()

    async def tick(self, request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        self.late_ms.append(time.time() * 1000 - request.inputs[0].payload["due_ms"])
        if len(self.late_ms) == self.target:
            self.all_started.set()
        return loom.Completed()


BACKGROUND_TASKS = 10


async def background(rt: loom.Runtime, rate: float, *, task_status: trio.TaskStatus[None]) -> None:
    """Publish ``rate`` Events per second that match no route, at an even pace, until cancelled."""
    task_status.started()
    if rate <= 0:
        return
    interval = BACKGROUND_TASKS / rate

    async def paced(task: int) -> None:
        deadline = trio.current_time() + interval * task / BACKGROUND_TASKS
        n = 0
        while True:
            await trio.sleep_until(deadline)
            await rt.publish(
                loom.EventIn(source="bench", delivery_id=f"bg-{task}-{n}", type="x.background", scope=SCOPE)
            )
            n += 1
            deadline = max(deadline + interval, trio.current_time())

    async with trio.open_nursery() as nursery:
        for task in range(BACKGROUND_TASKS):
            nursery.start_soon(paced, task)


def percentiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def lateness(rt: loom.Runtime, ticks: Ticks, n: int) -> tuple[float, float]:
    """``n`` timers due 20 ms apart from 1 s from now; how late each one's function started."""
    ticks.target = n
    due_ms = int((time.time() + 1.0) * 1000)
    for i in range(n):
        due = due_ms + 20 * i
        await rt.arm(
            loom.TimerSpec(
                id=f"tick-{i}",
                fire_at_ms=due,
                source="bench",
                type="tick.due",
                scope=SCOPE,
                payload={"due_ms": due},
            )
        )
    await ticks.all_started.wait()
    return percentiles(ticks.late_ms)


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
    ticks = Ticks()
    executor = PythonExecutor()
    executor.register("job", jobs.job)
    executor.register("tick", ticks.tick)
    jobs.target = args.waiting
    async with loom.open_runtime(location, config=CONFIG, plugins=[executor], load_entry_points=False) as rt:
        began = time.perf_counter()
        await publish_all(rt, [start(i) for i in range(args.waiting)], args.producers)
        await jobs.all_parked.wait()
        await rt.wait_idle()
        print(f"setup: {args.waiting} Works waiting after {time.perf_counter() - began:.1f} s")

        latencies: list[float] = []
        async with trio.open_nursery() as load:
            await load.start(background, rt, args.background)
            for i in range(args.samples):
                work = await rt.work_for_key(f"job/{i}")
                started = jobs.watch[work.id] = trio.Event()
                t0 = time.perf_counter()
                await rt.publish(go(i))
                await started.wait()
                latencies.append((jobs.started[work.id] - t0) * 1000)
            late_p50, late_p99 = await lateness(rt, ticks, args.timers) if args.timers else (0.0, 0.0)
            load.cancel_scope.cancel()
        await rt.wait_idle()
        p50, p99 = percentiles(latencies)
        under = f"under {args.background:,.0f} events/s of background load" if args.background else "no load"
        # on PostgreSQL: how many raw commit-per-row transactions take as long
        commits = (
            f"; in raw psycopg commits: p50 {p50 / 1000 * raw:.1f}, p99 {p99 / 1000 * raw:.1f}" if raw else ""
        )
        print(
            f"event-to-continuation latency with {args.waiting} waiting, {under}: p50 {p50:.2f} ms"
            f"  p99 {p99:.2f} ms  ({args.samples} samples, one at a time){commits}"
        )
        if args.timers:
            print(
                f"due-to-fire lateness, {under}: p50 {late_p50:.2f} ms  p99 {late_p99:.2f} ms  ({args.timers} "
                "timers due 20 ms apart; due time to the function's start, each on fresh Work)"
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
    parser.add_argument("--background", type=float, default=1000.0, help="events/s of background load")
    parser.add_argument("--timers", type=int, default=200, help="timers for the lateness figure (0: none)")
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
