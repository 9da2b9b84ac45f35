"""Route resolution: pure decisions over configuration, with no transaction (seed 003, "Routing and
ownership": first match, no broadcast; a drop route or no match needs no handler).

`routing.route_in_tx` applies what these decide; the router actor calls them outside any transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..config import Config, EffectiveRoute
from ..records.events import Event
from ..records.work import Decision, Drop, Policy, Unmatched


@attrs.frozen(kw_only=True)
class RouteRef:
    """The route a decision came from, as pinned on its checkpoint."""

    name: str
    scope: str
    declared: Policy
    """The route's own policy."""
    policy: Policy
    """The effective policy for the binding the route resolved to (a fallback when it lacks the capability)."""
    fallback: Policy | None = None
    """The queue or drop fallback for an attempt pinned without the capability."""
    fallback_reason: str | None = None
    reopen: bool = False


@attrs.frozen(kw_only=True)
class RouteRequest:
    event_id: str
    decision: Decision
    route: RouteRef | None
    expected_revision: int | None
    """The revision of the Work the handler saw (``None``: it saw no Work)."""
    generation: int


def first_match(routes: Sequence[EffectiveRoute], event_type: str) -> EffectiveRoute | None:
    """The first route, in effective order, whose type filter passes: no broadcast."""
    return next((route for route in routes if route.matches(event_type)), None)


def route_ref(config: Config, route: EffectiveRoute) -> RouteRef:
    """What a checkpoint pins of the route a decision came from."""
    kind = config.work_kinds.get(route.route.work_kind or "")
    fallback = next((p for p in route.route.fallback if p in (Policy.QUEUE, Policy.DROP)), None)
    return RouteRef(
        name=route.name,
        scope=route.scope,
        declared=route.route.policy,
        policy=route.policy,
        fallback=fallback,
        fallback_reason=route.fallback_reason,
        reopen=bool(kind and kind.reopen),
    )


def decide_without_handler(
    config: Config, route: EffectiveRoute | None, event: Event
) -> tuple[Decision, RouteRef | None] | None:
    """The decision when the first match needs no handler: no match (unmatched) or a drop route.

    ``None``: the route's handler decides. Such decisions depend on no Work snapshot.
    """
    if route is None:
        return Unmatched(reason="no route matched"), None
    if route.policy is Policy.DROP:
        reason = route.route.reason or f"route {route.name!r} drops {event.type}"
        return Drop(reason=reason), route_ref(config, route)
    return None
