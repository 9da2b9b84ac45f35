"""The SQLite backend: opening, pragmas, migrations, and read-only connections.

WAL, ``synchronous=FULL`` by default (``NORMAL`` on request), foreign keys on, a busy
timeout, a 64 MiB page cache for the writer. ``:memory:`` keeps one connection (readers go through
the storage actor).

One process writes a file (docs/operations.md): opening the writer takes an OS lock on
``<file>.lock`` beside it, held while the process has the file open (the OS drops it when the
process dies, even by ``kill -9``); a second process is refused before it touches the file, and a
path that is a directory, or a file that is not a SQLite database, before the lock file is made. The
writer connection (`WriterConnection`) fails for good once the file is found corrupt, or deleted or
replaced under it (its device and inode, checked at each write transaction's start and after its
COMMIT): nothing is acknowledged that a restart would not find.

A new file is made with incremental vacuum (``PRAGMA auto_vacuum = INCREMENTAL``), so the space
compaction frees goes back to the file system; a file made by an earlier loom keeps its freed pages
for reuse until `SQLiteStore.vacuum` rewrites it (``loom vacuum``, with loom stopped).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import sqlite3
import stat
import threading
from pathlib import Path
from typing import Any

import attrs

from ..records.errors import InvalidRequest, SchemaTooNew, StorageError
from ..records.validation import describe_value
from ._dialect import SQLITE, Dialect
from ._schema import MIGRATIONS, SCHEMA_VERSION, render, statements

SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")

WRITER_CACHE_KIB = 65_536
"""The write connection's page cache (``PRAGMA cache_size``), in KiB: SQLite's default of 2 MiB holds
a few thousand Works' rows and indexes, so each write past that reads its pages back from the file
system. Memory is taken as pages are read, up to this much (bench/README.md has the figures)."""


@attrs.frozen(kw_only=True)
class SQLiteStore:
    """Where and how to open a SQLite database."""

    path: str = attrs.field()
    synchronous: str = attrs.field(default="FULL")
    busy_timeout_ms: int = 5000

    @path.validator
    def _check_path(self, attribute: attrs.Attribute[str], value: str) -> None:
        check_path(value)

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

    def relax(self, conn: sqlite3.Connection, relaxed: bool) -> None:
        """``synchronous = NORMAL`` for the next commit (in WAL mode a commit then waits for no fsync:
        a process kill keeps it, a power loss may take it back, never a commit before it), then the
        configured level again. A file configured NORMAL, and memory, have nothing to relax."""
        level = self.synchronous.upper()
        if self.in_memory or level == "NORMAL":
            return
        conn.execute(f"PRAGMA synchronous = {'NORMAL' if relaxed else level}")

    def open_writer(self) -> sqlite3.Connection:
        """Open the write connection, refusing a file another process writes, and a newer schema,
        before writing anything."""
        lock = None
        if not self.in_memory:
            parent = Path(self.path).parent
            if not parent.is_dir():
                raise StorageError(f"cannot open {self.path}: directory {parent} does not exist")
            _refuse_before_lock(self.path)
            lock = _FileLock.acquire(self.path)
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                check_same_thread=False,
                factory=WriterConnection,
                cached_statements=STATEMENT_CACHE,
            )
        except sqlite3.Error as exc:
            if lock is not None:
                lock.release()
            raise StorageError(f"cannot open {self.path}: {exc}") from exc
        conn.attach(None if self.in_memory else self.path, lock)
        try:
            version = read_schema_version(conn)
            if version > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has schema version {version}, newer than this loom supports "
                    f"({SCHEMA_VERSION}); upgrade loom to open it (nothing was written)"
                )
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            if version == 0:
                conn.execute("PRAGMA auto_vacuum = INCREMENTAL")  # only a file with no table yet takes it
            if not self.in_memory:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise StorageError(f"cannot put {self.path} in WAL mode (journal_mode={mode})")
            conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA cache_size = -{WRITER_CACHE_KIB}")
            migrate(conn, version)
        except BaseException:
            conn.close()
            raise
        return conn

    def vacuum(self) -> tuple[int, int]:
        """Rewrite the whole file with incremental vacuum on (a file an earlier loom made has it off, so
        compaction's freed pages stay in the file for reuse): SQLite's ``VACUUM``. Run it with loom
        stopped; it needs free disk space about the size of the file. Returns the file's size in bytes
        before and after."""
        if self.in_memory:
            raise InvalidRequest("an in-memory database has no file to vacuum")
        if not Path(self.path).is_file():
            raise StorageError(f"cannot vacuum {self.path}: no such file")
        before = _size(self.path)
        conn = self.open_writer()
        try:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot vacuum {self.path}: {exc}") from exc
        finally:
            self.close_writer(conn)
        return before, _size(self.path)

    def reader_uri(self) -> str:
        return f"{Path(self.path).resolve().as_uri()}?mode=ro"


def check_path(path: object) -> None:
    """Refuse a SQLite location no file can have, naming what is wrong (`InvalidRequest`): one that is
    not a non-empty str, holds a NUL character, or cannot be written as a file name (a lone surrogate
    that is not an undecodable byte of the file system's encoding)."""
    if not isinstance(path, str) or not path:
        raise InvalidRequest(f"store path must be a non-empty str, got {describe_value(path)}", field="store")
    if "\0" in path:
        raise InvalidRequest(f"store path {path!r} holds a NUL character", field="store")
    try:
        os.fsencode(path)
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"store path {path!r} is not a file name this system can write ({exc.reason})", field="store"
        ) from None


SQLITE_HEADER = b"SQLite format 3\0"
"""The first 16 bytes of every SQLite database file."""


def _refuse_before_lock(path: str) -> None:
    """What can be refused before the lock file is made, so that a refused ``path`` leaves nothing
    beside it: a directory, and an existing file that is not a SQLite database (an empty one becomes
    a new database). The messages are those SQLite's own refusals give."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return  # a new database
    except OSError as exc:
        raise StorageError(f"cannot open {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise StorageError(f"cannot open {path}: unable to open database file")
    if not stat.S_ISREG(info.st_mode) or not info.st_size:
        return  # left to SQLite (a pipe is never read here: it would wait for a writer)
    try:
        with open(path, "rb") as file:
            head = file.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise StorageError(f"cannot open {path}: {exc.strerror or exc}") from None
    if head and head != SQLITE_HEADER:
        raise StorageError("not a loom database, or unreadable: file is not a database")


def not_a_loom_database(path: str) -> str | None:
    """Why the SQLite ``path`` is not already a loom database (``None``: it is one), found without
    writing anything or creating anything beside it: no file there, not a SQLite file (an empty one
    included), or a SQLite file without loom's tables. For the commands that inspect or rewrite a store
    (``loom config check --db``, ``loom vacuum``): opening it as a runtime does would make a missing or
    empty file a new database, and migrate loom's tables into another program's."""
    file = Path(path)
    if not file.exists():
        return f"no database at {path}: no such file"
    if not file.is_file():
        return f"{path} is not a loom database (not a file)"
    try:
        with file.open("rb") as opened:
            head = opened.read(len(SQLITE_HEADER))
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if head != SQLITE_HEADER:
        return f"{path} is not a loom database ({'an empty file' if not head else 'not a SQLite file'})"
    # with no write-ahead log beside it the file is read as immutable (a read-only open of a WAL file
    # would make its -wal and -shm); with one, read-only through it (what it holds may be there)
    wal = file.with_name(file.name + "-wal").exists()
    uri = f"{file.resolve().as_uri()}?mode=ro" + ("" if wal else "&immutable=1")
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'loom_schema'"
            ).fetchone()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"{path} is not a loom database, or unreadable: {exc}"
    return (
        None if found is not None else f"{path} is not a loom database (a SQLite file without loom's tables)"
    )


def _size(path: str) -> int:
    """The bytes a database takes: its file and its write-ahead log."""
    wal = Path(path + "-wal")
    return Path(path).stat().st_size + (wal.stat().st_size if wal.exists() else 0)


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


# -- one writing process per file ---------------------------------------------------------------------


class _FileLock:
    """This process's lock on a database's ``<file>.lock``, shared by the writers it opens on that
    file (an OS lock belongs to the process: a second one taken here would refuse the first)."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.users = 0
        self.corrupt: str | None = None
        """Why the file is corrupt, once a read found it so (`note_corrupt`): its writers write no more."""
        self.opened = 0
        """When the last writer on the file was opened here (`_OPENS`): a writer alone on it sees
        whether another was opened since."""

    @classmethod
    def acquire(cls, db_path: str) -> _FileLock:
        path = os.path.realpath(db_path) + ".lock"  # one lock whatever name or link the file is opened by
        with _HELD_GUARD:
            lock = _HELD.get(path)
            if lock is None:
                lock = cls(path, _lock_file(db_path, path))
                _HELD[path] = lock
            lock.users += 1
            lock.opened = next(_OPENS)
            return lock

    def release(self) -> None:
        with _HELD_GUARD:
            self.users -= 1
            if self.users == 0:
                del _HELD[self.path]
                os.close(self.fd)  # closing the only descriptor drops the lock


def note_corrupt(path: str | None, exc: BaseException) -> None:
    """A read of the file at ``path`` failed on damage (``exc``): this process's writers on it write
    nothing more to it, as when a write meets the damage (`WriterConnection`)."""
    if path is None or getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _CORRUPT:
        return
    with _HELD_GUARD:
        lock = _HELD.get(os.path.realpath(path) + ".lock")
        if lock is not None and lock.corrupt is None:
            lock.corrupt = _corrupt_text(path, exc)


def _corrupt_text(path: str, exc: BaseException) -> str:
    return (
        f"the database file {path} is corrupt ({exc}): loom writes nothing more to it; restore it from"
        " a backup (docs/operations.md)"
    )


_HELD: dict[str, _FileLock] = {}
_HELD_GUARD = threading.Lock()
_OPENS = itertools.count(1)


def _lock_file(db_path: str, path: str) -> int:
    """Open ``path`` and lock it for this process, writing its pid there; `StorageError` naming the
    process that holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        raise StorageError(f"cannot open {db_path}: its lock file {path}: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            raise StorageError(
                f"cannot lock {db_path} (its lock file {path}): {exc.strerror or exc}"
            ) from None
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        by = f" (pid {holder})" if holder.isdigit() else ""
        raise StorageError(
            f"{db_path} is in use by another loom process{by}: only one process may write a SQLite file"
            f" (the lock is {path}); stop that one first, or share a PostgreSQL database between"
            " several (docs/operations.md)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


# -- the writer connection ----------------------------------------------------------------------------

_CORRUPT = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB


class FileGone(sqlite3.OperationalError):
    """The write connection's file was deleted, replaced or found corrupt: it writes nothing more
    (the storage actor answers it as `StorageLost`)."""


_BEGIN = SQLITE.begin


def _null(value: None) -> None:
    """A ``None`` parameter's adapter: it binds as NULL, as it does with none (below)."""
    return value


if (type(None), sqlite3.PrepareProtocol) not in sqlite3.adapters:
    # With no adapter registered for it, each ``None`` parameter takes the sqlite3 module's slow path
    # (its registry, then ``__adapt__`` and ``__conform__``): about 0.2 us a parameter, and an Event's
    # insert with its routing checkpoint binds ten or more. One that answers ``None`` binds the same
    # NULL for a lookup in the registry (bench/README.md, "None parameters"). sqlite3's adapters are
    # the process's: one registered before loom's is kept, and nothing else binds differently.
    sqlite3.register_adapter(type(None), _null)


STATEMENT_CACHE = 1024
"""Prepared statements the write connection keeps. The hot paths use about 200 distinct statements, past
the sqlite3 module's default of 128: its LRU cache then prepares most statements again at each use."""


class WriterConnection(sqlite3.Connection):
    """The write connection: a ``sqlite3.Connection`` that fails every statement, once the file is
    found corrupt or gone, with the reason (an `OperationalError`: the storage actor fails the batch
    as a storage failure), and drops the process's lock on the file when it closes."""

    _path: str | None = None
    _identity: tuple[int, int] | None = None
    _lock: _FileLock | None = None
    _failure: str | None = None

    def attach(self, path: str | None, lock: _FileLock | None) -> None:
        """Watch the file at ``path`` (``None``: in memory) from now on; ``lock`` is released at close."""
        self._path, self._lock = path, lock
        if path is not None:
            info = os.stat(path)
            self._identity = (info.st_dev, info.st_ino)

    def alone(self) -> int | None:
        """Whether this is the only writer open on its file in this process (loom's lock keeps other
        processes out): when the last writer on it was opened (`_FileLock.opened`; 0 in memory), or
        ``None`` while another is open too."""
        lock = self._lock
        if lock is None:
            return 0
        return lock.opened if lock.users == 1 else None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        if self._failure is not None and not sql.startswith("ROLLBACK"):  # undoing is always allowed
            raise FileGone(self._failure)
        if sql == _BEGIN:
            if self._lock is not None and self._lock.corrupt is not None:  # a read found the damage
                self._failure = self._lock.corrupt
                raise FileGone(self._failure)
            self._check_file()
        try:
            cursor = super().execute(sql, parameters)
        except sqlite3.DatabaseError as exc:
            self._note(exc)
            raise
        if sql == "COMMIT":
            # a batch committed into a file that is no longer the path's is lost at the next open:
            # it must not be acknowledged
            self._check_file()
        return cursor

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        if self._failure is not None:
            raise FileGone(self._failure)
        try:
            return super().executemany(sql, parameters)
        except sqlite3.DatabaseError as exc:
            self._note(exc)
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            lock, self._lock = self._lock, None
            if lock is not None:
                lock.release()

    def _note(self, exc: sqlite3.DatabaseError) -> None:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF in _CORRUPT:
            self._failure = _corrupt_text(self._path or ":memory:", exc)

    def _check_file(self) -> None:
        if self._path is None:
            return
        try:
            info = os.stat(self._path)
        except FileNotFoundError:
            lost = "was deleted"
        else:
            lost = "was replaced" if (info.st_dev, info.st_ino) != self._identity else ""
        if lost:
            self._failure = (
                f"the database file {self._path} {lost} while loom had it open: loom writes nothing more"
                " to what is left of it; restart loom (docs/operations.md)"
            )
            raise FileGone(self._failure)
