"""Executions: claims under scope capacity, fenced leases and outcomes.

A lease's expiry is exclusive: at ``now == expires_at`` it has lost authority. Every fenced call
presents execution id, attempt, epoch and token; anything stale raises `StaleAuthority` and changes
nothing. Pure decisions (trigger selection, whether a Work can start, the claim a config implies)
sit beside the procedures that use them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial

import attrs

from ..config import Budget, CausalLimits, Config
from ..records.errors import Conflict
from ..records.events import Event
from ..records.ids import stable_id
from ..records.notices import AttemptStarted, WorkChanged
from ..records.validation import MAX_LEASE_MS, check_int, check_text, validate_outcome
from ..records.waits import Waiting
from ..records.work import (
    Completed,
    Execution,
    ExecutionState,
    Failed,
    Handoff,
    Lease,
    Outcome,
    RetryState,
    RunRequest,
    Work,
    WorkState,
    outcome_json,
)
from ..store import AdmissionFacts, Tx
from ._common import origin_of, require_work
from ._told import claimed_work, ended_work
from .authority import Authority, authorize, authorize_recovery
from .bindings import NO_BINDING as NO_BINDING
from .bindings import BindingRef as BindingRef
from .bindings import binding_for_in_tx as binding_for_in_tx
from .budgets import admit_turn, charge_in_tx
from .capacity import capacity_pool
from .continuation import park_in_tx, resume_in_tx
from .intents import apply_proofs_in_tx, stale_open_intents_in_tx
from .kinds import TRIGGER_SELECTORS as TRIGGER_SELECTORS
from .kinds import KindPolicy as KindPolicy
from .kinds import TriggerSelector as TriggerSelector
from .kinds import kind_policy as kind_policy
from .kinds import pinned_retry_text
from .retry import apply_failure_in_tx
from .segments import end_segment_in_tx, start_segment_in_tx
from .unrouted import earlier_unrouted


class CompletionBlocked(Conflict):
    """Terminal completion waits until an accepted Event resolving to the Work is routed
    (``event_id``); the caller retries once it has its checkpoint."""

    def __init__(self, message: str, *, event_id: str) -> None:
        super().__init__(message)
        self.event_id = event_id


@attrs.frozen(kw_only=True)
class ClaimRequest:
    work_id: str
    owner: str
    token: str
    lease_ms: int
    binding: BindingRef
    kind: KindPolicy
    capacity: int | None
    """The capacity of ``pool`` (``None``: no capacity applies)."""
    generation: int
    timeout_ms: int | None = None
    """The execution timeout (active time); ``None``: no deadline."""
    handed: bool = False
    """The attempt counts as handed to its executor from this commit on: the claimer runs it itself (a
    host's claim) or hands it over at once (a runtime's), so a lost lease is recovered through the
    executor (adopted or failed), never relaunched. A runtime's clean close unmarks the attempts it
    claimed and never handed (`recovery.release_leases_in_tx`), and a claim that is not handed (a
    test's, or a tool's that launches later) is relaunched when its lease is lost."""
    budgets: tuple[Budget, ...] = ()
    """The budgets in force: a turn is admitted against them, and counted in ``turns`` and ``attempts``."""
    limits: CausalLimits = attrs.field(factory=CausalLimits)
    """The causal limits the budget Events are accepted under."""
    pool: str | None = None
    """The capacity pool the attempt counts against (`capacity.capacity_pool`); ``None`` with a
    ``capacity``: the Work's own scope."""


class RoutingBehind(Conflict):
    """A claim found an Event of the Work, accepted before its wake's winner, not routed yet: the
    continuation waits for ``event_id``'s checkpoint."""

    def __init__(self, message: str, *, event_id: str) -> None:
        super().__init__(message)
        self.event_id = event_id


class AtCapacity(Conflict):
    """A claim found its capacity pool full: the Work waits for a slot."""

    def __init__(self, message: str, *, pool: str) -> None:
        super().__init__(message)
        self.pool = pool


def claim_request(
    config: Config,
    work: Work,
    *,
    owner: str,
    token: str,
    lease_ms: int,
    binding: BindingRef,
    handed: bool = False,
) -> ClaimRequest:
    """The claim of ``work``'s next attempt that ``config`` implies (its kind, capacity and timeout).

    ``token`` is the new lease's secret, made by the caller (procedures use no randomness).
    """
    kind = kind_policy(config, work.kind)
    pool = capacity_pool(config, work.scope)
    return ClaimRequest(
        work_id=work.id,
        owner=owner,
        token=token,
        lease_ms=lease_ms,
        binding=binding,
        kind=kind,
        capacity=pool.capacity if pool is not None else None,
        pool=pool.scope if pool is not None else None,
        generation=config.generation,
        timeout_ms=kind.timeout_ms,
        handed=handed,
        budgets=config.budgets,
        limits=config.causal,
    )


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
    return start_refusal(
        work.id,
        work.state,
        held=work.held,
        hold_reason=work.hold_reason,
        retry=work.retry,
        execution_state=work.execution_state,
        execution_id=work.current_execution_id,
        has_pending=bool(work.pending_inputs),
    )


def start_refusal(
    work_id: str,
    state: WorkState,
    *,
    held: bool,
    hold_reason: str | None,
    retry: RetryState | None,
    execution_state: ExecutionState | None,
    execution_id: str | None,
    has_pending: bool,
) -> str | None:
    """Why a Work in this condition cannot start an attempt now (``None``: it can; it belongs in the
    ready queue). A parked attempt does not stop a start: a claim resumes it once it is woken."""
    if state.terminal:
        return f"work {work_id} is {state}"
    if execution_state is not None and execution_state is not ExecutionState.PARKED:
        return f"work {work_id} already has a nonterminal attempt {execution_id}"
    if held:
        return f"work {work_id} is held: {hold_reason}"
    if retry is RetryState.BACKOFF:
        return f"work {work_id} is in its retry backoff: its next attempt starts when the retry is due"
    if retry is RetryState.EXHAUSTED:
        return f"work {work_id} has spent its retry budget: request a retry to start the next attempt"
    if state is not WorkState.READY:
        return f"work {work_id} is {state}"
    if not has_pending:
        return f"work {work_id} has no pending input"
    return None


def _started(
    tx: Tx, now_ms: int, request: RunRequest, ready_at_ms: int | None, *, resumed: bool = False
) -> None:
    tx.notify(
        AttemptStarted(
            execution_id=request.execution_id,
            work_id=request.work_id,
            attempt=request.attempt,
            at_ms=now_ms,
            ready_at_ms=ready_at_ms,
            trigger_accepted_at_ms=request.trigger.accepted_at_ms if request.trigger else None,
            resumed=resumed,
        )
    )


def claim_in_tx(tx: Tx, now_ms: int, req: ClaimRequest) -> Lease:
    """Start the next attempt of a ready Work with every pending input, under scope capacity."""
    check_int("lease_ms", req.lease_ms, 1, MAX_LEASE_MS)
    check_text("owner", req.owner)
    work = require_work(tx, req.work_id)
    why = claimable(work)
    if why is not None:
        raise Conflict(f"cannot claim: {why}")
    admit_turn(tx, now_ms, work, req.budgets)
    wake = tx.untaken_wake(work.id)
    if wake is not None:
        _routed_up_to_the_winner(tx, work, wake.winner_event_id)
    pool = req.pool if req.pool is not None else work.scope if req.capacity is not None else None
    if pool is not None and req.capacity is not None:
        tx.lock_pool(pool)
        if tx.pool_running(pool) >= req.capacity:
            raise AtCapacity(
                f"cannot claim work {work.id}: scope {pool!r} is at its capacity of {req.capacity}", pool=pool
            )
    inputs = tx.input_events(work.pending_inputs)
    place = tx.queue_place(work.id)
    ready_at_ms = place.ready_at_ms
    if work.execution_state is ExecutionState.PARKED:
        parked = tx.live_execution(work.id)
        assert parked is not None
        if wake is None or wake.execution_id != parked.id:
            raise Conflict(f"cannot claim: work {work.id}'s parked attempt {parked.id} has not been woken")
        resumed = resume_in_tx(
            tx,
            now_ms,
            work,
            parked,
            wake,
            inputs,
            token=req.token,
            owner=req.owner,
            lease_ms=req.lease_ms,
            config=req.binding.config,
        )
        if pool is not None:
            tx.update_execution(parked.id, pool=pool)
        if req.budgets:
            charge_in_tx(tx, now_ms, work, {"turns": 1}, req.budgets, req.limits)
        _started(tx, now_ms, resumed.request, ready_at_ms, resumed=True)
        return resumed
    trigger = select_trigger(inputs, req.kind.select_trigger)
    authority = trigger.id if trigger else None
    if wake is not None:
        # a continuation after a wait: the winner triggers it, the wake's bridge is its authority
        winner = next((e for e in inputs if e.id == wake.winner_event_id), None)
        trigger = winner or trigger
        authority = wake.bridge_event_id or authority
        tx.take_wake(wake, now_ms)
    attempt = work.attempts + 1
    execution_id = stable_id("ex", work.id, str(attempt))
    expires = now_ms + req.lease_ms
    tx.insert_execution(
        id=execution_id,
        work_id=work.id,
        attempt=attempt,
        token=req.token,
        owner=req.owner,
        expires_at_ms=expires,
        trigger_id=trigger.id if trigger else None,
        inputs=work.pending_inputs,
        binding=req.binding.name,
        executor=req.binding.executor,
        capabilities=sorted(req.binding.capabilities),
        generation=req.generation,
        now_ms=now_ms,
        watermark=max((e.seq for e in inputs), default=0),
        authority_id=authority,
        pool=pool,
        retry_policy=pinned_retry_text(req.kind),
        binding_config=json.dumps(req.binding.config) if req.binding.config else None,
        handed_at_ms=now_ms if req.handed else None,
        budget_ms=req.timeout_ms,
    )
    if req.timeout_ms is not None:
        # the first active segment: its deadline is a durable timer armed in this same commit
        assert authority is not None
        start_segment_in_tx(tx, now_ms, execution_id, 1, req.timeout_ms, authority, work.scope)
    revision = tx.set_work_state(work, WorkState.RUNNING, now_ms, attempts=attempt, started=1, release_once=0)
    tx.known_lazily("work", work.id, partial(claimed_work, work, revision, execution_id, now_ms), pure=True)
    tx.known("place", work.id, place)  # (a claim moves no Work in the queue: the settle hook does)
    tx.notify(WorkChanged(work_id=work.id))
    if req.budgets:
        charge_in_tx(tx, now_ms, work, {"turns": 1, "attempts": 1}, req.budgets, req.limits)
    else:
        # what the settle hook reads next (`admission.settle_in_tx`), as this claim left the Work: its
        # new attempt the only live one, every input it held still pending, its queue place as read
        running = ExecutionState.RUNNING
        facts = AdmissionFacts.told(
            work, WorkState.RUNNING, place, now_ms, live=running, pending=bool(work.pending_inputs)
        )
        tx.known("facts", work.id, facts)
        tx.hold(work.id, "facts", work.id, facts)  # (for a batch's settling, after its other starts)
    request = RunRequest(
        work_id=work.id,
        execution_id=execution_id,
        attempt=attempt,
        scope=work.scope,
        kind=work.kind,
        trigger=trigger,
        inputs=tuple(inputs),
        binding=req.binding.name,
        config=req.binding.config,
        executor=req.binding.executor,
        origin=origin_of(tx, trigger),
    )
    _started(tx, now_ms, request, ready_at_ms)
    return Lease(
        execution_id=execution_id,
        work_id=work.id,
        attempt=attempt,
        epoch=1,
        token=req.token,
        owner=req.owner,
        expires_at_ms=expires,
        request=request,
    )


def _routed_up_to_the_winner(tx: Tx, work: Work, winner_id: str | None) -> None:
    """A continuation takes its inputs in acceptance order: while an Event accepted for the Work before
    its wake's winner is not routed yet, it does not start (`RoutingBehind`; the routing of that Event
    touches the Work, and the admission pass looks at it again)."""
    winner = tx.event(winner_id) if winner_id else None
    if winner is None:
        return
    behind = earlier_unrouted(tx, work.id, work.scope, work.keys, winner.seq)
    if behind:
        raise RoutingBehind(
            f"cannot claim work {work.id}: its continuation waits until event {behind[0].id}, accepted "
            f"before its wake's winner {winner.id}, is routed (inputs are taken in acceptance order)",
            event_id=behind[0].id,
        )


def renew_in_tx(tx: Tx, now_ms: int, auth: Authority, lease_ms: int) -> int:
    """Extend a live lease; return the new (exclusive) expiry."""
    check_int("lease_ms", lease_ms, 1, MAX_LEASE_MS)
    current = tx.execution(auth.execution_id)
    if current is not None and current.state is ExecutionState.RECOVERING:
        execution = authorize_recovery(tx, now_ms, auth)  # a recoverer renews while its executor verifies
    else:
        execution = authorize(tx, now_ms, auth)
    expires = now_ms + lease_ms
    tx.update_execution(execution.id, expires_at_ms=expires)
    return expires


def consume_claimed_inputs_in_tx(tx: Tx, execution: Execution) -> None:
    """An ended attempt took in every input it was handed: they are consumed by it."""
    for event_id in execution.inputs:
        tx.consume_if_pending(execution.work_id, event_id, execution.id)


def complete_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    outcome: Outcome,
    kind: KindPolicy,
    limits: CausalLimits | None = None,
    budgets: Sequence[Budget] = (),
) -> Execution:
    """Record an attempt's outcome under its fence, with its consumption proofs and the usage it
    reports (charged to ``budgets``), atomically.

    A `Waiting` outcome parks or ends the attempt on its wait (see `continuation.park_in_tx`): its proof
    is applied before the wait's registration scan, so it is never woken by what it already took in.
    """
    ended = record_outcome_in_tx(tx, now_ms, auth, outcome, kind, limits, budgets)
    if isinstance(ended, Execution):
        return ended
    result = tx.execution(auth.execution_id)
    assert result is not None
    return result


def record_outcome_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    outcome: Outcome,
    kind: KindPolicy,
    limits: CausalLimits | None = None,
    budgets: Sequence[Budget] = (),
    *,
    authorized: Execution | None = None,
) -> Execution | str:
    """`complete_in_tx` for a caller that needs only the Work: the parked attempt of a `Waiting`
    outcome, else the id of the attempt's Work (the ended attempt is not read back).

    ``authorized``: the attempt as `authorize` would answer it for ``auth`` now, when this transaction
    itself just fenced it (`chains.adopt_then_complete_in_tx`): it is not read again."""
    validate_outcome(outcome)
    if authorized is None:
        execution = authorize(tx, now_ms, auth)
    else:
        assert (authorized.id, authorized.epoch) == (auth.execution_id, auth.epoch), (
            "not this fence's attempt"
        )
        execution = authorized
    # the segment's clock was read with the attempt, or told by its adoption (no query): it is still
    # true when the segment ends
    clock = tx.execution_segment_clock(execution.id)
    work = require_work(tx, execution.work_id)
    place = tx.kept_queue_place(work.id)  # (kept with the Work's read; never a query of its own)
    if budgets and outcome.usage:
        charge_in_tx(tx, now_ms, work, outcome.usage, budgets, limits or CausalLimits())
    apply_proofs_in_tx(tx, now_ms, execution, outcome.consumed_inputs)
    consume_claimed_inputs_in_tx(tx, execution)
    # the segment's proof is in: its open intents (undispatched, or dispatched and unanswered) end
    # here, so a late dispatch answer finds them stale and changes nothing
    stale_open_intents_in_tx(tx, now_ms, execution.id)
    if not isinstance(outcome, Failed) and work.failures:
        # a turn that succeeded (completed, handed off, or ended on its wait) resets the failure budget
        tx.update_work(work.id, now_ms, failures=0)
        work = require_work(tx, work.id)
    if isinstance(outcome, Waiting):
        return park_in_tx(tx, now_ms, execution, work, outcome, limits or CausalLimits())
    handoff_settles = isinstance(outcome, Handoff) and kind.run_once
    if isinstance(outcome, Completed) or handoff_settles:
        state = ExecutionState.COMPLETED
    elif isinstance(outcome, Handoff):
        state = ExecutionState.HANDOFF
    else:
        state = ExecutionState.FAILED
    next_state = WorkState.READY
    if (
        state is ExecutionState.COMPLETED
        and not _still_pending(tx, work, execution, outcome)
        and not kind.standing
    ):
        unrouted = earlier_unrouted(tx, work.id, work.scope, work.keys, tx.max_seq() + 1)
        if unrouted:
            raise CompletionBlocked(
                f"work {work.id} cannot complete: accepted event {unrouted[0].id} resolving to it is not "
                "routed yet (retry once routing settles)",
                event_id=unrouted[0].id,
            )
        next_state = WorkState.COMPLETED
    end_segment_in_tx(tx, now_ms, execution, clock)
    tx.set_execution_state(
        execution, state, token=None, outcome=json.dumps(outcome_json(outcome)), ended_at_ms=now_ms
    )
    # a move to ready waits for the claim that mostly follows (`chains.complete_then_start_in_tx`): one
    # write of the Work's row for both (`Tx.move_later`; a terminal state is written at once)
    revision = tx.move_later(work, next_state, now_ms)
    tx.ended(execution.id, state)
    if not outcome.consumed_inputs and not (budgets and outcome.usage):  # nothing else wrote the Work
        ended = partial(ended_work, work, tuple(execution.inputs), next_state, revision, now_ms)
        tx.known_lazily("work", work.id, ended, pure=True)
        if place is not None:  # and its admission facts and queue place, for what follows
            pending = any(event_id not in execution.inputs for event_id in work.pending_inputs)
            facts = AdmissionFacts.told(work, next_state, place, now_ms, live=None, pending=pending)
            tx.known("facts", work.id, facts)
            tx.known("place", work.id, place)  # (an end moves no Work in the queue: the settle hook does)
    tx.notify(WorkChanged(work_id=work.id))
    if isinstance(outcome, Failed):
        apply_failure_in_tx(
            tx,
            now_ms,
            work.id,
            execution,
            error=outcome.error,
            hint_ms=outcome.retry_after_ms,
            rate_limited=outcome.rate_limited,
            final=not outcome.retryable,
        )
    return work.id


def _still_pending(tx: Tx, work: Work, execution: Execution, outcome: Outcome) -> bool:
    """Whether the Work has an input pending once ``execution``'s claimed inputs were consumed. Without
    proofs to apply that is its pending inputs as read before, less the attempt's: no query."""
    if outcome.consumed_inputs:
        return bool(tx.pending_inputs(work.id))
    claimed = execution.inputs
    return any(event_id not in claimed for event_id in work.pending_inputs)
