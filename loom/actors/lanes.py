"""Routing lanes: each accepted Event is routed in its lane, one at a time, in acceptance order.

Events reach a lane by their explicit Work, their key, or themselves. A lane reads detached snapshots,
runs the first matching route's handler outside any transaction (awaiting it if async) and submits the
decision to ``route_in_tx``, which revalidates revision and ownership. Lanes are independent tasks, so
a blocked handler delays only its own Work. Events whose first match needs no handler (no match, a
drop route) are decided from the notice alone, a whole notice batch per storage request.
"""

from __future__ import annotations

import heapq
import inspect
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import attrs

from ..config import Config, EffectiveRoute, effective_routes
from ..kernel.chains import route_batch_then_start_in_tx, route_then_start_in_tx
from ..kernel.resolve import (
    DeferredRoute,
    RoutePlan,
    RouteRef,
    RouteRequest,
    check_decision,
    decide_without_handler,
    first_match,
    is_pure_handler,
    route_ref,
)
from ..kernel.route_records import record_handler_error_in_tx, record_routing_failure_in_tx
from ..kernel.routing import OutOfOrder, route_in_tx
from ..kernel.unrouted import unrouted_in_tx
from ..records.errors import Conflict, InvalidRequest, StorageError
from ..records.events import Event, EventIn
from ..records.work import Decision, Work
from .shared import Shared
from .starter import LaunchHook, admit_request
from .supervision import describe

log = logging.getLogger("loom.router")


def _decide(handler: Callable[..., object], route: EffectiveRoute, event: Event, work: Work | None) -> object:
    return handler(event, event.scope, work, route)


MAX_REEVALUATIONS = 100
RESYNC_PAGE = 1000
MAX_PLANS = 4096
"""Routing plans kept per (scope, Event type) for a configuration generation, at most."""


@attrs.define(eq=False)
class _Lane:
    queue: list[tuple[int, str]] = attrs.Factory(list)
    queued: dict[str, Event | None] = attrs.Factory(dict)
    """Queued event ids, with the Event itself when a notice carried it (saves a read)."""


def routes_by_checkpoint_alone(event: Event | EventIn, plan: RoutePlan | None) -> bool:
    """Whether routing ``event`` by ``plan`` writes its checkpoint and nothing else: no key and no
    explicit Work (no wait, subscription or Work to look at) and a decision that needs no handler (no
    route, a drop route). What a commit holding a shared database's order lock may route."""
    return plan is not None and plan.decision is not None and event.key is None and event.work_id is None


@attrs.frozen
class Planner:
    """How an Event routes outside its lane under one configuration (`RoutingLanes.plan`): a pure
    function of the configuration and the registered handlers."""

    config: Config
    handlers: Mapping[str, Any]
    checkpoint_only: bool = False
    """Plan only an Event whose routing is its checkpoint alone (`routes_by_checkpoint_alone`)."""

    def __call__(self, event: Event | EventIn) -> RoutePlan | None:
        plan = self._plan(event)
        if self.checkpoint_only and not routes_by_checkpoint_alone(event, plan):
            return None
        return plan

    def _plan(self, event: Event | EventIn) -> RoutePlan | None:
        config = self.config
        match = first_match(effective_routes(config, event.scope), event.type)
        decided = decide_without_handler(config, match, event)
        if decided is not None:
            decision, ref = decided
            return RoutePlan(decision=decision, route=ref, generation=config.generation)
        assert match is not None
        handler = self.handlers.get(match.route.handler)
        if handler is None or not is_pure_handler(handler):
            return None
        return RoutePlan(
            decide=partial(_decide, handler, match),
            route=route_ref(config, match),
            generation=config.generation,
        )


class RoutingLanes:
    def __init__(self, shared: Shared, launch: LaunchHook | None = None) -> None:
        """``launch``: the runtime's starter runs here, so an Event that makes its Work able to start
        at once starts it in its routing commit (`chains.route_then_start_in_tx`) and the new lease is
        launched through ``launch``; without it (a host's pass) the ready queue decides alone."""
        self._s = shared
        self._launch = launch
        self._lanes: dict[str, _Lane] = {}
        self._routes_cache: dict[str, tuple[EffectiveRoute, ...]] = {}
        self._routes_generation = -1
        self._plans: dict[tuple[str, str], RoutePlan | None] = {}
        self._plans_generation = -1

    def _routes(self, config: Config, scope: str) -> tuple[EffectiveRoute, ...]:
        """Effective routes of a scope, cached per config generation."""
        if self._routes_generation != config.generation:
            self._routes_cache.clear()
            self._routes_generation = config.generation
        routes = self._routes_cache.get(scope)
        if routes is None:
            routes = self._routes_cache[scope] = effective_routes(config, scope)
        return routes

    def plan(self, event: Event | EventIn) -> RoutePlan | None:
        """How an Event of this scope and type routes outside its lane, when its first match allows it:
        decided here when it needs no handler (no match, a drop route: no Work snapshot matters), or
        deferred to the routing transaction when its handler is pure (`is_pure_handler`), which decides
        it over the Work as the Events routed before it in that transaction left it. ``None``: its lane
        routes it alone (a handler that may do I/O or take its time runs outside any transaction)."""
        config = self._s.config()
        if self._plans_generation != config.generation or len(self._plans) >= MAX_PLANS:
            self._plans.clear()
            self._plans_generation = config.generation
        key = (event.scope, event.type)
        if key in self._plans:
            return self._plans[key]
        plan = self._plans[key] = self._plan(config, event)
        return plan

    def _plan(self, config: Config, event: Event | EventIn) -> RoutePlan | None:
        """`plan`, made (it depends on the Event's scope and type only)."""
        return Planner(config, self._s.extensions.handlers)(event)

    def planner(self, *, checkpoint_only: bool = False) -> Planner:
        """`plan` as a value of its own, over the configuration in force now: safe to call inside a
        storage procedure (it keeps nothing between calls)."""
        return Planner(self._s.config(), self._s.extensions.handlers, checkpoint_only)

    def quick(self, event: Event) -> RouteRequest | DeferredRoute | None:
        """The routing request of an accepted Event that routes in a batch (`plan`), or ``None``."""
        plan = self.plan(event)
        return plan.request(event.id) if plan is not None else None

    async def route_quick(self, events: list[Event], requests: list[RouteRequest | DeferredRoute]) -> None:
        """Route a notice batch's Events in one storage request (`chains.route_batch_then_start_in_tx`),
        launching the attempts it started; an Event it could not route goes to its lane."""
        limits = self._s.config().causal
        admit = admit_request(self._s) if self._launch is not None else None
        batch = await self._s.storage.submit(route_batch_then_start_in_tx, requests, limits, admit)
        if self._launch is not None:
            for lease in batch.started:
                self._launch(lease, lease.request.executor or "")
        if batch.retry:
            by_id = {event.id: event for event in events}
            for event_id in batch.retry:
                event = by_id[event_id]
                self.enqueue(event.id, event.seq, event.work_id, event.key, event)

    def enqueue(
        self, event_id: str, seq: int, work_id: str | None, key: str | None, event: Event | None = None
    ) -> None:
        lane_id = f"w:{work_id}" if work_id else f"k:{key}" if key else f"e:{event_id}"
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = _Lane()
            self._s.activity.spawn(self._run_lane, lane_id, lane)
        if event_id not in lane.queued:
            lane.queued[event_id] = event
            heapq.heappush(lane.queue, (seq, event_id))

    async def _run_lane(self, lane_id: str, lane: _Lane) -> None:
        try:
            while lane.queue:
                _, event_id = heapq.heappop(lane.queue)
                try:
                    await self.route(event_id, lane.queued.get(event_id))
                finally:
                    lane.queued.pop(event_id, None)
        finally:
            del self._lanes[lane_id]

    async def resync(self, accepted_before_ms: int | None = None) -> None:
        """Queue every Event still unrouted, read from the routing watermark (at start and after a
        lagging feed; at the periodic check of a shared database, only those accepted before
        ``accepted_before_ms``: younger ones are their own node's to route)."""
        after: int | None = None
        while batch := await self._s.storage.submit(unrouted_in_tx, RESYNC_PAGE, after):
            for event in batch:
                if accepted_before_ms is None or event.accepted_at_ms < accepted_before_ms:
                    self.enqueue(event.id, event.seq, event.work_id, event.key)
            if len(batch) < RESYNC_PAGE or accepted_before_ms is not None:
                return  # a check reads one page: the oldest unrouted Events, those that could be stuck
            after = batch[-1].seq

    async def route_pass(self, limit: int) -> int:
        """Route up to ``limit`` unrouted Events in acceptance order, one after another, none waiting
        for another (a host's bounded pass, `Runtime.poll`); return how many got their checkpoint."""
        routed = 0
        for event in await self._s.storage.submit(unrouted_in_tx, limit):
            if await self.route(event.id, event, wait=False):
                routed += 1
        return routed

    async def _snapshot(self, event: Event) -> Work | None:
        reader = self._s.reader
        if event.work_id is not None:
            return await reader.work(event.work_id)
        if event.key is not None:
            owner = await reader.key_owner(event.key)
            return await reader.work(owner) if owner else None
        return None

    async def route(self, event_id: str, event: Event | None = None, *, wait: bool = True) -> bool:
        """Route one Event: evaluate outside the transaction, apply with a revision check.

        ``event`` is the accepted Event when a notice carried it; a committed checkpoint makes
        the apply a replay, so the first pass reads nothing it does not need. An earlier unrouted
        Event of the same Work blocks it: with ``wait`` it waits until that one has its checkpoint,
        else it returns ``False`` at once (a bounded host pass tries again later).

        A handler that raises or answers nonsense, and an apply that fails, leave the Event unrouted
        with a diagnostic; so do `MAX_REEVALUATIONS` revision conflicts in a row. Only a storage
        failure propagates.
        """
        storage, reader, activity = self._s.storage, self._s.reader, self._s.activity
        conflicts = 0
        fresh = event is None
        while True:
            if fresh:
                if await reader.checkpoint(event_id) is not None:
                    return True
                event = await reader.event(event_id)
                if event is None:
                    return True
            assert event is not None
            fresh = True
            config = self._s.config()
            match = first_match(self._routes(config, event.scope), event.type)
            decision: Decision
            work: Work | None = None
            ref: RouteRef | None
            decided = decide_without_handler(config, match, event)
            if decided is not None:
                decision, ref = decided
            else:
                assert match is not None
                ref = route_ref(config, match)
                work = await self._snapshot(event)
                evaluated = await self._evaluate(event, work, match)
                if isinstance(evaluated, str):
                    await storage.submit(
                        record_handler_error_in_tx, event.id, ref, evaluated, config.generation
                    )
                    return True
                decision = evaluated
            request = RouteRequest(
                event_id=event.id,
                decision=decision,
                route=ref,
                expected_revision=work.revision if work else None,
                generation=config.generation,
                from_handler=decided is None,
            )
            try:
                if self._launch is None:
                    await storage.submit(route_in_tx, request, config.causal)
                else:
                    _, lease = await storage.submit(
                        route_then_start_in_tx, request, config.causal, admit_request(self._s)
                    )
                    if lease is not None:
                        self._launch(lease, lease.request.executor or "")
                return True
            except OutOfOrder as blocked:
                if not wait:
                    return False
                await activity.wait_routed(blocked.event_id, partial(self._is_routed, blocked.event_id))
            except StorageError:
                raise
            except Conflict as exc:
                conflicts += 1
                if conflicts >= MAX_REEVALUATIONS:
                    reason = f"{conflicts} revision conflicts in a row, the last: {exc}"
                    await self._failed(event, ref, config.generation, reason, None)
                    return True
            except Exception as exc:
                await self._failed(
                    event, ref, config.generation, f"applying the decision failed: {describe(exc)}", exc
                )
                return True

    async def _is_routed(self, event_id: str) -> bool:
        return await self._s.reader.checkpoint(event_id) is not None

    async def _failed(
        self, event: Event, ref: RouteRef | None, generation: int, reason: str, exc: BaseException | None
    ) -> None:
        """Leave the Event unrouted with a diagnostic (an operator can replay it)."""
        log.error(
            "event %s: %s", event.id, reason, exc_info=(type(exc), exc, exc.__traceback__) if exc else None
        )
        try:
            await self._s.storage.submit(record_routing_failure_in_tx, event.id, ref, reason, generation)
        except StorageError:
            raise
        except Exception:
            log.exception("event %s: could not record its routing failure; it stays unrouted", event.id)

    async def _evaluate(self, event: Event, work: Work | None, route: EffectiveRoute) -> Decision | str:
        """Run a handler (sync or async) and check its answer; a string is the error that stops routing
        (logged with its traceback)."""
        name = route.route.handler
        handler = self._s.extensions.handlers.get(name)
        if handler is None:
            return f"no route handler named {name!r} is registered"
        try:
            decision = handler(event, event.scope, work, route)
            if inspect.isawaitable(decision):
                decision = await decision
            return check_decision(decision)
        except InvalidRequest as exc:
            log.error(
                "route %r (handler %r) answered badly for event %s: %s", route.name, name, event.id, exc
            )
            return f"InvalidRequest: {exc}"
        except Exception as exc:
            log.exception("route %r (handler %r) raised for event %s", route.name, name, event.id)
            return describe(exc)
