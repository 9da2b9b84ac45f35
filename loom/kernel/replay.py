"""Replaying an Event that stayed ``unrouted``: an operator's request, recorded as a control Event
(docs/concepts.md).
"""

from __future__ import annotations

import attrs

from ..config import CausalLimits
from ..records.core_events import CORE_SOURCE, REPLAY_REQUESTED
from ..records.errors import Conflict, InvalidRequest, NotFound
from ..records.events import Event, EventIn
from ..records.ids import core_delivery_id
from ..records.notices import EventReplayed
from ..records.validation import check_reason, check_text
from ..records.work import CheckpointStatus
from ..store import Tx
from .accept import accept_in_tx, delivered
from .checkpoints import control_checkpoint
from .unrouted import lower_watermark_in_tx


def replay_in_tx(
    tx: Tx, now_ms: int, event_id: str, request_id: str, reason: str, limits: CausalLimits
) -> Event:
    """An operator replays an Event that stayed ``unrouted``: a ``core.replay.requested`` control Event
    records the request (naming the Event and the checkpoint it replaces), and the Event is routed again,
    once, after what was routed meanwhile. Repeating a request returns its control Event; any other
    checkpoint is final (`Conflict`)."""
    check_text("event_id", event_id)
    check_text("request_id", request_id)
    check_reason("reason", reason)
    delivery_id = core_delivery_id("replay", request_id)
    done = delivered(tx, CORE_SOURCE, delivery_id)
    if done is not None:
        if done.compacted:
            return attrs.evolve(done, duplicate=True)  # its record is gone; the request stays answered
        if done.payload.get("event") != event_id:
            raise InvalidRequest(
                f"replay request {request_id!r} was already used for event {done.payload.get('event')}"
            )
        return attrs.evolve(done, duplicate=True)
    event = tx.event(event_id)
    if event is None:
        raise NotFound(f"no event with id {event_id!r}")
    checkpoint = tx.checkpoint(event_id)
    if checkpoint is None:
        raise Conflict(f"event {event_id} is not routed yet: there is nothing to replay")
    if checkpoint.status is not CheckpointStatus.UNROUTED:
        raise Conflict(
            f"event {event_id} is {checkpoint.status}, which is final; only an unrouted event can be replayed"
        )
    control = EventIn(
        source=CORE_SOURCE,
        delivery_id=delivery_id,
        type=REPLAY_REQUESTED,
        scope=event.scope,
        payload={"event": event.id, "replaces": checkpoint.reason or "", "reason": reason},
    )
    requested = accept_in_tx(tx, now_ms, control, limits, trusted=True)
    control_checkpoint(tx, now_ms, requested, checkpoint.work_id, f"replay of event {event.id}")
    tx.replace_checkpoint(checkpoint, requested.id, now_ms)
    lower_watermark_in_tx(tx, now_ms, event.seq)
    tx.notify(EventReplayed(event=event))
    return requested
