"""Crash points through admission (docs/testing.md "Crash points"; docs/architecture.md "Admission").

Six Works become ready in one scope whose capacity is 2 (a seventh in a scope with no capacity), and a
host drives them with the admission pass alone: `Runtime.poll` routes, `Runtime.admit` starts what the
pool allows, each lease completes, until every Work is done. The storage actor is stopped just before
or just after the commit of every batch of that sequence (counted in a dry run), and a fresh runtime
on the store finishes the drive from what the store says (the crashed host's leases, forgotten with
it, expire and are recovered). Checked from the database after the crash and at the end:

* nothing acknowledged lost: every acknowledged Event is stored once;
* capacity holds: at no point do more than two attempts of the pool run (or recover) at once;
* readiness order within the pool: attempts start in the order their Works became ready (the queue's
  order survives the crash: it is durable, not rebuilt);
* no Work passed over for good: every Work ends completed, each by one attempt (recovery relaunches
  an attempt never handed to an executor as the same attempt), and no Work stays blocked.

Catches: a ready queue rebuilt in another order after a restart, a freed slot whose waiting Work is
not let back in when the crash falls between the completion and the unblocking (the drive stalls), a
queue place lost with a rolled-back pass, and capacity counted outside the claim's transaction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from loom import Completed, Config, EventIn, ManualClock, Runtime, StorageClosed, open_runtime
from loom.store import FaultHook
from loom.testing import T0_MS, raw
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint

FreshStore = Callable[[str], str]
LEASE = 30_000
POOLED = [f"p/{i}" for i in range(6)]
FREE = "f/0"
CONFIG = Config.from_dict(
    {
        "scopes": {
            "shop": {
                "capacity": 2,
                "routes": [{"name": "orders", "types": ["order.*"], "create_work": True}],
            },
            "free": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]},
        }
    }
)


@asynccontextmanager
async def runtime(store: str, clock: ManualClock, fault: FaultHook | None = None) -> AsyncIterator[Runtime]:
    async with open_runtime(
        store,
        clock=clock,
        config=CONFIG,
        load_entry_points=False,
        fault=fault,
        actors=(),
        owner="host",
        lease_ms=LEASE,
    ) as rt:
        yield rt


def check(store: str, acked: set[str]) -> None:
    with raw.snapshot(store) as db:
        stored = db.query("SELECT delivery_id FROM events WHERE source = 'shop'")
        running = db.value(
            "SELECT count(*) FROM executions x JOIN works w ON w.id = x.work_id"
            " WHERE w.scope = 'shop' AND x.state IN ('running', 'stopping', 'recovering')"
        )
    ids = [row["delivery_id"] for row in stored]
    assert len(ids) == len(set(ids)), f"an Event stored twice: {sorted(ids)}"
    assert acked <= set(ids), f"acknowledged and lost: {acked - set(ids)}"
    assert running <= 2, f"{running} attempts of a pool of capacity 2 run at once"


async def drive(rt: Runtime, store: str, clock: ManualClock, acked: set[str]) -> None:
    """Publish what is not stored yet, then route, start and complete until every Work is done."""
    with raw.snapshot(store) as db:
        stored = {row["delivery_id"] for row in db.query("SELECT delivery_id FROM events")}
    for key in [*POOLED, FREE]:
        if key not in stored:
            scope = "shop" if key.startswith("p/") else "free"
            event = await rt.publish(
                EventIn(source="shop", delivery_id=key, type="order.placed", scope=scope, key=key)
            )
            acked.add(event.delivery_id)
            await rt.poll()  # routed (ready) before the next one: readiness order is key order
    for _ in range(100):
        for recovery in (await rt.poll()).recoveries:
            # an attempt the crashed host held: the same attempt goes on here
            lease = recovery.lease if recovery.relaunch else await rt.adopt(recovery.lease)
            await rt.complete(lease, Completed())
        for lease in await rt.admit(limit=10, owner="host"):
            check(store, acked)
            await rt.complete(lease, Completed())
        works = await rt.works(limit=100)
        if len(works) == 7 and all(w.state.terminal for w in works):
            return
        clock.advance(LEASE)  # leases a crashed host held expire, and recovery takes them
    with raw.snapshot(store) as db:
        works = db.query("SELECT scope, state, held, retry, attempts, ready_seq, blocked FROM works")
        attempts = db.query(
            "SELECT work_id, attempt, epoch, state, pool, owner, expires_at_ms FROM executions"
        )
    raise AssertionError(f"the drive did not finish: {works} {attempts} at {clock.now_ms()}")


async def run(store: str, clock: ManualClock, acked: set[str], fault: FaultHook | None) -> None:
    async with runtime(store, clock, fault) as rt:
        await drive(rt, store, clock, acked)


def finished(store: str, acked: set[str]) -> None:
    check(store, acked)
    with raw.snapshot(store) as db:
        works = db.query("SELECT id, state, attempts, blocked, ready_seq FROM works ORDER BY id")
        started = db.query(
            "SELECT k.key FROM executions x JOIN work_keys k ON k.work_id = x.work_id"
            " WHERE k.key LIKE 'p/%' ORDER BY x.created_at_ms, k.key"
        )
    assert [w["state"] for w in works] == ["completed"] * 7, works
    assert all(w["attempts"] == 1 for w in works), f"a Work ran more than one attempt: {works}"
    assert all(w["blocked"] is None and w["ready_seq"] is None for w in works), works
    assert [row["key"] for row in started] == POOLED, "the pool started its Works in readiness order"


def crashed_only(exc: BaseException) -> bool:
    """The runtime stopped with `CrashPoint`; anything else is a caller told `StorageClosed`."""
    if not isinstance(exc, BaseExceptionGroup):
        return isinstance(exc, CrashPoint)
    crash, rest = exc.split(CrashPoint)
    if rest is not None:
        _, unexpected = rest.split(StorageClosed)
        if unexpected is not None:
            raise unexpected
    return crash is not None


async def count_batches(store: str) -> int:
    seen: list[int] = []

    def counter(point: str, batch_no: int) -> None:
        if point == "after_commit":
            seen.append(batch_no)

    clock = ManualClock(start_ms=T0_MS)
    acked: set[str] = set()
    await run(store, clock, acked, counter)
    finished(store, acked)
    return max(seen)


@pytest.mark.parametrize("boundary", [BEFORE_COMMIT, AFTER_COMMIT])
async def test_a_crash_at_any_commit_of_admission_loses_no_place_and_no_slot(
    fresh_store: FreshStore, durable_backend: str, boundary: Boundary
) -> None:
    batches = await count_batches(fresh_store("dry"))
    # every boundary on a file; on PostgreSQL (a database per point, a round trip per statement) every
    # seventh, which still crosses every kind of batch the drive commits
    points = range(1, batches + 1) if durable_backend == "file" else range(1, batches + 1, 7)
    for batch in points:
        store = fresh_store(f"crash-{boundary}-{batch}")
        clock = ManualClock(start_ms=T0_MS)
        acked: set[str] = set()
        crash = CrashAt(boundary, batch)
        with pytest.raises(BaseException) as stopped:  # noqa: PT011 - checked just below
            await run(store, clock, acked, crash)
        assert crashed_only(stopped.value), stopped.value
        assert crash.fired, f"batch {batch} of {batches} never ran"
        check(store, acked)
        await run(store, clock, acked, None)
        finished(store, acked)
