"""The store's time floor: the latest clock reading a host recorded as durable (time
never moves backwards, not even in a test).

A clock that only moves when told (``loom serve --test-clock``) records each move here before it is
acknowledged, and a restart starts the clock at the floor, so a drill's clock cannot run backwards
across a kill.
"""

from __future__ import annotations

from ..store import Tx

TIME_NAMESPACE = "core.clock"
FLOOR = "floor"


def mark_time_in_tx(tx: Tx, now_ms: int) -> int:
    """Raise the floor to ``now_ms`` (it never goes down); return the floor."""
    entry = tx.kv_get(TIME_NAMESPACE, FLOOR)
    floor = max(now_ms, int(entry.value["now_ms"])) if entry is not None else now_ms
    tx.kv_put(TIME_NAMESPACE, FLOOR, {"now_ms": floor}, now_ms)
    return floor
