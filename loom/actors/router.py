"""The router pool and its per-Work routers (DESIGN section 4; seed 003 "Routing and ownership").

Accepted Events reach a router lane by their explicit Work, their key, or themselves. A
lane routes its Events one at a time in acceptance order: it reads detached snapshots,
runs the first matching route's handler outside any transaction (awaiting it if async),
and submits the decision to ``route_in_tx``, which revalidates revision and ownership.
Lanes are independent tasks, so a blocked handler delays only its own Work.

After routing, a Work's checker claims its next attempt (start gates first) and launches
it through the bound executor in a task of its own, renewing the lease until the
outcome is committed. Inject and interrupt intents are dispatched outside transactions.
"""

from __future__ import annotations

import heapq
import inspect
import logging
import secrets
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import pluggy
import trio

from .._clock import Clock
from .._config import Config, EffectiveRoute, effective_routes
from .._errors import Conflict, NotAccepting, StaleAuthority
from .._executor import Executor
from .._notices import EventAccepted, EventRouted, ExecutionFenced, IntentPending, WorkChanged
from .._records import Event
from .._work import Decision, Deliver, Drop, Failed, IntentKind, Lease, Outcome, Unmatched, Work
from ..kernel.executions import (
    Authority,
    BindingRef,
    ClaimRequest,
    DispatchResult,
    begin_dispatch_in_tx,
    binding_for_in_tx,
    claim_in_tx,
    claimable,
    complete_in_tx,
    finish_dispatch_in_tx,
    hold_in_tx,
    kind_policy,
)
from ..kernel.routing import (
    OutOfOrder,
    RouteRequest,
    decide_without_handler,
    first_match,
    record_handler_error_in_tx,
    route_batch_in_tx,
    route_in_tx,
    route_ref,
)
from ..store import Reader, StorageActor
from .toolbelt import RuntimeToolbelt

log = logging.getLogger("loom.router")

MAX_REEVALUATIONS = 100


def merged(results: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge hook results; pluggy calls the last registered first, so earlier plugins win last."""
    out: dict[str, Any] = {}
    for result in reversed(results):
        out.update(result or {})
    return out


def _barrier_in_tx(tx: object, now_ms: int) -> None:
    """A no-op procedure: its reply follows every earlier commit's notices."""


@attrs.define(eq=False)
class _Lane:
    queue: list[tuple[int, str]] = attrs.Factory(list)
    queued: dict[str, Event | None] = attrs.Factory(dict)
    """Queued event ids, with the Event itself when a notice carried it (saves a read)."""


class RouterPool:
    def __init__(
        self,
        *,
        storage: StorageActor,
        reader: Reader,
        config: Callable[[], Config],
        plugins: pluggy.PluginManager,
        clock: Clock,
        owner: str = "loom",
        lease_ms: int = 60_000,
    ) -> None:
        self._storage = storage
        self._reader = reader
        self._config = config
        self._clock = clock
        self.owner = owner
        self.lease_ms = lease_ms
        self.handlers: dict[str, Any] = merged(plugins.hook.loom_route_handlers())
        self.executors: dict[str, Executor] = merged(plugins.hook.loom_executors())
        self.start_gates: dict[str, Any] = merged(plugins.hook.loom_start_gates())
        self._lanes: dict[str, _Lane] = {}
        self._routes_cache: dict[str, tuple[EffectiveRoute, ...]] = {}
        self._routes_generation = -1
        self._checking: set[str] = set()
        self._dirty: set[str] = set()
        self._deferred: set[str] = set()
        """Works whose claim scope capacity refused: rechecked when some Work changes (a slot may be free)."""
        self._dispatching: set[str] = set()
        self._changes = 0
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._feed_pending = False
        self._busy = 0
        self._quiet = trio.Event()
        self.launched = 0

    # -- quiescence (for tests and orderly hosts) -------------------------------------

    def _enter(self) -> None:
        self._busy += 1

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            quiet, self._quiet = self._quiet, trio.Event()
            quiet.set()

    @property
    def idle(self) -> bool:
        """No routing, start check or dispatch in flight, and no unread commit notice."""
        return self._busy == 0 and not self._feed_pending

    async def wait_idle(self) -> None:
        """Return once the pool is idle (running executions and clock sleeps do not count)."""
        while True:
            while not self.idle:
                await self._quiet.wait()
            # A commit's notices are handed straight to the waiting feed reader, which has not
            # run yet, so the pool can look idle with a notice in flight. Once a round trip
            # through storage returns, every earlier commit's notices have been taken.
            await self._storage.submit(_barrier_in_tx)
            if self.idle:
                return

    # -- the actor ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[RouterPool] = trio.TASK_STATUS_IGNORED) -> None:
        feed = self._storage.feed()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._resync()
                task_status.started(self)
                while True:
                    self._feed_pending = feed.pending
                    if not self._feed_pending and self._busy == 0:
                        self._enter()
                        self._leave()
                    notices = await feed.next_batch()
                    self._feed_pending = True
                    self._enter()
                    try:
                        if not notices:
                            await self._resync()
                            continue
                        quick: list[RouteRequest] = []
                        for notice in notices:
                            self._on_notice(notice, quick)
                        if quick:
                            self._spawn(self._route_quick, quick)
                    finally:
                        self._leave()
        except trio.EndOfChannel:
            return  # the storage actor stopped: the runtime is going down
        finally:
            self._storage.unsubscribe(feed)

    def _on_notice(self, notice: object, quick: list[RouteRequest] | None = None) -> None:
        if isinstance(notice, EventAccepted):
            event = notice.event
            request = self._without_handler(event)
            if request is not None and quick is not None:
                quick.append(request)
            else:
                self._enqueue(event.id, event.seq, event.work_id, event.key, event)
        elif isinstance(notice, EventRouted):
            self._signal_change()  # an earlier Event a lane or a completion waits on may be settled
        elif isinstance(notice, WorkChanged):
            self._signal_change()
            self.kick(notice.work_id)
            deferred, self._deferred = self._deferred, set()
            for work_id in deferred:
                self.kick(work_id)
        elif isinstance(notice, IntentPending):
            self._spawn_dispatch(notice.intent_id)
        elif isinstance(notice, ExecutionFenced):
            self._spawn(self._stop_fenced, notice)

    def _signal_change(self) -> None:
        self._changes += 1
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start a task that counts as busy until it returns (or marks itself quiet)."""
        assert self._nursery is not None
        self._enter()

        async def counted() -> None:
            try:
                await fn(*args)
            finally:
                self._leave()

        self._nursery.start_soon(counted)

    async def _resync(self) -> None:
        """Rebuild in-memory work lists from the store (at start, and after a lagging feed)."""
        after = 0
        while batch := await self._reader.unrouted_events(after, 1000):
            for event in batch:
                self._enqueue(event.id, event.seq, event.work_id, event.key)
            after = batch[-1].seq
        last = ""
        while works := await self._reader.works(state="ready", after_id=last, limit=500):
            for work in works:
                self.kick(work.id)
            last = works[-1].id
        for intent in await self._reader.open_intents(None, 10_000):
            self._spawn_dispatch(intent.id)

    # -- routing lanes --------------------------------------------------------------

    def _routes(self, config: Config, scope: str) -> tuple[EffectiveRoute, ...]:
        """Effective routes of a scope, cached per config generation."""
        if self._routes_generation != config.generation:
            self._routes_cache.clear()
            self._routes_generation = config.generation
        routes = self._routes_cache.get(scope)
        if routes is None:
            routes = self._routes_cache[scope] = effective_routes(config, scope)
        return routes

    def _without_handler(self, event: Event) -> RouteRequest | None:
        """The decision for an Event whose first match needs no handler (no match, or a drop route).

        Such decisions depend on no Work snapshot, so a whole notice batch of them is applied
        in one storage request instead of a router task each.
        """
        config = self._config()
        decided = decide_without_handler(
            config, first_match(self._routes(config, event.scope), event.type), event
        )
        if decided is None:
            return None
        decision, ref = decided
        return RouteRequest(event_id=event.id, decision=decision, route=ref, expected_revision=None,
                            generation=config.generation)  # fmt: skip

    async def _route_quick(self, requests: list[RouteRequest]) -> None:
        limits = self._config().causal
        failed = await self._storage.submit(route_batch_in_tx, requests, limits)
        for event_id in failed:
            self._enqueue(event_id, 0, None, None)

    def _enqueue(
        self, event_id: str, seq: int, work_id: str | None, key: str | None, event: Event | None = None
    ) -> None:
        lane_id = f"w:{work_id}" if work_id else f"k:{key}" if key else f"e:{event_id}"
        lane = self._lanes.get(lane_id)
        if lane is None:
            lane = self._lanes[lane_id] = _Lane()
            self._spawn(self._run_lane, lane_id, lane)
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

    async def _snapshot(self, event: Event) -> Work | None:
        if event.work_id is not None:
            return await self._reader.work(event.work_id)
        if event.key is not None:
            owner = await self._reader.key_owner(event.key)
            return await self._reader.work(owner) if owner else None
        return None

    async def route(self, event_id: str, event: Event | None = None) -> None:
        """Route one Event: evaluate outside the transaction, apply with a revision check.

        ``event`` is the accepted Event when a notice carried it; a committed checkpoint makes
        the apply a replay, so the first pass reads nothing it does not need.
        """
        for attempt in range(MAX_REEVALUATIONS):
            if event is None or attempt > 0:
                if await self._reader.checkpoint(event_id) is not None:
                    return
                event = await self._reader.event(event_id)
                if event is None:
                    return
            config = self._config()
            match = first_match(self._routes(config, event.scope), event.type)
            decision: Decision
            work: Work | None = None
            if (decided := decide_without_handler(config, match, event)) is not None:
                decision, ref = decided
            else:
                assert match is not None
                ref = route_ref(config, match)
                work = await self._snapshot(event)
                evaluated = await self._evaluate(event, work, match)
                if isinstance(evaluated, str):
                    await self._storage.submit(
                        record_handler_error_in_tx, event.id, ref, evaluated, config.generation
                    )
                    return
                decision = evaluated
            changes = self._changes
            request = RouteRequest(
                event_id=event.id, decision=decision, route=ref,
                expected_revision=work.revision if work else None, generation=config.generation,
            )  # fmt: skip
            try:
                await self._storage.submit(route_in_tx, request, config.causal)
                return
            except OutOfOrder:
                await self._wait_change(changes)
            except Conflict:
                pass
        log.warning("event %s: routing gave up after %d re-evaluations", event_id, MAX_REEVALUATIONS)

    async def _wait_change(self, changes: int) -> None:
        """Wait (not busy) until some Work changed after ``changes`` was read."""
        if self._changes != changes:
            return
        self._leave()
        try:
            await self._changed.wait()
        finally:
            self._enter()

    async def _evaluate(self, event: Event, work: Work | None, route: EffectiveRoute) -> Decision | str:
        """Run a handler (sync or async); a string is the error that stops routing."""
        handler = self.handlers.get(route.route.handler)
        if handler is None:
            return f"no route handler named {route.route.handler!r} is registered"
        try:
            decision = handler(event, event.scope, work, route)
            if inspect.isawaitable(decision):
                decision = await decision
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        if not isinstance(decision, (Deliver, Drop, Unmatched)):
            return f"returned {type(decision).__name__}, not a Deliver, Drop or Unmatched decision"
        return decision

    # -- starting attempts ----------------------------------------------------------

    def kick(self, work_id: str) -> None:
        """Check whether ``work_id`` can start an attempt (coalesced: one checker per Work)."""
        if work_id in self._checking:
            self._dirty.add(work_id)
            return
        self._checking.add(work_id)
        self._spawn(self._check_work, work_id)

    async def _check_work(self, work_id: str) -> None:
        try:
            while True:
                self._dirty.discard(work_id)
                await self._maybe_start(work_id)
                if work_id not in self._dirty:
                    return
        finally:
            self._checking.discard(work_id)

    def advertised(self) -> dict[str, frozenset[str]]:
        """Executor name -> the capabilities it advertises now."""
        return {
            name: frozenset(str(c) for c in getattr(e, "capabilities", ()))
            for name, e in self.executors.items()
        }

    async def binding_for(self, work: Work, config: Config) -> BindingRef | None:
        return await self._storage.submit(binding_for_in_tx, work.id, config, self.advertised())

    async def _maybe_start(self, work_id: str) -> None:
        work = await self._reader.work(work_id)
        if work is None or claimable(work) is not None:
            return
        config = self._config()
        binding = await self.binding_for(work, config)
        if binding is None or binding.executor not in self.executors:
            return
        if not work.started and not work.released:
            reason = await self._gate(work)
            if reason is not None:
                try:
                    await self._storage.submit(hold_in_tx, work.id, reason)
                except Conflict:
                    pass
                return
        capacity = config.scopes[work.scope].capacity if work.scope in config.scopes else None
        request = ClaimRequest(
            work_id=work.id, owner=self.owner, token=secrets.token_urlsafe(24), lease_ms=self.lease_ms,
            binding=binding, kind=(kind := kind_policy(config, work.kind)), capacity=capacity,
            generation=config.generation, timeout_ms=kind.timeout_ms,
        )  # fmt: skip
        try:
            lease = await self._storage.submit(claim_in_tx, request)
        except Conflict:
            if capacity is not None:
                self._deferred.add(work.id)
            return
        self._spawn(self._run_execution, lease, self.executors[binding.executor], config)

    async def _gate(self, work: Work) -> str | None:
        """Ask the start gates (outside any transaction) whether to hold a first start."""
        for name, gate in sorted(self.start_gates.items()):
            reason = gate(work)
            if inspect.isawaitable(reason):
                reason = await reason
            if reason:
                return f"start gate {name}: {reason}"
        return None

    async def _run_execution(self, lease: Lease, executor: Executor, config: Config) -> None:
        """Hold and renew the lease from the claim through launch to the committed outcome."""
        self.launched += 1
        toolbelt = RuntimeToolbelt(self._storage, lease, limits=config.causal, generation=config.generation,
                                   lease_ms=self.lease_ms)  # fmt: skip
        outcome: Outcome
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew, toolbelt, executor)  # not counted: it sleeps on the clock
            self._leave()  # a running execution is not routing work in flight
            try:
                outcome = await executor.launch(lease.request, toolbelt)
            except Exception as exc:
                outcome = Failed(error=f"executor raised {type(exc).__name__}: {exc}")
            finally:
                self._enter()
            nursery.cancel_scope.cancel()
        kind = kind_policy(config, lease.request.kind)
        for _ in range(MAX_REEVALUATIONS):
            changes = self._changes
            try:
                await self._storage.submit(complete_in_tx, Authority.of(toolbelt.lease), outcome, kind)
                return
            except StaleAuthority as exc:
                log.info("execution %s ended without authority: %s", lease.execution_id, exc)
                return
            except Conflict:
                # unrouted input for this Work: wait for routing to settle, then retry
                await self._wait_change(changes)

    async def _renew(self, toolbelt: RuntimeToolbelt, executor: Executor) -> None:
        while True:
            lease = toolbelt.lease
            await self._clock.sleep_until(lease.expires_at_ms - self.lease_ms * 2 // 3)
            try:
                await toolbelt.heartbeat()
            except StaleAuthority:
                # losing the lease stops the launch
                await executor.interrupt(lease.execution_id)
                return

    # -- intents --------------------------------------------------------------------

    def _spawn_dispatch(self, intent_id: str) -> None:
        if intent_id not in self._dispatching:
            self._dispatching.add(intent_id)
            self._spawn(self._dispatch, intent_id)

    async def _dispatch(self, intent_id: str) -> None:
        """Dispatch one intent; an ambiguous answer is retried, when the kernel schedules it, with the
        same intent identity."""
        try:
            while True:
                dispatch = await self._storage.submit(begin_dispatch_in_tx, intent_id)
                if dispatch is None:
                    return
                executor = self.executors.get(dispatch.execution.executor or "")
                result = DispatchResult.AMBIGUOUS
                if executor is not None:
                    try:
                        if dispatch.intent.kind is IntentKind.INJECT:
                            await executor.inject(dispatch.execution.id, dispatch.event)
                        else:
                            await executor.interrupt(dispatch.execution.id)
                        result = DispatchResult.ACCEPTED
                    except NotAccepting:
                        result = DispatchResult.NOT_ACCEPTING
                    except Exception as exc:
                        log.warning("intent %s: ambiguous dispatch: %r", intent_id, exc)
                intent = await self._storage.submit(finish_dispatch_in_tx, intent_id, result)
                if result != DispatchResult.AMBIGUOUS or intent.next_attempt_ms is None:
                    return
                self._leave()
                try:
                    await self._clock.sleep_until(intent.next_attempt_ms)
                finally:
                    self._enter()
        finally:
            self._dispatching.discard(intent_id)

    async def _stop_fenced(self, notice: ExecutionFenced) -> None:
        """Cleanup after a control fenced an attempt; it cannot restore authority."""
        execution = await self._reader.execution(notice.execution_id)
        executor = self.executors.get(execution.executor or "") if execution else None
        if executor is not None:
            try:
                await executor.interrupt(notice.execution_id)
            except Exception as exc:
                log.warning("execution %s: interrupt after cancel failed: %r", notice.execution_id, exc)
