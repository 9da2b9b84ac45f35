"""Durable timers on a running runtime: firing once, restarts, revisions, the
recurrence hook, bounded and fair ``due`` and ``poll`` (`Runtime.poll`), and causal bounds for timer
firings (docs/concepts.md "Timer").

Business time is a `ManualClock`; tests wait on commits (`RuntimeDriver.until`) or trio events, never
on time. "Nothing else fired" is shown with a sentinel timer armed last at the current instant: the
timer service fires in (deadline, schedule order), one at a time, so once the sentinel fired every
timer due before it has had its turn.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import loom
from loom import (
    Config,
    Conflict,
    Event,
    EventIn,
    InvalidRequest,
    ManualClock,
    NotFound,
    Runtime,
    StaleAuthority,
    StorageError,
    open_runtime,
)
from loom.actors.timers import DEFAULT_RETRY_MS, TimerActor
from loom.kernel import firing as kernel_timers  # the firing procedures the timer actor and poll run
from loom.kernel.firing import fire_timer_in_tx
from loom.kernel.timers import arm_in_tx
from loom.records.timers import (
    FireRequest,
    Firing,
    FiringResult,
    Occurrence,
    Replacement,
    Skip,
    Timer,
    TimerSpec,
    TimerState,
)
from loom.records.validation import MAX_PAYLOAD_BYTES
from loom.records.work import Handoff, Lease
from loom.store import Tx
from loom.testing import T0_MS, RuntimeDriver, wait_routed
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashPoint, storage_failure
from loom.testing.internals import storage_of, timer_actor_of

T0 = T0_MS  # 2026-01-01T00:00:00Z
SCOPE = "acme"
SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
STALL_S = 20  # a watchdog only: nothing waits on real time


def tick(timer_id: str, at_ms: int, **fields: Any) -> TimerSpec:
    return TimerSpec(id=timer_id, fire_at_ms=at_ms, source="clock", type="clock.tick", scope=SCOPE, **fields)


def config(*, per_minute: int = 128, binding: bool = False) -> Config:
    """Scope ``acme``: Events of type ``job.*`` correlate by key into (created) Work; with ``binding``
    the fake executor runs it, otherwise nothing launches and tests claim as a host would."""
    route: dict[str, Any] = {"name": "jobs", "types": ["job.*"], "create_work": True}
    scope: dict[str, Any] = {"routes": [route]}
    if binding:
        route["binding"] = "fake"
        scope["bindings"] = {"fake": {"executor": "fake"}}
    return Config.from_dict({"scopes": {SCOPE: scope}, "causal": {"per_minute": per_minute}})


async def ledger(driver: RuntimeDriver, timer_id: str, n: int) -> list[Firing]:
    """Wait (on commits) until the timer's ledger holds ``n`` firings; it must hold no more."""

    async def check() -> bool:
        return len(await driver.runtime.firings(timer_id)) >= n

    await driver.until(check, f"{n} firing(s) of timer {timer_id}")
    firings = await driver.runtime.firings(timer_id)
    assert len(firings) == n, f"timer {timer_id} fired {len(firings)} times, not {n}"
    return firings


_sentinels = 0


async def quiet(driver: RuntimeDriver) -> None:
    """Return once every timer due now has had its turn (see the module docstring)."""
    global _sentinels
    _sentinels += 1
    sentinel = f"~sentinel-{_sentinels}"
    await driver.runtime.arm(
        TimerSpec(
            id=sentinel, fire_at_ms=driver.clock.now_ms(), source="sentinel", type="sentinel", scope=SCOPE
        )
    )
    await ledger(driver, sentinel, 1)


async def deliveries(rt: Runtime, source: str) -> list[Event]:
    return [e for e in await rt.events(limit=10_000) if e.source == source]


async def claim_by_key(driver: RuntimeDriver, event: EventIn) -> tuple[Event, Lease]:
    """Publish a keyed ``job.*`` Event, wait until it is routed into Work, and claim that Work as a host."""
    accepted = await driver.runtime.publish(event)
    return accepted, await claim_routed(driver, accepted)


async def claim_routed(driver: RuntimeDriver, accepted: Event) -> Lease:
    (checkpoint,) = await wait_routed(driver, accepted)
    assert checkpoint.work_id is not None, checkpoint
    lease = await driver.runtime.claim(checkpoint.work_id, owner="host")
    assert lease.request.trigger is not None
    assert lease.request.trigger.id == accepted.id
    return lease


def job(delivery_id: str, key: str = "job/1", **payload: Any) -> EventIn:
    return EventIn(
        source="ext", delivery_id=delivery_id, type="job.start", scope=SCOPE, key=key, payload=payload
    )


@pytest.fixture
def host_driven(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop the timer actor from firing: the host drives firing with `due`/`fire`/`poll` alone."""

    async def ignore(self: TimerActor) -> None:
        self.next_due_ms = None

    monkeypatch.setattr(TimerActor, "_fire_due", ignore)


# -- exactly once lives in the firing ledger ------------------------------------------------------------


async def test_fire_timer_is_idempotent(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        timer = await rt.arm(tick("t", T0 + 30 * SECOND, payload={"n": 1}))
        assert (timer.state, timer.revision, timer.delivery_id, timer.parent_id) == (
            TimerState.ARMED,
            1,
            "t",
            None,
        )
        request = FireRequest(timer_id="t", revision=1, fire_at_ms=T0 + 30 * SECOND)

        early = await rt.fire(request)
        assert (early.result, early.event_id) == (FiringResult.NOT_DUE, None)
        assert await rt.firings("t") == [], "a not-due answer writes no ledger entry"

        driver.clock.advance(30 * SECOND)  # exactly the deadline: it fires now, not a tick later
        (first,) = await ledger(driver, "t", 1)
        assert (first.result, first.at_ms, first.next_fire_at_ms, first.replay) == (
            FiringResult.ACCEPTED,
            T0 + 30 * SECOND,
            None,
            False,
        )
        event = await rt.event_by_delivery("clock", "t")
        assert first.event_id == event.id
        assert event.payload == {"n": 1, "timer": "t", "occurrence_ms": T0 + 30 * SECOND}
        assert event.is_root

        # the service may fire twice (a restart, a race); the ledger answers the repeat
        driver.clock.advance(5 * SECOND)
        again = await rt.fire(request)
        assert again == attrs.evolve(first, replay=True)
        assert len(await deliveries(rt, "clock")) == 1, "a repeated firing accepted nothing new"
        assert await rt.firings("t") == [first]
        fired = await rt.timer("t")
        assert (fired.state, fired.occurrences) == (TimerState.FIRED, 1)

        # unknown or stale identities do nothing
        for stale in (
            FireRequest(timer_id="nope", revision=1, fire_at_ms=T0),
            FireRequest(timer_id="t", revision=2, fire_at_ms=T0 + 30 * SECOND),
            FireRequest(timer_id="t", revision=1, fire_at_ms=T0 + 31 * SECOND),
        ):
            answer = await rt.fire(stale)
            assert (answer.result, answer.event_id, answer.replay) == (FiringResult.STALE, None, False)
            assert await rt.firings(stale.timer_id) == ([first] if stale.timer_id == "t" else [])
        assert len(await deliveries(rt, "clock")) == 1


async def test_fired_timers_leave_the_service(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        await rt.arm(tick("once", T0 + SECOND))
        await quiet(driver)  # the arm notice has reached the timer actor
        assert timer_actor_of(rt).next_due_ms == T0 + SECOND
        driver.clock.advance(SECOND)
        await ledger(driver, "once", 1)
        await quiet(driver)
        assert timer_actor_of(rt).next_due_ms is None, "nothing else is armed: nothing to wake for"
        driver.clock.advance(MINUTE)
        await quiet(driver)
        assert len(await rt.firings("once")) == 1


# -- a firing whose commit fails is armed again ---------------------------------------------------------


async def test_a_firing_whose_commit_fails_is_rearmed_and_fires_once_later(
    loom_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fire_timer_in_tx
    calls: list[str] = []
    failed = trio.Event()
    token = trio.lowlevel.current_trio_token()  # the procedure runs in the storage actor's thread

    def disk_full_once(tx: Tx, now_ms: int, request: FireRequest, *args: Any) -> Firing:
        calls.append(request.timer_id)
        if len(calls) == 1:
            trio.from_thread.run_sync(failed.set, trio_token=token)
            raise storage_failure(loom_store, "database or disk is full")
        return real(tx, now_ms, request, *args)

    monkeypatch.setattr(kernel_timers, "fire_timer_in_tx", disk_full_once)
    # no rescan for other nodes (PostgreSQL) shares the failing batch: a storage failure in one of
    # its requests would stop the runtime, which is another test's subject
    async with RuntimeDriver.open(loom_store, resync_ms=HOUR) as driver:
        rt = driver.runtime
        await rt.arm(tick("wake", T0 + 10 * SECOND))
        failures_before = storage_of(rt).stats.failed_batches
        driver.clock.advance(10 * SECOND)
        with trio.fail_after(STALL_S):
            await failed.wait()
        await storage_of(rt).submit(lambda tx, now_ms: None)  # the failed batch has been answered
        assert storage_of(rt).stats.failed_batches == failures_before + 1
        assert await rt.firings("wake") == [], "the failed batch committed nothing"
        assert (await rt.timer("wake")).state is TimerState.ARMED
        assert timer_actor_of(rt).next_due_ms == T0 + 10 * SECOND + DEFAULT_RETRY_MS

        driver.clock.advance(DEFAULT_RETRY_MS)
        (firing,) = await ledger(driver, "wake", 1)
        assert (firing.result, firing.at_ms) == (FiringResult.ACCEPTED, T0 + 10 * SECOND + DEFAULT_RETRY_MS)
        driver.clock.advance(MINUTE)
        await quiet(driver)
        assert calls.count("wake") == 2
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == ["wake"]


# -- restarts (a pending timer; a durable sleep) --------------------------------------------------------


async def test_two_restarts_with_three_pending_timers_fire_each_once_in_deadline_order(
    tmp_path: Path,
) -> None:
    async with RuntimeDriver.open(str(tmp_path / "loom.db")) as driver:
        for timer_id, after in (("c", 30), ("a", 10), ("b", 20)):
            await driver.runtime.arm(tick(timer_id, T0 + after * SECOND))

        await driver.reopen()
        assert timer_actor_of(driver.runtime).next_due_ms == T0 + 10 * SECOND, "the earliest, from the store"
        driver.clock.advance(15 * SECOND)
        await ledger(driver, "a", 1)

        await driver.reopen()
        assert timer_actor_of(driver.runtime).next_due_ms == T0 + 20 * SECOND, "a fired timer stays fired"
        driver.clock.advance(15 * SECOND)  # b and c are both due after one jump
        await ledger(driver, "c", 1)
        await ledger(driver, "b", 1)

        await driver.reopen()
        rt = driver.runtime
        assert timer_actor_of(rt).next_due_ms is None
        driver.clock.advance(MINUTE)
        await quiet(driver)
        fired = {k: (await rt.firings(k))[0] for k in "abc"}
        assert [fired[k].at_ms for k in "abc"] == [T0 + 15 * SECOND, T0 + 30 * SECOND, T0 + 30 * SECOND]
        events = await deliveries(rt, "clock")
        assert [e.delivery_id for e in events] == ["a", "b", "c"], "deadline order, each once"
        assert [e.id for e in events] == [fired[k].event_id for k in "abc"]
        assert [len(await rt.firings(k)) for k in "abc"] == [1, 1, 1]


async def test_a_durable_sleep_survives_a_restart_and_wakes_once(tmp_path: Path) -> None:
    async with RuntimeDriver.open(str(tmp_path / "loom.db"), config=config(binding=True)) as driver:
        start = await driver.runtime.publish(job("start-1"))

        async def launches(n: int) -> None:
            async def check() -> bool:
                return len(driver.fake.launches) >= n

            await driver.until(check, f"launch {n}")

        await launches(1)
        first = driver.fake.launches[0]
        assert first.request.trigger is not None
        assert first.request.trigger.id == start.id
        work_id = first.request.work_id
        sleep = await first.toolbelt.arm_timer(
            TimerSpec(
                id="sleep:job/1",
                fire_at_ms=driver.clock.now_ms() + 30 * SECOND,
                source="sleeper",
                type="job.woke",
                scope=SCOPE,
                key="job/1",
                payload={"slept_ms": 30 * SECOND},
            )
        )
        assert (sleep.parent_id, sleep.execution_id) == (start.id, first.request.execution_id)
        driver.fake.finish(work_id, Handoff())

        async def handed_off() -> bool:
            work = await driver.runtime.work(work_id)
            return work.current_execution_id is None

        await driver.until(handed_off, "the first attempt to hand off")

        await driver.reopen()  # the process restarts in the middle of the sleep
        assert timer_actor_of(driver.runtime).next_due_ms == T0 + 30 * SECOND
        driver.clock.advance(30 * SECOND)
        (firing,) = await ledger(driver, "sleep:job/1", 1)
        await launches(2)
        second = driver.fake.launches[1]
        wake = second.request.trigger
        assert wake is not None
        assert wake.id == firing.event_id
        assert (wake.type, wake.parent_id, wake.root_id, wake.depth) == ("job.woke", start.id, start.id, 1)
        assert second.request.work_id == work_id
        driver.fake.finish(work_id, Handoff())
        await driver.until(handed_off, "the second attempt to hand off")

        await driver.reopen()
        driver.clock.advance(24 * 60 * MINUTE)
        await quiet(driver)
        assert len(driver.fake.launches) == 2
        woke = [e for e in await driver.runtime.events(root_id=start.id) if e.type == "job.woke"]
        assert [e.id for e in woke] == [wake.id], "the sleep woke exactly once"
        assert (await driver.runtime.timer("sleep:job/1")).state is TimerState.FIRED


# -- revisions (revisioned cancellation; refused commands) ----------------------------------------------


async def test_revisioned_cancellation_and_rearming(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        at = T0 + MINUTE
        armed = await rt.arm(tick("t", at))
        assert await rt.arm(tick("t", at)) == armed, "arming the same definition again is a no-op"

        with pytest.raises(Conflict, match="revision 2 is not yet written"):
            await rt.cancel_timer("t", revision=2)
        with pytest.raises(NotFound):
            await rt.cancel_timer("missing", revision=1)
        cancelled = await rt.cancel_timer("t", revision=1)
        assert (cancelled.state, cancelled.revision, cancelled.reason) == (
            TimerState.CANCELLED,
            1,
            "cancelled",
        )
        with pytest.raises(Conflict, match="not armed"):
            await rt.cancel_timer("t", revision=1)
        driver.clock.advance(MINUTE)
        await quiet(driver)
        assert await rt.firings("t") == [], "a cancelled timer is disarmed, not only refused at fire"
        stale = await rt.fire(FireRequest(timer_id="t", revision=1, fire_at_ms=at))
        assert stale.result is FiringResult.STALE
        await quiet(driver)
        assert await rt.firings("t") == []
        assert await deliveries(rt, "clock") == []

        # re-arming after a cancel (even the same definition) recreates it under a new revision
        again = await rt.arm(tick("t", T0 + 2 * MINUTE))
        assert (again.state, again.revision) == (TimerState.ARMED, 2)
        changed = await rt.arm(tick("t", T0 + 3 * MINUTE, payload={"v": 3}))
        assert (changed.revision, changed.fire_at_ms) == (3, T0 + 3 * MINUTE)
        driver.clock.advance(MINUTE)  # revision 2's instant: it no longer exists
        old = await rt.fire(FireRequest(timer_id="t", revision=2, fire_at_ms=T0 + 2 * MINUTE))
        assert old.result is FiringResult.STALE
        await quiet(driver)
        assert await rt.firings("t") == []

        driver.clock.advance(MINUTE)
        (firing,) = await ledger(driver, "t", 1)
        assert (firing.revision, firing.fire_at_ms) == (3, T0 + 3 * MINUTE)
        (event,) = await deliveries(rt, "clock")
        assert event.payload["v"] == 3


async def test_a_firing_request_must_name_the_armed_revision_and_instant(
    loom_store: str, host_driven: None
) -> None:
    """A timer's firing identity is (id, revision, fire_at): a request that matches the armed timer in
    one part only is stale and fires nothing. Catches: a firing that checks the revision but not the
    instant, or the instant but not the revision (a leftover request for a cancelled revision, or for
    another instant, would fire the timer armed now)."""
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        at = T0 + MINUTE
        await rt.arm(tick("t", at))
        await rt.cancel_timer("t", revision=1)
        again = await rt.arm(tick("t", at))  # recreated at the same instant: revision 2
        assert (again.revision, again.fire_at_ms) == (2, at)
        driver.clock.advance(MINUTE)
        for stale in (
            FireRequest(timer_id="t", revision=1, fire_at_ms=at),  # the cancelled revision
            FireRequest(timer_id="t", revision=2, fire_at_ms=at - SECOND),  # another instant
        ):
            answer = await rt.fire(stale)
            assert (answer.result, answer.event_id) == (FiringResult.STALE, None), stale
        assert await rt.firings("t") == []
        assert (await rt.timer("t")).state is TimerState.ARMED
        fired = await rt.fire(FireRequest(timer_id="t", revision=2, fire_at_ms=at))
        assert fired.result is FiringResult.ACCEPTED


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"id": ""}, "timer.id"),
        ({"fire_at_ms": -1}, "timer.fire_at_ms"),
        ({"interval_ms": 0}, "timer.interval_ms"),
        ({"interval_ms": 10, "recurrence": "cron", "spec": {}}, "exclusive"),
        ({"recurrence": "cron"}, "timer.spec"),
        ({"scope": "not a scope"}, "event.scope"),
        ({"payload": {"x": float("nan")}}, "timer.payload"),
    ],
)
async def test_a_malformed_timer_is_refused_and_changes_nothing(fields: dict[str, Any], field: str) -> None:
    async with RuntimeDriver.open(":memory:") as driver:
        with pytest.raises(InvalidRequest, match=field):
            await driver.runtime.arm(attrs.evolve(tick("bad", T0), **fields))
        assert await driver.runtime.timers() == []


# -- fixed-interval recurrence --------------------------------------------------------------------------


async def test_fixed_interval_occurrences_have_their_own_identity_and_a_clock_jump_fires_one(
    loom_store: str,
) -> None:
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        start = T0 + MINUTE
        await rt.arm(tick("every", start, interval_ms=MINUTE, payload={"job": "sweep"}))
        driver.clock.advance(MINUTE)
        await ledger(driver, "every", 1)
        driver.clock.advance(MINUTE)
        await ledger(driver, "every", 2)
        assert (await rt.timer("every")).fire_at_ms == start + 2 * MINUTE

        # ten ticks (start + 2 .. start + 11 minutes) fall due at once: the latest fires, nine are
        # counted as missed, never a burst
        driver.clock.advance(10 * MINUTE + 5 * SECOND)
        firings = await ledger(driver, "every", 3)
        await quiet(driver)
        assert len(await rt.firings("every")) == 3
        assert [(f.fire_at_ms, f.next_fire_at_ms, f.result) for f in firings] == [
            (start, start + MINUTE, FiringResult.ACCEPTED),
            (start + MINUTE, start + 2 * MINUTE, FiringResult.ACCEPTED),
            (start + 2 * MINUTE, start + 12 * MINUTE, FiringResult.ACCEPTED),
        ]
        events = await deliveries(rt, "clock")
        assert [e.delivery_id for e in events] == [
            f"every@{start}",
            f"every@{start + MINUTE}",
            f"every@{start + 11 * MINUTE}",
        ]
        assert [e.payload["skipped"] for e in events] == [0, 0, 9]
        assert [e.payload["occurrence_ms"] for e in events] == [start, start + MINUTE, start + 11 * MINUTE]
        assert all(e.is_root and e.payload["job"] == "sweep" for e in events)
        timer = await rt.timer("every")
        assert (timer.state, timer.fire_at_ms, timer.occurrences) == (
            TimerState.ARMED,
            start + 12 * MINUTE,
            3,
        )
        assert timer_actor_of(rt).next_due_ms == start + 12 * MINUTE


async def test_a_derived_recurring_timer_keeps_its_arming_parent(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        trigger, lease = await claim_by_key(driver, job("start-1"))
        timer = await rt.toolbelt(lease).arm_timer(
            TimerSpec(
                id="poll-ci",
                fire_at_ms=T0 + MINUTE,
                source="bot",
                type="ci.poll",
                scope=SCOPE,
                interval_ms=MINUTE,
            )
        )
        assert (timer.parent_id, timer.execution_id) == (trigger.id, lease.execution_id)
        for n in (1, 2, 3):
            driver.clock.advance(MINUTE)
            await ledger(driver, "poll-ci", n)
        polls = await deliveries(rt, "bot")
        assert [e.delivery_id for e in polls] == [f"poll-ci@{T0 + n * MINUTE}" for n in (1, 2, 3)]
        assert {(e.parent_id, e.root_id, e.depth, e.execution_id) for e in polls} == {
            (trigger.id, trigger.id, 1, lease.execution_id)
        }, "every occurrence derives from the arming trigger, not from the previous occurrence"


async def test_an_execution_cannot_rearm_a_timer_it_does_not_own(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        root = await rt.arm(tick("nightly", T0 + MINUTE))
        _, lease = await claim_by_key(driver, job("start-1"))
        with pytest.raises(Conflict, match="nightly"):
            await rt.toolbelt(lease).arm_timer(tick("nightly", T0 + 99 * MINUTE))
        assert await rt.timer("nightly") == root
        with pytest.raises(InvalidRequest, match=r"core\.\* family"):
            await rt.toolbelt(lease).arm_timer(
                attrs.evolve(tick("forged", T0), type="core.execution.timeout")
            )
        with pytest.raises(InvalidRequest, match="scope"):
            await rt.toolbelt(lease).arm_timer(attrs.evolve(tick("elsewhere", T0), scope="other"))
        # its own timers it may move
        mine = await rt.toolbelt(lease).arm_timer(tick("mine", T0 + MINUTE))
        moved = await rt.toolbelt(lease).arm_timer(tick("mine", T0 + 2 * MINUTE))
        assert (moved.revision, moved.fire_at_ms) == (mine.revision + 1, T0 + 2 * MINUTE)
        await rt.complete(lease, Handoff())
        with pytest.raises(StaleAuthority):
            await rt.toolbelt(lease).arm_timer(tick("late", T0 + MINUTE))


# -- the recurrence hook (calendar recurrence as a hook, validated by core) -----------------------------


class CalendarDouble:
    """A recurrence policy whose answer the timer's spec chooses (``mode``)."""

    @loom.hookimpl
    def loom_recurrence_policies(self) -> Mapping[str, Any]:
        return {"test": self.policy}

    @staticmethod
    def policy(
        timer: Timer, now_ms: int, spec: Mapping[str, Any]
    ) -> tuple[Occurrence | Skip, Replacement | None]:
        mode = spec["mode"]
        occurrence = Occurrence(
            occurrence_ms=timer.fire_at_ms,
            delivery_id=f"{timer.delivery_id}#{timer.occurrences}",
            payload={"mode": mode},
        )
        following = Replacement(
            fire_at_ms=now_ms + MINUTE, delivery_id=f"{timer.delivery_id}#{timer.occurrences + 1}"
        )
        if mode == "raise":
            raise ValueError("the calendar is unreadable")
        answers: dict[str, tuple[Occurrence | Skip, Replacement | None]] = {
            "occur": (occurrence, following),
            "last": (occurrence, None),
            "skip": (Skip(reason="a holiday", skipped=1), following),
            "replacement_not_after_now": (occurrence, attrs.evolve(following, fire_at_ms=now_ms)),
            "replacement_same_identity": (
                occurrence,
                attrs.evolve(following, delivery_id=occurrence.delivery_id),
            ),
            "oversize": (attrs.evolve(occurrence, payload={"blob": "x" * MAX_PAYLOAD_BYTES}), following),
            "changes_source": (attrs.evolve(occurrence, source="elsewhere"), following),
            "changes_parent": (attrs.evolve(occurrence, parent_id="ev_forged"), following),
            "keeps_source": (
                attrs.evolve(occurrence, source=timer.source, parent_id=timer.parent_id),
                following,
            ),
        }
        return answers[mode]


def recurring(timer_id: str, mode: str, at_ms: int, kind: str = "test") -> TimerSpec:
    return attrs.evolve(tick(timer_id, at_ms), recurrence=kind, spec={"mode": mode})


async def test_a_recurrence_policy_answers_occurrences_skips_and_replacements(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, plugins=(CalendarDouble(),)) as driver:
        rt = driver.runtime
        await rt.arm(recurring("cal", "occur", T0 + MINUTE))
        driver.clock.advance(MINUTE)
        (first,) = await ledger(driver, "cal", 1)
        assert (first.result, first.next_fire_at_ms) == (FiringResult.ACCEPTED, T0 + 2 * MINUTE)
        event = await rt.event_by_delivery("clock", "cal#0")
        assert first.event_id == event.id
        assert event.payload["mode"] == "occur"

        # the next arming answers a skip: ledger says skipped, nothing is accepted, it moves on
        moved = await rt.timer("cal")
        await rt.arm(attrs.evolve(tick("cal", moved.fire_at_ms), recurrence="test", spec={"mode": "skip"}))
        driver.clock.advance(MINUTE)
        skipped = (await ledger(driver, "cal", 2))[1]
        assert (skipped.result, skipped.event_id, skipped.detail) == (FiringResult.SKIPPED, None, "a holiday")
        assert skipped.next_fire_at_ms == T0 + 3 * MINUTE
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == ["cal#0"]

        # an occurrence with no replacement ends the timer; giving back the timer's own source and
        # parent is not a change
        await rt.arm(recurring("final", "keeps_source", T0 + 2 * MINUTE))
        await rt.arm(recurring("final2", "last", T0 + 2 * MINUTE))  # both due now
        await ledger(driver, "final", 1)
        (last,) = await ledger(driver, "final2", 1)
        assert (last.result, last.next_fire_at_ms) == (FiringResult.ACCEPTED, None)
        assert (await rt.timer("final2")).state is TimerState.FIRED


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("replacement_not_after_now", "not after now"),
        ("replacement_same_identity", "same identity as the occurrence"),
        ("changes_source", "changes the source"),
        ("changes_parent", "changes the timer's parent"),
        ("raise", "raised ValueError"),
    ],
)
async def test_arming_asks_the_policy_and_refuses_an_answer_that_breaks_the_contract(
    mode: str, reason: str
) -> None:
    async with RuntimeDriver.open(":memory:", plugins=(CalendarDouble(),)) as driver:
        rt = driver.runtime
        with pytest.raises(InvalidRequest, match=reason):
            await rt.arm(recurring("cal", mode, T0 + MINUTE))
        with pytest.raises(NotFound):
            await rt.timer("cal")


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("replacement_not_after_now", "not after now"),
        ("replacement_same_identity", "same identity as the occurrence"),
        ("changes_source", "changes the source"),
        ("changes_parent", "changes the timer's parent"),
        ("raise", "raised ValueError"),
        # the firing checks the size of what it writes (arming checked the template's alone)
        ("oversize", f"event.payload is larger than {MAX_PAYLOAD_BYTES} bytes"),
    ],
)
async def test_core_refuses_a_recurrence_answer_that_breaks_the_contract_at_fire(
    mode: str, reason: str
) -> None:
    async with RuntimeDriver.open(":memory:", plugins=(CalendarDouble(),)) as driver:
        rt = driver.runtime
        # armed without asking the policy (as a timer armed before its policy changed would be)
        await storage_of(rt).submit(arm_in_tx, recurring("cal", mode, T0 + MINUTE))
        driver.clock.advance(MINUTE)
        (firing,) = await ledger(driver, "cal", 1)
        assert (firing.result, firing.event_id, firing.next_fire_at_ms) == (FiringResult.INVALID, None, None)
        assert reason in (firing.detail or "")
        timer = await rt.timer("cal")
        assert timer.state is TimerState.INVALID
        assert reason in (timer.reason or "")
        (diagnostic,) = await rt.diagnostics(kind="invalid_timer")
        assert diagnostic.subject == "cal"
        assert reason in diagnostic.message
        assert await deliveries(rt, "clock") == []
        driver.clock.advance(10 * MINUTE)
        await quiet(driver)
        assert len(await rt.firings("cal")) == 1, "an invalid timer leaves the due set"


def _put_legacy_timer(tx: Tx, now_ms: int, timer_id: str, scope: str) -> None:
    """A timer row as an older loom with laxer rules might have left it: armed, then its scope rewritten
    without `validate_spec`."""
    armed = arm_in_tx(tx, now_ms, tick(timer_id, now_ms))
    tx.put_timer(attrs.evolve(armed, scope=scope), armed)


async def _fire_ties(driver: RuntimeDriver, *, poll: bool) -> list[str]:
    """Arm z, a, m, b due at one instant, then a again (a changed payload: a new arming); fire them all
    (by the timer actor, or by `Runtime.poll`); the timers in the order their Events were accepted."""
    rt = driver.runtime
    for timer_id in ("z", "a", "m", "b"):
        await rt.arm(tick(timer_id, T0 + MINUTE))
    await rt.arm(tick("a", T0 + MINUTE, payload={"again": True}))
    driver.clock.advance(MINUTE)
    if poll:
        await rt.poll(limit=2)  # (two passes: the order holds across them)
        await rt.poll(limit=10)
    else:
        await quiet(driver)
    return [str(e.payload["timer"]) for e in await deliveries(rt, "clock")]


async def test_timers_due_at_one_instant_fire_in_the_order_they_were_armed(loom_store: str) -> None:
    """Ties in due time fire in schedule order (docs/concepts.md, "Timer"). Catches a due order by id
    (seen: z, a, m, b fired as a, b, m, z) and an arming again that keeps its first place."""
    async with RuntimeDriver.open(loom_store) as driver:
        assert await _fire_ties(driver, poll=False) == ["z", "m", "b", "a"]


async def test_timers_due_at_one_instant_are_polled_in_the_order_they_were_armed(
    loom_store: str, host_driven: None
) -> None:
    async with RuntimeDriver.open(loom_store) as driver:
        assert await _fire_ties(driver, poll=True) == ["z", "m", "b", "a"]


async def test_a_template_todays_rules_refuse_leaves_its_timer_invalid_and_accepts_nothing(
    loom_store: str, host_driven: None
) -> None:
    # catches: a firing that trusts the stored template because arming checked it (rows armed under
    # older rules, or written by anything but `arm_in_tx`, would be accepted as Events today's rules
    # refuse)
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        await storage_of(rt).submit(_put_legacy_timer, "legacy", "not a scope!")
        await rt.arm(tick("fine", T0))
        fired = {f.timer_id: f for f in (await rt.poll(limit=10)).firings}
        assert fired["legacy"].result is FiringResult.INVALID
        assert "its event template is refused: event.scope" in (fired["legacy"].detail or "")
        assert fired["fine"].result is FiringResult.ACCEPTED
        (diagnostic,) = await rt.diagnostics(kind="invalid_timer")
        assert diagnostic.subject == "legacy"
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == ["fine"]


async def test_an_unregistered_recurrence_kind_is_invalid_and_never_starves_other_timers(
    loom_store: str, host_driven: None
) -> None:
    async with RuntimeDriver.open(loom_store, plugins=(CalendarDouble(),)) as driver:
        rt = driver.runtime
        with pytest.raises(InvalidRequest, match="no recurrence policy is registered for 'lunar'"):
            await rt.arm(recurring("a-unknown", "occur", T0, kind="lunar"))
        # armed while a plugin that is gone now was installed
        await storage_of(rt).submit(arm_in_tx, recurring("a-unknown", "occur", T0, kind="lunar"))
        await rt.arm(recurring("b-known", "occur", T0))
        await rt.arm(tick("c-plain", T0))
        first = await rt.poll(limit=1)
        assert [(f.timer_id, f.result) for f in first.firings] == [("a-unknown", FiringResult.INVALID)]
        (diagnostic,) = await rt.diagnostics(kind="invalid_timer")
        assert diagnostic.subject == "a-unknown"
        assert "'lunar'" in diagnostic.message
        assert (await rt.timer("a-unknown")).state is TimerState.INVALID
        second = await rt.poll(limit=1)
        third = await rt.poll(limit=1)
        assert [(f.timer_id, f.result) for f in (*second.firings, *third.firings)] == [
            ("b-known", FiringResult.ACCEPTED),
            ("c-plain", FiringResult.ACCEPTED),
        ]
        assert (await rt.poll(limit=10)).firings == ()
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == ["b-known#0", "c-plain"]


# -- bounded, fair `due` and `poll` ---------------------------------------------------------------------


async def test_due_is_bounded_and_rotates_through_overdue_timers_across_a_reopen(
    tmp_path: Path, host_driven: None
) -> None:
    async with RuntimeDriver.open(str(tmp_path / "loom.db")) as driver:
        for timer_id in "edcba":
            await driver.runtime.arm(tick(timer_id, T0 - MINUTE))
        await driver.runtime.arm(tick("later", T0 + MINUTE))

        async def due(limit: int) -> list[str]:
            requests = await driver.runtime.due(limit)
            assert len(requests) <= limit
            return [r.timer_id for r in requests]

        # due at one instant, they come in the order they were armed (e first), not by id
        assert await due(2) == ["e", "d"]
        assert await due(2) == ["c", "b"]
        assert await due(2) == ["a", "e"]
        # each cursor move commits without waiting for the disk (a process kill keeps it, as the
        # clean reopen below does; only a power loss may take a move back)
        assert storage_of(driver.runtime).stats.relaxed_batches == 3
        await driver.reopen()  # the cursor is persisted
        assert await due(1) == ["d"]
        assert await due(3) == ["c", "b", "a"]
        assert await due(10) == ["e", "d", "c", "b", "a"], "never a timer twice in one answer"
        assert (await driver.runtime.due(1))[0] == FireRequest(
            timer_id="e", revision=1, fire_at_ms=T0 - MINUTE
        )
        for bad in (0, -1, 10_001):
            with pytest.raises(InvalidRequest, match="limit"):
                await driver.runtime.due(bad)
        # the bound is inclusive: the largest limit is an answer, not a refusal
        assert len(await driver.runtime.due(10_000)) == 5


async def test_poll_fires_at_most_limit_per_pass_and_a_firing_that_raises_retires_its_timer(
    loom_store: str, host_driven: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fire_timer_in_tx

    def broken_for_a(tx: Tx, now_ms: int, request: FireRequest, *args: Any) -> Firing:
        if request.timer_id == "a":
            raise RuntimeError("a broken template store")
        return real(tx, now_ms, request, *args)

    monkeypatch.setattr(kernel_timers, "fire_timer_in_tx", broken_for_a)
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        for timer_id in "abcd":
            await rt.arm(tick(timer_id, T0))
        first = await rt.poll(limit=2)
        assert [(f.timer_id, f.result) for f in first.firings] == [
            ("a", FiringResult.INVALID),
            ("b", FiringResult.ACCEPTED),
        ]
        assert first.failures == ()
        # the raising firing left nothing behind but its answer: the timer is retired with a reason,
        # never retried in a loop
        (diagnostic,) = await rt.diagnostics(kind="invalid_timer")
        assert diagnostic.subject == "a"
        assert "RuntimeError" in diagnostic.message
        assert (await rt.timer("a")).state is TimerState.INVALID
        second = await rt.poll(limit=2)
        assert [f.timer_id for f in second.firings] == ["c", "d"]
        third = await rt.poll(limit=2)
        assert third.firings == ()
        assert third.failures == ()
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == ["b", "c", "d"]


async def test_poll_raises_a_storage_failure(
    loom_store: str, host_driven: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_io_error(tx: Tx, now_ms: int, request: FireRequest, *args: Any) -> Firing:
        raise storage_failure(loom_store, "disk I/O error")

    monkeypatch.setattr(kernel_timers, "fire_timer_in_tx", disk_io_error)
    # No background actor shares the failed batch: only the host's poll sees the failure.
    async with RuntimeDriver.open(loom_store, actors=()) as driver:
        rt = driver.runtime
        await rt.arm(tick("a", T0))
        with pytest.raises(StorageError, match="disk I/O error"):
            await rt.poll(limit=10)
        assert await rt.diagnostics(kind="poll_item_failed") == []
        assert (await rt.timer("a")).state is TimerState.ARMED


# -- causal bounds on firings (docs/concepts.md "Causal bounds") ----------------------------------------


async def test_a_derived_timer_over_the_depth_limit_is_refused_disabled_and_never_retried(
    loom_store: str,
) -> None:
    async with RuntimeDriver.open(loom_store, config=config()) as driver:
        rt = driver.runtime
        link = await rt.publish(EventIn(source="ext", delivery_id="link-0", type="chain.link", scope=SCOPE))
        root = link
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
        assert (link.depth, link.root_id) == (32, root.id)
        lease = await claim_routed(driver, link)
        timer = await rt.toolbelt(lease).arm_timer(
            TimerSpec(
                id="too-deep",
                fire_at_ms=T0 + MINUTE,
                source="bot",
                type="job.later",
                scope=SCOPE,
                payload={"token": "s3cret-payload"},
            )
        )
        assert timer.parent_id == link.id

        driver.clock.advance(MINUTE)
        (firing,) = await ledger(driver, "too-deep", 1)
        assert (firing.result, firing.event_id, firing.next_fire_at_ms) == (FiringResult.REFUSED, None, None)
        assert "depth 33" in (firing.detail or "")
        disabled = await rt.timer("too-deep")
        assert disabled.state is TimerState.DISABLED
        assert (disabled.reason or "").startswith("causal_rejection")
        with pytest.raises(NotFound):
            await rt.event_by_delivery("bot", "too-deep")
        (rejection,) = await rt.causal_rejections()
        assert (rejection.reason, rejection.depth, rejection.limit, rejection.root_id) == (
            loom.RejectionReason.DEPTH_LIMIT,
            33,
            32,
            root.id,
        )
        assert (rejection.parent_id, rejection.delivery_id, rejection.execution_id) == (
            link.id,
            "too-deep",
            lease.execution_id,
        )
        stored = await rt.kv("core.causal.rejections")
        assert "s3cret-payload" not in repr(stored), "the rejection is redacted"

        driver.clock.advance(60 * MINUTE)
        await quiet(driver)
        assert len(await rt.firings("too-deep")) == 1, "no retry loop"
        assert (await rt.timer("too-deep")).state is not TimerState.ARMED


async def test_a_derived_recurring_timer_over_the_minute_budget_is_disabled(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, config=config(per_minute=3)) as driver:
        rt = driver.runtime
        trigger, lease = await claim_by_key(driver, job("start-1"))
        await rt.toolbelt(lease).arm_timer(
            TimerSpec(
                id="chatty",
                fire_at_ms=T0 + SECOND,
                source="bot",
                type="bot.ping",
                scope=SCOPE,
                interval_ms=SECOND,
            )
        )
        for n in (1, 2, 3, 4):  # all inside the first UTC minute of the root
            driver.clock.advance(SECOND)
            firings = await ledger(driver, "chatty", n)
        assert [f.result for f in firings] == [FiringResult.ACCEPTED] * 3 + [FiringResult.REFUSED]
        assert firings[-1].next_fire_at_ms is None
        assert (await rt.timer("chatty")).state is TimerState.DISABLED
        (rejection,) = await rt.causal_rejections()
        assert (rejection.reason, rejection.root_id, rejection.budget) == (
            loom.RejectionReason.RATE_LIMIT,
            trigger.id,
            3,
        )
        driver.clock.advance(5 * MINUTE)  # a new minute restores budget, but the timer stays off
        await quiet(driver)
        assert len(await rt.firings("chatty")) == 4
        assert len(await deliveries(rt, "bot")) == 3


# -- atomic fire and re-arm across a crash point --------------------------------------------------------


@attrs.define
class CrashOnFiring:
    """A fault hook that stops the storage actor at ``boundary`` of the batch that fires a timer."""

    boundary: Boundary
    firing: bool = False
    fired: bool = False

    def __call__(self, point: str, batch_no: int) -> None:
        if self.firing and not self.fired and point == self.boundary:
            self.fired = True
            raise CrashPoint(f"crash point: {point} of the firing batch {batch_no}")


def _contains(exc: BaseException | None, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(kind) is not None
    return isinstance(exc, kind)


@pytest.mark.parametrize("boundary", [BEFORE_COMMIT, AFTER_COMMIT])
async def test_fire_and_rearm_are_atomic_across_a_crash(
    tmp_path: Path, boundary: Boundary, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "loom.db")
    clock = ManualClock(start_ms=T0)
    first_at = T0 + MINUTE
    async with RuntimeDriver.open(path, clock=clock) as driver:
        await driver.runtime.arm(tick("every", first_at, interval_ms=MINUTE))

    hook = CrashOnFiring(boundary)
    real = fire_timer_in_tx

    def marking(tx: Tx, now_ms: int, request: FireRequest, *args: Any) -> Firing:
        hook.firing = True  # this batch fires a timer: the hook stops it at its boundary
        return real(tx, now_ms, request, *args)

    monkeypatch.setattr(kernel_timers, "fire_timer_in_tx", marking)
    stopped_by: BaseException | None = None
    try:
        with trio.fail_after(STALL_S):
            async with open_runtime(path, clock=clock, fault=hook, load_entry_points=False):
                clock.advance(MINUTE)
                await trio.sleep_forever()  # until the crash point stops the runtime
    except BaseException as exc:
        stopped_by = exc
    assert hook.fired
    assert _contains(stopped_by, CrashPoint), repr(stopped_by)
    monkeypatch.setattr(kernel_timers, "fire_timer_in_tx", real)
    conn = sqlite3.connect(path)
    try:
        committed = conn.execute("SELECT count(*) FROM timer_firings").fetchone()[0]
        armed_at = conn.execute("SELECT fire_at_ms FROM timers WHERE id = 'every'").fetchone()[0]
    finally:
        conn.close()
    assert (committed, armed_at) == ((0, first_at) if boundary == BEFORE_COMMIT else (1, first_at + MINUTE))

    async with RuntimeDriver.open(path, clock=clock) as driver:
        rt = driver.runtime
        # the crashed firing either committed whole (event, ledger, next arming) or left no trace,
        # and a reopen fires the old identity once if it did not commit
        (firing,) = await ledger(driver, "every", 1)
        assert (firing.fire_at_ms, firing.result) == (first_at, FiringResult.ACCEPTED)
        assert firing.at_ms == first_at
        timer = await rt.timer("every")
        assert (timer.fire_at_ms, timer.occurrences) == (firing.next_fire_at_ms, 1) == (first_at + MINUTE, 1)
        assert timer_actor_of(rt).next_due_ms == first_at + MINUTE
        await quiet(driver)
        events = await deliveries(rt, "clock")
        assert [e.delivery_id for e in events] == [f"every@{first_at}"]
        assert events[0].id == firing.event_id

        clock.advance(MINUTE)
        second = (await ledger(driver, "every", 2))[1]
        assert second.fire_at_ms == first_at + MINUTE
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == [
            f"every@{first_at}",
            f"every@{first_at + MINUTE}",
        ]


async def test_an_interval_timer_armed_again_unchanged_after_it_fired_keeps_its_ticks(
    loom_store: str,
) -> None:
    """A program arms its interval timer at each start: the same definition again is a no-op, as for
    a schedule. Catches the re-arm taken as a new definition because the stored next tick moved on:
    revision 2 fired the last tick again (``skipped`` counting ticks already delivered)."""
    async with RuntimeDriver.open(loom_store) as driver:
        rt = driver.runtime
        every = tick("iv", T0, interval_ms=MINUTE)
        armed = await rt.arm(every)
        await ledger(driver, "iv", 1)
        for n in (2, 3):
            driver.clock.advance(MINUTE)
            await ledger(driver, "iv", n)
        again = await rt.arm(every)
        assert (again.revision, again.fire_at_ms) == (armed.revision, T0 + 3 * MINUTE)
        await quiet(driver)
        assert [e.delivery_id for e in await deliveries(rt, "clock")] == [
            f"iv@{T0 + n * MINUTE}" for n in range(3)
        ]
        # a tick on the same grid still ahead, or another interval, is a change: a new revision
        later = await rt.arm(tick("iv", T0 + 5 * MINUTE, interval_ms=MINUTE))
        assert (later.revision, later.fire_at_ms) == (armed.revision + 1, T0 + 5 * MINUTE)
        other = await rt.arm(tick("iv", T0, interval_ms=2 * MINUTE))
        assert (other.revision, other.fire_at_ms) == (armed.revision + 2, T0)
