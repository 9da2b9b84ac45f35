"""The SQL's own ceiling on each hot path: what the write connection's statements cost with no Python
around them.

Run from the repository root::

    python bench/ceiling.py [--events N] [--wakes W] [--timers T] [--attempts A] [--jobs J] [--dir DIR]

Each path runs once through loom (a fresh SQLite file, WAL, ``synchronous=FULL``) while every statement
of the write connection (``execute`` and ``executemany``, with their parameters, from the file's creation
on) is recorded; the run is timed as its bench times it. The recording is then replayed through raw
``sqlite3`` on a fresh file in the same directory, statement after statement in one thread (of each
read only the first row fetched: loom fetched at least that, so the replay does no more than loom's SQL
did; each statement that failed in the run failing again), and the part that was timed in the run is
timed again: the same transactions, the same rows, the same indexes, without loom's Python, the
thread hops and the executor. That is the fastest the path could go with the statements it makes on
this disk. Paths (the workloads of `route.py`, `waits.py`, `timers.py`, `recovery.py` and `peers.py`):

* acceptance: ``rt.publish`` of N Events that match no route, from 100 producers;
* route-100: N Events over 100 keys, each routed into its standing Work, consumed by no-op attempts;
* wakes: W Works each parked on a wait, then W matching Events from 100 producers, until every
  continuation has started;
* timers: T timers armed, then the clock moved past them: fired by the timer actor;
* recovery: A attempts claimed by a node that is gone, then the store opened with their leases expired:
  each recovered, its finished result adopted, until idle (the open included, as in recovery.py);
* due-jobs: J timers armed, each firing an Event that a route gives to fresh Work whose function
  completes at once (`peers.py`'s loom workload), then the clock moved past them: until every attempt
  has completed.

Each line gives loom's rate, the replay's, and what the replay allows at most of the ratios the issue
sets (route-100, wakes and recovery against acceptance; timers against raw batched firing writes, in timers.py).
See bench/README.md (`ceiling.py`).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import peers
import recovery
import route
import timers
import trio
import waits

import loom
from loom.plugins.python_executor import PythonExecutor
from loom.store import SQLiteStore, _sqlite
from loom.testing.internals import storage_of, timer_actor_of

Statement = tuple[bool, str, Any, bool]
"""``(many, sql, parameters, failed)`` as the write connection ran it."""


class Recorder:
    """Every statement of every write connection opened while it is installed, and where the timed part
    of the run begins and ends in that list."""

    def __init__(self) -> None:
        self.statements: list[Statement] = []
        self.window: tuple[int, int] | None = None
        self._start = 0
        self.garbage = 0
        """Objects the cyclic collector freed in the window: only a reference cycle leaves an object to
        it (anything else is freed when its last reference goes), so on a hot path each is a cycle
        made per item, and every collection it causes walks the whole heap in the end."""
        self._counting = False

    def begin(self) -> None:
        self._start = len(self.statements)
        gc.collect()  # (what the set-up left is not counted)
        self.garbage, self._counting = 0, True

    def end(self) -> None:
        self.window = (self._start, len(self.statements))
        gc.collect()  # (what the window left, until now)
        self._counting = False

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if self._counting and phase == "stop":
            self.garbage += info["collected"]

    def install(self) -> Callable[[], None]:
        execute, executemany = _sqlite.WriterConnection.execute, _sqlite.WriterConnection.executemany
        log = self.statements

        def recorded(run: Callable[..., Any], many: bool) -> Callable[..., Any]:
            def method(conn: Any, sql: str, parameters: Any = (), /) -> Any:
                if many:
                    parameters = list(parameters)  # an iterator would be spent by the run
                try:
                    cursor = run(conn, sql, parameters)
                except sqlite3.Error:
                    log.append((many, sql, parameters, True))
                    raise
                log.append((many, sql, parameters, False))
                return cursor

            return method

        _sqlite.WriterConnection.execute = recorded(execute, False)  # type: ignore[method-assign]
        _sqlite.WriterConnection.executemany = recorded(executemany, True)  # type: ignore[method-assign]
        gc.callbacks.append(self._collected)

        def uninstall() -> None:
            _sqlite.WriterConnection.execute = execute  # type: ignore[method-assign]
            _sqlite.WriterConnection.executemany = executemany  # type: ignore[method-assign]
            gc.callbacks.remove(self._collected)

        return uninstall


def replay(statements: list[Statement], window: tuple[int, int], path: Path) -> tuple[float, int]:
    """Run ``statements`` on a fresh file at ``path`` as the write connection is opened; the seconds the
    ``window`` took, and how many statements that failed in the run succeeded here (should be 0)."""
    conn = sqlite3.connect(
        path, isolation_level=None, check_same_thread=False, cached_statements=_sqlite.STATEMENT_CACHE
    )
    diverged = 0

    def run(part: list[Statement]) -> None:
        nonlocal diverged
        for many, sql, parameters, failed in part:
            try:
                if many:
                    conn.executemany(sql, parameters)
                else:
                    conn.execute(sql, parameters).fetchone()
            except sqlite3.Error:
                if not failed:
                    raise
            else:
                diverged += failed

    try:
        first, last = window
        run(statements[:first])
        start = time.perf_counter()
        run(statements[first:last])
        seconds = time.perf_counter() - start
    finally:
        conn.close()
    return seconds, diverged


async def acceptance(location: str, rec: Recorder, n: int) -> float:
    async with loom.open_runtime(location, clock=loom.SystemClock(), load_entry_points=False) as rt:
        rec.begin()
        start = time.perf_counter()
        await route.publish_all(rt, n, 100, keys=None)
        seconds = time.perf_counter() - start
        rec.end()
        await rt.wait_idle()
    return n / seconds


async def route_100(location: str, rec: Recorder, n: int) -> float:
    consumed = route.Consumption(target=n)
    executor = PythonExecutor()

    @executor.function("noop")
    async def noop(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        consumed.inputs += len(request.inputs)
        if consumed.inputs >= consumed.target:
            consumed.done.set()
        return loom.Completed()

    async with loom.open_runtime(
        location, clock=loom.SystemClock(), config=route.ROUTED, plugins=[executor], load_entry_points=False
    ) as rt:
        rec.begin()
        start = time.perf_counter()
        await route.publish_all(rt, n, 100, keys=100)
        await consumed.done.wait()
        await rt.wait_idle()  # the last attempts' completions have committed
        seconds = time.perf_counter() - start
        rec.end()
    assert consumed.inputs == n, f"attempts took {consumed.inputs} inputs for {n} Events"
    return n / seconds


async def wakes(location: str, rec: Recorder, n: int) -> float:
    jobs = waits.Jobs()
    jobs.target = n
    executor = PythonExecutor()
    executor.register("job", jobs.job)
    async with loom.open_runtime(
        location, config=waits.CONFIG, plugins=[executor], load_entry_points=False
    ) as rt:
        await waits.publish_all(rt, [waits.start(i) for i in range(n)], 100)
        await jobs.all_parked.wait()
        await rt.wait_idle()
        rec.begin()
        start = time.perf_counter()
        await waits.publish_all(rt, [waits.go(i) for i in range(n)], 100)
        await rt.wait_idle()  # every continuation has started (and, no-op, completed)
        seconds = time.perf_counter() - start
        rec.end()
    assert len(jobs.started) == n, f"{len(jobs.started)} of {n} continuations started"
    return n / seconds


async def fired(location: str, rec: Recorder, n: int) -> float:
    clock = loom.ManualClock(start_ms=timers.T0)
    async with loom.open_runtime(location, clock=clock, load_entry_points=False) as rt:
        storage = storage_of(rt)
        for first in range(0, n, timers.ARM_CHUNK):
            await storage.submit(
                timers.arm_many_in_tx, first, min(timers.ARM_CHUNK, n - first), timers.T0 + timers.HOUR_MS
            )
        await storage.submit(timers._noop)
        await trio.testing.wait_all_tasks_blocked()
        assert timer_actor_of(rt).next_due_ms == timers.T0 + timers.HOUR_MS
        rec.begin()
        start = time.perf_counter()
        clock.set(timers.T0 + timers.HOUR_MS)
        await trio.testing.wait_all_tasks_blocked()
        await rt.wait_idle()
        seconds = time.perf_counter() - start
        rec.end()
    timers.check_fired(SQLiteStore(path=location), n)
    return n / seconds


async def recovered(location: str, rec: Recorder, n: int) -> float:
    await recovery.build(location, n, "adopt")
    executor = recovery.Detached(n)
    rec.begin()
    start = time.perf_counter()  # the open is timed, as in recovery.py
    async with loom.open_runtime(
        location,
        clock=loom.ManualClock(start_ms=recovery.T0_MS + recovery.LEASE_MS),
        config=recovery.CONFIG,
        plugins=[executor],
        load_entry_points=False,
        owner="restarted",
    ) as rt:
        await executor.all_through.wait()
        await rt.wait_idle()
        seconds = time.perf_counter() - start
        rec.end()
    assert executor.recovered == n, f"{executor.recovered} of {n} attempts recovered"
    recovery.check(location, n, recovered=True)
    return n / seconds


async def due_jobs(location: str, rec: Recorder, n: int) -> float:
    clock = loom.ManualClock(start_ms=timers.T0)
    executor = PythonExecutor()
    done = trio.Event()
    completed = 0

    @executor.function("done")
    async def job(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        nonlocal completed
        completed += 1
        if completed == n:
            done.set()
        return loom.Completed()

    async with loom.open_runtime(
        location, clock=clock, config=peers.ROUTED, plugins=[executor], load_entry_points=False
    ) as rt:
        for i in range(n):
            due = timers.T0 + timers.HOUR_MS
            await rt.arm(
                loom.TimerSpec(
                    id=f"job-{i}", fire_at_ms=due, source="bench", type="bench.due", scope=peers.SCOPE
                )
            )
        await rt.wait_idle()
        rec.begin()
        start = time.perf_counter()
        clock.set(timers.T0 + timers.HOUR_MS)
        await done.wait()
        await rt.wait_idle()  # every completion has committed
        seconds = time.perf_counter() - start
        rec.end()
    return n / seconds


Workload = Callable[[str, Recorder, int], Awaitable[float]]


def measure(tmp: Path, name: str, path: Workload, n: int) -> tuple[float, float, int, int]:
    """loom's rate on ``path``, the replay's rate of the same statements, the statements timed, and the
    objects the cyclic collector freed in the timed part (`Recorder.garbage`)."""
    rec = Recorder()
    uninstall = rec.install()
    try:
        rate = trio.run(path, str(tmp / f"{name}.db"), rec, n)
    finally:
        uninstall()
    assert rec.window is not None
    seconds, diverged = replay(rec.statements, rec.window, tmp / f"{name}-replay.db")
    assert diverged == 0, f"{name}: {diverged} statements that failed in the run succeeded in the replay"
    first, last = rec.window
    return rate, n / seconds, last - first, rec.garbage


def parser_of(description: str) -> argparse.ArgumentParser:
    """The arguments every script over these paths takes: each path's size, and the directory."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--events", type=int, default=5_000, help="Events of acceptance and route-100")
    parser.add_argument("--wakes", type=int, default=2_000, help="Works parked, then woken")
    parser.add_argument("--timers", type=int, default=20_000, help="timers fired by the timer actor")
    parser.add_argument("--attempts", type=int, default=2_000, help="expired attempts recovered")
    parser.add_argument("--jobs", type=int, default=2_000, help="timers run as jobs of fresh Work")
    parser.add_argument("--dir", default=None, help="where the database files go (default: temp dir)")
    return parser


def paths(args: argparse.Namespace) -> list[tuple[str, Workload, int, str]]:
    """Each path: its name, its workload, how many items (from ``args``), and what an item is."""
    return [
        ("acceptance", acceptance, args.events, "events"),
        ("route-100", route_100, args.events, "events"),
        ("wakes", wakes, args.wakes, "wakes"),
        ("timers", fired, args.timers, "timers"),
        ("recovery", recovered, args.attempts, "attempts"),
        ("due-jobs", due_jobs, args.jobs, "jobs"),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parser_of(__doc__.splitlines()[0]).parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="loom-ceiling-", dir=args.dir))
    try:
        print(
            f"# linux, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, WAL, synchronous=FULL; {tmp}"
        )
        raw_batched = timers.raw_fires(str(tmp / "raw-batch.db"), args.timers, timers.RAW_BATCH, "FULL")
        rates: dict[str, tuple[float, float]] = {}
        for name, path, n, unit in paths(args):
            loom_rate, sql_rate, count, garbage = measure(tmp, name, path, n)
            rates[name] = (loom_rate, sql_rate)
            print(
                f"{name}: loom {loom_rate:,.0f} {unit}/s; its statements replayed alone {sql_rate:,.0f} {unit}/s"
                f" ({count / n:.1f} statements per item); loom/replay {loom_rate / sql_rate:.2f};"
                f" {garbage / n:.2f} objects per item freed by the cyclic collector"
            )
        accept = rates["acceptance"][0]
        for name in ("route-100", "wakes", "recovery"):
            loom_rate, sql_rate = rates[name]
            print(
                f"ratio {name}/acceptance: loom {loom_rate / accept:.2f}; at most {sql_rate / accept:.2f} with these"
                " statements (their replay against loom's acceptance)"
            )
        loom_rate, sql_rate = rates["timers"]
        print(
            f"ratio timers/raw-batched firing writes ({raw_batched:,.0f}/s): loom {loom_rate / raw_batched:.3f};"
            f" at most {sql_rate / raw_batched:.3f} with these statements"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
