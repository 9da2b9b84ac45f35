"""Routing checkpoints written outside a route decision: control Events the runtime accepts itself.

A control checkpoint keeps the Event's association (its Work) but is nonrunnable: the Event never
becomes a Work's input, and nothing waits for it to be routed.
"""

from __future__ import annotations

from ..records.events import Event
from ..records.notices import EventRouted
from ..records.work import Checkpoint, CheckpointStatus
from ..store import Tx


def control_checkpoint(tx: Tx, now_ms: int, event: Event, work_id: str | None, reason: str) -> None:
    """Checkpoint a control Event as routed to ``work_id`` without making it input."""
    tx.insert_checkpoint(
        Checkpoint(
            event_id=event.id,
            seq=event.seq,
            status=CheckpointStatus.ROUTED,
            work_id=work_id,
            route=None,
            route_scope=None,
            policy=None,
            effective_policy=None,
            fallback_reason=None,
            reason=f"control: {reason}",
            generation=None,
            at_ms=now_ms,
        )
    )
    tx.notify(EventRouted(event_id=event.id, work_id=work_id, status=CheckpointStatus.ROUTED))
