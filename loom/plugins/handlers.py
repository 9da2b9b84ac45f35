"""Built-in route handlers: correlate by key (creating Work when the route says so),
explicit Work id, and fresh Work for an uncorrelated Event.

Handlers are deterministic over detached snapshots and never do I/O. They are
registered like any third-party plugin, through ``loom_route_handlers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import EffectiveRoute
from ..records.events import Event
from ..records.ids import stable_id
from ..records.work import Decision, Deliver, Unmatched, Work
from ._manager import hookimpl


def work_id_for_key(scope: str, key: str) -> str:
    """The stable proposed id of a Work created for ``key`` (the same on every re-evaluation)."""
    return stable_id("wk", scope, key)


def work_id_for_event(event_id: str) -> str:
    """The stable proposed id of fresh Work created for one uncorrelated Event."""
    return stable_id("wk", "event", event_id)


def _keys(event: Event, route: EffectiveRoute) -> tuple[str, ...]:
    """The Event's key plus any extra keys named by the route's ``keys_field`` payload entry."""
    keys = [event.key] if event.key else []
    field = route.route.config.get("keys_field")
    if isinstance(field, str):
        extra = event.payload.get(field)
        if isinstance(extra, list):
            keys.extend(k for k in extra if isinstance(k, str) and k and k not in keys)
    return tuple(keys)


def correlate(event: Event, scope: str, work: Work | None, route: EffectiveRoute) -> Decision:
    """Deliver to the Work that owns the key (or that the Event names); create it if the route says so."""
    keys = _keys(event, route)
    if work is not None:
        return Deliver(work_id=work.id, attach_keys=keys)
    if event.work_id is not None:
        return Deliver(work_id=event.work_id, attach_keys=keys)
    if event.key is None:
        return Unmatched(reason=f"route {route.name!r}: an uncorrelated event has no key to correlate")
    if not route.route.create_work:
        return Unmatched(
            reason=f"route {route.name!r}: no work owns key {event.key!r} and the route creates none"
        )
    return Deliver(
        work_id=work_id_for_key(scope, event.key), create=True, attach_keys=keys, kind=route.route.work_kind
    )


def explicit_work(event: Event, scope: str, work: Work | None, route: EffectiveRoute) -> Decision:
    """Deliver only to the Work the Event names explicitly."""
    if event.work_id is None:
        return Unmatched(reason=f"route {route.name!r}: the event names no work")
    return Deliver(work_id=event.work_id, attach_keys=_keys(event, route))


def fresh(event: Event, scope: str, work: Work | None, route: EffectiveRoute) -> Decision:
    """Create fresh Work for this Event, with an id stable across replays (or join the named Work)."""
    if work is not None:
        return Deliver(work_id=work.id, attach_keys=_keys(event, route))
    return Deliver(
        work_id=work_id_for_event(event.id),
        create=True,
        attach_keys=_keys(event, route),
        kind=route.route.work_kind,
    )


# pure functions of their arguments: loom may decide them inside the routing transaction, in batches
correlate.pure = True  # type: ignore[attr-defined]
explicit_work.pure = True  # type: ignore[attr-defined]
fresh.pure = True  # type: ignore[attr-defined]


@hookimpl
def loom_route_handlers() -> Mapping[str, Any]:
    return {"correlate": correlate, "explicit_work": explicit_work, "fresh": fresh}
