"""Route resolution: pure decisions over configuration, with no transaction (first match, no broadcast; a drop route or no match needs no handler).

`routing.route_in_tx` applies what these decide; the router actor calls them outside any transaction.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import attrs

from ..config import Config, EffectiveRoute
from ..records.errors import InvalidRequest
from ..records.events import Event, EventIn
from ..records.validation import MAX_REASON_LEN, check_keys, check_text
from ..records.work import Decision, Deliver, Drop, Policy, Unmatched, Work


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
    error_fallback: Policy | None = None
    """What an inject falls back to when its dispatch stays ambiguous (``None``: the input stays pending)."""


@attrs.frozen(kw_only=True)
class RouteRequest:
    event_id: str
    decision: Decision
    route: RouteRef | None
    expected_revision: int | None
    """The revision of the Work the handler saw (``None``: it saw no Work)."""
    generation: int
    from_handler: bool = True
    """The decision is a handler's, made over a Work snapshot: whatever it decided (deliver, drop or
    no match), it applies only if that Work is still at ``expected_revision``. Decisions made without
    a handler (no route matched, a drop route) depend on no snapshot."""


@attrs.frozen(kw_only=True)
class DeferredRoute:
    """A route whose handler is pure (`is_pure_handler`): decided inside the routing transaction, over the
    Work as it is there (`routing.decide_in_tx`), so a batch of Events for one Work routes in one commit.
    The decision is checked as a handler's and applies exactly as one made outside would."""

    event_id: str
    decide: Callable[[Event, Work | None], object]
    """The handler bound to its route: the Event and the Work it selects -> a decision."""
    route: RouteRef
    generation: int


@attrs.frozen(kw_only=True)
class RoutePlan:
    """How Events of one scope and type route outside their lane: with a decision that needs no handler
    (``decision``), or by a pure handler decided in the routing transaction (``decide``)."""

    decision: Decision | None = None
    decide: Callable[[Event, Work | None], object] | None = None
    route: RouteRef | None = None
    generation: int

    def request(self, event_id: str) -> RouteRequest | DeferredRoute:
        """The routing request of one such Event."""
        if self.decide is not None and self.route is not None:
            return DeferredRoute(
                event_id=event_id, decide=self.decide, route=self.route, generation=self.generation
            )
        assert self.decision is not None
        return RouteRequest(
            event_id=event_id,
            decision=self.decision,
            route=self.route,
            expected_revision=None,
            generation=self.generation,
            from_handler=False,
        )


def is_pure_handler(handler: object) -> bool:
    """A handler that declares itself a pure function of its arguments (``handler.pure = True``: no I/O,
    deterministic, synchronous), as loom's built-in handlers do: loom may decide it inside the routing
    transaction (docs/plugins.md, "Route handlers")."""
    return getattr(handler, "pure", False) is True and not inspect.iscoroutinefunction(handler)


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
        error_fallback=route.route.error_fallback,
    )


def decide_without_handler(
    config: Config, route: EffectiveRoute | None, event: Event | EventIn
) -> tuple[Decision, RouteRef | None] | None:
    """The decision when the first match needs no handler: no match (unmatched) or a drop route.

    ``None``: the route's handler decides. Such decisions depend on no Work snapshot.
    """
    if route is None:
        return Unmatched(reason="no route matched"), None
    if route.route.policy is Policy.DROP:  # (declared: a drop a fallback chose drops for running Work)
        reason = route.route.reason or f"route {route.name!r} drops {event.type}"
        return Drop(reason=reason), route_ref(config, route)
    return None


def check_decision(decision: object) -> Decision:
    """A route handler's answer, checked before it is applied: a `Deliver` names a well-formed Work id,
    well-formed keys and kind; a `Drop` or `Unmatched` gives a reason. `InvalidRequest` names the
    problem (the router records it as the handler's error)."""
    if isinstance(decision, Deliver):
        check_text("Deliver.work_id", decision.work_id)
        if not isinstance(decision.create, bool):
            raise InvalidRequest(f"Deliver.create must be true or false, got {decision.create!r}")
        check_keys("Deliver.attach_keys", decision.attach_keys)
        check_text("Deliver.kind", decision.kind, optional=True)
        return decision
    if isinstance(decision, Drop | Unmatched):
        check_text(f"{type(decision).__name__}.reason", decision.reason, max_len=MAX_REASON_LEN, strip=False)
        return decision
    raise InvalidRequest(f"answered {type(decision).__name__}, not a Deliver, Drop or Unmatched decision")
