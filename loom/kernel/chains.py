"""Steps that commit together on the hot path (docs/architecture.md, "Admission"): an accepted or fired
Event is routed in its acceptance or firing commit, a batch of Events is routed in one commit, a routed
Event starts its Work's attempt, a completed attempt starts the next, and a recovered attempt's finished
result is adopted and recorded, each in the same transaction.

Starting at once is only a shortcut past the admission pass, never around its rules: it is taken only
when the pass, made right then, would start this very Work first (it can start, no scope capacity
makes it wait its turn, its binding runs here, and no start gate must be asked), and otherwise the
Work waits in the ready queue as usual. One commit and one round trip fewer per attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs

from ..config import Budget, CausalLimits
from ..records.events import Event, EventIn
from ..records.timers import Firing, FiringResult, RecurrencePolicy
from ..records.validation import CheckedPayload
from ..records.waits import Waiting
from ..records.work import Checkpoint, Execution, Lease, Outcome
from ..store import Tx
from .accept import accept_in_tx
from .admission import AdmitRequest, settle_in_tx, start_at_once_in_tx
from .authority import Authority
from .executions import KindPolicy, record_outcome_in_tx
from .firing import FirePass, fire_due_in_tx
from .recovery import adopt_fence_in_tx
from .resolve import DeferredRoute, RoutePlan, RouteRequest
from .route_records import RouteResult
from .routing import decide_in_tx, route_in_tx
from .unrouted import raise_watermark_in_tx, routing_watermark


def route_then_start_in_tx(
    tx: Tx, now_ms: int, req: RouteRequest, limits: CausalLimits, admit: AdmitRequest
) -> tuple[RouteResult, Lease | None]:
    """Route one Event (`route_in_tx`), then start the Work it was routed to if it can start at once (a
    Work the routing created, from what it wrote: `TxBase.holding`)."""
    with tx.holding():
        result = route_in_tx(tx, now_ms, req, limits)
        raise_watermark_in_tx(tx, now_ms)
        work_id = result.checkpoint.work_id
        if result.replay or work_id is None:
            return result, None
        return result, start_at_once_in_tx(tx, now_ms, work_id, admit)


@attrs.frozen
class RoutedBatch:
    retry: tuple[str, ...]
    """Events the batch did not route (a conflict, an earlier Event of their Work unrouted, a handler that
    failed): each needs its lane's full pass, which diagnoses what fails."""
    started: tuple[Lease, ...]


def route_batch_then_start_in_tx(
    tx: Tx,
    now_ms: int,
    requests: Sequence[RouteRequest | DeferredRoute],
    limits: CausalLimits,
    admit: AdmitRequest | None,
    *,
    raise_watermark: bool = True,
) -> RoutedBatch:
    """Route many Events in acceptance order, each in a savepoint and exactly as `route_in_tx` would (a
    deferred one decided over its Work as the earlier ones left it), then start each Work they were
    routed to if it can start at once (with ``admit``): one commit for a whole batch of a Work's Events
    and the attempt that takes them all. A Work the batch created is started from what its routing
    wrote, unless a later Event changed it, and the ready queue is settled (`admission.settle_in_tx`)
    from what each start wrote, through the others (`TxBase.holding`)."""
    with tx.holding():
        retry: list[str] = []
        routed_to: dict[str, None] = {}
        for req in requests:
            try:
                with tx.savepoint():
                    decided = decide_in_tx(tx, req) if isinstance(req, DeferredRoute) else req
                    if decided is None:
                        continue  # routed meanwhile
                    result = route_in_tx(tx, now_ms, decided, limits)
            except Exception as exc:
                if tx.is_storage_failure(exc):
                    raise
                retry.append(req.event_id)
                continue
            if not result.replay and result.checkpoint.work_id is not None:
                routed_to[result.checkpoint.work_id] = None
        if raise_watermark:
            raise_watermark_in_tx(tx, now_ms)
        started: list[Lease] = []
        if admit is not None:
            for work_id in routed_to:
                try:
                    with tx.savepoint():
                        lease = start_at_once_in_tx(tx, now_ms, work_id, admit, index=len(started))
                except Exception as exc:
                    if tx.is_storage_failure(exc):
                        raise
                    continue  # the Work stays queued: the admission pass meets it and diagnoses it
                if lease is not None:
                    started.append(lease)
        settle_in_tx(tx, now_ms)  # while what the starts told of their Works is held
    return RoutedBatch(retry=tuple(retry), started=tuple(started))


def complete_then_start_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    outcome: Outcome,
    kind: KindPolicy,
    limits: CausalLimits,
    budgets: Sequence[Budget],
    admit: AdmitRequest,
) -> Lease | None:
    """Commit an attempt's outcome (`complete_in_tx`), then start the Work's next attempt if input is
    waiting for it and it can start at once (a standing Work's queue, a retry due now): its lease."""
    ended = record_outcome_in_tx(tx, now_ms, auth, outcome, kind, limits, budgets)
    if isinstance(outcome, Waiting) or isinstance(ended, Execution):
        return None  # a wait's wake, not this commit, decides what comes next
    return start_at_once_in_tx(tx, now_ms, ended, admit)


def adopt_then_complete_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    outcome: Outcome,
    kind: KindPolicy,
    limits: CausalLimits,
    budgets: Sequence[Budget],
) -> None:
    """A recovered attempt's executor verified it and answered its finished outcome without adopting it
    first: adopt it under the recoverer's lease (`recovery.adopt_fence_in_tx`) and commit the outcome under
    that fence, in one transaction (docs/recovery.md: a finished result still commits under the new
    fence). Nothing is read back: the runner that asks goes on to its next attempt. The adoption's move to
    running is written with the outcome's end, in one statement."""
    adopted = adopt_fence_in_tx(tx, now_ms, auth, later=True)
    record_outcome_in_tx(tx, now_ms, auth, outcome, kind, limits, budgets, authorized=adopted)
    if adopted is not None:
        tx.write_state_later(adopted)  # (none is left once the end wrote the attempt's state)


WATERMARK_EVERY = 32
"""An acceptance that routes its own Event raises the routing watermark once it is this many sequences
behind (a count of sequences would miss it when each acceptance also derives Events: a wake's bridge)."""


def accept_then_route_in_tx(
    tx: Tx,
    now_ms: int,
    event: EventIn,
    limits: CausalLimits,
    plan: RoutePlan,
    admit: AdmitRequest | None,
    *,
    trusted: bool = False,
    checked: CheckedPayload | None = None,
) -> tuple[Event, tuple[Lease, ...], Checkpoint | None]:
    """Accept an Event (`accept_in_tx`) and route it in the same commit as a batch of one would
    (`route_batch_then_start_in_tx`), starting its Work at once if the admission pass would (with
    ``admit``: a plan that can deliver): one commit from publish to a started attempt. Routing is the
    router's to retry: an Event this cannot route (an earlier Event of its Work unrouted, a conflict, a
    failing pure handler) is accepted unrouted, as any other, and its lane routes it. A duplicate is
    answered as it is. Also answers the routing checkpoint this commit wrote (``None``: it routed
    nothing, or the Event is a duplicate)."""
    accepted = accept_in_tx(tx, now_ms, event, limits, trusted=trusted, checked=checked)
    if accepted.duplicate:
        return accepted, (), None
    req = plan.request(accepted.id)
    with tx.holding():  # a Work the routing creates starts from what it wrote (`TxBase.hold`)
        try:
            with tx.savepoint():
                decided = decide_in_tx(tx, req) if isinstance(req, DeferredRoute) else req
                result = route_in_tx(tx, now_ms, decided, limits) if decided is not None else None
        except Exception as exc:
            if tx.is_storage_failure(exc):
                raise
            return accepted, (), None  # its lane routes it, and records what fails
        if not tx.dialect.shared and accepted.seq - routing_watermark(tx) >= WATERMARK_EVERY:
            raise_watermark_in_tx(tx, now_ms)
        work_id = result.checkpoint.work_id if result is not None and not result.replay else None
        checkpoint = result.checkpoint if result is not None else None
        if admit is None or work_id is None:
            return accepted, (), checkpoint
        try:
            with tx.savepoint():
                lease = start_at_once_in_tx(tx, now_ms, work_id, admit)
        except Exception as exc:
            if tx.is_storage_failure(exc):
                raise
            return accepted, (), checkpoint  # the Work stays queued: the admission pass diagnoses it
    return accepted, (lease,) if lease is not None else (), checkpoint


def fire_then_route_in_tx(
    tx: Tx,
    now_ms: int,
    limit: int,
    limits: CausalLimits,
    policies: Mapping[str, RecurrencePolicy],
    exclude: frozenset[str],
    planner: Callable[[Event], RoutePlan | None],
    admit: AdmitRequest,
) -> tuple[FirePass, tuple[Lease, ...]]:
    """A firing pass (`firing.fire_due_in_tx`), then the routing of the Events it accepted as a batch
    (`route_batch_then_start_in_tx`), each that routes outside its lane (``planner``: the router's plan
    for it, a pure function of the configuration), starting the Works they reach: one commit from a due
    timer to a started attempt. What the batch cannot route is routed from its notice."""
    done = fire_due_in_tx(tx, now_ms, limit, limits, policies, exclude)
    events = [
        result.event_id
        for result in done.results
        if isinstance(result, Firing) and result.result is FiringResult.ACCEPTED and result.event_id
    ]
    requests: list[RouteRequest | DeferredRoute] = []
    for event_id in events:
        event = tx.event(event_id)
        try:
            plan = planner(event) if event is not None else None
        except Exception:  # the plan reads plugin handlers' declarations: the notice way decides then
            plan = None
        if plan is not None:
            requests.append(plan.request(event_id))
    if not requests:
        return done, ()
    batch = route_batch_then_start_in_tx(tx, now_ms, requests, limits, admit)
    return done, batch.started
