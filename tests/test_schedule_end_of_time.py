"""Schedules at the end of loom's time (docs/schedules.md "Catch-up after an outage"): times end at
`MAX_TIME_MS`, 9999-12-31T23:59:59.999Z. A timer firing there fires its latest due occurrence (or
skips) and retires; a local time past the year 9999 (in a zone ahead of UTC) is no occurrence; an
instant past loom's times is refused with `InvalidRequest` naming the argument, never a builtin error.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import islice
from typing import Any

import pytest

from loom import InvalidRequest, open_runtime
from loom.plugins.schedule import (
    ScheduleSpec,
    next_occurrence,
    occurrence_id,
    occurrences,
    plan_firing,
    previous_occurrence,
    schedule_timer,
)
from loom.records.timers import FiringResult, TimerState
from loom.records.validation import MAX_TIME_MS
from loom.testing import ManualClock

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE


def utc_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def spec(cron: str, timezone: str = "UTC", **fields: Any) -> ScheduleSpec:
    return ScheduleSpec(schedule_id="y", cron=cron, timezone=timezone, **fields)


LAST_MINUTE = utc_ms("9999-12-31T23:59:00")
PLUS_14 = ["Pacific/Kiritimati", "Etc/GMT-14"]


def test_the_last_new_year_is_found_from_the_end_of_time() -> None:
    assert previous_occurrence(spec("0 0 1 1 *"), MAX_TIME_MS) == utc_ms("9999-01-01T00:00")
    assert previous_occurrence(spec("0 0 1 1 *"), MAX_TIME_MS + 1) == utc_ms("9999-01-01T00:00")


@pytest.mark.parametrize("timezone", ["UTC", "America/New_York", "Etc/GMT+12"])
@pytest.mark.parametrize("fold", ["first", "both"])
def test_a_catch_up_at_the_end_of_time_fires_the_last_due_occurrence_and_ends(
    timezone: str, fold: str
) -> None:
    # armed for 23:54Z, firing at the last millisecond: 23:54 .. 23:59 are due; 23:59 fires
    plan = plan_firing(spec("* * * * *", timezone, dst_fold=fold), LAST_MINUTE - 5 * MINUTE, MAX_TIME_MS)
    assert (plan.fire_ms, plan.skipped_count, plan.skipped_first_ms, plan.skipped_last_ms, plan.next_ms) == (
        LAST_MINUTE, 5, LAST_MINUTE - 5 * MINUTE, LAST_MINUTE - MINUTE, None,
    )  # fmt: skip


def test_a_catch_up_from_years_back_to_the_end_of_time_counts_its_skips_and_ends() -> None:
    plan = plan_firing(spec("* * * * *"), utc_ms("2026-01-01T00:01"), MAX_TIME_MS)
    assert (plan.fire_ms, plan.skipped_count, plan.skipped_count_truncated, plan.next_ms) == (
        LAST_MINUTE, 1000, True, None,
    )  # fmt: skip
    assert plan.skipped_last_ms == LAST_MINUTE - MINUTE
    yearly = plan_firing(spec("0 0 1 1 *"), utc_ms("2027-01-01T00:00"), MAX_TIME_MS)
    assert (yearly.fire_ms, yearly.skipped_last_ms, yearly.next_ms) == (
        None,
        utc_ms("9999-01-01T00:00"),
        None,
    )


def test_the_last_second_of_the_year_9999_is_an_occurrence() -> None:
    every_second = spec("* * * * * *", seconds="first")
    last_second = utc_ms("9999-12-31T23:59:59")
    assert previous_occurrence(every_second, MAX_TIME_MS + 1) == last_second
    assert previous_occurrence(every_second, last_second) == last_second - SECOND
    assert plan_firing(every_second, last_second, MAX_TIME_MS).fire_ms == last_second
    assert previous_occurrence(spec("59 59 23 31 12 * *", seconds="first"), MAX_TIME_MS) == last_second


@pytest.mark.parametrize("timezone", PLUS_14)
@pytest.mark.parametrize("fold", ["first", "both"])
def test_ahead_of_utc_the_schedule_ends_with_the_local_year_9999(timezone: str, fold: str) -> None:
    # At 10:00Z it is already 10000-01-01 00:00 at +14:00: the last occurrence is 9999-12-31 23:59 local.
    every_minute = spec("* * * * *", timezone, dst_fold=fold)
    last = utc_ms("9999-12-31T09:59")
    for before in (last + MINUTE, utc_ms("9999-12-31T15:00"), MAX_TIME_MS, MAX_TIME_MS + 1):
        assert previous_occurrence(every_minute, before) == last
    assert list(occurrences(every_minute, last - 2 * MINUTE, MAX_TIME_MS)) == [last - MINUTE, last]
    for after in (last, utc_ms("9999-12-31T12:00"), MAX_TIME_MS):
        with pytest.raises(InvalidRequest, match="no occurrence after"):
            next_occurrence(every_minute, after)
    # within the catch-up window the last one fires; later it is skipped; either way nothing follows
    recent = plan_firing(every_minute, last - 5 * MINUTE, utc_ms("9999-12-31T12:00"))
    assert (recent.fire_ms, recent.skipped_count, recent.next_ms) == (last, 5, None)
    late = plan_firing(every_minute, last - 5 * MINUTE, MAX_TIME_MS)
    assert (late.fire_ms, late.skipped_count, late.skipped_last_ms, late.next_ms) == (None, 6, last, None)
    yearly = spec("0 0 1 1 *", timezone, dst_fold=fold)
    assert previous_occurrence(yearly, MAX_TIME_MS) == utc_ms("9998-12-31T10:00")


@pytest.mark.parametrize("timezone", PLUS_14)
def test_a_calendar_ahead_of_utc_ends_with_the_local_year_9999(timezone: str) -> None:
    nightly = ScheduleSpec(schedule_id="c", calendar="23:30", timezone=timezone)
    assert previous_occurrence(nightly, MAX_TIME_MS) == utc_ms("9999-12-31T09:30")
    plan = plan_firing(nightly, utc_ms("9999-12-30T09:30"), MAX_TIME_MS)
    assert (plan.fire_ms, plan.skipped_count, plan.next_ms) == (None, 2, None)


def test_the_first_occurrences_near_the_end_of_time_are_still_found_forwards() -> None:
    found = list(
        islice(occurrences(spec("0 * * * *", "Pacific/Kiritimati"), utc_ms("9999-12-31T06:30"), 2**62), 5)
    )
    assert found == [utc_ms("9999-12-31T07:00"), utc_ms("9999-12-31T08:00"), utc_ms("9999-12-31T09:00")]


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda s: next_occurrence(s, 2**62), "next_occurrence: after_ms"),
        (lambda s: next_occurrence(s, MAX_TIME_MS + 1), "next_occurrence: after_ms"),
        (lambda s: previous_occurrence(s, 2**62), "previous_occurrence: before_ms"),
        (lambda s: previous_occurrence(s, MAX_TIME_MS + 2), "previous_occurrence: before_ms"),
        (lambda s: list(occurrences(s, 2**62, 2**63)), "occurrences: after_ms"),
        (lambda s: plan_firing(s, MAX_TIME_MS, 2**62), "plan_firing: now_ms"),
        (lambda s: plan_firing(s, 2**62 - 1, 2**62), "plan_firing: scheduled_ms"),
        (lambda s: next_occurrence(s, -(2**62)), "next_occurrence: after_ms"),
        (lambda s: previous_occurrence(s, -(2**62)), "previous_occurrence: before_ms"),
        (lambda s: next_occurrence(s, 1.5), "next_occurrence: after_ms must be integer milliseconds"),
    ],
)
@pytest.mark.parametrize("timezone", ["UTC", "Pacific/Kiritimati"])
def test_an_instant_past_loom_s_times_is_refused_naming_the_argument(
    call: Any, named: str, timezone: str
) -> None:
    with pytest.raises(InvalidRequest, match=named):
        call(spec("0 0 1 1 *", timezone))


async def test_a_cron_timer_firing_at_the_end_of_time_fires_its_last_occurrence_and_retires(
    loom_store: str,
) -> None:
    """Catches the firing that was invalid ("recurrence policy 'cron' raised OverflowError")."""
    clock = ManualClock(start_ms=utc_ms("2026-01-01T00:00"))
    every_minute = ScheduleSpec(schedule_id="m", cron="* * * * *")
    async with open_runtime(loom_store, clock=clock, actors=(), load_entry_points=False) as rt:
        timer = await rt.arm(schedule_timer(every_minute, now_ms=clock.now_ms(), source="cron", type="job.due",
                                            scope="acme"))  # fmt: skip
        clock.set(MAX_TIME_MS)
        await rt.poll()
        (firing,) = await rt.firings(timer.id)
        assert (firing.result, firing.next_fire_at_ms) == (FiringResult.ACCEPTED, None), firing.detail
        (event,) = [e for e in await rt.events(limit=100) if e.source == "cron"]
        assert event.delivery_id == occurrence_id("m", LAST_MINUTE)
        assert (event.payload["skipped"], event.payload["skipped_truncated"]) == (1000, True)
        assert (await rt.timer(timer.id)).state is TimerState.FIRED
