"""Active segments of an attempt: its active time, and the durable deadline timer of each segment.

An attempt's execution timeout counts active time only: a segment starts at a claim (or a resume)
and ends with an outcome, a cancel or an interrupt, which counts its time and disarms its deadline.
`deadlines` applies a deadline that fires.
"""

from __future__ import annotations

from ..records.core_events import CORE_SOURCE, EXECUTION_TIMEOUT
from ..records.notices import TimerCancelled
from ..records.timers import TimerSpec, TimerState
from ..records.validation import MAX_TIME_MS
from ..records.work import Execution
from ..store import Tx
from .timers import DEADLINE_TIMER_PREFIX, arm_in_tx


def deadline_timer_id(execution_id: str, segment: int) -> str:
    return f"{DEADLINE_TIMER_PREFIX}{execution_id}:{segment}"


def start_segment_in_tx(
    tx: Tx, now_ms: int, execution_id: str, segment: int, remaining_ms: int, parent_id: str, scope: str
) -> None:
    """Start an active segment with the remaining budget: its deadline is a durable timer whose
    template is a ``core.execution.timeout`` Event naming the execution and segment."""
    execution = tx.execution(execution_id)
    assert execution is not None
    timer_id = deadline_timer_id(execution_id, segment)
    payload = {
        "execution": execution_id,
        "segment": segment,
        "epoch": execution.epoch,
        "work": execution.work_id,
    }
    spec = TimerSpec(
        id=timer_id,
        fire_at_ms=min(now_ms + max(remaining_ms, 0), MAX_TIME_MS),  # none later than the last instant
        source=CORE_SOURCE,
        type=EXECUTION_TIMEOUT,
        scope=scope,
        payload=payload,
    )
    arm_in_tx(tx, now_ms, spec, parent_id=parent_id, execution_id=execution_id, control=True)
    tx.update_execution(execution_id, segment=segment, segment_started_ms=now_ms, deadline_timer_id=timer_id)


def end_segment_in_tx(
    tx: Tx, now_ms: int, execution: Execution, clock: tuple[int | None, str | None] | None = None
) -> None:
    """Close the active segment: count its active time and disarm its deadline. ``clock``: the segment's
    clock (`Tx.execution_segment_clock`) as the caller read it in this transaction, if it did."""
    started, timer_id = clock if clock is not None else tx.execution_segment_clock(execution.id)
    if started is None:
        return
    tx.update_execution(
        execution.id, used_ms=execution.used_ms + max(now_ms - started, 0), segment_started_ms=None
    )
    timer = tx.timer(timer_id) if timer_id else None
    if timer is not None and timer.state is TimerState.ARMED:
        tx.set_timer_state(timer, TimerState.CANCELLED, "segment ended", now_ms)
        tx.notify(TimerCancelled(timer_id=timer.id))
