"""Operator controls: hold, release, cancel and interrupt.

Cancellation fences every attempt and intent before it terminalises the Work, and never rewrites
terminal Work. An operator interrupt is a ``core.manual.interrupt`` control Event plus an interrupt
intent against the running attempt; the Event is a control, never input.
"""

from __future__ import annotations

import json

from ..config import CausalLimits
from ..records.core_events import CORE_SOURCE, MANUAL_INTERRUPT, WORK_RELEASED
from ..records.errors import Conflict, InvalidRequest
from ..records.events import EventIn
from ..records.ids import core_delivery_id
from ..records.notices import ExecutionFenced, IntentPending, TimerCancelled, WorkChanged
from ..records.timers import TimerState
from ..records.validation import check_reason, check_text
from ..records.waits import WaitState
from ..records.work import Capability, ExecutionState, Intent, IntentKind, RetryState, Work, WorkState
from ..store import Tx
from ._common import require_work
from .accept import accept_in_tx, delivered
from .checkpoints import control_checkpoint
from .intents import end_unconfirmed_stop_in_tx, intent_id, stale_open_intents_in_tx
from .segments import end_segment_in_tx
from .waits import cancel_wait_in_tx, unblock_waits_in_tx


def hold_in_tx(tx: Tx, now_ms: int, work_id: str, reason: str) -> Work:
    check_reason("reason", reason)
    work = require_work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot hold work {work.id}: it is {work.state}")
    tx.update_work(work.id, now_ms, held=1, hold_reason=reason, budget_hold=None)
    tx.notify(WorkChanged(work_id=work.id))
    return require_work(tx, work_id)


def release_in_tx(
    tx: Tx, now_ms: int, work_id: str, limits: CausalLimits | None = None, request_id: str | None = None
) -> Work:
    """Release a hold: the next start goes through (start gates let it through once). A blocked wait is
    rearmed and arbitrated again, with a root ``core.work.released`` Event (the operator's outside
    input) as the parent of its next wake."""
    work = require_work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot release work {work.id}: it is {work.state}")
    if not work.held:
        raise Conflict(f"work {work.id} is not held")
    if work.retry is RetryState.EXHAUSTED:
        raise Conflict(
            f"work {work.id} is held because its retry budget is spent: request a retry to start the next "
            "attempt with a fresh budget (a release would start nothing)"
        )
    reason = work.hold_reason
    # the one turn a release grants answers the hold it ends: a budget's (one more turn past it), or a
    # start gate's before the first start; an operator's hold of a started Work grants nothing more
    once = not work.started or tx.budget_hold(work.id) is not None
    tx.update_work(work.id, now_ms, held=0, hold_reason=None, release_once=int(once), budget_hold=None)
    end_unconfirmed_stop_in_tx(tx, now_ms, work.id)
    wait = tx.open_wait_of_work(work.id)
    if wait is not None and wait.state is WaitState.BLOCKED:
        release = accept_in_tx(
            tx,
            now_ms,
            EventIn(
                source=CORE_SOURCE,
                delivery_id=core_delivery_id("work.released", work.id, request_id or str(now_ms)),
                type=WORK_RELEASED,
                scope=work.scope,
                work_id=work.id,
                payload={"work": work.id, "hold_reason": reason or ""},
            ),
            limits or CausalLimits(),
            trusted=True,
        )
        if release.compacted:
            raise Conflict(
                f"release request {request_id!r} of work {work.id} was already used, and its record was"
                " removed by compaction: use a new request id"
            )
        if not release.duplicate:
            control_checkpoint(tx, now_ms, release, work.id, "operator release")
        released = require_work(tx, work_id)
        unblock_waits_in_tx(tx, now_ms, released, release, limits or CausalLimits())
    tx.notify(WorkChanged(work_id=work.id))
    return require_work(tx, work_id)


def cancel_in_tx(tx: Tx, now_ms: int, work_id: str) -> Work:
    """Cancel Work: fence every attempt and intent first, then terminalise. Never rewrites terminal Work."""
    work = require_work(tx, work_id)
    if work.state.terminal:
        raise Conflict(f"cannot cancel work {work.id}: it is already {work.state}")
    live = tx.live_execution(work.id)
    if live is not None:
        end_segment_in_tx(tx, now_ms, live)
        tx.set_execution_state(
            live,
            ExecutionState.CANCELLED,
            token=None,
            ended_at_ms=now_ms,
            outcome=json.dumps({"kind": "cancelled"}),
        )
        stale_open_intents_in_tx(tx, now_ms, live.id)
        tx.notify(ExecutionFenced(execution_id=live.id, work_id=work.id))
    cancel_wait_in_tx(tx, now_ms, work)
    for timer in tx.armed_timers_of_work(work.id):
        # every timer its attempts armed dies with the Work (deadlines included)
        tx.set_timer_state(timer, TimerState.CANCELLED, f"work {work.id} was cancelled", now_ms)
        tx.notify(TimerCancelled(timer_id=timer.id))
    # its retry eligibility ends with it (the retry timer is among the timers cancelled above)
    tx.set_work_state(
        work,
        WorkState.CANCELLED,
        now_ms,
        held=0,
        hold_reason=None,
        retry=None,
        retry_timer_id=None,
        budget_hold=None,
    )
    tx.notify(WorkChanged(work_id=work.id))
    return require_work(tx, work_id)


def manual_interrupt_in_tx(
    tx: Tx, now_ms: int, work_id: str, request_id: str, reason: str, limits: CausalLimits
) -> Intent:
    """The operator interrupt: a ``core.manual.interrupt`` control Event plus an interrupt intent.

    Refused unless the running attempt was pinned with the interrupt capability.
    """
    check_text("request_id", request_id)
    check_reason("reason", reason)
    work = require_work(tx, work_id)
    replayed = delivered(tx, CORE_SOURCE, f"manual.interrupt/{request_id}")
    if replayed is not None and replayed.compacted:
        raise Conflict(
            f"interrupt request {request_id!r} was already used, and its record was removed by compaction:"
            " use a new request id"
        )
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
    if Capability.INTERRUPT.value not in live.capabilities:  # (its binding, not the request, refuses it)
        raise Conflict(
            f"cannot interrupt work {work.id}: its attempt {live.id} was not pinned with the interrupt "
            f"capability (executor {live.executor!r})"
        )
    control = EventIn(
        source=CORE_SOURCE,
        delivery_id=core_delivery_id("manual.interrupt", request_id),
        type=MANUAL_INTERRUPT,
        scope=work.scope,
        work_id=work.id,
        payload={"reason": reason, "execution": live.id},
    )
    event = accept_in_tx(tx, now_ms, control, limits, trusted=True)
    if not event.duplicate:
        control_checkpoint(tx, now_ms, event, work.id, "operator interrupt")
    iid = intent_id(IntentKind.INTERRUPT, event.id, live.id)
    tx.insert_intent(
        id=iid,
        kind=IntentKind.INTERRUPT,
        work_id=work.id,
        event_id=event.id,
        execution_id=live.id,
        epoch=live.epoch,
        now_ms=now_ms,
    )
    tx.set_execution_state(live, ExecutionState.STOPPING, token=None)
    tx.update_work(work.id, now_ms)
    tx.notify(IntentPending(intent_id=iid, work_id=work.id))
    tx.notify(WorkChanged(work_id=work.id))
    intent = tx.intent(iid)
    assert intent is not None
    return intent
