"""Admission (docs/architecture.md, "Admission: which ready Work starts next"; docs/configuration.md,
``capacity``): the database keeps ready Work in the order it became ready, and a pass starts it in that
order under scope capacity, resolved with inheritance.

Claims are counted by wrapping the kernel's claim: each is one try to start an attempt, so a starter
that tries every waiting Work whenever a slot frees (N(N-1)/2 claims for N Works) fails the bound.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loom
import loom.kernel.admission
from loom import Config, EventIn, ManualClock, Runtime, open_runtime
from loom.kernel.executions import BindingRef
from loom.plugins.python_executor import PythonExecutor
from loom.records.executor import Toolbelt
from loom.records.work import Completed, ExecutionState, Lease, RunRequest, WorkState
from loom.testing import T0_MS

STALL_S = 20  # a watchdog only: nothing waits on time


def config(capacities: dict[str, int | None], *, binding: bool = False) -> Config:
    """Scopes with the given capacities; ``order.*`` Events correlate by key into created Work in any
    of them (each root scope declares the route; descendants inherit it)."""
    route: dict[str, Any] = {"name": "orders", "types": ["order.*"], "create_work": True}
    root: dict[str, Any] = {"routes": [route]}
    if binding:
        route["binding"] = "py"
        root["bindings"] = {"py": {"executor": "python", "config": {"function": "run"}}}
    scopes: dict[str, Any] = {"shop": root}
    for scope, capacity in capacities.items():
        declared = scopes.setdefault(scope, {} if "/" in scope else dict(root))
        if capacity is not None:
            declared["capacity"] = capacity
    return Config.from_dict({"scopes": scopes})


def order(key: str, scope: str = "shop") -> EventIn:
    return EventIn(source="shop", delivery_id=key, type="order.placed", scope=scope, key=key)


@pytest.fixture
def claims(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every claim the admission pass or a host's claim tries, by Work id."""
    tried: list[str] = []
    real = loom.kernel.admission.claim_in_tx

    def counted(tx: Any, now_ms: int, request: Any) -> Any:
        tried.append(request.work_id)
        return real(tx, now_ms, request)

    monkeypatch.setattr(loom.kernel.admission, "claim_in_tx", counted)
    return tried


@asynccontextmanager
async def host_driven(store: str, cfg: Config) -> AsyncIterator[Runtime]:
    async with open_runtime(
        store, clock=ManualClock(start_ms=T0_MS), config=cfg, load_entry_points=False, actors=()
    ) as rt:
        yield rt


async def ready_in_order(rt: Runtime, keys: list[tuple[str, str]]) -> list[str]:
    """Publish one Event per (key, scope) and route each before the next: the Works become ready in
    this order. Returns their ids."""
    ids = []
    for key, scope in keys:
        await rt.publish(order(key, scope))
        await rt.poll()
        ids.append((await rt.work_for_key(key)).id)
    return ids


# -- readiness order and the cost of a full pool ---------------------------------------------------------


async def test_fifty_works_under_capacity_one_drain_in_readiness_order_with_one_claim_each(
    loom_store: str, claims: list[str]
) -> None:
    """Catches: starting in any order but readiness (a set, a hash), and a pass that tries to claim
    every waiting Work whenever a slot frees (1,225 claims for 50 Works)."""
    async with host_driven(loom_store, config({"shop": 1})) as rt:
        ids = await ready_in_order(rt, [(f"o/{i}", "shop") for i in range(50)])
        started: list[str] = []
        for _ in range(50):
            leases = await rt.admit(limit=10, owner="host")
            assert len(leases) == 1, "capacity 1: one attempt at a time"
            started.append(leases[0].work_id)
            assert await rt.admit(limit=10, owner="host") == [], "the pool is full until it completes"
            await rt.complete(leases[0], Completed())
        assert started == ids
        assert len(claims) <= 100, f"{len(claims)} claims to start 50 Works"
        assert len(claims) == 50, "a Work waiting for a slot is never claimed before the slot frees"


class Holding:
    """An executor function that holds every attempt until told, recording the order they start in
    and how many run at once."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.running = 0
        self.most = 0
        self.go = trio.Event()
        self.changed = trio.Event()

    async def run(self, request: RunRequest, toolbelt: Toolbelt) -> Completed:
        self.started.append(request.work_id)
        self.running += 1
        self.most = max(self.most, self.running)
        self._changed()
        try:
            await self.go.wait()
        finally:
            self.running -= 1
        return Completed()

    def _changed(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    async def until_started(self, n: int) -> None:
        with trio.fail_after(STALL_S):
            while len(self.started) < n:
                await self.changed.wait()


@asynccontextmanager
async def with_executor(store: str, cfg: Config, holding: Holding) -> AsyncIterator[Runtime]:
    executor = PythonExecutor()
    executor.register("run", holding.run)
    async with open_runtime(
        store,
        clock=ManualClock(start_ms=T0_MS),
        config=cfg,
        plugins=[executor],
        load_entry_points=False,
    ) as rt:
        yield rt


async def test_the_starter_drains_a_full_pool_in_readiness_order(loom_store: str, claims: list[str]) -> None:
    """The same through the runtime's own starter (each completion frees the slot for the next in
    line). Catches: a starter that rechecks every deferred Work on every change."""
    holding = Holding()
    async with with_executor(loom_store, config({"shop": 1}, binding=True), holding) as rt:
        await rt.publish(order("o/0"))
        await holding.until_started(1)
        for i in range(1, 50):
            await rt.publish(order(f"o/{i}"))
            await rt.wait_idle()  # routed (and ready) before the next one
        ids = [(await rt.work_for_key(f"o/{i}")).id for i in range(50)]
        assert holding.started == ids[:1]
        holding.go.set()
        await holding.until_started(50)
        await rt.wait_idle()
        assert holding.started == ids, "readiness order"
        assert holding.most == 1
        assert [(await rt.work(w)).state for w in ids] == [WorkState.COMPLETED] * 50
        assert len(claims) <= 100, f"{len(claims)} claims to start 50 Works"


# -- capacity with inheritance ----------------------------------------------------------------------------


async def test_a_parent_scopes_capacity_bounds_its_undeclared_descendants(loom_store: str) -> None:
    """``[scopes.shop] capacity = 1``: Works in ``shop/eu`` and ``shop/us`` (which declare no capacity)
    share its one slot. Catches: capacity looked up for the Work's own scope only (all 20 ran at once)."""
    holding = Holding()
    cfg = config({"shop": 1, "shop/eu": None, "shop/us": None}, binding=True)
    async with with_executor(loom_store, cfg, holding) as rt:
        for i in range(20):
            await rt.publish(order(f"o/{i}", "shop/eu" if i % 2 else "shop/us"))
        await holding.until_started(1)
        await rt.wait_idle()
        assert len(holding.started) == 1, "one slot for the whole tree"
        holding.go.set()
        await holding.until_started(20)
        await rt.wait_idle()
        assert holding.most == 1


async def test_a_descendant_that_declares_a_capacity_is_a_pool_of_its_own(loom_store: str) -> None:
    """``shop`` capacity 1 and ``shop/eu`` capacity 2: eu runs two at once, the rest of shop one.
    Catches: nested pools that all count against the root, or a descendant's capacity ignored."""
    async with host_driven(loom_store, config({"shop": 1, "shop/eu": 2})) as rt:
        await ready_in_order(
            rt, [(f"eu/{i}", "shop/eu") for i in range(3)] + [(f"us/{i}", "shop/us") for i in range(3)]
        )
        leases = await rt.admit(limit=10, owner="host")
        scopes = sorted([(await rt.work(lease.work_id)).scope for lease in leases])
        assert scopes == ["shop/eu", "shop/eu", "shop/us"]
        assert all(
            x.pool in ("shop", "shop/eu")
            for x in [await rt.execution(lease.execution_id) for lease in leases]
        )


async def test_a_host_claim_in_a_full_pool_is_refused_naming_the_pool(loom_store: str) -> None:
    """Catches: a host's claim that skips the capacity the pass enforces (one claim path, not two)."""
    async with host_driven(loom_store, config({"shop": 1, "shop/eu": None})) as rt:
        first, second = await ready_in_order(rt, [("a", "shop/eu"), ("b", "shop")])
        await rt.claim(first, owner="host")
        with pytest.raises(loom.Conflict, match="scope 'shop' is at its capacity of 1"):
            await rt.claim(second, owner="host")
        assert (await rt.work(second)).attempts == 0, "a refused claim changes nothing"


async def test_a_raised_capacity_lets_waiting_work_start_at_once(loom_store: str) -> None:
    """Catches: Work passed over for a full pool that stays passed over after the configuration raises
    the capacity (it would wait for a completion that may never come)."""
    async with host_driven(loom_store, config({"shop": 1})) as rt:
        await ready_in_order(rt, [(f"o/{i}", "shop") for i in range(3)])
        assert len(await rt.admit(limit=10, owner="host")) == 1
        assert await rt.admit(limit=10, owner="host") == []
        rt.reload(config({"shop": 3}))
        assert len(await rt.admit(limit=10, owner="host")) == 2


async def test_a_parked_attempt_holds_no_slot(loom_store: str) -> None:
    """A parked attempt waits and does not run: another Work of its pool may start. Catches: capacity
    counting parked attempts (a pool of waiting Work would stop everything behind it)."""
    async with host_driven(loom_store, config({"shop": 1})) as rt:
        first, second = await ready_in_order(rt, [("a", "shop"), ("b", "shop")])
        resumable = BindingRef(name=None, executor=None, capabilities=frozenset({"resume"}))
        lease = await rt.claim(first, owner="host", binding=resumable)
        await rt.complete(lease, loom.Waiting(wait=loom.WaitSpec(types=("order.paid",))))
        assert (await rt.execution(lease.execution_id)).state is ExecutionState.PARKED
        (other,) = await rt.admit(limit=10, owner="host")
        assert other.work_id == second


# -- no starvation -----------------------------------------------------------------------------------------


POOLS = {"shop": 1, "shop/eu": 2, "free": None}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    arrivals=st.lists(st.sampled_from(["shop", "shop/us", "shop/eu", "free"]), min_size=1, max_size=14),
    completions=st.lists(st.integers(min_value=0, max_value=10), max_size=30),
    limit=st.integers(min_value=1, max_value=4),
)
def test_no_work_waits_behind_work_that_became_ready_later(
    tmp_path: Any, arrivals: list[str], completions: list[int], limit: int
) -> None:
    """Whatever the order Works arrive and attempts complete: within a pool, Works start in the order
    they became ready (none starts after one of its pool that became ready later), at most ``capacity``
    run at once, Works without capacity start at the first pass, and once everything completes every
    Work has started. Catches: any starter order but readiness (hash, set, newest first), a pool that
    forgets a freed slot (starvation), and capacity not inherited."""
    store = str(tmp_path / f"admit-{abs(hash((tuple(arrivals), tuple(completions), limit)))}.db")
    cfg = config({"shop": 1, "shop/eu": 2, "free": None})
    trio.run(_no_starvation, store, cfg, arrivals, completions, limit)


def _pool(scope: str) -> str | None:
    return "shop/eu" if scope == "shop/eu" else "shop" if scope.startswith("shop") else None


async def _no_starvation(
    store: str, cfg: Config, arrivals: list[str], completions: list[int], limit: int
) -> None:
    async with host_driven(store, cfg) as rt:
        ready: list[str] = []
        scope_of: dict[str, str] = {}
        running: list[Lease] = []
        started: list[str] = []
        steps = list(completions)

        async def admit() -> None:
            for lease in await rt.admit(limit=limit, owner="host"):
                running.append(lease)
                started.append(lease.work_id)
            for pool in ("shop", "shop/eu"):
                live = [x for x in running if _pool(scope_of[x.work_id]) == pool]
                assert len(live) <= POOLS[pool], f"{len(live)} running in {pool}"  # type: ignore[operator]

        for i, scope in enumerate(arrivals):
            key = f"o/{i}"
            await rt.publish(order(key, scope))
            await rt.poll()
            work_id = (await rt.work_for_key(key)).id
            ready.append(work_id)
            scope_of[work_id] = scope
            await admit()
            if steps and running:
                await rt.complete(running.pop(steps.pop(0) % len(running)), Completed())
                await admit()
        while running:
            await rt.complete(running.pop(0), Completed())
            await admit()
        assert sorted(started) == sorted(ready), "every Work started"
        for pool in ("shop", "shop/eu"):
            in_pool = [w for w in ready if _pool(scope_of[w]) == pool]
            assert [w for w in started if w in in_pool] == in_pool, f"{pool}: readiness order"
