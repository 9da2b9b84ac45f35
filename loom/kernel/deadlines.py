"""Execution deadlines: active-time budgets as durable ``core.execution.timeout`` timers.

Each active segment of an attempt arms a deadline timer for its remaining budget (`segments`). When
the timer fires, `TIMER_KIND` applies the deadline inside the firing transaction: if that segment is still the
active one, the attempt is fenced and failed under its current fence; a stale deadline does nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..config import CausalLimits
from ..records.core_events import EXECUTION_TIMEOUT
from ..records.events import CausalRejection, Event
from ..records.notices import ExecutionFenced, WorkChanged
from ..records.timers import Timer
from ..records.work import ExecutionState, InputState, WorkState
from ..store import Tx
from .checkpoints import control_checkpoint
from .intents import stale_open_intents_in_tx
from .retry import apply_failure_in_tx
from .segments import end_segment_in_tx
from .timer_kind import TimerKind


def apply_deadline_in_tx(
    tx: Tx,
    now_ms: int,
    event: Event | None,
    payload: Mapping[str, Any],
    refusal: CausalRejection | None = None,
) -> None:
    """A ``core.execution.timeout`` was accepted (``event``), or refused by the causal bounds (``None``,
    with the ``refusal``):
    if its segment is still the active one, fence the attempt and fail it under its current fence; a
    stale deadline does nothing.

    The control checkpoint keeps Work and execution in the envelope but routes nothing, so earlier
    runnable input cannot delay the fencing. A refused deadline still fences, and holds the Work.
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
        if tx.input_state(work.id, event_id) is InputState.PENDING:
            tx.consume_input(work.id, event_id, execution.id)
    stale_open_intents_in_tx(tx, now_ms, execution.id)
    end_segment_in_tx(tx, now_ms, execution)
    outcome = {
        "kind": "failed",
        "error": f"execution timeout after {execution.budget_ms} ms of active time",
        "timeout_event_id": event.id if event else None,
    }
    tx.set_execution_state(
        execution, ExecutionState.FAILED, token=None, ended_at_ms=now_ms, outcome=json.dumps(outcome)
    )
    if work.state is WorkState.RUNNING:
        tx.set_work_state(work, WorkState.READY, now_ms)
    apply_failure_in_tx(
        tx, now_ms, work.id, execution, error=f"execution timeout after {execution.budget_ms} ms"
    )
    if event is not None:
        control_checkpoint(tx, now_ms, event, None, f"execution deadline of {execution.id}")
    else:
        # the causal bounds refused the deadline Event: fenced all the same, and held
        tx.update_work(
            work.id,
            now_ms,
            held=1,
            hold_reason="causal_rejection: the execution deadline's event was refused"
            + (f" ({refusal.describe()})" if refusal is not None else ""),
        )
    tx.notify(ExecutionFenced(execution_id=execution.id, work_id=work.id))
    tx.notify(WorkChanged(work_id=work.id))


def _on_fired(tx: Tx, now_ms: int, timer: Timer, event: Event, limits: CausalLimits) -> None:
    apply_deadline_in_tx(tx, now_ms, event, event.payload)


def _on_refused(tx: Tx, now_ms: int, timer: Timer, rejection: CausalRejection, limits: CausalLimits) -> None:
    apply_deadline_in_tx(tx, now_ms, None, timer.payload, rejection)


TIMER_KIND = TimerKind(event_type=EXECUTION_TIMEOUT, on_fired=_on_fired, on_refused=_on_refused)
"""How a firing of a deadline timer is applied (registered in `timer_kinds`)."""
