"""A random mixed workload through a whole runtime: what every transaction kept or was told answers as
a read would, and the store holds together at the end.

Each example opens a runtime on a fresh file with a `ManualClock` and one route that creates a Work per
key (a kind that retries with backoff and reopens a finished Work's key), whose python function answers
at random: complete, fail, hand off, wait on ``go.*`` (with or without a timeout) or emit an Event on its
key. Steps then run a few operations at once, so that they share a storage batch: publishes (some are
redeliveries), holds, releases, cancels and retry requests on random Works (many refused: a batch with a
refused request runs again guarded), timers armed on the route's types, the clock moved (timers, wait
timeouts, retries due), compaction sweeps with retention of a second. conftest's checks compare every
record a transaction answers from what it or an earlier commit kept (a Work, its place and facts, an
attempt, pending inputs, owners, routed inputs ...) with a read, at every answer; a mismatch fails the
request that met it, and any request failed by an `AssertionError` (a check's, or one of loom's own)
fails the test, wherever the actor that sent it contained the failure. Once idle, the store must hold:

* every acknowledged Event stored once (or, once compacted, its tombstone), and every stored Event
  routed (its checkpoint);
* at most one live attempt per Work, and a running Work's attempt running;
* at most one open wait per Work, and every woken wait naming its winner and bridge Event.

Wrong implementations this catches (each put in and seen to fail): a commit that carries a Work's
records although a transaction wrote the Work (the next routing decides on the stale Work); a
savepoint's rollback (a refused request in a guarded batch) that keeps what the request told.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import loom
from loom.plugins.python_executor import PythonExecutor
from loom.store import StorageActor
from loom.store._batch import Request
from loom.testing import T0_MS, raw

SCOPE = "s"
KEYS = 12
STEPS = 300
CONFIG = loom.Config.from_dict(
    {
        "work_kinds": {"k": {"retry_attempts": 3, "retry_backoff_ms": [1000, 2000], "reopen": True}},
        "scopes": {
            SCOPE: {
                "capacity": 3,
                "bindings": {"py": {"executor": "python", "config": {"function": "job"}}},
                "routes": [
                    {
                        "name": "jobs",
                        "types": ["job.*", "go.*"],
                        "create_work": True,
                        "binding": "py",
                        "work_kind": "k",
                    }
                ],
                "retention": {"works": "1s", "events": "1s", "timers": "1s"},
            }
        },
    }
)
LIVE = "('running', 'stopping', 'parked', 'recovering')"


def executor(rng: random.Random) -> PythonExecutor:
    python = PythonExecutor()

    @python.function("job")
    async def job(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        await trio.lowlevel.checkpoint()
        r = rng.random()
        if r < 0.08:
            return loom.Completed(value={"attempt": request.attempt})
        if r < 0.25:
            return loom.Failed(error="a failure the workload chose")
        if r < 0.55:
            return loom.Handoff()
        if r < 0.88:
            timeout = rng.choice([None, 500, 3000])
            return loom.Waiting(wait=loom.WaitSpec(types=("go.*",), timeout_ms=timeout))
        key = request.trigger.key if request.trigger is not None else None
        emitted = loom.EventIn(
            source="work",
            delivery_id=f"emit-{request.execution_id}",
            type="job.emitted",
            scope=SCOPE,
            key=key,
        )
        await toolbelt.emit(emitted)
        return loom.Completed()

    return python


def failed_assertions(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Every `AssertionError` a request's procedure raised, from here on (the storage actor answers it
    to the request's sender, which may contain it: an actor logs what its item failed with)."""
    failed: list[BaseException] = []
    execute = StorageActor._execute_until_settled

    def recorded(self: StorageActor, batch: list[Request], *args: Any) -> Any:
        try:
            return execute(self, batch, *args)
        finally:
            failed.extend(r.error for r in batch if isinstance(r.error, AssertionError))

    monkeypatch.setattr(StorageActor, "_execute_until_settled", recorded)
    return failed


@pytest.mark.parametrize("seed", range(3))
async def test_a_random_mixed_workload_keeps_every_record_true_and_the_store_whole(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = failed_assertions(monkeypatch)
    rng = random.Random(seed)
    clock = loom.ManualClock(start_ms=T0_MS)
    db = str(tmp_path / "mixed.db")
    acknowledged: dict[tuple[str, str], str] = {}
    published = 0
    async with loom.open_runtime(
        db, clock=clock, config=CONFIG, plugins=[executor(rng)], load_entry_points=False
    ) as rt:

        async def publish(key: str) -> None:
            nonlocal published
            published += 1
            delivery = f"d{rng.randrange(published + 1)}"  # (often one used before: a redelivery)
            kind = rng.choice(["job.a", "go.b"])
            offered = loom.EventIn(source="t", delivery_id=delivery, type=kind, scope=SCOPE, key=key)
            event = await rt.publish(offered)
            acknowledged.setdefault(("t", delivery), event.id)

        async def control(work_id: str) -> None:
            change: list[Callable[[], Awaitable[object]]] = [
                lambda: rt.hold(work_id, reason="held by the workload"),
                lambda: rt.release(work_id),
                lambda: rt.cancel(work_id),
                lambda: rt.retry(work_id),
            ]
            await rng.choice(change)()

        async def arm(step: int, key: str) -> None:
            due = clock.now_ms() + rng.choice([100, 2000])
            kind = rng.choice(["job.t", "go.t"])
            await rt.arm(
                loom.TimerSpec(id=f"t{step}", fire_at_ms=due, source="tm", type=kind, scope=SCOPE, key=key)
            )

        async def refused_or_done(op: Callable[[], Awaitable[None]]) -> None:
            try:
                await op()
            except loom.LoomError:
                pass  # a control on a finished, removed or running Work: refused, nothing changed

        for step in range(STEPS):
            works = [w.id for w in await rt.works()]
            async with trio.open_nursery() as nursery:
                for _ in range(rng.randint(1, 5)):
                    key = f"k{rng.randrange(KEYS)}"
                    op = rng.random()
                    if op < 0.6:
                        nursery.start_soon(refused_or_done, partial(publish, key))
                    elif op < 0.8 and works:
                        nursery.start_soon(refused_or_done, partial(control, rng.choice(works)))
                    elif op < 0.9:
                        nursery.start_soon(refused_or_done, partial(arm, step, key))
                    else:
                        nursery.start_soon(refused_or_done, rt.compact)
            if rng.random() < 0.3:
                clock.advance(rng.choice([10, 300, 1200, 5000]))
            await trio.testing.wait_all_tasks_blocked()
        await rt.wait_idle()
        assert sum(w.attempts for w in await rt.works()) > 0
    assert not failed, f"{len(failed)} requests failed an assertion, the first: {failed[0]}"

    events = {(r["source"], r["delivery_id"]): r["id"] for r in raw.query(db, "SELECT * FROM events")}
    tombstones = {(r["source"], r["delivery_id"]) for r in raw.query(db, "SELECT * FROM event_tombstones")}
    for delivery, event_id in acknowledged.items():
        assert events.get(delivery) == event_id or delivery in tombstones, f"acknowledged {delivery} was lost"
    unrouted = raw.query(
        db, "SELECT e.id FROM events e WHERE NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.seq = e.seq)"
    )
    assert not unrouted, f"events left without a routing checkpoint: {unrouted[:3]}"
    live = raw.query(
        db,
        f"SELECT work_id, count(*) AS n FROM executions WHERE state IN {LIVE} GROUP BY work_id HAVING n > 1",
    )
    assert not live, f"Works with more than one live attempt: {live}"
    running = raw.query(
        db,
        "SELECT w.id FROM works w WHERE w.state = 'running' AND NOT EXISTS"
        " (SELECT 1 FROM executions x WHERE x.work_id = w.id AND x.state IN ('running', 'stopping', 'recovering'))",
    )
    assert not running, f"running Works without a running attempt: {running}"
    waits = raw.query(
        db,
        "SELECT work_id, count(*) AS n FROM waits WHERE state IN ('active', 'blocked') GROUP BY work_id HAVING n > 1",
    )
    assert not waits, f"Works with more than one open wait: {waits}"
    woken = raw.query(
        db,
        "SELECT id FROM waits WHERE state = 'woken' AND (winner_event_id IS NULL OR bridge_event_id IS NULL)",
    )
    assert not woken, f"woken waits without their winner or bridge: {woken}"
