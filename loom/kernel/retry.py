"""Retry with backoff.

Failure atomically ends the attempt, leaves the Work ready but not eligible, and arms a durable retry
timer whose ``core.retry.due`` Event (derived from the failed attempt's authority) makes the Work
eligible again when it is routed, only if its failure generation is still current, the Work is not
terminal and nothing live blocks it. The default budget is three failure attempts (5 then 10 minutes);
a configured four-attempt budget adds 15. The failure count is policy state, apart from the monotonic
attempt number. A spent budget holds the Work with a reason (or fails it, with ``fail_on_exhaustion``);
a manual ``core.retry.requested`` clears backoff or exhaustion, cancels the old timer and resets the
budget.

An executor's retry hint (``Failed.retry_after_ms``: a known reset) waits that long plus two minutes;
a rate-limited failure without one waits 30 minutes. Hints are bounded when validated.

Standing Work has no failure budget: a failure arms no automatic retry (its next input is its next
attempt) unless its executor hinted when to try again (a busy or rate-limited job), which it honours
the same way, spending nothing and never exhausting.
"""

from __future__ import annotations

from ..config import CausalLimits
from ..records.clock import iso_ms
from ..records.core_events import CORE_SOURCE, RETRY_DUE, RETRY_REQUESTED
from ..records.errors import Conflict
from ..records.events import CausalRejection, DiagnosticKind, Event, EventIn
from ..records.ids import core_delivery_id
from ..records.notices import AttemptFailed, TimerCancelled, WorkChanged, WorkSettled
from ..records.timers import Timer, TimerSpec, TimerState
from ..records.validation import MAX_TIME_MS
from ..records.work import Checkpoint, CheckpointStatus, Execution, RetryState, Work, WorkState
from ..store import Tx
from ._common import require_work
from .accept import accept_in_tx, delivered
from .checkpoints import control_checkpoint
from .kinds import KindPolicy, pinned_retry
from .timer_kind import TimerKind
from .timers import RETRY_TIMER_PREFIX, arm_in_tx

HINT_MARGIN_MS = 120_000
"""A known reset time is waited for, plus two minutes."""
RATE_LIMITED_MS = 30 * 60_000
"""A rate-limited failure with no known reset waits 30 minutes."""


def retry_delay_ms(kind: KindPolicy, failures: int, hint_ms: int | None, rate_limited: bool) -> int | None:
    """The wait before the next automatic attempt after the ``failures``-th consecutive failure
    (``None``: no automatic retry: the budget is spent, or the Work is standing)."""
    if kind.standing or not 1 <= failures < kind.retry_attempts:
        return None
    hinted = hinted_delay_ms(hint_ms, rate_limited)
    return hinted if hinted is not None else kind.retry_backoff_ms[failures - 1]


def hinted_delay_ms(hint_ms: int | None, rate_limited: bool) -> int | None:
    """The wait an executor's hint asks for (``None``: it gave none)."""
    if hint_ms is not None:
        return hint_ms + HINT_MARGIN_MS
    if rate_limited:
        return RATE_LIMITED_MS
    return None


def retry_timer_id(work_id: str, attempt: int) -> str:
    """One retry timer per failed attempt: a later failure's timer never answers for an earlier one."""
    return f"{RETRY_TIMER_PREFIX}{work_id}:{attempt}"


def apply_failure_in_tx(
    tx: Tx,
    now_ms: int,
    work_id: str,
    execution: Execution,
    *,
    error: str,
    hint_ms: int | None = None,
    rate_limited: bool = False,
    final: bool = False,
) -> None:
    """The attempt failed (its state is written): arm the retry timer, or hold (or fail) the Work when
    the budget is spent, under the retry policy pinned on the attempt at its claim. Standing Work arms
    nothing. ``final``: its executor said it would fail again (`Failed.retryable`): no automatic retry,
    and no hint is honoured; the Work is held (or fails) as with its budget spent."""
    kind = pinned_retry(execution.retry_policy)
    work = require_work(tx, work_id)
    if work.state.terminal:
        return
    if kind.standing:
        hinted = None if final else hinted_delay_ms(hint_ms, rate_limited)
        if hinted is None:
            then = "its next input starts the next attempt"
            _failed(tx, now_ms, work, execution, error, work.failures, None, then)
        else:  # honoured with no budget to spend: the failure count stays as it is
            then = (
                "its executor asked to be tried again: the next attempt at {at} (standing: no retry budget)"
            )
            _back_off(tx, now_ms, work, execution, error, work.failures, hinted, then)
        return
    failures = work.failures + 1
    delay = None if final else retry_delay_ms(kind, failures, hint_ms, rate_limited)
    if delay is not None:
        left = kind.retry_attempts - failures
        then = f"retry {failures} of {kind.retry_attempts - 1} due at {{at}} ({left} failure{'s' if left != 1 else ''} left)"
        _back_off(tx, now_ms, work, execution, error, failures, delay, then)
        return
    summary = f"{failures} failed attempt{'s' if failures != 1 else ''} (the last: {error})"
    if final:
        summary = f"a failure its executor marked final, not to be retried ({error})"
    if kind.fail_on_exhaustion:
        tx.update_work(
            work.id, now_ms, failures=failures, retry=RetryState.EXHAUSTED.value, retry_timer_id=None
        )
        tx.set_work_state(require_work(tx, work.id), WorkState.FAILED, now_ms)
        spent = "it is not retried" if final else "its retry budget is spent"
        message = f"work {work.id} failed: {spent} after {summary}"
    else:
        message = (
            f"{'no automatic retry' if final else 'retries exhausted'} after {summary}: request a retry to"
            " start the next attempt with a fresh budget, or cancel the work"
        )
        tx.update_work(
            work.id,
            now_ms,
            failures=failures,
            retry=RetryState.EXHAUSTED.value,
            retry_timer_id=None,
            held=1,
            hold_reason=message,
        )
    _failed(
        tx,
        now_ms,
        work,
        execution,
        error,
        failures,
        None,
        "no retry is left: the work failed"
        if kind.fail_on_exhaustion
        else "no retry is left: the work is held",
    )
    tx.add_diagnostic(
        DiagnosticKind.RETRY_EXHAUSTED, work.id, message, {"work": work.id, "failures": failures}, now_ms
    )
    tx.notify(WorkChanged(work_id=work.id))
    tx.notify(WorkSettled(work_id=work.id))


def _back_off(
    tx: Tx, now_ms: int, work: Work, execution: Execution, error: str, failures: int, delay: int, then: str
) -> None:
    """Arm the failed attempt's retry timer ``delay`` from now and put the Work in backoff."""
    timer_id = retry_timer_id(work.id, execution.attempt)
    due = min(now_ms + delay, MAX_TIME_MS)  # nothing is later than the last instant loom stores
    parent = execution.authority_id or execution.trigger_id
    assert parent is not None, f"execution {execution.id} has no causal authority"
    spec = TimerSpec(
        id=timer_id,
        fire_at_ms=due,
        source=CORE_SOURCE,
        type=RETRY_DUE,
        scope=work.scope,
        work_id=work.id,
        delivery_id=core_delivery_id("retry.due", work.id, str(execution.attempt)),
        payload={
            "work": work.id,
            "failures": failures,
            "attempt": execution.attempt,
            "execution": execution.id,
        },
    )
    arm_in_tx(tx, now_ms, spec, parent_id=parent, execution_id=execution.id, control=True)
    tx.update_work(
        work.id, now_ms, failures=failures, retry=RetryState.BACKOFF.value, retry_timer_id=timer_id
    )
    tx.notify(WorkChanged(work_id=work.id))
    _failed(tx, now_ms, work, execution, error, failures, due, then)


MAX_ERROR_SHOWN = 500
"""How much of an attempt's error its ``attempt_failed`` diagnostic repeats (the attempt keeps all of it)."""


def _failed(
    tx: Tx,
    now_ms: int,
    work: Work,
    execution: Execution,
    error: str,
    failures: int,
    retry_at_ms: int | None,
    then: str,
) -> None:
    """Say that the attempt failed and what follows: an ``attempt_failed`` diagnostic on the Work, and an
    `AttemptFailed` notice (the runtime logs it). ``then`` may hold ``{at}``: the retry's time."""
    then = then.format(at=iso_ms(retry_at_ms)) if retry_at_ms is not None else then
    shown = error if len(error) <= MAX_ERROR_SHOWN else error[: MAX_ERROR_SHOWN - 3] + "..."
    tx.add_diagnostic(
        DiagnosticKind.ATTEMPT_FAILED,
        work.id,
        f"attempt {execution.attempt} ({execution.id}) failed: {shown}; {then}",
        {
            "work": work.id,
            "execution": execution.id,
            "attempt": execution.attempt,
            "failures": failures,
            "retry_at_ms": retry_at_ms,
        },
        now_ms,
    )
    tx.notify(
        AttemptFailed(
            work_id=work.id,
            execution_id=execution.id,
            attempt=execution.attempt,
            error=error,
            failures=failures,
            retry_at_ms=retry_at_ms,
            then=then,
        )
    )


def retry_in_tx(
    tx: Tx, now_ms: int, work_id: str, request_id: str, reason: str, limits: CausalLimits
) -> Event:
    """A manual ``core.retry.requested``: clear backoff or exhaustion, cancel the old retry timer, reset
    the budget, and make the request itself the next attempt's input. Repeating ``request_id`` returns
    the first request; a Work with a live attempt, a waiting one, or a terminal one, is refused
    (`Conflict`)."""
    delivery_id = core_delivery_id("retry.requested", work_id, request_id)
    done = delivered(tx, CORE_SOURCE, delivery_id)
    if done is not None:
        return done
    work = require_work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot retry work {work.id}: it is {work.state} (a retry needs a successor)")
    if work.current_execution_id is not None:
        raise Conflict(f"cannot retry work {work.id}: attempt {work.current_execution_id} is not over")
    if work.state is WorkState.WAITING:
        # its wait decides what comes next: a retry would queue behind it as context, and start nothing
        raise Conflict(
            f"cannot retry work {work.id}: it is waiting on wait {work.wait_id} (its wake starts the next"
            " attempt; cancel the work to end it)"
        )
    requested = accept_in_tx(
        tx,
        now_ms,
        EventIn(
            source=CORE_SOURCE,
            delivery_id=delivery_id,
            type=RETRY_REQUESTED,
            scope=work.scope,
            work_id=work.id,
            payload={"work": work.id, "reason": reason, "failures": work.failures},
        ),
        limits,
        trusted=True,
    )
    _cancel_retry_timer(tx, now_ms, work, "a manual retry replaced it")
    fields: dict[str, object] = {"failures": 0, "retry": None, "retry_timer_id": None}
    if work.held and work.retry is RetryState.EXHAUSTED:
        fields.update(held=0, hold_reason=None)
    tx.update_work(work.id, now_ms, **fields)
    _as_input(tx, now_ms, requested, work.id, "a manual retry request")
    return requested


def _cancel_retry_timer(tx: Tx, now_ms: int, work: Work, reason: str) -> None:
    timer = tx.timer(retry_timer_id(work.id, work.attempts)) if work.attempts else None
    if timer is not None and timer.state is TimerState.ARMED:
        tx.set_timer_state(timer, TimerState.CANCELLED, reason, now_ms)
        tx.notify(TimerCancelled(timer_id=timer.id))


def _as_input(tx: Tx, now_ms: int, event: Event, work_id: str, why: str) -> None:
    """A retry Event is the next attempt's input (and trigger): the failed attempt consumed its own."""
    tx.insert_checkpoint(
        Checkpoint(
            event_id=event.id,
            seq=event.seq,
            status=CheckpointStatus.ROUTED,
            work_id=work_id,
            route=None,
            route_scope=None,
            policy=None,
            effective_policy=None,
            fallback_reason=None,
            reason=why,
            generation=None,
            at_ms=now_ms,
        )
    )
    tx.add_input(work_id, event.id, event.seq)
    tx.notify(WorkChanged(work_id=work_id))


def _retry_due(tx: Tx, now_ms: int, timer: Timer, event: Event, limits: CausalLimits) -> None:
    """``core.retry.due`` was accepted: the Work becomes eligible only if this is its current failure
    generation, it is not terminal and no attempt is live; anything else is audit only."""
    work = tx.work(str(event.payload.get("work", "")))
    current = (
        work is not None
        and not work.state.terminal
        and work.retry is RetryState.BACKOFF
        and tx.work_retry_timer(work.id) == timer.id
        and work.current_execution_id is None
    )
    if not current or work is None:
        control_checkpoint(tx, now_ms, event, work.id if work else None, "a stale retry (audit only)")
        return
    tx.update_work(work.id, now_ms, retry=None, retry_timer_id=None)
    _as_input(tx, now_ms, event, work.id, f"retry due after attempt {event.payload.get('attempt')} failed")


def _retry_refused(
    tx: Tx, now_ms: int, timer: Timer, rejection: CausalRejection, limits: CausalLimits
) -> None:
    """The causal limits refused the retry's Event: no wake without an Event; hold the Work saying so."""
    work = tx.work(str(timer.payload.get("work", "")))
    if work is None or work.state.terminal or work.retry is not RetryState.BACKOFF:
        return
    reason = (
        f"its retry was refused by the causal limits ({rejection.describe()}); request a retry to start "
        "the next attempt"
    )
    tx.update_work(
        work.id, now_ms, retry=RetryState.EXHAUSTED.value, retry_timer_id=None, held=1, hold_reason=reason
    )
    tx.notify(WorkChanged(work_id=work.id))
    tx.notify(WorkSettled(work_id=work.id))


TIMER_KIND = TimerKind(event_type=RETRY_DUE, on_fired=_retry_due, on_refused=_retry_refused)
"""How a retry timer's firing is applied (registered in `timer_kinds`)."""


def cancel_retry_in_tx(tx: Tx, now_ms: int, work: Work) -> None:
    """Cancellation removes the retry eligibility and its timer (part of cancelling the Work)."""
    _cancel_retry_timer(tx, now_ms, work, f"work {work.id} was cancelled")
