"""The read side: one read through the runtime, as a multiple of the same read in raw ``sqlite3``.

Run from the repository root::

    python bench/reads.py [--reads N] [--dir DIR]

A runtime on a fresh SQLite file accepts one Event (routed: its checkpoint is written), then reads the
Event's routing checkpoint N times one after another (``rt.checkpoint``: the read side's connection in
its own thread, one hand-off there and back per read), and N times from 100 concurrent tasks. The
baselines are the same query on a connection of its own, N times, measured in the same run: in this
thread, and through one ``trio.to_thread`` hop per read (what a read off the event loop costs at the
least; its hop costs what the machine's load makes it, as loom's does, so the ratio to it moves less).
Each figure is printed as a multiple of the baseline's time per read, and as reads per second. See bench/README.md ("The read side").
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

import loom
from loom.store import _sql

TASKS = 100


def raw_reads(path: Path, event_id: str, reads: int) -> float:
    """Seconds per read of the checkpoint through raw sqlite3 (a connection of its own, this thread)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        start = time.perf_counter()
        for _ in range(reads):
            conn.execute(_sql.CHECKPOINT_BY_EVENT, (event_id,)).fetchall()
        return (time.perf_counter() - start) / reads
    finally:
        conn.close()


async def raw_hop_reads(path: Path, event_id: str, reads: int) -> float:
    """Seconds per read of the checkpoint through raw sqlite3 in a worker thread, one
    ``trio.to_thread.run_sync`` hop there and back per read: what a read off the event loop costs at
    the least."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)

    def read() -> list[Any]:
        return conn.execute(_sql.CHECKPOINT_BY_EVENT, (event_id,)).fetchall()

    try:
        start = time.perf_counter()
        for _ in range(reads):
            await trio.to_thread.run_sync(read)
        return (time.perf_counter() - start) / reads
    finally:
        conn.close()


async def loom_reads(path: Path, reads: int) -> tuple[str, float, float]:
    """The Event's id, seconds per read one after another, and reads per second from `TASKS` tasks."""
    config = loom.Config.from_dict({"scopes": {"b": {"routes": [{"name": "all", "types": ["b.*"]}]}}})
    async with loom.open_runtime(str(path), config=config, load_entry_points=False) as rt:
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
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="loom-reads-", dir=args.dir))
    try:
        path = tmp / "reads.db"
        event_id, one, many = trio.run(loom_reads, path, args.reads)
        raw = raw_reads(path, event_id, args.reads)
        hop = trio.run(raw_hop_reads, path, event_id, args.reads)
        print(
            f"# linux, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}; {args.reads:,} reads each"
        )
        print(f"raw sqlite3 read of a checkpoint: {1 / raw:,.0f} reads/s")
        print(f"the same read through one trio.to_thread hop: {1 / hop:,.0f} reads/s")
        print(
            f"rt.checkpoint, one after another: {1 / one:,.0f} reads/s; ratio loom-read/raw-read: {one / raw:.1f};"
            f" ratio loom-read/raw-hop-read: {one / hop:.2f}"
        )
        print(
            f"rt.checkpoint from {TASKS} tasks: {many:,.0f} reads/s; ratio raw/loom-concurrent: {1 / raw / many:.1f}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
