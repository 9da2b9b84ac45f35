"""Calendar schedules: local times of day on chosen weekdays, the form that needs no cron syntax.

A `Calendar` yields local wall-clock times (naive datetimes); turning them into instants in a time
zone, with the DST policy, is `occurrences`' job, the same for calendars and cron expressions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import date, datetime, time, timedelta

import attrs

from ...records.errors import InvalidRequest

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_TIME_RE = re.compile(r"(\d\d):(\d\d)(?::(\d\d))?")


def _parse_time_of_day(text: object) -> time:
    match = _TIME_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidRequest(f"Calendar.at: {text!r} is not a local time of day HH:MM or HH:MM:SS")
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise InvalidRequest(f"Calendar.at: {text!r} is not a time of day (00:00 to 23:59:59)")
    return time(hour, minute, second)


def _as_sequence(field: str, value: object) -> Iterable[object]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidRequest(f"{field}: must be a list, got {value!r}")
    return value


def _to_times(value: object) -> tuple[str, ...]:
    items: Iterable[object] = (value,) if isinstance(value, str) else _as_sequence("Calendar.at", value)
    times = sorted({_parse_time_of_day(item) for item in items})
    if not times:
        raise InvalidRequest("Calendar.at: give at least one local time of day (HH:MM)")
    return tuple(t.strftime("%H:%M" if t.second == 0 else "%H:%M:%S") for t in times)


def _to_weekdays(value: object) -> tuple[str, ...]:
    days = set()
    for item in _as_sequence("Calendar.weekdays", value):
        name = item.lower() if isinstance(item, str) else item
        if name not in WEEKDAYS:
            raise InvalidRequest(f"Calendar.weekdays: {item!r} is not one of {', '.join(WEEKDAYS)}")
        days.add(WEEKDAYS.index(name))
    return tuple(WEEKDAYS[day] for day in sorted(days))


@attrs.frozen(kw_only=True)
class Calendar:
    """Fire at each local time of day in ``at`` on each day in ``weekdays`` (every day when empty).

    ``at`` holds ``"HH:MM"`` or ``"HH:MM:SS"`` strings (a single string is one time); ``weekdays``
    holds ``"mon"`` .. ``"sun"``. Both are normalised: sorted, without duplicates.
    """

    at: tuple[str, ...] = attrs.field(converter=_to_times)
    weekdays: tuple[str, ...] = attrs.field(default=(), converter=_to_weekdays)

    def times(self) -> list[time]:
        return [_parse_time_of_day(text) for text in self.at]

    def allows(self, day: date) -> bool:
        return not self.weekdays or WEEKDAYS[day.weekday()] in self.weekdays

    def walls(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Local wall times after ``start`` (before it when ``reverse``), in order.

        A calendar occurs at least once a week, so the stream only ends where `datetime` does.
        """
        times = self.times()
        if reverse:
            times.reverse()
        day = start.date()
        one_day = timedelta(days=1)
        while True:
            if self.allows(day):
                for t in times:
                    wall = datetime.combine(day, t)
                    if (wall < start) if reverse else (wall > start):
                        yield wall
            try:
                day = day - one_day if reverse else day + one_day
            except OverflowError:
                return
