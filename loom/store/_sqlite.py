"""The SQLite backend: opening, pragmas, migrations, and read-only connections.

WAL, ``synchronous=FULL`` by default (``NORMAL`` on request), foreign keys on, a busy
timeout. ``:memory:`` keeps one connection (readers go through the storage actor).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import attrs

from ..records.errors import InvalidRequest, SchemaTooNew, StorageError
from ._dialect import SQLITE, Dialect
from ._schema import MIGRATIONS, SCHEMA_VERSION, render, statements

SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")


@attrs.frozen(kw_only=True)
class SQLiteStore:
    """Where and how to open a SQLite database."""

    path: str
    synchronous: str = attrs.field(default="FULL")
    busy_timeout_ms: int = 5000

    @synchronous.validator
    def _check_sync(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value.upper() not in SYNCHRONOUS:
            raise InvalidRequest(f"store.synchronous must be one of {', '.join(SYNCHRONOUS)}, got {value!r}")

    @property
    def in_memory(self) -> bool:
        return self.path == ":memory:"

    @property
    def dialect(self) -> Dialect:
        return SQLITE

    def describe(self) -> str:
        return self.path

    def reconnect_delays(self) -> tuple[float, ...]:
        """A file does not come back by waiting: a failed connection stops the runtime."""
        return ()

    def close_writer(self, conn: sqlite3.Connection) -> None:
        """A clean close: fold the write-ahead log into the database file, so the file alone holds
        everything (a copy of it is a complete backup), then close."""
        try:
            if not self.in_memory and not conn.in_transaction:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass  # readers still hold the log: it stays, and the next open folds it in
        finally:
            conn.close()

    def open_writer(self) -> sqlite3.Connection:
        """Open the write connection, refusing a newer schema before writing anything."""
        if not self.in_memory:
            parent = Path(self.path).parent
            if not parent.is_dir():
                raise StorageError(f"cannot open {self.path}: directory {parent} does not exist")
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self.path}: {exc}") from exc
        try:
            version = read_schema_version(conn)
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has schema version {version}, newer than this loom supports "
                    f"({SCHEMA_VERSION}); upgrade loom to open it (nothing was written)"
                )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            if not self.in_memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StorageError(f"cannot put {self.path} in WAL mode (journal_mode={mode})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys = ON")
            migrate(conn, version)
        except BaseException:
            conn.close()
            raise
        return conn

    def reader_uri(self) -> str:
        return f"{Path(self.path).resolve().as_uri()}?mode=ro"


def read_schema_version(conn: sqlite3.Connection) -> int:
    try:
        exists = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'loom_schema'"
        ).fetchone()
        if not exists:
            return 0
        row = conn.execute("SELECT version FROM loom_schema").fetchone()
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"not a loom database, or unreadable: {exc}") from exc
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, current: int) -> None:
    """Apply every migration after ``current``, each atomically with its version bump."""
    for version in range(current + 1, SCHEMA_VERSION + 1):
        script = render(MIGRATIONS[version - 1], SQLITE.name)
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements(script):
                conn.execute(statement)
            conn.execute("CREATE TABLE IF NOT EXISTS loom_schema (version INTEGER NOT NULL)")
            conn.execute("DELETE FROM loom_schema")
            conn.execute("INSERT INTO loom_schema (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
