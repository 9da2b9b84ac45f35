"""`Tx`: the typed data-access object a kernel procedure runs against. SQL lives here.

A `Tx` wraps one DB-API connection inside an open transaction (the storage actor
opened it). Procedures call its methods and record commit notices with `notify`;
the notices reach the actors only after the batch commits.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from .._records import Event, KVEntry
from . import _sql

Params = Sequence[Any]


class Tx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.notices: list[object] = []

    # -- plumbing ---------------------------------------------------------

    def _one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        return row

    def _all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()

    def notify(self, notice: object) -> None:
        """Queue a notice for publication after this batch commits."""
        self.notices.append(notice)

    # -- events -----------------------------------------------------------

    def insert_event(
        self,
        *,
        id: str,
        source: str,
        delivery_id: str,
        type: str,
        scope: str,
        key: str | None,
        work_id: str | None,
        execution_id: str | None,
        payload_json: str,
        parent_id: str | None,
        cause_id: str | None,
        root_id: str,
        depth: int,
        accepted_at_ms: int,
    ) -> int:
        """Insert an immutable Event; return its sequence (strictly increasing)."""
        cur = self._conn.execute(
            "INSERT INTO events (id, source, delivery_id, type, scope, key, work_id, execution_id, payload,"
            " parent_id, cause_id, root_id, depth, accepted_at_ms)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                id,
                source,
                delivery_id,
                type,
                scope,
                key,
                work_id,
                execution_id,
                payload_json,
                parent_id,
                cause_id,
                root_id,
                depth,
                accepted_at_ms,
            ),
        )
        seq = cur.lastrowid
        assert seq is not None
        return seq

    def event(self, event_id: str) -> Event | None:
        row = self._one(_sql.EVENT_BY_ID, (event_id,))
        return _sql.event_from_row(row) if row else None

    def event_by_delivery(self, source: str, delivery_id: str) -> Event | None:
        row = self._one(_sql.EVENT_BY_DELIVERY, (source, delivery_id))
        return _sql.event_from_row(row) if row else None

    def events_after(self, seq: int, limit: int) -> list[Event]:
        return [_sql.event_from_row(r) for r in self._all(_sql.EVENTS_AFTER, (seq, limit))]

    def events_of_root(self, root_id: str, after_seq: int, limit: int) -> list[Event]:
        return [_sql.event_from_row(r) for r in self._all(_sql.EVENTS_OF_ROOT, (root_id, after_seq, limit))]

    def max_seq(self) -> int:
        row = self._one("SELECT coalesce(max(seq), 0) FROM events")
        assert row is not None
        return int(row[0])

    # -- causal bounds ----------------------------------------------------

    def causal_root_limits(self, root_id: str) -> tuple[int, int] | None:
        row = self._one("SELECT max_depth, per_minute FROM causal_roots WHERE root_id = ?", (root_id,))
        return (int(row[0]), int(row[1])) if row else None

    def pin_causal_root(self, root_id: str, max_depth: int, per_minute: int) -> None:
        self._conn.execute(
            "INSERT OR IGNORE INTO causal_roots (root_id, max_depth, per_minute) VALUES (?, ?, ?)",
            (root_id, max_depth, per_minute),
        )

    def bucket_count(self, root_id: str, minute: int) -> int:
        row = self._one(_sql.BUCKET_COUNT, (root_id, minute))
        return int(row[0]) if row else 0

    def charge_bucket(self, root_id: str, minute: int) -> int:
        """Add one to a root's bucket for ``minute``; return the new count."""
        self._conn.execute(
            "INSERT INTO causal_buckets (root_id, minute, count) VALUES (?, ?, 1)"
            " ON CONFLICT (root_id, minute) DO UPDATE SET count = count + 1",
            (root_id, minute),
        )
        return self.bucket_count(root_id, minute)

    # -- namespaced KV ----------------------------------------------------

    def kv_put(self, namespace: str, key: str, value: dict[str, Any], now_ms: int) -> None:
        self._conn.execute(
            "INSERT INTO kv (namespace, key, value, updated_at_ms) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
            " updated_at_ms = excluded.updated_at_ms",
            (namespace, key, json.dumps(value, sort_keys=True, separators=(",", ":")), now_ms),
        )

    def kv_get(self, namespace: str, key: str) -> KVEntry | None:
        row = self._one(_sql.KV_GET, (namespace, key))
        return _sql.kv_from_row(row) if row else None

    def kv_list(self, namespace: str, limit: int = 1000) -> list[KVEntry]:
        return [_sql.kv_from_row(r) for r in self._all(_sql.KV_LIST, (namespace, limit))]

    # -- diagnostics ------------------------------------------------------

    def add_diagnostic(
        self, kind: str, subject: str, message: str, detail: dict[str, Any], now_ms: int
    ) -> int:
        cur = self._conn.execute(
            "INSERT INTO diagnostics (kind, subject, message, detail, at_ms) VALUES (?, ?, ?, ?, ?)",
            (kind, subject, message, json.dumps(detail, sort_keys=True), now_ms),
        )
        assert cur.lastrowid is not None
        return cur.lastrowid
