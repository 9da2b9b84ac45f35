"""Routing throughput: accept -> route -> queue -> claim -> a no-op python executor -> completion.

Run from the repository root::

    python bench/route.py [--events N] [--producers P] [--dir DIR] [--synchronous FULL|NORMAL]
                          [--backend sqlite|postgres] [--url URL]

Three figures from one run, each on a fresh database file in one temporary directory (default: under the
system temp dir) with `SystemClock`, plus their ratios: durable acceptance alone (``rt.publish``, no routes),
and events/s routed into standing Work and consumed by attempts, with all events on one key (1 Work) and
spread over 100 keys (100 Works). With ``--backend postgres`` each figure gets a fresh database on the
server instead (bench/backend.py), and raw psycopg inserts measured in the same run are the baseline of
every figure. See bench/README.md.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time

import attrs
import backend
import pg
import trio

import loom
from loom.plugins.python_executor import PythonExecutor
from loom.records.executor import Toolbelt
from loom.records.work import Completed, Outcome, RunRequest
from loom.store import Store
from loom.testing.internals import storage_of

SCOPE = "bench"
RAW_BATCH = 500

ROUTED = loom.Config.from_dict(
    {
        "scopes": {
            SCOPE: {
                "bindings": {"py": {"executor": "python", "config": {"function": "noop"}}},
                "routes": [{"name": "main", "create_work": True, "binding": "py", "work_kind": "standing"}],
            }
        },
        "work_kinds": {"standing": {"standing": True}},
    }
)


def offer(i: int, keys: int | None) -> loom.EventIn:
    key = None if keys is None else f"bench/{i % keys}"
    return loom.EventIn(source="bench", delivery_id=f"d-{i}", type="bench.event", scope=SCOPE, key=key)


@attrs.define
class Consumption:
    """What the no-op executor saw: inputs handed to attempts, and the attempts themselves."""

    target: int
    inputs: int = 0
    attempts: int = 0
    done: trio.Event = attrs.Factory(trio.Event)


@attrs.frozen
class Figure:
    rate: float
    detail: str


async def publish_all(rt: loom.Runtime, events: int, producers: int, keys: int | None) -> None:
    async def produce(first: int) -> None:
        for i in range(first, events, producers):
            accepted = await rt.publish(offer(i, keys))
            assert not accepted.duplicate

    async with trio.open_nursery() as nursery:
        for p in range(producers):
            nursery.start_soon(produce, p)


async def acceptance(store: Store, events: int, producers: int) -> Figure:
    """``rt.publish`` alone, no routes: events/s until every publish has returned."""
    async with loom.open_runtime(store, clock=loom.SystemClock(), load_entry_points=False) as rt:
        start = time.perf_counter()
        await publish_all(rt, events, producers, keys=None)
        elapsed = time.perf_counter() - start
        await rt.wait_idle()  # the router checkpoints each as unmatched; not timed
    return Figure(events / elapsed, f"{producers} producers")


async def routed(store: Store, events: int, producers: int, keys: int) -> Figure:
    """Events/s from the first publish until every Work's inputs are consumed by completed attempts."""
    seen = Consumption(target=events)
    executor = PythonExecutor()

    @executor.function("noop")
    async def noop(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        seen.attempts += 1
        seen.inputs += len(request.inputs)
        if seen.inputs >= seen.target:
            seen.done.set()
        return Completed()

    async with loom.open_runtime(
        store, clock=loom.SystemClock(), config=ROUTED, plugins=[executor], load_entry_points=False
    ) as rt:
        start = time.perf_counter()
        await publish_all(rt, events, producers, keys=keys)
        published = time.perf_counter() - start
        await seen.done.wait()
        await rt.wait_idle()  # the last attempts' completions have committed
        elapsed = time.perf_counter() - start
        works = await rt.works(limit=keys + 1)
        pending = sum(len(work.pending_inputs) for work in works)
        stats = storage_of(rt).stats
    assert len(works) == keys, f"expected {keys} Works, found {len(works)}"
    assert pending == 0, f"{pending} inputs still pending"
    assert seen.inputs == events, f"attempts took {seen.inputs} inputs for {events} events"
    return Figure(
        events / elapsed,
        f"{seen.attempts:,} attempts, {events / seen.attempts:.1f} inputs per attempt; publishing alone took "
        f"{published:.2f} s of {elapsed:.2f} s; {stats.batches:,} commits, mean {stats.requests / stats.batches:.1f} "
        "requests per commit",
    )


@attrs.frozen
class Raw:
    """The raw psycopg baselines of a PostgreSQL run, rows/s."""

    commit_per_row: float
    batched: float


def raw_baselines(run: backend.Backend, rows: int) -> Raw:
    """Raw psycopg inserts of ``rows`` event-shaped rows, each on a fresh database."""
    assert run.cluster is not None
    new = run.cluster.create_database
    raw = Raw(pg.raw_commit_per_row(new(), rows), pg.raw_batched(new(), rows, RAW_BATCH))
    print(f"raw psycopg commit-per-row inserts: {raw.commit_per_row:,.0f} rows/s ({rows:,} rows)", flush=True)
    print(
        f"raw psycopg batched inserts, {RAW_BATCH} rows per commit: {raw.batched:,.0f} rows/s ({rows:,} rows)",
        flush=True,
    )
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000, help="events per figure (default 1000)")
    parser.add_argument(
        "--producers", type=int, default=100, help="concurrent publishing tasks (default 100)"
    )
    parser.add_argument(
        "--dir", default=None, help="put the temporary database directory here (the disk under test)"
    )
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    backend.add_options(parser)
    args = parser.parse_args(argv)
    backend.check_options(parser, args)
    if args.events < 100 or args.producers < 1:
        parser.error(
            "--events must be at least 100 (one per Work of the 100-Work figure), --producers at least 1"
        )

    n, producers, sync = args.events, args.producers, args.synchronous
    with backend.chosen(args, "loom-bench-route-") as run:
        if run.postgres:
            print(
                f"# {sys.platform}, python {sys.version.split()[0]}, {run.server()}, {n:,} events per figure, "
                f"{producers} producers, a fresh database per figure; baseline: raw psycopg inserts "
                "measured in this run",
                flush=True,
            )
            raw = raw_baselines(run, n)
        else:
            print(
                f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
                f"synchronous={sync}, {n:,} events per figure, {producers} producers, databases in {run.tmp}",
                flush=True,
            )
        accept = trio.run(acceptance, run.store("accept.db"), n, producers)
        print(
            f"loom durable acceptance alone (no routes): {accept.rate:,.0f} events/s ({accept.detail})",
            flush=True,
        )
        figures: dict[int, Figure] = {}
        for keys in (1, 100):
            figure = trio.run(routed, run.store(f"route-{keys}.db"), n, producers, keys)
            figures[keys] = figure
            works = "1 Work (one key)" if keys == 1 else f"{keys} Works ({keys} keys)"
            print(
                f"accept -> route -> claim -> no-op executor -> completion, {works}: "
                f"{figure.rate:,.0f} events/s ({figure.detail})",
                flush=True,
            )
        for keys, figure in figures.items():
            print(f"ratio route-{keys}/accept: {figure.rate / accept.rate:.2f}")
        if run.postgres:
            print(f"ratio accept/raw-commit-per-row: {accept.rate / raw.commit_per_row:.2f}")
            print(f"ratio accept/raw-batched: {accept.rate / raw.batched:.3f}")
            for keys, figure in figures.items():
                print(f"ratio route-{keys}/raw-commit-per-row: {figure.rate / raw.commit_per_row:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
