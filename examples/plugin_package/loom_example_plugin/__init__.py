"""An example third-party loom plugin.

loom finds it through the ``loom`` entry-point group (see ``pyproject.toml``) and registers this
module exactly as it registers its built-in plugins: each ``@loom.hookimpl`` function here
contributes by name.

* Route handler ``triage``: correlates by key like the built-in ``correlate``, but opens new Work
  only for an Event whose ``priority`` reaches the route's ``min_priority`` (from the route's
  opaque ``config`` table); the others are dropped with a reason.
* Recurrence policy ``business_days``: a timer that fires at the same UTC time every Monday to
  Friday. Like every recurrence policy it is pure: what it answers depends only on the timer, the
  time and the spec, so a replayed firing gets the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import loom
from loom.config import EffectiveRoute

DAY_MS = 24 * 3600 * 1000


def triage(event: loom.Event, scope: str, work: loom.Work | None, route: EffectiveRoute) -> loom.Decision:
    """Correlate by key, but open new Work only for Events whose ``priority`` reaches the route's
    ``min_priority`` (its opaque ``config``); Events for existing Work are always delivered."""
    if event.key is None:
        return loom.Unmatched(reason=f"route {route.name!r}: the event has no key")
    if work is not None:
        return loom.Deliver(work_id=work.id, attach_keys=(event.key,))
    wanted = route.route.config.get("min_priority", 0)
    priority = event.payload.get("priority", 0)
    if not isinstance(priority, int) or priority < wanted:
        return loom.Drop(reason=f"priority {priority!r} is below {wanted}: no Work is opened for it")
    return loom.Deliver(
        work_id=f"triage-{event.key}", create=True, attach_keys=(event.key,), kind=route.route.work_kind
    )


def _next_business_day(ms: int, after_ms: int) -> int:
    """The first instant after ``after_ms`` at ``ms``'s time of day, on a Monday to Friday."""
    candidate = ms
    while candidate <= after_ms or datetime.fromtimestamp(candidate / 1000, UTC).weekday() >= 5:
        candidate += DAY_MS
    return candidate


def business_days(
    timer: loom.Timer, now_ms: int, spec: Mapping[str, Any]
) -> tuple[loom.Occurrence | loom.Skip, loom.Replacement | None]:
    """Fire the occurrence the timer was armed for, then re-arm it for the next business day."""
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise loom.InvalidRequest("business_days: spec.name must be a non-empty string")
    if datetime.fromtimestamp(timer.fire_at_ms / 1000, UTC).weekday() >= 5:
        raise loom.InvalidRequest("business_days: the first occurrence must fall on a Monday to Friday")
    fire_at = _next_business_day(timer.fire_at_ms, now_ms)
    occurrence = loom.Occurrence(
        occurrence_ms=timer.fire_at_ms,
        delivery_id=f"{name}@{timer.fire_at_ms}",
        payload={"name": name, "late_ms": now_ms - timer.fire_at_ms},
    )
    return occurrence, loom.Replacement(fire_at_ms=fire_at, delivery_id=f"{name}@{fire_at}")


@loom.hookimpl
def loom_route_handlers() -> Mapping[str, Any]:
    return {"triage": triage}


@loom.hookimpl
def loom_recurrence_policies() -> Mapping[str, Any]:
    return {"business_days": business_days}
