"""One peer's measurement, run by bench/peers.py inside that peer's own environment (never loom's).

Run by bench/peers.py, not by hand::

    <peer venv>/bin/python bench/peer_jobs.py SYSTEM WORKLOAD --db FILE [--n N] [--producers P]
                                             [--lead S] [--spacing-ms MS]

SYSTEM is ``apscheduler``, ``huey`` or ``dbos``; WORKLOAD is ``submit`` (N jobs from P concurrent
producers, each call returning once the job is durable), ``due`` (N jobs due at one moment, from that
moment until the last one's completion is recorded) or ``lateness`` (N jobs due ``--spacing-ms``
apart under no other load, each job's start minus its due time). Every database is the SQLite file
``--db`` in WAL mode with ``synchronous=FULL``. This file imports nothing from loom and only the
standard library besides the peer itself. It prints one JSON object on its last line of output.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

# -- what every system shares ----------------------------------------------------------------------


def prepare_file(path: str) -> None:
    """Make the database file WAL before the peer opens it (the journal mode is kept in the file);
    SQLite's own default ``synchronous`` is FULL on every connection, which each result checks."""
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal"
    finally:
        conn.close()


def file_settings(path: str, synchronous: str) -> str:
    """The journal mode the file is in, and the ``synchronous`` a fresh connection gets (what the peer's
    connections have where ``synchronous`` says the peer sets none)."""
    conn = sqlite3.connect(path)
    try:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        default = conn.execute("PRAGMA synchronous").fetchone()[0]
    finally:
        conn.close()
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={mode}, synchronous={synchronous or names[default] + ' (SQLite default)'}"


def in_threads(producers: int, n: int, submit: Callable[[int], None]) -> float:
    """Call ``submit(i)`` for i in range(n) from ``producers`` threads; seconds from their common start
    until the last call returned."""
    barrier = threading.Barrier(producers + 1)
    errors: list[BaseException] = []

    def produce(first: int) -> None:
        barrier.wait()
        try:
            for i in range(first, n, producers):
                submit(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p,), daemon=True) for p in range(producers)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lateness_result(late_ms: list[float], n: int) -> dict[str, Any]:
    assert len(late_ms) == n, f"{len(late_ms)} of {n} jobs started"
    return {"p50_ms": percentile(late_ms, 0.5), "p99_ms": percentile(late_ms, 0.99), "max_ms": max(late_ms)}


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not done within {timeout:.0f} s")
        time.sleep(0.01)


def due_result(n: int, due_at: float, ready_at: float, last_done: float, **extra: Any) -> dict[str, Any]:
    """The rate from the due moment until the last completion was recorded. ``ready_at``: when every
    job was durable and in its system's schedule; after ``due_at`` the figure would be wrong."""
    if ready_at > due_at:
        return {"overran_s": ready_at - due_at}
    return {
        "rate": n / (last_done - due_at),
        "seconds": last_done - due_at,
        "slack_s": due_at - ready_at,
        **extra,
    }


# -- APScheduler 4: AsyncScheduler with its SQLAlchemy data store on SQLite (aiosqlite) ----------


def apscheduler(args: argparse.Namespace) -> dict[str, Any]:
    return asyncio.run(_apscheduler(args))


async def _apscheduler(args: argparse.Namespace) -> dict[str, Any]:
    from apscheduler import AsyncScheduler, JobReleased, SchedulerRole
    from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
    from apscheduler.triggers.date import DateTrigger
    from sqlalchemy.ext.asyncio import create_async_engine

    prepare_file(args.db)
    engine = create_async_engine(f"sqlite+aiosqlite:///{args.db}")
    store = SQLAlchemyDataStore(engine)
    late_ms: list[float] = []
    done: list[float] = []

    async def job(due: float) -> int:
        if args.workload == "lateness":
            late_ms.append((time.time() - due) * 1000)
        return 1

    job.__qualname__ = job.__name__ = "bench_job"
    role = SchedulerRole.scheduler if args.workload == "submit" else SchedulerRole.both
    n, producers = args.n, args.producers
    try:
        async with AsyncScheduler(store, role=role, max_concurrent_jobs=100, cleanup_interval=None) as sch:
            # One task definition, with no limit on its jobs running at once (the default is 1).
            await sch.configure_task("bench_job", func=job, max_running_jobs=None)
            if args.workload == "submit":

                async def produce(first: int) -> None:
                    for _ in range(first, n, producers):
                        await sch.add_job("bench_job", args=(None,))

                start = time.perf_counter()
                async with asyncio.TaskGroup() as tg:
                    for p in range(producers):
                        tg.create_task(produce(p))
                elapsed = time.perf_counter() - start
                assert len(await sch.get_jobs()) == n
                return {"rate": n / elapsed, "settings": file_settings(args.db, "")}

            sch.subscribe(lambda event: done.append(time.time()), JobReleased, is_async=False)
            due_at = time.time() + args.lead

            def due_of(i: int) -> float:
                return due_at if args.workload == "due" else due_at + i * args.spacing_ms / 1000

            async def schedule(first: int) -> None:
                for i in range(first, n, producers):
                    at = datetime.fromtimestamp(due_of(i), UTC)
                    await sch.add_schedule("bench_job", DateTrigger(at), args=(due_of(i),))

            async with asyncio.TaskGroup() as tg:
                for p in range(producers):
                    tg.create_task(schedule(p))
            ready_at = time.time()
            await sch.start_in_background()
            while len(done) < n:
                await asyncio.sleep(0.01)
                if time.time() > due_of(n - 1) + args.timeout:
                    raise TimeoutError(f"{len(done)} of {n} jobs done within {args.timeout:.0f} s")
            await sch.stop()
    finally:
        await engine.dispose()
    if args.workload == "lateness":
        return lateness_result(late_ms, n)
    return due_result(n, due_at, ready_at, max(done), settings=file_settings(args.db, ""))


# -- Huey: SqliteHuey, its consumer's threads in this process ---------------------------------------


def huey(args: argparse.Namespace) -> dict[str, Any]:
    from huey import SqliteHuey, signals

    prepare_file(args.db)
    queue = SqliteHuey("bench", filename=args.db, fsync=True)  # fsync=True: synchronous=FULL
    late_ms: list[float] = []
    done: list[float] = []

    @queue.task()
    def job(due: float | None) -> int:
        if args.workload == "lateness" and due is not None:
            late_ms.append((time.time() - due) * 1000)
        return 1  # a result: the completion is recorded in the result store

    @queue.signal(signals.SIGNAL_COMPLETE)
    def completed(signal: str, task: Any) -> None:
        done.append(time.time())

    n, producers = args.n, args.producers
    if args.workload == "submit":
        elapsed = in_threads(producers, n, lambda i: job(None))
        assert queue.pending_count() == n
        return {"rate": n / elapsed, "settings": file_settings(args.db, "FULL (fsync=True)")}

    consumer = queue.create_consumer(workers=args.workers, worker_type="thread", periodic=False)
    consumer.start()
    try:
        due_at = time.time() + args.lead

        def due_of(i: int) -> float:
            return due_at if args.workload == "due" else due_at + i * args.spacing_ms / 1000

        started = time.time()
        in_threads(
            producers,
            n,
            lambda i: job.schedule(args=(due_of(i),), eta=datetime.fromtimestamp(due_of(i), UTC)),
        )
        # A task enqueued with an eta goes to the queue, and a worker that takes it moves it to the
        # schedule: ready once all are there. From the due moment on, the scheduler moves them back, so
        # the count is read no later than that; short of n, the lead was too short (how much short: at
        # the rate they were moved so far), and bench/peers.py runs it again with a longer one.
        wait_for(lambda: queue.scheduled_count() == n or time.time() >= due_at, args.lead + 60, "scheduling")
        moved = queue.scheduled_count()
        if moved < n:
            return {"overran_s": (n - moved) * (time.time() - started) / max(moved, 1)}
        ready_at = time.time()
        wait_for(lambda: len(done) >= n, due_of(n - 1) - time.time() + args.timeout, "running")
    finally:
        consumer.stop(graceful=True)
    if args.workload == "lateness":
        return lateness_result(late_ms, n)
    return due_result(n, due_at, ready_at, max(done), settings=file_settings(args.db, "FULL (fsync=True)"))


# -- DBOS: workflows on a queue, SQLite system database ----------------------------------------------


def dbos(args: argparse.Namespace) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig, SetEnqueueOptions

    prepare_file(args.db)
    late_ms: list[float] = []
    config: DBOSConfig = {"name": "loom-bench", "system_database_url": f"sqlite:///{args.db}"}
    config["log_level"] = "WARNING"
    DBOS(config=config)

    @DBOS.workflow()
    def job(due: float | None) -> int:
        if args.workload == "lateness" and due is not None:
            late_ms.append((time.time() - due) * 1000)
        return 1

    n, producers = args.n, args.producers
    if args.workload == "submit":
        DBOS.listen_queues([])  # nothing dequeues while producers enqueue
    DBOS.launch()
    try:
        DBOS.register_queue("bench", polling_interval_sec=args.dbos_poll)

        def status_count(status: str) -> int:
            conn = sqlite3.connect(args.db)
            try:
                return int(
                    conn.execute(
                        "SELECT count(*) FROM workflow_status WHERE queue_name = 'bench' AND status = ?",
                        (status,),
                    ).fetchone()[0]
                )
            finally:
                conn.close()

        if args.workload == "submit":
            elapsed = in_threads(producers, n, lambda i: DBOS.enqueue_workflow("bench", job, None))
            assert status_count("ENQUEUED") == n, status_count("ENQUEUED")
            return {"rate": n / elapsed, "settings": file_settings(args.db, "")}

        due_at = time.time() + args.lead

        def due_of(i: int) -> float:
            return due_at if args.workload == "due" else due_at + i * args.spacing_ms / 1000

        def enqueue(i: int) -> None:
            with SetEnqueueOptions(delay_seconds=due_of(i) - time.time()):
                DBOS.enqueue_workflow("bench", job, due_of(i))

        in_threads(producers, n, enqueue)
        ready_at = time.time()
        wait_for(
            lambda: status_count("SUCCESS") >= n,
            due_of(n - 1) - time.time() + args.timeout,
            "running",
        )
        conn = sqlite3.connect(args.db)
        try:
            # the status row's own time of its last update: when SUCCESS was recorded
            (last_ms,) = conn.execute(
                "SELECT max(updated_at) FROM workflow_status WHERE queue_name = 'bench'"
            ).fetchone()
        finally:
            conn.close()
    finally:
        DBOS.destroy(destroy_registry=True)
    if args.workload == "lateness":
        return lateness_result(late_ms, n)
    return due_result(n, due_at, ready_at, last_ms / 1000, settings=file_settings(args.db, ""))


SYSTEMS = {"apscheduler": apscheduler, "huey": huey, "dbos": dbos}
# What each system's measurements import, and the distributions whose versions the report names.
NEEDS = {
    "apscheduler": (
        ("apscheduler", "apscheduler.datastores.sqlalchemy", "sqlalchemy.ext.asyncio", "aiosqlite"),
        ("apscheduler", "sqlalchemy", "aiosqlite"),
    ),
    "huey": (("huey",), ("huey",)),
    "dbos": (("dbos",), ("dbos", "sqlalchemy")),
}


def versions(system: str) -> dict[str, Any]:
    """Import what ``system``'s measurements need (an ImportError says what is missing)."""
    modules, distributions = NEEDS[system]
    for module in modules:
        importlib.import_module(module)
    return {"versions": {name: metadata.version(name) for name in distributions}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("workload", choices=["submit", "due", "lateness", "version"])
    parser.add_argument("--db", default=":memory:")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--producers", type=int, default=100)
    parser.add_argument("--lead", type=float, default=5.0, help="seconds from now to the (first) due time")
    parser.add_argument("--spacing-ms", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds past the last due time")
    parser.add_argument("--workers", type=int, default=8, help="Huey consumer worker threads")
    parser.add_argument("--dbos-poll", type=float, default=1.0, help="DBOS queue polling interval (s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    if args.workload == "version":
        result = versions(args.system)
    else:
        result = SYSTEMS[args.system](args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
