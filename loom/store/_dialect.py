"""What differs between the backends' SQL, in one place (the kernel never sees it).

`Tx` and the readers write SQL in one portable subset: ``?`` parameters, ``ON CONFLICT``
upserts, ``RETURNING``, row-value comparisons, integers for times and sequences, TEXT ids and
JSON. A `Dialect` says what each backend needs on top of that: how a write transaction begins,
the lock that keeps acceptance order visible on a shared database, row locks that divide work
between nodes, an index hint, and which driver errors mean "the store failed" or "another
writer got there first; run the batch again".
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol


class Cursor(Protocol):
    """The part of a DB-API cursor `Tx` uses."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """The part of a DB-API connection `Tx` uses (``sqlite3.Connection`` is one)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Any: ...

    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


class RowConflict(Exception):
    """A compare-and-set found its row changed by another writer inside this transaction (only a
    shared database has other writers): the batch runs again on what they committed."""


class Dialect:
    """The SQLite dialect; `PostgresDialect` overrides what differs."""

    name = "sqlite"
    shared = False
    """Whether other processes may write the same database at once."""
    begin = "BEGIN IMMEDIATE"
    order_lock: str | None = None
    """SQL that serialises acceptance order until the transaction ends (``None``: writers are serial)."""
    due_hint = " INDEXED BY timers_due"
    """Forces the partial (fire_at, id) index: SQLite's planner may otherwise scan by state."""
    skip_locked = ""
    """Appended to a scan for work to take: rows another node holds are left to it."""
    notify: str | None = None
    """SQL (one text parameter: the payload) that tells the other nodes what a batch committed, sent
    with the commit (``None``: nobody else writes)."""
    for_update = ""
    """Appended to a read of a row the transaction will change: other writers wait for it."""
    size_sql = (
        "SELECT (SELECT page_count FROM pragma_page_count()) * (SELECT page_size FROM pragma_page_size()),"
        " (SELECT freelist_count FROM pragma_freelist_count()) * (SELECT page_size FROM pragma_page_size())"
    )
    """The database's size and the part of it that holds nothing (bytes), as one row."""
    pool_lock: str | None = None
    """SQL (one text parameter: the pool's name) that serialises one capacity pool's claims and freed
    slots until the transaction ends (``None``: writers are serial)."""
    json_pairs = "json_group_array(json_array({a}, {b}))"
    """An aggregate of the ``({a}, {b})`` pairs of a group into one JSON array."""
    seq_by_rowid = True
    """An inserted Event's sequence is the connection's last row id (the cursor's ``lastrowid``), so its
    insert asks for no ``RETURNING`` (`_sql.INSERT_EVENT`)."""
    caches_reads = True
    """A transaction may answer a read of a record again from what it read, while it has changed no row
    since (SQLite's ``total_changes`` tells; a savepoint rolled back forgets them)."""

    def is_storage_failure(self, exc: BaseException) -> bool:
        """I/O errors, a full disk, a locked or corrupt database: the store failed, not the request."""
        return isinstance(exc, _SQLITE_FAILURES) or type(exc) is sqlite3.DatabaseError

    def is_conflict(self, exc: BaseException) -> bool:
        """Another writer raced this batch (a shared database only): roll back and run it again."""
        return False

    def is_disconnect(self, exc: BaseException) -> bool:
        """The connection itself is gone (a shared database only): reconnect before the next batch."""
        return False

    def changes(self, conn: Any) -> int:
        """A count that moves whenever the connection changes a row (SQLite: the rows it changed)."""
        return int(conn.total_changes)

    def in_transaction(self, conn: Any) -> bool:
        return bool(conn.in_transaction)

    def send_later(self, conn: Any, sql: str, parameters: Sequence[Any] = ()) -> None:
        """Run ``sql``, whose result nobody reads, no later than the connection's next statement (on a
        server: sent with it, in one round trip; here, at once)."""
        conn.execute(sql, parameters)

    def failure(self, message: str) -> Exception:
        """The error this backend's driver raises when the store itself fails (an I/O error, a full
        disk): fault injection raises it on purpose, and the batch it is in must fail as a whole."""
        return sqlite3.OperationalError(message)


_SQLITE_FAILURES = (sqlite3.OperationalError, sqlite3.InternalError, sqlite3.NotSupportedError)

SQLITE = Dialect()


class Store(Protocol):
    """What the storage actor needs of a backend (`SQLiteStore`, `PostgresStore`)."""

    @property
    def dialect(self) -> Dialect: ...

    @property
    def in_memory(self) -> bool: ...

    def describe(self) -> str:
        """Where the database is, for messages (never a password)."""
        ...

    def open_writer(self) -> Any:
        """Open the write connection (a `Connection` with ``in_transaction`` and ``close``), migrated."""
        ...

    def close_writer(self, conn: Any) -> None: ...

    def relax(self, conn: Any, relaxed: bool) -> None:
        """Between transactions: let the next COMMIT return before its writes reach the disk
        (``relaxed``), or make every COMMIT wait for the disk again, as configured. A relaxed commit
        survives a process kill, not a power loss: the storage actor relaxes a batch only when every
        write in it is one nobody loses anything by (`StorageActor.submit_relaxed`)."""
        ...

    def reconnect_delays(self) -> tuple[float, ...]:
        """Seconds between reconnection attempts after a lost connection, the last repeating; empty
        when a lost connection cannot come back (the runtime stops instead)."""
        ...
