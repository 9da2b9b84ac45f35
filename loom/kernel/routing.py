"""Routing: the atomic apply of a route decision (docs/concepts.md; docs/architecture.md).

Handlers run outside any transaction over detached snapshots (`resolve` holds the pure decisions);
`route_in_tx` revalidates ownership and revision and applies create/attach-keys, inputs, intents and
the route checkpoint together. No executor call happens here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ..config import CausalLimits
from ..records.core_events import BUDGET_EXCEEDED, BUDGET_WARNING, CORE_SOURCE, WORK_CREATED
from ..records.errors import Conflict, NotFound
from ..records.events import CausalRejection, DiagnosticKind, Event, EventIn
from ..records.ids import core_delivery_id, stable_id
from ..records.notices import EventRouted, IntentPending, WorkChanged
from ..records.work import (
    Capability,
    Checkpoint,
    CheckpointStatus,
    Decision,
    Deliver,
    Drop,
    Execution,
    ExecutionState,
    IntentKind,
    Policy,
    Unmatched,
    Work,
    WorkState,
    work_with,
)
from ..store import AdmissionFacts, QueuePlace, Tx
from ._common import new_work_id
from .accept import accept_derived_in_tx
from .checkpoints import control_checkpoint
from .intents import intent_id
from .resolve import DeferredRoute, RouteRef, RouteRequest, check_decision
from .route_records import RouteResult, resolved_work, route_checkpoint, unrouted
from .unrouted import earlier_unrouted
from .waits import wait_won_by, wake_on_key_in_tx

_GENERATION_SUFFIX = re.compile(r"/generation/reopen-\d+$")


class OutOfOrder(Conflict):
    """An earlier accepted Event for the same Work is still unrouted; route that one first.

    ``event_id`` names the earliest such Event: the caller waits until it has its checkpoint.
    """

    def __init__(self, message: str, *, event_id: str) -> None:
        super().__init__(message)
        self.event_id = event_id


class HandlerFailed(Conflict):
    """A pure handler raised inside the routing transaction: its lane asks it again outside, where the
    failure is recorded as any handler's."""


def successor_key(key: str, n: int) -> str:
    return f"{key}/generation/reopen-{n}"


def _base_key(key: str) -> str:
    """A successor's generation-qualified key without its generation (generations never nest)."""
    return _GENERATION_SUFFIX.sub("", key)


def route_in_tx(tx: Tx, now_ms: int, req: RouteRequest, limits: CausalLimits) -> RouteResult:
    """Apply one routing decision atomically, or return the committed checkpoint (replay).

    Whatever the decision (routed, unmatched, drop, terminal), every wait watching the Event's key then
    arbitrates again in the same transaction: an Event for a waiting Work is always seen by its wait.
    """
    check_decision(req.decision)
    found = tx.event_to_route(req.event_id)
    if found is None:
        raise NotFound(f"no event with id {req.event_id!r}")
    event, existing = found
    if existing is not None:
        return RouteResult(checkpoint=existing, replay=True)
    result = _route_in_tx(tx, now_ms, req, event, limits)
    wake_on_key_in_tx(tx, now_ms, event.key, limits)
    return result


def decide_in_tx(tx: Tx, req: DeferredRoute) -> RouteRequest | None:
    """The decision of a pure handler over the Work as it is in this transaction, as a handler's request
    at that Work's revision (``None``: the Event already has its checkpoint). Whatever the handler
    raises (as `HandlerFailed`) or answers badly propagates: the caller asks it again outside, where its
    error is recorded."""
    found = tx.event_to_route(req.event_id)
    if found is None:
        raise NotFound(f"no event with id {req.event_id!r}")
    event, existing = found
    if existing is not None:
        return None
    work = resolved_work(tx, event)
    try:
        answer = req.decide(event, work)
    except Exception as exc:
        # plugin code: whatever it raises (a database error of its own included) fails this Event's
        # batch routing only, never the storage batch it runs in
        raise HandlerFailed(f"event {event.id}: its pure handler raised {type(exc).__name__}: {exc}") from exc
    return RouteRequest(
        event_id=event.id,
        decision=check_decision(answer),
        route=req.route,
        expected_revision=work.revision if work else None,
        generation=req.generation,
    )


def _route_in_tx(tx: Tx, now_ms: int, req: RouteRequest, event: Event, limits: CausalLimits) -> RouteResult:
    decision = req.decision
    if req.from_handler and not isinstance(decision, Deliver):
        # a handler's drop or no-match was decided over the Work it saw: that Work must not have changed
        seen = resolved_work(tx, event)
        if (seen.revision if seen else None) != req.expected_revision:
            raise Conflict(f"event {event.id}: work changed since the handler ran (reread and re-evaluate)")
    if isinstance(decision, Unmatched):
        # no route passes it on, but it may win a wait (`route_in_tx` wakes it next): then it is its
        # Work's input, and the checkpoint says so instead of calling it unmatched
        wait = wait_won_by(tx, event)
        if wait is not None:
            cp = route_checkpoint(
                tx,
                now_ms,
                event,
                CheckpointStatus.ROUTED,
                req,
                work_id=wait.work_id,
                reason=f"no route matched it; it wins wait {wait.id}",
            )
            return RouteResult(checkpoint=cp)
        cp = route_checkpoint(tx, now_ms, event, CheckpointStatus.UNMATCHED, req, reason=decision.reason)
        return RouteResult(checkpoint=cp)
    target = _target(tx, event, decision)
    if isinstance(target, tuple):
        return unrouted(tx, now_ms, event, req, *target)
    work = target
    if isinstance(decision, Drop):
        # a drop depends on no Work state: it is associated with the target as of now
        cp = route_checkpoint(
            tx,
            now_ms,
            event,
            CheckpointStatus.DROP,
            req,
            work_id=work.id if work else None,
            reason=decision.reason,
        )
        return RouteResult(checkpoint=cp)
    assert isinstance(decision, Deliver)
    if work is not None and _own_budget_event(event, work.id):
        cp = route_checkpoint(
            tx,
            now_ms,
            event,
            CheckpointStatus.DROP,
            req,
            work_id=work.id,
            reason="a budget Event never becomes the input of the Work it counts",
        )
        return RouteResult(checkpoint=cp)
    if (work.revision if work else None) != req.expected_revision:
        raise Conflict(f"event {event.id}: work changed since the handler ran (reread and re-evaluate)")
    if work is not None:
        _check_order(tx, event, work.id, work.keys)
        if work.state.terminal:
            return _terminal(tx, now_ms, event, req, work, limits)
    # every ownership check happens before the first write, so an abort changes nothing
    owner_work_id = work.id if work else new_work_id(tx, decision.work_id)
    new_keys: list[str] = []
    for key in decision.attach_keys:
        owner = tx.key_owner(key)
        if owner is not None and owner != owner_work_id:
            return unrouted(
                tx, now_ms, event, req, DiagnosticKind.OWNED_BY_OTHER, f"key {key!r} is owned by work {owner}"
            )
        if owner is None and key not in new_keys:
            new_keys.append(key)
    created = work is None
    if work is None:
        work = tx.insert_work(
            id=owner_work_id,
            scope=event.scope,
            kind=decision.kind,
            parent_id=None,
            predecessor_id=None,
            generation=req.generation,
            now_ms=now_ms,
        )
    return _deliver(tx, now_ms, event, req, work, new_keys, created=created)


def _own_budget_event(event: Event, work_id: str) -> bool:
    return (
        event.source == CORE_SOURCE
        and event.type in (BUDGET_WARNING, BUDGET_EXCEEDED)
        and event.payload.get("work") == work_id
    )


def _check_order(tx: Tx, event: Event, work_id: str, keys: Sequence[str]) -> None:
    """Per-Work acceptance order: no Event is routed to a Work while an earlier one resolving to it is
    unrouted (`OutOfOrder` names the earliest)."""
    earlier = earlier_unrouted(tx, work_id, event.scope, keys, event.seq)
    if earlier:
        raise OutOfOrder(
            f"event {event.id} (seq {event.seq}) cannot be routed to work {work_id} before earlier "
            f"unrouted event {earlier[0].id} (seq {earlier[0].seq}): routing follows acceptance order",
            event_id=earlier[0].id,
        )


def _target(tx: Tx, event: Event, decision: Decision) -> Work | tuple[DiagnosticKind, str] | None:
    """The Work a decision selects (``None``: to be created or none), or a contradiction."""
    if isinstance(decision, Deliver):
        if event.work_id is not None and decision.work_id != event.work_id:
            return (
                DiagnosticKind.CONTRADICTION,
                f"event names work {event.work_id} but the route chose {decision.work_id}",
            )
        work = tx.work(decision.work_id)
        if work is None and not decision.create:
            if tx.work_removed(decision.work_id):
                return (
                    DiagnosticKind.UNKNOWN_WORK,
                    f"work {decision.work_id!r} ended and was removed by compaction (its retention passed)",
                )
            return DiagnosticKind.UNKNOWN_WORK, f"work {decision.work_id!r} does not exist"
        if work is not None and work.scope != event.scope:
            return (
                DiagnosticKind.CONTRADICTION,
                f"work {work.id} is in scope {work.scope!r}, the event in {event.scope!r}",
            )
        if work is not None and event.key is not None:
            owner = tx.key_owner(event.key)
            if owner is not None and owner != work.id:
                return (
                    DiagnosticKind.CONTRADICTION,
                    f"key {event.key!r} is owned by work {owner}, not {work.id}",
                )
        return work
    return resolved_work(tx, event)


def _deliver(
    tx: Tx, now_ms: int, event: Event, req: RouteRequest, work: Work, new_keys: list[str], *, created: bool
) -> RouteResult:
    """``created``: the Work was inserted by this routing, at the revision its first input counts in."""
    policy = req.route.declared if req.route else Policy.QUEUE
    place = tx.kept_queue_place(work.id)  # (kept from the Work's read while no row changed since)
    # the Work was read in this transaction, nothing written since: its live attempt's state is current,
    # and the attempt itself is read only when a control policy needs its capabilities
    running = work.execution_state is ExecutionState.RUNNING
    live_running = _running_attempt(tx, work, req.route) if running else None
    effective, fallback_reason = _effective_policy(running, live_running, req.route)
    if effective is None:
        # decided before any write: an unsupported control attaches no key and joins nothing
        return unrouted(
            tx,
            now_ms,
            event,
            req,
            DiagnosticKind.UNSUPPORTED_CAPABILITY,
            fallback_reason or "unsupported policy",
            work_id=work.id,
        )
    for key in new_keys:
        tx.attach_key(key, work.id, event.seq, now_ms)
    joined = earlier_unrouted(tx, work.id, work.scope, new_keys, event.seq) if new_keys else []
    for earlier in joined:
        tx.insert_checkpoint(
            Checkpoint(
                event_id=earlier.id,
                seq=earlier.seq,
                status=CheckpointStatus.ROUTED,
                work_id=work.id,
                route=req.route.name if req.route else None,
                route_scope=req.route.scope if req.route else None,
                policy=Policy.QUEUE,
                effective_policy=Policy.QUEUE,
                fallback_reason=None,
                reason=f"joined the backlog when event {event.id} attached its key",
                generation=req.generation,
                at_ms=now_ms,
            )
        )
        tx.notify(EventRouted(event_id=earlier.id, work_id=work.id, status=CheckpointStatus.ROUTED))
        tx.add_input(work.id, earlier.id, earlier.seq)
    if effective is Policy.DROP:
        cp = route_checkpoint(
            tx,
            now_ms,
            event,
            CheckpointStatus.DROP,
            req,
            work_id=work.id,
            effective=effective,
            fallback_reason=fallback_reason,
            reason=fallback_reason,
        )
        tx.bump_work(work.id, work.revision, now_ms)
        tx.notify(WorkChanged(work_id=work.id))
        return RouteResult(checkpoint=cp, joined=tuple(e.id for e in joined))
    tx.add_input(work.id, event.id, event.seq)
    live = live_running if effective in (Policy.INJECT, Policy.INTERRUPT) else None
    if live is not None:
        kind = IntentKind.INJECT if effective is Policy.INJECT else IntentKind.INTERRUPT
        iid = intent_id(kind, event.id, live.id)
        tx.insert_intent(
            id=iid,
            kind=kind,
            work_id=work.id,
            event_id=event.id,
            execution_id=live.id,
            epoch=live.epoch,
            now_ms=now_ms,
            error_fallback=req.route.error_fallback if req.route else None,
        )
        tx.notify(IntentPending(intent_id=iid, work_id=work.id))
        if effective is Policy.INTERRUPT:
            # the old attempt is fenced before any replacement can start
            tx.set_execution_state(live, ExecutionState.STOPPING, token=None)
    cp = route_checkpoint(
        tx,
        now_ms,
        event,
        CheckpointStatus.ROUTED,
        req,
        work_id=work.id,
        policy=policy,
        effective=effective,
        fallback_reason=fallback_reason,
    )
    if not created:
        revision = tx.bump_work(work.id, work.revision, now_ms)
        if place is not None and not new_keys and live is None:
            # and its admission facts, for the settle hook after this request (its queue place as
            # read with it: routing moves no Work in the queue; its pending inputs as kept, with the
            # one just added, unless a replay found it there, taken already)
            live_state, pending = work.execution_state, bool(tx.pending_of(work.id))
            facts = AdmissionFacts.told(work, work.state, place, now_ms, live=live_state, pending=pending)
            tx.known("facts", work.id, facts)
            tx.known("place", work.id, place)
        if not new_keys and live is None:
            # the Work as this routing wrote it: the start that follows, and the next Event routed to
            # it in this transaction, read it from here
            tx.known_lazily(
                "work",
                work.id,
                lambda: work_with(
                    work, revision=revision, updated_at_ms=now_ms, pending_inputs=tx.pending_of(work.id)
                ),
            )
    elif not joined:
        _tell_created(tx, now_ms, work, new_keys, cp)
    tx.notify(WorkChanged(work_id=work.id))
    return RouteResult(checkpoint=cp, joined=tuple(e.id for e in joined))


def _tell_created(tx: Tx, now_ms: int, work: Work, new_keys: list[str], cp: Checkpoint) -> None:
    """A Work this routing created, as it wrote it: ready, out of the queue, its keys those it attached,
    its one input this Event, routed by ``cp``. The start that follows (and the binding it runs with)
    reads them from here, after a routing batch's other Events too (`TxBase.hold`)."""
    place = QueuePlace(None, None, None)
    tx.hold(work.id, "place", work.id, place)
    facts = AdmissionFacts.told(work, WorkState.READY, place, now_ms, live=None, pending=True)
    tx.hold(work.id, "facts", work.id, facts)
    tx.hold(work.id, "checkpoint", cp.event_id, cp)
    # a read gives the keys in the order they were attached (all with this Event), then by key
    told = attrs.evolve(work, keys=tuple(sorted(new_keys)), pending_inputs=(cp.event_id,))
    tx.hold(work.id, "work", work.id, told)


def _running_attempt(tx: Tx, work: Work, route: RouteRef | None) -> Execution | None:
    """The Work's running attempt, when the route's policy depends on it (an inject or interrupt)."""
    if route is None or route.policy in (Policy.QUEUE, Policy.DROP):
        return None
    live = tx.live_execution(work.id)
    return live if live is not None and live.state is ExecutionState.RUNNING else None


def _effective_policy(
    running: bool, live: Execution | None, route: RouteRef | None
) -> tuple[Policy | None, str | None]:
    """The policy that applies now, and why it differs from the route's (if it does). ``running``: the
    Work has a running attempt; ``live``: that attempt, read when an inject or interrupt needs it.

    Policies apply to a running attempt; other Work queues its input. An inject or
    interrupt against an attempt not pinned with that capability takes the route's
    explicit fallback, never an inferred queue.
    """
    if route is None:
        return Policy.QUEUE, None
    if route.policy in (Policy.QUEUE, Policy.DROP):
        # (a route declared drop never gets here: it drops without a handler, `decide_without_handler`)
        return (route.policy, route.fallback_reason) if running else (Policy.QUEUE, None)
    if live is None:
        return Policy.QUEUE, None
    needed = Capability.INJECT if route.policy is Policy.INJECT else Capability.INTERRUPT
    if needed.value in live.capabilities:
        return route.policy, route.fallback_reason
    reason = f"the running attempt's executor {live.executor!r} lacks the {needed} capability"
    if route.fallback in (Policy.QUEUE, Policy.DROP):
        return route.fallback, f"fallback to {route.fallback}: {reason}"
    return None, f"{reason} and route {route.name!r} has no queue or drop fallback"


def _terminal(
    tx: Tx, now_ms: int, event: Event, req: RouteRequest, work: Work, limits: CausalLimits
) -> RouteResult:
    """Terminal Work is immutable: a late Event gets `terminal`, or a successor under a reopen policy."""
    if req.route is None or not req.route.reopen or event.key is None or event.work_id is not None:
        cp = route_checkpoint(
            tx,
            now_ms,
            event,
            CheckpointStatus.TERMINAL,
            req,
            work_id=work.id,
            reason=f"work {work.id} is {work.state}",
        )
        return RouteResult(checkpoint=cp)
    first = work
    while first.predecessor_id is not None:  # the chain's first Work, whose key generations count
        earlier = tx.work(first.predecessor_id)
        assert earlier is not None
        first = earlier
    last, n = first, 0
    while (nxt := tx.successor_of(last.id)) is not None:
        successor = tx.work(nxt)
        assert successor is not None
        last, n = successor, n + 1
    if not last.state.terminal:
        # the successor's own order holds: an earlier unrouted Event of it goes first
        _check_order(tx, event, last.id, last.keys)
        return _deliver(tx, now_ms, event, req, last, [], created=False)
    new_id = new_work_id(tx, stable_id("wk", first.id, "reopen", str(n + 1)))
    new_key = successor_key(_base_key(event.key), n + 1)
    _check_order(tx, event, new_id, [new_key])
    if tx.key_owner(new_key) is not None:
        return unrouted(
            tx, now_ms, event, req, DiagnosticKind.OWNED_BY_OTHER, f"key {new_key!r} is already owned"
        )
    record = EventIn(
        source=CORE_SOURCE,
        delivery_id=core_delivery_id("work.created", new_id),
        type=WORK_CREATED,
        scope=work.scope,
        key=new_key,
        payload={"predecessor": last.id, "successor": new_id, "key": event.key},
    )
    created = accept_derived_in_tx(tx, now_ms, record, event.id, limits)
    if isinstance(created, CausalRejection):
        return unrouted(tx, now_ms, event, req, DiagnosticKind.CAUSAL_REJECTION, created.describe())
    tx.insert_work(
        id=new_id,
        scope=work.scope,
        kind=work.kind,
        parent_id=None,
        predecessor_id=last.id,
        generation=req.generation,
        now_ms=now_ms,
    )
    control_checkpoint(tx, now_ms, created, new_id, "records the successor of a terminal work")
    successor = tx.work(new_id)
    assert successor is not None
    return _deliver(tx, now_ms, event, req, successor, [new_key], created=False)
