"""No input, plugin or handler can stop the runtime, and nothing waits forever or gives up silently.

Each test feeds one bad value or one misbehaving plugin and checks three things: the item takes its
defined failure path (an Event stays unrouted with a diagnostic, an attempt fails with the reason, a
Work is held with a reason), every other item goes on, and (on a file) a restart comes up and stays up.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

import loom
from loom import (
    CheckpointStatus,
    Completed,
    Config,
    Deliver,
    DiagnosticKind,
    EventIn,
    ExecutionState,
    InvalidRequest,
    Work,
    WorkState,
)
from loom.plugins.handlers import correlate, work_id_for_key
from loom.testing import T0_MS, RuntimeDriver, wait_routed
from loom.testing._fake import InjectAnswer

SCOPE = "acme"
LEASE_MS = 30_000


def ev(delivery_id: str, type: str = "job.run", *, key: str | None = "k", **fields: Any) -> EventIn:
    return EventIn(**{"source": "t", "scope": SCOPE, **fields}, delivery_id=delivery_id, type=type, key=key)


def routes(*extra: dict[str, Any], binding: bool = False, work_kinds: dict[str, Any] | None = None) -> Config:
    scope: dict[str, Any] = {
        "routes": [
            *extra,
            {
                "name": "jobs",
                "types": ["job.*"],
                "create_work": True,
                **({"binding": "fake"} if binding else {}),
            },
        ]
    }
    if binding:
        scope["bindings"] = {"fake": {"executor": "fake"}}
    return Config.from_dict({"scopes": {SCOPE: scope}, "work_kinds": work_kinds or {}})


async def until(driver: RuntimeDriver, check: Callable[[], Awaitable[bool]], what: str) -> None:
    await driver.until(check, what)


async def a_good_event_still_routes(driver: RuntimeDriver, delivery_id: str) -> None:
    good = await driver.runtime.publish(ev(delivery_id, key=f"good/{delivery_id}"))
    (checkpoint,) = await wait_routed(driver, good)
    assert checkpoint.status is CheckpointStatus.ROUTED


# -- route handlers ---------------------------------------------------------------------------------------

NONSENSE: list[tuple[str, Callable[[], Any], str]] = [
    ("a Deliver with no Work id", lambda: Deliver(work_id=None, create=True), "Deliver.work_id"),  # type: ignore[arg-type]
    (
        "a key that is not Unicode",
        lambda: Deliver(work_id="w", create=True, attach_keys=("\ud800",)),
        "Unicode",
    ),
    ("an empty key", lambda: Deliver(work_id="w", create=True, attach_keys=("",)), "attach_keys"),
    ("a string", lambda: "route it please", "not a Deliver"),
    ("nothing", lambda: None, "not a Deliver"),
]


@pytest.mark.parametrize(("case", "answer", "named"), NONSENSE, ids=[c[0] for c in NONSENSE])
async def test_a_handler_answering_nonsense_leaves_its_event_unrouted_and_the_runtime_up(
    loom_drivers: Any, case: str, answer: Callable[[], Any], named: str
) -> None:
    async with loom_drivers(config=routes({"name": "odd", "types": ["odd.*"], "handler": "scenario",
                                           "config": {"fn": "odd"}})) as driver:  # fmt: skip
        driver.handlers.table["odd"] = lambda *args: answer()
        bad = await driver.runtime.publish(ev("bad", "odd.thing"))
        (checkpoint,) = await wait_routed(driver, bad)
        assert checkpoint.status is CheckpointStatus.UNROUTED
        (diagnostic,) = await driver.runtime.diagnostics(subject=bad.id)
        assert diagnostic.kind == DiagnosticKind.HANDLER_ERROR
        assert named in diagnostic.message
        await a_good_event_still_routes(driver, "after")
        await driver.reopen()  # a restart after the bad input comes up and stays up
        await a_good_event_still_routes(driver, "after-restart")
        assert (await driver.runtime.checkpoint(bad.id)) == checkpoint


async def test_an_event_whose_successor_key_is_too_long_stays_unrouted_and_restarts_stay_up(
    loom_drivers: Any,
) -> None:
    config = Config.from_dict({
        "scopes": {SCOPE: {"routes": [{"name": "r", "types": ["r.*"], "create_work": True, "work_kind": "again"}]}},
        "work_kinds": {"again": {"reopen": True}},
    })  # fmt: skip
    key = "x" * 490  # within the 500-character limit; its successor key is not
    async with loom_drivers(config=config) as driver:
        rt = driver.runtime
        first = await rt.publish(ev("r1", "r.start", key=key))
        await wait_routed(driver, first)
        work = await rt.work_for_key(key)
        await rt.complete(await rt.claim(work.id, owner="host"), Completed())
        late = await rt.publish(ev("r2", "r.late", key=key))
        (checkpoint,) = await wait_routed(driver, late)
        assert checkpoint.status is CheckpointStatus.UNROUTED
        assert "longer than 500" in (checkpoint.reason or "")
        await driver.reopen()
        await driver.reopen()
        fine = await driver.runtime.publish(ev("r3", "r.start", key="short"))
        assert (await wait_routed(driver, fine))[0].status is CheckpointStatus.ROUTED


# -- executors and start gates ----------------------------------------------------------------------------

BAD_OUTCOMES: list[tuple[str, Any, str]] = [
    (
        "None (a forgotten return)",
        None,
        "must be a Completed, Handoff, Failed or Waiting outcome, got NoneType",
    ),
    ("an unserialisable usage amount", Completed(usage={"x": object()}), "usage"),  # type: ignore[dict-item]
    ("consumed_inputs of None", Completed(consumed_inputs=None), "consumed_inputs"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("case", "outcome", "named"), BAD_OUTCOMES, ids=[c[0] for c in BAD_OUTCOMES])
async def test_an_executor_answering_nonsense_fails_its_attempt_and_nothing_else(
    loom_drivers: Any, case: str, outcome: Any, named: str
) -> None:
    async with loom_drivers(config=routes(binding=True)) as driver:
        rt = driver.runtime
        await rt.publish(ev("j1", key="bad"))
        work_id = work_id_for_key(SCOPE, "bad")

        async def launched() -> bool:
            return bool(driver.fake.launches_of(work_id))

        await until(driver, launched, "the attempt to launch")
        driver.fake.finish(work_id, outcome)

        async def failed() -> bool:
            history = await rt.history(work_id)
            return any(x.state is ExecutionState.FAILED for x in history.executions)

        await until(driver, failed, "the attempt to fail")
        (execution,) = (await rt.history(work_id)).executions
        assert named in str((execution.outcome or {}).get("error"))
        work = await rt.work(work_id)
        assert work.state is WorkState.READY, "the Work is not left running"
        (diagnostic,) = await rt.diagnostics(kind=DiagnosticKind.EXECUTOR_FAILED)
        assert diagnostic.subject == execution.id
        driver.fake.auto_complete = True
        await a_good_event_still_routes(driver, "after")


async def test_a_start_gate_that_raises_holds_its_work_with_the_reason(loom_drivers: Any) -> None:
    class Gates:
        @loom.hookimpl
        def loom_start_gates(self) -> Mapping[str, Any]:
            def budget(work: Work) -> str | None:
                if "broken" in work.keys[0]:
                    raise RuntimeError("the budget service is down")
                return None

            return {"budget": budget}

    async with loom_drivers(config=routes(binding=True), plugins=(Gates(),)) as driver:
        rt = driver.runtime
        driver.fake.auto_complete = True
        await rt.publish(ev("j1", key="broken/1"))
        await rt.publish(ev("j2", key="fine/1"))
        broken = work_id_for_key(SCOPE, "broken/1")

        async def held() -> bool:
            try:
                return (await rt.work(broken)).held
            except loom.NotFound:
                return False

        await until(driver, held, "the gate's failure to hold the Work")
        work = await rt.work(broken)
        assert "start gate budget failed: RuntimeError: the budget service is down" in (
            work.hold_reason or ""
        )
        assert "release" in (work.hold_reason or ""), "the reason says what a person can do"
        (diagnostic,) = await rt.diagnostics(kind=DiagnosticKind.GATE_FAILED)
        assert diagnostic.subject == broken
        await driver.settle()
        assert (await rt.work(work_id_for_key(SCOPE, "fine/1"))).state is WorkState.COMPLETED
        assert not driver.fake.launches_of(broken)


async def test_an_interrupt_that_raises_after_a_cancel_is_contained(loom_drivers: Any) -> None:
    async with loom_drivers(config=routes(binding=True), lease_ms=LEASE_MS) as driver:
        rt = driver.runtime

        async def broken_interrupt(execution_id: str) -> None:
            raise ConnectionError("the executor's control socket is gone")

        driver.fake.interrupt = broken_interrupt  # type: ignore[method-assign]
        await rt.publish(ev("j1", key="slow"))
        work_id = work_id_for_key(SCOPE, "slow")

        async def launched() -> bool:
            return bool(driver.fake.launches_of(work_id))

        await until(driver, launched, "the attempt to launch")
        await rt.cancel(work_id)  # fences the attempt; stopping its process is cleanup that raises

        async def diagnosed() -> bool:
            return bool(await rt.diagnostics(kind=DiagnosticKind.INTERRUPT_FAILED))

        await until(driver, diagnosed, "the failed interrupt's diagnostic")
        driver.fake.auto_complete = True
        await a_good_event_still_routes(driver, "after")


# -- blocked steps wait for their condition, not for a count -------------------------------------------


async def test_a_completion_waiting_for_routing_commits_after_a_thousand_events_and_two_leases(
    loom_drivers: Any,
) -> None:
    release = trio.Event()

    async def slow(event: loom.Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.payload.get("slow"):
            await release.wait()
        return correlate(event, scope, work, route)

    config = routes({"name": "held", "types": ["job.*"], "handler": "scenario", "create_work": True,
                     "binding": "fake", "config": {"fn": "slow"}}, binding=True)  # fmt: skip
    async with loom_drivers(config=config, lease_ms=LEASE_MS) as driver:
        rt = driver.runtime
        driver.handlers.table["slow"] = slow
        await rt.publish(ev("first", key="w"))
        work_id = work_id_for_key(SCOPE, "w")

        async def launched() -> bool:
            return bool(driver.fake.launches_of(work_id))

        await until(driver, launched, "the attempt to launch")
        held = await rt.publish(ev("held", key="w", payload={"slow": True}))
        attempt = driver.fake.running(work_id)
        driver.fake.finish(work_id, Completed())  # its completion must wait for `held` to be routed
        execution_id = attempt.request.execution_id
        for i in range(1000):
            await rt.publish(ev(f"noise-{i}", "noise.x", key=f"noise/{i}"))
        for _ in range(4):  # two lease lengths of business time, in steps the renewals keep up with
            driver.clock.advance(LEASE_MS // 2)
            now = driver.clock.now_ms()

            async def renewed(now: int = now) -> bool:
                return ((await rt.execution(execution_id)).expires_at_ms or 0) > now + LEASE_MS // 2

            await until(driver, renewed, "the waiting attempt's lease to be renewed")
        execution = await rt.execution(execution_id)
        assert execution.state is ExecutionState.RUNNING, "the waiting attempt kept its lease"
        release.set()

        async def committed() -> bool:
            return (await rt.execution(execution_id)).state is ExecutionState.COMPLETED

        await until(driver, committed, "the completion to commit")
        assert (await rt.work(work_id)).state is not WorkState.COMPLETED, "the routed Event keeps it going"
        assert held.id in [
            e.id for launch in driver.fake.launches_of(work_id)[1:] for e in launch.request.inputs
        ] or (held.id in (await rt.work(work_id)).pending_inputs)


async def test_a_lane_behind_an_earlier_event_waits_through_a_thousand_unrelated_changes(
    loom_drivers: Any,
) -> None:
    release = trio.Event()

    async def slow(event: loom.Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.payload.get("slow"):
            await release.wait()
        return correlate(event, scope, work, route)

    config = routes({"name": "held", "types": ["job.*"], "handler": "scenario", "create_work": True,
                     "config": {"fn": "slow", "keys_field": "keys"}})  # fmt: skip
    async with loom_drivers(config=config) as driver:
        rt = driver.runtime
        driver.handlers.table["slow"] = slow
        opened = await rt.publish(ev("open", key="a"))
        await wait_routed(driver, opened)
        work = await rt.work_for_key("a")
        earlier = await rt.publish(ev("earlier", key="a", payload={"slow": True}))
        later = await rt.publish(ev("later", work_id=work.id, key=None))
        noise = [await rt.publish(ev(f"noise-{i}", key=f"noise/{i}")) for i in range(1000)]
        await wait_routed(driver, noise[-1])  # a thousand Work changes happened meanwhile
        assert await rt.checkpoint(later.id) is None, "the later Event waits behind the earlier one"
        release.set()
        await wait_routed(driver, earlier, later)
        history = await rt.history(work.id)
        assert [c.event_id for c in history.checkpoints] == [opened.id, earlier.id, later.id]


# -- bad values at the public entries ---------------------------------------------------------------------


async def test_bad_values_are_invalid_requests_and_change_nothing(loom_drivers: Any) -> None:
    async with loom_drivers(config=routes()) as driver:
        rt = driver.runtime
        placed = await rt.publish(ev("ok"))
        await wait_routed(driver, placed)
        work = await rt.work_for_key("k")
        lease = await rt.claim(work.id, owner="host")
        deep: Any = {}
        for _ in range(10_000):
            deep = {"d": deep}
        calls: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("event.source", lambda: rt.publish(ev("x", source="\ud800"))),
            ("event.delivery_id", lambda: rt.publish(ev("\ud800"))),
            ("event.key", lambda: rt.publish(ev("x", key="\ud800"))),
            ("event.work_id", lambda: rt.publish(ev("x", work_id="\udfff"))),
            ("nested more than", lambda: rt.publish(ev("x", payload=deep))),
            ("JSON object keys are strings", lambda: rt.publish(ev("x", payload={1: "a"}))),
            ("not valid Unicode", lambda: rt.publish(ev("x", payload={"also": ["\ud800"]}))),
            ("after_seq", lambda: rt.events(after_seq=2**63)),
            ("timer.fire_at_ms", lambda: rt.arm(loom.TimerSpec(id="t", fire_at_ms=2**63, source="t", type="t.t", scope=SCOPE))),
            ("timer.interval_ms", lambda: rt.arm(loom.TimerSpec(id="t", fire_at_ms=T0_MS, interval_ms=2**63 - 1, source="t", type="t.t", scope=SCOPE))),
            ("lease_ms", lambda: rt.claim(work.id, owner="o", lease_ms=2**63)),
            ("lease_ms", lambda: rt.renew(lease, lease_ms="1000")),  # type: ignore[arg-type]
            ("reason", lambda: rt.hold(work.id, reason=5)),  # type: ignore[arg-type]
            ("outcome", lambda: rt.complete(lease, None)),  # type: ignore[arg-type]
            ("work_id", lambda: rt.work("\ud800")),
            ("create_child: keys[0]", lambda: rt.toolbelt(lease).create_child("c", keys=[""])),
            ("create_child: keys[0]", lambda: rt.toolbelt(lease).create_child("c", keys=["\ud800"])),
            ("create_child: name", lambda: rt.toolbelt(lease).create_child("\ud800")),
        ]  # fmt: skip
        before = await rt.events(limit=100)
        for named, call in calls:
            with pytest.raises(InvalidRequest, match=re.escape(named)):
                await call()
        assert await rt.events(limit=100) == before, "a refused call stored nothing"
        assert (await rt.work(work.id)).held is False
        await a_good_event_still_routes(driver, "after")


async def test_a_timer_payload_leaves_room_for_what_firing_adds(loom_drivers: Any) -> None:
    async with loom_drivers() as driver:
        big = {"blob": "x" * (1_048_576 - 1_000)}  # under the event limit, over what a timer may carry
        with pytest.raises(InvalidRequest, match=r"timer\.payload is larger"):
            await driver.runtime.arm(
                loom.TimerSpec(id="t", fire_at_ms=T0_MS, source="t", type="t.t", scope=SCOPE, payload=big)
            )


async def test_an_invalid_schedule_is_refused_at_arm(loom_drivers: Any) -> None:
    async with loom_drivers() as driver:
        for kind, spec, named in [
            ("cron", {"schedule_id": "s", "cron": "61 * * * *"}, "timer.spec"),
            ("lunar", {"phase": "full"}, "no recurrence policy is registered for 'lunar'"),
        ]:
            with pytest.raises(InvalidRequest, match=named):
                await driver.runtime.arm_recurrence(
                    kind, spec, timer_id="s", fire_at_ms=T0_MS + 60_000, source="t", type="t.t", scope=SCOPE
                )
        assert await driver.runtime.timers() == []


async def test_a_fired_one_shot_armed_again_fires_with_its_own_event(loom_drivers: Any) -> None:
    async with loom_drivers() as driver:
        rt = driver.runtime
        spec = loom.TimerSpec(id="once", fire_at_ms=T0_MS + 1_000, source="t", type="t.t", scope=SCOPE)
        await rt.arm(spec)
        driver.clock.advance(1_000)
        await driver.settle()
        (first,) = await rt.firings("once")
        same = await rt.arm(spec)  # a program arming its timers at each start: it fired already
        assert (same.revision, same.state) == (1, loom.TimerState.FIRED)
        driver.clock.advance(1_000)
        await driver.settle()
        assert await rt.firings("once") == [first], "armed again unchanged, it does not fire twice"
        again = await rt.arm(
            loom.TimerSpec(id="once", fire_at_ms=T0_MS + 3_000, source="t", type="t.t", scope=SCOPE)
        )
        assert again.revision == 2, "a changed definition arms its next revision"
        driver.clock.advance(1_000)
        await driver.settle()
        firings = await rt.firings("once")
        assert [(f.revision, f.result) for f in firings] == [(1, loom.FiringResult.ACCEPTED)] * 1 + [
            (2, loom.FiringResult.ACCEPTED)
        ]
        assert firings[1].event_id != first.event_id, "revision 2 points at its own Event"
        events = [e for e in await rt.events(limit=100) if e.type == "t.t"]
        assert {e.id for e in events} == {first.event_id, firings[1].event_id}
        with pytest.raises(loom.Conflict, match="already accepted"):
            await rt.arm(loom.TimerSpec(id="once", fire_at_ms=T0_MS + 9_000, source="t", type="t.t",
                                        scope=SCOPE, delivery_id="once"))  # fmt: skip
        # a request repeated after a lost answer, with its own delivery identity: answered, not refused
        named = loom.TimerSpec(id="named", fire_at_ms=T0_MS + 3_500, source="t", type="t.t", scope=SCOPE,
                               delivery_id="named-1")  # fmt: skip
        await rt.arm(named)
        driver.clock.advance(1_000)
        await driver.settle()
        repeated = await rt.arm(named)
        assert (repeated.revision, repeated.state) == (1, loom.TimerState.FIRED)
        assert len(await rt.firings("named")) == 1


# -- semantics ----------------------------------------------------------------------------------------------


async def test_an_emit_naming_another_works_key_is_refused(loom_drivers: Any) -> None:
    async with loom_drivers(config=routes()) as driver:
        rt = driver.runtime
        a, b = await rt.publish(ev("a", key="a")), await rt.publish(ev("b", key="b"))
        await wait_routed(driver, a, b)
        work_a = await rt.work_for_key("a")
        lease = await rt.claim(work_a.id, owner="host")
        with pytest.raises(InvalidRequest, match="owned by work"):
            await rt.toolbelt(lease).emit(ev("forged", key="b", work_id=work_a.id))
        with pytest.raises(InvalidRequest, match="names no existing work"):
            await rt.toolbelt(lease).emit(ev("forged2", key=None, work_id="wk_nobody"))


async def test_cancel_disarms_every_timer_its_attempts_armed(loom_drivers: Any) -> None:
    async with loom_drivers(config=routes()) as driver:
        rt = driver.runtime
        placed = await rt.publish(ev("a", key="a"))
        await wait_routed(driver, placed)
        work = await rt.work_for_key("a")
        lease = await rt.claim(work.id, owner="host")
        timer = await rt.toolbelt(lease).arm_timer(
            loom.TimerSpec(id="remind", fire_at_ms=T0_MS + 60_000, source="t", type="t.remind", scope=SCOPE)
        )
        await rt.cancel(work.id)
        assert (await rt.timer(timer.id)).state is loom.TimerState.CANCELLED
        driver.clock.advance(60_000)
        await driver.settle()
        assert await rt.firings(timer.id) == []


async def test_an_inject_that_stays_ambiguous_ends_in_its_drop_error_fallback(loom_drivers: Any) -> None:
    config = Config.from_dict({"scopes": {SCOPE: {
        "bindings": {"fake": {"executor": "fake", "capabilities": ["inject"]}},
        "routes": [{"name": "inj", "types": ["job.*"], "create_work": True, "binding": "fake",
                    "policy": "inject", "error_fallback": "drop"}],
    }}})  # fmt: skip
    async with loom_drivers() as driver:
        driver.fake.capabilities.add("inject")
        await driver.configure(config)
        rt = driver.runtime
        await rt.publish(ev("j1", key="w"))
        work_id = work_id_for_key(SCOPE, "w")

        async def launched() -> bool:
            return bool(driver.fake.launches_of(work_id))

        await until(driver, launched, "the attempt to launch")
        driver.fake.inject_answers = [InjectAnswer.AMBIGUOUS] * 5
        extra = await rt.publish(ev("j2", key="w"))
        execution_id = driver.fake.running(work_id).request.execution_id
        seen = 0
        while True:

            async def tried(seen: int = seen) -> bool:
                intents = await rt.intents(execution_id)
                return bool(intents) and (
                    intents[0].status is loom.IntentStatus.GAVE_UP
                    or (intents[0].attempts > seen and intents[0].next_attempt_ms is not None)
                )

            await until(driver, tried, "the next dispatch try")
            (intent,) = await rt.intents(execution_id)
            if intent.status is loom.IntentStatus.GAVE_UP:
                break
            assert intent.next_attempt_ms is not None
            seen = intent.attempts
            driver.clock.set(max(intent.next_attempt_ms, driver.clock.now_ms()))
        assert intent.attempts == 5
        (intent,) = await rt.intents(execution_id)
        assert intent.status is loom.IntentStatus.GAVE_UP
        assert extra.id not in (await rt.work(work_id)).pending_inputs, "the drop fallback dropped it"
        (diagnostic,) = await rt.diagnostics(kind=DiagnosticKind.DISPATCH_GAVE_UP)
        assert "drop error fallback" in diagnostic.message


async def test_an_unrouted_event_can_be_replayed_once_in_order(loom_drivers: Any) -> None:
    broken = {"on": True}

    def flaky(event: loom.Event, scope: str, work: Work | None, route: Any) -> Any:
        if broken["on"]:
            raise RuntimeError("a bad deploy")
        return correlate(event, scope, work, route)

    config = routes({"name": "flaky", "types": ["f.*"], "handler": "scenario", "create_work": True,
                     "config": {"fn": "flaky"}})  # fmt: skip
    async with loom_drivers(config=config) as driver:
        rt = driver.runtime
        driver.handlers.table["flaky"] = flaky
        lost = await rt.publish(ev("lost", "f.x", key="f"))
        (checkpoint,) = await wait_routed(driver, lost)
        assert checkpoint.status is CheckpointStatus.UNROUTED
        broken["on"] = False
        await driver.reopen()
        request = await driver.runtime.replay(lost.id, request_id="first")
        assert request.type == "core.replay.requested"
        assert request.payload["event"] == lost.id
        (routed,) = await wait_routed(driver, lost)
        assert routed.status is CheckpointStatus.ROUTED
        again = await driver.runtime.replay(lost.id, request_id="first")
        assert again.id == request.id, "repeating a replay request answers with its first record"
        assert again.duplicate, "and says it is a repeat"
        with pytest.raises(loom.Conflict, match="final"):
            await driver.runtime.replay(lost.id, request_id="other")
        history = await driver.runtime.history((await driver.runtime.work_for_key("f")).id)
        assert [c.event_id for c in history.checkpoints] == [lost.id], "routed once"


async def test_an_unrouted_event_holds_no_later_one_back_and_its_replay_reaches_the_work_after_them(
    loom_drivers: Any,
) -> None:
    """docs/concepts.md "Work": an Event stopped ``unrouted`` holds no later Event back, and its replay
    reaches the Work after what was handed there meanwhile. Catches a key stalled behind an Event that
    waits for an operator (every later Event unrouted too), and a replay that is lost or routed twice."""
    broken = {"on": True}

    def flaky(event: loom.Event, scope: str, work: Work | None, route: Any) -> Any:
        if broken["on"] and event.payload.get("bad"):
            raise RuntimeError("a bad deploy")
        return correlate(event, scope, work, route)

    config = routes({"name": "flaky", "types": ["f.*"], "handler": "scenario", "create_work": True,
                     "config": {"fn": "flaky"}})  # fmt: skip
    async with loom_drivers(config=config) as driver:
        rt = driver.runtime
        driver.handlers.table["flaky"] = flaky
        bad = await rt.publish(ev("bad", "f.x", key="f", payload={"bad": True}))
        good = await rt.publish(ev("good", "f.x", key="f"))
        stopped, routed = await wait_routed(driver, bad, good)
        assert (stopped.status, routed.status) == (CheckpointStatus.UNROUTED, CheckpointStatus.ROUTED)
        work = await rt.work_for_key("f")
        lease = await rt.claim(work.id, owner="host")
        assert [e.id for e in lease.request.inputs] == [good.id]
        await rt.complete(lease, loom.Handoff())
        broken["on"] = False
        await rt.replay(bad.id)
        (replayed,) = await wait_routed(driver, bad)
        assert (replayed.status, replayed.work_id) == (CheckpointStatus.ROUTED, work.id)
        lease = await rt.claim(work.id, owner="host")
        assert [e.id for e in lease.request.inputs] == [bad.id]


# -- operations ---------------------------------------------------------------------------------------------


async def test_a_clean_close_leaves_one_self_contained_file_and_reads_after_close_refuse(
    tmp_path: Path,
) -> None:
    db = tmp_path / "loom.db"
    async with loom.open_runtime(
        str(db), clock=loom.ManualClock(start_ms=T0_MS), load_entry_points=False
    ) as rt:
        await rt.publish(ev("one"))
        closed_rt = rt
    wal = trio.Path(f"{db}-wal")
    assert not await wal.exists() or (await wal.stat()).st_size == 0, "the log was folded into the file"
    with pytest.raises(loom.StorageClosed):
        await closed_rt.events()


async def test_request_ids_of_the_longest_length_make_distinct_stable_control_events(
    loom_drivers: Any,
) -> None:
    """A request id may be as long as any id (200 characters); the control Event's delivery id that names
    it and the Work would then pass an Event's limit. Catches building it by concatenation alone (the
    request is refused with an error naming a field the caller never gave) and cutting it to length
    without a digest (two requests sharing their first characters would be taken for one)."""
    async with loom_drivers(config=routes()) as driver:
        rt = driver.runtime
        placed = await rt.publish(ev("ok"))
        await wait_routed(driver, placed)
        work = await rt.work_for_key("k")
        first, second = "r" * 199 + "1", "r" * 199 + "2"
        requested = await rt.retry(work.id, request_id=first)
        assert requested.type == "core.retry.requested"
        assert len(requested.delivery_id) <= 200
        again = await rt.retry(work.id, request_id=first)
        assert again.id == requested.id, "repeating the request answers with its first Event"
        other = await rt.retry(work.id, request_id=second)
        assert other.id != requested.id, "a different request is a different Event"
        await driver.reopen()
        assert (await driver.runtime.retry(work.id, request_id=first)).id == requested.id
