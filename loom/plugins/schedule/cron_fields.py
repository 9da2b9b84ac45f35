"""Cron fields: what each item of a field means, read twice, and accepted only where the readings agree.

A plain item (``*``, ``a``, ``a-b``, ``a/n``, ``a-b/n`` and ``*/n``, with names) is read twice: by
croniter, whose meaning loom keeps, and by loom as cron, Quartz and croner read it (a range whose
end is below its start wraps around, stepping on across the wrap as Quartz does; ``a-a`` is ``a``).
Where croniter reads an item otherwise (``5-5`` and ``sun-sun`` are the whole field to croniter, and
it steps across a wrap differently, so ``50-10/15`` is 50 and 6 to croniter but 50 and 5 to Quartz)
the item is refused, and the message names both readings and the list to write instead. Ranges
of years do not wrap: where a year field ends differs from tool to tool.

The ``L``, ``W`` and ``#`` forms are read here, by their documented meanings, and croniter is given
them only in the spellings it reads the same way (see `loom.plugins.schedule.cron`).
"""

from __future__ import annotations

import re

import attrs
from croniter import croniter

YEAR_MIN = 1970
YEAR_MAX = 2099
"""The years a year field may name: the range croniter computes in."""

MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
LAST_OFFSET_MAX = 30
"""``L-30`` is the largest offset from the last day (Quartz's limit): the 1st of a 31-day month."""


class Refusal(Exception):
    """A field or expression is refused; `parse_cron` adds which expression."""


@attrs.frozen
class Field:
    """One cron field: its name, its place in croniter's order, its values and the names it accepts."""

    name: str
    index: int
    """Where croniter keeps it: minute hour day month day-of-week second year."""
    low: int
    high: int
    names: tuple[str, ...] = ()
    """Names of ``low``, ``low + 1``, ..."""
    open_high: int | None = None
    """Where ``*`` and ``start/step`` end, if not at ``high`` (day-of-week ends at 6, not at 7)."""

    @property
    def end(self) -> int:
        return self.high if self.open_high is None else self.open_high

    @property
    def every(self) -> frozenset[int]:
        return frozenset(range(self.low, self.end + 1))


SECOND = Field("second", 5, 0, 59)
MINUTE = Field("minute", 0, 0, 59)
HOUR = Field("hour", 1, 0, 23)
DAY = Field("day-of-month", 2, 1, 31)
MONTH = Field("month", 3, 1, 12, MONTH_NAMES)
WEEKDAY = Field("day-of-week", 4, 0, 7, WEEKDAY_NAMES, open_high=6)
YEAR = Field("year", 6, YEAR_MIN, YEAR_MAX)

_ITEM_RE = re.compile(r"(?P<start>\*|\d+|[a-z]+)(?:-(?P<end>\d+|[a-z]+))?(?:/(?P<step>\d+))?")
_NEAREST_RE = re.compile(r"(\d+)w|w(\d+)")
_LAST_OFFSET_RE = re.compile(r"l(?:-(\d+))?(w?)")
_HASH_RE = re.compile(r"(?P<base>[^#]+)#(?P<n>\d+|l)")
_LAST_SUFFIX_RE = re.compile(r"(?P<base>[^#]+)l")
_LAST_PREFIX_RE = re.compile(r"l(?P<day>\d+)")
_BASE_RE = re.compile(r"(?:\d+|[a-z]{3})(?:-(?:\d+|[a-z]{3}))?")
_DAY_NUMBER_RE = re.compile(r"(?<![/#\d])\d+")
_TO_LAST_RE = re.compile(r"\d+-l(?:/\d+)?")


def _number(field: Field, token: str) -> int:
    if token.isdigit():
        value = int(token)
    elif token in field.names:
        value = field.low + field.names.index(token)
    elif field.names:
        raise Refusal(f"{token!r} is not a number or a {field.name} name ({', '.join(field.names)})")
    else:
        raise Refusal(f"{token!r} is not a number")
    if not field.low <= value <= field.high:
        raise Refusal(f"{value} is outside {field.low}-{field.high}")
    return value


def _walk(field: Field, low: int, high: int, step: int) -> set[int]:
    """The values from ``low`` to ``high`` by ``step``; past the field's end it wraps to its start."""
    if low <= high:
        return set(range(low, high + 1, step))
    size = field.end - field.low + 1
    return {field.low + (value - field.low) % size for value in range(low, high + size + 1, step)}


def cron_reading(field: Field, item: str) -> frozenset[int]:
    """What one plain item means to cron, Quartz and croner."""
    match = _ITEM_RE.fullmatch(item)
    if match is None:
        raise Refusal(f"{item!r} is not a value, a range or a step")
    start, end, step_text = match["start"], match["end"], match["step"]
    step = 1 if step_text is None else int(step_text)
    if step == 0:
        raise Refusal(f"{item!r} has a step of 0")
    if start == "*":
        if end is not None:
            raise Refusal(f"{item!r}: '*' cannot start a range")
        low, high = field.low, field.end
    else:
        low = _number(field, start)
        if end is None:
            # "a/step" runs from a to the end of the field; "a" alone is a single value.
            high = field.end if step_text is not None else low
            if field is WEEKDAY and low == 7:
                high = 7  # 7 is Sunday, the end of the week: "7/2" is Sunday alone
        elif field is DAY and end == "l":
            high = field.high  # "29-L": to the last day of the month
        else:
            high = _number(field, end)
        if field is WEEKDAY and low != high:
            if low == 7:
                low = 0  # "SUN-TUE" written "7-2"
            elif high == 0:
                high = 7  # "FRI-SUN": Sunday closes the week
        if field is YEAR and low > high:
            raise Refusal(
                f"{item!r} runs backwards, and ranges of years do not wrap around (where the year field "
                f"ends differs between tools); write {high}-{low}, or {low}-{YEAR_MAX},{YEAR_MIN}-{high}"
            )
    values = _walk(field, low, high, step)
    # (a step past the field's last value names its first value alone, as croniter reads it: refusing
    # it, as APScheduler and Quartz do, would break the schedules armed with it before)
    return frozenset(v % 7 for v in values) if field is WEEKDAY else frozenset(values)


def croniter_reading(field: Field, item: str) -> frozenset[int] | None:
    """What one plain item means to croniter, or None if croniter does not read it."""
    fields = ["*"] * max(5, field.index + 1)
    fields[field.index] = item
    try:
        expanded, _ = croniter.expand(" ".join(fields))
    except (ValueError, TypeError):  # croniter's CroniterError subclasses, and its bad types
        return None
    values = expanded[field.index]
    if values == ["*"]:
        return field.every
    return frozenset(int(value) for value in values)


def spell(field: Field, values: frozenset[int]) -> str:
    """Values as a list to write instead: runs of three or more as ranges, days of the week by name."""
    ordered = sorted(values)
    runs: list[list[int]] = []
    for value in ordered:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])

    def name(value: int) -> str:
        return WEEKDAY_NAMES[value].upper() if field is WEEKDAY else str(value)

    parts = []
    for run in runs:
        if len(run) >= 3:
            parts.append(f"{name(run[0])}-{name(run[-1])}")
        else:
            parts.extend(map(name, run))
    return ",".join(parts)


def plain(field: Field, item: str) -> frozenset[int]:
    """One plain item, refused unless croniter reads it as cron, Quartz and croner do."""
    ours = cron_reading(field, item)
    theirs = croniter_reading(field, item)
    if theirs is None:
        raise Refusal(f"{item!r} is not a form croniter reads")
    if ours != theirs:
        if theirs == field.every and len(ours) == 1:
            raise Refusal(
                f"croniter reads {item!r} as every {field.name} value, cron, Quartz and croner as "
                f"{spell(field, ours)} alone; write {spell(field, ours)} (or * for every value)"
            )
        raise Refusal(
            f"croniter reads {item!r} as {spell(field, theirs)}, other cron tools as {spell(field, ours)}; "
            f"write the values you mean as a list (e.g. {spell(field, ours)})"
        )
    return ours


def plain_list(field: Field, items: list[str]) -> frozenset[int]:
    values: set[int] = set()
    for item in items:
        values |= plain(field, item)
    return frozenset(values)


def list_items(text: str) -> list[str]:
    items = text.split(",")
    if "" in items:
        raise Refusal("an empty list item")
    if "?" in items and text != "?":
        raise Refusal("'?' stands alone")
    return items


@attrs.frozen(kw_only=True)
class DayField:
    """A day-of-month field: plain days, ``L``, ``L-n``, and nearest-weekday forms, any of them listed."""

    days: frozenset[int] = frozenset()
    last: bool = False
    offsets: frozenset[int] = frozenset()
    """``L-n``: the n-th day before the last (n >= 1)."""
    nearest: frozenset[int] = frozenset()
    """``15W``: the weekday nearest that day of the month."""
    last_nearest: frozenset[int] = frozenset()
    """``LW`` (0) and ``L-nW``: the weekday nearest the n-th day before the last."""


def day_field(text: str) -> DayField:
    days: set[int] = set()
    last = False
    offsets: set[int] = set()
    nearest: set[int] = set()
    last_nearest: set[int] = set()
    for item in list_items(text):
        near = _NEAREST_RE.fullmatch(item)
        from_last = _LAST_OFFSET_RE.fullmatch(item)
        if near is not None:
            day = int(near[1] or near[2])
            if not 1 <= day <= DAY.high:
                raise Refusal(f"{item!r}: W takes a day from 1 to 31 (LW for the last weekday)")
            nearest.add(day)
        elif from_last is not None and from_last[2]:
            last_nearest.add(_offset(item, from_last[1]))
        elif from_last is not None:
            offset = _offset(item, from_last[1])
            if offset:
                offsets.add(offset)
            else:
                last = True
        elif ("w" in item or "l" in item) and _TO_LAST_RE.fullmatch(item) is None:
            raise Refusal(
                f"{item!r} is not a day-of-month form (L, L-3, LW, L-3W, 15W or W15, or a range "
                "ending in L such as 29-L; W takes one day, not a range)"
            )
        elif item != "?":
            days |= plain(DAY, item)
    return DayField(
        days=frozenset(days),
        last=last,
        offsets=frozenset(offsets),
        nearest=frozenset(nearest),
        last_nearest=frozenset(last_nearest),
    )


def _offset(item: str, digits: str | None) -> int:
    offset = 0 if digits is None else int(digits)
    if offset > LAST_OFFSET_MAX:
        raise Refusal(f"{item!r}: an offset from the last day is 0 to {LAST_OFFSET_MAX}")
    return offset


@attrs.frozen(kw_only=True)
class WeekdayField:
    """A day-of-week field: plain weekdays, n-th weekdays of the month and last weekdays of the month."""

    weekdays: frozenset[int] = frozenset()
    nth: frozenset[tuple[int, int]] = frozenset()
    """``FRI#2``: (weekday, n) for the n-th such weekday of the month."""
    last: frozenset[int] = frozenset()
    """``FRI#L``, ``5L``, ``L5``: the last such weekday of the month."""


def weekday_field(text: str, *, names_only: bool) -> WeekdayField:
    """Read a day-of-week field; ``names_only`` refuses numbered days (seconds first: see `_numbered`)."""
    items = list_items(text)
    if names_only:
        _numbered(items)
    weekdays: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last: set[int] = set()
    for item in items:
        by_hash = _HASH_RE.fullmatch(item)
        by_suffix = _LAST_SUFFIX_RE.fullmatch(item)
        by_prefix = _LAST_PREFIX_RE.fullmatch(item)
        if item == "l":
            raise Refusal(
                "'L' alone is Saturday to Quartz and not a day to croniter and croner; write SAT for "
                "Saturday, or FRI#L (5L) for the last Friday of the month"
            )
        if by_prefix is not None:
            last.add(_number(WEEKDAY, by_prefix["day"]) % 7)
        elif by_hash is not None and by_hash["n"] == "l":
            last |= _base(item, by_hash["base"])
        elif by_hash is not None:
            n = int(by_hash["n"])
            if not 1 <= n <= 5:
                raise Refusal(f"{item!r}: the n in day#n is 1 to 5 (or L for the last)")
            nth |= {(day, n) for day in _base(item, by_hash["base"])}
        elif by_suffix is not None:
            last |= _base(item, by_suffix["base"])
        elif "#" in item or "l" in item:
            raise Refusal(
                f"{item!r} is not a day-of-week form (FRI#2, FRI#L, 5L, L5, or a range of them such "
                "as MON-FRI#1)"
            )
        elif item != "?":
            weekdays |= plain(WEEKDAY, item)
    if weekdays and (nth or last):
        # croniter refuses this, or (when the plain days cover the #/L days or the whole week) drops
        # the plain days; croner adds them
        raise Refusal(
            "plain days of the week cannot be listed with #n or L days (croniter ignores the plain ones "
            "or refuses, croner adds them); write them as two schedules"
        )
    return WeekdayField(weekdays=frozenset(weekdays), nth=frozenset(nth), last=frozenset(last))


def _base(item: str, base: str) -> frozenset[int]:
    """The weekdays before ``#n``, ``#L`` or ``L``: one day or a range of them."""
    if _BASE_RE.fullmatch(base) is None:
        raise Refusal(f"{item!r}: #n and L follow one day or a range of days (such as MON-FRI#1)")
    return plain(WEEKDAY, base)


def _numbered(items: list[str]) -> None:
    """Seconds first is Quartz's order, and Quartz numbers the days of the week 1 (Sunday) to 7."""
    for item in items:
        numbers = [int(n) for n in _DAY_NUMBER_RE.findall(item.split("/")[0].split("#")[0])]
        if any(1 <= n <= 7 for n in numbers):
            raise Refusal(
                f"{item!r}: with the seconds first, a numbered day of the week means one day to Quartz "
                "(1 is Sunday) and another to croner, Spring and cron (1 is Monday); write day names "
                "(such as MON-FRI, FRI#L or SUN)"
            )
