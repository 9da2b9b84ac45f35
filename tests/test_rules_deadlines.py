"""Execution deadlines (docs/configuration.md, ``timeout_ms``: the active time an attempt may run): the
rules that decide which attempt a deadline that fires may end, and what ends with it. A host drives
the runtime by hand (``actors=()``): it claims attempts pinned with the ``inject`` and ``interrupt``
capabilities, and deadlines fire only when the test calls `Runtime.poll`, so each answer arrives
exactly when the test says. Each test names the rule and the wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from loom import (
    Config,
    Event,
    EventIn,
    ExecutionState,
    IntentStatus,
    Lease,
    ManualClock,
    Runtime,
    WorkState,
    open_runtime,
)
from loom.kernel.executions import BindingRef
from loom.kernel.segments import deadline_timer_id
from loom.plugins.handlers import work_id_for_key
from loom.records.timers import FiringResult
from loom.testing import FakeExecutor

SCOPE = "acme"
TIMEOUT_MS = 10_000
LEASE_MS = 10 * 60_000  # longer than the deadline: the deadline, not the lease, ends these attempts
PINNED = BindingRef(name="fake", executor="fake", capabilities=frozenset({"inject", "interrupt"}))
"""The binding the host claims its attempts under (nothing launches them: no actor runs)."""


def config() -> Config:
    """Input for a running attempt is injected; attempts of kind ``slow`` have a 10 s active-time budget."""
    route = {"name": "r", "types": ["r.*"], "create_work": True, "binding": "fake", "policy": "inject",
             "work_kind": "slow"}  # fmt: skip
    bindings = {"fake": {"executor": "fake", "capabilities": ["inject", "interrupt"]}}
    return Config.from_dict(
        {
            "scopes": {SCOPE: {"bindings": bindings, "routes": [route]}},
            "work_kinds": {"slow": {"timeout_ms": TIMEOUT_MS}},
        }
    )


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    fake = FakeExecutor()
    fake.capabilities.update({"inject", "interrupt"})
    async with open_runtime(
        loom_store, clock=clock, config=config(), plugins=[fake], actors=(), load_entry_points=False
    ) as rt:
        yield rt


async def publish(rt: Runtime, n: int) -> Event:
    event = await rt.publish(EventIn(source="t", delivery_id=f"a-{n}", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    return event


async def running(rt: Runtime) -> Lease:
    """Work ``a`` with its first attempt running under a deadline."""
    await publish(rt, 0)
    lease = await rt.claim(work_id_for_key(SCOPE, "a"), owner="host", lease_ms=LEASE_MS, binding=PINNED)
    assert (await rt.execution(lease.execution_id)).budget_ms == TIMEOUT_MS
    return lease


async def expire(rt: Runtime, clock: ManualClock, lease: Lease) -> None:
    """The budget runs out and the deadline fires (the host's poll fires due timers)."""
    clock.advance(TIMEOUT_MS)
    await rt.poll()
    (firing,) = await rt.firings(deadline_timer_id(lease.execution_id, 1))
    assert firing.result is FiringResult.ACCEPTED


async def test_a_deadline_makes_the_attempts_open_intents_stale(rt: Runtime, clock: ManualClock) -> None:
    """A deadline ends its attempt, and an ended attempt's undispatched intents never retarget another
    attempt: they become stale in the deadline's commit, and the injected input stays pending for the
    next attempt. Catches: a deadline that fails the attempt but leaves its intents open (a dispatcher
    would still deliver the input to the failed attempt)."""
    lease = await running(rt)
    event = await publish(rt, 1)
    [intent] = await rt.intents(lease.execution_id)
    assert (intent.event_id, intent.status) == (event.id, IntentStatus.PENDING)
    await expire(rt, clock, lease)
    assert (await rt.execution(lease.execution_id)).state is ExecutionState.FAILED
    [after] = await rt.intents(lease.execution_id)
    assert after.status is IntentStatus.STALE
    assert (await rt.work(lease.work_id)).pending_inputs == (event.id,)


async def test_a_deadline_that_fires_while_the_attempt_is_being_interrupted_does_nothing(
    rt: Runtime, clock: ManualClock
) -> None:
    """A deadline ends only a running attempt: once an interrupt has fenced it (``stopping``), the
    interrupt decides how it ends, and the deadline is stale (audit only). Catches: a deadline that checks
    the segment and epoch but not that the attempt is still running (it would fail the stopping attempt
    and count a failure against the retry budget)."""
    lease = await running(rt)
    await rt.interrupt(lease.work_id)
    assert (await rt.execution(lease.execution_id)).state is ExecutionState.STOPPING
    await expire(rt, clock, lease)
    execution = await rt.execution(lease.execution_id)
    assert (execution.state, execution.outcome) == (ExecutionState.STOPPING, None)
    work = await rt.work(lease.work_id)
    assert (work.state, work.failures, work.retry) == (WorkState.RUNNING, 0, None)
