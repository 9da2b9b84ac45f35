"""Durable timers: arm, revisioned cancel, fair `due`, and `fire_timer_in_tx` (seed 000 "Timers",
seed 004 "FireTimer", seed 003 on timers inside the causal bounds).

`fire_timer_in_tx` joins acceptance (with causal charging), the firing ledger and the
timer's deletion or replacement in one transaction. A committed firing is answered again
from the ledger; a request for an older identity (cancelled, recreated, already moved on)
does nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._config import CausalLimits
from .._errors import Conflict, InvalidRequest, NotFound
from .._notices import TimerArmed, TimerCancelled
from .._records import CORE_PREFIX, CausalRejection, Event, EventIn, payload_json, validate_event_in
from .._timers import (
    FireRequest,
    Firing,
    FiringResult,
    Occurrence,
    RecurrencePolicy,
    Replacement,
    Skip,
    Timer,
    TimerSpec,
    TimerState,
)
from ..store import Tx
from .accept import accept_derived_in_tx, accept_in_tx
from .authority import Authority, authorize
from .executions import EXECUTION_TIMEOUT, apply_deadline_in_tx

TIMERS_NAMESPACE = "core.timers"
DUE_CURSOR = "due_cursor"
MAX_DUE = 10_000


def validate_spec(spec: TimerSpec) -> None:
    """Refuse a malformed timer before anything is written, naming the field."""
    if not isinstance(spec.id, str) or not spec.id or len(spec.id) > 200:
        raise InvalidRequest(
            f"timer.id must be a non-empty string of at most 200 characters, got {spec.id!r}"
        )
    if isinstance(spec.fire_at_ms, bool) or not isinstance(spec.fire_at_ms, int) or spec.fire_at_ms < 0:
        raise InvalidRequest(f"timer.fire_at_ms must be a non-negative integer, got {spec.fire_at_ms!r}")
    if spec.interval_ms is not None and (
        isinstance(spec.interval_ms, bool) or not isinstance(spec.interval_ms, int) or spec.interval_ms < 1
    ):
        raise InvalidRequest(f"timer.interval_ms must be a positive integer, got {spec.interval_ms!r}")
    if spec.interval_ms is not None and spec.recurrence is not None:
        raise InvalidRequest("timer: interval_ms and recurrence are exclusive")
    if spec.recurrence is not None and (not isinstance(spec.recurrence, str) or not spec.recurrence):
        raise InvalidRequest(f"timer.recurrence must name a recurrence policy, got {spec.recurrence!r}")
    if spec.recurrence is not None and not isinstance(spec.spec, Mapping):
        raise InvalidRequest("timer.spec must be a table for a recurrence timer")
    if spec.spec is not None:
        payload_json(spec.spec, field="timer.spec")
    validate_event_in(_template(spec, spec.delivery_id or spec.id), allow_core=True)


def _template(timer: TimerSpec | Timer, delivery_id: str, extra: Mapping[str, Any] | None = None) -> EventIn:
    payload = dict(timer.payload)
    if extra:
        payload.update(extra)
    return EventIn(source=timer.source, delivery_id=delivery_id, type=timer.type, scope=timer.scope,
                   key=timer.key, work_id=timer.work_id, payload=payload)  # fmt: skip


def arm_in_tx(
    tx: Tx, now_ms: int, spec: TimerSpec, *, parent_id: str | None = None, execution_id: str | None = None
) -> Timer:
    """Arm (or re-arm) a timer. Arming the same definition again is a no-op; a changed one
    recreates the timer under a new revision, so older firing requests go stale."""
    validate_spec(spec)
    existing = tx.timer(spec.id)
    fresh = Timer(
        id=spec.id, revision=1, state=TimerState.ARMED, fire_at_ms=spec.fire_at_ms, source=spec.source,
        type=spec.type, scope=spec.scope, key=spec.key, work_id=spec.work_id, payload=dict(spec.payload),
        delivery_id=spec.delivery_id or spec.id, interval_ms=spec.interval_ms, recurrence=spec.recurrence,
        spec=dict(spec.spec) if spec.spec is not None else None, parent_id=parent_id, execution_id=execution_id,
        occurrences=0, reason=None, created_at_ms=now_ms, updated_at_ms=now_ms,
    )  # fmt: skip
    if existing is not None:
        same = attrs.evolve(fresh, revision=existing.revision, occurrences=existing.occurrences,
                            created_at_ms=existing.created_at_ms, updated_at_ms=existing.updated_at_ms)  # fmt: skip
        if existing.state is TimerState.ARMED and existing == same:
            return existing
        fresh = attrs.evolve(fresh, revision=existing.revision + 1, created_at_ms=existing.created_at_ms)
    tx.put_timer(fresh)
    tx.notify(TimerArmed(timer_id=fresh.id, revision=fresh.revision, fire_at_ms=fresh.fire_at_ms))
    return fresh


def arm_derived_in_tx(tx: Tx, now_ms: int, auth: Authority, spec: TimerSpec) -> Timer:
    """Arm a timer under an execution's lease; it inherits the attempt's trigger as its parent,
    so its firing stays on the trigger's causal chain even days later."""
    execution = authorize(tx, now_ms, auth)
    # an execution may not schedule the privileged core.* family (a forged core.execution.timeout)
    validate_spec(spec)
    validate_event_in(_template(spec, spec.delivery_id or spec.id))
    if execution.trigger_id is None:
        raise InvalidRequest(f"execution {execution.id} has no trigger to derive a timer from")
    work = tx.work(execution.work_id)
    assert work is not None
    if spec.scope != work.scope:
        raise InvalidRequest(f"timer.scope {spec.scope!r} is not the arming work's scope {work.scope!r}")
    existing = tx.timer(spec.id)
    if existing is not None and not _armed_by_work(tx, existing, work.id):
        # re-arming would recreate someone else's timer (a root schedule, its own deadline)
        raise Conflict(f"timer {spec.id!r} was not armed by an execution of work {work.id}")
    return arm_in_tx(tx, now_ms, spec, parent_id=execution.trigger_id, execution_id=execution.id)


def _armed_by_work(tx: Tx, timer: Timer, work_id: str) -> bool:
    if timer.execution_id is None or timer.type.startswith(CORE_PREFIX):
        return False
    armed_by = tx.execution(timer.execution_id)
    return armed_by is not None and armed_by.work_id == work_id


def cancel_timer_in_tx(tx: Tx, now_ms: int, timer_id: str, revision: int) -> Timer:
    """Cancel the timer at ``revision``; its row stays as a tombstone for stale firing requests."""
    timer = tx.timer(timer_id)
    if timer is None:
        raise NotFound(f"no timer with id {timer_id!r}")
    if timer.revision != revision:
        raise Conflict(f"timer {timer_id}: revision {revision} is stale (current {timer.revision})")
    if timer.state is not TimerState.ARMED:
        raise Conflict(f"timer {timer_id} is {timer.state}, not armed")
    tx.set_timer_state(timer_id, TimerState.CANCELLED.value, "cancelled", now_ms)
    tx.notify(TimerCancelled(timer_id=timer_id))
    cancelled = tx.timer(timer_id)
    assert cancelled is not None
    return cancelled


def due_in_tx(tx: Tx, now_ms: int, limit: int) -> list[FireRequest]:
    """Up to ``limit`` due firing requests, fair across calls at a fixed clock.

    Timers come in (fire_at, id) order, and a persisted round-robin cursor starts each call
    after the last timer the previous one returned (wrapping around), so one overdue
    recurrence or invalid timer cannot monopolise the answer.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_DUE:
        raise InvalidRequest(f"due: limit must be an integer from 1 to {MAX_DUE}, got {limit!r}")
    entry = tx.kv_get(TIMERS_NAMESPACE, DUE_CURSOR)
    cursor = (int(entry.value["fire_at_ms"]), str(entry.value["id"])) if entry else (-1, "")
    rows = tx.due_timers(now_ms, cursor, limit, wrapped=False)
    if len(rows) < limit and entry is not None:
        rows += tx.due_timers(now_ms, cursor, limit - len(rows), wrapped=True)
    if rows:
        tx.kv_put(TIMERS_NAMESPACE, DUE_CURSOR, {"fire_at_ms": rows[-1][2], "id": rows[-1][0]}, now_ms)
    return [FireRequest(timer_id=i, revision=r, fire_at_ms=f) for i, r, f in rows]


def fire_timer_in_tx(
    tx: Tx,
    now_ms: int,
    req: FireRequest,
    limits: CausalLimits,
    policies: Mapping[str, RecurrencePolicy],
) -> Firing:
    """Fire one timer identity: accept its Event, write the ledger, delete or replace it."""
    committed = tx.firing(req.timer_id, req.revision, req.fire_at_ms)
    if committed is not None:
        return attrs.evolve(committed, replay=True)
    timer = tx.timer(req.timer_id)
    if (
        timer is None
        or timer.state is not TimerState.ARMED
        or timer.revision != req.revision
        or timer.fire_at_ms != req.fire_at_ms
    ):
        return _noop(req, FiringResult.STALE, now_ms, "not the timer's current armed identity")
    if now_ms < timer.fire_at_ms:
        return _noop(req, FiringResult.NOT_DUE, now_ms, f"due at {timer.fire_at_ms}")
    if timer.recurrence is not None:
        return _fire_recurrence(tx, now_ms, timer, limits, policies)
    if timer.interval_ms is not None:
        occurrence, replacement = interval_occurrence(timer, now_ms)
        return _accept(tx, now_ms, timer, occurrence, replacement, limits)
    occurrence = Occurrence(occurrence_ms=timer.fire_at_ms, delivery_id=timer.delivery_id)
    return _accept(tx, now_ms, timer, occurrence, None, limits)


def fire_timers_in_tx(
    tx: Tx,
    now_ms: int,
    requests: Sequence[FireRequest],
    limits: CausalLimits,
    policies: Mapping[str, RecurrencePolicy],
) -> list[Firing | str]:
    """Fire many timer identities in one storage request (one commit), in the given order.

    Each firing is atomic on its own: one that raises leaves its own effects undone and its
    error (a string) in its slot, and the others stand. A storage failure fails them all.
    """
    results: list[Firing | str] = []
    for request in requests:
        try:
            with tx.savepoint():
                results.append(fire_timer_in_tx(tx, now_ms, request, limits, policies))
        except Exception as exc:
            if tx.is_storage_failure(exc):
                raise
            results.append(f"{type(exc).__name__}: {exc}")
    return results


def interval_occurrence(timer: Timer, now_ms: int) -> tuple[Occurrence, Replacement]:
    """A fixed-interval firing: the latest due tick fires, older missed ticks are counted as
    skipped (never a burst), and the replacement is the next tick after now."""
    assert timer.interval_ms is not None
    missed = (now_ms - timer.fire_at_ms) // timer.interval_ms
    latest = timer.fire_at_ms + missed * timer.interval_ms
    occurrence = Occurrence(
        occurrence_ms=latest, delivery_id=f"{timer.delivery_id}@{latest}", payload={"skipped": missed}
    )
    nxt = latest + timer.interval_ms
    return occurrence, Replacement(fire_at_ms=nxt, delivery_id=f"{timer.delivery_id}@{nxt}")


def _fire_recurrence(
    tx: Tx, now_ms: int, timer: Timer, limits: CausalLimits, policies: Mapping[str, RecurrencePolicy]
) -> Firing:
    assert timer.recurrence is not None
    policy = policies.get(timer.recurrence)
    if policy is None:
        return _invalid(
            tx, now_ms, timer, f"no recurrence policy is registered for kind {timer.recurrence!r}"
        )
    try:
        answer, replacement = policy(timer, now_ms, timer.spec or {})
    except Exception as exc:
        return _invalid(
            tx, now_ms, timer, f"recurrence policy {timer.recurrence!r} raised {type(exc).__name__}: {exc}"
        )
    problem = _check_answer(timer, now_ms, answer, replacement)
    if problem is not None:
        return _invalid(tx, now_ms, timer, problem)
    if isinstance(answer, Skip):
        return _settle(tx, now_ms, timer, FiringResult.SKIPPED, None, replacement, answer.reason)
    return _accept(tx, now_ms, timer, answer, replacement, limits)


def _check_answer(timer: Timer, now_ms: int, answer: object, replacement: object) -> str | None:
    """Core validates every policy answer: the occurrence keeps the timer's source and parent;
    the replacement fires after now and has an identity distinct from the occurrence's."""
    if not isinstance(answer, (Occurrence, Skip)):
        return f"policy answered {type(answer).__name__}, not an Occurrence or Skip"
    if replacement is not None and not isinstance(replacement, Replacement):
        return f"policy answered a {type(replacement).__name__} replacement, not a Replacement"
    if isinstance(answer, Occurrence):
        if answer.source is not None and answer.source != timer.source:
            return f"the occurrence changes the source from {timer.source!r} to {answer.source!r}"
        if answer.parent_id is not None and answer.parent_id != timer.parent_id:
            return "the occurrence changes the timer's parent"
        if not answer.delivery_id:
            return "the occurrence has no delivery identity"
    if isinstance(replacement, Replacement):
        if isinstance(replacement.fire_at_ms, bool) or not isinstance(replacement.fire_at_ms, int):
            return f"the replacement's fire_at_ms is not integer milliseconds: {replacement.fire_at_ms!r}"
        if replacement.fire_at_ms <= now_ms:
            return f"the replacement fires at {replacement.fire_at_ms}, not after now ({now_ms})"
        if isinstance(answer, Occurrence) and replacement.delivery_id == answer.delivery_id:
            return "the replacement has the same identity as the occurrence"
    return None


def _accept(
    tx: Tx,
    now_ms: int,
    timer: Timer,
    occurrence: Occurrence,
    replacement: Replacement | None,
    limits: CausalLimits,
) -> Firing:
    extra = {"timer": timer.id, "occurrence_ms": occurrence.occurrence_ms, **occurrence.payload}
    event_in = _template(timer, occurrence.delivery_id, extra)
    try:
        if timer.parent_id is None:
            accepted: Event | CausalRejection = accept_in_tx(tx, now_ms, event_in, limits, trusted=True)
        else:
            accepted = accept_derived_in_tx(
                tx, now_ms, event_in, timer.parent_id, limits, execution_id=timer.execution_id
            )
    except InvalidRequest as exc:
        return _invalid(tx, now_ms, timer, f"its event template is refused: {exc}")
    if isinstance(accepted, CausalRejection):
        # a refused firing disables the timer: no event, no tight retry loop
        if timer.type == EXECUTION_TIMEOUT:
            apply_deadline_in_tx(tx, now_ms, None, timer.payload)
        tx.set_timer_state(
            timer.id, TimerState.DISABLED.value, f"causal_rejection: {accepted.reason}", now_ms
        )
        tx.notify(TimerCancelled(timer_id=timer.id))
        firing = _ledger(tx, now_ms, timer, FiringResult.REFUSED, None, None, accepted.describe())
        return firing
    if timer.type == EXECUTION_TIMEOUT and not accepted.duplicate:
        apply_deadline_in_tx(tx, now_ms, accepted, accepted.payload)
    return _settle(tx, now_ms, timer, FiringResult.ACCEPTED, accepted.id, replacement, None)


def _settle(
    tx: Tx,
    now_ms: int,
    timer: Timer,
    result: FiringResult,
    event_id: str | None,
    replacement: Replacement | None,
    detail: str | None,
) -> Firing:
    """Delete (tombstone) a one-shot timer, or move a recurring one to its replacement."""
    if replacement is None:
        tx.set_timer_state(timer.id, TimerState.FIRED.value, None, now_ms)
        tx.count_firing(timer.id, now_ms)
    else:
        tx.rearm_timer(timer.id, replacement.fire_at_ms, now_ms)
        tx.notify(TimerArmed(timer_id=timer.id, revision=timer.revision, fire_at_ms=replacement.fire_at_ms))
    return _ledger(
        tx, now_ms, timer, result, event_id, replacement.fire_at_ms if replacement else None, detail
    )


def _invalid(tx: Tx, now_ms: int, timer: Timer, reason: str) -> Firing:
    """An unusable recurrence: an ``invalid_timer`` diagnostic, and the timer leaves the due set."""
    tx.set_timer_state(timer.id, TimerState.INVALID.value, reason, now_ms)
    tx.add_diagnostic("invalid_timer", timer.id, f"timer {timer.id}: {reason}",
                      {"timer": timer.id, "revision": timer.revision, "fire_at_ms": timer.fire_at_ms}, now_ms)  # fmt: skip
    tx.notify(TimerCancelled(timer_id=timer.id))
    return _ledger(tx, now_ms, timer, FiringResult.INVALID, None, None, reason)


def _ledger(
    tx: Tx,
    now_ms: int,
    timer: Timer,
    result: FiringResult,
    event_id: str | None,
    next_fire_at_ms: int | None,
    detail: str | None,
) -> Firing:
    firing = Firing(timer_id=timer.id, revision=timer.revision, fire_at_ms=timer.fire_at_ms, result=result,
                    event_id=event_id, next_fire_at_ms=next_fire_at_ms, detail=detail, at_ms=now_ms)  # fmt: skip
    tx.insert_firing(firing)
    return firing


def _noop(req: FireRequest, result: FiringResult, now_ms: int, detail: str) -> Firing:
    return Firing(timer_id=req.timer_id, revision=req.revision, fire_at_ms=req.fire_at_ms, result=result,
                  event_id=None, next_fire_at_ms=None, detail=detail, at_ms=now_ms)  # fmt: skip
