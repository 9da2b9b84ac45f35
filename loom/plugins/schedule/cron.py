"""Cron expressions: validation, and the local wall-clock times an expression names (via croniter)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta

from croniter import CroniterError, croniter

from ..._errors import InvalidRequest

# A schedule with no occurrence this far ahead of the instant asked about has none at all.
_HORIZON = timedelta(days=366 * 30)
_NONDETERMINISTIC_CRON_RE = re.compile(r"[RH](\(.*\))?(/\d+)?", re.IGNORECASE)


def check_cron(value: object) -> None:
    """Refuse what is not a deterministic cron expression croniter reads."""
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


def cron_walls(cron: str, start: datetime, *, reverse: bool) -> Iterator[datetime]:
    """Local wall times of ``cron`` after ``start`` (before it when ``reverse``), in order."""
    try:
        limit = start - _HORIZON if reverse else start + _HORIZON
    except OverflowError:
        limit = datetime.min if reverse else datetime.max
    it = croniter(cron, start)
    step = it.get_prev if reverse else it.get_next
    while True:
        try:
            wall: datetime = step(datetime)
        except (CroniterError, OverflowError, ValueError):
            return
        if (wall < limit) if reverse else (wall > limit):
            return
        yield wall
