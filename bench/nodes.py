"""Several nodes on one PostgreSQL server: durable acceptance and timer firing with 1, 2 and 3 node
processes, as ratios to raw psycopg commit-per-row inserts measured in the same run.

Run from the repository root::

    python bench/nodes.py [--events N] [--timers T] [--raw-rows R] [--url postgresql://...]

Without ``--url`` it starts a throwaway PostgreSQL cluster (``initdb`` in a temporary directory,
``fsync`` on) and removes it at the end; each configuration gets a fresh database. Acceptance: the
nodes publish ``N`` distinct Events between them (50 concurrent producers each), from a common start
until the last node is done. Firing: the nodes arm ``T`` timers between them, all due at one moment,
and the rate is the timers fired from that moment until the last firing committed (the ledger's
times). See bench/README.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psycopg
import trio
from pg import raw_commit_per_row, server

import loom
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
    armed = finish(nodes(url, "timers", n, timers, due_ms))
    assert max(armed) * 1000 < due_ms, "arming ended after the timers fell due: give it more time"
    fired = count(url, "SELECT count(*) FROM timer_firings")
    assert fired == timers == count(url, "SELECT count(*) FROM events WHERE type = 'bench.tick'"), fired
    last = count(url, "SELECT max(at_ms) FROM timer_firings")
    return timers / (max(1, last - due_ms) / 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=6000, help="Events per configuration (default 6000)")
    parser.add_argument("--timers", type=int, default=3000, help="timers per configuration (default 3000)")
    parser.add_argument("--raw-rows", type=int, default=1000, help="rows of the raw baseline (default 1000)")
    parser.add_argument(
        "--url", default=None, help="a PostgreSQL server to measure on (default: a throwaway one)"
    )
    args = parser.parse_args(argv)
    if args.events < PRODUCERS * 3 or args.timers < 3 or args.raw_rows < 1:
        parser.error(f"--events must be at least {PRODUCERS * 3}, --timers at least 3, --raw-rows at least 1")
    with server(args.url) as cluster:
        version = count(cluster.url(), "SELECT current_setting('server_version_num')")
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, PostgreSQL {version}, psycopg {psycopg.__version__}"
        )
        raw = raw_commit_per_row(cluster.create_database(), args.raw_rows)
        print(f"raw psycopg commit-per-row inserts: {raw:,.0f} rows/s ({args.raw_rows:,} rows) = 1.00")
        for n in NODES:
            rate = measure_acceptance(cluster, n, args.events)
            print(
                f"acceptance, {n} node(s): {rate:,.0f} events/s = {rate / raw:.2f} x raw ({args.events:,} events)"
            )
        for n in NODES:
            rate = measure_firing(cluster, n, args.timers)
            print(
                f"timer firing, {n} node(s): {rate:,.0f} timers/s = {rate / raw:.2f} x raw ({args.timers:,} timers)"
            )
    return 0


def child(argv: list[str]) -> None:
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
