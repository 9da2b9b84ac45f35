"""Where the time of each hot path goes: shares of its wall time, measured in one run.

Run from the repository root::

    python bench/where.py [--events N] [--wakes W] [--timers T] [--attempts A] [--jobs J] [--dir DIR]

Each path of `ceiling.py` (acceptance, route-100, wakes, timers, recovery, due-jobs: the workloads of
the other benches) runs once through loom on a fresh SQLite file (WAL, ``synchronous=FULL``), and the
part its bench times is split, as shares of that part's wall time:

* ``sql``: CPU time of the storage thread inside the write connection's statements (SQLite's own work,
  the GIL released);
* ``disk``: the rest of the time inside those statements (waiting: mostly a COMMIT's fsync);
* ``storage py``: the storage thread's other CPU time: the procedures, the transaction's bookkeeping,
  the batch around them (Python, under the GIL);
* ``trio``: CPU time of the trio thread: the actors, the publishers and executors, validation, the hand-off
  to the storage thread;
* ``other``: what is left of 100 (the threads waiting for each other, the loop idle);
* ``gc``: the cyclic garbage collector's passes (inside ``storage py`` or ``trio``, whichever thread met them).

Under one GIL only ``sql`` and ``disk`` run beside the other thread's Python, so the first four shares
may add up to a little more than 100 (``other`` is then 0). Each line also gives the items per second,
and the write connection's statements per item. The measurement costs about a microsecond per statement and
per batch (reading the thread's CPU clock); read the shares, not the rates, from this script.
"""

from __future__ import annotations

import gc
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ceiling
import trio

from loom.store import _actor, _sqlite


class Split(ceiling.Recorder):
    """Times of the timed window (`begin` to `end`): the storage thread's CPU in its batches and in
    its statements, the statements' wall time, the trio thread's CPU, the collector's passes."""

    def __init__(self) -> None:
        super().__init__()
        self.on = False
        self.statements_timed = 0
        self.sql_cpu = self.sql_wall = self.storage_cpu = self.gc = 0.0
        self.trio_cpu = self.wall = 0.0
        self._trio_at = self._wall_at = self._gc_at = 0.0

    def begin(self) -> None:
        self.on = True
        self._trio_at, self._wall_at = time.thread_time(), time.perf_counter()

    def end(self) -> None:
        self.trio_cpu = time.thread_time() - self._trio_at
        self.wall = time.perf_counter() - self._wall_at
        self.on = False

    def _collecting(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self._gc_at = time.perf_counter()
        else:
            self.gc += time.perf_counter() - self._gc_at

    def install(self) -> Callable[[], None]:
        execute, executemany = _sqlite.WriterConnection.execute, _sqlite.WriterConnection.executemany
        settled = _actor.StorageActor._execute_until_settled

        def timed(run: Callable[..., Any]) -> Callable[..., Any]:
            def method(conn: Any, sql: str, parameters: Any = (), /) -> Any:
                if not self.on:
                    return run(conn, sql, parameters)
                cpu, wall = time.thread_time(), time.perf_counter()
                try:
                    return run(conn, sql, parameters)
                finally:
                    self.sql_cpu += time.thread_time() - cpu
                    self.sql_wall += time.perf_counter() - wall
                    self.statements_timed += 1

            return method

        def batch(actor: Any, *args: Any) -> Any:
            if not self.on:
                return settled(actor, *args)
            cpu = time.thread_time()
            try:
                return settled(actor, *args)
            finally:
                self.storage_cpu += time.thread_time() - cpu

        _sqlite.WriterConnection.execute = timed(execute)  # type: ignore[method-assign]
        _sqlite.WriterConnection.executemany = timed(executemany)  # type: ignore[method-assign]
        _actor.StorageActor._execute_until_settled = batch  # type: ignore[method-assign]
        gc.callbacks.append(self._collecting)

        def uninstall() -> None:
            _sqlite.WriterConnection.execute = execute  # type: ignore[method-assign]
            _sqlite.WriterConnection.executemany = executemany  # type: ignore[method-assign]
            _actor.StorageActor._execute_until_settled = settled  # type: ignore[method-assign]
            gc.callbacks.remove(self._collecting)

        return uninstall

    def shares(self) -> dict[str, float]:
        """Each part as a share (percent) of the window's wall time."""
        disk = max(self.sql_wall - self.sql_cpu, 0.0)
        storage_py = max(self.storage_cpu - self.sql_cpu, 0.0)
        parts = {"sql": self.sql_cpu, "disk": disk, "storage py": storage_py, "trio": self.trio_cpu}
        parts["other"] = max(self.wall - sum(parts.values()), 0.0)
        parts["gc"] = self.gc
        return {name: 100 * seconds / self.wall for name, seconds in parts.items()}


def measure(tmp: Path, name: str, path: ceiling.Workload, n: int) -> tuple[float, Split]:
    split = Split()
    uninstall = split.install()
    try:
        rate = trio.run(path, str(tmp / f"{name}.db"), split, n)
    finally:
        uninstall()
    return rate, split


def main(argv: list[str] | None = None) -> int:
    args = ceiling.parser_of(__doc__.splitlines()[0]).parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="loom-where-", dir=args.dir))
    try:
        print(
            f"# linux, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, WAL, synchronous=FULL"
        )
        print("# shares of each path's timed wall time, percent: sql, disk, storage py, trio, other; gc")
        for name, path, n, unit in ceiling.paths(args):
            rate, split = measure(tmp, name, path, n)
            shares = "  ".join(f"{part} {share:4.1f}" for part, share in split.shares().items())
            print(
                f"{name:<10} {shares}   ({rate:,.0f} {unit}/s, {split.statements_timed / n:.1f} statements"
                " per item)"
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
