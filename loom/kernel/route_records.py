"""What routing records: the route checkpoint of an Event, the ``unrouted`` stop with its diagnostic,
and the failures the router reports when a handler raises or a decision cannot be applied
(docs/architecture.md).
"""

from __future__ import annotations

import attrs

from ..config import CausalLimits
from ..records.errors import NotFound
from ..records.events import DiagnosticKind, Event
from ..records.notices import EventRouted
from ..records.work import Checkpoint, CheckpointStatus, Policy, Unmatched, Work, WorkState
from ..store import Tx
from .resolve import RouteRef, RouteRequest
from .waits import wake_on_key_in_tx


@attrs.frozen(kw_only=True)
class RouteResult:
    checkpoint: Checkpoint
    replay: bool = False
    joined: tuple[str, ...] = ()
    """Earlier unrouted Events that joined the Work's backlog through a key attachment."""


def resolved_work(tx: Tx, event: Event) -> Work | None:
    """The Work an Event resolves to before any decision: the one it names, else its key's owner."""
    if event.work_id is not None:
        return tx.work(event.work_id)
    if event.key is not None:
        owner = tx.key_owner(event.key)
        return tx.work(owner) if owner else None
    return None


def unrouted(
    tx: Tx,
    now_ms: int,
    event: Event,
    req: RouteRequest,
    kind: DiagnosticKind,
    reason: str,
    *,
    work_id: str | None = None,
) -> RouteResult:
    """Routing stops with a diagnostic: the Event keeps an ``unrouted`` checkpoint naming why."""
    message = f"{kind}: {reason}"
    cp = route_checkpoint(tx, now_ms, event, CheckpointStatus.UNROUTED, req, work_id=work_id, reason=message)
    tx.add_diagnostic(kind, event.id, message, {"event": event.id, "seq": event.seq}, now_ms)
    return RouteResult(checkpoint=cp)


def record_handler_error_in_tx(
    tx: Tx, now_ms: int, event_id: str, route: RouteRef, error: str, generation: int = 0
) -> RouteResult:
    """A handler raised or answered nonsense: routing stops (no later route is tried); the Event stays
    unrouted with a diagnostic, for an operator to replay once the handler is fixed."""
    return _record_failure(
        tx,
        now_ms,
        event_id,
        route,
        generation,
        DiagnosticKind.HANDLER_ERROR,
        f"route {route.name!r} raised {error}",
    )


def record_routing_failure_in_tx(
    tx: Tx, now_ms: int, event_id: str, route: RouteRef | None, reason: str, generation: int = 0
) -> RouteResult:
    """Applying a decision failed (or kept conflicting): the Event stays unrouted with a diagnostic."""
    return _record_failure(tx, now_ms, event_id, route, generation, DiagnosticKind.ROUTING_FAILED, reason)


def _record_failure(
    tx: Tx,
    now_ms: int,
    event_id: str,
    route: RouteRef | None,
    generation: int,
    kind: DiagnosticKind,
    reason: str,
) -> RouteResult:
    event = tx.event(event_id)
    if event is None:
        raise NotFound(f"no event with id {event_id!r}")
    existing = tx.checkpoint(event.id)
    if existing is not None:
        return RouteResult(checkpoint=existing, replay=True)
    req = RouteRequest(
        event_id=event_id, decision=Unmatched(), route=route, expected_revision=None, generation=generation
    )
    waiting = resolved_work(tx, event)
    if kind is DiagnosticKind.HANDLER_ERROR and waiting is not None and waiting.state is WorkState.WAITING:
        # a route that errs keeps the input as context of the waiting Work (it cannot bypass the wait)
        tx.add_diagnostic(kind, event.id, f"{kind}: {reason}", {"event": event.id, "seq": event.seq}, now_ms)
        tx.add_input(waiting.id, event.id, event.seq)
        cp = route_checkpoint(
            tx,
            now_ms,
            event,
            CheckpointStatus.ROUTED,
            req,
            work_id=waiting.id,
            reason=f"kept as context of waiting work {waiting.id}: {reason}",
        )
        wake_on_key_in_tx(tx, now_ms, event.key, CausalLimits())
        return RouteResult(checkpoint=cp)
    return unrouted(tx, now_ms, event, req, kind, reason)


def route_checkpoint(
    tx: Tx,
    now_ms: int,
    event: Event,
    status: CheckpointStatus,
    req: RouteRequest,
    *,
    work_id: str | None = None,
    policy: Policy | None = None,
    effective: Policy | None = None,
    fallback_reason: str | None = None,
    reason: str | None = None,
) -> Checkpoint:
    route = req.route
    cp = Checkpoint(
        event_id=event.id,
        seq=event.seq,
        status=status,
        work_id=work_id,
        route=route.name if route else None,
        route_scope=route.scope if route else None,
        policy=policy or (route.declared if route else None),
        effective_policy=effective,
        fallback_reason=fallback_reason,
        reason=reason,
        generation=req.generation or None,
        at_ms=now_ms,
    )
    tx.insert_checkpoint(cp)
    tx.notify(EventRouted(event_id=cp.event_id, work_id=cp.work_id, status=cp.status))
    # the Work it resolves to may have a continuation waiting for this Event's routing (whatever its
    # checkpoint says): settling lets the admission pass look at that Work again
    resolved = work_id or event.work_id or (tx.key_owner(event.key) if event.key is not None else None)
    if resolved is not None:
        tx.touch(resolved)
    return cp
