"""The ingress actor: validation, dedup and the durable acceptance acknowledgement.

Each offered Event is validated before it reaches storage (a bad one gets an error
naming the field and nothing is stored), then accepted by ``accept_in_tx``. Acceptance
runs in the publisher's own task, straight to the storage actor's mailbox: with no
hand-off through a mailbox and a task of ingress's own, a producer whose batch just
committed offers its next Event within one scheduling pass, so the next batch gathers
every concurrent producer rather than about half of them (see bench/accept.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from ..config import CausalLimits
from ..kernel.accept import accept_batch_in_tx, accept_derived_in_tx, accept_in_tx
from ..kernel.admission import AdmitRequest
from ..kernel.chains import accept_then_route_in_tx
from ..kernel.resolve import RoutePlan
from ..records.errors import CausalRefused, LoomError
from ..records.events import CausalRejection, Event, EventIn
from ..records.validation import CheckedPayload, check_text, checked_payload
from ..records.work import Checkpoint, Lease
from ..store import StorageActor


@attrs.frozen
class RouteAtAcceptance:
    """What the router hands the ingress to route an Event in its acceptance commit: how it routes,
    how an attempt that commit starts is claimed, and where it is launched."""

    plan: RoutePlan
    admit: AdmitRequest | None
    """``None``: the plan delivers to no Work (no match, a drop), so nothing can start."""
    launch: Callable[[Lease, str], object]


@attrs.frozen
class RouteAtFiring:
    """What the router hands the timer actor to route the Events a firing pass accepts in its commit:
    the plan of each (`lanes.Planner`), how an attempt that commit starts is claimed, and where it is
    launched."""

    planner: Callable[[Event], RoutePlan | None]
    admit: AdmitRequest
    launch: Callable[[Lease, str], object]


class IngressActor:
    def __init__(self, storage: StorageActor, limits: Callable[[], CausalLimits]) -> None:
        # what bounds the requests in flight is the storage actor's mailbox: a publish waits there
        self._storage = storage
        self._limits = limits

    async def publish(
        self,
        event: EventIn,
        *,
        trusted: bool = False,
        routing: Callable[[EventIn], RouteAtAcceptance | None] | None = None,
    ) -> Event:
        """Accept a root Event; return it once committed (or the original, marked duplicate): see
        `publish_routed`."""
        accepted, _ = await self.publish_routed(event, trusted=trusted, routing=routing)
        return accepted

    async def publish_routed(
        self,
        event: EventIn,
        *,
        trusted: bool = False,
        routing: Callable[[EventIn], RouteAtAcceptance | None] | None = None,
    ) -> tuple[Event, Checkpoint | None]:
        """Accept a root Event; return it once committed (or the original, marked duplicate), with the
        routing checkpoint its acceptance commit wrote (``None``: that commit routed nothing).

        A bad Event is refused here, naming the field, before it costs a storage request. What is
        stored is the payload's JSON text checked here (``checked``, read back here too): a payload the
        publisher changes meanwhile changes nothing, and ``accept_in_tx`` need not check the same rules
        again, nor spend the storage thread's time reading the text back.

        With ``routing`` (the router's `at_acceptance`, asked once the Event is valid) an Event that
        routes outside its lane is routed in its acceptance commit, and an attempt that commit started
        is launched where the router launches attempts.
        """
        payload = checked_payload(event, allow_core=trusted)
        plan = routing(event) if routing is not None else None
        if plan is None:
            alone: Event = await self._storage.submit(
                accept_in_tx, event, self._limits(), trusted=trusted, checked=payload
            )
            return alone, None
        accepted, started, checkpoint = await self._storage.submit(
            accept_then_route_in_tx,
            event,
            self._limits(),
            plan.plan,
            plan.admit,
            trusted=trusted,
            checked=payload,
        )
        for lease in started:
            plan.launch(lease, lease.request.executor or "")
        return accepted, checkpoint

    async def publish_many(self, events: Sequence[EventIn]) -> list[Event | LoomError]:
        """Accept root Events in the order given, in one storage request (`accept_batch_in_tx`): each
        answer is the Event (new or a duplicate) or the `LoomError` that refused it, in order. A bad
        Event is refused here, naming the field, and the others are accepted without it."""
        answers: list[Event | LoomError | None] = []
        valid: list[EventIn] = []
        payloads: list[CheckedPayload] = []
        for event in events:
            try:
                payloads.append(checked_payload(event))
            except LoomError as refused:
                answers.append(refused)
            else:
                answers.append(None)
                valid.append(event)
        if valid:
            accepted = iter(await self._storage.submit(accept_batch_in_tx, valid, self._limits(), payloads))
            answers = [next(accepted) if answer is None else answer for answer in answers]
        return [answer for answer in answers if answer is not None]

    async def publish_derived(
        self,
        event: EventIn,
        *,
        parent_id: str,
        cause_id: str | None = None,
        execution_id: str | None = None,
    ) -> Event:
        """Accept an Event derived from ``parent_id`` (trusted authority) under the causal bounds.

        Raises `CausalRefused` after the refusal's diagnostic has committed.
        """
        payload = checked_payload(event, allow_core=True)
        check_text("parent_id", parent_id)
        check_text("cause_id", cause_id, optional=True)
        result = await self._storage.submit(
            accept_derived_in_tx,
            event,
            parent_id,
            self._limits(),
            cause_id=cause_id,
            execution_id=execution_id,
            checked=payload,
        )
        if isinstance(result, CausalRejection):
            raise CausalRefused(result.describe(), rejection=result)
        return result
