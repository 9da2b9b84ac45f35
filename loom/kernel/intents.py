"""Intents: inject and interrupt controls, committed before their executor is called.

Dispatch happens outside any transaction, between `begin_dispatch_in_tx` (the attempt is recorded)
and `finish_dispatch_in_tx` (the executor's answer). An inject answer of ``None`` means accepted for
delivery, never consumed; `NotAccepting` settles the intent and the input stays pending; anything
else is ambiguous and retried with the same intent identity on a durable schedule.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from ..records.errors import NotFound
from ..records.events import DiagnosticKind, Event
from ..records.ids import stable_id
from ..records.notices import WorkChanged
from ..records.work import (
    OPEN_INTENT_STATUSES,
    Execution,
    ExecutionState,
    InputState,
    Intent,
    IntentKind,
    IntentStatus,
    Policy,
    WorkState,
)
from ..store import Tx
from ._common import require_event
from .segments import end_segment_in_tx

DISPATCH_ATTEMPTS = 5
DISPATCH_BACKOFF_MS = 1_000


class DispatchResult(enum.StrEnum):
    """What an executor answered to one dispatch."""

    ACCEPTED = "accepted"
    NOT_ACCEPTING = "not_accepting"
    AMBIGUOUS = "ambiguous"


@attrs.frozen(kw_only=True)
class Dispatch:
    intent: Intent
    execution: Execution
    event: Event


def intent_id(kind: IntentKind, event_id: str, execution_id: str) -> str:
    """An intent's identity: its kind, its Event and the attempt it targets (stable across retries)."""
    return stable_id("in", kind.value, event_id, execution_id)


def stale_open_intents_in_tx(tx: Tx, now_ms: int, execution_id: str) -> None:
    """The attempt ended: its undispatched or unanswered intents never retarget another attempt."""
    for intent in tx.open_intents_of_execution(execution_id):
        tx.set_intent_status(intent, IntentStatus.STALE, now_ms)


def begin_dispatch_in_tx(tx: Tx, now_ms: int, intent_id: str) -> Dispatch | None:
    """Mark an intent as dispatched (attempted) before the executor is called.

    ``None``: nothing to dispatch (settled, stale, or its attempt ended: a post-completion
    dispatch never targets another attempt).
    """
    intent = tx.intent(intent_id)
    if intent is None:
        raise NotFound(f"no intent with id {intent_id!r}")
    if intent.status not in OPEN_INTENT_STATUSES:
        return None
    execution = tx.execution(intent.execution_id)
    assert execution is not None
    live = ExecutionState.RUNNING if intent.kind is IntentKind.INJECT else ExecutionState.STOPPING
    if execution.state is not live:
        tx.set_intent_status(intent, IntentStatus.STALE, now_ms)
        return None
    tx.set_intent_status(intent, IntentStatus.DISPATCHING, now_ms, attempted=True)
    tx.notify(WorkChanged(work_id=intent.work_id))
    return Dispatch(
        intent=attrs.evolve(intent, status=IntentStatus.DISPATCHING),
        execution=execution,
        event=require_event(tx, intent.event_id),
    )


def finish_dispatch_in_tx(tx: Tx, now_ms: int, intent_id: str, result: DispatchResult) -> Intent:
    """Record the executor's answer. A late acknowledgement never undoes a consumption."""
    intent = tx.intent(intent_id)
    if intent is None:
        raise NotFound(f"no intent with id {intent_id!r}")
    if intent.status is IntentStatus.DISPATCHING:
        if result is DispatchResult.AMBIGUOUS:
            # the same intent identity is tried again later, a bounded number of times
            retry = (
                now_ms + DISPATCH_BACKOFF_MS * intent.attempts
                if intent.attempts < DISPATCH_ATTEMPTS
                else None
            )
            if retry is not None:
                tx.set_intent_status(intent, IntentStatus.DISPATCHING, now_ms, next_attempt_ms=retry)
            else:
                _give_up(tx, now_ms, intent)
        elif intent.kind is IntentKind.INTERRUPT:
            _settle_interrupt(tx, now_ms, intent)
        elif result is DispatchResult.ACCEPTED:
            tx.set_intent_status(intent, IntentStatus.ACCEPTED, now_ms)
        else:
            tx.set_intent_status(intent, IntentStatus.NOT_ACCEPTING, now_ms)
    tx.notify(WorkChanged(work_id=intent.work_id))
    settled = tx.intent(intent_id)
    assert settled is not None
    return settled


def _give_up(tx: Tx, now_ms: int, intent: Intent) -> None:
    """Every dispatch stayed ambiguous: end the intent in its fallback, with a diagnostic.

    The Event's input takes its route's error fallback: ``drop`` drops it; otherwise (``queue``, or
    none configured) it stays pending for the next attempt. An interrupt's attempt stays fenced besides
    (its process may still run: nothing may start beside it), and the Work is held with a reason an
    operator can act on. (An operator's interrupt has no fallback, and its control Event is no input.)
    """
    tx.set_intent_status(intent, IntentStatus.GAVE_UP, now_ms)
    detail = {"intent": intent.id, "execution": intent.execution_id, "attempts": intent.attempts}
    state = tx.input_state(intent.work_id, intent.event_id)
    if state is None and intent.kind is IntentKind.INTERRUPT:
        outcome = ""
    elif state is not InputState.PENDING:
        outcome = f"; the input is no longer pending ({state or 'not recorded'}): it is left as it is"
    elif intent.error_fallback is Policy.DROP:
        tx.drop_input(intent.work_id, intent.event_id)
        outcome = "; the route's drop error fallback dropped the input"
    else:
        outcome = "; the input stays pending for the next attempt (queue)"
    if intent.kind is IntentKind.INJECT:
        message = f"inject of event {intent.event_id}: {intent.attempts} ambiguous dispatches{outcome}"
    else:
        reason = (
            f"the interrupt of attempt {intent.execution_id} was not confirmed after {intent.attempts} "
            "tries: make sure its process has stopped, then release the hold to end the attempt"
        )
        work = tx.work(intent.work_id)
        if work is not None and not work.state.terminal:
            tx.update_work(work.id, now_ms, held=1, hold_reason=reason)
        message = f"interrupt of {intent.execution_id}: {reason}{outcome}"
    tx.add_diagnostic(DiagnosticKind.DISPATCH_GAVE_UP, intent.event_id, message, detail, now_ms)


def end_unconfirmed_stop_in_tx(tx: Tx, now_ms: int, work_id: str) -> None:
    """An operator released a Work held because an interrupt was never confirmed: the fenced attempt
    ends (cancelled) so the next one may start."""
    live = tx.live_execution(work_id)
    if live is None or live.state is not ExecutionState.STOPPING:
        return
    if not any(
        i.kind is IntentKind.INTERRUPT and i.status is IntentStatus.GAVE_UP
        for i in tx.intents_of_execution(live.id)
    ):
        return
    end_segment_in_tx(tx, now_ms, live)
    tx.set_execution_state(
        live, ExecutionState.CANCELLED, ended_at_ms=now_ms, outcome='{"kind":"interrupted","confirmed":false}'
    )
    work = tx.work(work_id)
    if work is not None and work.state is WorkState.RUNNING:
        tx.set_work_state(work, WorkState.READY, now_ms)


def _settle_interrupt(tx: Tx, now_ms: int, intent: Intent) -> None:
    """The executor stopped the interrupted attempt: end it and leave the Work ready."""
    tx.set_intent_status(intent, IntentStatus.DONE, now_ms)
    execution = tx.execution(intent.execution_id)
    assert execution is not None
    if execution.state is ExecutionState.STOPPING:
        end_segment_in_tx(tx, now_ms, execution)
        tx.set_execution_state(
            execution,
            ExecutionState.CANCELLED,
            interrupt_event_id=intent.event_id,
            ended_at_ms=now_ms,
            outcome='{"kind":"interrupted"}',
        )
        work = tx.work(execution.work_id)
        assert work is not None
        if work.state is WorkState.RUNNING:
            tx.set_work_state(work, WorkState.READY, now_ms)
        tx.notify(WorkChanged(work_id=work.id))


def apply_proofs_in_tx(tx: Tx, now_ms: int, execution: Execution, consumed: Sequence[str]) -> None:
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
        if tx.input_state(execution.work_id, event_id) is not InputState.PENDING:
            continue
        tx.consume_input(execution.work_id, event_id, execution.id)
        tx.set_intent_status(intent, IntentStatus.CONSUMED, now_ms)
