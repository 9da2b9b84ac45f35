"""Durable timers: arm, revisioned cancel and the fair `due` cursor.

A timer's firing identity is (id, revision, fire_at): a changed re-arm recreates the timer under a
new revision, so older firing requests go stale; cancelled and fired timers stay as tombstones.
`firing` fires them.

The runtime's own control timers (a failed attempt's retry backoff, a wait's timeout, an attempt's
execution deadline) are named under prefixes reserved for them (`CONTROL_TIMER_PREFIXES`): the
runtime arms and ends them itself (``control=True``), and the public paths (`arm_in_tx` without it,
`cancel_timer_in_tx`) refuse to arm one, replace one or cancel one, or to take a reserved name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..records.errors import Conflict, InvalidRequest, NotFound
from ..records.events import EventIn
from ..records.notices import TimerArmed, TimerCancelled
from ..records.timers import FireRequest, RecurrencePolicy, Timer, TimerSpec, TimerState
from ..records.validation import (
    FIRING_RESERVE_BYTES,
    MAX_ID_LEN,
    MAX_INT,
    MAX_PAYLOAD_BYTES,
    check_int,
    check_text,
    check_time,
    checked_event_fields,
    describe_value,
    payload_json,
)
from ..store import Tx
from .accept import delivered
from .recurrence import dry_run

TIMERS_NAMESPACE = "core.timers"
DUE_CURSOR = "due_cursor"
MAX_DUE = 10_000


MAX_INTERVAL_MS = 100 * 366 * 86_400_000
"""The longest fixed interval a timer may recur at (a century)."""


MAX_TIMER_ID_LEN = MAX_ID_LEN - 24
"""A timer's id and delivery id leave room for the suffix its firings add (``@`` or ``@r`` and up to
19 digits) within an Event's delivery id limit."""


RETRY_TIMER_PREFIX = "retry:"
"""A failed attempt's retry backoff: ``retry:{work_id}:{attempt}`` (`retry.retry_timer_id`)."""
WAIT_TIMEOUT_TIMER_PREFIX = "wait-timeout:"
"""A wait's timeout: ``wait-timeout:{wait_id}`` (`waits.timeout_timer_id`)."""
DEADLINE_TIMER_PREFIX = "deadline:"
"""An active segment's execution deadline: ``deadline:{execution_id}:{segment}`` (`segments`)."""

CONTROL_TIMER_PREFIXES: Mapping[str, str] = {
    RETRY_TIMER_PREFIX: "a failed attempt's retry backoff",
    WAIT_TIMEOUT_TIMER_PREFIX: "a wait's timeout",
    DEADLINE_TIMER_PREFIX: "an attempt's execution deadline",
}
"""The id prefixes reserved for the runtime's own control timers, and what each such timer is for."""


def control_prefix(timer_id: str) -> str | None:
    """The reserved prefix ``timer_id`` begins with (``None``: it names no control timer of the runtime).

    Every control timer the runtime arms is named so (`arm_in_tx` with ``control=True`` asserts it), and
    nothing else may be: so the id alone says whose a timer is, whatever its template (a trusted host
    may arm a root timer with a ``core.*`` template under an id of its own, and cancel it).
    """
    return next((prefix for prefix in CONTROL_TIMER_PREFIXES if timer_id.startswith(prefix)), None)


def control_timer(timer_id: str) -> str | None:
    """What the runtime's own control timer ``timer_id`` is for (``None``: it is not one)."""
    prefix = control_prefix(timer_id)
    return None if prefix is None else CONTROL_TIMER_PREFIXES[prefix]


def _refuse_control(timer_id: str, timer: Timer | None, action: str) -> None:
    """`Conflict` when ``timer`` is one of the runtime's own control timers; `InvalidRequest` when a new
    timer would take an id reserved for them. Nothing is written either way."""
    prefix = control_prefix(timer_id)
    if prefix is None:
        return
    purpose = CONTROL_TIMER_PREFIXES[prefix]
    if timer is not None:
        raise Conflict(
            f"timer {timer_id!r} is the runtime's own timer for {purpose}: it cannot be {action} through "
            "the API (the runtime arms and ends it itself)"
        )
    raise InvalidRequest(
        f"timer.id {timer_id!r}: ids beginning {prefix!r} are reserved for the runtime's own timers "
        f"({purpose}); choose another id",
        field="timer.id",
    )


def validate_spec(spec: object) -> TimerSpec:
    """Refuse a malformed timer before anything is written, naming the field.

    The payload must leave room for the fields its firing adds (`FIRING_RESERVE_BYTES`), so a timer
    accepted at arm is never refused at fire for its size.
    """
    if not isinstance(spec, TimerSpec):
        raise InvalidRequest(f"expected a TimerSpec, got {type(spec).__name__}")
    # a firing's delivery identity adds '@{occurrence_ms}' or '@r{revision}' to the timer's own
    check_text("timer.id", spec.id, max_len=MAX_TIMER_ID_LEN)
    check_time("timer.fire_at_ms", spec.fire_at_ms)
    if spec.interval_ms is not None:
        check_int("timer.interval_ms", spec.interval_ms, 1, MAX_INTERVAL_MS)
        if spec.recurrence is not None:
            raise InvalidRequest("timer: interval_ms and recurrence are exclusive", field="timer.recurrence")
    check_text("timer.delivery_id", spec.delivery_id, optional=True, max_len=MAX_TIMER_ID_LEN)
    if spec.recurrence is not None:
        check_text("timer.recurrence", spec.recurrence)
        if not isinstance(spec.spec, Mapping):
            raise InvalidRequest("timer.spec must be a table for a recurrence timer", field="timer.spec")
    elif spec.spec is not None:
        raise InvalidRequest(
            "timer.spec belongs to a recurrence timer; this timer names no recurrence", field="timer.spec"
        )
    if spec.spec is not None:
        payload_json(spec.spec, field="timer.spec")
    payload_json(spec.payload, field="timer.payload", max_bytes=MAX_PAYLOAD_BYTES - FIRING_RESERVE_BYTES)
    # the template's payload is the timer's, checked above
    checked_event_fields(timer_template(spec, spec.delivery_id or spec.id), allow_core=True)
    return spec


def check_fire_request(request: object) -> FireRequest:
    """A well-formed firing identity (whether it is current is for `fire_timer_in_tx` to say)."""
    if not isinstance(request, FireRequest):
        raise InvalidRequest(f"expected a FireRequest, got {type(request).__name__}")
    check_text("request.timer_id", request.timer_id)
    check_int("request.revision", request.revision, 1, MAX_INT)
    check_time("request.fire_at_ms", request.fire_at_ms)
    return request


def timer_template(
    timer: TimerSpec | Timer, delivery_id: str, extra: Mapping[str, Any] | None = None
) -> EventIn:
    payload = dict(timer.payload)
    if extra:
        payload.update(extra)
    return EventIn(
        source=timer.source,
        delivery_id=delivery_id,
        type=timer.type,
        scope=timer.scope,
        key=timer.key,
        work_id=timer.work_id,
        payload=payload,
    )


def arm_in_tx(
    tx: Tx,
    now_ms: int,
    spec: TimerSpec,
    *,
    parent_id: str | None = None,
    execution_id: str | None = None,
    policies: Mapping[str, RecurrencePolicy] | None = None,
    control: bool = False,
) -> Timer:
    """Arm (or re-arm) a timer. Arming the same definition again is a no-op (a one-shot timer that fired
    included: its occurrence was delivered); a changed one (or one that was cancelled, disabled, or
    is recurring and retired) recreates the timer under a new revision, so older firing requests go
    stale. A recurrence timer's definition is its spec and template, not the first time it
    was armed for: armed again after an outage, it keeps the occurrences it missed for its catch-up. An
    interval timer's is its interval, template and grid: armed again for a tick it has reached, it
    keeps its next tick.

    Only the runtime arms its own control timers (``control=True``, under a reserved id prefix):
    otherwise replacing one is a `Conflict`, and a new timer under a reserved prefix an `InvalidRequest`.

    Each revision fires with its own Event: without an explicit ``delivery_id`` a recreated timer's
    identity is ``{id}@r{revision}``; an explicit one already accepted by an earlier firing is refused
    (`Conflict`), never answered with another revision's Event. With ``policies``, a recurrence
    timer's spec is validated by its policy now (see `recurrence.dry_run`).
    """
    validate_spec(spec)
    if spec.work_id is not None and tx.work(spec.work_id) is None:
        # its Event could never be routed to it: refused now, as an Event naming no Work is, not when it fires
        raise InvalidRequest(f"work_id {spec.work_id!r} names no existing work", field="work_id")
    existing, removed = tx.timer_or_removed(spec.id)
    if control:
        assert control_timer(spec.id) is not None, f"control timer {spec.id!r} has no reserved id prefix"
    else:
        _refuse_control(spec.id, existing, "armed or replaced")
    fresh = Timer(
        id=spec.id,
        revision=1,
        state=TimerState.ARMED,
        fire_at_ms=spec.fire_at_ms,
        source=spec.source,
        type=spec.type,
        scope=spec.scope,
        key=spec.key,
        work_id=spec.work_id,
        payload=dict(spec.payload),
        delivery_id=spec.delivery_id or (existing.delivery_id if existing is not None else spec.id),
        interval_ms=spec.interval_ms,
        recurrence=spec.recurrence,
        spec=dict(spec.spec) if spec.spec is not None else None,
        parent_id=parent_id,
        execution_id=execution_id,
        occurrences=0,
        reason=None,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )
    if existing is not None:
        same = attrs.evolve(
            fresh,
            revision=existing.revision,
            occurrences=existing.occurrences,
            created_at_ms=existing.created_at_ms,
            updated_at_ms=existing.updated_at_ms,
            # a recurrence's next occurrence follows from its spec and the time it is armed at: the same
            # schedule armed again (a program arming its schedules at each start) keeps its occurrences;
            # so does an interval timer armed again for a tick its sequence has reached
            fire_at_ms=existing.fire_at_ms
            if fresh.recurrence is not None or _same_ticks(existing, fresh)
            else fresh.fire_at_ms,
        )
        if existing.state is TimerState.ARMED and existing == same:
            return existing
        if (
            existing.state is TimerState.FIRED
            and fresh.recurrence is None
            and fresh.interval_ms is None
            and attrs.evolve(existing, state=TimerState.ARMED, reason=None) == same
        ):
            # its one occurrence was delivered: the same definition armed again (a program arming its
            # timers at each start, a request repeated after a lost answer) does not fire it twice
            return existing
        revision = existing.revision + 1
        delivery_id = spec.delivery_id or f"{spec.id}@r{revision}"
        fresh = attrs.evolve(
            fresh, revision=revision, delivery_id=delivery_id, created_at_ms=existing.created_at_ms
        )
        _check_unused(tx, fresh)
    elif removed is not None:
        # compaction removed the ended timer: its tombstone says where the revisions go on from
        revision = removed + 1
        fresh = attrs.evolve(
            fresh, revision=revision, delivery_id=spec.delivery_id or f"{spec.id}@r{revision}"
        )
        _check_unused(tx, fresh)
        tx.forget_removed_timer(spec.id)
    if fresh.recurrence is not None and policies is not None:
        dry_run(fresh, policies)
    tx.put_timer(fresh, existing)
    tx.notify(TimerArmed(timer_id=fresh.id, revision=fresh.revision, fire_at_ms=fresh.fire_at_ms))
    return fresh


def _same_ticks(existing: Timer, fresh: Timer) -> bool:
    """Whether ``fresh`` is ``existing``'s interval armed again for a tick it has reached or passed (its
    first tick, armed again at each start): the same ticks, not a new timer that fires the last again."""
    interval = fresh.interval_ms
    return (
        interval is not None
        and existing.interval_ms == interval
        and fresh.fire_at_ms <= existing.fire_at_ms
        and (existing.fire_at_ms - fresh.fire_at_ms) % interval == 0
    )


def _check_unused(tx: Tx, fresh: Timer) -> None:
    """A new revision of a one-shot timer fires with a delivery identity of its own, never one an
    earlier firing (or anyone) was accepted with."""
    if not fresh.interval_ms and not fresh.recurrence:
        used = delivered(tx, fresh.source, fresh.delivery_id)
        if used is not None:
            raise Conflict(
                f"timer {fresh.id!r}: delivery identity {fresh.source}/{fresh.delivery_id} was already accepted "
                f"(event {used.id}); arm the new revision with its own delivery_id"
            )


def cancel_timer_in_tx(tx: Tx, now_ms: int, timer_id: str, revision: int) -> Timer:
    """Cancel the timer at ``revision``; its row stays as a tombstone for stale firing requests. The
    public cancel: the runtime's own control timers are refused (`Conflict`); the runtime ends those
    itself."""
    timer = tx.timer(timer_id)
    if timer is None:
        raise NotFound(f"no timer with id {timer_id!r}")
    _refuse_control(timer_id, timer, "cancelled")
    if timer.revision != revision:
        raise Conflict(
            f"timer {timer_id}: revision {revision} is "
            f"{'stale' if revision < timer.revision else 'not yet written'} (current {timer.revision})"
        )
    if timer.state is not TimerState.ARMED:
        raise Conflict(f"timer {timer_id} is {timer.state}, not armed")
    tx.set_timer_state(timer, TimerState.CANCELLED, "cancelled", now_ms)
    tx.notify(TimerCancelled(timer_id=timer_id))
    cancelled = tx.timer(timer_id)
    assert cancelled is not None
    return cancelled


def due_in_tx(tx: Tx, now_ms: int, limit: int) -> list[FireRequest]:
    """Up to ``limit`` due firing requests, fair across calls at a fixed clock.

    Timers come in due order (fire_at, then the order they were armed), and a persisted round-robin
    cursor starts each call after the last timer the previous one returned (wrapping around), so one
    overdue recurrence or invalid timer cannot monopolise the answer.
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_DUE:
        raise InvalidRequest(
            f"due: limit must be an integer from 1 to {MAX_DUE}, got {describe_value(limit)}"
        )
    entry = tx.kv_get(TIMERS_NAMESPACE, DUE_CURSOR)
    cursor = (-1, 0, "")
    if entry is not None:  # (a cursor kept before timers had an arming order has none: 0)
        cursor = (
            int(entry.value["fire_at_ms"]),
            int(entry.value.get("armed_seq", 0)),
            str(entry.value["id"]),
        )
    rows = tx.due_timers(now_ms, cursor, limit, wrapped=False)
    if len(rows) < limit and entry is not None:
        rows += tx.due_timers(now_ms, cursor, limit - len(rows), wrapped=True)
    if rows:
        last = {"fire_at_ms": rows[-1][2], "armed_seq": rows[-1][3], "id": rows[-1][0]}
        tx.kv_put(TIMERS_NAMESPACE, DUE_CURSOR, last, now_ms)
    return [FireRequest(timer_id=i, revision=r, fire_at_ms=f) for i, r, f, _ in rows]
