"""Read a store behind loom's back, on a connection of its own: what is committed, as the backend
holds it (crash and drill tests check the database itself, not loom's answers about it).

`query` reads once; `snapshot` reads several times from one committed state while runtimes go on
writing (a read transaction on SQLite, a ``REPEATABLE READ`` read-only transaction on PostgreSQL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..store import as_store
from ..store._open import postgres_backend

Row = dict[str, Any]


def location(store: Any) -> str:
    """The path or URL of a store given as a string, a `SQLiteStore` or a `PostgresStore`."""
    if isinstance(store, str):
        return store
    return str(getattr(store, "url", None) or store.path)


def query(store: Any, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    """Rows of ``sql`` (``?`` parameters) as dicts, read from ``store`` (a file or a PostgreSQL URL)."""
    with _connected(location(store), snapshot=False) as read:
        return read.query(sql, params)


@contextmanager
def snapshot(store: Any) -> Iterator[Snapshot]:
    """A `Snapshot` of ``store``: every query in the block sees the same committed state (taken at
    its first query), whatever is committed meanwhile. Nothing can be written through it."""
    with _connected(location(store), snapshot=True) as read:
        yield read


class Snapshot:
    """Queries on one read-only connection (``?`` parameters on either backend), rows as dicts."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn  # a sqlite3 connection (rows as `sqlite3.Row`) or a `PostgresConnection`

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return [dict(row) for row in self._conn.execute(sql, params).fetchall()]

    def value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The one value of a query of one row and one column (``SELECT count(*) ...``)."""
        rows = self.query(sql, params)
        if len(rows) != 1 or len(rows[0]) != 1:
            raise ValueError(f"{sql!r} gave {rows}, not one value")
        return next(iter(rows[0].values()))


@contextmanager
def _connected(where: str, *, snapshot: bool) -> Iterator[Snapshot]:
    if as_store(where).dialect.shared:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(where, autocommit=True, row_factory=dict_row) as raw:
            if snapshot:  # ended with the connection: it writes nothing, so nothing is lost
                raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield Snapshot(postgres_backend().PostgresConnection(raw))
        return
    conn = sqlite3.connect(f"file:{where}?mode=ro", uri=True, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        if snapshot:  # a deferred read transaction: its snapshot is taken at the first read
            conn.execute("BEGIN")
        yield Snapshot(conn)
    finally:
        conn.close()
