"""Several nodes on one PostgreSQL server: durable acceptance and timer firing with 1, 2 and 3 node
processes, as ratios to raw psycopg commit-per-row inserts measured in the same run; how long an Event
accepted on one node takes to wake a wait and start the continuation on another; and what an idle node
with many armed timers costs.

Run from the repository root::

    python bench/nodes.py [--events N] [--timers T] [--raw-rows R] [--waits W] [--idle-timers K]
                          [--idle-seconds S] [--only acceptance,firing,wake,idle] [--url postgresql://...]

Without ``--url`` it starts a throwaway PostgreSQL cluster (``initdb`` in a temporary directory,
``fsync`` on) and removes it at the end; each configuration gets a fresh database. Acceptance: the
nodes publish ``N`` distinct Events between them (50 concurrent producers each), from a common start
until the last node is done. Firing: the nodes arm ``T`` timers between them, all due at one moment,
and the rate is the timers fired from that moment until the last firing committed (the first node
to see every timer fired tells). Wake: a worker node runs ``W`` Works whose first attempt waits for a
``bench.wake`` Event; a second node that only publishes (no actors: an application feeding the cluster) publishes one such
Event at a time, and the worker's continuation measures the time from just before the publish to its
own start (both on this machine's clock): the worker hears of the Event through a notification, routes
it, wakes the wait and starts the continuation. Idle: a node with ``K`` timers armed a day ahead does nothing
for ``S`` seconds; its process's CPU time over them, as a share of one core. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg
import trio
from pg import raw_commit_per_row, server

import loom
from loom.plugins.python_executor import PythonExecutor
from loom.store import as_store
from loom.testing.postgres import PostgresCluster

PRODUCERS = 50
NODES = (1, 2, 3)


# -- a node process ---------------------------------------------------------------------------------


async def accept_node(url: str, node: int, count: int, start_at: float) -> None:
    async with loom.open_runtime(
        url, clock=loom.SystemClock(), owner=f"bench{node}", load_entry_points=False
    ) as rt:
        await trio.sleep(max(0.0, start_at - time.time()))

        async def produce(first: int) -> None:
            for i in range(first, count, PRODUCERS):
                event = loom.EventIn(
                    source="bench",
                    delivery_id=f"{node}-{i}",
                    type="bench.event",
                    scope="bench",
                    payload={"n": i},
                )
                assert not (await rt.publish(event)).duplicate

        async with trio.open_nursery() as nursery:
            for p in range(PRODUCERS):
                nursery.start_soon(produce, p)
        print(f"done {time.time()}", flush=True)


async def timers_node(url: str, node: int, count: int, due_ms: int) -> None:
    async with loom.open_runtime(
        url, clock=loom.SystemClock(), owner=f"bench{node}", load_entry_points=False
    ) as rt:

        async def arm(first: int) -> None:
            for i in range(first, count, PRODUCERS):
                spec = loom.TimerSpec(
                    id=f"t-{node}-{i}", fire_at_ms=due_ms, source="bench", type="bench.tick", scope="b"
                )
                await rt.arm(spec)

        async with trio.open_nursery() as nursery:
            for p in range(PRODUCERS):
                nursery.start_soon(arm, p)
        print(f"armed {time.time()}", flush=True)
        async with rt.watch() as notices:  # this node's commits, and a rescan a second
            while await rt.timers(state="armed", limit=1):  # until every node's timers fired
                await notices.__anext__()
        # no node sees every timer fired before the last firing committed; the node that committed it
        # sees it at that commit's notice
        print(f"fired {time.time()}", flush=True)


WAKE_CONFIG = {
    "routes": [
        {"name": "start", "types": ["bench.start"], "create_work": True, "binding": "py"},
        {"name": "wake", "types": ["bench.wake"]},
    ],
    "bindings": {"py": {"executor": "python", "config": {"function": "steps"}}},
}


async def wake_worker(url: str, waits: int) -> None:
    """Runs every attempt: the first waits for its Work's ``bench.wake``, the second (the continuation)
    records how long after the publish it started. Prints ``ready`` once every Work waits, then the
    latencies as JSON once every continuation has run."""
    latencies: list[float] = []
    done = trio.Event()

    async def steps(request: Any, toolbelt: Any) -> Any:
        if request.attempt == 1:
            return loom.Waiting(wait=loom.WaitSpec(types=("bench.wake",)))
        latencies.append(time.time() - float(request.trigger.payload["sent"]))
        if len(latencies) == waits:
            done.set()
        return loom.Completed()

    executor = PythonExecutor()
    executor.register("steps", steps)
    config = loom.Config.from_dict({"scopes": {"bench": WAKE_CONFIG}})
    async with loom.open_runtime(
        url,
        clock=loom.SystemClock(),
        owner="worker",
        config=config,
        plugins=[executor],
        load_entry_points=False,
    ) as rt:
        for i in range(waits):
            await rt.publish(
                loom.EventIn(
                    source="bench", delivery_id=f"s{i}", type="bench.start", scope="bench", key=f"w/{i}"
                )
            )
        async with rt.watch() as notices:
            while len(await rt.works(state="waiting", limit=waits)) < waits:
                await notices.__anext__()
        print("ready", flush=True)
        await done.wait()
        print(json.dumps(latencies), flush=True)


async def wake_publisher(url: str, waits: int) -> None:
    """A node that only publishes (no actors: an application feeding the cluster): each Work's
    ``bench.wake`` in turn, one in flight at a time, with the time just before the publish."""
    async with loom.open_runtime(
        url, clock=loom.SystemClock(), owner="publisher", load_entry_points=False, actors=()
    ) as rt:
        for i in range(waits):
            await rt.publish(
                loom.EventIn(
                    source="bench",
                    delivery_id=f"w{i}",
                    type="bench.wake",
                    scope="bench",
                    key=f"w/{i}",
                    payload={"sent": repr(time.time())},
                )
            )
            await trio.sleep(0.02)  # the next Event is not queued behind this one
        print("done", flush=True)


async def idle_node(url: str, timers: int, seconds: float) -> None:
    async with loom.open_runtime(url, clock=loom.SystemClock(), owner="idle", load_entry_points=False) as rt:
        due = int((time.time() + 86_400) * 1000)

        async def arm(first: int) -> None:
            for i in range(first, timers, PRODUCERS):
                await rt.arm(
                    loom.TimerSpec(id=f"idle-{i}", fire_at_ms=due + i, source="b", type="b.t", scope="b")
                )

        async with trio.open_nursery() as nursery:
            for p in range(PRODUCERS):
                nursery.start_soon(arm, p)
        await trio.sleep(2.0)  # what arming set in motion settles
        cpu, wall = time.process_time(), time.perf_counter()
        await trio.sleep(seconds)
        print(f"{(time.process_time() - cpu) / (time.perf_counter() - wall)}", flush=True)


# -- the run ------------------------------------------------------------------------------------------


def nodes(url: str, mode: str, n: int, total: int, when: float) -> list[subprocess.Popen[str]]:
    share = [total // n + (1 if i < total % n else 0) for i in range(n)]
    return [
        subprocess.Popen(
            [sys.executable, __file__, "--child", mode, url, str(i), str(share[i]), repr(when)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]


def finish(procs: list[subprocess.Popen[str]]) -> list[float]:
    """Each node's reported time; a node that failed fails the run."""
    times = []
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise SystemExit(f"a node failed (exit {proc.returncode}): {out[-2000:]}")
        times.append(float(out.split()[-1]))
    return times


def count(url: str, sql: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def measure_acceptance(cluster: PostgresCluster, n: int, events: int) -> float:
    url = cluster.create_database()
    as_store(url).open_writer().close()  # migrated before the clock starts
    start_at = time.time() + 3.0  # every node open and waiting by then
    done = finish(nodes(url, "accept", n, events, start_at))
    stored = count(url, "SELECT count(*) FROM events")
    assert stored == events, f"{stored} of {events} Events stored"
    return events / (max(done) - start_at)


def measure_firing(cluster: PostgresCluster, n: int, timers: int) -> float:
    url = cluster.create_database()
    as_store(url).open_writer().close()
    due_ms = int((time.time() + 5.0 + timers / 500) * 1000)  # after every node armed its share
    procs = nodes(url, "timers", n, timers, due_ms)
    outs = [proc.communicate(timeout=600) for proc in procs]
    for proc, (out, _) in zip(procs, outs, strict=True):
        if proc.returncode != 0:
            raise SystemExit(f"a node failed (exit {proc.returncode}): {out[-2000:]}")
    said = [dict(line.split() for line in out.splitlines()) for out, _ in outs]
    assert max(float(s["armed"]) for s in said) * 1000 < due_ms, "arming ended after the timers fell due"
    fired = count(url, "SELECT count(*) FROM timer_firings")
    assert fired == timers == count(url, "SELECT count(*) FROM events WHERE type = 'bench.tick'"), fired
    # until the last firing committed: the first node to see every timer fired (the ledger's times are
    # each batch's start, which leaves the last batch's own time out)
    return timers / (min(float(s["fired"]) for s in said) - due_ms / 1000)


def measure_wake(cluster: PostgresCluster, waits: int) -> list[float]:
    url = cluster.create_database()
    as_store(url).open_writer().close()
    worker = subprocess.Popen(
        [sys.executable, __file__, "--child", "wake-worker", url, str(waits), "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    line = worker.stdout.readline().strip()
    if line != "ready":
        worker.kill()
        raise SystemExit(f"the worker node failed before its Works waited: {line!r}")
    publisher = subprocess.Popen(
        [sys.executable, __file__, "--child", "wake-publisher", url, str(waits), "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = worker.communicate(timeout=600)
    publisher.communicate(timeout=600)
    if worker.returncode or publisher.returncode:
        raise SystemExit(f"a node failed (exit {worker.returncode}, {publisher.returncode})")
    return [x * 1000 for x in json.loads(out.strip().splitlines()[-1])]


def measure_idle(cluster: PostgresCluster, timers: int, seconds: float) -> float:
    url = cluster.create_database()
    as_store(url).open_writer().close()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", "idle", url, str(timers), repr(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=900)
    if proc.returncode:
        raise SystemExit(f"the idle node failed (exit {proc.returncode})")
    return float(out.strip().splitlines()[-1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=6000, help="Events per configuration (default 6000)")
    parser.add_argument("--timers", type=int, default=3000, help="timers per configuration (default 3000)")
    parser.add_argument("--raw-rows", type=int, default=1000, help="rows of the raw baseline (default 1000)")
    parser.add_argument(
        "--url", default=None, help="a PostgreSQL server to measure on (default: a throwaway one)"
    )
    parser.add_argument("--waits", type=int, default=200, help="waits woken across nodes (default 200)")
    parser.add_argument("--idle-timers", type=int, default=50_000, help="timers armed on the idle node")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="how long the idle node is watched")
    parser.add_argument(
        "--only", default="acceptance,firing,wake,idle", help="which figures (default: all of them)"
    )
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    if args.events < PRODUCERS * 3 or args.timers < 3 or args.raw_rows < 1:
        parser.error(f"--events must be at least {PRODUCERS * 3}, --timers at least 3, --raw-rows at least 1")
    with server(args.url) as cluster:
        version = count(cluster.url(), "SELECT current_setting('server_version_num')")
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, PostgreSQL {version}, psycopg {psycopg.__version__}"
        )
        raw = raw_commit_per_row(cluster.create_database(), args.raw_rows)
        print(f"raw psycopg commit-per-row inserts: {raw:,.0f} rows/s ({args.raw_rows:,} rows) = 1.00")
        for n in NODES if "acceptance" in only else ():
            rate = measure_acceptance(cluster, n, args.events)
            print(
                f"acceptance, {n} node(s): {rate:,.0f} events/s = {rate / raw:.2f} x raw ({args.events:,} events)"
            )
        for n in NODES if "firing" in only else ():
            rate = measure_firing(cluster, n, args.timers)
            print(
                f"timer firing, {n} node(s): {rate:,.0f} timers/s = {rate / raw:.2f} x raw ({args.timers:,} timers)"
            )
        if "wake" in only:
            latencies = measure_wake(cluster, args.waits)
            commit_ms = 1000 / raw
            print(
                f"cross-node Event-to-continuation: p50 {percentile(latencies, 0.5):.1f} ms,"
                f" p99 {percentile(latencies, 0.99):.1f} ms, max {max(latencies):.1f} ms"
                f" ({len(latencies)} waits; p50 = {statistics.median(latencies) / commit_ms:.1f} raw commits)"
            )
        if "idle" in only:
            share = measure_idle(cluster, args.idle_timers, args.idle_seconds)
            print(
                f"idle node with {args.idle_timers:,} armed timers: {share * 100:.2f}% of a core"
                f" over {args.idle_seconds:.0f} s"
            )
    return 0


def child(argv: list[str]) -> None:
    if argv[0] in ("wake-worker", "wake-publisher", "idle"):
        mode, url, count, extra = argv
        if mode == "wake-worker":
            trio.run(wake_worker, url, int(count))
        elif mode == "wake-publisher":
            trio.run(wake_publisher, url, int(count))
        else:
            trio.run(idle_node, url, int(count), float(extra))
        return
    mode, url, node, share, when = argv
    if mode == "accept":
        trio.run(accept_node, url, int(node), int(share), float(when))
    else:
        trio.run(timers_node, url, int(node), int(share), int(float(when)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
