"""Active-event policies: explicit fallbacks for unsupported controls, and completion against
injection."""

from __future__ import annotations

from typing import Any

import trio

from ... import (
    CheckpointStatus,
    Completed,
    ConfigError,
    Conflict,
    Event,
    IntentKind,
    IntentStatus,
    Policy,
    Work,
    WorkState,
)
from ...plugins.handlers import correlate, work_id_for_key
from .._driver import Driver, wait_routed
from .._fake import InjectAnswer
from .._scenario import expect
from ._common import (
    SCOPE,
    _checkpoint,
    _config,
    _ev,
)


async def unsupported_policy_explicit_fallback(driver: Driver) -> None:
    """Unsupported controls are refused at validation or take an explicit, recorded fallback;
    an ambiguous supported inject is retried with the same intent."""
    base = driver.runtime.config.generation
    inject_route = {
        "name": "inj",
        "types": ["p.*"],
        "create_work": True,
        "binding": "fake",
        "policy": "inject",
    }
    try:
        await driver.configure(_config([inject_route]))
        refused = None
    except ConfigError as exc:
        refused = exc
    expect(
        refused is not None and "inj" in str(refused) and "inject" in str(refused),
        f"an inject route on an executor without inject was not refused by name: {refused}",
    )
    expect(driver.runtime.config.generation == base, "a refused config changed the generation in force")
    for bad, word in (
        ({"policy": "teleport"}, "teleport"),
        ({"policy": "coalesce"}, "coalesce"),
        ({"policy": "inject", "fallback": ["interrupt", "inject"]}, "cycle"),
    ):
        try:
            _config([{**inject_route, **bad}])
            problem = None
        except ConfigError as exc:
            problem = exc
        expect(
            problem is not None and word in str(problem), f"config {bad} was not refused ({word}): {problem}"
        )

    await driver.configure(_config([{**inject_route, "fallback": ["queue"]}]))
    await driver.runtime.publish(_ev("p1", "p.start", key="pk"))
    work_id = work_id_for_key(SCOPE, "pk")

    async def launched() -> bool:
        return bool(driver.fake.launches_of(work_id))

    await driver.until(launched, "the fallback route's Work to launch")
    second = await driver.runtime.publish(_ev("p2", "p.more", key="pk"))
    await wait_routed(driver, second)
    cp = await _checkpoint(driver, second)
    expect(
        cp.policy is Policy.INJECT and cp.effective_policy is Policy.QUEUE and cp.fallback_reason,
        f"the queue fallback and its reason were not recorded: {cp}",
    )
    expect(
        second.id in (await driver.runtime.work(work_id)).pending_inputs, "the fallback did not queue input"
    )
    driver.fake.finish(work_id, Completed())
    await driver.settle()
    generation = driver.runtime.config.generation
    await driver.reopen()
    expect(
        driver.runtime.config.generation == generation and await _checkpoint(driver, second) == cp,
        "the fallback checkpoint or the generation in force changed across a reopen",
    )

    driver.fake.capabilities.add("inject")
    await driver.configure(_config([inject_route], capabilities=["inject"]))
    await driver.runtime.publish(_ev("q1", "p.start", key="qk"))
    work_id = work_id_for_key(SCOPE, "qk")

    async def q_launched() -> bool:
        return bool(driver.fake.launches_of(work_id))

    await driver.until(q_launched, "the inject route's Work to launch")
    driver.fake.inject_answers = [InjectAnswer.AMBIGUOUS, InjectAnswer.ACCEPT]
    injected = await driver.runtime.publish(_ev("q2", "p.more", key="qk"))
    execution_id = driver.fake.running(work_id).request.execution_id

    async def retry_scheduled() -> int | None:
        intents = await driver.runtime.intents(execution_id)
        return next((i.next_attempt_ms for i in intents if i.next_attempt_ms is not None), None)

    async def first_try() -> bool:
        return await retry_scheduled() is not None

    await driver.until(first_try, "the first, ambiguous inject to schedule its retry")
    retry_at = await retry_scheduled()
    assert retry_at is not None
    driver.clock.set(max(retry_at, driver.clock.now_ms()))

    async def accepted() -> bool:
        return any(i.status is IntentStatus.ACCEPTED for i in await driver.runtime.intents(execution_id))

    await driver.until(accepted, "the retried inject to be accepted")
    intents = [i for i in await driver.runtime.intents(execution_id) if i.event_id == injected.id]
    expect(
        len(intents) == 1 and intents[0].attempts == 2,
        f"an ambiguous inject was not retried once with the same intent identity: {intents}",
    )
    cp = await _checkpoint(driver, injected)
    expect(
        cp.effective_policy is Policy.INJECT and not cp.fallback_reason,
        f"an ambiguous supported inject took the unsupported path: {cp}",
    )
    driver.fake.finish(work_id, Completed())
    await driver.settle()


async def completion_inject_orders(driver: Driver) -> None:
    """Committed inject intents retain unconfirmed input; unrouted input blocks terminal
    completion (refused for that reason); consumed_inputs is the only consumption proof, whatever
    the order, and it consumes only input whose inject intent was dispatched and not refused."""
    driver.fake.capabilities.add("inject")
    hold = trio.Event()

    async def holding(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.payload.get("hold"):
            await hold.wait()
        return correlate(event, scope, work, route)

    driver.handlers.table["inj"] = holding
    await driver.configure(
        _config(
            [
                {
                    "name": "inj",
                    "types": ["i.*"],
                    "handler": "scenario",
                    "create_work": True,
                    "binding": "fake",
                    "policy": "inject",
                    "config": {"fn": "inj"},
                },
                {"name": "queued", "types": ["q.*"], "create_work": True, "binding": "fake"},
            ],
            capabilities=["inject"],
        )
    )

    async def launch_count(work_id: str, n: int) -> None:
        async def check() -> bool:
            return len(driver.fake.launches_of(work_id)) >= n

        await driver.until(check, f"attempt {n} of {work_id} to launch")

    # 1. intent before inject; no proof keeps input pending; attempt N+1 gets it
    await driver.runtime.publish(_ev("i0", "i.start", key="ik"))
    w = work_id_for_key(SCOPE, "ik")
    await launch_count(w, 1)
    seen: list[IntentStatus] = []

    async def on_inject(execution_id: str, event: Event) -> None:
        seen.extend(i.status for i in await driver.runtime.intents(execution_id) if i.event_id == event.id)

    driver.fake.on_inject = on_inject
    e = await driver.runtime.publish(_ev("i1", "i.more", key="ik"))

    async def injected() -> bool:
        return any(ev == e.id for _, ev in driver.fake.injected)

    await driver.until(injected, "e to be injected")
    expect(seen == [IntentStatus.DISPATCHING], f"the inject intent was not committed before inject: {seen}")
    driver.fake.on_inject = None
    driver.fake.finish(w, Completed())
    await launch_count(w, 2)
    second = driver.fake.launches_of(w)[1]
    expect(
        e.id in [x.id for x in second.request.inputs], "attempt 2 did not get the unconsumed injected input"
    )
    expect((await driver.runtime.work(w)).state is WorkState.RUNNING, "W did not stay live for attempt 2")

    # 2. an accepted but unrouted event blocks terminal completion
    held = await driver.runtime.publish(_ev("i2", "i.more", key="ik", payload={"hold": True}))
    try:
        await driver.runtime.complete(second.toolbelt.lease, Completed())
        blocked = None
    except Conflict as exc:
        blocked = exc
    expect(blocked is not None, "terminal completion succeeded while an accepted event for W was unrouted")
    expect(
        held.id in str(blocked) and "not routed" in str(blocked),
        f"completion was refused for another reason than the unrouted event {held.id}: {blocked}",
    )
    hold.set()
    await wait_routed(driver, held)
    await driver.runtime.complete(second.toolbelt.lease, Completed())
    expect((await driver.runtime.work(w)).state is not WorkState.COMPLETED, "W completed with pending input")
    driver.fake.finish(w, Completed())
    await launch_count(w, 3)

    # 3. completion first, then a new event: terminal
    third = driver.fake.launches_of(w)[2]
    driver.fake.finish(w, Completed())

    async def done() -> bool:
        return (await driver.runtime.work(w)).state is WorkState.COMPLETED

    await driver.until(done, "W to complete")
    late = await driver.runtime.publish(_ev("i3", "i.more", key="ik"))
    await wait_routed(driver, late)
    expect(
        (await _checkpoint(driver, late)).status is CheckpointStatus.TERMINAL,
        "a post-terminal event was not terminal",
    )
    expect(
        third.request.inputs and [x.id for x in third.request.inputs] == [held.id],
        f"attempt 3 did not get the event routed after the refused completion: {third.request.inputs}",
    )
    await driver.settle()
    await driver.reopen()

    # 4. a proof while the acknowledgement is in flight consumes; the late ack keeps it consumed
    await driver.runtime.publish(_ev("j0", "i.start", key="jk"))
    w2 = work_id_for_key(SCOPE, "jk")
    await launch_count(w2, 1)
    launch = driver.fake.running(w2)
    driver.fake.inject_gate = trio.Event()
    e5 = await driver.runtime.publish(_ev("j1", "i.more", key="jk"))

    async def in_flight() -> bool:
        return any(
            i.status is IntentStatus.DISPATCHING
            for i in await driver.runtime.intents(launch.request.execution_id)
        )

    await driver.until(in_flight, "the inject of e5 to be in flight")
    await driver.runtime.complete(launch.toolbelt.lease, Completed(consumed_inputs=(e5.id,)))
    driver.fake.inject_gate.set()
    driver.fake.inject_gate = None
    driver.fake.finish(w2, Completed())
    await driver.settle()
    intents = [i for i in await driver.runtime.intents(launch.request.execution_id) if i.event_id == e5.id]
    expect(
        [i.status for i in intents] == [IntentStatus.CONSUMED],
        f"a proof with the acknowledgement in flight did not stay consumed: {intents}",
    )
    expect(e5.id not in (await driver.runtime.work(w2)).pending_inputs, "the proved input is still pending")

    # ... and an inject answered "not accepting" settles its intent and retains the input
    await driver.runtime.publish(_ev("k0", "i.start", key="kk"))
    w3 = work_id_for_key(SCOPE, "kk")
    await launch_count(w3, 1)
    execution_id = driver.fake.running(w3).request.execution_id
    driver.fake.inject_answers = [InjectAnswer.NOT_ACCEPTING]
    e6 = await driver.runtime.publish(_ev("k1", "i.more", key="kk"))

    async def settled() -> bool:
        return any(i.status is IntentStatus.NOT_ACCEPTING for i in await driver.runtime.intents(execution_id))

    await driver.until(settled, "the not-accepting answer to settle the intent")
    expect(e6.id in (await driver.runtime.work(w3)).pending_inputs, "a not-accepted input was not retained")

    # 5. only an input whose inject intent was dispatched (and not refused) can be proved consumed:
    # neither the not-accepted e6 nor e7, queued with no intent at all, although the result names both
    e7 = await driver.runtime.publish(_ev("k2", "q.more", key="kk"))
    await wait_routed(driver, e7)
    cp7 = await _checkpoint(driver, e7)
    expect(cp7.effective_policy is Policy.QUEUE, f"e7 should be queued for the running attempt: {cp7}")
    intents = await driver.runtime.intents(execution_id)
    expect(
        [(i.kind, i.event_id) for i in intents] == [(IntentKind.INJECT, e6.id)],
        f"the attempt should hold exactly e6's inject intent: {intents}",
    )
    driver.fake.finish(w3, Completed(consumed_inputs=(e6.id, e7.id)))

    async def ended() -> bool:
        return (await driver.runtime.execution(execution_id)).state.terminal

    await driver.until(ended, "the first attempt of W3 to end")
    pending = (await driver.runtime.work(w3)).pending_inputs
    expect(
        list(pending) == [e6.id, e7.id],
        "a completion consumed an input whose inject intent was never dispatched or was not accepted; "
        f"both must stay pending for the next attempt: pending {pending}",
    )
    await launch_count(w3, 2)
    retry = driver.fake.launches_of(w3)[1]
    expect(
        [x.id for x in retry.request.inputs] == [e6.id, e7.id],
        f"the next attempt was not handed the unconsumed e6 and e7: {retry.request.inputs}",
    )
    expect(
        [i.status for i in await driver.runtime.intents(execution_id)] == [IntentStatus.NOT_ACCEPTING],
        "a proof changed the settled not-accepting intent",
    )
    driver.fake.finish(w3, Completed())
    await driver.settle()
    expect((await driver.runtime.work(w3)).state is WorkState.COMPLETED, "W3 did not complete")
    await driver.reopen()
