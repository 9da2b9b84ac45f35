"""Inject intents once their attempt is gone: the rules that keep an intent from acting on input or
attempts it no longer concerns (docs/architecture.md: inject and interrupt intents and their dispatch
answers; docs/recovery.md, "Cancellation"). A host drives the runtime by hand (``actors=()``): it claims
attempts pinned with the ``inject`` capability, and the dispatch steps an executor's dispatcher takes
(`begin_dispatch_in_tx`, `finish_dispatch_in_tx`) run as single storage requests, so each answer
arrives exactly when the test says. Each test names the rule and the wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from loom import (
    Completed,
    Config,
    Conflict,
    Event,
    EventIn,
    ExecutionState,
    Intent,
    IntentKind,
    IntentStatus,
    Lease,
    ManualClock,
    Runtime,
    WorkState,
    open_runtime,
)
from loom.kernel.executions import BindingRef
from loom.kernel.intents import DISPATCH_ATTEMPTS, DispatchResult, begin_dispatch_in_tx, finish_dispatch_in_tx
from loom.plugins.handlers import work_id_for_key
from loom.records.work import InputState
from loom.testing import FakeExecutor
from loom.testing.internals import storage_of

SCOPE = "acme"
LEASE_MS = 60_000
INJECTING = BindingRef(name="fake", executor="fake", capabilities=frozenset({"inject"}))
"""The binding the host claims its attempts under: they take injected input (nothing launches them:
no actor runs)."""


def config() -> Config:
    """Input for a running attempt is injected; an inject that stays ambiguous drops its input."""
    route = {"name": "r", "types": ["r.*"], "create_work": True, "binding": "fake", "policy": "inject",
             "error_fallback": "drop"}  # fmt: skip
    bindings = {"fake": {"executor": "fake", "capabilities": ["inject"]}}
    return Config.from_dict({"scopes": {SCOPE: {"bindings": bindings, "routes": [route]}}})


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    fake = FakeExecutor()
    fake.capabilities.add("inject")
    async with open_runtime(
        loom_store, clock=clock, config=config(), plugins=[fake], actors=(), load_entry_points=False
    ) as rt:
        yield rt


async def publish(rt: Runtime, n: int) -> Event:
    event = await rt.publish(EventIn(source="t", delivery_id=f"a-{n}", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    return event


async def running(rt: Runtime) -> Lease:
    """Work ``a`` with its first attempt running, pinned with ``inject``."""
    await publish(rt, 0)
    return await rt.claim(work_id_for_key(SCOPE, "a"), owner="host", lease_ms=LEASE_MS, binding=INJECTING)


async def injected(rt: Runtime, lease: Lease, n: int) -> tuple[Event, Intent]:
    """Input routed to the running attempt: it is pending, and an inject intent targets the attempt."""
    event = await publish(rt, n)
    [intent] = [i for i in await rt.intents(lease.execution_id) if i.event_id == event.id]
    assert intent.status is IntentStatus.PENDING
    return event, intent


async def dispatching(rt: Runtime, intent: Intent) -> None:
    """The dispatcher marks the intent attempted and calls the executor (whose answer is not in yet)."""
    assert await storage_of(rt).submit(begin_dispatch_in_tx, intent.id) is not None


async def answer(rt: Runtime, intent: Intent, result: DispatchResult) -> Intent:
    settled: Intent = await storage_of(rt).submit(finish_dispatch_in_tx, intent.id, result)
    return settled


async def input_state(rt: Runtime, work_id: str, event_id: str) -> InputState | None:
    return await storage_of(rt).submit(lambda tx, now: tx.input_state(work_id, event_id))


async def statuses(rt: Runtime, lease: Lease) -> dict[str, IntentStatus]:
    return {i.event_id: i.status for i in await rt.intents(lease.execution_id)}


async def ambiguous_until_the_last_try(rt: Runtime, intent: Intent) -> None:
    """Every dispatch but the last stays ambiguous; the last is in flight."""
    for _ in range(DISPATCH_ATTEMPTS - 1):
        await dispatching(rt, intent)
        assert (await answer(rt, intent, DispatchResult.AMBIGUOUS)).status is IntentStatus.DISPATCHING
    await dispatching(rt, intent)


# -- an attempt that ends takes its open intents with it -------------------------------------------------


async def test_a_completed_attempt_takes_its_open_intents_with_it_and_a_late_answer_changes_nothing(
    rt: Runtime,
) -> None:
    """An attempt's open intents (undispatched, or dispatched and unanswered) end when it ends
    (docs/architecture.md: inject intents and their dispatch answers): they never retarget another
    attempt. Here the attempt completes while the last try of one inject is in flight and another is
    not dispatched yet; the last try's ambiguous answer comes after. Catches: a completion that ends
    only the undispatched intents: the late answer would end the one in flight in its route's ``drop``
    error fallback and drop input the next attempt must get (or revive a dispatch to an ended attempt)."""
    first = await running(rt)
    in_flight, first_intent = await injected(rt, first, 1)
    await ambiguous_until_the_last_try(rt, first_intent)
    queued, queued_intent = await injected(rt, first, 2)
    await rt.complete(first, Completed())
    assert await statuses(rt, first) == {in_flight.id: IntentStatus.STALE, queued.id: IntentStatus.STALE}

    late = await answer(rt, first_intent, DispatchResult.AMBIGUOUS)
    assert late.status is IntentStatus.STALE
    assert (await answer(rt, first_intent, DispatchResult.ACCEPTED)).status is IntentStatus.STALE
    assert await storage_of(rt).submit(begin_dispatch_in_tx, queued_intent.id) is None, "no dispatch revives"
    assert await rt.diagnostics(kind="dispatch_gave_up") == []
    assert await input_state(rt, first.work_id, in_flight.id) is InputState.PENDING
    second = await rt.claim(first.work_id, owner="host", binding=INJECTING)
    assert [e.id for e in second.request.inputs] == [in_flight.id, queued.id], "kept for the next attempt"
    await rt.complete(second, Completed())
    assert await input_state(rt, first.work_id, in_flight.id) is InputState.CONSUMED
    assert (await rt.work(first.work_id)).state is WorkState.COMPLETED


# -- an attempt that ends by cancel or as not adoptable takes its open intents with it -------------------


async def test_cancel_makes_the_attempts_open_intents_stale(rt: Runtime) -> None:
    """Cancellation commits the cancellation of the live attempt and its intents before the Work is
    terminal (docs/recovery.md, "Cancellation"): an intent not yet dispatched and one whose dispatch is
    in flight both become stale, and the executor's late answer changes nothing. Catches: a cancel that
    leaves them open (a dispatcher would still deliver input to a cancelled attempt, and the late answer
    would record it as accepted)."""
    lease = await running(rt)
    in_flight, first = await injected(rt, lease, 1)
    await dispatching(rt, first)
    queued, _ = await injected(rt, lease, 2)
    await rt.cancel(lease.work_id)
    assert await statuses(rt, lease) == {in_flight.id: IntentStatus.STALE, queued.id: IntentStatus.STALE}
    late = await answer(rt, first, DispatchResult.ACCEPTED)
    assert late.status is IntentStatus.STALE


async def test_an_attempt_found_not_adoptable_takes_its_open_intents_with_it(
    rt: Runtime, clock: ManualClock
) -> None:
    """An attempt whose lease expired and whose executor cannot verify it fails under the recoverer's
    fence (docs/recovery.md); its open intents become stale, since they never retarget another
    attempt, and its injected input stays pending for the next one. Catches: a not-adoptable failure
    that leaves them open: the last ambiguous answer of a dispatch in flight would end the intent in
    its ``drop`` error fallback and drop input the next attempt should have had."""
    lease = await running(rt)
    in_flight, first = await injected(rt, lease, 1)
    await ambiguous_until_the_last_try(rt, first)
    queued, _ = await injected(rt, lease, 2)
    clock.advance(LEASE_MS)  # expiry is exclusive: the lease has lost its authority
    [recovery] = await rt.recover_expired(owner="recoverer")
    assert not recovery.relaunch
    await rt.not_adoptable(recovery.lease, "its process cannot be verified")
    assert await statuses(rt, lease) == {in_flight.id: IntentStatus.STALE, queued.id: IntentStatus.STALE}
    late = await answer(rt, first, DispatchResult.AMBIGUOUS)
    assert late.status is IntentStatus.STALE
    assert await rt.diagnostics(kind="dispatch_gave_up") == []
    work = await rt.work(lease.work_id)
    assert work.pending_inputs == (in_flight.id, queued.id), "kept for the next attempt"


# -- an operator interrupt targets the running attempt, once ---------------------------------------------


async def test_an_operator_interrupt_pins_the_attempts_epoch_and_a_stopping_attempt_takes_no_second(
    loom_store: str, clock: ManualClock
) -> None:
    """An operator interrupt records an interrupt intent fenced by the running attempt's epoch, and the
    attempt is stopping from that commit: a second request (another request id) finds no running attempt
    and is refused (`Conflict`), recording nothing (docs/architecture.md: interrupt intents). Catches an
    intent recorded under another epoch than the attempt's, and an interrupt that accepts any live
    attempt, stopping or not (a second control Event and intent against an attempt already stopping)."""
    fake = FakeExecutor()
    fake.capabilities.update({"inject", "interrupt"})
    interruptible = BindingRef(name="fake", executor="fake", capabilities=frozenset({"interrupt"}))
    async with open_runtime(
        loom_store, clock=clock, config=config(), plugins=[fake], actors=(), load_entry_points=False
    ) as rt:
        await publish(rt, 0)
        lease = await rt.claim(work_id_for_key(SCOPE, "a"), owner="host", binding=interruptible)
        intent = await rt.interrupt(lease.work_id, request_id="op-1")
        assert (intent.kind, intent.execution_id, intent.epoch) == (
            IntentKind.INTERRUPT,
            lease.execution_id,
            lease.epoch,
        )
        assert (await rt.execution(lease.execution_id)).state is ExecutionState.STOPPING
        events = await rt.events(limit=100)
        with pytest.raises(Conflict, match="no running attempt"):
            await rt.interrupt(lease.work_id, request_id="op-2")
        assert await rt.events(limit=100) == events
        assert await rt.intents(lease.execution_id) == [intent]


# -- an interrupt that is never confirmed takes its route's error fallback ---------------------------------


@pytest.mark.parametrize("fallback", ["drop", "queue"])
async def test_an_unconfirmed_interrupt_takes_its_routes_error_fallback_for_its_input(
    loom_store: str, clock: ManualClock, fallback: str
) -> None:
    """An interrupt route's ``error_fallback`` (docs/configuration.md: "when a supported inject or
    interrupt fails for good") applies to the interrupting Event's input: ``drop`` drops it, ``queue``
    keeps it for the next attempt. Either way the attempt stays fenced and its Work held (its process
    may still run). Catches a give-up that ignores the fallback (seen: the input stayed pending with
    ``drop``)."""
    route = {"name": "r", "types": ["r.*"], "create_work": True, "binding": "fake", "policy": "interrupt",
             "error_fallback": fallback}  # fmt: skip
    bindings = {"fake": {"executor": "fake", "capabilities": ["interrupt"]}}
    cfg = Config.from_dict({"scopes": {SCOPE: {"bindings": bindings, "routes": [route]}}})
    fake = FakeExecutor()
    fake.capabilities.add("interrupt")
    interruptible = BindingRef(name="fake", executor="fake", capabilities=frozenset({"interrupt"}))
    async with open_runtime(
        loom_store, clock=clock, config=cfg, plugins=[fake], actors=(), load_entry_points=False
    ) as rt:
        await publish(rt, 0)
        work_id = work_id_for_key(SCOPE, "a")
        lease = await rt.claim(work_id, owner="host", lease_ms=LEASE_MS, binding=interruptible)
        event = await publish(rt, 1)
        [intent] = await rt.intents(lease.execution_id)
        assert (intent.kind, intent.event_id) == (IntentKind.INTERRUPT, event.id)
        await ambiguous_until_the_last_try(rt, intent)
        assert (await answer(rt, intent, DispatchResult.AMBIGUOUS)).status is IntentStatus.GAVE_UP
        work = await rt.work(work_id)
        assert work.held
        kept = InputState.DROPPED if fallback == "drop" else InputState.PENDING
        assert await input_state(rt, work_id, event.id) is kept
        (diagnostic,) = await rt.diagnostics(kind="dispatch_gave_up")
        assert ("dropped the input" in diagnostic.message) is (fallback == "drop")
