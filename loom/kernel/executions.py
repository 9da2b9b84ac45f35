"""Executions: claim under scope capacity, fenced leases, outcomes, intents and operator
controls (seed 003: "Active-event policies", "Generic inject acknowledgement", "Pending-job
coalescing and standing Work", "Gated starts", "Lease recovery" (claim, lease, epoch)).

A lease's expiry is exclusive: at ``now == expires_at`` it has lost authority. Every
fenced call presents execution id, attempt, epoch and token; anything stale raises
`StaleAuthority` and changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from .._config import CausalLimits, Config, effective_routes
from .._errors import Conflict, InvalidRequest, NotFound
from .._ids import stable_id
from .._notices import ExecutionFenced, IntentPending, WorkChanged
from .._records import CausalRejection, Event, EventIn, validate_event_in
from .._work import (
    Capability,
    Completed,
    Execution,
    ExecutionState,
    Handoff,
    Intent,
    IntentKind,
    IntentStatus,
    Lease,
    Outcome,
    RunRequest,
    Work,
    WorkState,
    check_execution_transition,
    check_work_transition,
    outcome_json,
)
from ..store import Tx
from .accept import accept_derived_in_tx, accept_in_tx
from .authority import Authority as Authority
from .authority import authorize as authorize
from .routing import CORE_SOURCE, WORK_CREATED, control_checkpoint, intent_id

MANUAL_INTERRUPT = "core.manual.interrupt"
EXECUTION_TIMEOUT = "core.execution.timeout"

TriggerSelector = Callable[[Sequence[Event]], int]


@attrs.frozen(kw_only=True)
class KindPolicy:
    """What the kernel needs of a Work kind (pure policy)."""

    standing: bool = False
    run_once: bool = False
    select_trigger: TriggerSelector | None = None
    timeout_ms: int | None = None


@attrs.frozen(kw_only=True)
class BindingRef:
    """The binding an attempt is pinned to: executor and the capabilities it may use."""

    name: str | None
    executor: str | None
    capabilities: frozenset[str] = frozenset()
    config: Mapping[str, Any] = attrs.field(factory=dict, hash=False)


@attrs.frozen(kw_only=True)
class ClaimRequest:
    work_id: str
    owner: str
    token: str
    lease_ms: int
    binding: BindingRef
    kind: KindPolicy
    capacity: int | None
    generation: int
    timeout_ms: int | None = None
    """The execution timeout (active time); ``None``: no deadline."""


TRIGGER_SELECTORS: Mapping[str, TriggerSelector] = {
    "first": lambda inputs: 0,
    "newest": lambda inputs: len(inputs) - 1,
}
"""Built-in trigger selection by Work kind (``first`` is the default)."""


def kind_policy(config: Config, kind: str | None) -> KindPolicy:
    """The kernel's view of a configured Work kind (an unknown or absent kind: the defaults)."""
    policy = config.work_kinds.get(kind or "")
    if policy is None:
        return KindPolicy()
    return KindPolicy(
        standing=policy.standing,
        run_once=policy.run_once,
        select_trigger=TRIGGER_SELECTORS.get(policy.trigger),
        timeout_ms=policy.timeout_ms,
    )


def binding_for_in_tx(
    tx: Tx, now_ms: int, work_id: str, config: Config, advertised: Mapping[str, Collection[str]]
) -> BindingRef | None:
    """The binding a Work's next attempt runs with: that of the route which routed its earliest
    pending input, resolved in the Work's scope, pinning only capabilities its executor advertises.

    ``None``: no pending input came through a route with a binding (a host may still claim).
    """
    work = tx.work(work_id)
    if work is None:
        raise NotFound(f"no work with id {work_id!r}")
    routes = {route.name: route for route in effective_routes(config, work.scope)}
    for event_id in work.pending_inputs:
        checkpoint = tx.checkpoint(event_id)
        route = routes.get(checkpoint.route or "") if checkpoint else None
        if route is None or route.binding is None:
            continue
        binding = route.binding.binding
        capabilities = frozenset(str(c) for c in binding.capabilities)
        return BindingRef(
            name=route.binding.name, executor=binding.executor,
            capabilities=capabilities & frozenset(advertised.get(binding.executor, ())), config=binding.config,
        )  # fmt: skip
    return None


def select_trigger(inputs: Sequence[Event], selector: TriggerSelector | None) -> Event | None:
    """The input that triggers an attempt; an out-of-range answer selects the first."""
    if not inputs:
        return None
    if selector is None:
        return inputs[0]
    index = selector(inputs)
    return inputs[index] if isinstance(index, int) and 0 <= index < len(inputs) else inputs[0]


def claimable(work: Work) -> str | None:
    """Why ``work`` cannot start an attempt now (``None``: it can)."""
    if work.state.terminal:
        return f"work {work.id} is {work.state}"
    if work.current_execution_id is not None:
        return f"work {work.id} already has a nonterminal attempt {work.current_execution_id}"
    if work.held:
        return f"work {work.id} is held: {work.hold_reason}"
    if work.state is not WorkState.READY:
        return f"work {work.id} is {work.state}"
    if not work.pending_inputs:
        return f"work {work.id} has no pending input"
    return None


def claim_in_tx(tx: Tx, now_ms: int, req: ClaimRequest) -> Lease:
    """Start the next attempt of a ready Work with every pending input, under scope capacity."""
    if req.lease_ms <= 0:
        raise InvalidRequest(f"lease_ms must be positive, got {req.lease_ms}")
    work = tx.work(req.work_id)
    if work is None:
        raise NotFound(f"no work with id {req.work_id!r}")
    why = claimable(work)
    if why is not None:
        raise Conflict(f"cannot claim: {why}")
    if req.capacity is not None and tx.running_in_scope(work.scope) >= req.capacity:
        raise Conflict(
            f"cannot claim work {work.id}: scope {work.scope!r} is at its capacity of {req.capacity}"
        )
    inputs = [_event(tx, event_id) for event_id in work.pending_inputs]
    trigger = select_trigger(inputs, req.kind.select_trigger)
    attempt = work.attempts + 1
    execution_id = stable_id("ex", work.id, str(attempt))
    expires = now_ms + req.lease_ms
    tx.insert_execution(
        id=execution_id, work_id=work.id, attempt=attempt, token=req.token, owner=req.owner,
        expires_at_ms=expires, trigger_id=trigger.id if trigger else None, inputs=work.pending_inputs,
        binding=req.binding.name, executor=req.binding.executor, capabilities=sorted(req.binding.capabilities),
        generation=req.generation, now_ms=now_ms,
    )  # fmt: skip
    if req.timeout_ms is not None:
        # the first active segment: its deadline is a durable timer armed in this same commit
        assert trigger is not None
        tx.update_execution(execution_id, budget_ms=req.timeout_ms)
        start_segment_in_tx(tx, now_ms, execution_id, 1, req.timeout_ms, trigger.id, work.scope)
    check_work_transition(work.id, work.state, WorkState.RUNNING)
    tx.update_work(
        work.id, now_ms, state=WorkState.RUNNING.value, attempts=attempt, started=1, release_once=0
    )
    tx.notify(WorkChanged(work_id=work.id))
    request = RunRequest(
        work_id=work.id, execution_id=execution_id, attempt=attempt, scope=work.scope, kind=work.kind,
        trigger=trigger, inputs=tuple(inputs), binding=req.binding.name, config=dict(req.binding.config),
    )  # fmt: skip
    return Lease(execution_id=execution_id, work_id=work.id, attempt=attempt, epoch=1, token=req.token,
                 owner=req.owner, expires_at_ms=expires, request=request)  # fmt: skip


def renew_in_tx(tx: Tx, now_ms: int, auth: Authority, lease_ms: int) -> int:
    """Extend a live lease; return the new (exclusive) expiry."""
    if lease_ms <= 0:
        raise InvalidRequest(f"lease_ms must be positive, got {lease_ms}")
    execution = authorize(tx, now_ms, auth)
    expires = now_ms + lease_ms
    tx.update_execution(execution.id, expires_at_ms=expires)
    return expires


def complete_in_tx(tx: Tx, now_ms: int, auth: Authority, outcome: Outcome, kind: KindPolicy) -> Execution:
    """Record an attempt's outcome under its fence, with its consumption proofs, atomically."""
    execution = authorize(tx, now_ms, auth)
    work = tx.work(execution.work_id)
    assert work is not None
    for event_id in execution.inputs:
        if tx.input_state(work.id, event_id) == "pending":
            tx.consume_input(work.id, event_id, execution.id)
    _apply_proofs(tx, now_ms, execution, outcome.consumed_inputs)
    for intent in tx.intents_of_execution(execution.id):
        if intent.status is IntentStatus.PENDING:
            tx.update_intent(intent.id, IntentStatus.STALE.value, now_ms)
    handoff_settles = isinstance(outcome, Handoff) and kind.run_once
    if isinstance(outcome, Completed) or handoff_settles:
        state = ExecutionState.COMPLETED
    elif isinstance(outcome, Handoff):
        state = ExecutionState.HANDOFF
    else:
        state = ExecutionState.FAILED
    next_state = WorkState.READY
    if state is ExecutionState.COMPLETED and not tx.pending_inputs(work.id) and not kind.standing:
        unrouted = tx.earlier_unrouted_for(work.id, work.keys, tx.max_seq() + 1)
        if unrouted:
            raise Conflict(
                f"work {work.id} cannot complete: accepted event {unrouted[0].id} resolving to it is not "
                "routed yet (retry once routing settles)"
            )
        next_state = WorkState.COMPLETED
    check_execution_transition(execution.id, execution.state, state)
    end_segment_in_tx(tx, now_ms, execution)
    data = outcome_json(outcome)
    tx.update_execution(
        execution.id, state=state.value, token=None, outcome=json.dumps(data), ended_at_ms=now_ms
    )
    check_work_transition(work.id, work.state, next_state)
    tx.update_work(work.id, now_ms, state=next_state.value)
    tx.notify(WorkChanged(work_id=work.id))
    result = tx.execution(execution.id)
    assert result is not None
    return result


def _apply_proofs(tx: Tx, now_ms: int, execution: Execution, consumed: Sequence[str]) -> None:
    """``consumed_inputs`` is the only consumption proof, and it grants no authority.

    An input is consumed only where an inject intent for this execution (any epoch) was
    dispatched, is not ``not_accepting`` or already consumed, and the input is pending.
    """
    if not consumed:
        return
    intents = {i.event_id: i for i in tx.intents_of_execution(execution.id) if i.kind is IntentKind.INJECT}
    for event_id in dict.fromkeys(consumed):
        intent = intents.get(event_id)
        if intent is None or intent.status not in (IntentStatus.DISPATCHING, IntentStatus.ACCEPTED):
            continue
        if tx.input_state(execution.work_id, event_id) != "pending":
            continue
        tx.consume_input(execution.work_id, event_id, execution.id)
        tx.update_intent(intent.id, IntentStatus.CONSUMED.value, now_ms)


# -- intents: dispatch happens outside the transaction, between these two -----------


@attrs.frozen(kw_only=True)
class Dispatch:
    intent: Intent
    execution: Execution
    event: Event


def begin_dispatch_in_tx(tx: Tx, now_ms: int, intent_id: str) -> Dispatch | None:
    """Mark an intent as dispatched (attempted) before the executor is called.

    ``None``: nothing to dispatch (settled, stale, or its attempt ended: a post-completion
    dispatch never targets another attempt).
    """
    intent = tx.intent(intent_id)
    if intent is None:
        raise NotFound(f"no intent with id {intent_id!r}")
    if intent.status not in (IntentStatus.PENDING, IntentStatus.DISPATCHING):
        return None
    execution = tx.execution(intent.execution_id)
    assert execution is not None
    live = ExecutionState.RUNNING if intent.kind is IntentKind.INJECT else ExecutionState.STOPPING
    if execution.state is not live:
        tx.update_intent(intent.id, IntentStatus.STALE.value, now_ms)
        return None
    tx.update_intent(intent.id, IntentStatus.DISPATCHING.value, now_ms, attempted=True)
    tx.notify(WorkChanged(work_id=intent.work_id))
    return Dispatch(intent=attrs.evolve(intent, status=IntentStatus.DISPATCHING), execution=execution,
                    event=_event(tx, intent.event_id))  # fmt: skip


DISPATCH_ATTEMPTS = 5
DISPATCH_BACKOFF_MS = 1_000


class DispatchResult:
    ACCEPTED = "accepted"
    NOT_ACCEPTING = "not_accepting"
    AMBIGUOUS = "ambiguous"


def finish_dispatch_in_tx(tx: Tx, now_ms: int, intent_id: str, result: str) -> Intent:
    """Record the executor's answer. A late acknowledgement never undoes a consumption."""
    intent = tx.intent(intent_id)
    if intent is None:
        raise NotFound(f"no intent with id {intent_id!r}")
    if result == DispatchResult.AMBIGUOUS:
        if intent.status is IntentStatus.DISPATCHING:
            # the same intent identity is tried again later, a bounded number of times
            retry = (
                now_ms + DISPATCH_BACKOFF_MS * intent.attempts
                if intent.attempts < DISPATCH_ATTEMPTS
                else None
            )
            tx.update_intent(intent.id, IntentStatus.DISPATCHING.value, now_ms, next_attempt_ms=retry)
            if retry is None:
                tx.add_diagnostic("dispatch_gave_up", intent.event_id,
                                  f"intent {intent.id}: {intent.attempts} ambiguous dispatches; the input stays pending",
                                  {"intent": intent.id, "execution": intent.execution_id}, now_ms)  # fmt: skip
    elif intent.kind is IntentKind.INTERRUPT:
        _settle_interrupt(tx, now_ms, intent)
    elif intent.status is IntentStatus.DISPATCHING:
        if result == DispatchResult.ACCEPTED:
            tx.update_intent(intent.id, IntentStatus.ACCEPTED.value, now_ms)
        elif result == DispatchResult.NOT_ACCEPTING:
            tx.update_intent(intent.id, IntentStatus.NOT_ACCEPTING.value, now_ms)
    tx.notify(WorkChanged(work_id=intent.work_id))
    settled = tx.intent(intent_id)
    assert settled is not None
    return settled


def _settle_interrupt(tx: Tx, now_ms: int, intent: Intent) -> None:
    """The executor stopped the interrupted attempt: end it and leave the Work ready."""
    tx.update_intent(intent.id, IntentStatus.DONE.value, now_ms)
    execution = tx.execution(intent.execution_id)
    assert execution is not None
    if execution.state is ExecutionState.STOPPING:
        end_segment_in_tx(tx, now_ms, execution)
        tx.update_execution(execution.id, state=ExecutionState.CANCELLED.value, interrupt_event_id=intent.event_id,
                            ended_at_ms=now_ms, outcome=json.dumps({"kind": "interrupted"}))  # fmt: skip
        work = tx.work(execution.work_id)
        assert work is not None
        if work.state is WorkState.RUNNING:
            tx.update_work(work.id, now_ms, state=WorkState.READY.value)
        tx.notify(WorkChanged(work_id=work.id))


# -- operator controls -------------------------------------------------------------


def hold_in_tx(tx: Tx, now_ms: int, work_id: str, reason: str) -> Work:
    if not reason or not reason.strip():
        raise InvalidRequest("hold: reason must be a non-empty string")
    work = _work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot hold work {work.id}: it is {work.state}")
    tx.update_work(work.id, now_ms, held=1, hold_reason=reason)
    tx.notify(WorkChanged(work_id=work.id))
    return _work(tx, work_id)


def release_in_tx(tx: Tx, now_ms: int, work_id: str) -> Work:
    """Release a hold: the next start goes through (start gates let it through once)."""
    work = _work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot release work {work.id}: it is {work.state}")
    if not work.held:
        raise Conflict(f"work {work.id} is not held")
    tx.update_work(work.id, now_ms, held=0, hold_reason=None, release_once=1)
    tx.notify(WorkChanged(work_id=work.id))
    return _work(tx, work_id)


def cancel_in_tx(tx: Tx, now_ms: int, work_id: str) -> Work:
    """Cancel Work: fence every attempt and intent first, then terminalise. Never rewrites terminal Work."""
    work = _work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot cancel work {work.id}: it is already {work.state}")
    live = tx.live_execution(work.id)
    if live is not None:
        end_segment_in_tx(tx, now_ms, live)
        tx.update_execution(live.id, state=ExecutionState.CANCELLED.value, token=None, ended_at_ms=now_ms,
                            outcome=json.dumps({"kind": "cancelled"}))  # fmt: skip
        for intent in tx.intents_of_execution(live.id):
            if intent.status in (IntentStatus.PENDING, IntentStatus.DISPATCHING):
                tx.update_intent(intent.id, IntentStatus.STALE.value, now_ms)
        tx.notify(ExecutionFenced(execution_id=live.id, work_id=work.id))
    tx.update_work(work.id, now_ms, state=WorkState.CANCELLED.value, held=0)
    tx.notify(WorkChanged(work_id=work.id))
    return _work(tx, work_id)


def manual_interrupt_in_tx(
    tx: Tx, now_ms: int, work_id: str, request_id: str, reason: str, limits: CausalLimits
) -> Intent:
    """The operator interrupt: a ``core.manual.interrupt`` control Event plus an interrupt intent.

    Refused unless the running attempt was pinned with the interrupt capability.
    """
    work = _work(tx, work_id)
    replayed = tx.event_by_delivery(CORE_SOURCE, f"manual.interrupt/{request_id}")
    if replayed is not None:
        # a replayed control targets the attempt it first targeted, never a newer one
        first = intent_id(IntentKind.INTERRUPT, replayed.id, str(replayed.payload.get("execution")))
        original = tx.intent(first)
        if replayed.work_id != work.id or original is None:
            raise InvalidRequest(
                f"interrupt request {request_id!r} was already used for work {replayed.work_id}"
            )
        return original
    live = tx.live_execution(work.id)
    if live is None or live.state is not ExecutionState.RUNNING:
        raise Conflict(f"cannot interrupt work {work.id}: it has no running attempt")
    if Capability.INTERRUPT.value not in live.capabilities:
        raise InvalidRequest(
            f"cannot interrupt work {work.id}: its attempt {live.id} was not pinned with the interrupt "
            f"capability (executor {live.executor!r})"
        )
    event = accept_in_tx(
        tx, now_ms,
        EventIn(source=CORE_SOURCE, delivery_id=f"manual.interrupt/{request_id}", type=MANUAL_INTERRUPT,
                scope=work.scope, work_id=work.id, payload={"reason": reason, "execution": live.id}),
        limits, trusted=True,
    )  # fmt: skip
    if not event.duplicate:
        control_checkpoint(tx, now_ms, event, work.id, "operator interrupt")
    iid = intent_id(IntentKind.INTERRUPT, event.id, live.id)
    tx.insert_intent(id=iid, kind=IntentKind.INTERRUPT.value, work_id=work.id, event_id=event.id,
                     execution_id=live.id, epoch=live.epoch, now_ms=now_ms)  # fmt: skip
    tx.update_execution(live.id, state=ExecutionState.STOPPING.value, token=None)
    tx.update_work(work.id, now_ms)
    tx.notify(IntentPending(intent_id=iid, work_id=work.id))
    tx.notify(WorkChanged(work_id=work.id))
    intent = tx.intent(iid)
    assert intent is not None
    return intent


# -- the toolbelt: fenced calls from a running execution ------------------------------


def emit_in_tx(
    tx: Tx, now_ms: int, auth: Authority, event: EventIn, limits: CausalLimits, cause_id: str | None = None
) -> Event | CausalRejection:
    """Emit a derived Event from the attempt's trigger, charged to the causal bounds."""
    execution = authorize(tx, now_ms, auth)
    validate_event_in(event)  # an execution may not emit the privileged core.* family
    work = _work(tx, execution.work_id)
    if event.scope != work.scope:
        raise InvalidRequest(
            f"emit: event.scope {event.scope!r} is not the emitting work's scope {work.scope!r}"
        )
    parent = _authority_parent(execution)
    return accept_derived_in_tx(
        tx, now_ms, event, parent, limits, cause_id=cause_id, execution_id=execution.id
    )


def create_child_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    name: str,
    keys: Sequence[str],
    kind: str | None,
    generation: int,
    limits: CausalLimits,
) -> Work | CausalRejection:
    """Create child Work in the parent's scope, atomically with its ``core.work.created`` Event."""
    execution = authorize(tx, now_ms, auth)
    parent_work = _work(tx, execution.work_id)
    if not name or not isinstance(name, str):
        raise InvalidRequest("create_child: name must be a non-empty string (it makes the child id stable)")
    child_id = stable_id("wk", parent_work.id, "child", name)
    existing = tx.work(child_id)
    if existing is not None:
        return existing
    for key in keys:
        owner = tx.key_owner(key)
        if owner is not None:
            raise InvalidRequest(f"create_child: key {key!r} is already owned by work {owner}")
    created = accept_derived_in_tx(
        tx, now_ms,
        EventIn(source=CORE_SOURCE, delivery_id=f"work.created/{child_id}", type=WORK_CREATED,
                scope=parent_work.scope, payload={"parent": parent_work.id, "child": child_id, "name": name}),
        _authority_parent(execution), limits, execution_id=execution.id,
    )  # fmt: skip
    if isinstance(created, CausalRejection):
        return created
    tx.insert_work(id=child_id, scope=parent_work.scope, kind=kind, parent_id=parent_work.id, predecessor_id=None,
                   generation=generation, now_ms=now_ms)  # fmt: skip
    for key in keys:
        tx.attach_key(key, child_id, created.seq, now_ms)
    control_checkpoint(tx, now_ms, created, child_id, "records the creation of a child work")
    tx.notify(WorkChanged(work_id=child_id))
    return _work(tx, child_id)


def _authority_parent(execution: Execution) -> str:
    if execution.trigger_id is None:
        raise InvalidRequest(f"execution {execution.id} has no trigger to derive from")
    return execution.trigger_id


def _work(tx: Tx, work_id: str) -> Work:
    work = tx.work(work_id)
    if work is None:
        raise NotFound(f"no work with id {work_id!r}")
    return work


def _event(tx: Tx, event_id: str) -> Event:
    event = tx.event(event_id)
    assert event is not None, f"event {event_id} vanished"
    return event


# -- execution deadlines: durable core.execution.timeout templates -------------------------


def deadline_timer_id(execution_id: str, segment: int) -> str:
    return f"deadline:{execution_id}:{segment}"


def start_segment_in_tx(
    tx: Tx, now_ms: int, execution_id: str, segment: int, remaining_ms: int, parent_id: str, scope: str
) -> None:
    """Start an active segment with the remaining budget: its deadline is a durable timer whose
    template is a ``core.execution.timeout`` Event naming the execution and segment."""
    from .._timers import TimerSpec
    from .timers import arm_in_tx

    execution = tx.execution(execution_id)
    assert execution is not None
    timer_id = deadline_timer_id(execution_id, segment)
    spec = TimerSpec(
        id=timer_id, fire_at_ms=now_ms + max(remaining_ms, 0), source=CORE_SOURCE, type=EXECUTION_TIMEOUT,
        scope=scope, payload={"execution": execution_id, "segment": segment, "epoch": execution.epoch,
                              "work": execution.work_id},
    )  # fmt: skip
    arm_in_tx(tx, now_ms, spec, parent_id=parent_id, execution_id=execution_id)
    tx.update_execution(execution_id, segment=segment, segment_started_ms=now_ms, deadline_timer_id=timer_id)


def end_segment_in_tx(tx: Tx, now_ms: int, execution: Execution) -> None:
    """Close the active segment: count its active time and disarm its deadline."""
    from .._notices import TimerCancelled
    from .._timers import TimerState

    started, timer_id = tx.execution_segment_clock(execution.id)
    if started is None:
        return
    tx.update_execution(
        execution.id, used_ms=execution.used_ms + max(now_ms - started, 0), segment_started_ms=None
    )
    timer = tx.timer(timer_id) if timer_id else None
    if timer is not None and timer.state is TimerState.ARMED:
        tx.set_timer_state(timer.id, TimerState.CANCELLED.value, "segment ended", now_ms)
        tx.notify(TimerCancelled(timer_id=timer.id))


def apply_deadline_in_tx(tx: Tx, now_ms: int, event: Event | None, payload: Mapping[str, Any]) -> None:
    """A ``core.execution.timeout`` was accepted: if its segment is still the active one, fence
    the attempt and fail it under its current fence; a stale deadline does nothing.

    The control checkpoint keeps Work and execution in the envelope but routes nothing, so
    earlier runnable input cannot delay the fencing.
    """
    execution = tx.execution(str(payload.get("execution", "")))
    current = (
        execution is not None
        and execution.state is ExecutionState.RUNNING
        and execution.segment == payload.get("segment")
        and execution.epoch == payload.get("epoch")
    )
    if not current or execution is None:
        if event is not None:
            control_checkpoint(tx, now_ms, event, None, "a stale execution deadline")
        return
    work = tx.work(execution.work_id)
    assert work is not None
    for event_id in execution.inputs:
        if tx.input_state(work.id, event_id) == "pending":
            tx.consume_input(work.id, event_id, execution.id)
    for intent in tx.intents_of_execution(execution.id):
        if intent.status in (IntentStatus.PENDING, IntentStatus.DISPATCHING):
            tx.update_intent(intent.id, IntentStatus.STALE.value, now_ms)
    end_segment_in_tx(tx, now_ms, execution)
    budget = execution.budget_ms
    tx.update_execution(execution.id, state=ExecutionState.FAILED.value, token=None, ended_at_ms=now_ms,
                        outcome=json.dumps({"kind": "failed", "error": f"execution timeout after {budget} ms of "
                                            "active time", "timeout_event_id": event.id if event else None}))  # fmt: skip
    if work.state is WorkState.RUNNING:
        tx.update_work(work.id, now_ms, state=WorkState.READY.value)
    if event is not None:
        control_checkpoint(tx, now_ms, event, None, f"execution deadline of {execution.id}")
    else:
        # the causal bounds refused the deadline Event: fenced all the same, and held
        tx.update_work(
            work.id,
            now_ms,
            held=1,
            hold_reason="causal_rejection: the execution deadline's event was refused",
        )
    tx.notify(ExecutionFenced(execution_id=execution.id, work_id=work.id))
    tx.notify(WorkChanged(work_id=work.id))
