"""Firing timers: `fire_timer_in_tx` joins acceptance (with causal charging), the firing ledger and the
timer's deletion or replacement in one transaction.

A committed firing is answered again from the ledger; a request for an older identity (cancelled,
recreated, already moved on) does nothing. A recurring timer asks its recurrence policy (a pure plugin)
for the occurrence and the replacement, and core validates both. A timer whose template is one of the
runtime's control Events applies its effect through its `TimerKind` in the same transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from ..config import CausalLimits
from ..records.clock import iso_ms
from ..records.errors import InvalidRequest
from ..records.events import CausalRejection, DiagnosticKind, Event
from ..records.notices import TimerArmed, TimerCancelled, TimerFired
from ..records.timers import (
    FireRequest,
    Firing,
    FiringResult,
    Occurrence,
    RecurrencePolicy,
    Replacement,
    Skip,
    Timer,
    TimerState,
)
from ..records.validation import MAX_TIME_MS
from ..store import Tx
from .accept import accept_derived_in_tx, accept_in_tx
from .recurrence import check_answer
from .timer_kinds import TIMER_KINDS
from .timers import timer_template


def fire_timer_in_tx(
    tx: Tx,
    now_ms: int,
    req: FireRequest,
    limits: CausalLimits,
    policies: Mapping[str, RecurrencePolicy],
) -> Firing:
    """Fire one timer identity: accept its Event, write the ledger, delete or replace it. On a shared
    database the timer's row is locked first, skipping one another node holds (`FiringResult.TAKEN`):
    nodes divide due timers instead of racing for them."""
    if not tx.take_timer(req.timer_id):
        return _noop(req, FiringResult.TAKEN, now_ms, "another node is firing it now")
    timer = tx.timer(req.timer_id)
    if (
        timer is None
        or timer.state is not TimerState.ARMED
        or timer.revision != req.revision
        or timer.fire_at_ms != req.fire_at_ms
    ):
        # only a timer no longer armed at this identity may have fired it: a firing leaves the timer
        # fired, invalid, or armed later at the same revision (a replacement fires after now), and a
        # new arming takes a new revision; the ledger's key refuses a second firing of it anyway
        committed = tx.firing(req.timer_id, req.revision, req.fire_at_ms)
        if committed is not None:
            return attrs.evolve(committed, replay=True)
        return _noop(req, FiringResult.STALE, now_ms, "not the timer's current armed identity")
    if now_ms < timer.fire_at_ms:
        return _noop(req, FiringResult.NOT_DUE, now_ms, f"due at {timer.fire_at_ms}")
    if timer.recurrence is not None:
        return _fire_recurrence(tx, now_ms, timer, limits, policies)
    if timer.interval_ms is not None:
        occurrence, replacement = interval_occurrence(timer, now_ms)
        if replacement.fire_at_ms > MAX_TIME_MS:
            # no later tick is a time loom can store: this one is the last, and the timer retires
            ended = (
                f"retired after this firing: its next tick ({replacement.fire_at_ms} ms) would come after "
                f"the latest instant loom can store ({MAX_TIME_MS} ms, {iso_ms(MAX_TIME_MS)})"
            )
            return _accept(tx, now_ms, timer, occurrence, None, limits, ended=ended)
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

    Each firing is atomic on its own: one that raises leaves its own effects undone, and its timer
    is marked invalid with a diagnostic (an answer in the ledger, never a retry loop); if even that
    fails, its error (a string) takes its slot. The others stand. A storage failure fails them all.
    """
    results: list[Firing | str] = []
    for request in requests:
        try:
            with tx.savepoint():
                results.append(fire_timer_in_tx(tx, now_ms, request, limits, policies))
        except Exception as exc:
            if tx.is_storage_failure(exc):
                raise
            results.append(_firing_failed(tx, now_ms, request, f"{type(exc).__name__}: {exc}"))
    return results


@attrs.frozen(kw_only=True)
class FirePass:
    """What one firing pass did."""

    requests: tuple[FireRequest, ...]
    """The due timer identities it fired, in order."""
    results: tuple[Firing | str, ...]
    """Each one's firing, or the error that kept it from firing (it stays armed)."""
    next_due_ms: int | None
    """The earliest deadline among armed timers after the pass, not counting ``exclude``d ones (``None``:
    nothing else is armed)."""
    more: bool
    """The pass stopped at its limit: more may be due now."""
    at_ms: int
    """The time the pass fired at (what "due now" meant)."""


def fire_due_in_tx(
    tx: Tx,
    now_ms: int,
    limit: int,
    limits: CausalLimits,
    policies: Mapping[str, RecurrencePolicy],
    exclude: frozenset[str] = frozenset(),
) -> FirePass:
    """Fire up to ``limit`` due timers, earliest first (each atomic on its own, as `fire_timers_in_tx`),
    and say when the next one is due: the one bounded firing pass that the timer actor and
    `Runtime.poll` both make. The database keeps what is armed; nobody holds a copy. ``exclude``: timers
    the caller looks at again later (a firing that failed), passed by and not counted as next."""
    rows = [row for row in tx.due_head(now_ms, limit + len(exclude)) if row[0] not in exclude][:limit]
    requests = tuple(FireRequest(timer_id=i, revision=r, fire_at_ms=f) for i, r, f in rows)
    results = tuple(fire_timers_in_tx(tx, now_ms, requests, limits, policies))
    upcoming = [f for i, f in tx.next_armed(1 + len(exclude)) if i not in exclude]
    return FirePass(
        requests=requests,
        results=results,
        next_due_ms=upcoming[0] if upcoming else None,
        more=len(requests) >= limit,
        at_ms=now_ms,
    )


def next_due_in_tx(tx: Tx, now_ms: int, exclude: frozenset[str] = frozenset()) -> int | None:
    """The earliest deadline among armed timers, not counting ``exclude``d ones (``None``: none)."""
    upcoming = [f for i, f in tx.next_armed(1 + len(exclude)) if i not in exclude]
    return upcoming[0] if upcoming else None


def _firing_failed(tx: Tx, now_ms: int, request: FireRequest, error: str) -> Firing | str:
    """A firing raised: its own effects are undone; the timer leaves the due set as invalid."""
    try:
        with tx.savepoint():
            timer = tx.timer(request.timer_id)
            if timer is None or timer.state is not TimerState.ARMED or timer.revision != request.revision:
                return error
            return _invalid(tx, now_ms, timer, f"firing failed: {error}")
    except Exception as exc:
        if tx.is_storage_failure(exc):
            raise
        return f"{error}; marking it invalid failed too: {type(exc).__name__}: {exc}"


def interval_occurrence(timer: Timer, now_ms: int) -> tuple[Occurrence, Replacement]:
    """A fixed-interval firing: the latest due tick fires, older missed ticks are counted as
    skipped (never a burst), and the replacement is the next tick after now (which may lie past
    `MAX_TIME_MS`: the caller retires the timer then)."""
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
    problem = check_answer(timer, now_ms, answer, replacement)
    if problem is not None:
        return _invalid(tx, now_ms, timer, problem)
    if isinstance(answer, Skip):
        return _settle(tx, now_ms, timer, FiringResult.SKIPPED, None, replacement, answer.reason)
    return _accept(tx, now_ms, timer, answer, replacement, limits)


def _accept(
    tx: Tx,
    now_ms: int,
    timer: Timer,
    occurrence: Occurrence,
    replacement: Replacement | None,
    limits: CausalLimits,
    *,
    ended: str | None = None,
) -> Firing:
    """Accept the occurrence's Event and settle the timer. ``ended``: why a recurring timer has no
    replacement (it retires with that reason)."""
    extra = {"timer": timer.id, "occurrence_ms": occurrence.occurrence_ms, **occurrence.payload}
    event_in = timer_template(timer, occurrence.delivery_id, extra)
    try:
        # the template is checked again, as any offered Event: a row armed under older rules fails here
        if timer.parent_id is None:
            accepted: Event | CausalRejection = accept_in_tx(tx, now_ms, event_in, limits, trusted=True)
        else:
            accepted = accept_derived_in_tx(
                tx, now_ms, event_in, timer.parent_id, limits, execution_id=timer.execution_id
            )
    except InvalidRequest as exc:
        return _invalid(tx, now_ms, timer, f"its event template is refused: {exc}")
    if isinstance(accepted, Event) and accepted.duplicate:
        # the ledger answers a repeated firing before this point: a duplicate here is an identity
        # another firing or publisher already used, never this firing's own Event
        if replacement is not None or ended is not None:
            # a recurring timer's occurrence is named by its identity: one already accepted (an
            # earlier revision armed with the same delivery_id fired it) is not fired twice, and the
            # timer moves on to its next occurrence instead of being lost (or retires, at its last)
            taken = (
                f"occurrence {occurrence.occurrence_ms}: its delivery identity {event_in.source}/"
                f"{event_in.delivery_id} was already accepted as event {accepted.id}"
            )
            return _settle(
                tx,
                now_ms,
                timer,
                FiringResult.SKIPPED,
                None,
                replacement,
                taken if ended is None else f"{taken}; {ended}",
                ended=ended,
            )
        return _invalid(
            tx,
            now_ms,
            timer,
            f"its delivery identity {event_in.source}/{event_in.delivery_id} was already accepted as event "
            f"{accepted.id}; arm it again with its own delivery_id",
        )
    if isinstance(accepted, CausalRejection):
        # a refused firing disables the timer: no event, no tight retry loop. The timer is settled
        # first, so its kind's effect sees it no longer armed.
        tx.set_timer_state(timer, TimerState.DISABLED, f"causal_rejection: {accepted.reason}", now_ms)
        tx.notify(TimerCancelled(timer_id=timer.id))
        firing = _ledger(tx, now_ms, timer, FiringResult.REFUSED, None, None, accepted.describe())
        kind = TIMER_KINDS.get(timer.type)
        if kind is not None:
            kind.on_refused(tx, now_ms, timer, accepted, limits)
        return firing
    firing = _settle(tx, now_ms, timer, FiringResult.ACCEPTED, accepted.id, replacement, ended, ended=ended)
    kind = TIMER_KINDS.get(timer.type)
    if kind is not None and not accepted.duplicate:
        kind.on_fired(tx, now_ms, timer, accepted, limits)
    return firing


def _settle(
    tx: Tx,
    now_ms: int,
    timer: Timer,
    result: FiringResult,
    event_id: str | None,
    replacement: Replacement | None,
    detail: str | None,
    *,
    ended: str | None = None,
) -> Firing:
    """Delete (tombstone) a one-shot timer, or move a recurring one to its replacement; ``ended``: the
    reason a recurring timer without one retires with."""
    if replacement is None:
        tx.set_timer_state(timer, TimerState.FIRED, ended, now_ms, fired=True)
    else:
        tx.rearm_timer(timer, replacement.fire_at_ms, now_ms)
        tx.notify(TimerArmed(timer_id=timer.id, revision=timer.revision, fire_at_ms=replacement.fire_at_ms))
    return _ledger(
        tx, now_ms, timer, result, event_id, replacement.fire_at_ms if replacement else None, detail
    )


def _invalid(tx: Tx, now_ms: int, timer: Timer, reason: str) -> Firing:
    """An unusable recurrence: an ``invalid_timer`` diagnostic, and the timer leaves the due set."""
    tx.set_timer_state(timer, TimerState.INVALID, reason, now_ms)
    tx.add_diagnostic(
        DiagnosticKind.INVALID_TIMER,
        timer.id,
        f"timer {timer.id}: {reason}",
        {"timer": timer.id, "revision": timer.revision, "fire_at_ms": timer.fire_at_ms},
        now_ms,
    )
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
    firing = Firing(
        timer_id=timer.id,
        revision=timer.revision,
        fire_at_ms=timer.fire_at_ms,
        result=result,
        event_id=event_id,
        next_fire_at_ms=next_fire_at_ms,
        detail=detail,
        at_ms=now_ms,
    )
    tx.insert_firing(firing)
    tx.notify(
        TimerFired(timer_id=timer.id, revision=timer.revision, fire_at_ms=timer.fire_at_ms, result=result)
    )
    return firing


def _noop(req: FireRequest, result: FiringResult, now_ms: int, detail: str) -> Firing:
    return Firing(
        timer_id=req.timer_id,
        revision=req.revision,
        fire_at_ms=req.fire_at_ms,
        result=result,
        event_id=None,
        next_fire_at_ms=None,
        detail=detail,
        at_ms=now_ms,
    )
