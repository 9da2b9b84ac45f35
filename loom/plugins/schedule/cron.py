"""Cron expressions: croniter's meaning, Quartz's and croner's ``5L``, ``FRI#L``, ``LW`` and ``L-n``,
and a refusal wherever cron tools read the same text differently.

Every form croniter 7 accepts means here what it means to croniter, except where croniter and the
other cron tools (cron itself, Quartz, croner) read the same text differently; such a form is
refused, and the message says what to write instead. `cron_fields` reads each field and decides
that; this module puts the fields together and searches for occurrences.

The search is croniter's, over explicit values: an expression becomes one or more croniter
expressions made only of plain numbers and the ``L``, ``W`` and ``#`` spellings croniter reads as
documented, each with at most one restricted day field, and the occurrences are the union of
theirs. The day-of-month-or-day-of-week rule is that union; a day form croniter has no spelling
for (``L-3``, ``L-3W``) is searched as the days it can fall on, keeping the right one. The tests
check the search against an independent model, and the readings against croniter's own.

The field order has one rule, so that an expression ported from another tool cannot be misread:

* five fields are ``minute hour day-of-month month day-of-week``;
* six or seven fields carry seconds, and other tools disagree where (Quartz, Spring, robfig/cron,
  croner and Temporal put them first; croniter after the day of week), so the spec must say:
  `SecondsField.FIRST` reads ``second minute hour day-of-month month day-of-week [year]``, and
  `SecondsField.LAST` reads ``minute hour day-of-month month day-of-week second [year]``.
"""

from __future__ import annotations

import calendar
import enum
import functools
import heapq
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import date, datetime, time, timedelta

import attrs
from croniter import croniter

from ...records.errors import InvalidRequest
from .cron_fields import (
    DAY,
    HOUR,
    MINUTE,
    MONTH,
    SECOND,
    WEEKDAY,
    YEAR,
    YEAR_MAX,
    YEAR_MIN,
    DayField,
    Field,
    Refusal,
    WeekdayField,
    day_field,
    plain_list,
    weekday_field,
)

__all__ = [
    "ALIASES",
    "YEAR_MAX",
    "YEAR_MIN",
    "CronExpression",
    "SecondsField",
    "nearest_weekday",
    "parse_cron",
]

# croniter gives up after this many years without a match; every gap between two occurrences of a
# valid expression is shorter (a year field spans 1970..2099; without one, the rarest day an
# expression can name, such as the fifth Monday of February, recurs within 40 years).
_SEARCH_YEARS = YEAR_MAX - YEAR_MIN + 1

ALIASES: Mapping[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_NONDETERMINISTIC_RE = re.compile(r"[rh](\(.*\))?(/\d+)?")
_SECOND = timedelta(seconds=1)
_DAY = timedelta(days=1)
_LAST_WALL = datetime.max.replace(microsecond=0)
"""The last local time a `datetime` holds, 9999-12-31 23:59:59."""

DayTest = Callable[[date], bool]


class SecondsField(enum.StrEnum):
    """Where the seconds field of a six- or seven-field cron expression is."""

    FIRST = "first"
    """``second minute hour day-of-month month day-of-week [year]``: Quartz, Spring, robfig/cron, croner,
    Temporal."""
    LAST = "last"
    """``minute hour day-of-month month day-of-week second [year]``: croniter's order."""


def nearest_weekday(year: int, month: int, day: int) -> int | None:
    """The weekday (Monday to Friday) nearest ``day`` within its month, as croniter and Quartz find it
    (``None`` for a day before the 1st, such as ``L-30W`` in February)."""
    if day < 1:
        return None
    last = calendar.monthrange(year, month)[1]
    weekday = calendar.weekday(year, month, day)
    if weekday == 5:  # Saturday: the Friday before, unless that is in the previous month
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday: the Monday after, unless that is in the next month
        return day + 1 if day < last else day - 2
    return day


@attrs.frozen(kw_only=True)
class CronExpression:
    """A cron expression as the explicit sets of values its fields mean.

    A day matches when it is in the month (and year) sets and its day fields match: when both
    day-of-month and day-of-week are restricted a day matches if either does, otherwise it must
    match the restricted one (standard cron's rule; which fields are restricted is croniter's
    reading, see `parse_cron`).
    """

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int] = frozenset()
    last_day: bool = False
    """``L`` in day-of-month: the last day of the month."""
    last_day_offsets: frozenset[int] = frozenset()
    """``L-3``: the n-th day before the last day of the month."""
    nearest_weekdays: frozenset[int] = frozenset()
    """``15W``: the weekday nearest the 15th, within its month (`nearest_weekday`); as croniter reads
    it, a day the month lacks stands for its last day (``31W`` in April: the weekday nearest the 30th)."""
    last_nearest_weekdays: frozenset[int] = frozenset()
    """``LW`` (0), ``L-3W`` (3): the weekday nearest the n-th day before the last, within its month."""
    days_restricted: bool
    months: frozenset[int]
    weekdays: frozenset[int] = frozenset()
    """0 is Sunday, 6 Saturday."""
    nth_weekdays: frozenset[tuple[int, int]] = frozenset()
    """``FRI#3``: (weekday, n) for the n-th such weekday of the month."""
    last_weekdays: frozenset[int] = frozenset()
    """``FRI#L``: the last such weekday of the month."""
    weekdays_restricted: bool
    years: frozenset[int] | None = None
    """``None``: every year."""

    def croniter_terms(self) -> list[tuple[str, DayTest | None]]:
        """The croniter expressions whose occurrences together are this expression's, each with the
        test a day must pass (``None``: every day croniter finds is one).

        Each has one restricted day field at most, so croniter never combines two; the other is
        ``?`` rather than ``*``, because next to a ``*`` croniter reads a list of 31 days (or 7
        weekdays) as no restriction at all.
        """
        terms: list[tuple[str, DayTest | None]] = []
        if self.days_restricted:
            terms += [(self._croniter_text(day, "?"), test) for day, test in self._day_terms()]
        if self.weekdays_restricted and self.weekdays:
            terms.append((self._croniter_text("?", ",".join(map(str, sorted(self.weekdays)))), None))
        if self.weekdays_restricted and (self.nth_weekdays or self.last_weekdays):
            special = [f"{d}#{n}" for d, n in sorted(self.nth_weekdays)]
            special += [f"L{d}" for d in sorted(self.last_weekdays)]
            terms.append((self._croniter_text("?", ",".join(special)), None))
        return terms or [(self._croniter_text("*", "*"), None)]

    def _day_terms(self) -> Iterator[tuple[str, DayTest | None]]:
        """Day-of-month texts for croniter: one per W form (croniter reads W alone), one for the rest."""
        for day in sorted(self.nearest_weekdays):
            yield f"{day}W", None
        for n in sorted(self.last_nearest_weekdays):
            if n == 0:
                yield "31W", None  # croniter's 31W is the last weekday: the 31st stands for the last day
            else:
                yield _days(range(max(1, 26 - n), min(31, 33 - n) + 1)), functools.partial(_is_nearest_to, n)
        if self.days or self.last_day or self.last_day_offsets:
            candidates = set(self.days)
            for n in self.last_day_offsets:
                candidates |= set(range(max(1, 28 - n), 31 - n + 1))
            text = ",".join([*map(str, sorted(candidates)), *(["L"] if self.last_day else [])])
            yield text, (self._is_day if self.last_day_offsets else None)

    def _is_day(self, day: date) -> bool:
        last = calendar.monthrange(day.year, day.month)[1]
        return (
            day.day in self.days
            or (self.last_day and day.day == last)
            or last - day.day in self.last_day_offsets
        )

    def _croniter_text(self, day: str, weekday: str) -> str:
        fields = [
            _render(self.minutes, MINUTE),
            _render(self.hours, HOUR),
            day,
            _render(self.months, MONTH),
            weekday,
        ]
        if self.seconds != {0} or self.years is not None:
            fields.append(_render(self.seconds, SECOND))
        if self.years is not None:
            fields.append(_render(self.years, YEAR))
        return " ".join(fields)

    def walls(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Local wall times strictly after ``start`` (before it when ``reverse``), in order."""
        streams = [_term_walls(text, test, start, reverse=reverse) for text, test in self.croniter_terms()]
        previous = None
        for wall in heapq.merge(*streams, reverse=reverse):
            if wall != previous:
                previous = wall
                yield wall

    def search_start(self) -> datetime:
        """A local time before the first occurrence: just before the first year the expression names."""
        return datetime(min(self.years) if self.years else YEAR_MIN, 1, 1) - _SECOND


def _is_nearest_to(n: int, day: date) -> bool:
    """Whether ``day`` is the weekday nearest the n-th day before the last of its month (``L-nW``)."""
    last = calendar.monthrange(day.year, day.month)[1]
    return nearest_weekday(day.year, day.month, last - n) == day.day


def _term_walls(text: str, test: DayTest | None, start: datetime, *, reverse: bool) -> Iterator[datetime]:
    if reverse and start > _LAST_WALL:
        # croniter neither starts past the last second of the year 9999 nor finds that second
        # looking back from it: find it looking forward from the second before, and start there.
        start = _LAST_WALL
        try:
            last: datetime | None = croniter(text, start - _SECOND).get_next(datetime)
        except (OverflowError, ValueError):
            last = None
        if last == _LAST_WALL and (test is None or test(_LAST_WALL.date())):
            yield _LAST_WALL
    it = croniter(text, start, max_years_between_matches=_SEARCH_YEARS)
    step = it.get_prev if reverse else it.get_next
    found = start
    while True:
        try:
            wall: datetime = step(datetime)
        except (OverflowError, ValueError):  # no match in reach (CroniterBadDateError), or past year 9999
            return
        if test is None or test(wall.date()):
            found = wall
            yield wall
        elif abs(wall.year - found.year) > _SEARCH_YEARS:
            return
        else:  # not one of the days: go on from that day's other end
            midnight = datetime.combine(wall.date(), time.min)
            it.set_current(midnight if reverse else midnight + _DAY - _SECOND, force=True)


def _days(days: range) -> str:
    return ",".join(map(str, days))


def _render(values: frozenset[int], field: Field) -> str:
    return "*" if values == field.every else ",".join(map(str, sorted(values)))


def _split(text: str, seconds: SecondsField | None) -> tuple[str, list[str], list[str]]:
    """The expression's fields as ``(seconds, [minute, hour, day, month, weekday], [year])``."""
    fields = text.lower().split()
    if len(fields) == 1 and fields[0].startswith("@"):
        alias = ALIASES.get(fields[0])
        if alias is None:
            raise Refusal(f"unknown alias {fields[0]!r} (known: {', '.join(ALIASES)})")
        if seconds is not None:
            raise Refusal(f"{fields[0]} has no seconds field; leave ScheduleSpec.seconds unset")
        return "0", alias.split(), []
    if len(fields) == 5:
        if seconds is not None:
            raise Refusal(
                "five fields (minute hour day-of-month month day-of-week) have no seconds; "
                "leave ScheduleSpec.seconds unset, or add the seconds field"
            )
        return "0", fields, []
    if len(fields) in (6, 7) and seconds is None:
        raise Refusal(
            f"{len(fields)} fields include seconds, and cron tools disagree where they go; say where with "
            'ScheduleSpec.seconds: "first" reads "second minute hour day-of-month month day-of-week [year]" '
            '(as Quartz, Spring, robfig/cron, croner and Temporal do), "last" reads "minute hour '
            'day-of-month month day-of-week second [year]" (as croniter does)'
        )
    if len(fields) in (6, 7):
        if seconds is SecondsField.FIRST:
            return fields[0], fields[1:6], fields[6:]
        return fields[5], fields[:5], fields[6:]
    raise Refusal(
        f"{len(fields)} fields; give five (minute hour day-of-month month day-of-week), "
        "or six or seven with seconds (and a year), saying where with ScheduleSpec.seconds"
    )


@functools.lru_cache(maxsize=256)
def parse_cron(text: str, seconds: SecondsField | None = None) -> CronExpression:
    """Read a cron expression; `InvalidRequest` naming ``ScheduleSpec.cron`` says what is wrong."""
    try:
        return _parse(text, None if seconds is None else SecondsField(seconds))
    except Refusal as refusal:
        raise InvalidRequest(f"ScheduleSpec.cron: {text!r}: {refusal}") from None


def _field(field: Field, text: str) -> frozenset[int]:
    try:
        if "?" in text:
            raise Refusal("'?' is only for day-of-month and day-of-week; write *")
        items = text.split(",")
        if "" in items:
            raise Refusal("an empty list item")
        return plain_list(field, items)
    except Refusal as refusal:
        raise Refusal(f"{field.name} field {text!r}: {refusal}") from None


def _years(text: str) -> frozenset[int] | None:
    years = _field(YEAR, text)
    return None if years == YEAR.every else years


def _restricted(day: str, weekday: str, days: DayField, weekdays: WeekdayField) -> tuple[bool, bool]:
    """Which day fields restrict the day, as croniter reads them; refused where croner reads otherwise.

    To croniter a day field is unrestricted when it is ``*`` or ``?``, has a plain ``*`` in its list,
    or names every value while the other day field has a ``*`` in it; to croner (and in the cron
    tools' documentation) only when it is ``*`` or ``?``. The two agree unless that leaves croniter
    one restricted field, which croner ORs with every day.
    """
    day_count = len(days.days) + days.last
    weekday_count = len(weekdays.weekdays)  # #n and L days restrict the day whatever they cover
    croniter_free = (
        day == "?" or "*" in day.split(",") or (day_count == DAY.high and "*" in weekday),
        weekday == "?" or "*" in weekday.split(",") or (weekday_count == 7 and "*" in day),
    )
    croner_free = (day in ("*", "?"), weekday in ("*", "?"))
    if day_count == DAY.high and "*" in weekday and days.last and days.days != frozenset(range(1, 31)):
        raise Refusal(
            f"day-of-month field {day!r}: croniter counts 31 values (L among them) and reads it as every "
            "day, other cron tools as the days it names; write * for every day, or the days without L"
        )
    if croniter_free != croner_free and not all(croniter_free):
        field, text, other = (DAY, day, WEEKDAY) if croniter_free[0] else (WEEKDAY, weekday, DAY)
        raise Refusal(
            f"{field.name} field {text!r} names every day but is not a plain '*': croniter then lets the "
            f"{other.name} alone decide, croner fires on every day; write '*' for the {field.name} if "
            f"the {other.name} alone should decide"
        )
    return not croniter_free[0], not croniter_free[1]


def _parse(text: str, seconds: SecondsField | None) -> CronExpression:
    for item in text.lower().replace(",", " ").split():
        if _NONDETERMINISTIC_RE.fullmatch(item):
            raise Refusal(
                f"{item!r} is a random or hashed field; occurrences must be a function of the spec: "
                "write a fixed value"
            )
    second, (minute, hour, day, month, weekday), year = _split(text, seconds)
    try:
        days = day_field(day)
    except Refusal as refusal:
        raise Refusal(f"day-of-month field {day!r}: {refusal}") from None
    try:
        weekdays = weekday_field(weekday, names_only=seconds is SecondsField.FIRST)
    except Refusal as refusal:
        raise Refusal(f"day-of-week field {weekday!r}: {refusal}") from None
    days_restricted, weekdays_restricted = _restricted(day, weekday, days, weekdays)
    if (days.nearest or days.last_nearest) and weekdays_restricted:
        raise Refusal(
            f"{day.upper()} in day-of-month needs '*' or '?' in day-of-week: with both, croniter lets the "
            "W day alone decide and croner fires on either"
        )
    if (weekdays.nth or weekdays.last) and days_restricted:
        raise Refusal(
            f"{weekday.upper()} in day-of-week needs '*' or '?' in day-of-month: with both, croniter "
            "fires where both match and croner where either does"
        )
    expression = CronExpression(
        text=text,
        seconds=_field(SECOND, second),
        minutes=_field(MINUTE, minute),
        hours=_field(HOUR, hour),
        days=days.days,
        last_day=days.last,
        last_day_offsets=days.offsets,
        nearest_weekdays=days.nearest,
        last_nearest_weekdays=days.last_nearest,
        days_restricted=days_restricted,
        months=_field(MONTH, month),
        weekdays=weekdays.weekdays,
        nth_weekdays=weekdays.nth,
        last_weekdays=weekdays.last,
        weekdays_restricted=weekdays_restricted,
        years=_years(year[0]) if year else None,
    )
    _check_occurs(expression)
    return expression


def _check_occurs(e: CronExpression) -> None:
    """Refuse days of the month that no month the expression names has (the spec searches the rest)."""
    if not e.days_restricted or e.weekdays_restricted or e.last_day or e.nearest_weekdays:
        return
    longest = max(calendar.monthrange(2000, month)[1] for month in e.months)
    offsets = e.last_day_offsets | e.last_nearest_weekdays
    if any(d <= longest for d in e.days) or any(longest - n >= 1 for n in offsets):
        return
    what = f"day {min(e.days)}" if e.days else f"a day L-{min(offsets)}"
    raise Refusal(f"never occurs: no month it names has {what}")
