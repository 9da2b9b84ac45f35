"""Cron expressions: loom reads every field itself, and croniter does the calendar arithmetic.

Loom parses each field into the explicit set of values it means in standard cron (Vixie cron and
cronie, robfig/cron; ``a/n`` as robfig/cron and Quartz read it, ``L``, ``W`` and ``#`` as Quartz
does), and hands croniter an expression made only of plain numbers and the ``L``, ``W`` and ``#``
forms. Croniter's own reading of ranges and steps never decides what a schedule means, because it
has changed from release to release: an equal range (``5-5``, ``Sun-Sun``, ``jan-jan``) is read as
the whole field from croniter 5.0 on, ``59/15`` as every fifteen minutes in 5.0 to 6.2, and ``6/1``
in the day-of-week field as every day in 4.0 to 6.2. What is left to croniter (finding the next or
previous local time that matches explicit sets) is checked against an independent model in the
tests.

The field order has one rule, so that an expression ported from another tool cannot be misread:

* five fields are ``minute hour day-of-month month day-of-week``;
* six or seven fields carry seconds, and other tools disagree where (Quartz, Spring, robfig/cron,
  croner and Temporal put them first; croniter after the day of week), so the spec must say:
  `SecondsField.FIRST` reads ``second minute hour day-of-month month day-of-week [year]``, and
  `SecondsField.LAST` reads six fields as ``minute hour day-of-month month day-of-week second``.
  A year, when given, is always the seventh field after seconds first.
"""

from __future__ import annotations

import calendar
import enum
import functools
import re
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

import attrs
from croniter import croniter

from ...records.errors import InvalidRequest

YEAR_MIN = 1970
YEAR_MAX = 2099
"""The years a year field may name: the range croniter computes in."""

# croniter gives up after this many years without a match; every gap between two occurrences of a
# valid expression is shorter (a year field spans 1970..2099; without one, the rarest day an
# expression can name, such as the fifth Monday of February, recurs within 40 years).
_SEARCH_YEARS = YEAR_MAX - YEAR_MIN + 1

MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")

ALIASES: Mapping[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


class SecondsField(enum.StrEnum):
    """Where the seconds field of a six- or seven-field cron expression is."""

    FIRST = "first"
    """``second minute hour day-of-month month day-of-week [year]``: Quartz, Spring, robfig/cron, croner,
    Temporal."""
    LAST = "last"
    """``minute hour day-of-month month day-of-week second``: six fields only (croniter's order)."""


@attrs.frozen
class _Field:
    """One cron field: its name, its values, and the names it accepts for them."""

    name: str
    low: int
    high: int
    names: tuple[str, ...] = ()
    """Names of ``low``, ``low + 1``, ..."""
    open_high: int | None = None
    """Where ``*`` and ``start/step`` end, if not at ``high`` (day-of-week ends at 6, not at 7)."""

    @property
    def end(self) -> int:
        return self.high if self.open_high is None else self.open_high


_SECOND = _Field("second", 0, 59)
_MINUTE = _Field("minute", 0, 59)
_HOUR = _Field("hour", 0, 23)
_DAY = _Field("day-of-month", 1, 31)
_MONTH = _Field("month", 1, 12, MONTH_NAMES)
_WEEKDAY = _Field("day-of-week", 0, 7, WEEKDAY_NAMES, open_high=6)
_YEAR = _Field("year", YEAR_MIN, YEAR_MAX)

_ITEM_RE = re.compile(r"(?P<start>\*|\d+|[a-z]+)(?:-(?P<end>\d+|[a-z]+))?(?:/(?P<step>\d+))?")
_NONDETERMINISTIC_RE = re.compile(r"[rh](\(.*\))?(/\d+)?")
_NEAREST_WEEKDAY_RE = re.compile(r"(\d+)w")
_NTH_WEEKDAY_RE = re.compile(r"(\d+|[a-z]+)#(\d+)")
_LAST_WEEKDAY_RE = re.compile(r"(\d+|[a-z]+)l")
_UNRESTRICTED = frozenset({"*", "?", "*/1"})
_NEAREST_WEEKDAY_MAX = 28


@attrs.frozen(kw_only=True)
class CronExpression:
    """A cron expression as the explicit sets of values its fields mean.

    A day matches when it is in the month (and year) sets and its day fields match: when both
    day-of-month and day-of-week are restricted (neither has a plain ``*`` or ``?``) a day matches
    if either does, otherwise it must match the restricted one (standard cron's rule).
    """

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    last_day: bool = False
    """``L`` in day-of-month: the last day of the month."""
    nearest_weekday: int | None = None
    """``15W``: the weekday (Monday to Friday) nearest the 15th, within its month."""
    days_restricted: bool
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday, 6 Saturday."""
    nth_weekdays: frozenset[tuple[int, int]] = frozenset()
    """``5#3``: (weekday, n) for the n-th such weekday of the month."""
    last_weekdays: frozenset[int] = frozenset()
    """``5L``: the last such weekday of the month."""
    weekdays_restricted: bool
    years: frozenset[int] | None = None
    """``None``: every year."""

    def croniter_expression(self) -> str:
        """The expression croniter is given: explicit values only, in croniter's field order."""
        day = "*"
        if self.days_restricted:
            if self.nearest_weekday is not None:
                day = f"{self.nearest_weekday}W"
            else:
                day = ",".join([*map(str, sorted(self.days)), *(["L"] if self.last_day else [])])
        weekday = "*"
        if self.weekdays_restricted:
            special = [f"{d}#{n}" for d, n in sorted(self.nth_weekdays)]
            special += [f"L{d}" for d in sorted(self.last_weekdays)]
            weekday = ",".join(special or map(str, sorted(self.weekdays)))
        fields = [
            _render(self.minutes, _MINUTE),
            _render(self.hours, _HOUR),
            day,
            _render(self.months, _MONTH),
            weekday,
        ]
        if self.seconds != {0} or self.years is not None:
            fields.append(_render(self.seconds, _SECOND))
        if self.years is not None:
            fields.append(_render(self.years, _YEAR))
        return " ".join(fields)

    def walls(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Local wall times strictly after ``start`` (before it when ``reverse``), in order."""
        it = croniter(self.croniter_expression(), start, max_years_between_matches=_SEARCH_YEARS)
        step = it.get_prev if reverse else it.get_next
        while True:
            try:
                wall: datetime = step(datetime)
            except (OverflowError, ValueError):  # no match in reach (CroniterBadDateError), or past year 9999
                return
            yield wall

    def search_start(self) -> datetime:
        """A local time before the first occurrence: just before the first year the expression names."""
        return datetime(min(self.years) if self.years else YEAR_MIN, 1, 1) - timedelta(seconds=1)


def _render(values: frozenset[int], field: _Field) -> str:
    full = set(range(field.low, field.end + 1))
    return "*" if values == full else ",".join(map(str, sorted(values)))


class _Refusal(Exception):
    """A field is refused; `parse_cron` adds which expression."""


def _number(field: _Field, token: str) -> int:
    if token.isdigit():
        value = int(token)
    elif token in field.names:
        value = field.low + field.names.index(token)
    elif field.names:
        raise _Refusal(f"{token!r} is not a number or a {field.name} name ({', '.join(field.names)})")
    else:
        raise _Refusal(f"{token!r} is not a number")
    if not field.low <= value <= field.high:
        raise _Refusal(f"{value} is outside {field.low}-{field.high}")
    return value


def _values(field: _Field, item: str) -> set[int]:
    """The values one list item (``*``, ``a``, ``a-b``, with an optional ``/step``) names."""
    match = _ITEM_RE.fullmatch(item)
    if match is None:
        raise _Refusal(f"{item!r} is not a value, a range or a step")
    start, end, step_text = match["start"], match["end"], match["step"]
    step = 1 if step_text is None else int(step_text)
    if step == 0:
        raise _Refusal(f"{item!r} has a step of 0")
    if start == "*":
        if end is not None:
            raise _Refusal(f"{item!r}: '*' cannot start a range")
        low, high = field.low, field.end
    else:
        low = _number(field, start)
        if end is not None:
            high = _number(field, end)
            if field is _WEEKDAY and high == 0 and low > 0:
                high = 7  # FRI-SUN: Sunday closes the week
        else:
            # "a/step" runs from a to the end of the field; "a" alone is a single value.
            high = field.end if step_text is not None else low
        if low > high:
            raise _Refusal(f"{item!r} runs backwards; write it as two ranges (e.g. 22-23,0-2)")
    return set(range(low, high + 1, step))


def _plain(field: _Field, text: str) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        values |= _values(field, item)
    if field is _WEEKDAY and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values)


def _list_items(text: str) -> list[str]:
    items = text.split(",")
    if "" in items:
        raise _Refusal("an empty list item")
    if "?" in items and text != "?":
        raise _Refusal("'?' stands alone")
    return items


def _day_field(text: str) -> tuple[frozenset[int], bool, int | None]:
    items = _list_items(text)
    days: set[int] = set()
    last = False
    nearest = None
    for item in items:
        w = _NEAREST_WEEKDAY_RE.fullmatch(item)
        if item == "l":
            last = True
        elif w is not None:
            nearest = int(w[1])
            if len(items) > 1:
                raise _Refusal(f"{item!r}: W takes one day and stands alone")
            if not 1 <= nearest <= _NEAREST_WEEKDAY_MAX:
                raise _Refusal(
                    f"W takes a day from 1 to {_NEAREST_WEEKDAY_MAX} (a month without that day "
                    "has no agreed nearest weekday); use L for the last day of the month"
                )
        elif item.startswith("l") or item.endswith("w"):
            raise _Refusal(f"{item!r} is not supported (L alone, or a day with W such as 15W)")
        else:
            days |= _values(_DAY, "*" if item == "?" else item)
    return frozenset(days), last, nearest


def _weekday_field(text: str) -> tuple[frozenset[int], frozenset[tuple[int, int]], frozenset[int]]:
    items = _list_items(text)
    plain: list[str] = []
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    for item in items:
        hash_match = _NTH_WEEKDAY_RE.fullmatch(item)
        last_match = _LAST_WEEKDAY_RE.fullmatch(item)
        if hash_match is not None:
            n = int(hash_match[2])
            if not 1 <= n <= 5:
                raise _Refusal(f"{item!r}: the n in day#n is 1 to 5")
            nth.add((_number(_WEEKDAY, hash_match[1]) % 7, n))
        elif last_match is not None:
            last.add(_number(_WEEKDAY, last_match[1]) % 7)
        elif item == "l" or "#" in item:
            raise _Refusal(f"{item!r} is not supported (a weekday with L or #n, such as 5L or FRI#2)")
        else:
            plain.append("*" if item == "?" else item)
    if plain and (nth or last):
        raise _Refusal("plain weekdays cannot be mixed with the L or # forms in one field")
    return _plain(_WEEKDAY, ",".join(plain)) if plain else frozenset(), frozenset(nth), frozenset(last)


def _split(text: str, seconds: SecondsField | None) -> tuple[str, list[str], list[str]]:
    """The expression's fields as ``(seconds, [minute, hour, day, month, weekday], [year])``."""
    fields = text.lower().split()
    if len(fields) == 1 and fields[0].startswith("@"):
        alias = ALIASES.get(fields[0])
        if alias is None:
            raise _Refusal(f"unknown alias {fields[0]!r} (known: {', '.join(ALIASES)})")
        if seconds is not None:
            raise _Refusal(f"{fields[0]} has no seconds field; leave ScheduleSpec.seconds unset")
        return "0", alias.split(), []
    if len(fields) == 5:
        if seconds is not None:
            raise _Refusal(
                "five fields (minute hour day-of-month month day-of-week) have no seconds; "
                "leave ScheduleSpec.seconds unset, or add the seconds field"
            )
        return "0", fields, []
    if len(fields) in (6, 7) and seconds is None:
        raise _Refusal(
            f"{len(fields)} fields include seconds, and cron tools disagree where they go; say where with "
            'ScheduleSpec.seconds: "first" reads "second minute hour day-of-month month day-of-week [year]" '
            '(as Quartz, Spring, robfig/cron, croner and Temporal do), "last" reads six fields as '
            '"minute hour day-of-month month day-of-week second" (as croniter does)'
        )
    if len(fields) == 6:
        if seconds is SecondsField.FIRST:
            return fields[0], fields[1:], []
        return fields[5], fields[:5], []
    if len(fields) == 7:
        if seconds is SecondsField.LAST:
            raise _Refusal(
                'with a year (seven fields) the seconds come first: use ScheduleSpec.seconds "first" and '
                '"second minute hour day-of-month month day-of-week year"'
            )
        return fields[0], fields[1:6], fields[6:]
    raise _Refusal(
        f"{len(fields)} fields; give five (minute hour day-of-month month day-of-week), "
        "or six or seven with seconds (and a year), saying where with ScheduleSpec.seconds"
    )


@functools.lru_cache(maxsize=256)
def parse_cron(text: str, seconds: SecondsField | None = None) -> CronExpression:
    """Read a cron expression; `InvalidRequest` naming ``ScheduleSpec.cron`` says what is wrong."""
    try:
        return _parse(text, None if seconds is None else SecondsField(seconds))
    except _Refusal as refusal:
        raise InvalidRequest(f"ScheduleSpec.cron: {text!r}: {refusal}") from None


def _field(field: _Field, text: str) -> frozenset[int]:
    try:
        if "?" in text:
            raise _Refusal("'?' is only for day-of-month and day-of-week")
        return _plain(field, text)
    except _Refusal as refusal:
        raise _Refusal(f"{field.name} field {text!r}: {refusal}") from None


def _years(text: str) -> frozenset[int] | None:
    years = _field(_YEAR, text)
    return None if years == frozenset(range(YEAR_MIN, YEAR_MAX + 1)) else years


def _parse(text: str, seconds: SecondsField | None) -> CronExpression:
    for item in text.lower().replace(",", " ").split():
        if _NONDETERMINISTIC_RE.fullmatch(item):
            raise _Refusal(
                f"{item!r} is a random or hashed field; occurrences must be a function of the spec"
            )
    second, (minute, hour, day, month, weekday), year = _split(text, seconds)
    try:
        days, last_day, nearest = _day_field(day)
    except _Refusal as refusal:
        raise _Refusal(f"day-of-month field {day!r}: {refusal}") from None
    try:
        weekdays, nth, last_weekdays = _weekday_field(weekday)
    except _Refusal as refusal:
        raise _Refusal(f"day-of-week field {weekday!r}: {refusal}") from None
    # A day field with a plain '*' or '?' in it puts no restriction on the day (as in cronie and
    # robfig/cron); '*/2' does restrict it (as in robfig/cron, unlike cronie, which looks only at
    # whether the field's first character is '*').
    days_restricted = _UNRESTRICTED.isdisjoint(day.split(","))
    weekdays_restricted = _UNRESTRICTED.isdisjoint(weekday.split(","))
    if nearest is not None and weekdays_restricted:
        raise _Refusal(f"{day.upper()} in day-of-month needs '*' or '?' in day-of-week")
    if (nth or last_weekdays) and days_restricted:
        raise _Refusal(f"{weekday.upper()} in day-of-week needs '*' or '?' in day-of-month")
    expression = CronExpression(
        text=text,
        seconds=_field(_SECOND, second),
        minutes=_field(_MINUTE, minute),
        hours=_field(_HOUR, hour),
        days=days,
        last_day=last_day,
        nearest_weekday=nearest,
        days_restricted=days_restricted,
        months=_field(_MONTH, month),
        weekdays=weekdays,
        nth_weekdays=nth,
        last_weekdays=last_weekdays,
        weekdays_restricted=weekdays_restricted,
        years=_years(year[0]) if year else None,
    )
    if days_restricted and not weekdays_restricted and not last_day and nearest is None:
        longest = max(calendar.monthrange(2000, month)[1] for month in expression.months)
        if min(days) > longest:
            raise _Refusal(f"never occurs: no month it names has day {min(days)}")
    return expression
