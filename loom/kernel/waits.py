"""Waits: registration, arbitration and exactly one wake.

Registration stores the key/type predicate and the exclusive watermark and scans accepted history in
the same transaction. A wake is attempted wherever a candidate may have appeared: at registration,
when any Event on a watched key is routed, and when the wait's own timeout is accepted. Each attempt
arbitrates over everything accepted so far (`arbitrate`: the lowest sequence wins, the timeout being
a candidate like any other), so the order in which the attempts happen never changes the winner, and
the wait's state (active -> woken, compare-and-set) makes the wake happen once.

A wake commits the winner as input, the ``core.wait.woken`` bridge (the continuation's causal
authority, derived from the winner), timeout cancellation and the Work's ready state together. A
bridge the causal limits refuse blocks the wait and holds the Work with the reason; releasing the hold
arbitrates again with the release as the bridge's parent.

The dependency subscriptions a wait declares are stored pending with it (`dependencies`); its wake
ends them, its block disables them, its release rearms them, and cancelling the Work ends every
subscription the Work has. The reconcile rules themselves live in `subscriptions`, which imports
this module.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ..config import CausalLimits
from ..records.core_events import CORE_SOURCE, WAIT_BLOCKED, WAIT_TIMEOUT, WAIT_WOKEN
from ..records.errors import Conflict, InvalidRequest
from ..records.events import CausalRejection, DiagnosticKind, Event, EventIn
from ..records.ids import core_delivery_id, stable_id
from ..records.notices import SubscriptionChanged, TimerCancelled, WorkChanged
from ..records.subscriptions import SubscriptionState
from ..records.timers import Timer, TimerSpec, TimerState
from ..records.validation import MAX_TIME_MS
from ..records.waits import Wait, WaitSpec, WaitState
from ..records.work import Execution, Work, WorkState, work_with
from ..store import Tx
from .accept import accept_derived_in_tx, accept_in_tx, delivered
from .checkpoints import control_checkpoint
from .dependencies import declare_in_tx
from .timer_kind import TimerKind
from .timers import WAIT_TIMEOUT_TIMER_PREFIX, arm_in_tx
from .unrouted import routing_watermark

SCAN_PAGE = 200


@attrs.frozen(kw_only=True)
class Candidate:
    """An accepted Event that could wake a wait: a match on its keys and types, or its own timeout."""

    seq: int
    event_id: str
    timeout: bool = False


def arbitrate(candidates: Iterable[Candidate]) -> Candidate | None:
    """The winner: the lowest acceptance sequence (a timeout accepted first wins; a normal match accepted
    before the timeout wins even at the deadline). ``None``: nothing has been accepted that could wake."""
    return min(candidates, key=lambda c: c.seq, default=None)


def type_matches(types: Sequence[str], event_type: str) -> bool:
    """A wait's type allowlist: glob patterns, OR'd; empty allows every type."""
    return not types or any(fnmatch.fnmatchcase(event_type, pattern) for pattern in types)


def wait_id_for(execution_id: str, epoch: int) -> str:
    """One registration per attempt and epoch: parking releases authority, resuming raises the epoch."""
    return stable_id("wt", execution_id, str(epoch))


def timeout_timer_id(wait_id: str) -> str:
    return f"{WAIT_TIMEOUT_TIMER_PREFIX}{wait_id}"


# -- registration ---------------------------------------------------------------------------------------


def keys_answered_by(tx: Tx, work: Work) -> tuple[str, ...]:
    """The keys whose Events reach ``work``: its own, and, for a successor (a reopened Work), those of
    every Work before it in its chain (a later Event on the first Work's key is routed along the chain
    to its live end: `routing._terminal`), so its wait is woken by them too."""
    keys = list(work.keys)
    earlier = work.predecessor_id
    while earlier is not None:
        before = tx.work(earlier)
        if before is None:
            break  # compacted away: its keys reach nothing any more
        keys += [key for key in before.keys if key not in keys]
        earlier = before.predecessor_id
    return tuple(keys)


def register_wait_in_tx(
    tx: Tx,
    now_ms: int,
    execution: Execution,
    work: Work,
    spec: WaitSpec,
    *,
    resume: bool,
    limits: CausalLimits,
) -> Wait:
    """Store the wait of ``execution`` (already parked or ended by the caller, with its waiting result's
    proof applied) and scan accepted history for it; wake at once if something already matches."""
    answered = keys_answered_by(tx, work)
    keys = tuple(spec.keys) or answered
    for key in keys:
        if key not in answered:
            raise Conflict(  # (the Work's keys now: a state, not the request's form)
                f"wait.keys: key {key!r} is not owned by work {work.id} (its keys: {list(answered)})"
            )
    if not keys:
        raise InvalidRequest(f"wait: work {work.id} owns no key to wait on")
    # the last sequence accepted: compaction removes Events only up to the routing watermark
    accepted = max(tx.max_seq(), routing_watermark(tx))
    after = execution.watermark if spec.after_seq is None else spec.after_seq
    if after < execution.watermark:
        raise Conflict(  # (the attempt's acknowledged watermark: a state, not the request's form)
            f"wait.after_seq {after} is behind the attempt's acknowledged watermark {execution.watermark}"
        )
    if after > accepted:
        raise Conflict(  # (accepted history now: a state, not the request's form)
            f"wait.after_seq {after} is beyond accepted history (the last sequence is {accepted})"
        )
    wait_id = wait_id_for(execution.id, execution.epoch)
    if tx.open_wait_of_work(work.id) is not None or tx.wait(wait_id) is not None:
        raise Conflict(f"attempt {execution.id} already registered a wait at epoch {execution.epoch}")
    timeout_at = None
    timer_id = delivery_id = None
    if spec.timeout_ms is not None:
        timeout_at = min(now_ms + spec.timeout_ms, MAX_TIME_MS)
        timer_id, delivery_id = timeout_timer_id(wait_id), f"wait.timeout/{wait_id}"
    wait = Wait(
        id=wait_id,
        work_id=work.id,
        execution_id=execution.id,
        attempt=execution.attempt,
        epoch=execution.epoch,
        state=WaitState.ACTIVE,
        keys=keys,
        types=tuple(spec.types),
        after_seq=after,
        resume=resume,
        timeout_at_ms=timeout_at,
        timeout_timer_id=timer_id,
        timeout_delivery_id=delivery_id,
        winner_event_id=None,
        bridge_event_id=None,
        reason=None,
        created_at_ms=now_ms,
        woken_at_ms=None,
    )
    place = tx.kept_queue_place(work.id)
    tx.insert_wait(wait)
    # the Work as it waits now (``work``: read after its move to waiting) and its queue place, which
    # the Event that wakes it reads first, on a database alone from this commit (`Carried.of_works`)
    tx.known("work", work.id, work_with(work, wait_id=wait.id))
    if place is not None:
        tx.known("place", work.id, place)
    for i, declared in enumerate(spec.subscriptions):
        # the aliases land on the wait's first key, so a matching one wakes it
        declare_in_tx(
            tx,
            now_ms,
            work,
            declared,
            dependent_key=keys[0],
            wait_id=wait.id,
            state=SubscriptionState.PENDING,
            field=f"wait.subscriptions[{i}]",
        )
    if timeout_at is not None:
        _arm_timeout(tx, now_ms, wait, execution)
    wake_in_tx(tx, now_ms, wait.id, limits)
    registered = tx.wait(wait.id)
    assert registered is not None
    return registered


def _arm_timeout(
    tx: Tx, now_ms: int, wait: Wait, execution: Execution, *, parent_id: str | None = None
) -> None:
    """Arm the wait's timeout, derived from ``parent_id`` (by default the attempt's causal authority)."""
    assert wait.timeout_at_ms is not None
    assert wait.timeout_timer_id
    assert wait.timeout_delivery_id
    work = tx.work(wait.work_id)
    assert work is not None
    spec = TimerSpec(
        id=wait.timeout_timer_id,
        fire_at_ms=wait.timeout_at_ms,
        source=CORE_SOURCE,
        type=WAIT_TIMEOUT,
        scope=work.scope,
        work_id=work.id,
        delivery_id=wait.timeout_delivery_id,
        payload={"wait": wait.id, "work": work.id},
    )
    # the timeout derives from the attempt's causal authority: each timed-out round is one step deeper
    parent = parent_id or execution.authority_id or execution.trigger_id
    assert parent is not None, f"execution {execution.id} has no causal authority"
    arm_in_tx(tx, now_ms, spec, parent_id=parent, execution_id=execution.id, control=True)


# -- arbitration and wake ---------------------------------------------------------------------------------


def candidates_in_tx(tx: Tx, wait: Wait) -> list[Candidate]:
    """The wait's earliest normal match (if any) and its accepted timeout (if any)."""
    found: list[Candidate] = []
    after = wait.after_seq
    while True:
        page = tx.matching_candidates(wait.work_id, wait.keys, after, SCAN_PAGE)
        match = next((e for e in page if type_matches(wait.types, e.type)), None)
        if match is not None:
            found.append(Candidate(seq=match.seq, event_id=match.id))
            break
        if len(page) < SCAN_PAGE:
            break
        after = page[-1].seq
    if wait.timeout_delivery_id is not None:
        timeout = delivered(tx, CORE_SOURCE, wait.timeout_delivery_id)
        if timeout is not None and timeout.seq > wait.after_seq:
            found.append(Candidate(seq=timeout.seq, event_id=timeout.id, timeout=True))
    return found


def wake_in_tx(
    tx: Tx, now_ms: int, wait_id: str, limits: CausalLimits, *, parent_id: str | None = None
) -> Wait | None:
    """Arbitrate the wait over everything accepted so far and wake it with the winner (once).

    ``None``: nothing to do (not active, or nothing could wake it yet). ``parent_id`` overrides the
    bridge's parent (an operator's release of a blocked wait); by default it is the winner.
    """
    wait = tx.wait(wait_id)
    if wait is None:
        return None
    return wake_wait_in_tx(tx, now_ms, wait, limits, parent_id)


def wake_wait_in_tx(
    tx: Tx, now_ms: int, wait: Wait, limits: CausalLimits, parent_id: str | None = None
) -> Wait | None:
    """`wake_in_tx` for the wait as this transaction read it (every wake goes through here)."""
    if wait.state is not WaitState.ACTIVE:
        return None
    winner = arbitrate(candidates_in_tx(tx, wait))
    if winner is None:
        return None
    event = tx.event(winner.event_id)
    assert event is not None
    work = tx.work(wait.work_id)
    assert work is not None
    place = tx.kept_queue_place(work.id)  # (kept with the Work while no row changed since)
    bridge_in = EventIn(
        source=CORE_SOURCE,
        delivery_id=core_delivery_id("wait.woken", wait.id),
        type=WAIT_WOKEN,
        scope=work.scope,
        work_id=work.id,
        payload={"wait": wait.id, "winner": event.id, "work": work.id, "execution": wait.execution_id},
    )
    bridge = accept_derived_in_tx(
        tx, now_ms, bridge_in, parent_id or event.id, limits, execution_id=wait.execution_id, unseen=True
    )
    if isinstance(bridge, CausalRejection):
        return _block(
            tx, now_ms, wait, work, event, f"the causal limits refused its wake: {bridge.describe()}", limits
        )
    control_checkpoint(tx, now_ms, bridge, work.id, f"wake of wait {wait.id}")
    tx.set_wait_state(
        wait, WaitState.WOKEN, winner_event_id=event.id, bridge_event_id=bridge.id, woken_at_ms=now_ms
    )
    _disarm_timeout(tx, now_ms, wait, "its wait was woken")
    tx.end_subscriptions_of_wait(wait.id, SubscriptionState.WOKEN, f"its wait {wait.id} woke", now_ms)
    tx.add_input(work.id, event.id, event.seq)
    revision = tx.move_later(work, WorkState.READY, now_ms) if work.state is WorkState.WAITING else None
    # the start that mostly follows in this transaction reads the Work again: tell it as woken
    tx.known_lazily("work", work.id, lambda: _woken(tx, work, revision, now_ms))
    if place is not None:
        tx.known("place", work.id, place)  # (a wake moves no Work in the ready queue: the settle hook does)
    tx.notify(WorkChanged(work_id=work.id))
    return attrs.evolve(
        wait, state=WaitState.WOKEN, winner_event_id=event.id, bridge_event_id=bridge.id, woken_at_ms=now_ms
    )


def _woken(tx: Tx, work: Work, revision: int | None, now_ms: int) -> Work:
    """``work`` as its wait's wake wrote it: no open wait, the winner among its pending inputs, and ready
    if it was waiting (``revision``: its state's write; ``None``: its row is as it was)."""
    moved: dict[str, Any] = {}
    if revision is not None:
        moved = {"state": WorkState.READY, "revision": revision, "updated_at_ms": now_ms}
    return work_with(work, **moved, wait_id=None, pending_inputs=tx.pending_of(work.id))


def _disarm_timeout(tx: Tx, now_ms: int, wait: Wait, reason: str) -> None:
    timer = tx.timer(wait.timeout_timer_id) if wait.timeout_timer_id else None
    if timer is not None and timer.state is TimerState.ARMED:
        tx.set_timer_state(timer, TimerState.CANCELLED, reason, now_ms)
        tx.notify(TimerCancelled(timer_id=timer.id))


def _block(
    tx: Tx, now_ms: int, wait: Wait, work: Work, winner: Event | None, why: str, limits: CausalLimits
) -> Wait:
    """The wake cannot proceed: block the wait, disarm its timeout, hold the Work with an actionable
    reason, and record a root ``core.wait.blocked`` Event naming wait, winner and reason."""
    reason = f"Its wait is blocked: {why}; release the hold to wake it on what has arrived"
    tx.set_wait_state(wait, WaitState.BLOCKED, reason=reason, winner_event_id=winner.id if winner else None)
    _disarm_timeout(tx, now_ms, wait, "its wait is blocked")
    tx.end_subscriptions_of_wait(
        wait.id, SubscriptionState.DISABLED, f"its wait {wait.id} is blocked", now_ms
    )
    tx.update_work(work.id, now_ms, held=1, hold_reason=reason)
    blocked = accept_in_tx(
        tx,
        now_ms,
        EventIn(
            source=CORE_SOURCE,
            delivery_id=core_delivery_id("wait.blocked", wait.id, str(now_ms)),
            type=WAIT_BLOCKED,
            scope=work.scope,
            work_id=work.id,
            payload={"wait": wait.id, "winner": winner.id if winner else None, "reason": why},
        ),
        limits,
        trusted=True,
    )
    if not blocked.duplicate:
        control_checkpoint(tx, now_ms, blocked, work.id, f"wait {wait.id} is blocked")
    tx.add_diagnostic(DiagnosticKind.WAIT_BLOCKED, work.id, reason, {"wait": wait.id}, now_ms)
    tx.notify(WorkChanged(work_id=work.id))
    result = tx.wait(wait.id)
    assert result is not None
    return result


def unblock_waits_in_tx(tx: Tx, now_ms: int, work: Work, release: Event, limits: CausalLimits) -> None:
    """An operator released a Work held by a blocked wait: rearm its unfired timeout and arbitrate again,
    with the release (the operator's outside input) as the parent of the next wake's bridge. The
    rearmed timeout derives from the release too: derived from the attempt's chain, a timeout the
    causal limits refused would be refused again at once, and the wait could never be released."""
    wait = tx.open_wait_of_work(work.id)
    if wait is None or wait.state is not WaitState.BLOCKED:
        return
    tx.set_wait_state(wait, WaitState.ACTIVE, reason=f"released by {release.id}")
    for sub in tx.rearm_subscriptions_of_wait(wait.id, f"its wait was released by {release.id}", now_ms):
        tx.notify(SubscriptionChanged(namespace=sub.namespace, id=sub.id, source_key=sub.source_key))
    timeout_accepted = (
        wait.timeout_delivery_id is not None
        and delivered(tx, CORE_SOURCE, wait.timeout_delivery_id) is not None
    )
    if wait.timeout_at_ms is not None and not timeout_accepted:
        execution = tx.execution(wait.execution_id)
        assert execution is not None
        _arm_timeout(
            tx,
            now_ms,
            attrs.evolve(wait, timeout_at_ms=max(wait.timeout_at_ms, now_ms)),
            execution,
            parent_id=release.id,
        )
    wake_in_tx(tx, now_ms, wait.id, limits, parent_id=release.id)


def wake_on_key_in_tx(tx: Tx, now_ms: int, key: str | None, limits: CausalLimits) -> None:
    """An Event on ``key`` was routed (or checkpointed): every open wait watching it arbitrates again."""
    if key is None:
        return
    for wait in tx.open_waits_on_key(key):
        # each is another Work's (one open wait per Work): waking one leaves the others as read
        wake_wait_in_tx(tx, now_ms, wait, limits)


def wait_won_by(tx: Tx, event: Event) -> Wait | None:
    """The active wait whose arbitration ``event`` wins now (its routing transaction then wakes it with
    ``event``), if any. Reads only."""
    if event.key is None:
        return None
    for wait in tx.open_waits_on_key(event.key):
        if wait.state is not WaitState.ACTIVE:
            continue
        winner = arbitrate(candidates_in_tx(tx, wait))
        if winner is not None and winner.event_id == event.id:
            return wait
    return None


def cancel_wait_in_tx(tx: Tx, now_ms: int, work: Work) -> None:
    """Cancellation first: the open wait is cancelled (its timeout dies with the Work's timers), and
    every subscription of the Work ends: a cancelled Work gets no alias."""
    tx.cancel_subscriptions_of_work(work.id, f"work {work.id} was cancelled", now_ms)
    wait = tx.open_wait_of_work(work.id)
    if wait is not None:
        tx.set_wait_state(wait, WaitState.CANCELLED, reason=f"work {work.id} was cancelled")
        _disarm_timeout(tx, now_ms, wait, "its wait was cancelled")


# -- the wait timeout as a timer kind -------------------------------------------------------------------


def _timeout_fired(tx: Tx, now_ms: int, timer: Timer, event: Event, limits: CausalLimits) -> None:
    wait = tx.wait(str(event.payload.get("wait", "")))
    work_id = wait.work_id if wait is not None else None
    if wait is not None and wait.state is WaitState.ACTIVE:
        control_checkpoint(tx, now_ms, event, work_id, f"timeout of wait {wait.id}")
        wake_in_tx(tx, now_ms, wait.id, limits)
    else:
        control_checkpoint(tx, now_ms, event, work_id, "a wait timeout after its wait ended (audit only)")


def _timeout_refused(
    tx: Tx, now_ms: int, timer: Timer, rejection: CausalRejection, limits: CausalLimits
) -> None:
    wait = tx.wait(str(timer.payload.get("wait", "")))
    if wait is None or wait.state is not WaitState.ACTIVE:
        return
    work = tx.work(wait.work_id)
    assert work is not None
    _block(
        tx, now_ms, wait, work, None, f"the causal limits refused its timeout: {rejection.describe()}", limits
    )


TIMER_KIND = TimerKind(event_type=WAIT_TIMEOUT, on_fired=_timeout_fired, on_refused=_timeout_refused)
"""How a wait's timeout is applied when it fires (registered in `timer_kinds`)."""
