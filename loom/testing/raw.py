"""Read a store behind loom's back, on a connection of its own: what is committed, as the backend
holds it (crash and drill tests check the database itself, not loom's answers about it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..store import is_postgres_url
from ..store._open import postgres_backend


def location(store: Any) -> str:
    """The path or URL of a store given as a string, a `SQLiteStore` or a `PostgresStore`."""
    if isinstance(store, str):
        return store
    return str(getattr(store, "url", None) or store.path)


def query(store: Any, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """Rows of ``sql`` (``?`` parameters) as dicts, read from ``store`` (a file or a PostgreSQL URL)."""
    where = location(store)
    if is_postgres_url(where):
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(where, autocommit=True, row_factory=dict_row) as raw:
            return list(postgres_backend().PostgresConnection(raw).execute(sql, params).fetchall())
    conn = sqlite3.connect(f"file:{where}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(sql, params)]
    finally:
        conn.close()
