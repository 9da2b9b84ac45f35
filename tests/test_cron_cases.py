"""Cron expressions against their expected instants: one readable row per case.

Each row is a cron expression (with the spec options it needs), an instant to start after, and the
instants its next occurrences must be, written as ISO times with their UTC offset so that a DST row
says which of two equal wall times it means. ``END`` says the schedule has no further occurrence.
The expectations are worked out by hand from what the expression means in standard cron (Vixie
cron/cronie, robfig/cron); the rows for forms beyond it (wrap-around ranges, ``29-L``, ``L5``,
``5L``, ``FRI#L``, ``W15``, ``31W``, ``LW``, ``L-n``, ``MON-FRI#1``) give the occurrences the
documentation or test suite of croniter 7, Quartz or croner gives for them, named in each section;
the DST rows come from the zone's transitions and loom's documented DST policy.

After the rows: what is refused (and that the message says why and what to write instead), a
model-based check that the occurrences croniter finds for loom's parsed fields are exactly the ones
an independent, day-by-day model of those fields finds, and a check against croniter itself that
every expression croniter reads is either read by loom with croniter's meaning or refused for a
documented disagreement between cron tools.
"""

from __future__ import annotations

import calendar
import contextlib
import importlib.metadata
import re
from datetime import UTC, date, datetime, timedelta
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

import attrs
import pytest
from croniter import CroniterBadCronError, CroniterBadDateError, croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from loom import InvalidRequest
from loom.plugins.schedule import (
    ScheduleSpec,
    next_occurrence,
    occurrences,
    previous_occurrence,
    spec_from_mapping,
)
from loom.plugins.schedule.cron import CronExpression, parse_cron

END = "END"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FOREVER = 2**62


@attrs.frozen
class Case:
    id: str
    cron: str
    after: str
    expect: tuple[str, ...]
    options: dict[str, Any] = attrs.field(factory=dict, hash=False)


def case(id: str, cron: str, after: str, *expect: str, **options: Any) -> Any:
    return pytest.param(Case(id, cron, after, expect, options), id=id)


def ms(text: str) -> int:
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None, f"{text} needs its UTC offset"
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def iso(ms_value: int, zone: str) -> str:
    return (_EPOCH + timedelta(milliseconds=ms_value)).astimezone(ZoneInfo(zone)).isoformat()


def following(spec: ScheduleSpec, after_ms: int, count: int) -> list[str]:
    """The next ``count`` occurrences as ISO times in the spec's zone, ``END`` once there are none."""
    found = [iso(value, spec.timezone) for value in islice(occurrences(spec, after_ms, _FOREVER), count)]
    return found if len(found) == count else [*found, END]


CASES = [
    # --- Ranges ------------------------------------------------------------------------------------------
    case("hour-range", "0 8-10 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T08:00+00:00", "2024-01-01T09:00+00:00", "2024-01-01T10:00+00:00",
         "2024-01-02T08:00+00:00"),
    case("weekday-range-ending-sunday", "0 0 * * FRI-SUN", "2024-01-01T00:00+00:00",
         "2024-01-05T00:00+00:00", "2024-01-06T00:00+00:00", "2024-01-07T00:00+00:00",
         "2024-01-12T00:00+00:00"),
    case("sunday-as-7", "0 0 * * 6-7", "2024-01-01T00:00+00:00",
         "2024-01-06T00:00+00:00", "2024-01-07T00:00+00:00", "2024-01-13T00:00+00:00"),
    # --- Steps: "a/n" runs from a to the end of the field ---------------------------------------------
    case("step-from-the-last-minute", "59/15 * * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T00:59+00:00", "2024-01-01T01:59+00:00"),
    case("step-from-saturday", "* * * * 6/1", "2024-01-01T00:00+00:00",
         "2024-01-06T00:00+00:00", "2024-01-06T00:01+00:00"),
    case("step-from-saturday-next-week", "0 12 * * 6/1", "2024-01-06T13:00+00:00",
         "2024-01-13T12:00+00:00"),
    case("wildcard-step", "*/20 * * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T00:20+00:00", "2024-01-01T00:40+00:00", "2024-01-01T01:00+00:00"),
    case("start-step", "5/20 * * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T00:05+00:00", "2024-01-01T00:25+00:00", "2024-01-01T00:45+00:00",
         "2024-01-01T01:05+00:00"),
    case("range-step", "10-50/20 * * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T00:10+00:00", "2024-01-01T00:30+00:00", "2024-01-01T00:50+00:00",
         "2024-01-01T01:10+00:00"),
    case("uneven-hour-step", "0 */7 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T07:00+00:00", "2024-01-01T14:00+00:00", "2024-01-01T21:00+00:00",
         "2024-01-02T00:00+00:00"),
    case("day-step", "0 0 */10 * *", "2024-01-01T00:00+00:00",
         "2024-01-11T00:00+00:00", "2024-01-21T00:00+00:00", "2024-01-31T00:00+00:00",
         "2024-02-01T00:00+00:00"),
    case("month-step", "0 0 1 */4 *", "2024-01-01T00:00+00:00",
         "2024-05-01T00:00+00:00", "2024-09-01T00:00+00:00", "2025-01-01T00:00+00:00"),
    # --- Lists and names ------------------------------------------------------------------------------
    case("lists", "0,30 9,17 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T09:00+00:00", "2024-01-01T09:30+00:00", "2024-01-01T17:00+00:00",
         "2024-01-01T17:30+00:00"),
    case("day-list", "0 0 1,15 * *", "2024-01-01T00:00+00:00",
         "2024-01-15T00:00+00:00", "2024-02-01T00:00+00:00", "2024-02-15T00:00+00:00"),
    case("weekday-names-any-case", "0 0 * * MON,wed,Fri", "2024-01-01T00:00+00:00",
         "2024-01-03T00:00+00:00", "2024-01-05T00:00+00:00", "2024-01-08T00:00+00:00"),
    case("month-name-range", "0 0 1 FEB-APR *", "2024-01-01T00:00+00:00",
         "2024-02-01T00:00+00:00", "2024-03-01T00:00+00:00", "2024-04-01T00:00+00:00",
         "2025-02-01T00:00+00:00"),
    case("months-and-a-weekday", "0 12 * jan,jul mon", "2024-01-20T00:00+00:00",
         "2024-01-22T12:00+00:00", "2024-01-29T12:00+00:00", "2024-07-01T12:00+00:00"),
    # --- Day of month OR day of week, when both are restricted ----------------------------------------
    case("the-13th-or-a-friday", "0 0 13 * 5", "2024-09-01T00:00+00:00",
         "2024-09-06T00:00+00:00", "2024-09-13T00:00+00:00", "2024-09-20T00:00+00:00",
         "2024-09-27T00:00+00:00",
         "2024-10-04T00:00+00:00", "2024-10-11T00:00+00:00", "2024-10-13T00:00+00:00"),
    case("a-day-november-lacks-or-saturday", "0 0 31 11 sat", "2024-01-01T00:00+00:00",
         "2024-11-02T00:00+00:00", "2024-11-09T00:00+00:00"),
    case("a-leap-day-or-weekday", "45 23 23,29 * 3-5", "2032-02-26T00:00+00:00",
         "2032-02-26T23:45+00:00", "2032-02-27T23:45+00:00", "2032-02-29T23:45+00:00",
         "2032-03-03T23:45+00:00"),
    case("last-day-or-friday", "0 0 L * 5", "2024-12-25T00:00+00:00",
         "2024-12-27T00:00+00:00", "2024-12-31T00:00+00:00", "2025-01-03T00:00+00:00"),
    case("a-stepped-star-is-restricted", "0 0 */10 * 1", "2024-01-01T00:00+00:00",
         "2024-01-08T00:00+00:00", "2024-01-11T00:00+00:00", "2024-01-15T00:00+00:00",
         "2024-01-21T00:00+00:00",
         "2024-01-22T00:00+00:00"),
    case("question-mark-is-unrestricted", "0 0 1 * ?", "2024-01-01T00:00+00:00",
         "2024-02-01T00:00+00:00", "2024-03-01T00:00+00:00"),
    # croniter and croner: a day field stepped by one names every day, and restricts it.
    case("a-star-stepped-by-one-is-restricted-too", "0 0 */1 * 1", "2024-01-01T00:00+00:00",
         "2024-01-02T00:00+00:00", "2024-01-03T00:00+00:00", "2024-01-04T00:00+00:00"),
    # --- L: the last day, and the last such weekday, of the month ------------------------------------
    case("last-day", "0 0 L * *", "2024-01-01T00:00+00:00",
         "2024-01-31T00:00+00:00", "2024-02-29T00:00+00:00", "2024-03-31T00:00+00:00",
         "2024-04-30T00:00+00:00"),
    case("last-day-of-february", "0 0 L 2 *", "2023-01-01T00:00+00:00",
         "2023-02-28T00:00+00:00", "2024-02-29T00:00+00:00", "2025-02-28T00:00+00:00"),
    case("first-and-last-day", "0 0 1,L * *", "2024-01-15T00:00+00:00",
         "2024-01-31T00:00+00:00", "2024-02-01T00:00+00:00", "2024-02-29T00:00+00:00"),
    case("last-friday", "0 18 * * 5L", "2024-01-01T00:00+00:00",
         "2024-01-26T18:00+00:00", "2024-02-23T18:00+00:00", "2024-03-29T18:00+00:00"),
    case("last-sunday-by-name", "0 1 * * SUNL", "2024-03-01T00:00+00:00",
         "2024-03-31T01:00+00:00", "2024-04-28T01:00+00:00"),
    # --- W: the weekday nearest a day, within its month -----------------------------------------------
    case("nearest-weekday-to-a-saturday", "0 9 15W 6 *", "2024-01-01T00:00+00:00",
         "2024-06-14T09:00+00:00", "2025-06-16T09:00+00:00"),  # the 15th: Sat 2024, Sun 2025
    case("nearest-weekday-to-a-sunday", "0 9 15W 9 *", "2024-01-01T00:00+00:00",
         "2024-09-16T09:00+00:00", "2025-09-15T09:00+00:00"),  # Sun 2024, Mon 2025
    case("nearest-weekday-stays-in-its-month", "0 9 1W 6 *", "2024-01-01T00:00+00:00",
         "2024-06-03T09:00+00:00", "2025-06-02T09:00+00:00"),  # June 1st: Sat 2024, Sun 2025
    # --- #: the n-th such weekday of the month --------------------------------------------------------
    case("second-monday", "0 10 * * 1#2", "2024-01-01T00:00+00:00",
         "2024-01-08T10:00+00:00", "2024-02-12T10:00+00:00", "2024-03-11T10:00+00:00"),
    case("fifth-friday-skips-months-without-one", "0 10 * * 5#5", "2024-01-01T00:00+00:00",
         "2024-03-29T10:00+00:00", "2024-05-31T10:00+00:00", "2024-08-30T10:00+00:00"),
    case("first-sunday-by-name", "0 0 * * sun#1", "2024-01-01T00:00+00:00",
         "2024-01-07T00:00+00:00", "2024-02-04T00:00+00:00"),
    case("nth-and-last-together", "0 0 * * 1#1,5L", "2023-12-31T00:00+00:00",
         "2024-01-01T00:00+00:00", "2024-01-26T00:00+00:00", "2024-02-05T00:00+00:00"),
    # --- Ranges that wrap around the end of their field (croniter; Quartz's documentation: 22-2) ------
    case("hours-across-midnight", "0 22-2 * * *", "2024-01-01T12:00+00:00",
         "2024-01-01T22:00+00:00", "2024-01-01T23:00+00:00", "2024-01-02T00:00+00:00",
         "2024-01-02T01:00+00:00", "2024-01-02T02:00+00:00", "2024-01-02T22:00+00:00"),
    case("saturday-to-monday", "0 0 * * 6-1", "2024-01-01T00:00+00:00",  # a Monday
         "2024-01-06T00:00+00:00", "2024-01-07T00:00+00:00", "2024-01-08T00:00+00:00",
         "2024-01-13T00:00+00:00"),
    case("saturday-to-sunday-by-name", "0 0 * * Sat-Sun", "2024-01-01T00:00+00:00",  # croniter's test
         "2024-01-06T00:00+00:00", "2024-01-07T00:00+00:00", "2024-01-13T00:00+00:00",
         "2024-01-14T00:00+00:00"),
    case("november-to-february", "0 0 1 nov-feb *", "2024-01-15T00:00+00:00",
         "2024-02-01T00:00+00:00", "2024-11-01T00:00+00:00", "2024-12-01T00:00+00:00",
         "2025-01-01T00:00+00:00"),
    case("days-across-the-month-end", "0 0 30-2 * *", "2024-01-15T00:00+00:00",
         "2024-01-30T00:00+00:00", "2024-01-31T00:00+00:00", "2024-02-01T00:00+00:00",
         "2024-02-02T00:00+00:00", "2024-03-01T00:00+00:00"),
    case("a-step-across-the-week-end", "0 0 * * Thu-Tue/3", "2024-01-01T00:00+00:00",  # croniter's test
         "2024-01-04T00:00+00:00", "2024-01-07T00:00+00:00", "2024-01-11T00:00+00:00",
         "2024-01-14T00:00+00:00"),
    case("a-step-across-the-hour-end", "50-10/5 * * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T00:05+00:00", "2024-01-01T00:10+00:00", "2024-01-01T00:50+00:00",
         "2024-01-01T00:55+00:00", "2024-01-01T01:00+00:00"),
    # --- Ranges that end in L (croniter's tests) --------------------------------------------------------
    case("from-the-29th-to-the-last-day", "0 0 29-L * *", "2015-09-04T00:00+00:00",
         "2015-09-29T00:00+00:00", "2015-09-30T00:00+00:00", "2015-10-29T00:00+00:00"),
    case("every-eighth-day-to-the-last", "35 * 1-L/8 * *", "2020-01-10T00:00+00:00",
         "2020-01-17T00:35+00:00", "2020-01-17T01:35+00:00"),
    case("every-eighth-day-into-the-next-month", "35 * 1-L/8 * *", "2020-01-26T00:00+00:00",
         "2020-02-01T00:35+00:00"),
    # --- The last such weekday of the month: L5 (croniter), 5L and FRI#L (Quartz, croner) -------------
    case("last-friday-written-L5", "0 0 * * L5", "1987-01-15T00:00+00:00",  # croniter's test
         "1987-01-30T00:00+00:00", "1987-02-27T00:00+00:00", "1987-03-27T00:00+00:00",
         "1987-04-24T00:00+00:00"),
    case("last-friday-written-5L", "0 0 * * 5L", "2023-12-01T00:00+00:00",  # croner's test
         "2023-12-29T00:00+00:00", "2024-01-26T00:00+00:00", "2024-02-23T00:00+00:00"),
    case("last-friday-of-february-written-FRI#L", "0 0 0 * 2 FRI#L", "2023-12-30T00:00+00:00",
         "2024-02-23T00:00+00:00", seconds="first"),  # croner's test
    case("last-thursday-of-a-leap-february", "0 0 0 * 2 THU#L", "2023-12-30T00:00+00:00",
         "2024-02-29T00:00+00:00", seconds="first"),  # croner's test
    case("last-thursday-and-friday", "0 0 0 * 2 THU-FRI#L", "2023-12-30T00:00+00:00",
         "2024-02-23T00:00+00:00", "2024-02-29T00:00+00:00", seconds="first"),  # croner's test
    case("last-weekend-and-first-sunday", "0 0 0 * * SAT-SUN#L,SUN#1", "2023-08-09T00:00+00:00",
         "2023-08-26T00:00+00:00", "2023-08-27T00:00+00:00", "2023-09-03T00:00+00:00",
         "2023-09-24T00:00+00:00", "2023-09-30T00:00+00:00", seconds="first"),  # croner's test
    case("last-monday-and-last-friday", "0 0 * * MONL,FRIL", "2025-01-01T00:00+00:00",
         "2025-01-27T00:00+00:00", "2025-01-31T00:00+00:00"),  # croner's test
    case("last-sunday-written-L7", "0 0 * * L7", "2024-01-01T00:00+00:00",
         "2024-01-28T00:00+00:00", "2024-02-25T00:00+00:00"),
    # --- # on a range of days (croniter; croner) --------------------------------------------------------
    case("first-monday-to-friday-of-january", "30 23 * JAN MON-FRI#1", "2018-01-01T00:00+00:00",
         "2018-01-01T23:30+00:00", "2018-01-02T23:30+00:00", "2018-01-03T23:30+00:00",
         "2018-01-04T23:30+00:00", "2018-01-05T23:30+00:00", "2019-01-01T23:30+00:00",
         "2019-01-02T23:30+00:00", "2019-01-03T23:30+00:00", "2019-01-04T23:30+00:00",
         "2019-01-07T23:30+00:00"),  # croniter's test (there with 1-7 in the day of month)
    case("first-weekday-numbers-1-5", "0 0 * * 1-5#1", "2024-01-31T00:00+00:00",
         "2024-02-01T00:00+00:00", "2024-02-02T00:00+00:00", "2024-02-05T00:00+00:00",
         "2024-02-06T00:00+00:00", "2024-02-07T00:00+00:00", "2024-03-01T00:00+00:00"),
    # --- W before the day (croniter), and on days 29-31: within the month (croniter's tests) -----------
    case("nearest-weekday-written-W15", "0 9 W15 * *", "2024-01-01T00:00+00:00",
         "2024-01-15T09:00+00:00", "2024-02-15T09:00+00:00"),
    case("nearest-weekday-to-a-saturday-30th", "0 9 30W * *", "2024-11-01T00:00+00:00",
         "2024-11-29T09:00+00:00"),
    case("nearest-weekday-to-the-31st-of-a-30-day-month", "0 9 31W * *", "2024-11-01T00:00+00:00",
         "2024-11-29T09:00+00:00", "2024-12-31T09:00+00:00"),
    case("nearest-weekday-to-a-monday-31st", "0 9 31W * *", "2025-03-01T00:00+00:00",
         "2025-03-31T09:00+00:00"),
    case("nearest-weekdays-listed", "0 0 1W,15W 1 *", "2024-12-31T00:00+00:00",  # croner's test
         "2025-01-01T00:00+00:00", "2025-01-15T00:00+00:00"),
    case("a-nearest-weekday-and-a-day", "0 15 10 2W,16 * ? 2010", "2010-10-01T00:00+00:00",  # Quartz's test
         "2010-10-01T10:15+00:00", "2010-10-16T10:15+00:00", "2010-11-02T10:15+00:00",
         "2010-11-16T10:15+00:00", seconds="first"),
    case("last-weekday-and-the-day-before-the-last", "0 15 10 L-1W,L-1 * ? 2010", "2010-10-01T00:00+00:00",
         "2010-10-29T10:15+00:00", "2010-10-30T10:15+00:00", seconds="first"),  # Quartz's test
    case("nearest-weekday-to-the-29th-of-february", "0 9 29W 2 *", "2025-01-01T00:00+00:00",
         "2025-02-28T09:00+00:00", "2026-02-27T09:00+00:00"),  # the 28th: a Friday, a Saturday
    # --- LW, L-n, L-nW: the last weekday, days before the last (Quartz; LW also croner) ---------------
    case("last-weekday", "0 0 LW * *", "2025-01-01T00:00+00:00",  # croner's test
         "2025-01-31T00:00+00:00", "2025-02-28T00:00+00:00", "2025-03-31T00:00+00:00",
         "2025-04-30T00:00+00:00", "2025-05-30T00:00+00:00", "2025-06-30T00:00+00:00",
         "2025-07-31T00:00+00:00", "2025-08-29T00:00+00:00", "2025-09-30T00:00+00:00",
         "2025-10-31T00:00+00:00", "2025-11-28T00:00+00:00", "2025-12-31T00:00+00:00"),
    case("last-weekday-of-february", "0 0 LW 2 *", "2024-02-01T00:00+00:00",  # croner's test
         "2024-02-29T00:00+00:00", "2025-02-28T00:00+00:00"),
    case("two-days-before-the-last", "0 15 10 L-2 * ? 2010", "2010-06-01T00:00+00:00",  # Quartz's test
         "2010-06-28T10:15+00:00", "2010-07-29T10:15+00:00", "2010-08-29T10:15+00:00",
         "2010-09-28T10:15+00:00", "2010-10-29T10:15+00:00", seconds="first"),
    case("three-days-before-the-last-of-february", "0 15 10 L-3 2 ?", "2000-01-01T00:00+00:00",
         "2000-02-26T10:15+00:00", "2001-02-25T10:15+00:00", seconds="first"),  # Quartz's test
    case("weekday-nearest-five-days-before-the-last", "0 15 10 L-5W * ? 2010", "2010-09-01T00:00+00:00",
         "2010-09-24T10:15+00:00", "2010-10-26T10:15+00:00", seconds="first"),  # Quartz's test
    case("weekday-nearest-the-day-before-the-last", "0 15 10 L-1W * ? 2010", "2010-10-01T00:00+00:00",
         "2010-10-29T10:15+00:00", seconds="first"),  # Quartz's test
    case("two-days-before-the-last-every-month", "0 0 L-2 * *", "2024-01-01T00:00+00:00",  # the docs' example
         "2024-01-29T00:00+00:00", "2024-02-27T00:00+00:00", "2024-03-29T00:00+00:00",
         "2024-04-28T00:00+00:00"),
    case("thirty-days-before-the-last-skips-short-months", "0 0 L-30 * *", "2024-01-01T00:00+00:00",
         "2024-03-01T00:00+00:00", "2024-05-01T00:00+00:00", "2024-07-01T00:00+00:00"),
    case("the-first-and-three-days-before-the-last", "0 0 1,L-3 * *", "2024-01-15T00:00+00:00",
         "2024-01-28T00:00+00:00", "2024-02-01T00:00+00:00", "2024-02-26T00:00+00:00"),
    case("three-days-before-the-last-or-a-monday", "0 0 L-3 * 1", "2024-01-20T00:00+00:00",
         "2024-01-22T00:00+00:00", "2024-01-28T00:00+00:00", "2024-01-29T00:00+00:00"),
    # --- Seconds, where the spec says they are --------------------------------------------------------
    case("noon-with-seconds-first", "0 0 12 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T12:00+00:00", "2024-01-02T12:00+00:00", seconds="first"),
    case("six-fields-seconds-last", "0 0 12 * * *", "2024-01-01T00:00+00:00",
         "2024-01-12T00:00+00:00", "2024-01-12T00:00:01+00:00", seconds="last"),
    case("half-a-minute-past-noon", "30 0 12 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T12:00:30+00:00", "2024-01-02T12:00:30+00:00", seconds="first"),
    case("every-fifteen-seconds", "*/15 * * * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T00:00:15+00:00", "2024-01-01T00:00:30+00:00",
         "2024-01-01T00:00:45+00:00", seconds="first"),
    case("seconds-last", "0 12 * * * 30", "2024-01-01T00:00+00:00",
         "2024-01-01T12:00:30+00:00", seconds="last"),
    case("seven-fields-seconds-last", "0 12 1 1 * 30 2030", "2024-01-01T00:00+00:00",
         "2030-01-01T12:00:30+00:00", END, seconds="last"),  # croniter's order
    # --- Years: any year 1970-2099, judged from the schedule itself ----------------------------------
    case("one-new-year", "0 0 0 1 1 * 2030", "2024-01-01T00:00+00:00",
         "2030-01-01T00:00+00:00", END, seconds="first"),
    case("a-year-far-ahead", "0 0 0 11 * * 2060", "2024-01-01T00:00+00:00",
         "2060-01-11T00:00+00:00", "2060-02-11T00:00+00:00", seconds="first"),
    case("sixty-years-apart", "0 0 0 1 1 * 2030,2090", "2024-01-01T00:00+00:00",
         "2030-01-01T00:00+00:00", "2090-01-01T00:00+00:00", END, seconds="first"),
    case("leap-days-in-a-span", "0 0 12 29 2 * 2024-2032", "2024-01-01T00:00+00:00",
         "2024-02-29T12:00+00:00", "2028-02-29T12:00+00:00", "2032-02-29T12:00+00:00", END, seconds="first"),
    case("the-last-year-of-a-span", "0 0 0 1 1 * 2000-2025", "2024-06-01T00:00+00:00",
         "2025-01-01T00:00+00:00", END, seconds="first"),
    case("year-step", "0 0 0 1 1 * 2024/25", "2024-01-01T00:00+00:00",
         "2049-01-01T00:00+00:00", "2074-01-01T00:00+00:00", "2099-01-01T00:00+00:00", END, seconds="first"),
    case("the-last-year", "0 0 0 31 12 * 2099", "2024-01-01T00:00+00:00",
         "2099-12-31T00:00+00:00", END, seconds="first"),
    # --- Aliases --------------------------------------------------------------------------------------
    case("daily", "@daily", "2024-01-01T00:00+00:00", "2024-01-02T00:00+00:00"),
    case("hourly", "@hourly", "2024-01-01T00:30+00:00", "2024-01-01T01:00+00:00"),
    case("weekly-on-sunday", "@weekly", "2024-01-01T00:00+00:00", "2024-01-07T00:00+00:00"),
    case("monthly", "@monthly", "2024-01-01T00:00+00:00", "2024-02-01T00:00+00:00"),
    case("yearly", "@yearly", "2024-01-01T00:00+00:00", "2025-01-01T00:00+00:00"),
    # --- Time zones: local wall-clock time ------------------------------------------------------------
    case("tokyo", "0 9 * * *", "2023-12-31T12:00+00:00",
         "2024-01-01T09:00+09:00", "2024-01-02T09:00+09:00", timezone="Asia/Tokyo"),
    case("los-angeles-winter", "0 9 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T09:00-08:00", timezone="America/Los_Angeles"),
    case("kolkata-half-hour-offset", "30 9 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T09:30+05:30", timezone="Asia/Kolkata"),
    case("kathmandu-quarter-hour-offset", "45 9 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T09:45+05:45", timezone="Asia/Kathmandu"),
    case("kiritimati-a-day-ahead", "0 0 * * *", "2024-01-01T00:00+00:00",
         "2024-01-02T00:00+14:00", timezone="Pacific/Kiritimati"),
    case("sydney-summer", "0 12 * * *", "2024-01-01T00:00+00:00",
         "2024-01-01T12:00+11:00", timezone="Australia/Sydney"),
    case("new-year-in-a-zone", "0 0 0 1 1 * 2030", "2029-12-31T00:00+00:00",
         "2030-01-01T00:00+09:00", END, seconds="first", timezone="Asia/Tokyo"),
    # --- Spring forward: a local time that never happens ---------------------------------------------
    case("berlin-gap-shifts", "30 2 * * *", "2024-03-30T12:00+00:00",
         "2024-03-31T03:00+02:00", "2024-04-01T02:30+02:00", timezone="Europe/Berlin"),
    case("berlin-gap-skip", "30 2 * * *", "2024-03-30T12:00+00:00",
         "2024-04-01T02:30+02:00", timezone="Europe/Berlin", dst_gap="skip"),
    case("new-york-gap-shifts", "30 2 * * *", "2024-03-09T12:00+00:00",
         "2024-03-10T03:00-04:00", "2024-03-11T02:30-04:00", timezone="America/New_York"),
    case("london-gap-shifts", "30 1 * * *", "2024-03-30T12:00+00:00",
         "2024-03-31T02:00+01:00", "2024-04-01T01:30+01:00", timezone="Europe/London"),
    case("sydney-gap-shifts", "15 2 * * *", "2024-10-05T00:00+00:00",
         "2024-10-06T03:00+11:00", "2024-10-07T02:15+11:00", timezone="Australia/Sydney"),
    case("lord-howe-half-hour-gap", "0,15 2 * * *", "2024-10-05T00:00+00:00",
         "2024-10-06T02:30+11:00", "2024-10-07T02:00+11:00", timezone="Australia/Lord_Howe"),
    case("santiago-midnight-gap", "0 0 * * *", "2024-09-07T12:00+00:00",
         "2024-09-08T01:00-03:00", "2024-09-09T00:00-03:00", timezone="America/Santiago"),
    case("santiago-midnight-gap-skip", "0 0 * * *", "2024-09-07T12:00+00:00",
         "2024-09-09T00:00-03:00", timezone="America/Santiago", dst_gap="skip"),
    case("half-hourly-across-the-gap", "*/30 * * * *", "2024-03-31T01:00+01:00",
         "2024-03-31T01:30+01:00", "2024-03-31T03:00+02:00",
         "2024-03-31T03:30+02:00", timezone="Europe/Berlin"),
    case("half-hourly-across-the-gap-skip", "*/30 * * * *", "2024-03-31T01:00+01:00",
         "2024-03-31T01:30+01:00", "2024-03-31T03:00+02:00", "2024-03-31T03:30+02:00",
         timezone="Europe/Berlin", dst_gap="skip"),
    case("every-last-sunday-of-march-is-in-the-gap-from-1981", "30 2 * 3 0L", "1979-01-01T00:00+01:00",
         "1979-03-25T02:30+01:00", "1980-03-30T02:30+01:00", END, timezone="Europe/Berlin", dst_gap="skip"),
    # --- Fall back: a local time that happens twice ---------------------------------------------------
    case("berlin-fold-first", "30 2 * * *", "2024-10-26T12:00+00:00",
         "2024-10-27T02:30+02:00", "2024-10-28T02:30+01:00", timezone="Europe/Berlin"),
    case("berlin-fold-both", "30 2 * * *", "2024-10-26T12:00+00:00",
         "2024-10-27T02:30+02:00", "2024-10-27T02:30+01:00", "2024-10-28T02:30+01:00",
         timezone="Europe/Berlin", dst_fold="both"),
    case("new-york-fold-first", "30 1 * * *", "2024-11-02T12:00+00:00",
         "2024-11-03T01:30-04:00", "2024-11-04T01:30-05:00", timezone="America/New_York"),
    case("new-york-fold-both", "30 1 * * *", "2024-11-02T12:00+00:00",
         "2024-11-03T01:30-04:00", "2024-11-03T01:30-05:00", timezone="America/New_York", dst_fold="both"),
    case("sydney-fold-both", "30 2 * * *", "2024-04-06T00:00+00:00",
         "2024-04-07T02:30+11:00", "2024-04-07T02:30+10:00", timezone="Australia/Sydney", dst_fold="both"),
    case("lord-howe-half-hour-fold", "45 1 * * *", "2024-04-06T00:00+00:00",
         "2024-04-07T01:45+11:00", "2024-04-08T01:45+10:30", timezone="Australia/Lord_Howe"),
    case("dublin-winter-fold-both", "30 1 * * *", "2024-10-26T12:00+00:00",
         "2024-10-27T01:30+01:00", "2024-10-27T01:30+00:00", timezone="Europe/Dublin", dst_fold="both"),
    case("santiago-fold-first", "30 23 * * *", "2024-04-06T12:00+00:00",
         "2024-04-06T23:30-03:00", "2024-04-07T23:30-04:00", timezone="America/Santiago"),
    # The example the schedules documentation gives for the fall-back day (default fold policy, then "both").
    case("half-hourly-on-the-fall-back-day", "*/30 * * * *", "2024-10-27T01:00+02:00",
         "2024-10-27T01:30+02:00", "2024-10-27T02:00+02:00", "2024-10-27T02:30+02:00",
         "2024-10-27T03:00+01:00", "2024-10-27T03:30+01:00", timezone="Europe/Berlin"),
    case("half-hourly-on-the-fall-back-day-both", "*/30 * * * *", "2024-10-27T01:00+02:00",
         "2024-10-27T01:30+02:00", "2024-10-27T02:00+02:00", "2024-10-27T02:30+02:00",
         "2024-10-27T02:00+01:00", "2024-10-27T02:30+01:00", "2024-10-27T03:00+01:00",
         timezone="Europe/Berlin", dst_fold="both"),
]  # fmt: skip


@pytest.mark.parametrize("row", CASES)
def test_cron_case(row: Case) -> None:
    spec = ScheduleSpec(schedule_id=row.id, cron=row.cron, **row.options)
    assert following(spec, ms(row.after), len(row.expect)) == [
        value if value == END else iso(ms(value), spec.timezone) for value in row.expect
    ]
    # What a recurring timer stores reads back as the same schedule.
    assert spec_from_mapping(spec.to_mapping()) == spec


PREVIOUS = [
    # cron, spec options, before, the last occurrence before it (None: there is none)
    ("45 23 23,29 * 3-5", {}, "2032-03-03T00:00+00:00", "2032-02-29T23:45+00:00"),
    ("0 59 3 24 * wed 1997", {"seconds": "first"}, "1997-01-20T00:00+00:00", "1997-01-15T03:59+00:00"),
    ("0 0 L * *", {}, "2024-03-01T00:00+00:00", "2024-02-29T00:00+00:00"),
    ("0 9 15W 6 *", {}, "2024-07-01T00:00+00:00", "2024-06-14T09:00+00:00"),
    ("0 10 * * 5#5", {}, "2024-05-01T00:00+00:00", "2024-03-29T10:00+00:00"),
    ("0 0 * * 5L", {}, "2024-03-01T12:00+00:00", "2024-02-23T00:00+00:00"),  # croner's test
    ("0 0 LW * *", {}, "2025-09-01T00:00+00:00", "2025-08-29T00:00+00:00"),
    ("0 0 L-3 * *", {}, "2024-03-01T00:00+00:00", "2024-02-26T00:00+00:00"),
    ("0 0 L-3W * *", {}, "2024-05-01T00:00+00:00", "2024-04-26T00:00+00:00"),  # the 27th: a Saturday
    ("0 9 31W * *", {}, "2024-12-01T00:00+00:00", "2024-11-29T09:00+00:00"),
    ("0 22-2 * * *", {}, "2024-01-02T12:00+00:00", "2024-01-02T02:00+00:00"),
    ("0 0 0 1 1 * 2030,2090", {"seconds": "first"}, "2099-01-01T00:00+00:00", "2090-01-01T00:00+00:00"),
    ("0 0 0 1 1 * 2030", {"seconds": "first"}, "2029-06-01T00:00+00:00", None),
    ("30 2 * * *", {"timezone": "Europe/Berlin"}, "2024-10-27T02:45+01:00", "2024-10-27T02:30+02:00"),
    ("30 2 * * *", {"timezone": "Europe/Berlin", "dst_fold": "both"}, "2024-10-27T02:45+01:00",
     "2024-10-27T02:30+01:00"),
]  # fmt: skip


@pytest.mark.parametrize(("cron", "options", "before", "expected"), PREVIOUS)
def test_previous_occurrence(cron: str, options: dict[str, Any], before: str, expected: str | None) -> None:
    # A late firing looks back for the latest due occurrence, so the backward search matters as much.
    spec = ScheduleSpec(schedule_id="p", cron=cron, **options)
    found = previous_occurrence(spec, ms(before))
    assert (None if found is None else iso(found, spec.timezone)) == (
        None if expected is None else iso(ms(expected), spec.timezone)
    )


# --- What is refused, and what the refusal says -------------------------------------------------------

REFUSED = [
    # cron, spec options, what the message must say
    ("0 0 12 * * *", {}, r'ScheduleSpec\.seconds: "first" reads "second minute hour'),
    ("0 0 12 * * *", {}, r'"last" reads "minute hour day-of-month month day-of-week second \[year\]"'),
    ("0 0 0 1 1 * 2030", {}, r"7 fields include seconds"),
    ("0 12 * * *", {"seconds": "first"}, r"five fields .* have no seconds"),
    ("@daily", {"seconds": "first"}, r"@daily has no seconds field"),
    ("0 0 12 * * *", {"seconds": "middle"}, r"ScheduleSpec\.seconds: must be one of first, last"),
    ("* * * *", {}, r"4 fields; give five"),
    ("0 0 * * * * * *", {}, r"8 fields"),
    ("@reboot", {}, r"unknown alias '@reboot'"),
    ("*/0 * * * *", {}, r"step of 0"),
    ("61 * * * *", {}, r"minute field '61': 61 is outside 0-59"),
    ("0 24 * * *", {}, r"hour field '24': 24 is outside 0-23"),
    ("0 0 0 * *", {}, r"day-of-month field '0': 0 is outside 1-31"),
    ("0 0 * 13 *", {}, r"month field '13'"),
    ("0 0 * * 8", {}, r"day-of-week field '8': 8 is outside 0-7"),
    ("0 0 * foo *", {}, r"'foo' is not a number or a month name"),
    ("0 0 * * mon-funday", {}, r"'funday' is not a number or a day-of-week name"),
    ("0 0 1,,2 * *", {}, r"an empty list item"),
    ("0 0 30 2 *", {}, r"never occurs: no month it names has day 30"),
    ("0 0 31 4,6,9,11 *", {}, r"never occurs"),
    ("0 0 L-29 2 *", {}, r"never occurs: no month it names has a day L-29"),
    ("0 0 L-29W 2 *", {}, r"never occurs: no month it names has a day L-29"),
    ("0 0 0 29 2 * 2025-2027", {"seconds": "first"}, r"never occurs"),
    ("0 0 0 1 1 * 2100", {"seconds": "first"}, r"year field '2100': 2100 is outside 1970-2099"),
    ("0 0 0 1 1 * 1969", {"seconds": "first"}, r"1969 is outside 1970-2099"),
    ("0 30 2 31 3 * 2024", {"seconds": "first", "timezone": "Europe/Berlin", "dst_gap": "skip"},
     r"never occurs \(in time zone Europe/Berlin, with dst_gap skip\)"),
    # Where croniter reads an item otherwise than cron, Quartz and croner: both readings, and what to write.
    ("0 9-9 * * *", {}, r"croniter reads '9-9' as every hour value, cron, Quartz and croner as 9 alone; "
     r"write 9 \(or \* for every value\)"),
    ("5-5 * * * *", {}, r"croniter reads '5-5' as every minute value.* write 5"),
    ("0 0 * * Sun-Sun", {}, r"croniter reads 'sun-sun' as every day-of-week value.* write SUN"),
    ("0 0 * * 7-0", {}, r"croniter reads '7-0' as every day-of-week value.* write SUN"),
    ("0 0 1 jan-jan *", {}, r"croniter reads 'jan-jan' as every month value.* write 1"),
    ("50-10/15 * * * *", {}, r"croniter reads '50-10/15' as 6,50, other cron tools as 5,50; write the "
     r"values you mean as a list"),
    ("0 0 * * Thu-Tue/2", {}, r"croniter reads 'thu-tue/2' as TUE,THU,SAT, other cron tools as MON,THU,SAT"),
    ("0 0 * * 7/2", {}, r"croniter reads '7/2' as SUN,TUE,THU,SAT, other cron tools as SUN"),
    ("0 0 0 1 1 * 2098-1971", {"seconds": "first"},
     r"ranges of years do not wrap around .*write 1971-2098, or 2098-2099,1970-1971"),
    # Where croniter and croner combine the two day fields differently.
    ("0 0 *,15 * mon", {}, r"day-of-month field '\*,15' names every day but is not a plain '\*': croniter then "
     r"lets the day-of-week alone decide, croner fires on every day; write '\*' for the day-of-month"),
    ("0 0 1-31 * */2", {}, r"day-of-month field '1-31' names every day but is not a plain '\*'"),
    ("0 0 */2 * 0-6", {}, r"day-of-week field '0-6' names every day but is not a plain '\*'"),
    ("0 0 L,2-L * *", {}, r"croniter counts 31 values \(L among them\) and reads it as every day"),
    ("0 0 15W * 1", {}, r"15W in day-of-month needs '\*' or '\?' in day-of-week"),
    ("0 0 31W 2 0", {}, r"31W in day-of-month needs '\*' or '\?' in day-of-week"),  # croniter's test
    ("0 0 LW * fri", {}, r"LW in day-of-month needs '\*' or '\?' in day-of-week"),
    ("0 0 1 * 5#2", {}, r"5#2 in day-of-week needs '\*' or '\?' in day-of-month"),
    ("30 23 1-7 JAN MON-FRI#1", {}, r"MON-FRI#1 in day-of-week needs '\*' or '\?' in day-of-month: with both, "
     r"croniter fires where both match and croner where either does"),  # croniter's test: both
    ("0 0 * * 1,5#2", {}, r"plain days of the week cannot be listed with #n or L days"),
    ("0 0 * * *,FRI#L", {}, r"plain days of the week cannot be listed with #n or L days"),
    # Spellings cron tools read differently.
    ("0 0 * * L", {}, r"'L' alone is Saturday to Quartz and not a day to croniter and croner; write SAT"),
    ("0 0 12 * * 1-5", {"seconds": "first"}, r"with the seconds first, a numbered day of the week means one day "
     r"to Quartz \(1 is Sunday\) and another to croner, Spring and cron \(1 is Monday\); write day names"),
    ("0 15 10 ? * 6L", {"seconds": "first"}, r"'6l': with the seconds first, a numbered day of the week"),
    ("0 0 0 * * 7", {"seconds": "first"}, r"numbered day of the week"),
    ("0 ? * * *", {}, r"hour field '\?': '\?' is only for day-of-month and day-of-week; write \*"),
    ("0 0 ?,1 * *", {}, r"'\?' stands alone"),
    ("H 2 * * *", {}, r"random or hashed field; .* write a fixed value"),
    ("R * * * *", {}, r"random or hashed field"),
    # What no cron tool reads this way.
    ("0 0 32W * *", {}, r"W takes a day from 1 to 31"),
    ("0 0 1-15W * *", {}, r"'1-15w' is not a day-of-month form .* W takes one day, not a range"),
    ("0 0 L-31 * *", {}, r"an offset from the last day is 0 to 30"),
    ("0 0 L/2 * *", {}, r"'l/2' is not a day-of-month form"),
    ("0 0 * * 5#6", {}, r"the n in day#n is 1 to 5 \(or L for the last\)"),
    ("0 0 * * */2#1", {}, r"#n and L follow one day or a range of days"),
    ("0 0 * * L8", {}, r"8 is outside 0-7"),
]  # fmt: skip


@pytest.mark.parametrize(("cron", "options", "says"), REFUSED)
def test_a_refused_expression_says_why(cron: str, options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest, match=r"^ScheduleSpec\.(cron|seconds)") as refused:
        ScheduleSpec(schedule_id="s", cron=cron, **options)
    assert re.search(says, str(refused.value)), str(refused.value)


def test_the_gap_only_refuses_with_the_skip_policy() -> None:
    # The same single occurrence, in the gap, shifts to the first instant after it by default.
    spec = ScheduleSpec(
        schedule_id="once", cron="0 30 2 31 3 * 2024", seconds="first", timezone="Europe/Berlin"
    )
    assert following(spec, ms("2024-01-01T00:00+00:00"), 2) == ["2024-03-31T03:00:00+02:00", END]


def test_the_seconds_position_is_stored_with_the_spec() -> None:
    spec = ScheduleSpec(schedule_id="noon", cron="0 0 12 * * *", seconds="first")
    assert spec.to_mapping()["seconds"] == "first"
    assert "seconds" not in ScheduleSpec(schedule_id="noon", cron="0 12 * * *").to_mapping()
    with pytest.raises(InvalidRequest, match=r"ScheduleSpec\.seconds: only a cron expression"):
        ScheduleSpec(schedule_id="noon", calendar="12:00", seconds="first")


def test_year_validation_does_not_depend_on_where_a_search_would_start() -> None:
    # Every year of the range is accepted, first and last included, each found from the schedule itself.
    for year in (1970, 2000, 2030, 2060, 2099):
        spec = ScheduleSpec(schedule_id="y", cron=f"0 0 0 1 1 * {year}", seconds="first")
        assert following(spec, ms("1969-01-01T00:00+00:00"), 2) == [f"{year}-01-01T00:00:00+00:00", END]
        with pytest.raises(InvalidRequest, match="no occurrence after"):
            next_occurrence(spec, ms(f"{year}-01-01T00:00+00:00"))


def test_the_declared_croniter_range_starts_at_the_first_release_that_agrees_with_the_model() -> None:
    # croniter 6.2 misses days of some day-of-month-or-day-of-week expressions (the
    # "a-day-november-lacks-or-saturday" row), and releases before it have no W: the declared
    # lower bound must exclude them, and the installed croniter must be a declared one.
    (requirement,) = [
        r for r in importlib.metadata.requires("loom-runtime") or [] if r.startswith("croniter")
    ]
    bounds = dict(re.findall(r"(>=|<)\s*([\d.]+)", requirement))
    assert tuple(map(int, bounds[">="].split("."))) >= (7, 0)
    installed = tuple(map(int, importlib.metadata.version("croniter").split(".")[:2]))
    assert (7, 0) <= installed < tuple(map(int, bounds["<"].split(".")))


# --- Model: croniter's search against an independent reading of the parsed fields -------------------


def _nearest_weekday(year: int, month: int, day: int) -> int | None:
    """The weekday nearest ``day`` in its month; a day past the end is the last day (croniter's 31W)."""
    last = calendar.monthrange(year, month)[1]
    if day < 1:
        return None
    moment = date(year, month, min(day, last))
    if moment.weekday() == 5:  # Saturday: the Friday before, unless that is in the previous month
        return moment.day - 1 if moment.day > 1 else moment.day + 2
    if moment.weekday() == 6:  # Sunday: the Monday after, unless that is in the next month
        return moment.day + 1 if moment.day < last else moment.day - 2
    return moment.day


def _day_matches(e: CronExpression, d: date) -> bool:
    if (e.years is not None and d.year not in e.years) or d.month not in e.months:
        return False
    last = calendar.monthrange(d.year, d.month)[1]
    by_day = (
        d.day in e.days
        or (e.last_day and d.day == last)
        or any(d.day == last - n for n in e.last_day_offsets)
        or any(d.day == _nearest_weekday(d.year, d.month, n) for n in e.nearest_weekdays)
        or any(d.day == _nearest_weekday(d.year, d.month, last - n) for n in e.last_nearest_weekdays)
    )
    weekday = d.isoweekday() % 7
    by_weekday = (
        weekday in e.weekdays
        or (weekday, (d.day - 1) // 7 + 1) in e.nth_weekdays
        or (weekday in e.last_weekdays and d.day + 7 > last)
    )
    if e.days_restricted and e.weekdays_restricted:
        return by_day or by_weekday
    return (by_day or not e.days_restricted) and (by_weekday or not e.weekdays_restricted)


def model_walls(e: CronExpression, start: datetime, reverse: bool, count: int) -> list[datetime]:
    """The next ``count`` matching local times after ``start`` (before it if ``reverse``), day by day."""
    out: list[datetime] = []
    day, one_day = start.date(), timedelta(days=-1 if reverse else 1)
    times = sorted(((h, m, s) for h in e.hours for m in e.minutes for s in e.seconds), reverse=reverse)
    while len(out) < count and 1960 <= day.year <= 2200:
        if _day_matches(e, day):
            for h, m, s in times:
                moment = datetime(day.year, day.month, day.day, h, m, s)
                if (moment < start) if reverse else (moment > start):
                    out.append(moment)
                    start = moment
                    if len(out) == count:
                        break
        day += one_day
    return out


def _field_text(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    value = st.integers(low, high).map(str)
    if names:
        value = value | st.sampled_from(names)
    bounded = st.tuples(st.integers(low, high), st.integers(low, high)).map(sorted)
    either_way = st.tuples(st.integers(low, high), st.integers(low, high))  # wraps around when reversed
    item = st.one_of(
        st.just("*"),
        st.integers(1, max(1, high - low)).map(lambda n: f"*/{n}"),
        value,
        bounded.map(lambda r: f"{r[0]}-{r[1]}"),
        either_way.map(lambda r: f"{r[0]}-{r[1]}"),
        st.tuples(bounded, st.integers(1, 6)).map(lambda t: f"{t[0][0]}-{t[0][1]}/{t[1]}"),
        st.tuples(either_way, st.integers(1, 6)).map(lambda t: f"{t[0][0]}-{t[0][1]}/{t[1]}"),
        st.tuples(st.integers(low, high), st.integers(1, 20)).map(lambda t: f"{t[0]}/{t[1]}"),
    )
    return st.lists(item, min_size=1, max_size=3).map(",".join)


MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

day_of_month = st.one_of(
    st.just("*"), st.just("L"), st.just("LW"), _field_text(1, 31),
    st.integers(1, 31).map(lambda n: f"{n}W"), st.integers(1, 31).map(lambda n: f"W{n}"),
    st.integers(1, 31).map(lambda n: f"{n},L"), st.integers(1, 31).map(lambda n: f"{n}-L"),
    st.tuples(st.integers(1, 31), st.integers(1, 9)).map(lambda t: f"{t[0]}-L/{t[1]}"),
    st.integers(0, 30).map(lambda n: f"L-{n}"), st.integers(0, 30).map(lambda n: f"L-{n}W"),
    st.tuples(st.integers(1, 31), st.integers(1, 30)).map(lambda t: f"{t[0]},L-{t[1]}"),
    st.lists(
        st.one_of(st.integers(1, 31).map(lambda n: f"{n}W"), st.integers(0, 30).map(lambda n: f"L-{n}W"),
                  st.integers(1, 31).map(str), st.just("L"), st.just("LW")),
        min_size=2, max_size=3,
    ).map(",".join),
)  # fmt: skip
weekday_range = st.tuples(st.sampled_from(WEEKDAYS), st.sampled_from(WEEKDAYS)).map(
    lambda t: f"{t[0]}-{t[1]}"
)
last_weekday = st.one_of(
    st.integers(0, 7).map(lambda d: f"{d}L"), st.integers(0, 7).map(lambda d: f"L{d}"),
    st.sampled_from(WEEKDAYS).map(lambda d: f"{d}#L"), weekday_range.map(lambda r: f"{r}L"),
)  # fmt: skip
nth_weekday = st.one_of(
    st.tuples(st.sampled_from(WEEKDAYS), st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"),
    st.tuples(weekday_range, st.integers(1, 5)).map(lambda t: f"{t[0]}#{t[1]}"),
)  # fmt: skip
day_of_week = st.one_of(
    st.just("*"), _field_text(0, 7, WEEKDAYS),
    st.lists(last_weekday | nth_weekday, min_size=1, max_size=3).map(",".join),
)  # fmt: skip
years = st.integers(1990, 2080).flatmap(
    lambda y: st.sampled_from([str(y), f"{y}-{min(y + 9, 2099)}", f"{y},{min(y + 60, 2099)}", f"{y}/7"])
)


@st.composite
def expressions(draw: st.DrawFn) -> tuple[str, str | None]:
    fields = [
        draw(_field_text(0, 59)),
        draw(_field_text(0, 23)),
        draw(day_of_month),
        draw(st.just("*") | _field_text(1, 12, MONTHS)),
        draw(day_of_week),
    ]
    form = draw(st.sampled_from(["five", "seconds-first", "seconds-last", "year"]))
    if form == "five":
        return " ".join(fields), None
    second = draw(st.just("0") | _field_text(0, 59))
    if form == "seconds-last":
        return " ".join([*fields, second]), "last"
    year = [draw(years)] if form == "year" else []
    return " ".join([second, *fields, *year]), "first"


@settings(max_examples=300, deadline=None)
@given(
    expression=expressions(),
    start=st.datetimes(datetime(1995, 1, 1), datetime(2060, 12, 31)).map(lambda d: d.replace(microsecond=0)),
    reverse=st.booleans(),
)
def test_croniter_finds_exactly_the_times_a_day_by_day_model_finds(
    expression: tuple[str, str | None], start: datetime, reverse: bool
) -> None:
    text, seconds = expression
    try:
        parsed = parse_cron(text, seconds)
    except InvalidRequest:
        return  # e.g. a W with a restricted day of week; the refusals are tested above
    expected = model_walls(parsed, start, reverse, 4)
    found = []
    for wall in parsed.walls(start, reverse=reverse):
        found.append(wall)
        if len(found) == 4:
            break
    assert found == expected, parsed.croniter_terms()


# --- croniter itself: every expression it reads is read with its meaning, or refused for a reason --


DISAGREEMENTS = [
    # Each documented way cron tools read one text differently, and so a reason to refuse it.
    r"croniter reads '[^']*' as every [a-z-]+ value, cron, Quartz and croner as .* alone; write ",
    r"croniter reads '[^']*' as [A-Z\d,-]+, other cron tools as [A-Z\d,-]+; write the values you mean",
    r"names every day but is not a plain '\*': .* write '\*' for the",
    r"croniter counts 31 values \(L among them\) and reads it as every day, .* write \* for every day",
    r"in day-of-month needs '\*' or '\?' in day-of-week: with both, croniter lets the W day alone decide",
    r"in day-of-week needs '\*' or '\?' in day-of-month: with both, croniter fires where both match",
    r"plain days of the week cannot be listed with #n or L days \(croniter ignores the plain ones",
    r"ranges of years do not wrap around \(where the year field ends differs between tools\); write",
    r"never occurs",  # croniter reads it too, and finds no time for it
]


def _croniter_item(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    value = st.integers(low, high).map(str)
    if names:
        value = value | st.sampled_from(names)
    return st.one_of(
        st.just("*"),
        st.integers(1, high - low + 2).map(lambda n: f"*/{n}"),
        value,
        st.tuples(value, value).map(lambda t: f"{t[0]}-{t[1]}"),
        st.tuples(value, value, st.integers(1, 8)).map(lambda t: f"{t[0]}-{t[1]}/{t[2]}"),
        st.tuples(value, st.integers(1, 20)).map(lambda t: f"{t[0]}/{t[1]}"),
    )


def _croniter_field(item: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(item, min_size=1, max_size=3).map(",".join)


croniter_day_of_month = st.one_of(
    st.just("*"), st.just("?"), st.just("L"), _croniter_field(_croniter_item(1, 31) | st.just("L")),
    st.integers(1, 31).map(lambda n: f"{n}W"), st.integers(1, 31).map(lambda n: f"W{n}"),
    _croniter_field(st.integers(1, 31).map(lambda n: f"{n}-L") | _croniter_item(1, 31)),
    st.tuples(st.integers(1, 31), st.integers(1, 9)).map(lambda t: f"{t[0]}-L/{t[1]}"),
)  # fmt: skip
croniter_day_of_week = st.one_of(
    st.just("*"), st.just("?"), _croniter_field(_croniter_item(0, 7, WEEKDAYS)),
    _croniter_field(st.integers(0, 7).map(lambda d: f"L{d}") | _croniter_item(0, 7, WEEKDAYS)),
    _croniter_field(
        st.tuples(st.sampled_from(WEEKDAYS) | weekday_range | st.integers(0, 7).map(str), st.integers(1, 5))
        .map(lambda t: f"{t[0]}#{t[1]}")
        | st.integers(0, 7).map(lambda d: f"L{d}")
        | _croniter_item(0, 7, WEEKDAYS)
    ),
)  # fmt: skip


@st.composite
def croniter_expressions(draw: st.DrawFn) -> tuple[str, str | None]:
    """Expressions in croniter's grammar and field order, most of which croniter reads."""
    fields = [
        draw(st.sampled_from(["0", "*", "30"]) | _croniter_field(_croniter_item(0, 59))),
        draw(st.sampled_from(["0", "*", "12"]) | _croniter_field(_croniter_item(0, 23))),
        draw(croniter_day_of_month),
        draw(st.just("*") | _croniter_field(_croniter_item(1, 12, MONTHS))),
        draw(croniter_day_of_week),
    ]
    form = draw(st.sampled_from(["five", "seconds", "year"]))
    if form == "five":
        return " ".join(fields), None
    fields.append(draw(st.sampled_from(["0", "*"]) | _croniter_field(_croniter_item(0, 59))))
    if form == "year":
        first = draw(st.integers(1990, 2070))
        fields.append(
            draw(st.sampled_from([f"{first}", f"{first}-{first + 9}", f"{first}/7", "*", "2098-1971"]))
        )
    return " ".join(fields), "last"


@settings(max_examples=400, deadline=None)
@given(
    expression=croniter_expressions(),
    start=st.datetimes(datetime(1995, 1, 1), datetime(2060, 12, 31)).map(lambda d: d.replace(microsecond=0)),
    reverse=st.booleans(),
)
def test_every_expression_croniter_reads_means_what_it_means_to_croniter_or_is_refused_for_a_disagreement(
    expression: tuple[str, str | None], start: datetime, reverse: bool
) -> None:
    text, seconds = expression
    try:
        croniter.expand(text)
    except CroniterBadCronError:
        return  # not a form croniter reads; the rows above cover the ones loom reads anyway
    try:
        parsed = parse_cron(text, seconds)
    except InvalidRequest as refused:
        refusal = str(refused)
    else:
        refusal = None
    if refusal is not None:
        assert any(re.search(reason, refusal) for reason in DISAGREEMENTS), refusal
        return
    theirs = []
    it = croniter(text, start, max_years_between_matches=130)
    with contextlib.suppress(CroniterBadDateError):
        for _ in range(4):
            theirs.append((it.get_prev if reverse else it.get_next)(datetime))
    assert list(islice(parsed.walls(start, reverse=reverse), 4)) == theirs, parsed.croniter_terms()
