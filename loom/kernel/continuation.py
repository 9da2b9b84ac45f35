"""Continuation after a wait: parking an attempt on its waiting outcome, and resuming it (or starting attempt N+1) once woken.

A resume-capable attempt (its binding pinned ``resume``) parks: its authority is released, its active
time stops counting, and after the wake the same attempt resumes at a higher epoch with a new token,
its original trigger kept and the winner as `RunRequest.trigger`. Any other attempt ends on its wait
and attempt N+1 starts with the winner. Either way the continuation's causal authority is the wake's
``core.wait.woken`` bridge, and `RunRequest.inputs` is the ordered batch accumulated meanwhile.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..config import Budget, CausalLimits
from ..records.errors import Conflict, StaleAuthority
from ..records.events import Event
from ..records.notices import WorkChanged
from ..records.waits import Wait, Waiting
from ..records.work import (
    Capability,
    Execution,
    ExecutionState,
    Lease,
    RunRequest,
    Work,
    WorkState,
    outcome_json,
)
from ..store import Tx
from .authority import Authority
from .budgets import charge_in_tx
from .segments import end_segment_in_tx, start_segment_in_tx
from .waits import register_wait_in_tx


def park_in_tx(
    tx: Tx, now_ms: int, execution: Execution, work: Work, outcome: Waiting, limits: CausalLimits
) -> Execution:
    """Apply a waiting outcome (its inputs already settled by the caller): park or end the attempt,
    make the Work waiting, and register the wait, which scans history and may wake it at once."""
    resume = Capability.RESUME.value in execution.capabilities
    end_segment_in_tx(tx, now_ms, execution)
    data = json.dumps(outcome_json(outcome))
    if resume:
        # the token stays with the parked record (a host may still enrich it); authority needs `running`
        tx.set_execution_state(execution, ExecutionState.PARKED, outcome=data)
    else:
        tx.set_execution_state(execution, ExecutionState.WAITED, token=None, outcome=data, ended_at_ms=now_ms)
    tx.set_work_state(work, WorkState.WAITING, now_ms)
    tx.notify(WorkChanged(work_id=work.id))
    parked = tx.execution(execution.id)
    assert parked is not None
    waiting = tx.work(work.id)
    assert waiting is not None
    register_wait_in_tx(tx, now_ms, parked, waiting, outcome.wait, resume=resume, limits=limits)
    result = tx.execution(execution.id)
    assert result is not None
    return result


def resume_in_tx(
    tx: Tx,
    now_ms: int,
    work: Work,
    execution: Execution,
    wake: Wait,
    inputs: list[Event],
    *,
    token: str,
    owner: str,
    lease_ms: int,
    config: Mapping[str, Any],
) -> Lease:
    """Resume a parked attempt after its wake: a higher epoch, a new token, the winner as trigger, the
    accumulated batch as inputs, and a new active segment with the budget it has left."""
    winner = tx.event(wake.winner_event_id or "")
    assert winner is not None, f"woken wait {wake.id} has no winner"
    epoch = execution.epoch + 1
    expires = now_ms + lease_ms
    watermark = max([execution.watermark, *(e.seq for e in inputs)])
    tx.set_execution_state(
        execution,
        ExecutionState.RUNNING,
        epoch=epoch,
        token=token,
        owner=owner,
        expires_at_ms=expires,
        inputs=json.dumps([e.id for e in inputs]),
        watermark=watermark,
        authority_id=wake.bridge_event_id,
    )
    tx.take_wake(wake, now_ms)
    if execution.budget_ms is not None:
        parent = wake.bridge_event_id or winner.id
        remaining = execution.budget_ms - execution.used_ms
        start_segment_in_tx(tx, now_ms, execution.id, execution.segment + 1, remaining, parent, work.scope)
    tx.set_work_state(work, WorkState.RUNNING, now_ms, release_once=0)
    tx.notify(WorkChanged(work_id=work.id))
    request = RunRequest(
        work_id=work.id,
        execution_id=execution.id,
        attempt=execution.attempt,
        scope=work.scope,
        kind=work.kind,
        trigger=winner,
        inputs=tuple(inputs),
        binding=execution.binding,
        config=config,
        executor=execution.executor,
        resumed=True,
    )
    return Lease(
        execution_id=execution.id,
        work_id=work.id,
        attempt=execution.attempt,
        epoch=epoch,
        token=token,
        owner=owner,
        expires_at_ms=expires,
        request=request,
    )


def enrich_waiting_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    usage: Mapping[str, float],
    artifacts: tuple[str, ...],
    budgets: Sequence[Budget] = (),
    limits: CausalLimits | None = None,
) -> Execution:
    """A later host acknowledgement of a parked attempt's waiting result: it may
    add usage and artifact references to the still-parked record without reviving authority. It cannot
    rewrite a terminal waiting outcome, and an old epoch's acknowledgement fails after the resume."""
    execution = tx.execution(auth.execution_id)
    if execution is None or execution.attempt != auth.attempt:
        raise StaleAuthority(f"execution {auth.execution_id!r}: no such attempt {auth.attempt}")
    if execution.epoch != auth.epoch:
        raise StaleAuthority(
            f"execution {execution.id}: epoch {auth.epoch} is stale (current {execution.epoch})"
        )
    if execution.state is ExecutionState.WAITED:
        raise Conflict(f"execution {execution.id} ended on its wait: its waiting outcome is final")
    if tx.execution_token(execution.id) != auth.token:
        raise StaleAuthority(f"execution {execution.id}: the token is not the parked attempt's")
    if execution.state is not ExecutionState.PARKED:
        raise StaleAuthority(f"execution {execution.id} is {execution.state}, not parked on a wait")
    recorded = dict(execution.outcome or {})
    total = dict(recorded.get("usage") or {})
    for unit, amount in usage.items():
        total[unit] = total.get(unit, 0) + amount
    recorded["usage"] = total
    recorded["artifacts"] = [
        *recorded.get("artifacts", []),
        *(a for a in artifacts if a not in recorded.get("artifacts", [])),
    ]
    tx.update_execution(execution.id, outcome=json.dumps(recorded, sort_keys=True))
    if budgets and usage:
        work = tx.work(execution.work_id)
        assert work is not None
        charge_in_tx(tx, now_ms, work, usage, budgets, limits or CausalLimits())
    enriched = tx.execution(execution.id)
    assert enriched is not None
    return enriched
