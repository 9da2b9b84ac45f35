"""Instants: a schedule's local wall-clock times turned into instants, with the DST policy.

Everything here is a pure function over integer Unix milliseconds (no clock, no I/O), so core may
call it inside the firing transaction.

A schedule yields local wall-clock times ("walls", naive datetimes) in increasing order. Each wall
maps to instants: f0(w) is the first instant the local clock reads w (or, in a gap, the first
instant after the gap) and f1(w) the last one. Both maps are non-decreasing, so each turns the
wall sequence into a sorted stream of instants, and the occurrences are f0's stream (fold
``"first"``) or the merge of f0's and f1's (fold ``"both"``), without duplicates.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from ...records.errors import InvalidRequest
from ...records.validation import MAX_TIME_MS

HOUR_MS = 3_600_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)
# A stream of occurrences ends when this long (131 years) passes without one. Consecutive local
# times of a valid schedule are always closer (a cron year field spans 1970-2099), so only a DST
# policy that skips every one of them gets here, and the search stops there instead of running on
# to the year 9999.
_REACH = timedelta(days=366 * 131)


class DstGap(enum.StrEnum):
    """What a local time inside a spring-forward gap (a time that never happens) does."""

    SHIFT_FORWARD = "shift_forward"
    SKIP = "skip"


class DstFold(enum.StrEnum):
    """What a local time inside a fall-back fold (a time that happens twice) does."""

    FIRST = "first"
    BOTH = "both"


class Recurring(Protocol):
    """What the occurrence functions need of a schedule (a `ScheduleSpec` is one)."""

    @property
    def schedule_id(self) -> str: ...

    @property
    def timezone(self) -> str: ...

    @property
    def dst_gap(self) -> DstGap: ...

    @property
    def dst_fold(self) -> DstFold: ...

    def walls(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Local wall times strictly after ``start`` (before it when ``reverse``), in order."""
        ...


def occurrence_id(schedule_id: str, occurrence_ms: int) -> str:
    """The deterministic identity of one occurrence of a schedule."""
    return f"{schedule_id}@{occurrence_ms}"


def instant(ms: int) -> datetime:
    """The UTC datetime of Unix milliseconds."""
    return _EPOCH + ms * _MS


def _naive_utc(ms: int) -> datetime:
    """The naive UTC datetime of ``ms``, or `datetime.max` when that is past the year 9999."""
    return datetime.max if ms > MAX_TIME_MS else instant(ms).replace(tzinfo=None)


def _plus(moment: datetime, delta: timedelta) -> datetime:
    """``moment + delta``, or `datetime.max` past the year 9999 (`datetime.min` before the year 1).

    As a bound on walls, a local reading past the year 9999 (as in its last hours in a zone ahead
    of UTC) is `datetime.max`: no schedule has a wall there.
    """
    try:
        return moment + delta
    except OverflowError:
        return datetime.max if delta > timedelta(0) else datetime.min


def to_ms(moment: datetime) -> int:
    """Unix milliseconds of an aware datetime."""
    return (moment - _EPOCH) // _MS


def wall_at(zone: ZoneInfo, ms: int) -> datetime:
    """What the local clock reads at ``ms`` (a naive datetime); `datetime.max` past the year 9999."""
    return _plus(_naive_utc(ms), timedelta(milliseconds=_offset_ms(zone, ms)))


def _offset_ms(zone: ZoneInfo, ms: int) -> int:
    """The zone's UTC offset at ``ms`` (past `MAX_TIME_MS`: at `MAX_TIME_MS`)."""
    moment = instant(min(ms, MAX_TIME_MS))
    if moment > datetime.max.replace(tzinfo=UTC) - timedelta(days=1):
        # `astimezone` cannot read the last day of the year 9999 in a zone ahead of UTC, where it is
        # already the year 10000; the offset a day earlier is the same (no zone changes its offset
        # on the 31st of December).
        moment -= timedelta(days=1)
    offset = moment.astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _MS


_PAST_END = MAX_TIME_MS + 1
"""`_map_wall`'s answer for a wall whose instant is past `MAX_TIME_MS` (the end of loom's time)."""


def _map_wall(spec: Recurring, zone: ZoneInfo, wall: datetime, fold: int) -> int | None:
    ms = to_ms(wall.replace(tzinfo=zone, fold=fold))
    if ms > MAX_TIME_MS:
        return _PAST_END
    if wall_at(zone, ms) == wall:
        return ms
    if spec.dst_gap is DstGap.SKIP:
        return None
    # In a gap, fold=1 reads the wall with the offset after the transition (an instant before
    # it) and fold=0 with the offset before (an instant after it): the transition lies between.
    before = to_ms(wall.replace(tzinfo=zone, fold=1))
    after = to_ms(wall.replace(tzinfo=zone, fold=0))
    if after > MAX_TIME_MS:
        return _PAST_END
    target = _offset_ms(zone, after)
    while after - before > 1:
        mid = (before + after) // 2
        if _offset_ms(zone, mid) == target:
            after = mid
        else:
            before = mid
    return after


def _mapped(
    spec: Recurring, zone: ZoneInfo, walls: Iterator[datetime], fold: int, *, reverse: bool
) -> Iterator[int]:
    found: datetime | None = None  # the last wall that mapped to an instant (or the first wall)
    for wall in walls:
        found = found or wall
        if abs(wall - found) > _REACH:
            return
        ms = _map_wall(spec, zone, wall, fold)
        if ms == _PAST_END:
            if reverse:  # an earlier wall may still be in time
                continue
            return  # every later wall is past the end of time too
        if ms is not None:
            found = wall
            yield ms


def forward(spec: Recurring, after_ms: int) -> Iterator[int]:
    """Every occurrence strictly after ``after_ms``, increasing."""
    zone = ZoneInfo(spec.timezone)
    # Walls at or before wall(after) have f0 <= after.
    streams = [_mapped(spec, zone, spec.walls(wall_at(zone, after_ms), reverse=False), 0, reverse=False)]
    if spec.dst_fold is DstFold.BOTH:
        # f1(w) > after only for walls above the lowest reading the clock will still show,
        # which a coming fall-back lowers below wall(after).
        lowest_offset = min(_offset_ms(zone, after_ms + k * HOUR_MS) for k in range(4))
        start = _naive_utc(after_ms + lowest_offset)
        streams.append(_mapped(spec, zone, spec.walls(start, reverse=False), 1, reverse=False))
    last = after_ms
    for ms in heapq.merge(*streams):
        if ms > last:
            last = ms
            yield ms


def backward(spec: Recurring, before_ms: int) -> Iterator[int]:
    """Every occurrence strictly before ``before_ms``, decreasing."""
    zone = ZoneInfo(spec.timezone)
    # f0(w) < before only for walls up to the highest reading the clock showed before it,
    # which a recent fall-back raises above wall(before).
    highest_offset = max(_offset_ms(zone, before_ms - 1 - k * HOUR_MS) for k in range(4))
    start = _plus(_naive_utc(before_ms + highest_offset), _SECOND)
    streams = [_mapped(spec, zone, spec.walls(start, reverse=True), 0, reverse=True)]
    if spec.dst_fold is DstFold.BOTH:
        start = _plus(wall_at(zone, before_ms), _SECOND)
        streams.append(_mapped(spec, zone, spec.walls(start, reverse=True), 1, reverse=True))
    last = before_ms
    for ms in heapq.merge(*streams, reverse=True):
        if ms < last:
            last = ms
            yield ms


MIN_INSTANT_MS = -62_135_510_400_000
"""0001-01-02T00:00Z: the earliest instant the occurrence functions take (a day after `datetime`'s
first, so that local times in every zone exist); loom's own times start at 0."""


def check_instant(where: str, name: str, value: object, *, high: int = MAX_TIME_MS) -> int:
    """``value`` as integer Unix milliseconds from `MIN_INSTANT_MS` to ``high`` (loom's times end at
    `MAX_TIME_MS`, the last millisecond of the year 9999), or `InvalidRequest` naming ``where`` and
    ``name``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{where}: {name} must be integer milliseconds, got {value!r}")
    if not MIN_INSTANT_MS <= value <= high:
        raise InvalidRequest(
            f"{where}: {name} must be from {MIN_INSTANT_MS} to {high} (the year 1 to the end of the "
            f"year 9999, where loom's times end), got {value}"
        )
    return value


def next_occurrence(spec: Recurring, after_ms: int) -> int:
    """The first occurrence strictly after ``after_ms``, honouring the DST gap and fold policy.

    ``after_ms`` is at most `MAX_TIME_MS` (`InvalidRequest` naming it otherwise, see `check_instant`);
    `InvalidRequest` also says when the schedule has no occurrence after it (its years ran out, or
    loom's time does: a local time past the year 9999 is none).
    """
    check_instant("next_occurrence", "after_ms", after_ms)
    for ms in forward(spec, after_ms):
        return ms
    raise InvalidRequest(f"schedule {spec.schedule_id!r}: no occurrence after {after_ms}")


def previous_occurrence(spec: Recurring, before_ms: int) -> int | None:
    """The last occurrence strictly before ``before_ms`` (``None`` if there is none in reach).

    ``before_ms`` is at most ``MAX_TIME_MS + 1`` (`InvalidRequest` naming it otherwise): the last
    occurrence at or before a time of loom's is the last one before that time plus one.
    """
    check_instant("previous_occurrence", "before_ms", before_ms, high=MAX_TIME_MS + 1)
    for ms in backward(spec, before_ms):
        return ms
    return None


def occurrences(spec: Recurring, after_ms: int, until_ms: int) -> Iterator[int]:
    """The occurrences in ``(after_ms, until_ms]``, increasing (``after_ms`` as for `next_occurrence`;
    ``until_ms`` may lie past loom's times, which have no occurrence)."""
    check_instant("occurrences", "after_ms", after_ms)
    for ms in forward(spec, after_ms):
        if ms > until_ms:
            return
        yield ms
