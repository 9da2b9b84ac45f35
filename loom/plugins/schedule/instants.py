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


def to_ms(moment: datetime) -> int:
    """Unix milliseconds of an aware datetime."""
    return (moment - _EPOCH) // _MS


def wall_at(zone: ZoneInfo, ms: int) -> datetime:
    """What the local clock reads at ``ms`` (a naive datetime)."""
    return instant(ms).astimezone(zone).replace(tzinfo=None, fold=0)


def _offset_ms(zone: ZoneInfo, ms: int) -> int:
    offset = instant(ms).astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _MS


def _map_wall(spec: Recurring, zone: ZoneInfo, wall: datetime, fold: int) -> int | None:
    ms = to_ms(wall.replace(tzinfo=zone, fold=fold))
    if wall_at(zone, ms) == wall:
        return ms
    if spec.dst_gap is DstGap.SKIP:
        return None
    # In a gap, fold=1 reads the wall with the offset after the transition (an instant before
    # it) and fold=0 with the offset before (an instant after it): the transition lies between.
    before = to_ms(wall.replace(tzinfo=zone, fold=1))
    after = to_ms(wall.replace(tzinfo=zone, fold=0))
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
        start = instant(after_ms + lowest_offset).replace(tzinfo=None)
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
    start = instant(before_ms + highest_offset).replace(tzinfo=None) + _SECOND
    streams = [_mapped(spec, zone, spec.walls(start, reverse=True), 0, reverse=True)]
    if spec.dst_fold is DstFold.BOTH:
        start = wall_at(zone, before_ms) + _SECOND
        streams.append(_mapped(spec, zone, spec.walls(start, reverse=True), 1, reverse=True))
    last = before_ms
    for ms in heapq.merge(*streams, reverse=True):
        if ms < last:
            last = ms
            yield ms


def next_occurrence(spec: Recurring, after_ms: int) -> int:
    """The first occurrence strictly after ``after_ms``, honouring the DST gap and fold policy."""
    for ms in forward(spec, after_ms):
        return ms
    raise InvalidRequest(f"schedule {spec.schedule_id!r}: no occurrence after {after_ms}")


def previous_occurrence(spec: Recurring, before_ms: int) -> int | None:
    """The last occurrence strictly before ``before_ms`` (``None`` if there is none in reach)."""
    for ms in backward(spec, before_ms):
        return ms
    return None


def occurrences(spec: Recurring, after_ms: int, until_ms: int) -> Iterator[int]:
    """The occurrences in ``(after_ms, until_ms]``, increasing."""
    for ms in forward(spec, after_ms):
        if ms > until_ms:
            return
        yield ms
