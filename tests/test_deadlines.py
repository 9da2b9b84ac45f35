"""Execution deadlines (docs/configuration.md, a Work kind's ``timeout_ms``): an attempt of a Work kind with
``timeout_ms`` has a durable ``core.execution.timeout`` timer armed with its claim; when it fires the
attempt is fenced and failed under its current fence, and the Work is ready again. Ending the segment
first cancels the deadline; a deadline whose segment is no longer active does nothing.

Work here has no executor binding, so nothing launches by itself: the tests claim and complete as a
host would. Business time is a `ManualClock`; tests wait on commits, never on time.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from loom import Config, Conflict, Event, EventIn, Runtime, StaleAuthority
from loom.kernel.executions import BindingRef, ClaimRequest, KindPolicy, claim_in_tx
from loom.kernel.segments import deadline_timer_id
from loom.records.core_events import CORE_SOURCE, EXECUTION_TIMEOUT
from loom.records.timers import FireRequest, Firing, FiringResult, TimerSpec, TimerState
from loom.records.work import (
    CheckpointStatus,
    Completed,
    ExecutionState,
    Handoff,
    Lease,
    RetryState,
    WorkState,
)
from loom.testing import T0_MS, RuntimeDriver, wait_routed
from loom.testing.internals import storage_of, timer_actor_of

T0 = T0_MS
SCOPE = "acme"
SECOND = 1_000
MINUTE = 60 * SECOND
TIMEOUT_MS = 10 * SECOND
LEASE_MS = 10 * MINUTE  # longer than the deadline: the deadline, not the lease, ends these attempts


def config() -> Config:
    return Config.from_dict(
        {
            "scopes": {
                SCOPE: {
                    "routes": [{"name": "jobs", "types": ["job.*"], "create_work": True, "work_kind": "slow"}]
                }
            },
            "work_kinds": {"slow": {"timeout_ms": TIMEOUT_MS}},
        }
    )


def job(delivery_id: str, *, key: str = "job/1") -> EventIn:
    return EventIn(source="ext", delivery_id=delivery_id, type="job.run", scope=SCOPE, key=key)


async def routed(driver: RuntimeDriver, event: Event) -> str:
    (checkpoint,) = await wait_routed(driver, event)
    assert checkpoint.work_id is not None
    return checkpoint.work_id


async def claim(rt: Runtime, work_id: str) -> Lease:
    """Claim as the router does for a Work kind with a timeout: the request carries ``timeout_ms``."""
    kind = rt.config.work_kinds["slow"]
    request = ClaimRequest(
        work_id=work_id,
        owner="host",
        token=secrets.token_urlsafe(16),
        lease_ms=LEASE_MS,
        binding=BindingRef(name=None, executor=None),
        kind=KindPolicy(timeout_ms=kind.timeout_ms),
        capacity=None,
        generation=rt.config.generation,
        timeout_ms=kind.timeout_ms,
    )
    return await storage_of(rt).submit(claim_in_tx, request)


async def ledger(driver: RuntimeDriver, timer_id: str, n: int) -> list[Firing]:
    async def check() -> bool:
        return len(await driver.runtime.firings(timer_id)) >= n

    await driver.until(check, f"{n} firing(s) of {timer_id}")
    firings = await driver.runtime.firings(timer_id)
    assert len(firings) == n
    return firings


async def quiet(driver: RuntimeDriver, name: str) -> None:
    """Every timer due now has had its turn once a sentinel armed now has fired (deadline order)."""
    await driver.runtime.arm(
        TimerSpec(id=name, fire_at_ms=driver.clock.now_ms(), source="sentinel", type="sentinel", scope=SCOPE)
    )
    await ledger(driver, name, 1)


async def timeouts(rt: Runtime) -> list[Event]:
    return [e for e in await rt.events(limit=10_000) if e.type == EXECUTION_TIMEOUT]


async def test_the_claim_arms_a_durable_deadline_for_the_attempt(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        driver.clock.advance(7 * SECOND)
        trigger = await rt.publish(job("run-1"))
        lease = await claim(rt, await routed(driver, trigger))
        timer_id = deadline_timer_id(lease.execution_id, 1)
        assert timer_id == f"deadline:{lease.execution_id}:1"
        timer = await rt.timer(timer_id)
        assert (timer.state, timer.type, timer.source, timer.fire_at_ms) == (
            TimerState.ARMED,
            EXECUTION_TIMEOUT,
            CORE_SOURCE,
            T0 + 7 * SECOND + TIMEOUT_MS,
        )
        assert timer.payload == {
            "execution": lease.execution_id,
            "segment": 1,
            "epoch": 1,
            "work": lease.work_id,
        }
        assert (timer.parent_id, timer.execution_id) == (trigger.id, lease.execution_id)
        execution = await rt.execution(lease.execution_id)
        assert (execution.segment, execution.budget_ms, execution.used_ms) == (1, TIMEOUT_MS, 0)


async def test_an_expired_deadline_fences_and_fails_the_attempt(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        trigger = await driver.runtime.publish(job("run-1"))
        work_id = await routed(driver, trigger)
        lease = await claim(driver.runtime, work_id)
        timer_id = deadline_timer_id(lease.execution_id, 1)
        driver.clock.advance(TIMEOUT_MS // 2)
        await driver.reopen()  # the deadline is durable: a restart in the middle changes nothing
        if driver.reopenable:  # the reopened timer actor re-armed it from the store
            assert timer_actor_of(driver.runtime).next_due_ms == T0 + TIMEOUT_MS

        driver.clock.advance(TIMEOUT_MS // 2)
        (firing,) = await ledger(driver, timer_id, 1)
        rt = driver.runtime
        assert firing.result is FiringResult.ACCEPTED
        (timeout,) = await timeouts(rt)
        assert timeout.id == firing.event_id
        assert (timeout.parent_id, timeout.root_id, timeout.depth) == (trigger.id, trigger.id, 1)
        assert (timeout.source, timeout.delivery_id) == (CORE_SOURCE, timer_id)

        execution = await rt.execution(lease.execution_id)
        assert execution.state is ExecutionState.FAILED
        assert execution.outcome is not None
        assert execution.outcome["error"] == f"execution timeout after {TIMEOUT_MS} ms of active time"
        assert execution.outcome["timeout_event_id"] == timeout.id
        assert execution.used_ms == TIMEOUT_MS
        # the old token lost its authority at the deadline's commit
        with pytest.raises(StaleAuthority):
            await rt.complete(lease, Completed())
        with pytest.raises(StaleAuthority):
            await rt.renew(lease)
        with pytest.raises(StaleAuthority):
            await rt.toolbelt(lease).emit(
                EventIn(source="bot", delivery_id="late", type="bot.note", scope=SCOPE)
            )

        work = await rt.work(work_id)
        assert (work.state, work.current_execution_id, work.held) == (WorkState.READY, None, False)
        assert work.pending_inputs == (), "the failed attempt consumed its input"
        checkpoint = await rt.checkpoint(timeout.id)
        assert checkpoint is not None
        assert (checkpoint.status, checkpoint.work_id) == (CheckpointStatus.ROUTED, None)
        assert checkpoint.reason == f"control: execution deadline of {lease.execution_id}"
        assert (await rt.timer(timer_id)).state is TimerState.FIRED

        # the failure armed a retry: input queued during the backoff does not make it eligible
        assert work.retry is RetryState.BACKOFF
        again = await rt.publish(job("run-2"))
        await routed(driver, again)
        with pytest.raises(Conflict, match="retry backoff"):
            await claim(rt, work_id)
        driver.clock.advance(5 * 60_000)  # the first failure's backoff

        async def eligible() -> bool:
            return (await rt.work(work_id)).retry is None

        await driver.until(eligible, "the retry to become due")
        # attempt 2 runs with its own deadline
        second = await claim(rt, work_id)
        assert second.attempt == 2
        assert (
            await rt.timer(deadline_timer_id(second.execution_id, 1))
        ).fire_at_ms == rt.clock.now_ms() + TIMEOUT_MS


@pytest.mark.parametrize("outcome", [Completed(), Handoff()], ids=["completed", "handoff"])
async def test_ending_the_attempt_before_its_deadline_cancels_it(loom_store: str, outcome: Any) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        work_id = await routed(driver, await rt.publish(job("run-1")))
        lease = await claim(rt, work_id)
        timer_id = deadline_timer_id(lease.execution_id, 1)
        driver.clock.advance(3 * SECOND)
        ended = await rt.complete(lease, outcome)
        assert ended.state in (ExecutionState.COMPLETED, ExecutionState.HANDOFF)
        assert ended.used_ms == 3 * SECOND, "active time is counted when the segment ends"
        timer = await rt.timer(timer_id)
        assert (timer.state, timer.reason) == (TimerState.CANCELLED, "segment ended")

        driver.clock.advance(TIMEOUT_MS)
        await quiet(driver, "sentinel")
        assert await rt.firings(timer_id) == [], "a cancelled deadline never fires"
        assert await timeouts(rt) == []
        assert (await rt.execution(lease.execution_id)).state is ended.state
        # a late firing request for the old deadline identity is stale
        stale = await rt.fire(FireRequest(timer_id=timer_id, revision=1, fire_at_ms=T0 + TIMEOUT_MS))
        assert (stale.result, stale.event_id) == (FiringResult.STALE, None)


async def test_cancelling_the_work_cancels_the_deadline(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        work_id = await routed(driver, await rt.publish(job("run-1")))
        lease = await claim(rt, work_id)
        await rt.cancel(work_id)
        assert (await rt.timer(deadline_timer_id(lease.execution_id, 1))).state is TimerState.CANCELLED
        driver.clock.advance(TIMEOUT_MS)
        await quiet(driver, "sentinel")
        assert await timeouts(rt) == []
        assert (await rt.execution(lease.execution_id)).state is ExecutionState.CANCELLED


@pytest.mark.parametrize(("segment", "epoch"), [(2, 1), (1, 2)], ids=["older-segment", "older-epoch"])
async def test_a_stale_deadline_does_nothing(loom_store: str, segment: int, epoch: int) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        work_id = await routed(driver, await rt.publish(job("run-1")))
        lease = await claim(rt, work_id)
        # a deadline naming this execution but not its active segment (or its current epoch)
        await rt.arm(
            TimerSpec(
                id="stale-deadline",
                fire_at_ms=T0 + SECOND,
                source=CORE_SOURCE,
                type=EXECUTION_TIMEOUT,
                scope=SCOPE,
                payload={
                    "execution": lease.execution_id,
                    "segment": segment,
                    "epoch": epoch,
                    "work": work_id,
                },
            )
        )
        driver.clock.advance(SECOND)
        (firing,) = await ledger(driver, "stale-deadline", 1)
        assert firing.result is FiringResult.ACCEPTED
        checkpoint = await rt.checkpoint(firing.event_id or "")
        assert checkpoint is not None
        assert checkpoint.reason == "control: a stale execution deadline"
        execution = await rt.execution(lease.execution_id)
        assert (execution.state, execution.used_ms) == (ExecutionState.RUNNING, 0)
        assert (await rt.work(work_id)).state is WorkState.RUNNING
        renewed = await rt.renew(lease, lease_ms=LEASE_MS)  # the lease still holds
        assert (await rt.complete(renewed, Completed())).state is ExecutionState.COMPLETED


async def test_a_refused_deadline_event_still_fences_the_attempt_and_holds_the_work(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        link = await rt.publish(EventIn(source="ext", delivery_id="link-0", type="chain.link", scope=SCOPE))
        for depth in range(1, 33):
            last = depth == 32
            link = await rt.publish_derived(
                EventIn(
                    source="bot",
                    delivery_id=f"link-{depth}",
                    type="job.deep" if last else "chain.link",
                    scope=SCOPE,
                    key="deep/1" if last else None,
                ),
                parent_id=link.id,
            )
        work_id = await routed(driver, link)
        lease = await claim(rt, work_id)
        timer_id = deadline_timer_id(lease.execution_id, 1)
        driver.clock.advance(TIMEOUT_MS)
        (firing,) = await ledger(driver, timer_id, 1)
        assert (firing.result, firing.event_id) == (FiringResult.REFUSED, None)
        assert await timeouts(rt) == []
        (rejection,) = await rt.causal_rejections()
        assert (rejection.delivery_id, rejection.depth) == (timer_id, 33)

        execution = await rt.execution(lease.execution_id)
        assert execution.state is ExecutionState.FAILED
        with pytest.raises(StaleAuthority):
            await rt.complete(lease, Completed())
        work = await rt.work(work_id)
        assert work.held
        assert (work.hold_reason or "").startswith("causal_rejection")
        assert work.state is WorkState.READY
        assert work.current_execution_id is None
        assert (await rt.timer(timer_id)).state is TimerState.DISABLED


async def test_a_work_kind_timeout_reaches_the_runtime_claim() -> None:
    async with RuntimeDriver.open(":memory:", config=config()) as driver:
        rt = driver.runtime
        lease = await rt.claim(await routed(driver, await rt.publish(job("run-1"))), owner="host")
        assert (await rt.timer(deadline_timer_id(lease.execution_id, 1))).state is TimerState.ARMED


async def test_a_claim_without_a_timeout_arms_no_deadline(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        work_id = await routed(driver, await rt.publish(job("run-1")))
        request = ClaimRequest(
            work_id=work_id,
            owner="host",
            token="t",
            lease_ms=LEASE_MS,
            binding=BindingRef(name=None, executor=None),
            kind=KindPolicy(),
            capacity=None,
            generation=rt.config.generation,
        )
        lease = await storage_of(rt).submit(claim_in_tx, request)
        assert await rt.timers() == []
        assert (await rt.execution(lease.execution_id)).budget_ms is None
