"""Cron and calendar recurrence: the built-in ``schedule`` plugin (DESIGN section 5; seed 000 "Timers").

Core supplies calendar recurrence as a hook: a recurring timer stores an opaque spec, and when it
fires, core asks the policy registered for its kind what to do. This module is that policy, as
pure, deterministic functions over integer Unix milliseconds (no clock, no I/O), so core may call
it inside the firing transaction.

A schedule is a `ScheduleSpec`: either a ``cron`` expression (standard five fields, or croniter's
six/seven with seconds/years, and its ``@daily``-style aliases; random ``R`` and hashed ``H`` fields
are refused because they are not a function of the spec) or a `Calendar` (local times of day on
chosen weekdays), read as local wall-clock time in an IANA ``timezone``.

Defaults, and what they mean:

* ``dst_gap="shift_forward"``: a local time that does not exist (the spring-forward gap, e.g.
  02:30 on the day clocks jump from 02:00 to 03:00) fires at the first instant after the gap
  (03:00 local). ``"skip"`` drops that day's occurrence instead.
* ``dst_fold="first"``: a local time that happens twice (the fall-back hour) fires once, at its
  first occurrence. ``"both"`` fires at each.
* ``catch_up_ms=6 h``: when a timer fires late (an outage, a clock jump), only the most recent
  due occurrence no older than six hours fires; every other due occurrence is recorded as
  skipped (a count and the first/last, never a list and never a burst). The next fire time is
  always in the future, however far the clock jumped.
* ``overlap="skip"``: an occurrence due while the previous run is still going is skipped;
  ``"buffer_one"`` keeps one to start when the run ends; ``"allow_all"`` keeps every one. (On a
  runtime, the ``schedule`` route handler runs a schedule as one standing Work, which runs one
  attempt at a time: kept occurrences wait as its input, and the next attempt takes them all.)

Occurrence identity is deterministic: ``occurrence_id(schedule_id, occurrence_ms)`` is
``f"{schedule_id}@{occurrence_ms}"``, so a replayed or duplicated firing names the same occurrence.
"""

from __future__ import annotations

import enum
import heapq
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from croniter import CroniterError, croniter

from ..records.errors import InvalidRequest
from ..records.events import Event
from ..records.ids import stable_id
from ..records.timers import Occurrence, RecurrencePolicy, Replacement, Skip, Timer, TimerSpec
from ..records.work import Decision, Deliver, Drop, Unmatched, Work
from ._manager import hookimpl

HOUR_MS = 3_600_000
DEFAULT_CATCH_UP_MS = 6 * HOUR_MS
MAX_COUNTED_SKIPS = 1000
"""A firing counts at most this many skipped occurrences (see `FiringPlan.skipped_count_truncated`)."""

WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)
# Offsets are sampled this far around an instant to find a nearby DST transition; real
# transitions move the clock by at most two hours.
_TRANSITION_REACH_MS = 3 * HOUR_MS
# A schedule with no occurrence this far ahead of the instant asked about has none at all.
_HORIZON = timedelta(days=366 * 30)
_TIME_RE = re.compile(r"(\d\d):(\d\d)(?::(\d\d))?")
_NONDETERMINISTIC_CRON_RE = re.compile(r"[RH](\(.*\))?(/\d+)?", re.IGNORECASE)


class DstGap(enum.StrEnum):
    """What a local time inside a spring-forward gap (a time that never happens) does."""

    SHIFT_FORWARD = "shift_forward"
    SKIP = "skip"


class DstFold(enum.StrEnum):
    """What a local time inside a fall-back fold (a time that happens twice) does."""

    FIRST = "first"
    BOTH = "both"


class Overlap(enum.StrEnum):
    """What an occurrence due while the previous run is still going does."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW_ALL = "allow_all"


class OverlapAction(enum.StrEnum):
    """`overlap_decision`'s answer."""

    START = "start"
    BUFFER = "buffer"
    SKIP = "skip"


_E = TypeVar("_E", bound=enum.StrEnum)


def _enum_value(cls: type[_E], field: str, value: object) -> _E:
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    choices = ", ".join(member.value for member in cls)
    raise InvalidRequest(f"ScheduleSpec.{field}: must be one of {choices}; got {value!r}")


def _to_dst_gap(value: object) -> DstGap:
    return _enum_value(DstGap, "dst_gap", value)


def _to_dst_fold(value: object) -> DstFold:
    return _enum_value(DstFold, "dst_fold", value)


def _to_overlap(value: object) -> Overlap:
    return _enum_value(Overlap, "overlap", value)


def _parse_time_of_day(text: object) -> time:
    match = _TIME_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InvalidRequest(f"Calendar.at: {text!r} is not a local time of day HH:MM or HH:MM:SS")
    hour, minute, second = int(match[1]), int(match[2]), int(match[3] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise InvalidRequest(f"Calendar.at: {text!r} is not a time of day (00:00 to 23:59:59)")
    return time(hour, minute, second)


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


def _as_sequence(field: str, value: object) -> Iterable[object]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise InvalidRequest(f"{field}: must be a list, got {value!r}")
    return value


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


def _to_calendar(value: object) -> Calendar | None:
    if value is None or isinstance(value, Calendar):
        return value
    if isinstance(value, str):  # the "every day at HH:MM" shorthand
        return Calendar(at=(value,))
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"at", "weekdays"})
        if unknown:
            raise InvalidRequest(f"ScheduleSpec.calendar: unknown field(s) {', '.join(map(str, unknown))}")
        if "at" not in value:
            raise InvalidRequest("ScheduleSpec.calendar: missing field 'at' (local times of day)")
        return Calendar(at=value["at"], weekdays=value.get("weekdays", ()))
    raise InvalidRequest(f"ScheduleSpec.calendar: must be a mapping with 'at' and 'weekdays', got {value!r}")


def _check_schedule_id(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"ScheduleSpec.schedule_id: must be a non-empty string, got {value!r}")


def _check_timezone(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"ScheduleSpec.timezone: must be an IANA time zone name, got {value!r}")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(f"ScheduleSpec.timezone: unknown IANA time zone {value!r}") from None


def _check_catch_up(_: object, __: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequest(f"ScheduleSpec.catch_up_ms: must be a positive integer, got {value!r}")


def _check_cron(spec: ScheduleSpec, _: attrs.Attribute[str | None], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest(f"ScheduleSpec.cron: must be a cron expression string, got {value!r}")
    for item in value.replace(",", " ").split():
        if _NONDETERMINISTIC_CRON_RE.fullmatch(item):
            raise InvalidRequest(
                f"ScheduleSpec.cron: {value!r} uses a random or hashed field ({item!r}); "
                "occurrences must be a function of the spec"
            )
    try:
        croniter(value, datetime(2000, 1, 1)).get_next(datetime)
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        raise InvalidRequest(f"ScheduleSpec.cron: {value!r} is not a valid cron expression ({exc})") from None


@attrs.frozen(kw_only=True)
class ScheduleSpec:
    """A validated recurring schedule; bad fields raise `InvalidRequest` naming the field."""

    schedule_id: str = attrs.field(validator=_check_schedule_id)
    cron: str | None = attrs.field(default=None, validator=_check_cron)
    calendar: Calendar | None = attrs.field(default=None, converter=_to_calendar)
    timezone: str = attrs.field(default="UTC", validator=_check_timezone)
    dst_gap: DstGap = attrs.field(default=DstGap.SHIFT_FORWARD, converter=_to_dst_gap)
    dst_fold: DstFold = attrs.field(default=DstFold.FIRST, converter=_to_dst_fold)
    catch_up_ms: int = attrs.field(default=DEFAULT_CATCH_UP_MS, validator=_check_catch_up)
    overlap: Overlap = attrs.field(default=Overlap.SKIP, converter=_to_overlap)

    def __attrs_post_init__(self) -> None:
        if (self.cron is None) == (self.calendar is None):
            raise InvalidRequest("ScheduleSpec.cron, ScheduleSpec.calendar: give exactly one of them")
        try:
            next(_forward(self, 0))
        except StopIteration:
            raise InvalidRequest(
                f"ScheduleSpec.{'cron' if self.cron else 'calendar'}: schedule {self.schedule_id!r} "
                "never occurs (no occurrence after 1970 in this time zone and DST policy)"
            ) from None

    @property
    def kind(self) -> str:
        """The recurrence policy kind: ``"cron"`` or ``"calendar"``."""
        return "cron" if self.cron is not None else "calendar"

    def to_mapping(self) -> dict[str, Any]:
        """The JSON-safe mapping `spec_from_mapping` reads back (what a recurring timer stores)."""
        out: dict[str, Any] = {"schedule_id": self.schedule_id}
        if self.cron is not None:
            out["cron"] = self.cron
        if self.calendar is not None:
            out["calendar"] = {"at": list(self.calendar.at), "weekdays": list(self.calendar.weekdays)}
        out.update(
            timezone=self.timezone,
            dst_gap=self.dst_gap.value,
            dst_fold=self.dst_fold.value,
            catch_up_ms=self.catch_up_ms,
            overlap=self.overlap.value,
        )
        return out


_SPEC_FIELDS = frozenset(field.name for field in attrs.fields(ScheduleSpec))


def spec_from_mapping(spec: Mapping[str, Any]) -> ScheduleSpec:
    """Validate an opaque stored spec (as `ScheduleSpec.to_mapping` writes it)."""
    if not isinstance(spec, Mapping):
        raise InvalidRequest(f"schedule spec: must be a mapping, got {type(spec).__name__}")
    unknown = sorted(set(spec) - _SPEC_FIELDS, key=str)
    if unknown:
        raise InvalidRequest(f"schedule spec: unknown field(s) {', '.join(map(str, unknown))}")
    if "schedule_id" not in spec:
        raise InvalidRequest("ScheduleSpec.schedule_id: missing")
    return ScheduleSpec(**spec)


def occurrence_id(schedule_id: str, occurrence_ms: int) -> str:
    """The deterministic identity of one occurrence of a schedule."""
    return f"{schedule_id}@{occurrence_ms}"


# --- Local wall-clock time <-> instants ------------------------------------------------------------
#
# A schedule yields local wall-clock times ("walls", naive datetimes) in increasing order. Each
# wall maps to instants: f0(w) is the first instant the local clock reads w (or, in a gap, the
# first instant after the gap) and f1(w) the last one. Both maps are non-decreasing, so each
# turns the wall sequence into a sorted stream of instants, and the occurrences are f0's stream
# (fold "first") or the merge of f0's and f1's (fold "both"), without duplicates.


def _instant(ms: int) -> datetime:
    return _EPOCH + ms * _MS


def _ms(moment: datetime) -> int:
    return (moment - _EPOCH) // _MS


def _wall(zone: ZoneInfo, ms: int) -> datetime:
    return _instant(ms).astimezone(zone).replace(tzinfo=None, fold=0)


def _offset_ms(zone: ZoneInfo, ms: int) -> int:
    offset = _instant(ms).astimezone(zone).utcoffset()
    return 0 if offset is None else offset // _MS


def _map_wall(spec: ScheduleSpec, zone: ZoneInfo, wall: datetime, fold: int) -> int | None:
    ms = _ms(wall.replace(tzinfo=zone, fold=fold))
    if _wall(zone, ms) == wall:
        return ms
    if spec.dst_gap is DstGap.SKIP:
        return None
    # In a gap, fold=1 reads the wall with the offset after the transition (an instant before
    # it) and fold=0 with the offset before (an instant after it): the transition lies between.
    before = _ms(wall.replace(tzinfo=zone, fold=1))
    after = _ms(wall.replace(tzinfo=zone, fold=0))
    target = _offset_ms(zone, after)
    while after - before > 1:
        mid = (before + after) // 2
        if _offset_ms(zone, mid) == target:
            after = mid
        else:
            before = mid
    return after


def _walls(spec: ScheduleSpec, start: datetime, *, reverse: bool) -> Iterator[datetime]:
    """Local wall times of ``spec`` after ``start`` (before it when ``reverse``), in order."""
    try:
        limit = start - _HORIZON if reverse else start + _HORIZON
    except OverflowError:
        limit = datetime.min if reverse else datetime.max
    if spec.cron is not None:
        it = croniter(spec.cron, start)
        step = it.get_prev if reverse else it.get_next
        while True:
            try:
                wall: datetime = step(datetime)
            except (CroniterError, OverflowError, ValueError):
                return
            if (wall < limit) if reverse else (wall > limit):
                return
            yield wall
    else:
        assert spec.calendar is not None
        calendar = spec.calendar
        times = calendar.times()
        if reverse:
            times.reverse()
        day = start.date()
        one_day = timedelta(days=1)
        while (day >= limit.date()) if reverse else (day <= limit.date()):
            if calendar.allows(day):
                for t in times:
                    wall = datetime.combine(day, t)
                    if (wall < start) if reverse else (wall > start):
                        yield wall
            day = day - one_day if reverse else day + one_day


def _mapped(spec: ScheduleSpec, zone: ZoneInfo, walls: Iterator[datetime], fold: int) -> Iterator[int]:
    for wall in walls:
        ms = _map_wall(spec, zone, wall, fold)
        if ms is not None:
            yield ms


def _forward(spec: ScheduleSpec, after_ms: int) -> Iterator[int]:
    """Every occurrence strictly after ``after_ms``, increasing."""
    zone = ZoneInfo(spec.timezone)
    # Walls at or before wall(after) have f0 <= after.
    streams = [_mapped(spec, zone, _walls(spec, _wall(zone, after_ms), reverse=False), 0)]
    if spec.dst_fold is DstFold.BOTH:
        # f1(w) > after only for walls above the lowest reading the clock will still show,
        # which a coming fall-back lowers below wall(after).
        lowest_offset = min(_offset_ms(zone, after_ms + k * HOUR_MS) for k in range(4))
        start = _instant(after_ms + lowest_offset).replace(tzinfo=None)
        streams.append(_mapped(spec, zone, _walls(spec, start, reverse=False), 1))
    last = after_ms
    for ms in heapq.merge(*streams):
        if ms > last:
            last = ms
            yield ms


def _backward(spec: ScheduleSpec, before_ms: int) -> Iterator[int]:
    """Every occurrence strictly before ``before_ms``, decreasing."""
    zone = ZoneInfo(spec.timezone)
    # f0(w) < before only for walls up to the highest reading the clock showed before it,
    # which a recent fall-back raises above wall(before).
    highest_offset = max(_offset_ms(zone, before_ms - 1 - k * HOUR_MS) for k in range(4))
    start = _instant(before_ms + highest_offset).replace(tzinfo=None) + _SECOND
    streams = [_mapped(spec, zone, _walls(spec, start, reverse=True), 0)]
    if spec.dst_fold is DstFold.BOTH:
        start = _wall(zone, before_ms) + _SECOND
        streams.append(_mapped(spec, zone, _walls(spec, start, reverse=True), 1))
    last = before_ms
    for ms in heapq.merge(*streams, reverse=True):
        if ms < last:
            last = ms
            yield ms


def next_occurrence(spec: ScheduleSpec, after_ms: int) -> int:
    """The first occurrence strictly after ``after_ms``, honouring the DST gap and fold policy."""
    for ms in _forward(spec, after_ms):
        return ms
    raise InvalidRequest(f"schedule {spec.schedule_id!r}: no occurrence after {after_ms}")


def previous_occurrence(spec: ScheduleSpec, before_ms: int) -> int | None:
    """The last occurrence strictly before ``before_ms`` (``None`` if there is none in reach)."""
    for ms in _backward(spec, before_ms):
        return ms
    return None


def occurrences(spec: ScheduleSpec, after_ms: int, until_ms: int) -> Iterator[int]:
    """The occurrences in ``(after_ms, until_ms]``, increasing."""
    for ms in _forward(spec, after_ms):
        if ms > until_ms:
            return
        yield ms


# --- Firing ----------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class FiringPlan:
    """What to do when the timer armed for ``scheduled_ms`` fires at ``now_ms``.

    The due occurrences are ``scheduled_ms`` and every occurrence in ``(scheduled_ms, now_ms]``.
    At most one of them fires (``fire_ms``); the rest are skipped, summarised by a count and the
    first and last skipped instants. ``next_ms`` (always > ``now_ms``) is when to arm the timer
    again.
    """

    schedule_id: str
    scheduled_ms: int
    now_ms: int
    fire_ms: int | None
    """The occurrence to fire now: the latest due one within the catch-up window, if any."""
    skipped_count: int
    """Due occurrences not fired (counted up to `MAX_COUNTED_SKIPS`)."""
    skipped_count_truncated: bool
    """True when there were more skipped occurrences than were counted."""
    skipped_first_ms: int | None
    skipped_last_ms: int | None
    next_ms: int

    @property
    def occurrence_id(self) -> str | None:
        """The identity of the occurrence that fires now, if one does."""
        return None if self.fire_ms is None else occurrence_id(self.schedule_id, self.fire_ms)

    @property
    def next_occurrence_id(self) -> str:
        """The identity of the occurrence the re-armed timer is for."""
        return occurrence_id(self.schedule_id, self.next_ms)


def plan_firing(spec: ScheduleSpec, scheduled_ms: int, now_ms: int) -> FiringPlan:
    """Plan the firing of the timer armed for ``scheduled_ms`` (an occurrence) at ``now_ms``.

    ``scheduled_ms`` counts as due even if it is not an occurrence of ``spec`` (the spec changed
    since it was armed): it is what the timer was armed for.
    """
    for name, value in (("scheduled_ms", scheduled_ms), ("now_ms", now_ms)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(f"plan_firing: {name} must be integer milliseconds, got {value!r}")
    if now_ms < scheduled_ms:
        raise InvalidRequest(
            f"schedule {spec.schedule_id!r}: a timer armed for {scheduled_ms} cannot fire earlier, at {now_ms}"
        )
    latest = previous_occurrence(spec, now_ms + 1)
    latest_due = latest if latest is not None and latest > scheduled_ms else scheduled_ms
    fire_ms = latest_due if latest_due >= now_ms - spec.catch_up_ms else None

    count, truncated, first, last = 0, False, None, None
    if fire_ms != scheduled_ms:
        first = scheduled_ms
        if fire_ms is None:
            last = latest_due
        else:
            before_fire = previous_occurrence(spec, fire_ms)
            last = before_fire if before_fire is not None and before_fire > scheduled_ms else scheduled_ms
        count = 1
        for _ in occurrences(spec, scheduled_ms, last):
            if count == MAX_COUNTED_SKIPS:
                truncated = True
                break
            count += 1
    return FiringPlan(
        schedule_id=spec.schedule_id,
        scheduled_ms=scheduled_ms,
        now_ms=now_ms,
        fire_ms=fire_ms,
        skipped_count=count,
        skipped_count_truncated=truncated,
        skipped_first_ms=first,
        skipped_last_ms=last,
        next_ms=next_occurrence(spec, now_ms),
    )


def overlap_decision(spec: ScheduleSpec, running: int, buffered: int) -> OverlapAction:
    """Whether an occurrence due now starts, waits in the buffer, or is skipped.

    ``running`` is how many runs of the schedule are still going, ``buffered`` how many
    occurrences already wait for them to end.
    """
    for name, value in (("running", running), ("buffered", buffered)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(f"overlap_decision: {name} must be a non-negative integer, got {value!r}")
    return _overlap_action(spec.overlap, running, buffered)


def _overlap_action(overlap: Overlap, running: int, buffered: int) -> OverlapAction:
    if running == 0 or overlap is Overlap.ALLOW_ALL:
        return OverlapAction.START
    if overlap is Overlap.BUFFER_ONE and buffered == 0:
        return OverlapAction.BUFFER
    return OverlapAction.SKIP


# --- The hooks ----------------------------------------------------------------------------------

PlanPolicy = Callable[[int, int, Mapping[str, Any]], FiringPlan]


def _plan_policy(kind: str) -> PlanPolicy:
    def policy(timer_fire_at_ms: int, now_ms: int, spec: Mapping[str, Any]) -> FiringPlan:
        parsed = spec_from_mapping(spec)
        if parsed.kind != kind:
            raise InvalidRequest(f"schedule {parsed.schedule_id!r}: a {kind} timer needs a {kind} spec")
        return plan_firing(parsed, timer_fire_at_ms, now_ms)

    policy.__name__ = policy.__qualname__ = f"{kind}_policy"
    policy.__doc__ = f"The {kind} recurrence policy: `plan_firing` over a stored {kind} spec."
    return policy


cron_policy = _plan_policy("cron")
calendar_policy = _plan_policy("calendar")


def _core_policy(plan_policy: PlanPolicy) -> RecurrencePolicy:
    """Core's recurrence contract over a plan: the occurrence (or a skip) and the replacement."""

    def policy(
        timer: Timer, now_ms: int, spec: Mapping[str, Any]
    ) -> tuple[Occurrence | Skip, Replacement | None]:
        plan = plan_policy(timer.fire_at_ms, now_ms, spec)
        replacement = Replacement(fire_at_ms=plan.next_ms, delivery_id=plan.next_occurrence_id)
        skipped = {
            "skipped": plan.skipped_count,
            "skipped_first_ms": plan.skipped_first_ms,
            "skipped_last_ms": plan.skipped_last_ms,
        }
        if plan.fire_ms is None or plan.occurrence_id is None:
            reason = f"{plan.skipped_count} occurrence(s) older than the catch-up window were skipped"
            return Skip(reason=reason, skipped=plan.skipped_count), replacement
        payload = {"schedule": plan.schedule_id, "overlap": str(spec.get("overlap", Overlap.SKIP)), **skipped}
        return Occurrence(
            occurrence_ms=plan.fire_ms, delivery_id=plan.occurrence_id, payload=payload
        ), replacement

    return policy


@hookimpl
def loom_recurrence_policies() -> Mapping[str, RecurrencePolicy]:
    return {"cron": _core_policy(cron_policy), "calendar": _core_policy(calendar_policy)}


def schedule_handler(event: Event, scope: str, work: Work | None, route: Any) -> Decision:
    """Route handler ``schedule``: one standing Work per schedule, with the overlap policy.

    An occurrence for a schedule whose previous run is still going is delivered (allow all),
    delivered as the one buffered run (buffer one), or dropped (skip). A delivered occurrence gets
    the route's active-event policy; with ``queue`` it waits, and the next attempt takes every
    waiting occurrence as its input.
    """
    schedule_id = event.payload.get("schedule")
    if not isinstance(schedule_id, str):
        return Unmatched(reason="not a schedule occurrence (no schedule in its payload)")
    overlap = _to_overlap(event.payload.get("overlap", Overlap.SKIP))
    running = 1 if work is not None and work.current_execution_id is not None else 0
    # A running attempt's inputs stay pending until it ends, and the snapshot does not say which
    # they are: count the one occurrence it started with as taken, the rest as buffered.
    pending = len(work.pending_inputs) if work is not None else 0
    buffered = max(pending - running, 0)
    action = _overlap_action(overlap, running, buffered)
    if action is OverlapAction.SKIP:
        return Drop(reason=f"schedule {schedule_id}: the previous run is still going (overlap {overlap})")
    key = schedule_key(schedule_id)
    if work is not None:
        return Deliver(work_id=work.id, attach_keys=(key,))
    return Deliver(
        work_id=stable_id("wk", scope, key), create=True, attach_keys=(key,), kind=route.route.work_kind
    )


@hookimpl
def loom_route_handlers() -> Mapping[str, Any]:
    return {"schedule": schedule_handler}


def schedule_key(schedule_id: str) -> str:
    """The key of a schedule's Work; its occurrences carry it, so the router hands the handler that
    Work's snapshot (and routes one schedule's occurrences in order)."""
    return f"schedule/{schedule_id}"


def schedule_timer(
    spec: ScheduleSpec,
    *,
    now_ms: int,
    source: str,
    type: str,
    scope: str,
    payload: Mapping[str, Any] | None = None,
) -> TimerSpec:
    """A root recurrence timer for ``spec``, armed for its next occurrence after ``now_ms``."""
    first = next_occurrence(spec, now_ms)
    return TimerSpec(
        id=f"schedule:{spec.schedule_id}", fire_at_ms=first, source=source, type=type, scope=scope,
        key=schedule_key(spec.schedule_id), payload=dict(payload or {}), delivery_id=spec.schedule_id,
        recurrence=spec.kind, spec=spec.to_mapping(),
    )  # fmt: skip
