"""The schedule plugin on a running runtime (docs/schedules.md: calendar recurrence as a hook,
deterministic occurrence identity): cron and calendar timers armed with
`schedule_timer`, the six-hour catch-up after an outage, the DST gap policy, and the ``schedule`` route
handler's overlap policy with the fake executor keeping a run going.

Business time is a `ManualClock`; tests wait on commits and launches, never on time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import trio
import trio.testing

from loom import Config, ConfigError, Event, Runtime, open_runtime
from loom.plugins.schedule import ScheduleSpec, occurrence_id, schedule_timer
from loom.records.timers import Firing, FiringResult, TimerSpec, TimerState
from loom.records.work import CheckpointStatus, Completed
from loom.store import Tx
from loom.testing import FakeExecutor, ManualClock, RuntimeDriver
from loom.testing.internals import storage_of

SCOPE = "acme"
SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def utc_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


async def arm(driver: RuntimeDriver, spec: ScheduleSpec) -> TimerSpec:
    timer = schedule_timer(spec, now_ms=driver.clock.now_ms(), source="cron", type="job.due", scope=SCOPE,
                           payload={"job": spec.schedule_id})  # fmt: skip
    await driver.runtime.arm(timer)
    return timer


async def ledger(driver: RuntimeDriver, timer_id: str, n: int) -> list[Firing]:
    async def check() -> bool:
        return len(await driver.runtime.firings(timer_id)) >= n

    await driver.until(check, f"{n} firing(s) of {timer_id}")
    firings = await driver.runtime.firings(timer_id)
    assert len(firings) == n, f"{timer_id} fired {len(firings)} times, not {n}"
    return firings


async def occurrences(rt: Runtime) -> list[Event]:
    return [e for e in await rt.events(limit=10_000) if e.source == "cron"]


async def test_a_cron_timer_armed_off_its_schedule_fires_first_at_its_first_occurrence(
    loom_store: str,
) -> None:
    """A cron timer armed as it is (``rt.arm``, as ``POST /timers`` and ``loom timers arm --at`` do)
    for an instant that is no occurrence: nothing fires then; its first Event is for the schedule's
    first occurrence after it. Catches an Event for the armed instant (seen: ``c2@1796671912062``, at
    19:31:52.062 for a ``* * * * *`` schedule)."""
    async with RuntimeDriver.open(loom_store, start_ms=utc_ms("2026-01-01T00:10")) as driver:
        rt = driver.runtime
        spec = ScheduleSpec(schedule_id="c2", cron="* * * * *")
        armed = utc_ms("2026-01-01T00:10") + 1_062
        await rt.arm(TimerSpec(id="t-cron", fire_at_ms=armed, source="cron", type="job.due", scope=SCOPE,
                               recurrence="cron", spec=spec.to_mapping()))  # fmt: skip
        driver.clock.set(armed)
        (waited,) = await ledger(driver, "t-cron", 1)
        assert waited.result is FiringResult.SKIPPED
        assert waited.next_fire_at_ms == utc_ms("2026-01-01T00:11")
        assert await occurrences(rt) == []
        driver.clock.set(utc_ms("2026-01-01T00:11"))
        await ledger(driver, "t-cron", 2)
        (first,) = await occurrences(rt)
        assert first.delivery_id == occurrence_id("c2", utc_ms("2026-01-01T00:11"))
        assert first.payload["occurrence_ms"] == utc_ms("2026-01-01T00:11")


async def test_a_cron_schedule_fires_each_occurrence_with_its_deterministic_identity(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, start_ms=utc_ms("2026-01-01T00:10")) as driver:
        rt = driver.runtime
        spec = ScheduleSpec(schedule_id="hourly", cron="0 * * * *")
        timer = await arm(driver, spec)
        assert (timer.id, timer.fire_at_ms, timer.recurrence) == (
            "schedule:hourly",
            utc_ms("2026-01-01T01:00"),
            "cron",
        )

        for n, at in enumerate(("01:00", "02:00", "03:00"), start=1):
            driver.clock.set(utc_ms(f"2026-01-01T{at}"))
            await ledger(driver, timer.id, n)
        events = await occurrences(rt)
        assert [e.delivery_id for e in events] == [
            occurrence_id("hourly", utc_ms(f"2026-01-01T{at}")) for at in ("01:00", "02:00", "03:00")
        ]
        assert [e.delivery_id for e in events] == [
            f"hourly@{utc_ms(f'2026-01-01T{at}')}" for at in ("01:00", "02:00", "03:00")
        ]
        assert all(e.is_root and e.type == "job.due" and e.payload["schedule"] == "hourly" for e in events)
        assert all(e.payload["skipped"] == 0 and e.payload["job"] == "hourly" for e in events)
        armed = await rt.timer(timer.id)
        assert (armed.state, armed.fire_at_ms, armed.occurrences) == (
            TimerState.ARMED,
            utc_ms("2026-01-01T04:00"),
            3,
        )


async def test_after_a_ten_hour_outage_exactly_one_occurrence_fires(tmp_path: Path) -> None:
    async with RuntimeDriver.open(str(tmp_path / "loom.db"), start_ms=utc_ms("2026-01-01T00:10")) as driver:
        timer = await arm(driver, ScheduleSpec(schedule_id="hourly", cron="0 * * * *"))
        driver.clock.set(utc_ms("2026-01-01T01:00"))
        await ledger(driver, timer.id, 1)

        await driver.stop()  # a ten-hour outage
        driver.clock.advance(10 * HOUR + 5 * MINUTE)
        await driver.start()
        rt = driver.runtime
        firings = await ledger(driver, timer.id, 2)
        # the timer was armed for 02:00; 02:00 .. 11:00 are all due at 11:05: 11:00 fires, nine are skipped
        assert (firings[1].fire_at_ms, firings[1].next_fire_at_ms) == (
            utc_ms("2026-01-01T02:00"),
            utc_ms("2026-01-01T12:00"),
        )
        late = (await occurrences(rt))[-1]
        assert late.delivery_id == occurrence_id("hourly", utc_ms("2026-01-01T11:00"))
        assert (late.payload["skipped"], late.payload["skipped_first_ms"], late.payload["skipped_last_ms"]) == (
            9, utc_ms("2026-01-01T02:00"), utc_ms("2026-01-01T10:00"),
        )  # fmt: skip
        assert len(await occurrences(rt)) == 2, "one occurrence for the whole outage, never a burst"

        driver.clock.set(utc_ms("2026-01-01T12:00"))
        await ledger(driver, timer.id, 3)
        assert (await occurrences(rt))[-1].payload["skipped"] == 0


async def test_a_schedule_armed_again_at_a_restart_keeps_what_it_missed(loom_store: str) -> None:
    """A program arms its schedules at each start (`schedule_timer(..., now_ms=now)`, as docs/schedules.md
    shows). Catches a re-arm that replaces the armed timer with one for the next occurrence after now:
    the occurrence missed during the outage never fires. A changed spec still replaces the timer."""
    clock = ManualClock(start_ms=utc_ms("2026-01-01T00:10"))
    spec = ScheduleSpec(schedule_id="hourly", cron="0 * * * *")

    def armed_now() -> TimerSpec:
        return schedule_timer(spec, now_ms=clock.now_ms(), source="cron", type="job.due", scope=SCOPE)

    async with open_runtime(loom_store, clock=clock, actors=(), load_entry_points=False) as rt:
        first = await rt.arm(armed_now())
        clock.set(utc_ms("2026-01-01T11:05"))  # down since 00:10: 01:00 .. 11:00 were missed
        again = await rt.arm(armed_now())
        assert (again.revision, again.fire_at_ms) == (first.revision, utc_ms("2026-01-01T01:00"))
        await rt.poll()
        (late,) = await occurrences(rt)
        assert late.delivery_id == occurrence_id("hourly", utc_ms("2026-01-01T11:00"))
        assert late.payload["skipped"] == 10

        spec = ScheduleSpec(schedule_id="hourly", cron="30 * * * *")
        changed = await rt.arm(armed_now())
        assert (changed.revision, changed.fire_at_ms) == (first.revision + 1, utc_ms("2026-01-01T11:30"))


async def test_an_outage_longer_than_the_catch_up_window_records_a_skip(loom_store: str) -> None:
    async with RuntimeDriver.open(loom_store, start_ms=utc_ms("2026-01-01T00:10")) as driver:
        timer = await arm(driver, ScheduleSpec(schedule_id="daily", cron="0 0 * * *"))
        # armed for Jan 2 00:00; at Jan 4 07:00 even the latest due occurrence is older than six hours
        driver.clock.set(utc_ms("2026-01-04T07:00"))
        (firing,) = await ledger(driver, timer.id, 1)
        assert (firing.result, firing.event_id) == (FiringResult.SKIPPED, None)
        assert firing.next_fire_at_ms == utc_ms("2026-01-05T00:00")
        assert "3 occurrence(s)" in (firing.detail or "")
        assert await occurrences(driver.runtime) == []


async def test_the_last_occurrence_of_a_schedule_that_ends_is_delivered_and_the_timer_retires(
    loom_store: str,
) -> None:
    # midnight (UTC) on the first two days of 2026, and never again
    async with RuntimeDriver.open(loom_store, start_ms=utc_ms("2025-12-31T12:00")) as driver:
        rt = driver.runtime
        timer = await arm(
            driver, ScheduleSpec(schedule_id="twice", cron="0 0 0 1-2 1 * 2026", seconds="first")
        )
        days = [utc_ms("2026-01-01T00:00"), utc_ms("2026-01-02T00:00")]
        for n, at in enumerate(days, start=1):
            driver.clock.set(at)
            await ledger(driver, timer.id, n)
        firings = await rt.firings(timer.id)
        assert [(f.result, f.next_fire_at_ms) for f in firings] == [
            (FiringResult.ACCEPTED, days[1]),
            (FiringResult.ACCEPTED, None),
        ]
        assert [e.delivery_id for e in await occurrences(rt)] == [occurrence_id("twice", at) for at in days]
        retired = await rt.timer(timer.id)
        assert (retired.state, retired.occurrences, retired.reason) == (TimerState.FIRED, 2, None)


@pytest.mark.parametrize(
    ("dst_gap", "on_the_29th"),
    [("shift_forward", "2026-03-29T01:00"), ("skip", None)],  # 03:00 CEST, the first instant after the gap
)
async def test_a_daily_calendar_schedule_across_the_spring_forward_gap(
    dst_gap: str, on_the_29th: str | None
) -> None:
    # Europe/Berlin jumps from 02:00 CET to 03:00 CEST on 2026-03-29: 02:30 does not exist that day
    async with RuntimeDriver.open(":memory:", start_ms=utc_ms("2026-03-27T12:00")) as driver:
        rt = driver.runtime
        spec = ScheduleSpec(
            schedule_id="nightly", calendar="02:30", timezone="Europe/Berlin", dst_gap=dst_gap
        )
        timer = await arm(driver, spec)
        expected = [utc_ms("2026-03-28T01:30")]  # 02:30 CET
        if on_the_29th is not None:
            expected.append(utc_ms(on_the_29th))
        expected.append(utc_ms("2026-03-30T00:30"))  # 02:30 CEST
        assert timer.fire_at_ms == expected[0]
        for n, at in enumerate(expected, start=1):
            assert (await rt.timer(timer.id)).fire_at_ms == at
            driver.clock.set(at)
            await ledger(driver, timer.id, n)
        assert [e.payload["occurrence_ms"] for e in await occurrences(rt)] == expected
        assert [e.delivery_id for e in await occurrences(rt)] == [
            occurrence_id("nightly", at) for at in expected
        ]
        assert all(e.payload["skipped"] == 0 for e in await occurrences(rt))


# -- the `schedule` route handler and its overlap policy -------------------------------------------------


def schedule_config() -> Config:
    return Config.from_dict({
        "scopes": {SCOPE: {
            "bindings": {"fake": {"executor": "fake"}},
            "routes": [{"name": "jobs", "types": ["job.due"], "handler": "schedule", "binding": "fake",
                        "work_kind": "job"}],
        }},
        "work_kinds": {"job": {"standing": True}},
    })  # fmt: skip


class Schedule:
    """A minutely schedule with one overlap policy, driven occurrence by occurrence."""

    def __init__(self, driver: RuntimeDriver, overlap: str) -> None:
        self.driver = driver
        self.spec = ScheduleSpec(schedule_id=f"every-minute-{overlap}", cron="* * * * *", overlap=overlap)
        self.timer_id = f"schedule:{self.spec.schedule_id}"
        self.fired = 0

    async def occur(self) -> Event:
        """Move to the next occurrence and wait until it fired and was routed."""
        rt = self.driver.runtime
        await keep_runs_going(self.driver, (await rt.timer(self.timer_id)).fire_at_ms)
        self.fired += 1
        (*_, firing) = await ledger(self.driver, self.timer_id, self.fired)
        event = await rt.event(firing.event_id or "")

        async def routed() -> bool:
            return await rt.checkpoint(event.id) is not None

        await self.driver.until(routed, f"occurrence {event.delivery_id} to be routed")
        await self.driver.settle()
        return event

    async def status(self, event: Event) -> CheckpointStatus:
        checkpoint = await self.driver.runtime.checkpoint(event.id)
        assert checkpoint is not None
        return checkpoint.status


def _barrier(tx: Tx, now_ms: int) -> None:
    return None


async def keep_runs_going(driver: RuntimeDriver, target_ms: int) -> None:
    """Move the clock to ``target_ms`` without a jump over a running attempt's lease expiry: stop just
    before it and wait for the router's heartbeat, so the runs stay going as a live process's would."""
    rt = driver.runtime
    while True:
        running = [launch.request.execution_id for launch in driver.fake.launches if not launch.done.is_set()]
        expiries = [(await rt.execution(x)).expires_at_ms for x in running]
        expiring = min((e for e in expiries if e is not None and e <= target_ms), default=None)
        if expiring is None:
            driver.clock.set(target_ms)
            return
        driver.clock.set(expiring - 1)
        # the router's renewers woke on the clock and sent their heartbeats (which commit no
        # notice to wait on); a round trip through the storage actor follows their commits
        await trio.testing.wait_all_tasks_blocked()
        await storage_of(rt).submit(_barrier)
        renewed = [(await rt.execution(x)).expires_at_ms for x in running]
        assert all(e is not None and e > expiring for e in renewed), "a running attempt lost its lease"


async def finish(driver: RuntimeDriver, work_id: str) -> None:
    """End the running attempt and wait until its outcome is committed."""
    driver.fake.finish(work_id, Completed())

    async def ended() -> bool:
        return (await driver.runtime.work(work_id)).current_execution_id is None

    await driver.until(ended, "the run to end")


async def started(driver: RuntimeDriver, n: int) -> None:
    async def check() -> bool:
        return len(driver.fake.launches) >= n

    await driver.until(check, f"launch {n}")
    await driver.settle()


@asynccontextmanager
async def scheduled(overlap: str) -> AsyncIterator[tuple[RuntimeDriver, Schedule]]:
    async with RuntimeDriver.open(":memory:", config=schedule_config()) as driver:
        schedule = Schedule(driver, overlap)
        await arm(driver, schedule.spec)
        yield driver, schedule


async def test_overlap_skip_drops_an_occurrence_while_the_previous_run_is_going() -> None:
    async with scheduled("skip") as (driver, schedule):
        first = await schedule.occur()
        await started(driver, 1)
        work_id = driver.fake.launches[0].request.work_id
        assert driver.fake.launches[0].request.trigger == first

        during = await schedule.occur()  # the run is still going
        assert await schedule.status(during) is CheckpointStatus.DROP
        assert "still going" in ((await driver.runtime.checkpoint(during.id)).reason or "")  # type: ignore[union-attr]
        assert (await driver.runtime.work(work_id)).pending_inputs == (first.id,)

        await finish(driver, work_id)
        after = await schedule.occur()
        await started(driver, 2)
        assert await schedule.status(after) is CheckpointStatus.ROUTED
        assert [launch.request.trigger for launch in driver.fake.launches] == [first, after]
        assert len(driver.fake.launches) == 2, "the dropped occurrence never ran"


async def test_overlap_buffer_one_keeps_one_occurrence_for_when_the_run_ends() -> None:
    async with scheduled("buffer_one") as (driver, schedule):
        first = await schedule.occur()
        await started(driver, 1)
        work_id = driver.fake.launches[0].request.work_id

        buffered = await schedule.occur()
        assert await schedule.status(buffered) is CheckpointStatus.ROUTED, (
            "the first overlapping occurrence waits"
        )
        dropped = await schedule.occur()
        assert await schedule.status(dropped) is CheckpointStatus.DROP, "a second one is skipped"
        assert (await driver.runtime.work(work_id)).pending_inputs == (first.id, buffered.id)

        driver.fake.finish(work_id, Completed())
        await started(driver, 2)
        second = driver.fake.launches[1].request
        assert (second.trigger, second.inputs) == (buffered, (buffered,))


async def test_overlap_allow_all_delivers_every_occurrence() -> None:
    async with scheduled("allow_all") as (driver, schedule):
        first = await schedule.occur()
        await started(driver, 1)
        work_id = driver.fake.launches[0].request.work_id
        during = [await schedule.occur() for _ in range(3)]
        assert [await schedule.status(e) for e in during] == [CheckpointStatus.ROUTED] * 3
        # one Work per schedule runs one attempt at a time: the occurrences wait as its input
        assert len(driver.fake.launches) == 1
        assert (await driver.runtime.work(work_id)).pending_inputs == (first.id, *(e.id for e in during))

        driver.fake.finish(work_id, Completed())
        await started(driver, 2)
        assert driver.fake.launches[1].request.inputs == tuple(during), "none was dropped"


async def test_a_schedule_timer_is_root_activity_and_its_work_is_standing() -> None:
    async with scheduled("skip") as (driver, schedule):
        first = await schedule.occur()
        await started(driver, 1)
        launch = driver.fake.launches[0]
        work = await driver.runtime.work(launch.request.work_id)
        assert work.keys == (f"schedule/{schedule.spec.schedule_id}",)
        assert work.kind == "job"
        assert first.is_root
        await finish(driver, work.id)
        assert (await driver.runtime.work(work.id)).state.value == "ready", "standing Work outlives its run"
        timer = await driver.runtime.timer(schedule.timer_id)
        assert timer.state is TimerState.ARMED


# -- a schedule route runs every occurrence without declaring a work kind ----------------------------------


def plain_schedule_config(**route: object) -> dict[str, object]:
    return {"scopes": {SCOPE: {
        "bindings": {"fake": {"executor": "fake"}},
        "routes": [{"name": "jobs", "types": ["job.due"], "handler": "schedule", "binding": "fake", **route}],
    }}}  # fmt: skip


async def test_a_schedule_route_without_a_work_kind_runs_every_occurrence() -> None:
    """Catches a schedule Work created with no kind (the default, non-standing): its first completed run
    made it terminal and the next seven occurrences were recorded as reaching completed Work."""
    config = Config.from_dict(plain_schedule_config())
    async with RuntimeDriver.open(":memory:", config=config) as driver:
        schedule = Schedule(driver, "skip")
        await arm(driver, schedule.spec)
        for n in range(1, 9):
            event = await schedule.occur()
            assert await schedule.status(event) is CheckpointStatus.ROUTED, f"occurrence {n} was not routed"
            await started(driver, n)
            work_id = driver.fake.launches[-1].request.work_id
            assert driver.fake.launches[-1].request.trigger == event
            await finish(driver, work_id)
        work = await driver.runtime.work(work_id)
        assert (work.kind, work.state.value, work.attempts) == ("schedule", "ready", 8)


@pytest.mark.parametrize(
    ("kinds", "reason"),
    [
        (
            {"job": {"standing": False, "reopen": True}},
            "work kind 'job' is not standing: add standing = true",
        ),
        ({}, "work kind 'job' is not declared: add [work_kinds.job] with standing = true"),
    ],
)
async def test_a_schedule_route_naming_a_kind_that_is_not_standing_is_refused(
    kinds: dict[str, object], reason: str
) -> None:
    """Catches a config check that lets a schedule route run under a run-once kind (it ran once)."""
    config = Config.from_dict(
        {**plain_schedule_config(work_kind="job"), "work_kinds": kinds}, file="loom.toml"
    )
    with pytest.raises(ConfigError, match="leave work_kind out") as refused:
        async with open_runtime(":memory:", config=config, plugins=[FakeExecutor()], load_entry_points=False):
            pass
    assert reason in str(refused.value)
    assert refused.value.key == "scopes.acme.routes[0].work_kind"
