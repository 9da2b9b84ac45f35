"""Restart with many expired leases: opening a store and recovering every attempt through its executor,
as a ratio to opening the same store with none expired (docs/recovery.md).

Run from the repository root::

    python bench/recovery.py [--attempts N] [--outcome adopt|relaunch] [--rounds R] [--dir DIR]
                             [--synchronous FULL|NORMAL] [--backend sqlite|postgres] [--url URL]

The store: N Works, each with attempt 1 claimed by a node that is gone (owner ``node-gone``, a 60 s
lease from T0, never renewed). With ``--outcome adopt`` (the default) each attempt was handed to executor
``detached`` with its process handle pinned; the restarted runtime's recovery actor claims it at epoch 2,
the executor's ``recover`` verifies the handle and returns the finished result, which is adopted and
committed under the recovered lease in one transaction (an executor watching a live process would call
`Toolbelt.adopt` first: one request more). With ``--outcome relaunch`` no attempt was handed: each
is relaunched as the same attempt at epoch 2 and the executor's ``launch`` completes it.

Each round measures, back to back:

* durable acceptance alone: N Events matching no route published by 100 producers into a fresh file;
* none expired: a copy of the built store opened with every actor, the business clock (a `ManualClock`)
  at T0 so every lease is live, timed from entering `open_runtime` until `Runtime.wait_idle` returns
  (on a SQLite file the open recovers them at once all the same: its lock proves their holder dead);
* all expired: another copy opened the same way with the clock at T0 + 60 s, so every lease has just
  expired, timed until every attempt went through the executor and `wait_idle` returned (no lease
  expired, every recovered attempt's outcome committed).

With ``--backend postgres`` the stores are fresh databases on the server (bench/backend.py), the copies
databases made with the built one as their template, and each round also measures raw psycopg
commit-per-row inserts on a fresh database: the baseline of acceptance and of recovered attempts/s.

Printed one figure per line; read the ratios, not the absolute times (the machine is shared). Each
store is checked afterwards: untouched when none expired (PostgreSQL); every attempt completed as attempt 1 at
epoch 2, each through the executor, when all expired.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import time
from collections.abc import Mapping
from typing import Any

import attrs
import backend
import pg
import trio

import loom
from loom.kernel.authority import Authority
from loom.kernel.executions import BindingRef, ClaimRequest, claim_in_tx, claim_request
from loom.kernel.recovery import pin_metadata_in_tx
from loom.store import Store, Tx
from loom.testing import raw
from loom.testing.internals import storage_of

SCOPE = "bench"
LEASE_MS = 60_000
T0_MS = 1_767_225_600_000
PRODUCERS = 100
CLAIMS_PER_PROCEDURE = 500
RAW_ROWS = 1_000  # at most, for the raw commit-per-row baseline on PostgreSQL
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
    ``recover`` verifies the handle and returns the finished result; ``launch`` completes at once."""

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


async def acceptance(store: Store, events: int) -> float:
    """Durable acceptance alone: ``events`` Events matching no route published by ``PRODUCERS`` tasks
    into a fresh database with every actor running; events/s."""
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


async def build(store: Store, attempts: int, outcome: str) -> None:
    """The store: ``attempts`` Works, each with attempt 1 claimed for the node that will be gone."""
    clock = loom.ManualClock(start_ms=T0_MS)
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


async def open_until_idle(store: Store, now_ms: int, expect: int) -> tuple[float, Detached, Any]:
    """Seconds from entering `open_runtime` until ``expect`` attempts went through the executor and then
    `wait_idle` returned (their outcomes committed); the storage actor's figures meanwhile."""
    executor = Detached(expect)
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


def check(location: str, attempts: int, recovered: bool) -> None:
    """Untouched (attempt 1 running at epoch 1), or every attempt completed as attempt 1 at epoch 2."""
    rows = [
        (row["state"], row["attempt"], row["epoch"], row["n"])
        for row in raw.query(
            location,
            "SELECT state, attempt, epoch, count(*) AS n FROM executions GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        )
    ]
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
    backend.add_options(parser)
    args = parser.parse_args(argv)
    backend.check_options(parser, args)
    if args.attempts < 1 or args.rounds < 1:
        parser.error("--attempts and --rounds must be at least 1")
    with backend.chosen(args, "loom-bench-") as run:
        report(run, args)
    return 0


@attrs.frozen
class Round:
    """One round's figures, measured back to back."""

    accepted: float
    baseline: float
    recovery: float
    stats: Any
    raw_row: float | None


def one_round(run: backend.Backend, args: argparse.Namespace, built: str, r: int) -> Round:
    """Acceptance alone on a fresh database, then two copies of the built store opened: every lease
    live, then every lease expired; on PostgreSQL first the raw baseline on a fresh database."""
    n = args.attempts
    raw_row = None
    if run.cluster is not None:
        raw_row = pg.raw_commit_per_row(run.cluster.create_database(), min(n, RAW_ROWS))
    accept = run.location(f"accept-{r}.db")
    accepted = trio.run(acceptance, run.open(accept), n)
    live, expired = run.copy(built, f"live-{r}.db"), run.copy(built, f"expired-{r}.db")
    # On a SQLite file the open's lock proves the process that held the leases dead: it recovers them at
    # once, live or not (docs/recovery.md). On PostgreSQL a live lease may be a live node's: it waits.
    expect_live = 0 if run.postgres else n
    baseline, idle, _ = trio.run(open_until_idle, run.open(live), T0_MS, expect_live)
    through_live = idle.recovered if args.outcome == "adopt" else idle.launched
    if run.postgres:
        assert (idle.recovered, idle.launched) == (0, 0), "a live lease was recovered"
    else:
        assert through_live == n, f"the open recovered {through_live} of {n} dead leases at once"
    check(live, n, recovered=not run.postgres)
    elapsed, executor, stats = trio.run(open_until_idle, run.open(expired), T0_MS + LEASE_MS, n)
    through = executor.recovered if args.outcome == "adopt" else executor.launched
    assert through == n, f"{through} of {n} attempts went through the executor"
    check(expired, n, recovered=True)
    for location in (live, expired, accept):
        run.discard(location)
    return Round(accepted, baseline, elapsed, stats, raw_row)


def report(run: backend.Backend, args: argparse.Namespace) -> None:
    """Build the store once, measure every round, print the figures."""
    n = args.attempts
    if run.postgres:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, {run.server()}, outcome={args.outcome}, "
            f"{args.rounds} rounds, fresh databases (the stores opened are copies of the built one); "
            "baseline: raw psycopg commit-per-row inserts measured in each round",
            flush=True,
        )
    else:
        print(
            f"# {sys.platform}, python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
            f"synchronous={args.synchronous}, outcome={args.outcome}, {args.rounds} rounds, databases in {run.tmp}",
            flush=True,
        )
    built = run.location("built.db")
    began = time.perf_counter()
    trio.run(build, run.open(built), n, args.outcome)
    check(built, n, recovered=False)
    print(
        f"building {n:,} claimed attempts (publish, route by the router actor, claim in procedures of {CLAIMS_PER_PROCEDURE}): "
        f"{time.perf_counter() - began:.1f} s",
        flush=True,
    )
    rounds = [one_round(run, args, built, r) for r in range(args.rounds)]
    accepted = [r.accepted for r in rounds]
    baselines = [r.baseline for r in rounds]
    recoveries = [r.recovery for r in rounds]
    stats = rounds[-1].stats
    per_s = [n / t for t in recoveries]
    raw_rates = [r.raw_row for r in rounds if r.raw_row is not None]  # PostgreSQL only
    if raw_rates:
        print(
            f"raw psycopg commit-per-row inserts: {spread(raw_rates, ',.0f')} rows/s ({min(n, RAW_ROWS):,} rows)"
        )
    print(
        f"durable acceptance alone, {PRODUCERS} producers: {spread(accepted, ',.0f')} events/s ({n:,} Events "
        f"matching no route, a fresh {'database' if run.postgres else 'file'}, every actor running)"
    )
    if run.postgres:
        print(f"open with {n:,} live leases (none expired) until idle: {spread(baselines, '.2f')} s")
    else:
        print(
            f"open with {n:,} live leases of a dead process (a SQLite file: recovered at once, the file's "
            f"lock proving the process dead) until idle: {spread(baselines, '.2f')} s"
        )
    print(
        f"open recovering {n:,} expired attempts ({args.outcome} through the executor, outcome committed) "
        f"until idle: {spread(recoveries, '.2f')} s (last round: {stats.requests:,} storage requests in "
        f"{stats.batches:,} commits, {stats.requests / n:.1f} and {stats.batches / n:.1f} per attempt)"
    )
    if run.postgres:
        ratios = [e / b for e, b in zip(recoveries, baselines, strict=True)]
        print(f"ratio recovering/none-expired: {spread(ratios, ',.0f')}")
    print(f"recovered attempts/s: {spread(per_s, ',.0f')}")
    print(
        "ratio recovered-per-s/acceptance-per-s: "
        f"{spread([p / a for p, a in zip(per_s, accepted, strict=True)], '.3f')}"
    )
    if raw_rates:
        print(
            "ratio acceptance/raw-commit-per-row: "
            f"{spread([a / w for a, w in zip(accepted, raw_rates, strict=True)], '.2f')}"
        )
        print(
            "ratio recovered-per-s/raw-commit-per-row: "
            f"{spread([p / w for p, w in zip(per_s, raw_rates, strict=True)], '.3f')}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
