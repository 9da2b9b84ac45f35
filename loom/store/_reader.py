"""The read side: queries on separate read-only connections (sqlite-anyio).

Reads never block the writer (WAL) and a cancelled read interrupts its query. A
``:memory:`` database has no second connection, so its reads go through the storage
actor instead; both readers offer the same methods, mirroring `Tx`'s read methods.
"""

from __future__ import annotations

from typing import Any

import sqlite_anyio

from .._records import Event, KVEntry
from . import _sql
from ._actor import StorageActor
from ._tx import Tx


class Reader:
    """Read-only queries on a file database through sqlite-anyio."""

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._conn: sqlite_anyio.Connection | None = None

    async def open(self) -> None:
        self._conn = await sqlite_anyio.connect(self._uri, uri=True)

    async def aclose(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def _all(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        assert self._conn is not None, "Reader.open() was not called"
        cursor = await self._conn.cursor()
        try:
            await cursor.execute(sql, params)
            return await cursor.fetchall()
        finally:
            await cursor.close()

    async def event(self, event_id: str) -> Event | None:
        rows = await self._all(_sql.EVENT_BY_ID, (event_id,))
        return _sql.event_from_row(rows[0]) if rows else None

    async def event_by_delivery(self, source: str, delivery_id: str) -> Event | None:
        rows = await self._all(_sql.EVENT_BY_DELIVERY, (source, delivery_id))
        return _sql.event_from_row(rows[0]) if rows else None

    async def events_after(self, seq: int, limit: int) -> list[Event]:
        return [_sql.event_from_row(r) for r in await self._all(_sql.EVENTS_AFTER, (seq, limit))]

    async def events_of_root(self, root_id: str, after_seq: int, limit: int) -> list[Event]:
        rows = await self._all(_sql.EVENTS_OF_ROOT, (root_id, after_seq, limit))
        return [_sql.event_from_row(r) for r in rows]

    async def kv_get(self, namespace: str, key: str) -> KVEntry | None:
        rows = await self._all(_sql.KV_GET, (namespace, key))
        return _sql.kv_from_row(rows[0]) if rows else None

    async def kv_list(self, namespace: str, limit: int = 1000) -> list[KVEntry]:
        return [_sql.kv_from_row(r) for r in await self._all(_sql.KV_LIST, (namespace, limit))]

    async def bucket_count(self, root_id: str, minute: int) -> int:
        rows = await self._all(_sql.BUCKET_COUNT, (root_id, minute))
        return int(rows[0][0]) if rows else 0


class ActorReader:
    """The same reads, served by the storage actor (for ``:memory:``)."""

    def __init__(self, storage: StorageActor) -> None:
        self._storage = storage

    async def open(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def _call(self, name: str, *args: Any) -> Any:
        def read(tx: Tx, now_ms: int, *a: Any) -> Any:
            return getattr(tx, name)(*a)

        return await self._storage.submit(read, *args)

    async def event(self, event_id: str) -> Event | None:
        result: Event | None = await self._call("event", event_id)
        return result

    async def event_by_delivery(self, source: str, delivery_id: str) -> Event | None:
        result: Event | None = await self._call("event_by_delivery", source, delivery_id)
        return result

    async def events_after(self, seq: int, limit: int) -> list[Event]:
        result: list[Event] = await self._call("events_after", seq, limit)
        return result

    async def events_of_root(self, root_id: str, after_seq: int, limit: int) -> list[Event]:
        result: list[Event] = await self._call("events_of_root", root_id, after_seq, limit)
        return result

    async def kv_get(self, namespace: str, key: str) -> KVEntry | None:
        result: KVEntry | None = await self._call("kv_get", namespace, key)
        return result

    async def kv_list(self, namespace: str, limit: int = 1000) -> list[KVEntry]:
        result: list[KVEntry] = await self._call("kv_list", namespace, limit)
        return result

    async def bucket_count(self, root_id: str, minute: int) -> int:
        result: int = await self._call("bucket_count", root_id, minute)
        return result
