"""The read side: one read through the runtime, as a multiple of the same read in raw ``sqlite3``.

Run from the repository root::

    python bench/reads.py [--reads N] [--dir DIR] [--backend sqlite|postgres] [--url URL]

A runtime on a fresh SQLite file accepts one Event (routed: its checkpoint is written), then reads the
Event's routing checkpoint N times one after another (``rt.checkpoint``: the read side's connection in
its own thread, one hand-off there and back per read), and N times from 100 concurrent tasks. The
baselines are the same query on a connection of its own, N times, measured in the same run: in this
thread, and through one ``trio.to_thread`` hop per read (what a read off the event loop costs at the
least; its hop costs what the machine's load makes it, as loom's does, so the ratio to it moves less).
Each figure is printed as a multiple of the baseline's time per read, and as reads per second. With
``--backend postgres`` the runtime's database is a fresh one on the server (bench/backend.py) and the
baselines are the same query through raw psycopg. See bench/README.md, sections "2026-12-07 (14)" and
"(15)".
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import backend
import trio

import loom
from loom.store import _sql

TASKS = 100


Read = Callable[[], list[Any]]


@contextmanager
def raw_reader(location: str, event_id: str) -> Iterator[Read]:
    """The checkpoint's read on a raw connection of its own: sqlite3, read-only, or psycopg."""
    if location.startswith("postgresql://"):
        import psycopg

        pg_conn = psycopg.connect(location, autocommit=True)
        sql = _sql.CHECKPOINT_BY_EVENT.replace("?", "%s")
        try:
            yield lambda: pg_conn.execute(sql, (event_id,)).fetchall()
        finally:
            pg_conn.close()
        return
    conn = sqlite3.connect(f"file:{location}?mode=ro", uri=True, check_same_thread=False)
    try:
        yield lambda: conn.execute(_sql.CHECKPOINT_BY_EVENT, (event_id,)).fetchall()
    finally:
        conn.close()


def raw_reads(location: str, event_id: str, reads: int) -> float:
    """Seconds per read of the checkpoint on a raw connection of its own, in this thread."""
    with raw_reader(location, event_id) as read:
        start = time.perf_counter()
        for _ in range(reads):
            read()
        return (time.perf_counter() - start) / reads


async def raw_hop_reads(location: str, event_id: str, reads: int) -> float:
    """Seconds per read of the checkpoint on a raw connection in a worker thread, one
    ``trio.to_thread.run_sync`` hop there and back per read: what a read off the event loop costs at
    the least."""
    with raw_reader(location, event_id) as read:
        start = time.perf_counter()
        for _ in range(reads):
            await trio.to_thread.run_sync(read)
        return (time.perf_counter() - start) / reads


async def loom_reads(location: str, reads: int) -> tuple[str, float, float]:
    """The Event's id, seconds per read one after another, and reads per second from `TASKS` tasks."""
    config = loom.Config.from_dict({"scopes": {"b": {"routes": [{"name": "all", "types": ["b.*"]}]}}})
    async with loom.open_runtime(location, config=config, load_entry_points=False) as rt:
        event = await rt.publish(loom.EventIn(source="bench", delivery_id="one", type="b.x", scope="b"))
        assert await rt.wait_routed(event.id, timeout=30) is not None
        start = time.perf_counter()
        for _ in range(reads):
            await rt.checkpoint(event.id)
        one = (time.perf_counter() - start) / reads

        async def task(count: int) -> None:
            for _ in range(count):
                await rt.checkpoint(event.id)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(TASKS):
                nursery.start_soon(task, max(reads // TASKS, 1))
        many = max(reads // TASKS, 1) * TASKS / (time.perf_counter() - start)
    return event.id, one, many


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=5_000, help="reads per figure")
    parser.add_argument("--dir", default=None, help="where the database file goes (default: temp dir)")
    backend.add_options(parser)
    args = parser.parse_args(argv)
    backend.check_options(parser, args)
    with backend.chosen(args, "loom-reads-") as chosen:
        location = chosen.location("reads.db")
        event_id, one, many = trio.run(loom_reads, location, args.reads)
        raw = raw_reads(location, event_id, args.reads)
        hop = trio.run(raw_hop_reads, location, event_id, args.reads)
        where = chosen.server() if chosen.postgres else f"sqlite {sqlite3.sqlite_version}"
        name = "psycopg" if chosen.postgres else "sqlite3"
        print(f"# linux, python {sys.version.split()[0]}, {where}; {args.reads:,} reads each")
        print(f"raw {name} read of a checkpoint: {1 / raw:,.0f} reads/s")
        print(f"the same read through one trio.to_thread hop: {1 / hop:,.0f} reads/s")
        print(
            f"rt.checkpoint, one after another: {1 / one:,.0f} reads/s; ratio loom-read/raw-read: {one / raw:.1f};"
            f" ratio loom-read/raw-hop-read: {one / hop:.2f}"
        )
        print(
            f"rt.checkpoint from {TASKS} tasks: {many:,.0f} reads/s; ratio raw/loom-concurrent: {1 / raw / many:.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
