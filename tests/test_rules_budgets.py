"""Rules of budgets that count turns and attempts, and of the Events a ledger announces (docs/recovery.md,
"Budgets"): what a resumed turn and a new attempt charge, that an attempts budget holds the Work, and
that the warning and limit Events come once per ledger, each one of them. A host drives the runtime by
hand (``actors=()``). Each test names the rule and the wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from loom import (
    Completed,
    Config,
    Conflict,
    Event,
    EventIn,
    Lease,
    ManualClock,
    Runtime,
    Waiting,
    WaitSpec,
    open_runtime,
)
from loom.kernel.executions import BindingRef
from loom.plugins.handlers import work_id_for_key

SCOPE = "acme"
RESUMABLE = BindingRef(name=None, executor=None, capabilities=frozenset({"resume"}))


def budget(name: str, limit: float, **more: Any) -> dict[str, Any]:
    return {"name": name, "unit": name, "limit": limit, **more}


@pytest.fixture
def budgets() -> list[dict[str, Any]]:
    return [budget("turns", 100), budget("attempts", 100)]


@pytest.fixture
def standing() -> bool:
    return True


@pytest.fixture
async def rt(
    loom_store: str, clock: ManualClock, budgets: list[dict[str, Any]], standing: bool
) -> AsyncIterator[Runtime]:
    route = {"name": "r", "types": ["r.*"], "create_work": True, "work_kind": "job"}
    cfg = Config.from_dict(
        {
            "scopes": {SCOPE: {"routes": [route]}},
            "work_kinds": {"job": {"standing": standing}},
            "budgets": budgets,
        }
    )
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        yield rt


async def publish(rt: Runtime, key: str, n: int, type: str = "r.go") -> Event:
    event = await rt.publish(EventIn(source="t", delivery_id=f"{key}-{n}", type=type, scope=SCOPE, key=key))
    await rt.poll()
    return event


async def turn(rt: Runtime, key: str, n: int, *, binding: BindingRef | None = None) -> Lease:
    await publish(rt, key, n)
    return await rt.claim(work_id_for_key(SCOPE, key), owner="host", binding=binding)


async def amounts(rt: Runtime, work_id: str) -> dict[str, float]:
    return {ledger.budget: ledger.amount for ledger in await rt.budget_ledgers(subject=work_id)}


async def budget_events(rt: Runtime) -> list[Event]:
    return [e for e in await rt.events(limit=1000) if e.type.startswith("core.budget.")]


# -- what a turn charges ----------------------------------------------------------------------------------


async def test_a_resume_charges_a_turn_and_not_an_attempt(rt: Runtime) -> None:
    """A resumed attempt is one more turn of the same attempt: it counts in ``turns``, never in
    ``attempts``. Catches a resume charged as a new attempt (an attempts budget would be spent by waits
    that resume)."""
    lease = await turn(rt, "a", 0, binding=RESUMABLE)
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("r.*",))))
    await publish(rt, "a", 1)
    resumed = await rt.claim(lease.work_id, owner="host", binding=RESUMABLE)
    assert (resumed.execution_id, resumed.request.resumed) == (lease.execution_id, True)
    assert await amounts(rt, lease.work_id) == {"turns": 2, "attempts": 1}


@pytest.mark.parametrize("standing", [False])
async def test_each_new_attempt_charges_an_attempt_a_continuation_too(rt: Runtime) -> None:
    """Every new attempt counts in ``attempts`` and ``turns``, a continuation after a wait (attempt
    N+1) included. Catches new attempts charged only as turns (an attempts budget would never be
    reached)."""
    lease = await turn(rt, "a", 0)
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("r.*",))))
    await publish(rt, "a", 1)
    continuation = await rt.claim(lease.work_id, owner="host")
    assert (continuation.attempt, continuation.request.resumed) == (2, False)
    assert await amounts(rt, lease.work_id) == {"turns": 2, "attempts": 2}


@pytest.mark.parametrize("budgets", [[budget("attempts", 2)]])
async def test_an_attempts_budget_holds_the_work(rt: Runtime) -> None:
    """A turn does not start once the Work's attempts ledger reached its limit: the Work is held with
    the reason, and its input keeps queueing. Catches attempts left uncounted (the budget would never
    hold anything) or counted one late (a third attempt would start)."""
    for n in range(2):
        await rt.complete(await turn(rt, "a", n), Completed())
    with pytest.raises(Conflict, match="budget 'attempts' reached its limit: 2 of 2 attempts"):
        await turn(rt, "a", 2)
    work = await rt.work(work_id_for_key(SCOPE, "a"))
    assert work.held
    assert "budget 'attempts' reached its limit" in (work.hold_reason or "")
    assert len(work.pending_inputs) == 1


# -- the warning and limit Events ----------------------------------------------------------------------


@pytest.mark.parametrize("budgets", [[{"name": "usd", "unit": "usd", "limit": 10, "warning": 8}]])
async def test_one_charge_over_the_warning_and_the_limit_announces_both(rt: Runtime) -> None:
    """A charge that crosses the warning threshold and the limit at once crossed both: the warning is
    announced too, before the limit. Catches announcing only the larger of the two (a route acting on
    warnings would never hear of a ledger that jumped past its limit)."""
    lease = await turn(rt, "a", 0)
    await rt.complete(lease, Completed(usage={"usd": 11}))
    events = await budget_events(rt)
    assert [e.type for e in events] == ["core.budget.warning", "core.budget.exceeded"]
    assert [e.payload["amount"] for e in events] == [11, 11]
    (ledger,) = await rt.budget_ledgers(subject=lease.work_id)
    assert (ledger.warned, ledger.exceeded) == (True, True)
    with pytest.raises(Conflict, match="reached its limit"):
        await turn(rt, "a", 1)
    await rt.release(lease.work_id)  # one more turn over the limit
    await rt.complete(await rt.claim(lease.work_id, owner="host"), Completed(usage={"usd": 1}))
    assert len(await budget_events(rt)) == 2, "once per ledger"


@pytest.mark.parametrize("budgets", [[{"name": "usd", "unit": "usd", "limit": 1, "warning": 0.5}]])
async def test_each_works_ledger_announces_its_own_warning_and_limit(rt: Runtime) -> None:
    """The Events are once per ledger, and a per-Work budget has a ledger per Work: two Works that
    each reach the limit each get their warning and their limit Event, naming them. Catches an Event
    identity that leaves the subject out (the second Work's Events would be taken as duplicates of the
    first's, and nobody would hear that it ran over)."""
    for key in ("a", "b"):
        await rt.complete(await turn(rt, key, 0), Completed(usage={"usd": 1}))
    events = await budget_events(rt)
    announced = sorted((e.payload["subject"], e.type) for e in events)
    works = sorted(work_id_for_key(SCOPE, key) for key in ("a", "b"))
    assert announced == sorted(
        (work, kind) for work in works for kind in ("core.budget.exceeded", "core.budget.warning")
    )
    assert all(e.payload["work"] == e.payload["subject"] for e in events)
