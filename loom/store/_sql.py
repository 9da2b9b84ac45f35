"""Row shapes and read queries shared by the write-side `Tx` and the read-side `Reader`."""

from __future__ import annotations

import json
from typing import Any

from .._records import Event, KVEntry

EVENT_COLUMNS = (
    "id, seq, source, delivery_id, type, scope, key, work_id, execution_id, payload, "
    "parent_id, cause_id, root_id, depth, accepted_at_ms"
)
EVENT_BY_ID = f"SELECT {EVENT_COLUMNS} FROM events WHERE id = ?"
EVENT_BY_DELIVERY = f"SELECT {EVENT_COLUMNS} FROM events WHERE source = ? AND delivery_id = ?"
EVENTS_AFTER = f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
EVENTS_OF_ROOT = f"SELECT {EVENT_COLUMNS} FROM events WHERE root_id = ? AND seq > ? ORDER BY seq LIMIT ?"
EVENT_COUNT = "SELECT count(*) FROM events"
KV_GET = "SELECT namespace, key, value, updated_at_ms FROM kv WHERE namespace = ? AND key = ?"
KV_LIST = "SELECT namespace, key, value, updated_at_ms FROM kv WHERE namespace = ? ORDER BY key LIMIT ?"
BUCKET_COUNT = "SELECT count FROM causal_buckets WHERE root_id = ? AND minute = ?"

Row = tuple[Any, ...]


def event_from_row(row: Row) -> Event:
    return Event(
        id=row[0],
        seq=row[1],
        source=row[2],
        delivery_id=row[3],
        type=row[4],
        scope=row[5],
        key=row[6],
        work_id=row[7],
        execution_id=row[8],
        payload=json.loads(row[9]),
        parent_id=row[10],
        cause_id=row[11],
        root_id=row[12],
        depth=row[13],
        accepted_at_ms=row[14],
    )


def kv_from_row(row: Row) -> KVEntry:
    return KVEntry(namespace=row[0], key=row[1], value=json.loads(row[2]), updated_at_ms=row[3])
