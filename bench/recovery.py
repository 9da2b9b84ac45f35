"""Restart with many expired leases: opening a store and recovering every attempt through its executor,
as a ratio to opening the same store with none expired (docs/recovery.md).

Run from the repository root::

    python bench/recovery.py [--attempts N] [--outcome adopt|relaunch] [--rounds R] [--dir DIR]
                             [--synchronous FULL|NORMAL]

The store: N Works, each with attempt 1 claimed by a node that is gone (owner ``node-gone``, a 60 s
lease from T0, never renewed). With ``--outcome adopt`` (the default) each attempt was handed to executor
``detached`` with its process handle pinned; the restarted runtime's recovery actor claims it at epoch 2,
the executor's ``recover`` verifies the handle, adopts (`Toolbelt.adopt`) and returns the finished
result, which commits under the recovered lease. With ``--outcome relaunch`` no attempt was handed: each
is relaunched as the same attempt at epoch 2 and the executor's ``launch`` completes it.

Each round measures, back to back:

* durable acceptance alone: N Events matching no route published by 100 producers into a fresh file;
* none expired: a copy of the built store opened with every actor, the business clock (a `ManualClock`)
  at T0 so every lease is live, timed from entering `open_runtime` until `Runtime.wait_idle` returns;
* all expired: another copy opened the same way with the clock at T0 + 60 s, so every lease has just
  expired, timed until every attempt went through the executor and `wait_idle` returned (no lease
  expired, every recovered attempt's outcome committed).

Printed one figure per line; read the ratios, not the absolute times (the machine is shared). Each
store is checked afterwards: untouched when none expired; every attempt completed as attempt 1 at
epoch 2, each through the executor, when all expired.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

import loom
from loom.kernel.authority import Authority
from loom.kernel.executions import BindingRef, ClaimRequest, claim_in_tx, claim_request
from loom.kernel.recovery import pin_metadata_in_tx
from loom.store import SQLiteStore, Tx
from loom.testing.internals import storage_of

SCOPE = "bench"
LEASE_MS = 60_000
T0_MS = 1_767_225_600_000
PRODUCERS = 100
CLAIMS_PER_PROCEDURE = 500
BINDING = BindingRef(name="detached", executor="detached")
ROUTE: dict[str, Any] = {"name": "jobs", "types": ["job.*"], "create_work": True}
CONFIG = loom.Config.from_dict(
    {
        "scopes": {
            SCOPE: {
                "bindings": {"detached": {"executor": "detached"}},
                "routes": [{**ROUTE, "binding": "detached"}],
            }
        }
    }
)
BUILD_CONFIG = loom.Config.from_dict({"scopes": {SCOPE: {"routes": [ROUTE]}}})
"""While building: the same Works, routed by the router actor, but with no binding nothing starts them."""


class Detached:
    """Executor ``detached``: a detached process per attempt, named by the handle pinned with its segment.
    ``recover`` verifies the handle, adopts and returns the finished result; ``launch`` completes at once."""

    capabilities = frozenset[str]()

    def __init__(self, expect: int = 0) -> None:
        self.recovered = 0
        self.launched = 0
        self.expect = expect
        self.all_through = trio.Event()
        """Set once ``expect`` attempts went through ``recover`` or ``launch``."""

    def _through(self) -> None:
        if self.recovered + self.launched == self.expect:
            self.all_through.set()

    @loom.hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        return {"detached": self}

    async def launch(self, request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        self.launched += 1
        self._through()
        return loom.Completed()

    async def recover(
        self, request: loom.RunRequest, toolbelt: loom.Toolbelt, metadata: Mapping[str, Any]
    ) -> loom.Outcome:
        if metadata.get("handle") != request.execution_id:
            raise loom.NotAdoptable(f"no process with handle {metadata.get('handle')!r}")
        await toolbelt.adopt()
        self.recovered += 1
        self._through()
        return loom.Completed()

    async def inject(self, execution_id: str, event: loom.Event) -> None:
        raise loom.NotAccepting(f"execution {execution_id} takes no input")

    async def interrupt(self, execution_id: str) -> None:
        pass


def claim_all_in_tx(tx: Tx, now_ms: int, requests: list[ClaimRequest], pin: bool) -> None:
    """Claim attempt 1 of each Work for the node that will be gone (and pin its process handle)."""
    for request in requests:
        lease = claim_in_tx(tx, now_ms, request)
        if pin:
            pin_metadata_in_tx(tx, now_ms, Authority.of(lease), {"handle": lease.execution_id})


async def publish_all(rt: loom.Runtime, events: list[loom.EventIn]) -> None:
    queue = iter(events)

    async def producer() -> None:
        for event in queue:
            await rt.publish(event)

    async with trio.open_nursery() as nursery:
        for _ in range(PRODUCERS):
            nursery.start_soon(producer)


async def acceptance(path: Path, events: int, synchronous: str) -> float:
    """Durable acceptance alone: ``events`` Events matching no route published by ``PRODUCERS`` tasks
    into a fresh file with every actor running; events/s."""
    store = SQLiteStore(path=str(path), synchronous=synchronous)
    async with loom.open_runtime(
        store,
        clock=loom.ManualClock(start_ms=T0_MS),
        config=CONFIG,
        plugins=[Detached()],
        load_entry_points=False,
    ) as rt:
        began = time.perf_counter()
        await publish_all(
            rt,
            [
                loom.EventIn(source="bench", delivery_id=f"a-{i}", type="other", scope=SCOPE)
                for i in range(events)
            ],
        )
        return events / (time.perf_counter() - began)


async def build(path: Path, attempts: int, outcome: str, synchronous: str) -> None:
    """The store: ``attempts`` Works, each with attempt 1 claimed for the node that will be gone."""
    clock = loom.ManualClock(start_ms=T0_MS)
    store = SQLiteStore(path=str(path), synchronous=synchronous)
    async with loom.open_runtime(
        store,
        clock=clock,
        config=BUILD_CONFIG,
        plugins=[Detached()],
        load_entry_points=False,
        actors=("router",),
    ) as rt:
        await publish_all(
            rt,
            [
                loom.EventIn(
                    source="bench", delivery_id=f"job-{i}", type="job.start", scope=SCOPE, key=f"job/{i}"
                )
                for i in range(attempts)
            ],
        )
        await rt.wait_idle()  # every Event routed to its Work
        works: list[loom.Work] = []
        while page := await rt.works(after_id=works[-1].id if works else "", limit=1_000):
            works += page
        assert len(works) == attempts, f"{len(works)} Works for {attempts} Events"
        for first in range(0, attempts, CLAIMS_PER_PROCEDURE):
            requests = [
                claim_request(
                    rt.config,
                    work,
                    owner="node-gone",
                    token=f"t-{work.id}",
                    lease_ms=LEASE_MS,
                    binding=BINDING,
                    handed=outcome == "adopt",
                )
                for work in works[first : first + CLAIMS_PER_PROCEDURE]
            ]
            await storage_of(rt).submit(claim_all_in_tx, requests, outcome == "adopt")


async def open_until_idle(
    path: Path, now_ms: int, synchronous: str, expect: int
) -> tuple[float, Detached, Any]:
    """Seconds from entering `open_runtime` until ``expect`` attempts went through the executor and then
    `wait_idle` returned (their outcomes committed); the storage actor's figures meanwhile."""
    executor = Detached(expect)
    store = SQLiteStore(path=str(path), synchronous=synchronous)
    began = time.perf_counter()
    async with loom.open_runtime(
        store,
        clock=loom.ManualClock(start_ms=now_ms),
        config=CONFIG,
        plugins=[executor],
        load_entry_points=False,
        owner="restarted",
    ) as rt:
        if expect:
            await executor.all_through.wait()
        await rt.wait_idle()
        elapsed = time.perf_counter() - began
        stats = attrs.evolve(storage_of(rt).stats)
    return elapsed, executor, stats


def check(path: Path, attempts: int, recovered: bool) -> None:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT state, attempt, epoch, count(*) FROM executions GROUP BY 1, 2, 3"
        ).fetchall()
    finally:
        conn.close()
    expected = [("completed", 1, 2, attempts)] if recovered else [("running", 1, 1, attempts)]
    assert rows == expected, f"executions by (state, attempt, epoch): {rows}, expected {expected}"


def spread(values: list[float], fmt: str) -> str:
    middle = format(statistics.median(values), fmt)
    if len(values) == 1:
        return middle
    return f"{middle} (rounds: {format(min(values), fmt)} to {format(max(values), fmt)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=10_000, help="expired attempts (default 10000)")
    parser.add_argument(
        "--outcome",
        choices=["adopt", "relaunch"],
        default="adopt",
        help="adopt: recovered through the executor's recover; relaunch: never handed, launched again",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="measure each figure this many times (default 3)"
    )
    parser.add_argument("--dir", default=None, help="put the temporary database directory here")
    parser.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    args = parser.parse_args(argv)
    if args.attempts < 1 or args.rounds < 1:
        parser.error("--attempts and --rounds must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-", dir=args.dir))
    n = args.attempts
    try:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
            f"synchronous={args.synchronous}, outcome={args.outcome}, {args.rounds} rounds, databases in {tmp}",
            flush=True,
        )
        built = tmp / "built.db"
        began = time.perf_counter()
        trio.run(build, built, n, args.outcome, args.synchronous)
        check(built, n, recovered=False)
        print(
            f"building {n:,} claimed attempts (publish, route by the router actor, claim in procedures of {CLAIMS_PER_PROCEDURE}): "
            f"{time.perf_counter() - began:.1f} s",
            flush=True,
        )
        baselines: list[float] = []
        recoveries: list[float] = []
        accepted: list[float] = []
        for r in range(args.rounds):
            accepted.append(trio.run(acceptance, tmp / f"accept-{r}.db", n, args.synchronous))
            live, expired = tmp / f"live-{r}.db", tmp / f"expired-{r}.db"
            shutil.copy(built, live)
            shutil.copy(built, expired)
            baseline, idle, _ = trio.run(open_until_idle, live, T0_MS, args.synchronous, 0)
            assert (idle.recovered, idle.launched) == (0, 0), "a live lease was recovered"
            check(live, n, recovered=False)
            elapsed, executor, stats = trio.run(
                open_until_idle, expired, T0_MS + LEASE_MS, args.synchronous, n
            )
            through = executor.recovered if args.outcome == "adopt" else executor.launched
            assert through == n, f"{through} of {n} attempts went through the executor"
            check(expired, n, recovered=True)
            baselines.append(baseline)
            recoveries.append(elapsed)
            for path in (live, expired, tmp / f"accept-{r}.db"):
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
        per_s = [n / t for t in recoveries]
        print(
            f"durable acceptance alone, {PRODUCERS} producers: {spread(accepted, ',.0f')} events/s ({n:,} Events "
            "matching no route, a fresh file, every actor running)"
        )
        print(f"open with {n:,} live leases (none expired) until idle: {spread(baselines, '.2f')} s")
        print(
            f"open recovering {n:,} expired attempts ({args.outcome} through the executor, outcome committed) "
            f"until idle: {spread(recoveries, '.2f')} s (last round: {stats.requests:,} storage requests in "
            f"{stats.batches:,} commits, {stats.requests / n:.1f} and {stats.batches / n:.1f} per attempt)"
        )
        ratios = [e / b for e, b in zip(recoveries, baselines, strict=True)]
        print(f"ratio recovering/none-expired: {spread(ratios, ',.0f')}")
        print(f"recovered attempts/s: {spread(per_s, ',.0f')}")
        print(
            "ratio recovered-per-s/acceptance-per-s: "
            f"{spread([p / a for p, a in zip(per_s, accepted, strict=True)], '.3f')}"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
