"""What the runtime gives the service: the lease of a presented token, the durable time floor, filtered
reads, the notices its metrics count, and the relaunch of an attempt that expired before it was handed
to its executor."""

from __future__ import annotations

from pathlib import Path

import pytest

import loom
from loom.kernel.executions import BindingRef, claim_in_tx, claim_request
from loom.notices import Committed, LeaseRecovered, TimerFired
from loom.testing import T0_MS, RuntimeDriver
from loom.testing.internals import storage_of

CONFIG = loom.Config.from_dict(
    {
        "scopes": {
            "shop": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]},
            "shopping": {"routes": [{"name": "carts", "types": ["cart.*"], "create_work": True}]},
        }
    }
)


def order(n: int, scope: str = "shop", type: str = "order.placed") -> loom.EventIn:
    return loom.EventIn(source="t", delivery_id=f"{scope}-{n}", type=type, scope=scope, key=f"{scope}/{n}")


async def routed_work(driver: RuntimeDriver, n: int, scope: str = "shop") -> loom.Work:
    await driver.publish(order(n, scope, "cart.added" if scope == "shopping" else "order.placed"))
    await driver.settle()
    return await driver.runtime.work_for_key(f"{scope}/{n}")


async def test_lease_for_answers_only_the_current_token_of_that_execution(tmp_path: Path) -> None:
    """Catches a lookup that ignores the token, accepts another execution's token, or keeps answering
    after the attempt ended (the HTTP toolbelt's whole authentication)."""
    async with RuntimeDriver.open(str(tmp_path / "l.db"), config=CONFIG, actors=("router",)) as driver:
        rt = driver.runtime
        a = await rt.claim((await routed_work(driver, 1)).id, owner="host")
        b = await rt.claim((await routed_work(driver, 2)).id, owner="host")
        found = await rt.lease_for(a.execution_id, a.token)
        assert (found.execution_id, found.epoch, found.attempt, found.token) == (
            a.execution_id,
            1,
            1,
            a.token,
        )
        assert found.request.trigger is not None
        assert found.request.trigger.id == a.request.trigger.id  # type: ignore[union-attr]
        for execution_id, token in [
            (a.execution_id, b.token),
            (a.execution_id, a.token + "x"),
            ("ex_nope", a.token),
        ]:
            with pytest.raises(loom.StaleAuthority):
                await rt.lease_for(execution_id, token)
        await rt.complete(a, loom.Completed())
        with pytest.raises(loom.StaleAuthority):
            await rt.lease_for(a.execution_id, a.token)
        assert (await rt.lease_for(b.execution_id, b.token)).execution_id == b.execution_id


async def test_the_time_floor_only_rises_and_survives_a_reopen(tmp_path: Path) -> None:
    """Catches a floor that a later, earlier clock reading lowers, or one that is not durable."""
    async with RuntimeDriver.open(str(tmp_path / "t.db"), actors=()) as driver:
        assert await driver.runtime.time_floor() is None
        driver.clock.advance(5_000)
        assert await driver.runtime.mark_time() == T0_MS + 5_000
        await driver.reopen()
        assert await driver.runtime.time_floor() == T0_MS + 5_000
    async with RuntimeDriver.open(str(tmp_path / "t.db"), actors=(), start_ms=T0_MS) as driver:
        assert await driver.runtime.mark_time() == T0_MS + 5_000  # an earlier clock does not lower it
        assert await driver.runtime.time_floor() == T0_MS + 5_000


async def test_works_by_scope_keep_the_scope_and_its_descendants_only(tmp_path: Path) -> None:
    """Catches a scope filter that matches a bare prefix (``shop`` taking ``shopping``)."""
    config = loom.Config.from_dict(
        {
            "scopes": {
                "shop": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]},
                "shopping": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]},
            }
        }
    )
    async with RuntimeDriver.open(str(tmp_path / "w.db"), config=config) as driver:
        for n, scope in enumerate(["shop", "shop/eu", "shop/eu/de", "shopping"]):
            await driver.publish(order(n, scope))
        await driver.settle()
        rt = driver.runtime
        assert sorted(w.scope for w in await rt.works(scope="shop")) == ["shop", "shop/eu", "shop/eu/de"]
        assert sorted(w.scope for w in await rt.works(scope="shop/eu")) == ["shop/eu", "shop/eu/de"]
        assert [w.scope for w in await rt.works(scope="shopping")] == ["shopping"]
        assert await rt.works(scope="sho") == []
        assert len(await rt.works(scope="shop", state=loom.WorkState.READY)) == 3
        with pytest.raises(loom.InvalidRequest) as refused:
            await rt.works(scope="not a scope")
        assert refused.value.field == "scope"


async def test_events_by_type_and_timers_by_work(tmp_path: Path) -> None:
    """Catches a type filter that is ignored, and a Work's timers missing the ones its attempts armed."""
    async with RuntimeDriver.open(str(tmp_path / "e.db"), config=CONFIG, actors=("router",)) as driver:
        rt = driver.runtime
        work = await routed_work(driver, 1)
        await driver.publish(order(2, type="order.paid"))
        assert [e.type for e in await rt.events(type="order.paid")] == ["order.paid"]
        assert len(await rt.events(type="order.placed")) == 1
        lease = await rt.claim(work.id, owner="host")
        armed = await rt.toolbelt(lease).arm_timer(
            loom.TimerSpec(
                id="remind", fire_at_ms=T0_MS + 1000, source="t", type="order.remind", scope="shop"
            )
        )
        await rt.arm(
            loom.TimerSpec(id="other", fire_at_ms=T0_MS + 1000, source="t", type="x.y", scope="shop")
        )
        assert [t.id for t in await rt.timers(work_id=work.id)] == [armed.id]
        assert {t.id for t in await rt.timers()} == {"remind", "other"}


async def test_firings_and_batches_are_announced(tmp_path: Path) -> None:
    """Catches metrics without a source: a firing publishes `TimerFired` with its result, and every
    batch's `Committed` says how many requests it held and how long its hop took."""
    async with RuntimeDriver.open(str(tmp_path / "n.db")) as driver:
        rt = driver.runtime
        async with rt.watch() as notices:
            await rt.arm(loom.TimerSpec(id="t1", fire_at_ms=T0_MS + 10, source="t", type="x.tick", scope="s"))
            driver.clock.advance(10)
            seen: list[object] = []
            async for notice in notices:
                seen.append(notice)
                if isinstance(notice, TimerFired):
                    break
        fired = [n for n in seen if isinstance(n, TimerFired)]
        assert fired == [
            TimerFired(timer_id="t1", revision=1, fire_at_ms=T0_MS + 10, result=loom.FiringResult.ACCEPTED)
        ]
        commits = [n for n in seen if isinstance(n, Committed)]
        assert commits
        assert all(c.requests >= 1 and c.seconds > 0 for c in commits)


async def test_an_attempt_whose_lease_expired_before_it_was_handed_is_relaunched(tmp_path: Path) -> None:
    """Catches a relaunch refused as an illegal running -> running transition, which stopped the runtime
    (an invariant violation) the first time a lease expired between a claim and its launch."""
    async with RuntimeDriver.open(
        str(tmp_path / "r.db"), config=CONFIG, actors=("recovery",), lease_ms=30_000
    ) as driver:
        rt = driver.runtime
        driver.fake.auto_complete = True
        await rt.publish(order(1))
        await rt.poll(10)
        work = await rt.work_for_key("shop/1")
        # a claim by the runtime's own starter, not yet handed to its executor (a host's claim counts
        # as handed at once, so it is recovered, not relaunched)
        request = claim_request(
            rt.config, work, owner="loom", token="t-1", lease_ms=30_000,
            binding=BindingRef(name="b", executor="fake"), handed=False,
        )  # fmt: skip
        lease = await storage_of(rt).submit(claim_in_tx, request)
        async with rt.watch() as notices:
            driver.clock.advance(30_000)
            recovered = None
            async for notice in notices:
                if isinstance(notice, LeaseRecovered):
                    recovered = notice
                    break
        assert recovered == LeaseRecovered(
            execution_id=lease.execution_id, work_id=work.id, epoch=2, relaunch=True
        )

        async def completed() -> bool:
            return (await rt.work(work.id)).state is loom.WorkState.COMPLETED

        await driver.until(completed, "the relaunched attempt to complete")
        assert [launch.request.execution_id for launch in driver.fake.launches] == [lease.execution_id]
        assert (await rt.execution(lease.execution_id)).epoch == 2
        assert (await rt.publish(order(2))).seq > 0  # the runtime still runs
