"""Finding Events that still need routing, from a durable watermark.

Every Event at or below the routing watermark has its checkpoint, so a search for unrouted Events
starts there instead of at the first Event ever accepted: its cost follows what is not routed yet, not
the history. The search raises the watermark as far as it finds everything routed; a replay, which
makes an Event unrouted again, lowers it below that Event. On a shared database the watermark's row is
locked while it is read and moved, so a raise never overwrites a replay's lowering.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..records.events import Event
from ..store import Tx

ROUTING_NAMESPACE = "core.routing"
WATERMARK = "watermark"


def routing_watermark(tx: Tx, *, for_update: bool = False) -> int:
    entry = tx.kv_get(ROUTING_NAMESPACE, WATERMARK, for_update=for_update)
    return int(entry.value["seq"]) if entry is not None else 0


def unrouted_in_tx(tx: Tx, now_ms: int, limit: int, after_seq: int | None = None) -> list[Event]:
    """Up to ``limit`` Events without a routing checkpoint, in acceptance order: from the watermark,
    which it raises to just below the first of them (or to the newest Event, when every one is routed);
    or, to read on from an earlier page, from just after ``after_seq``."""
    if after_seq is not None:
        return tx.unrouted_events(after_seq, limit)
    watermark = routing_watermark(tx, for_update=True)
    # The newest Event is read before the search, not after: on a shared database each statement sees
    # what other nodes committed by then, and sequence order is commit order, so every Event up to it
    # has committed and the search sees it. Read after, it could name Events committed after the
    # search looked (unrouted, unseen), and the watermark would pass over them: an Event of their Work
    # accepted later would then route first (no earlier unrouted Event found below the watermark).
    newest = tx.max_seq()
    found = tx.unrouted_events(watermark, limit)
    raised = found[0].seq - 1 if found else newest
    if raised > watermark:
        tx.kv_put(ROUTING_NAMESPACE, WATERMARK, {"seq": raised}, now_ms)
    return found


RAISE_WINDOW = 2000
"""How many Events one raise of the watermark looks at, at most (a raise costs a bounded read)."""


def raise_watermark_in_tx(tx: Tx, now_ms: int) -> None:
    """Raise the watermark past the Events routed since it was last raised (a routing commit makes one,
    so the per-Work order checks read only Events not yet known routed, not a standing Work's whole
    history). It reads at most `RAISE_WINDOW` Events in a transaction, shared with the searches of
    `earlier_unrouted` (`Tx.routed_through`). On a shared database it is left to the routing
    passes of `unrouted_in_tx` (its row would be one lock every node's routing commit waits on)."""
    if tx.dialect.shared:
        return
    watermark = routing_watermark(tx)
    newest = tx.max_seq()
    if newest <= watermark:
        return
    raised = tx.routed_through(watermark, newest, RAISE_WINDOW)
    if raised > watermark:
        tx.kv_put(ROUTING_NAMESPACE, WATERMARK, {"seq": raised}, now_ms)


def earlier_unrouted(tx: Tx, work_id: str, scope: str, keys: Sequence[str], before_seq: int) -> list[Event]:
    """Unrouted Events accepted before ``before_seq`` that resolve to ``work_id`` (by id, or by ``keys``
    in its ``scope``), in acceptance order: searched above the routing watermark only, or above what
    this transaction knows routed past it (`Tx.routed_through`)."""
    after = tx.routed_through(routing_watermark(tx), before_seq - 1, RAISE_WINDOW)
    return tx.earlier_unrouted_for(work_id, scope, keys, before_seq, after_seq=after)


def lower_watermark_in_tx(tx: Tx, now_ms: int, seq: int) -> None:
    """The Event at ``seq`` needs routing again (a replay): the watermark goes below it."""
    if routing_watermark(tx, for_update=True) >= seq:
        tx.kv_put(ROUTING_NAMESPACE, WATERMARK, {"seq": seq - 1}, now_ms)
