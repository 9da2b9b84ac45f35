"""The schedule plugin: cron/calendar occurrences across DST, catch-up, clock jumps, overlap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pluggy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loom import InvalidRequest
from loom.plugins import hookspecs, schedule
from loom.plugins.schedule import (
    MAX_COUNTED_SKIPS,
    Calendar,
    FiringPlan,
    OverlapAction,
    ScheduleSpec,
    next_occurrence,
    occurrence_id,
    occurrences,
    overlap_decision,
    plan_firing,
    previous_occurrence,
    spec_from_mapping,
)
from loom.records.timers import Occurrence, Replacement, Skip, Timer, TimerState

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR


def local_ms(text: str, zone: str, fold: int = 0) -> int:
    """Unix ms of a local wall-clock time (``fold=1`` picks the second of a repeated hour)."""
    moment = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone), fold=fold)
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def utc_ms(text: str) -> int:
    return local_ms(text, "UTC")


def following(spec: ScheduleSpec, after_ms: int, count: int) -> list[int]:
    out = []
    for _ in range(count):
        after_ms = next_occurrence(spec, after_ms)
        out.append(after_ms)
    return out


def daily_0230(zone: str, *, calendar: bool = False, **policy: Any) -> ScheduleSpec:
    what: dict[str, Any] = {"calendar": {"at": ["02:30"]}} if calendar else {"cron": "30 2 * * *"}
    return ScheduleSpec(schedule_id="nightly", timezone=zone, **what, **policy)


# --- DST ----------------------------------------------------------------------------------------

SPRING_FORWARD = [
    # zone, the day the clocks jump from 02:00 to 03:00
    ("Europe/Berlin", "2024-03-31"),
    ("America/New_York", "2024-03-10"),
]


@pytest.mark.parametrize("calendar", [False, True], ids=["cron", "calendar"])
@pytest.mark.parametrize(("zone", "day"), SPRING_FORWARD)
def test_spring_forward_gap_shifts_to_the_first_instant_after_the_gap(
    zone: str, day: str, calendar: bool
) -> None:
    spec = daily_0230(zone, calendar=calendar)
    next_day = (datetime.fromisoformat(day) + timedelta(days=1)).date().isoformat()
    got = following(spec, local_ms(f"{day}T00:00", zone), 2)
    assert got == [local_ms(f"{day}T03:00", zone), local_ms(f"{next_day}T02:30", zone)]


@pytest.mark.parametrize("calendar", [False, True], ids=["cron", "calendar"])
@pytest.mark.parametrize(("zone", "day"), SPRING_FORWARD)
def test_spring_forward_gap_skip_policy_drops_that_day(zone: str, day: str, calendar: bool) -> None:
    spec = daily_0230(zone, calendar=calendar, dst_gap="skip")
    next_day = (datetime.fromisoformat(day) + timedelta(days=1)).date().isoformat()
    assert following(spec, local_ms(f"{day}T00:00", zone), 1) == [local_ms(f"{next_day}T02:30", zone)]


def test_gap_times_shifted_forward_fire_once() -> None:
    # 02:00, 02:15, 02:30, 02:45 and 03:00 all land on 03:00 on the spring-forward day.
    spec = ScheduleSpec(schedule_id="q", cron="*/15 2-3 * * *", timezone="Europe/Berlin")
    got = list(occurrences(spec, utc_ms("2024-03-30T12:00"), utc_ms("2024-03-31T12:00")))
    zone = "Europe/Berlin"
    assert got == [
        local_ms("2024-03-31T03:00", zone),
        local_ms("2024-03-31T03:15", zone),
        local_ms("2024-03-31T03:30", zone),
        local_ms("2024-03-31T03:45", zone),
    ]


FALL_BACK = [
    # zone, day, a local time inside the repeated hour
    ("Europe/Berlin", "2024-10-27", "02:30"),
    ("America/New_York", "2024-11-03", "01:30"),
]


@pytest.mark.parametrize("calendar", [False, True], ids=["cron", "calendar"])
@pytest.mark.parametrize(("zone", "day", "hhmm"), FALL_BACK)
def test_fall_back_fold_fires_once_at_the_first_occurrence(
    zone: str, day: str, hhmm: str, calendar: bool
) -> None:
    what: dict[str, Any] = {"calendar": hhmm} if calendar else {"cron": f"{hhmm[3:]} {hhmm[:2]} * * *"}
    spec = ScheduleSpec(schedule_id="nightly", timezone=zone, **what)
    first = local_ms(f"{day}T{hhmm}", zone, fold=0)
    assert local_ms(f"{day}T{hhmm}", zone, fold=1) - first == HOUR, "the test time is in the fold"
    got = following(spec, local_ms(f"{day}T00:00", zone), 2)
    assert got == [first, first + DAY + HOUR]


@pytest.mark.parametrize("calendar", [False, True], ids=["cron", "calendar"])
@pytest.mark.parametrize(("zone", "day", "hhmm"), FALL_BACK)
def test_fall_back_fold_both_policy_fires_twice(zone: str, day: str, hhmm: str, calendar: bool) -> None:
    what: dict[str, Any] = {"calendar": hhmm} if calendar else {"cron": f"{hhmm[3:]} {hhmm[:2]} * * *"}
    spec = ScheduleSpec(schedule_id="nightly", timezone=zone, dst_fold="both", **what)
    first = local_ms(f"{day}T{hhmm}", zone, fold=0)
    second = local_ms(f"{day}T{hhmm}", zone, fold=1)
    assert following(spec, local_ms(f"{day}T00:00", zone), 3) == [first, second, first + DAY + HOUR]
    # Asked from inside the fold (between the two readings), the second one is next.
    assert next_occurrence(spec, first) == second
    assert previous_occurrence(spec, second) == first


@pytest.mark.parametrize(("zone", "day", "hhmm"), FALL_BACK)
def test_looking_back_from_the_second_pass_of_a_fold_finds_the_first(zone: str, day: str, hhmm: str) -> None:
    spec = ScheduleSpec(schedule_id="nightly", timezone=zone, cron=f"{hhmm[3:]} {hhmm[:2]} * * *")
    first = local_ms(f"{day}T{hhmm}", zone, fold=0)
    # Twenty minutes before the second reading the local clock shows an earlier time than the
    # occurrence, which nevertheless already happened.
    assert previous_occurrence(spec, first + HOUR - 20 * MINUTE) == first
    assert next_occurrence(spec, first + HOUR - 20 * MINUTE) == first + DAY + HOUR


@pytest.mark.parametrize("fold", ["first", "both"])
def test_0230_on_the_new_york_fall_back_day_happens_once(fold: str) -> None:
    # New York repeats 01:00-02:00, so 02:30 is an ordinary time there under either policy.
    spec = daily_0230("America/New_York", dst_fold=fold)
    got = following(spec, local_ms("2024-11-03T00:00", "America/New_York"), 2)
    assert got == [utc_ms("2024-11-03T07:30"), utc_ms("2024-11-04T07:30")]


# The model below reads the zone minute by minute in UTC, independently of the module's search.
TRANSITIONS = [
    ("Europe/Berlin", "2024-03-31"),
    ("Europe/Berlin", "2024-10-27"),
    ("America/New_York", "2024-03-10"),
    ("America/New_York", "2024-11-03"),
    ("Australia/Lord_Howe", "2024-04-06"),  # back 30 minutes
    ("Australia/Lord_Howe", "2024-10-05"),  # forward 30 minutes
    ("Antarctica/Troll", "2024-03-31"),  # forward two hours
    ("Antarctica/Troll", "2024-10-27"),  # back two hours
    ("Pacific/Chatham", "2024-04-06"),
]


def model_occurrences(
    zone_name: str, minutes: set[int], hours: set[int], gap: str, fold: str, lo: int, hi: int
) -> list[int]:
    zone = ZoneInfo(zone_name)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def wall(ms: int) -> datetime:
        return (epoch + timedelta(milliseconds=ms)).astimezone(zone).replace(tzinfo=None)

    def matches(w: datetime) -> bool:
        return w.second == 0 and w.minute in minutes and w.hour in hours

    out: set[int] = set()
    t = lo - lo % MINUTE - DAY
    previous = highest = wall(t - MINUTE)
    while t <= hi:
        w = wall(t)
        skipped = previous + timedelta(minutes=1)
        while skipped < w:  # the clock jumped over these readings: a gap
            if matches(skipped) and gap == "shift_forward":
                out.add(t)
            skipped += timedelta(minutes=1)
        if matches(w) and (w > highest or fold == "both"):
            out.add(t)
        previous, highest = w, max(highest, w)
        t += MINUTE
    return sorted(ms for ms in out if lo < ms <= hi)


@settings(max_examples=60, deadline=None)
@given(
    transition=st.sampled_from(TRANSITIONS),
    minutes=st.sets(st.sampled_from([0, 15, 30, 45, 59]), min_size=1),
    hours=st.sets(st.integers(min_value=0, max_value=23), min_size=1, max_size=6),
    gap=st.sampled_from(["shift_forward", "skip"]),
    fold=st.sampled_from(["first", "both"]),
    start_offset=st.integers(min_value=-8 * HOUR, max_value=8 * HOUR),
)
def test_occurrences_match_a_minute_by_minute_model(
    transition: tuple[str, str],
    minutes: set[int],
    hours: set[int],
    gap: str,
    fold: str,
    start_offset: int,
) -> None:
    zone, day = transition
    cron = f"{','.join(map(str, sorted(minutes)))} {','.join(map(str, sorted(hours)))} * * *"
    spec = ScheduleSpec(schedule_id="p", cron=cron, timezone=zone, dst_gap=gap, dst_fold=fold)
    lo = utc_ms(f"{day}T00:00") + start_offset
    hi = lo + 30 * HOUR
    expected = model_occurrences(zone, minutes, hours, gap, fold, lo, hi)

    assert list(occurrences(spec, lo, hi)) == expected
    backwards = []
    previous = previous_occurrence(spec, hi + 1)
    while previous is not None and previous > lo:
        backwards.append(previous)
        previous = previous_occurrence(spec, previous)
    assert backwards == expected[::-1]


# --- Catch-up and clock jumps ---------------------------------------------------------------------


def hourly(**extra: Any) -> ScheduleSpec:
    return ScheduleSpec(schedule_id="hourly", cron="0 * * * *", timezone="UTC", **extra)


def test_catch_up_after_a_ten_hour_outage_fires_the_latest_and_skips_the_rest() -> None:
    scheduled = utc_ms("2024-05-01T00:00")
    now = utc_ms("2024-05-01T10:20")  # down for ten hours and twenty minutes
    plan = plan_firing(hourly(), scheduled, now)
    assert plan.fire_ms == utc_ms("2024-05-01T10:00")
    assert plan.occurrence_id == f"hourly@{utc_ms('2024-05-01T10:00')}"
    assert plan.skipped_count == 10  # 00:00 .. 09:00, though 05:00 .. 09:00 were inside the window
    assert plan.skipped_first_ms == scheduled
    assert plan.skipped_last_ms == utc_ms("2024-05-01T09:00")
    assert plan.skipped_count_truncated is False
    assert plan.next_ms == utc_ms("2024-05-01T11:00")
    assert plan.next_ms > now


def test_nothing_fires_when_every_due_occurrence_is_older_than_the_window() -> None:
    daily = ScheduleSpec(schedule_id="daily", cron="0 0 * * *", timezone="UTC")
    scheduled = utc_ms("2024-05-01T00:00")
    plan = plan_firing(daily, scheduled, scheduled + 6 * HOUR + 1)
    assert plan.fire_ms is None
    assert plan.occurrence_id is None
    assert (plan.skipped_count, plan.skipped_first_ms, plan.skipped_last_ms) == (1, scheduled, scheduled)
    assert plan.next_ms == utc_ms("2024-05-02T00:00")


def test_an_occurrence_exactly_catch_up_old_still_fires() -> None:
    daily = ScheduleSpec(schedule_id="daily", cron="0 0 * * *", timezone="UTC", catch_up_ms=HOUR)
    scheduled = utc_ms("2024-05-01T00:00")
    assert plan_firing(daily, scheduled, scheduled + HOUR).fire_ms == scheduled
    assert plan_firing(daily, scheduled, scheduled + HOUR + 1).fire_ms is None


def test_an_on_time_firing_fires_its_occurrence_and_skips_nothing() -> None:
    scheduled = utc_ms("2024-05-01T03:00")
    plan = plan_firing(hourly(), scheduled, scheduled + 250)
    assert plan == FiringPlan(
        schedule_id="hourly",
        scheduled_ms=scheduled,
        now_ms=scheduled + 250,
        fire_ms=scheduled,
        skipped_count=0,
        skipped_count_truncated=False,
        skipped_first_ms=None,
        skipped_last_ms=None,
        next_ms=scheduled + HOUR,
    )
    assert plan.next_occurrence_id == f"hourly@{scheduled + HOUR}"


def test_a_timer_armed_off_the_schedule_fires_first_at_its_first_occurrence() -> None:
    """A timer armed for an instant that is no occurrence (``POST /timers`` with any ``fire_at_ms``) is
    for the schedule's first occurrence from then on. Catches the armed instant fired as if it were
    one (seen: a ``* * * * *`` timer armed at 19:31:52.062 fired an Event for that instant) or
    counted as a skipped occurrence."""
    armed = utc_ms("2024-05-01T10:30")  # hourly occurrences are on the hour
    early = plan_firing(hourly(), armed, armed + MINUTE)
    assert (early.fire_ms, early.skipped_count, early.next_ms) == (None, 0, utc_ms("2024-05-01T11:00"))
    assert early.next_occurrence_id == f"hourly@{utc_ms('2024-05-01T11:00')}"
    plan = plan_firing(hourly(), armed, utc_ms("2024-05-01T11:00"))
    assert plan.fire_ms == utc_ms("2024-05-01T11:00")
    assert (plan.skipped_count, plan.skipped_first_ms, plan.skipped_last_ms) == (0, None, None)
    late = plan_firing(hourly(), armed, utc_ms("2024-05-01T13:10"))
    assert late.fire_ms == utc_ms("2024-05-01T13:00")
    assert (late.skipped_count, late.skipped_first_ms, late.skipped_last_ms) == (
        2,
        utc_ms("2024-05-01T11:00"),
        utc_ms("2024-05-01T12:00"),
    )


def test_clock_jump_forward_of_days_fires_once() -> None:
    scheduled = utc_ms("2024-05-01T00:00")
    now = scheduled + 30 * DAY + 90 * MINUTE
    plan = plan_firing(hourly(), scheduled, now)
    assert plan.fire_ms == now - 30 * MINUTE
    assert plan.skipped_count == 30 * 24 + 1  # every hour from the scheduled one to the one before
    assert plan.next_ms == now + 30 * MINUTE


def test_a_timer_driven_through_a_clock_jump_fires_one_occurrence() -> None:
    # Fire the re-armed timer as the timer service would, at a clock that jumped three days.
    policies = {"calendar": schedule.calendar_policy}
    spec = {"schedule_id": "daily", "calendar": "09:00", "timezone": "Europe/Berlin"}
    armed = next_occurrence(spec_from_mapping(spec), utc_ms("2024-05-01T12:00"))
    now = armed + 3 * DAY + HOUR
    fired = []
    while armed <= now:
        plan = policies["calendar"](armed, now, spec)
        if plan.fire_ms is not None:
            fired.append(plan.fire_ms)
        assert plan.next_ms > now
        armed = plan.next_ms
    assert fired == [local_ms("2024-05-05T09:00", "Europe/Berlin")]


def test_a_long_jump_counts_skips_up_to_a_bound() -> None:
    minutely = ScheduleSpec(schedule_id="m", cron="* * * * *", timezone="UTC")
    scheduled = utc_ms("2024-05-01T00:00")
    now = scheduled + 90 * DAY
    plan = plan_firing(minutely, scheduled, now)
    assert plan.fire_ms == now
    assert plan.skipped_count == MAX_COUNTED_SKIPS
    assert plan.skipped_count_truncated is True
    assert plan.skipped_last_ms == now - MINUTE
    assert plan.next_ms == now + MINUTE


def until_2025(**extra: Any) -> ScheduleSpec:
    """New Year's midnight (UTC) from 2000 to 2025, and never after."""
    return ScheduleSpec(schedule_id="until-2025", cron="0 0 0 1 1 * 2000-2025", seconds="first", **extra)


def test_the_last_occurrence_of_a_schedule_that_ends_fires_and_nothing_follows() -> None:
    last = utc_ms("2025-01-01T00:00")
    plan = plan_firing(until_2025(), last, last + 5)
    assert (plan.fire_ms, plan.occurrence_id) == (last, f"until-2025@{last}")
    assert (plan.next_ms, plan.next_occurrence_id) == (None, None)
    assert plan.skipped_count == 0
    # The one before it still has a successor.
    assert plan_firing(until_2025(), utc_ms("2024-01-01T00:00"), utc_ms("2024-01-01T00:00")).next_ms == last


def test_a_schedule_that_ended_during_an_outage_skips_without_a_successor() -> None:
    scheduled = utc_ms("2024-01-01T00:00")
    plan = plan_firing(until_2025(), scheduled, utc_ms("2026-06-01T00:00"))
    assert plan.fire_ms is None
    assert (plan.skipped_count, plan.skipped_first_ms, plan.skipped_last_ms) == (
        2,
        scheduled,
        utc_ms("2025-01-01T00:00"),
    )
    assert plan.next_ms is None


def test_a_firing_timer_never_runs_before_its_time() -> None:
    with pytest.raises(InvalidRequest, match="cannot fire earlier"):
        plan_firing(hourly(), utc_ms("2024-05-01T03:00"), utc_ms("2024-05-01T02:59"))


# --- Identity and determinism ------------------------------------------------------------------


def test_occurrence_ids_are_stable() -> None:
    assert occurrence_id("nightly", 1_711_846_800_000) == "nightly@1711846800000"
    spec = daily_0230("Europe/Berlin")
    scheduled = local_ms("2024-03-31T03:00", "Europe/Berlin")
    plans = [plan_firing(spec, scheduled, scheduled + 5) for _ in range(3)]
    plans.append(plan_firing(spec_from_mapping(spec.to_mapping()), scheduled, scheduled + 5))
    assert all(plan == plans[0] for plan in plans)
    assert plans[0].occurrence_id == "nightly@1711846800000"


def test_spec_round_trips_through_its_mapping() -> None:
    spec = ScheduleSpec(
        schedule_id="weekly",
        calendar=Calendar(at=["17:00", "09:30", "09:30"], weekdays=["FRI", "mon"]),
        timezone="America/New_York",
        dst_gap="skip",
        dst_fold="both",
        catch_up_ms=HOUR,
        overlap="buffer_one",
    )
    assert spec.calendar == Calendar(at=("09:30", "17:00"), weekdays=("mon", "fri"))
    assert spec_from_mapping(spec.to_mapping()) == spec


def test_calendar_weekdays_limit_the_days() -> None:
    spec = ScheduleSpec(
        schedule_id="w", calendar={"at": ["09:30", "17:00"], "weekdays": ["mon", "fri"]}, timezone="UTC"
    )
    # 2024-05-01 is a Wednesday.
    assert following(spec, utc_ms("2024-05-01T00:00"), 5) == [
        utc_ms("2024-05-03T09:30"),
        utc_ms("2024-05-03T17:00"),
        utc_ms("2024-05-06T09:30"),
        utc_ms("2024-05-06T17:00"),
        utc_ms("2024-05-10T09:30"),
    ]


def test_calendar_walls_are_strictly_after_the_start() -> None:
    """`Calendar.walls` yields the local times strictly after its start (before it, in reverse), as the
    occurrence functions expect of any schedule. Catches: a forward stream that starts with a wall equal
    to its start."""
    calendar = Calendar(at=["09:00"])
    start = datetime(2024, 5, 1, 9, 0)
    assert next(calendar.walls(start, reverse=False)) == datetime(2024, 5, 2, 9, 0)
    assert next(calendar.walls(start, reverse=True)) == datetime(2024, 4, 30, 9, 0)


# --- Validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"cron": "61 * * * *"}, "ScheduleSpec.cron"),
        ({"cron": "* * * *"}, "ScheduleSpec.cron"),
        ({"cron": "R * * * *"}, "ScheduleSpec.cron"),
        ({"cron": "H 2 * * *"}, "ScheduleSpec.cron"),
        ({"cron": "0 0 30 2 *"}, "ScheduleSpec.cron"),
        ({"cron": ""}, "ScheduleSpec.cron"),
        ({"cron": "0 * * * *", "timezone": "Mars/Olympus_Mons"}, "ScheduleSpec.timezone"),
        ({"cron": "0 * * * *", "timezone": "../etc/passwd"}, "ScheduleSpec.timezone"),
        ({"cron": "0 * * * *", "dst_gap": "later"}, "ScheduleSpec.dst_gap"),
        ({"cron": "0 * * * *", "dst_fold": "second"}, "ScheduleSpec.dst_fold"),
        ({"cron": "0 * * * *", "overlap": "queue_all"}, "ScheduleSpec.overlap"),
        ({"cron": "0 * * * *", "catch_up_ms": 0}, "ScheduleSpec.catch_up_ms"),
        ({"cron": "0 * * * *", "catch_up_ms": True}, "ScheduleSpec.catch_up_ms"),
        ({"cron": "0 * * * *", "catch_up_ms": 1.5}, "ScheduleSpec.catch_up_ms"),
        ({"cron": "0 * * * *", "calendar": "02:30"}, "ScheduleSpec.cron, ScheduleSpec.calendar"),
        ({}, "ScheduleSpec.cron, ScheduleSpec.calendar"),
        ({"calendar": "25:00"}, "Calendar.at"),
        ({"calendar": "24:00"}, "Calendar.at"),
        ({"calendar": {"at": []}}, "Calendar.at"),
        ({"calendar": {"at": ["02:30"], "weekdays": ["funday"]}}, "Calendar.weekdays"),
        ({"calendar": {"at": ["02:30"], "every": 2}}, "ScheduleSpec.calendar"),
        ({"calendar": {"weekdays": ["mon"]}}, "ScheduleSpec.calendar"),
        ({"schedule_id": "", "cron": "0 * * * *"}, "ScheduleSpec.schedule_id"),
        ({"cron": "0 * * * *", "crn": "x"}, "crn"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    mapping = {"schedule_id": "s", **fields}
    with pytest.raises(InvalidRequest) as refused:
        spec_from_mapping(mapping)
    assert named in str(refused.value)


# --- Overlap --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overlap", "running", "buffered", "expected"),
    [
        ("skip", 0, 0, "start"),
        ("skip", 1, 0, "skip"),
        ("buffer_one", 0, 0, "start"),
        ("buffer_one", 1, 0, "buffer"),
        ("buffer_one", 1, 1, "skip"),
        ("allow_all", 0, 0, "start"),
        ("allow_all", 3, 0, "start"),
    ],
)
def test_overlap_policy_table(overlap: str, running: int, buffered: int, expected: str) -> None:
    spec = hourly(overlap=overlap)
    assert overlap_decision(spec, running, buffered) == OverlapAction(expected)


def test_default_overlap_is_skip() -> None:
    assert overlap_decision(hourly(), 1, 0) is OverlapAction.SKIP


def test_overlap_refuses_negative_counts() -> None:
    with pytest.raises(InvalidRequest, match="running"):
        overlap_decision(hourly(), -1, 0)


# --- The hook -------------------------------------------------------------------------------------


def test_plan_policies_plan_cron_and_calendar_firings() -> None:
    policies = {"cron": schedule.cron_policy, "calendar": schedule.calendar_policy}

    scheduled = utc_ms("2024-05-01T00:00")
    spec = {"schedule_id": "hourly", "cron": "0 * * * *"}
    plan = policies["cron"](scheduled, scheduled + 10 * HOUR + 20 * MINUTE, spec)
    assert plan == plan_firing(hourly(), scheduled, scheduled + 10 * HOUR + 20 * MINUTE)

    plan = policies["calendar"](scheduled, scheduled, {"schedule_id": "c", "calendar": "00:00"})
    assert (plan.fire_ms, plan.next_ms) == (scheduled, scheduled + DAY)

    with pytest.raises(InvalidRequest, match="needs a calendar spec"):
        policies["calendar"](scheduled, scheduled, spec)
    with pytest.raises(InvalidRequest, match=r"ScheduleSpec\.timezone"):
        policies["cron"](scheduled, scheduled, {**spec, "timezone": "Nowhere/Special"})


@pytest.mark.parametrize("zone", ["America", "Etc", "zone.tab", "America/", "a" * 300, "UTC\x00", "../UTC"])
def test_a_time_zone_that_names_no_zone_is_refused_naming_the_field(zone: str) -> None:
    """A directory of zones, a data file of the zone database, a name too long for a file, a NUL:
    each gets `InvalidRequest` naming ``ScheduleSpec.timezone``, never the OS error the zone lookup
    raised (which named a path on the server). Catches catching only the lookup's own errors."""
    with pytest.raises(InvalidRequest, match=r"ScheduleSpec\.timezone: unknown IANA time zone"):
        ScheduleSpec(schedule_id="x", cron="0 0 * * *", timezone=zone)


def test_plugin_answers_core_recurrence_contract() -> None:
    pm = pluggy.PluginManager("loom")
    pm.add_hookspecs(hookspecs)
    pm.register(schedule)
    (policies,) = pm.hook.loom_recurrence_policies()
    assert set(policies) == {"cron", "calendar"}
    scheduled = utc_ms("2024-05-01T00:00")
    spec = ScheduleSpec(schedule_id="hourly", cron="0 * * * *").to_mapping()
    timer = _timer(scheduled, spec)
    # within the catch-up window the latest due occurrence fires, older ones are counted as skipped
    occurrence, replacement = policies["cron"](timer, scheduled + 2 * HOUR + MINUTE, spec)
    assert isinstance(occurrence, Occurrence)
    assert occurrence.delivery_id == f"hourly@{scheduled + 2 * HOUR}"
    assert occurrence.payload["skipped"] == 2
    assert occurrence.payload["skipped_truncated"] is False
    # a count past the bound says so (it read as an exact 1,000 for a day of minutes)
    minutely = ScheduleSpec(schedule_id="m", cron="* * * * *").to_mapping()
    long, _ = policies["cron"](_timer(scheduled, minutely), scheduled + DAY + MINUTE // 2, minutely)
    assert isinstance(long, Occurrence)
    assert (long.payload["skipped"], long.payload["skipped_truncated"]) == (MAX_COUNTED_SKIPS, True)
    assert long.payload["skipped_last_ms"] == scheduled + DAY - MINUTE
    assert replacement == Replacement(
        fire_at_ms=scheduled + 3 * HOUR, delivery_id=f"hourly@{scheduled + 3 * HOUR}"
    )
    # when even the latest due occurrence is older than six hours nothing fires: a skip, never a burst
    daily = ScheduleSpec(schedule_id="daily", cron="0 0 * * *").to_mapping()
    skip, replacement = policies["cron"](_timer(scheduled, daily), scheduled + 3 * DAY + 7 * HOUR, daily)
    assert isinstance(skip, Skip)
    assert skip.skipped == 4
    assert replacement is not None
    assert replacement.fire_at_ms == scheduled + 4 * DAY


def test_the_core_policy_delivers_the_last_occurrence_with_no_replacement() -> None:
    policies = schedule.loom_recurrence_policies()
    spec = until_2025().to_mapping()
    last = utc_ms("2025-01-01T00:00")
    occurrence, replacement = policies["cron"](_timer(last, spec), last + 5, spec)
    assert isinstance(occurrence, Occurrence)
    assert (occurrence.occurrence_ms, occurrence.delivery_id) == (last, f"until-2025@{last}")
    assert replacement is None
    skip, replacement = policies["cron"](_timer(last, spec), last + DAY, spec)
    assert isinstance(skip, Skip)
    assert replacement is None


def test_a_stored_expression_cron_tools_read_differently_is_refused_not_fired() -> None:
    # Armed before loom refused it: croniter reads 9-9 as every hour, cron, Quartz and croner as 9.
    # The policy refuses the stored spec, saying what to write, so core marks the timer invalid
    # instead of firing it with either meaning.
    policies = schedule.loom_recurrence_policies()
    spec = {**ScheduleSpec(schedule_id="nine", cron="0 9 * * *").to_mapping(), "cron": "0 9-9 * * *"}
    scheduled = utc_ms("2024-05-01T09:00")
    with pytest.raises(InvalidRequest, match=r"croniter reads '9-9' as every hour value.* write 9"):
        policies["cron"](_timer(scheduled, spec), scheduled, spec)


def _timer(fire_at_ms: int, spec: dict[str, object]) -> Timer:
    return Timer(
        id="schedule:hourly", revision=1, state=TimerState.ARMED, fire_at_ms=fire_at_ms, source="cron",
        type="job.due", scope="acme", key=None, work_id=None, payload={}, delivery_id="hourly", interval_ms=None,
        recurrence="cron", spec=spec, parent_id=None, execution_id=None, occurrences=0, reason=None,
        created_at_ms=0, updated_at_ms=0,
    )  # fmt: skip
