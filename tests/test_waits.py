"""Waits through the runtime (docs/concepts.md "Wait": registration, observation,
exactly one wake, resume and continuation): input while waiting, blocked waits and their release, the wake bridge
as the continuation's causal authority, active time paused while waiting, and enrichment of a parked
waiting result. The shared wait scenarios are in `test_scenarios_waits`."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

import loom
from loom import (
    CheckpointStatus,
    Completed,
    Config,
    EventIn,
    ExecutionState,
    FiringResult,
    StaleAuthority,
    TimerState,
    Waiting,
    WaitSpec,
    WaitState,
    WorkState,
)
from loom.plugins.handlers import work_id_for_key
from loom.records.validation import MAX_TIME_MS
from loom.store import Tx
from loom.testing import RuntimeDriver, wait_routed
from loom.testing.internals import storage_of
from loom.testing.pytest_plugin import DriverFactory

SCOPE = "acme"
SECOND = 1_000


def config(
    *, resume: bool = False, timeout_ms: int | None = None, causal: dict[str, int] | None = None
) -> Config:
    capabilities = ["resume"] if resume else []
    return Config.from_dict({
        "causal": causal or {},
        "work_kinds": {"job": {"timeout_ms": timeout_ms}} if timeout_ms else {},
        "scopes": {SCOPE: {
            "bindings": {"fake": {"executor": "fake", "capabilities": capabilities}},
            "routes": [
                {"name": "skip", "types": ["d.*"], "policy": "drop", "reason": "not for this work"},
                {"name": "err", "types": ["e.*"], "handler": "scenario", "config": {"fn": "err"}},
                {"name": "w", "types": ["w.*"], "create_work": True, "binding": "fake",
                 **({"work_kind": "job"} if timeout_ms else {})},
            ],
        }},
    })  # fmt: skip


def ev(delivery_id: str, type: str = "w.note", *, key: str = "k", **fields: Any) -> EventIn:
    return EventIn(**{"source": "t", "scope": SCOPE, **fields}, delivery_id=delivery_id, type=type, key=key)


async def launches(driver: RuntimeDriver, work_id: str, n: int) -> None:
    async def enough() -> bool:
        return len(driver.fake.launches_of(work_id)) >= n

    await driver.until(enough, f"launch {n}")


async def wait_state(driver: RuntimeDriver, work_id: str, state: WaitState) -> loom.Wait:
    async def reached() -> bool:
        waits = await driver.runtime.waits(work_id)
        return bool(waits) and waits[-1].state is state

    await driver.until(reached, f"the wait to be {state}")
    return (await driver.runtime.waits(work_id))[-1]


async def started(driver: RuntimeDriver, key: str = "k") -> str:
    await driver.runtime.publish(ev(f"{key}-start", "w.start", key=key))
    work_id = work_id_for_key(SCOPE, key)
    await launches(driver, work_id, 1)
    return work_id


async def test_input_while_waiting_is_context_only_where_a_route_passes_it(
    loom_drivers: DriverFactory,
) -> None:
    async with loom_drivers(config=config()) as driver:

        def err(*args: Any) -> Any:
            raise RuntimeError("the handler is broken")

        driver.handlers.table["err"] = err
        rt = driver.runtime
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.done",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        note = await rt.publish(ev("note"))  # a route passes it: context
        stray = await rt.publish(ev("stray", "x.nothing"))  # no route: unmatched
        skipped = await rt.publish(ev("skipped", "d.skip"))  # a drop route's skip holds while it waits
        broken = await rt.publish(ev("broken", "e.fail"))  # a route that errs keeps it as context
        await wait_routed(driver, note, stray, skipped, broken)
        assert (await rt.checkpoint(stray.id)).status is CheckpointStatus.UNMATCHED  # type: ignore[union-attr]
        assert (await rt.checkpoint(skipped.id)).status is CheckpointStatus.DROP  # type: ignore[union-attr]
        kept = await rt.checkpoint(broken.id)
        assert kept is not None
        assert kept.status is CheckpointStatus.ROUTED
        assert "context" in (kept.reason or "")
        assert (await rt.work(work_id)).state is WorkState.WAITING, "no ordinary input bypasses the wait"
        done = await rt.publish(ev("done", "w.done"))
        await launches(driver, work_id, 2)
        request = driver.fake.launches_of(work_id)[1].request
        assert [e.id for e in request.inputs] == [note.id, broken.id, done.id], (
            "the ordered accumulated batch"
        )
        assert request.trigger is not None
        assert request.trigger.id == done.id
        driver.fake.finish(work_id, Completed())


async def test_a_refused_wake_blocks_the_wait_and_holds_the_work_until_released(
    loom_drivers: DriverFactory,
) -> None:
    async with loom_drivers(config=config(causal={"max_depth": 3})) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.*",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        # a winner at the depth limit: its bridge would be one deeper, and is refused
        root = await rt.publish(ev("root", "x.root", key="elsewhere"))
        parent = root
        for depth in range(1, 4):
            key = "k" if depth == 3 else "elsewhere"
            parent = await rt.publish_derived(ev(f"chain-{depth}", "w.deep", key=key), parent_id=parent.id)
        winner = parent
        blocked = await wait_state(driver, work_id, WaitState.BLOCKED)
        assert blocked.winner_event_id == winner.id
        work = await rt.work(work_id)
        assert work.held
        reason = work.hold_reason or ""
        assert "depth 4, over the limit of 3" in reason
        assert "release the hold to wake it on what has arrived" in reason
        records = [e for e in await rt.events(limit=1000) if e.type == "core.wait.blocked"]
        assert len(records) == 1
        assert records[0].is_root
        assert records[0].payload["winner"] == winner.id
        assert records[0].payload["wait"] == blocked.id
        # releasing arbitrates again, with the release as the bridge's parent: a shallow chain
        await rt.release(work_id)
        woken = await wait_state(driver, work_id, WaitState.WOKEN)
        assert woken.winner_event_id == winner.id, "the same winner, woken once"
        bridge = await rt.event(woken.bridge_event_id or "")
        release = await rt.event(bridge.parent_id or "")
        assert release.type == "core.work.released"
        assert bridge.depth == 1
        await launches(driver, work_id, 2)
        driver.fake.finish(work_id, Completed())


async def test_releasing_a_hold_on_a_work_whose_wait_is_not_blocked_records_no_release_event(
    loom_drivers: DriverFactory,
) -> None:
    """Only a blocked wait is rearmed by a release, with a ``core.work.released`` Event as its wake's
    parent: an operator hold and release of a Work whose wait is simply active leave the wait as it was
    and record no release Event. Catches ``release_in_tx`` treating every open wait as blocked."""
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.*",))))
        active = await wait_state(driver, work_id, WaitState.ACTIVE)
        await rt.hold(work_id, reason="a look first")
        released = await rt.release(work_id)
        assert not released.held
        await rt.wait_idle()
        assert [e for e in await rt.events(limit=1000) if e.type == "core.work.released"] == []
        assert (await rt.waits(work_id))[-1] == active
        done = await rt.publish(ev("done", "w.done"))
        woken = await wait_state(driver, work_id, WaitState.WOKEN)
        assert woken.winner_event_id == done.id
        await launches(driver, work_id, 2)
        driver.fake.finish(work_id, Completed())


async def test_the_wake_bridge_is_the_continuations_causal_authority(loom_drivers: DriverFactory) -> None:
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        first = driver.fake.running(work_id)
        assert first.request.trigger is not None
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.*",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        outside = await rt.publish(ev("outside", "w.comment"))  # an independent root
        woken = await wait_state(driver, work_id, WaitState.WOKEN)
        bridge = await rt.event(woken.bridge_event_id or "")
        assert bridge.type == "core.wait.woken"
        assert bridge.parent_id == outside.id, "a wake is charged to the Event that woke it"
        assert bridge.depth == 1, "an outside root starts a shallow chain"
        assert bridge.payload["winner"] == outside.id
        await launches(driver, work_id, 2)
        second = driver.fake.launches_of(work_id)[1]
        emitted = await second.toolbelt.emit(ev("emitted", "x.report", key="report/1"))
        assert emitted.parent_id == bridge.id, "the continuation derives from the bridge"
        assert bridge.id not in (await rt.work(work_id)).pending_inputs, "the bridge is never input"
        assert all(
            bridge.id not in [e.id for e in launch.request.inputs]
            for launch in driver.fake.launches_of(work_id)
        )
        driver.fake.finish(work_id, Completed())


async def test_active_time_pauses_while_waiting_and_resumes_with_the_budget_left(
    loom_drivers: DriverFactory,
) -> None:
    driver_fake_capabilities = {"resume"}
    async with loom_drivers() as driver:
        driver.fake.capabilities |= driver_fake_capabilities
        await driver.configure(config(resume=True, timeout_ms=10 * SECOND))
        rt = driver.runtime
        work_id = await started(driver)
        driver.clock.advance(4 * SECOND)  # four seconds of active time
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        driver.clock.advance(3_600 * SECOND)  # an hour of waiting costs nothing
        await rt.publish(ev("go", "w.go"))
        await launches(driver, work_id, 2)
        resumed = driver.fake.launches_of(work_id)[1]
        execution = await rt.execution(resumed.request.execution_id)
        assert execution.used_ms == 4 * SECOND
        assert execution.segment == 2
        deadline = await rt.timer(f"deadline:{execution.id}:2")
        assert deadline.fire_at_ms == driver.clock.now_ms() + 6 * SECOND, "the budget left, not a full one"
        # the resumed segment's deadline derives from the wake's bridge, the attempt's authority now
        assert execution.authority_id is not None
        assert resumed.request.trigger is not None
        assert deadline.parent_id == execution.authority_id != resumed.request.trigger.id
        driver.clock.advance(2 * SECOND)
        driver.fake.finish(work_id, Completed())

        async def completed() -> bool:
            return (await rt.execution(execution.id)).state is ExecutionState.COMPLETED

        await driver.until(completed, "the resumed attempt to complete")
        ended = await rt.execution(execution.id)
        assert ended.used_ms == 6 * SECOND, "active time adds up across segments, the wait not counted"


async def test_a_parked_waiting_result_can_be_enriched_until_it_resumes(loom_drivers: DriverFactory) -> None:
    async with loom_drivers() as driver:
        driver.fake.capabilities.add("resume")
        await driver.configure(config(resume=True))
        rt = driver.runtime
        work_id = await started(driver)
        lease = driver.fake.running(work_id).toolbelt.lease
        driver.fake.finish(
            work_id, Waiting(wait=WaitSpec(types=("w.go",)), usage={"usd": 1.5}, artifacts=("a1",))
        )
        await wait_state(driver, work_id, WaitState.ACTIVE)
        enriched = await rt.enrich_wait(lease, usage={"usd": 0.5}, artifacts=("a2",))
        assert enriched.state is ExecutionState.PARKED, "enriching does not revive authority"
        assert enriched.outcome is not None
        assert enriched.outcome["usage"] == {"usd": 2.0}
        assert enriched.outcome["artifacts"] == ["a1", "a2"]
        again = await rt.enrich_wait(lease, artifacts=("a2", "a3"))
        assert again.outcome is not None
        assert again.outcome["artifacts"] == ["a1", "a2", "a3"], "a reference already kept is not repeated"
        with pytest.raises(StaleAuthority):
            await rt.toolbelt(lease).heartbeat()
        await rt.publish(ev("go", "w.go"))
        await launches(driver, work_id, 2)
        with pytest.raises(StaleAuthority, match="stale"):
            await rt.enrich_wait(lease, artifacts=("late",))
        driver.fake.finish(work_id, Completed())


async def test_a_terminal_waiting_outcome_cannot_be_rewritten(loom_drivers: DriverFactory) -> None:
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        lease = driver.fake.running(work_id).toolbelt.lease
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        with pytest.raises(loom.Conflict, match="final"):
            await rt.enrich_wait(lease, artifacts=("late",))
        await rt.cancel(work_id)


async def test_a_resumed_attempt_derives_from_its_wake_bridge_and_enrichment_needs_its_token(
    loom_drivers: DriverFactory,
) -> None:
    """A resumed attempt's causal authority is the wake's bridge (as a continuation's is), and only the
    parked attempt's own token may enrich its waiting result. Catches: a resume that keeps the first
    trigger as the attempt's authority (its emissions would escape the wake's chain), or an enrichment
    that checks attempt and epoch but not the token (anyone who knows the ids could rewrite it)."""
    async with loom_drivers() as driver:
        driver.fake.capabilities.add("resume")
        await driver.configure(config(resume=True))
        rt = driver.runtime
        work_id = await started(driver)
        lease = driver.fake.running(work_id).toolbelt.lease
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        with pytest.raises(StaleAuthority, match="token"):
            await rt.enrich_wait(attrs.evolve(lease, token="forged-token"), artifacts=("forged",))
        parked = await rt.execution(lease.execution_id)
        assert parked.outcome is not None
        assert "forged" not in parked.outcome.get("artifacts", [])
        outside = await rt.publish(ev("go", "w.go"))
        woken = await wait_state(driver, work_id, WaitState.WOKEN)
        await launches(driver, work_id, 2)
        resumed = driver.fake.launches_of(work_id)[1]
        assert resumed.request.resumed
        assert resumed.request.trigger is not None
        assert resumed.request.trigger.id == outside.id
        emitted = await resumed.toolbelt.emit(ev("emitted", "x.report", key="report/1"))
        assert emitted.parent_id == woken.bridge_event_id, "the resumed attempt derives from the bridge"
        driver.fake.finish(work_id, Completed())


def passing_config() -> Config:
    """Route ``w.*`` starts Work under binding ``fake``; ``r.*`` only passes input to its Work (no
    binding); ``a.*`` passes it under binding ``alt``."""
    routes = [
        {"name": "replies", "types": ["r.*"]},
        {"name": "alt", "types": ["a.*"], "binding": "alt"},
        {"name": "w", "types": ["w.*"], "create_work": True, "binding": "fake"},
    ]
    bindings = {"fake": {"executor": "fake"}, "alt": {"executor": "fake"}}
    return Config.from_dict({"scopes": {SCOPE: {"bindings": bindings, "routes": routes}}})


async def test_a_continuation_runs_with_the_waited_attempts_binding_whatever_route_its_winner_took(
    loom_drivers: DriverFactory,
) -> None:
    """Attempt N+1 carries on the waited attempt (docs/concepts.md "Wait"): a winner routed
    through a route without a binding (one that only passes replies to their Work) or with another
    binding still starts the continuation, under the binding the waited attempt ran with.

    Catches: taking the binding from the winner's route (no continuation ever starts after a reply
    through a binding-less route: the Work stays ready with its wake; or the second Work's continuation
    runs under ``alt``)."""
    async with loom_drivers(config=passing_config()) as driver:
        rt = driver.runtime
        for key, winner in (("k", "r.done"), ("j", "a.done")):
            work_id = await started(driver, key)
            driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=(winner,))))
            await wait_state(driver, work_id, WaitState.ACTIVE)
            done = await rt.publish(ev(f"{key}-done", winner, key=key))
            await launches(driver, work_id, 2)
            request = driver.fake.launches_of(work_id)[1].request
            assert request.attempt == 2
            assert request.trigger is not None
            assert request.trigger.id == done.id
            assert request.binding == "fake", f"the continuation of {key} ran under {request.binding}"
            driver.fake.finish(work_id, Completed())


async def test_input_through_a_route_without_a_binding_runs_the_next_attempt_under_the_last_binding(
    loom_drivers: DriverFactory,
) -> None:
    """A reply that arrives while an attempt runs stays pending; when the attempt completes the Work is
    ready again, and its next attempt runs under the binding its last attempt ran with, since the
    reply's route names none. Catches: no binding found for the next attempt (the Work stays ready
    with pending input and nothing ever starts it)."""
    async with loom_drivers(config=passing_config()) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        late = await rt.publish(ev("late", "r.late"))
        await wait_routed(driver, late)
        driver.fake.finish(work_id, Completed())
        await launches(driver, work_id, 2)
        request = driver.fake.launches_of(work_id)[1].request
        assert request.trigger is not None
        assert request.trigger.id == late.id
        assert request.binding == "fake"
        driver.fake.finish(work_id, Completed())


async def test_a_resumed_attempt_waits_again_only_after_its_raised_watermark(
    loom_drivers: DriverFactory,
) -> None:
    """A wait with no ``after_seq`` watches what is accepted after the attempt's acknowledged
    watermark, the highest sequence it was handed (docs/concepts.md "Wait"); a resume hands the
    attempt its winner and batch, so the watermark moves up to them. Catches: a resume that keeps the
    first segment's watermark (the attempt's next wait would scan from there and wake at once on an
    Event accepted before what it was handed, here one no route took while it waited)."""
    async with loom_drivers() as driver:
        driver.fake.capabilities.add("resume")
        await driver.configure(config(resume=True))
        rt = driver.runtime
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        stray = await rt.publish(ev("stray", "x.stray"))  # no route: unmatched, never input
        go = await rt.publish(ev("go", "w.go"))
        await launches(driver, work_id, 2)
        resumed = driver.fake.launches_of(work_id)[1]
        assert resumed.request.resumed
        assert stray.seq < go.seq
        assert (await rt.execution(resumed.request.execution_id)).watermark == go.seq
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("x.*",))))

        async def second_wait() -> loom.Wait | None:
            # one wait per epoch: the resumed segment's is the epoch-2 one
            return next((w for w in await rt.waits(work_id) if w.epoch == 2), None)

        async def registered() -> bool:
            return await second_wait() is not None

        await driver.until(registered, "the resumed segment's wait")
        await driver.settle()
        second = await second_wait()
        assert second is not None
        assert (second.after_seq, second.state) == (go.seq, WaitState.ACTIVE), (
            f"woken by {second.winner_event_id}, accepted before the attempt's watermark"
        )
        assert len(driver.fake.launches_of(work_id)) == 2
        later = await rt.publish(ev("later", "x.later"))
        await launches(driver, work_id, 3)
        woken = await second_wait()
        assert woken is not None
        assert woken.winner_event_id == later.id
        driver.fake.finish(work_id, Completed())


async def test_a_wait_timeout_is_clamped_to_the_last_representable_time(loom_drivers: DriverFactory) -> None:
    """A wait's timeout is at most `MAX_TIME_MS` (times are milliseconds up to the year 9999): a
    timeout that would run past it fires at that last instant instead. Catches: a deadline of
    ``now + timeout_ms`` unclamped (the timer could not be armed, so a legal waiting outcome with the
    largest timeout would be refused)."""
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",), timeout_ms=MAX_TIME_MS)))
        wait = await wait_state(driver, work_id, WaitState.ACTIVE)
        assert wait.timeout_at_ms == MAX_TIME_MS
        assert wait.timeout_timer_id is not None
        timer = await rt.timer(wait.timeout_timer_id)
        assert (timer.state, timer.fire_at_ms) == (TimerState.ARMED, MAX_TIME_MS)
        await rt.cancel(work_id)


async def test_a_released_wait_rearms_its_refused_timeout_at_the_release_not_in_the_past(
    loom_drivers: DriverFactory,
) -> None:
    """A blocked wait's release rearms its unfired timeout (docs/concepts.md "Wait": the release rearms
    its subscriptions and an unfired timeout): at its deadline, or at the release if the deadline passed
    while the wait was blocked with its timeout disarmed. Here the causal limits refuse the timeout
    (the trigger is already at the depth limit), which blocks the wait; the release rearms it, and it
    fires at the release. Catches: a timeout rearmed at its old deadline (its firing would be backdated
    to a time when no timeout was armed), or one not rearmed at all."""
    async with loom_drivers(config=config(causal={"max_depth": 1})) as driver:
        rt = driver.runtime
        root = await rt.publish(ev("root", "x.root", key="elsewhere"))
        await rt.publish_derived(ev("k-start", "w.start"), parent_id=root.id)  # the trigger: depth 1
        work_id = work_id_for_key(SCOPE, "k")
        await launches(driver, work_id, 1)
        deadline = driver.clock.now_ms() + 10 * SECOND
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",), timeout_ms=10 * SECOND)))
        wait = await wait_state(driver, work_id, WaitState.ACTIVE)
        assert wait.timeout_timer_id is not None
        timer_id = wait.timeout_timer_id
        driver.clock.advance(10 * SECOND)
        blocked = await wait_state(driver, work_id, WaitState.BLOCKED)
        assert "refused its timeout" in (blocked.reason or "")
        [refused] = await rt.firings(timer_id)
        assert (refused.result, refused.fire_at_ms) == (FiringResult.REFUSED, deadline)
        driver.clock.advance(5 * SECOND)
        released_at = driver.clock.now_ms()
        await rt.release(work_id)

        async def fired_again() -> bool:
            return len(await rt.firings(timer_id)) == 2

        await driver.until(fired_again, "the rearmed timeout to fire")
        rearmed = (await rt.firings(timer_id))[-1]
        assert rearmed.revision > refused.revision
        assert rearmed.fire_at_ms == released_at, "rearmed in the past, at the deadline it missed"
        await rt.cancel(work_id)


async def test_a_twice_resumed_attempt_is_presented_with_its_latest_winner(
    loom_drivers: DriverFactory,
) -> None:
    """A resumed attempt's trigger is the winner of its latest wake, also when its lease is presented
    again by token (`Runtime.lease_for`, what an executor's subprocess calling the service does), and
    `Runtime.waits` lists the waits oldest first. Here each attempt parks twice within one millisecond
    of business time (the clock does not move), for a few keys. Catches: waits ordered by registration
    time and then by id (a hash): two waits registered in the same millisecond come back in an
    arbitrary order, and the presented lease names the first wake's winner as the trigger."""
    async with loom_drivers() as driver:
        driver.fake.capabilities.add("resume")
        await driver.configure(config(resume=True))
        rt = driver.runtime
        for key in ("k0", "k1", "k2", "k3"):
            work_id = await started(driver, key)
            winners = []
            for n in (1, 2):
                driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",))))
                winners.append(await rt.publish(ev(f"{key}-go-{n}", "w.go", key=key)))
                await launches(driver, work_id, n + 1)
            running = driver.fake.running(work_id)
            assert running.request.trigger == winners[-1]
            assert [(w.epoch, w.winner_event_id) for w in await rt.waits(work_id)] == [
                (1, winners[0].id),
                (2, winners[1].id),
            ], "oldest first"
            presented = await rt.lease_for(running.request.execution_id, running.toolbelt.lease.token)
            assert presented.request.trigger is not None
            assert presented.request.trigger.id == winners[-1].id, f"{key}: the first wake's winner"
            driver.fake.finish(work_id, Completed())


async def test_a_transaction_reads_the_open_waits_on_a_key_anew_after_it_writes_a_wait(
    loom_drivers: DriverFactory,
) -> None:
    """Routing reads the open waits on an Event's key before and after it routes it, and the second
    read is answered from the first while no wait was written. Catches: a wait cancelled, or one
    inserted, still answered as before; a cancel rolled back with its savepoint still answered."""
    async with loom_drivers(config=config()) as driver:
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.done",))))
        wait = await wait_state(driver, work_id, WaitState.ACTIVE)
        seen: list[list[str]] = []

        def reads(tx: Tx, now_ms: int) -> None:
            def look() -> None:
                seen.append([w.id for w in tx.open_waits_on_key("k")])

            seen.clear()  # a batch that fails unguarded runs again guarded: what counts is the last run
            look()
            look()
            try:
                with tx.savepoint():
                    tx.set_wait_state(wait, WaitState.CANCELLED, reason="undone")
                    look()
                    raise LookupError("undo it")
            except LookupError:
                pass
            look()
            tx.set_wait_state(wait, WaitState.CANCELLED, reason="cancelled")
            look()
            tx.insert_wait(attrs.evolve(wait, id="another"))
            look()
            raise LookupError("change nothing")  # the request's own error undoes all of it

        with pytest.raises(LookupError, match="change nothing"):
            await storage_of(driver.runtime).submit(reads)
        assert seen == [[wait.id], [wait.id], [], [wait.id], [], ["another"]]
        assert (await driver.runtime.waits(work_id))[-1].state is WaitState.ACTIVE


async def test_a_transactions_work_read_answers_what_the_readers_does(loom_drivers: DriverFactory) -> None:
    """The transaction reads a Work's row, keys, live attempt and open wait in one query; the host's
    reader reads them one by one. Both answer the same Work: one running (its live attempt) and one
    waiting (its open wait), each with a second key attached later that sorts before its first.
    Catches: keys in name order instead of attachment order, a live attempt or open wait missed."""
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        waiting = await started(driver)
        driver.fake.finish(waiting, Waiting(wait=WaitSpec(types=("w.done",))))
        await wait_state(driver, waiting, WaitState.ACTIVE)
        running = await started(driver, key="r")

        def attach_and_read(tx: Tx, now_ms: int) -> list[loom.Work | None]:
            tx.attach_key("a-later", waiting, 10**6, now_ms)
            tx.attach_key("a-later-too", running, 10**6, now_ms)
            return [tx.work(waiting), tx.work(running)]

        in_tx = await storage_of(rt).submit(attach_and_read)
        assert in_tx == [await rt.work(waiting), await rt.work(running)]
        w, r = in_tx
        assert w is not None
        assert r is not None
        assert (w.keys, w.wait_id is not None, w.current_execution_id) == (("k", "a-later"), True, None)
        assert r.keys == ("r", "a-later-too")
        assert r.current_execution_id is not None
        assert r.execution_state is ExecutionState.RUNNING


async def test_a_wait_is_woken_by_an_event_a_drop_route_takes(loom_drivers: DriverFactory) -> None:
    """Waiting Work evaluates its wait before any route's policy: a wait matches accepted Events by key
    and type, whatever routing did with them (docs/configuration.md, `policy`). Catches a wake scan
    that skips dropped Events (the wait would hang until its timeout), and a drop that queues."""
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        work_id = await started(driver)
        driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("d.reply",))))
        await wait_state(driver, work_id, WaitState.ACTIVE)
        reply = await rt.publish(ev("reply", "d.reply"))
        await wait_routed(driver, reply)
        assert (await rt.checkpoint(reply.id)).status is CheckpointStatus.DROP  # type: ignore[union-attr]
        woken = await wait_state(driver, work_id, WaitState.WOKEN)
        assert woken.winner_event_id == reply.id
        await launches(driver, work_id, 2)
        request = driver.fake.launches_of(work_id)[1].request
        assert request.trigger is not None
        assert request.trigger.id == reply.id
        driver.fake.finish(work_id, Completed())
