"""What a commit tells the other nodes of a shared database, and what a node makes of it.

After each batch the storage actor sums up the batch's notices in one small payload (a few numbers
and flags, never the rows) and sends it with the commit (PostgreSQL: ``pg_notify`` inside the
transaction, delivered only if it commits). Another node turns the payload back into a `StoreChanged`
notice for its actors, which read what changed from their own cursors. Payloads are bounded: a batch
that fenced more attempts, or rearmed more subscriptions, than fit says ``everything`` instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from ..records.notices import (
    EventAccepted,
    EventReplayed,
    EventRouted,
    ExecutionFenced,
    IntentPending,
    LeaseExpiry,
    Notice,
    StoreChanged,
    SubscriptionChanged,
    TimerArmed,
    WorkReady,
    WorkSettled,
)

CHANNEL = "loom"
MAX_LISTED = 40
MAX_KEY_BYTES = 4000
"""A payload stays well under PostgreSQL's 8000 bytes: a batch that would list more says ``everything``."""


def summarize(notices: Iterable[Notice], origin: str, *, routing: bool = True) -> str | None:
    """The payload announcing a batch's notices to other nodes (``None``: nothing they need)."""
    seq = 0
    due: int | None = None
    expiry: int | None = None
    flags: dict[str, int] = {}
    fenced: list[str] = []
    settled: list[str] = []
    keys: dict[str, None] = {}
    for notice in notices:
        if isinstance(notice, EventAccepted):
            seq = max(seq, notice.event.seq)
        elif isinstance(notice, TimerArmed):
            due = notice.fire_at_ms if due is None else min(due, notice.fire_at_ms)
        elif isinstance(notice, LeaseExpiry):
            expiry = notice.expires_at_ms if expiry is None else min(expiry, notice.expires_at_ms)
        elif isinstance(notice, WorkReady):
            flags["w"] = 1
        elif isinstance(notice, EventRouted | EventReplayed):
            flags["r"] = 1
        elif isinstance(notice, IntentPending):
            flags["i"] = 1
        elif isinstance(notice, SubscriptionChanged):
            keys[notice.source_key] = None
        elif isinstance(notice, ExecutionFenced):
            fenced.append(notice.execution_id)
        elif isinstance(notice, WorkSettled):
            settled.append(notice.work_id)
    out: dict[str, object] = dict(flags)
    if seq:
        out["e"] = seq
        if not routing:
            out["u"] = 1
    if due is not None:
        out["t"] = due
    if expiry is not None:
        out["l"] = expiry
    if (
        len(fenced) > MAX_LISTED
        or len(keys) > MAX_LISTED
        or len(settled) > MAX_LISTED
        or sum(map(len, keys)) + sum(map(len, settled)) > MAX_KEY_BYTES
    ):
        out["*"] = 1
    else:
        if fenced:
            out["f"] = fenced
        if keys:
            out["s"] = list(keys)
        if settled:
            out["d"] = settled
    if not out:
        return None
    out["o"] = origin
    return json.dumps(out, separators=(",", ":"))


def parse(payload: str, origin: str) -> StoreChanged | None:
    """The notice another node's payload stands for (``None``: it is this node's own, or unreadable,
    which is reported as ``everything``)."""
    try:
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        if data.get("o") == origin:
            return None
        return StoreChanged(
            origin=str(data.get("o", "")),
            events_through=int(data.get("e", 0)),
            unrouted=bool(data.get("u")),
            timer_due_ms=int(data["t"]) if "t" in data else None,
            lease_expiry_ms=int(data["l"]) if "l" in data else None,
            work_ready=bool(data.get("w")),
            routed=bool(data.get("r")),
            intents=bool(data.get("i")),
            subscription_keys=tuple(str(x) for x in data.get("s", ())),
            fenced=tuple(str(x) for x in data.get("f", ())),
            settled=tuple(str(x) for x in data.get("d", ())),
            everything=bool(data.get("*")),
        )
    except (ValueError, TypeError, KeyError):
        return StoreChanged(everything=True)
