"""Causal bounds: depth and per-root per-minute budgets.

Pure decisions first, then the transaction helpers `accept_derived_in_tx` uses.
"""

from __future__ import annotations

import json

import attrs

from ..config import CausalLimits
from ..records.events import CausalRejection, Event, EventIn, RejectionReason
from ..records.serde import unstructure
from ..store import Tx

REJECTIONS_NAMESPACE = "core.causal.rejections"
MINUTE_MS = 60_000
DEFAULT_LIMITS = CausalLimits()
"""The limits of a root accepted under the defaults (it has no pinned row)."""


def utc_minute(now_ms: int) -> int:
    """The fixed UTC minute bucket: floor(unix seconds / 60)."""
    return now_ms // MINUTE_MS


@attrs.frozen(kw_only=True)
class Position:
    """Where a new derived Event would sit: its root, depth, and the roots it is charged to."""

    root_id: str
    depth: int
    charged_roots: tuple[str, ...]


def position(parent: Event, cause: Event | None) -> Position:
    """Depth is max(cause, trigger) + 1; the root is the cause's; both roots pay."""
    if cause is None or cause.id == parent.id:
        return Position(root_id=parent.root_id, depth=parent.depth + 1, charged_roots=(parent.root_id,))
    roots = (cause.root_id,) if cause.root_id == parent.root_id else (cause.root_id, parent.root_id)
    return Position(root_id=cause.root_id, depth=max(parent.depth, cause.depth) + 1, charged_roots=roots)


def rejection_key(parent_id: str, source: str, delivery_id: str) -> str:
    """The key of a refusal's diagnostic: one per parent, source and delivery id. The parts are written
    as a JSON array, since a source or a delivery id may hold any separator (``|`` included)."""
    return json.dumps([parent_id, source, delivery_id], ensure_ascii=False, separators=(",", ":"))


def root_limits(tx: Tx, root_id: str, current: CausalLimits) -> CausalLimits:
    """A root's pinned limits, never looser than the current configuration.

    A root accepted under the default limits has no row: its pin is the defaults.
    """
    pinned = tx.causal_root_limits(root_id)
    if pinned is None:
        return current.stricter(DEFAULT_LIMITS)
    return current.stricter(CausalLimits(max_depth=pinned[0], per_minute=pinned[1]))


def check_and_charge_in_tx(
    tx: Tx,
    now_ms: int,
    event: EventIn,
    parent: Event,
    cause: Event | None,
    limits: CausalLimits,
    *,
    execution_id: str | None = None,
) -> Position | CausalRejection:
    """Check depth and every charged root's budget; charge them all, or commit a rejection.

    A rejection writes its redacted diagnostic to the ``core.causal.rejections`` KV
    namespace and charges nothing.
    """
    pos = position(parent, cause)
    minute = utc_minute(now_ms)
    per_root = {root: root_limits(tx, root, limits) for root in pos.charged_roots}
    max_depth = min(lim.max_depth for lim in per_root.values())
    rejection: CausalRejection | None = None
    if pos.depth > max_depth:
        rejection = _rejection(
            RejectionReason.DEPTH_LIMIT,
            pos.root_id,
            pos.depth,
            max_depth,
            per_root[pos.root_id].per_minute,
            minute,
            event,
            parent,
            cause,
            execution_id,
            now_ms,
            observed=pos.depth,
        )
    else:
        # one root (most derived Events): checked and charged in one statement, nothing charged when full
        single = len(per_root) == 1 and min(lim.per_minute for lim in per_root.values()) >= 1
        for root, lim in per_root.items():
            if single and tx.charge_bucket_under(root, minute, lim.per_minute):
                return pos
            count = tx.bucket_count(root, minute)
            if count >= lim.per_minute:
                rejection = _rejection(
                    RejectionReason.RATE_LIMIT,
                    root,
                    pos.depth,
                    max_depth,
                    lim.per_minute,
                    minute,
                    event,
                    parent,
                    cause,
                    execution_id,
                    now_ms,
                    observed=count,
                )
                break
    if rejection is not None:
        tx.kv_put(
            REJECTIONS_NAMESPACE,
            rejection_key(parent.id, event.source, event.delivery_id),
            unstructure(rejection),
            now_ms,
        )
        return rejection
    for root in pos.charged_roots:
        tx.charge_bucket(root, minute)
    return pos


def _rejection(
    reason: RejectionReason,
    root_id: str,
    depth: int,
    limit: int,
    budget: int,
    minute: int,
    event: EventIn,
    parent: Event,
    cause: Event | None,
    execution_id: str | None,
    now_ms: int,
    *,
    observed: int,
) -> CausalRejection:
    return CausalRejection(
        reason=reason,
        root_id=root_id,
        depth=depth,
        limit=limit,
        budget=budget,
        minute=minute,
        source=event.source,
        delivery_id=event.delivery_id,
        type=event.type,
        parent_id=parent.id,
        cause_id=cause.id if cause is not None and cause.id != parent.id else None,
        work_id=event.work_id,
        execution_id=execution_id,
        at_ms=now_ms,
        observed=observed,
    )
