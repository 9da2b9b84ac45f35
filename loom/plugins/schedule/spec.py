"""`ScheduleSpec`: a validated recurring schedule, and the opaque mapping a recurring timer stores.

Every bad field raises `InvalidRequest` naming the field and the reason, both when a schedule is
built and when core hands a stored spec back to the policy, so a spec that is accepted means one
thing and a stored spec that no longer does is refused loudly rather than read differently.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs

from ...records.errors import InvalidRequest
from ...records.validation import MAX_ID_LEN, check_text
from .calendar import Calendar
from .cron import SecondsField, parse_cron
from .cron_fields import YEAR, spell
from .instants import HOUR_MS, DstFold, DstGap, forward, to_ms

DEFAULT_CATCH_UP_MS = 6 * HOUR_MS

_DAY = timedelta(days=1)


class Overlap(enum.StrEnum):
    """What an occurrence due while the previous run is still going does."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW_ALL = "allow_all"


_E = TypeVar("_E", bound=enum.StrEnum)


def enum_value(cls: type[_E], field: str, value: object) -> _E:
    """``value`` as a member of ``cls``, or `InvalidRequest` naming ``ScheduleSpec.<field>``."""
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    choices = ", ".join(member.value for member in cls)
    raise InvalidRequest(f"ScheduleSpec.{field}: must be one of {choices}; got {value!r}")


def _to_seconds(value: object) -> SecondsField | None:
    return None if value is None else enum_value(SecondsField, "seconds", value)


def _to_dst_gap(value: object) -> DstGap:
    return enum_value(DstGap, "dst_gap", value)


def _to_dst_fold(value: object) -> DstFold:
    return enum_value(DstFold, "dst_fold", value)


def to_overlap(value: object) -> Overlap:
    """An overlap policy from its name (`InvalidRequest` naming ``ScheduleSpec.overlap`` if unknown)."""
    return enum_value(Overlap, "overlap", value)


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
    # it becomes each occurrence's delivery identity, ``{schedule_id}@{occurrence_ms}``: text an Event
    # may carry, with room for the ``@`` and up to 20 digits
    check_text("ScheduleSpec.schedule_id", value, max_len=MAX_ID_LEN - 21)


def _check_timezone(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"ScheduleSpec.timezone: must be an IANA time zone name, got {value!r}")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # (a directory of zones, a name too long)
        raise InvalidRequest(f"ScheduleSpec.timezone: unknown IANA time zone {value!r}") from None


def _check_catch_up(_: object, __: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidRequest(f"ScheduleSpec.catch_up_ms: must be a positive integer, got {value!r}")


def _check_cron(_: object, __: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise InvalidRequest(f"ScheduleSpec.cron: must be a cron expression string, got {value!r}")


@attrs.frozen(kw_only=True)
class ScheduleSpec:
    """A validated recurring schedule; bad fields raise `InvalidRequest` naming the field."""

    schedule_id: str = attrs.field(validator=_check_schedule_id)
    cron: str | None = attrs.field(default=None, validator=_check_cron)
    seconds: SecondsField | None = attrs.field(default=None, converter=_to_seconds)
    """Where a six- or seven-field ``cron`` has its seconds (see `SecondsField`); unset for five fields."""
    calendar: Calendar | None = attrs.field(default=None, converter=_to_calendar)
    timezone: str = attrs.field(default="UTC", validator=_check_timezone)
    dst_gap: DstGap = attrs.field(default=DstGap.SHIFT_FORWARD, converter=_to_dst_gap)
    dst_fold: DstFold = attrs.field(default=DstFold.FIRST, converter=_to_dst_fold)
    catch_up_ms: int = attrs.field(default=DEFAULT_CATCH_UP_MS, validator=_check_catch_up)
    overlap: Overlap = attrs.field(default=Overlap.SKIP, converter=to_overlap)

    def __attrs_post_init__(self) -> None:
        if (self.cron is None) == (self.calendar is None):
            raise InvalidRequest("ScheduleSpec.cron, ScheduleSpec.calendar: give exactly one of them")
        if self.cron is None and self.seconds is not None:
            raise InvalidRequest("ScheduleSpec.seconds: only a cron expression has a seconds field")
        # Whether the schedule ever occurs is judged from the schedule itself: search from where its
        # first occurrence can be (the start of the first year a cron expression names), over its
        # whole span, in its time zone and DST policy.
        expression = parse_cron(self.cron, self.seconds) if self.cron else None
        start = expression.search_start() if expression else datetime(1970, 1, 1)
        first_wall = next(self.walls(start, reverse=False), None)
        if first_wall is None:  # no local time at all: the time zone and DST play no part
            years = expression.years if expression else None
            why = (
                f"the years it allows ({spell(YEAR, years)}) hold no date it names"
                if years
                else "no date it names exists"
            )
            raise InvalidRequest(
                f"ScheduleSpec.{self.kind}: schedule {self.schedule_id!r} never occurs: {why}"
            )
        # Any instant a day before the first wall's date comes before it, whatever the zone's offset.
        day_before = to_ms(datetime.combine(first_wall.date(), datetime.min.time(), UTC) - _DAY)
        if next(forward(self, day_before), None) is None:
            raise InvalidRequest(
                f"ScheduleSpec.{self.kind}: schedule {self.schedule_id!r} never occurs "
                f"(in time zone {self.timezone}, with dst_gap {self.dst_gap})"
            )

    @property
    def kind(self) -> str:
        """The recurrence policy kind: ``"cron"`` or ``"calendar"``."""
        return "cron" if self.cron is not None else "calendar"

    def walls(self, start: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Local wall times after ``start`` (before it when ``reverse``), in order."""
        if self.cron is not None:
            return parse_cron(self.cron, self.seconds).walls(start, reverse=reverse)
        assert self.calendar is not None
        return self.calendar.walls(start, reverse=reverse)

    def to_mapping(self) -> dict[str, Any]:
        """The JSON-safe mapping `spec_from_mapping` reads back (what a recurring timer stores)."""
        out: dict[str, Any] = {"schedule_id": self.schedule_id}
        if self.cron is not None:
            out["cron"] = self.cron
        if self.seconds is not None:
            out["seconds"] = self.seconds.value
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
