"""The PostgreSQL backend: several runtimes (nodes) on one database, through psycopg 3.

The storage actor drives a sync psycopg connection from its worker thread (psycopg's async API
is asyncio-only), exactly as it drives SQLite: one transaction per batch, a savepoint per
request, one COMMIT. `Tx`'s portable SQL reaches the server through `PostgresConnection`, which
turns ``?`` parameters into psycopg's ``%s`` (once per statement text) and 0/1 flags into
integers. What each guarantee rests on with several nodes is in ``docs/backends.md``:

* acceptance order: a transaction takes ``pg_advisory_xact_lock`` before it allocates an Event
  sequence or a checkpoint's commit order, and holds it to its end, so sequences become visible
  in the order they were allocated (`PostgresDialect.order_lock`);
* division of work: the scans for due timers and expired leases lock what they return with
  ``FOR UPDATE SKIP LOCKED``, so another node's concurrent scan takes other rows;
* races between nodes (a deadlock, a key both inserted, a row changed under a compare-and-set, a row
  another node's compaction removed) roll the batch back whole and run it again
  (`PostgresDialect.is_conflict`);
* a lost connection fails the batch in flight and the actor reconnects (`reconnect_delays`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import attrs
import psycopg
import psycopg.errors
import trio
from psycopg import conninfo
from psycopg.pq import TransactionStatus

from ..records.errors import (
    InvalidRequest,
    NodeInUse,
    SchemaTooNew,
    StorageError,
    StorageUnavailable,
)
from ._dialect import Dialect
from ._notify import CHANNEL
from ._schema import MIGRATIONS, SCHEMA_VERSION, render, statements

log = logging.getLogger("loom.storage")

LOCK_CLASS = 0x6C6F6F6D  # "loom": the first key of loom's advisory locks in a database
ORDER_LOCK = 1
MIGRATION_LOCK = 2

_CONFLICTS = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "23505",  # unique_violation: another node inserted the same key first
        "23503",  # foreign_key_violation: another node's compaction removed a row this batch refers to
        "55P03",  # lock_not_available
        "26000",  # a prepared statement psycopg names, the server lost: rerun (`PostgresConnection.execute`)
    }
)
_FAILURE_CLASSES = frozenset({"08", "53", "57", "58", "XX", "F0", "25"})
"""Connection, resources, operator intervention (a shutdown), system, internal, config, and a
transaction in a state it should never be in: the store failed, not the request."""
_DISCONNECTS = frozenset({"57P01", "57P02", "57P03"})  # admin or crash shutdown, cannot connect now


class PostgresDialect(Dialect):
    name = "postgresql"
    shared = True
    caches_reads = False  # another node may change a row between two statements: reads go to the server
    seq_by_rowid = False
    begin = "BEGIN ISOLATION LEVEL READ COMMITTED"
    order_lock = f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, {ORDER_LOCK})"
    due_hint = ""
    skip_locked = " FOR UPDATE SKIP LOCKED"
    for_update = " FOR UPDATE"
    notify = f"SELECT pg_notify('{CHANNEL}', ?)"
    pool_lock = f"SELECT pg_advisory_xact_lock({LOCK_CLASS}, hashtext(?))"
    size_sql = "SELECT pg_database_size(current_database()), 0"
    json_pairs = "json_agg(json_build_array({a}, {b}))"

    def is_storage_failure(self, exc: BaseException) -> bool:
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | psycopg.InternalError):
            return True
        if isinstance(exc, psycopg.Error):
            return (exc.sqlstate or "")[:2] in _FAILURE_CLASSES
        return False

    def is_conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.Error) and exc.sqlstate in _CONFLICTS

    def failure(self, message: str) -> Exception:
        return psycopg.errors.DiskFull(message)

    def send_later(self, conn: Any, sql: str, parameters: Sequence[Any] = ()) -> None:
        conn.defer(sql, parameters)

    def changes(self, conn: Any) -> int:
        """A count that moves whenever this connection may have changed a row (its statements other
        than a ``SELECT``): what a transaction keeps of the rows only it can see goes with it."""
        return int(conn.writes)

    def is_disconnect(self, exc: BaseException) -> bool:
        if not isinstance(exc, psycopg.Error):
            return False
        state = exc.sqlstate
        if state is None:
            return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        return state[:2] == "08" or state in _DISCONNECTS


POSTGRES = PostgresDialect()


@functools.lru_cache(maxsize=4096)
def _format(sql: str) -> str:
    """``?`` parameters as psycopg's ``%s`` (a literal ``%`` doubled); quoted text is left alone."""
    out: list[str] = []
    quoted = False
    for char in sql:
        if char == "'":
            quoted = not quoted
            out.append(char)
        elif char == "%":
            out.append("%%")
        elif char == "?" and not quoted:
            out.append("%s")
        else:
            out.append(char)
    return "".join(out)


def _params(params: Sequence[Any]) -> tuple[Any, ...]:
    # flags are stored as 0/1 integers on every backend
    return tuple(int(p) if isinstance(p, bool) else p for p in params)


class PostgresConnection:
    """A psycopg connection speaking `Tx`'s portable SQL (the `Connection` protocol).

    Statements whose result nobody reads (a transaction's ``BEGIN``, the acceptance-order lock, the
    commit's notification, the commit level) wait (`defer`) for the next statement and go with it in
    one round trip, through libpq's pipeline mode: the server runs them in order, each to its end
    before the next begins, and an error in any of them is raised by that next `execute` (whose
    batch it fails as a whole, as it would have failed one statement earlier)."""

    def __init__(self, raw: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.raw = raw
        self._deferred: list[tuple[str, Sequence[Any]]] = []
        self._pipelined = psycopg.Pipeline.is_supported()
        self.writes = 0
        """Statements other than a ``SELECT`` sent since the connection opened: a change of any row
        of this connection's moves it (`PostgresDialect.changes`; ``SELECT`` changes no row here)."""
        self._stale_prepared = False
        """A statement named a prepared one the server lost: ``DEALLOCATE ALL`` goes before the next
        transaction, through psycopg, which forgets them all (else it names the lost one again)."""

    def defer(self, sql: str, parameters: Sequence[Any] = ()) -> None:
        """Run ``sql`` (its result unread) with the next statement (at once without pipeline mode)."""
        if self._stale_prepared and not self.in_transaction:  # (a transaction's BEGIN is deferred)
            self._stale_prepared = False
            self.raw.execute("DEALLOCATE ALL")
        if self._pipelined:
            self._deferred.append((sql, parameters))
        else:
            self._run(sql, parameters)

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[tuple[Any, ...]]:
        try:
            if not self._deferred:
                return self._run(sql, parameters)
            with self._pipeline():
                cursor = self._run(sql, parameters)
            return cursor  # its result arrived with the pipeline's end
        except psycopg.errors.InvalidSqlStatementName:
            self._stale_prepared = True
            raise

    @contextlib.contextmanager
    def _pipeline(self) -> Iterator[None]:
        """A pipeline that sends the deferred statements first."""
        deferred, self._deferred = self._deferred, []
        with self.raw.pipeline():
            for sql, parameters in deferred:
                self._run(sql, parameters, prepare=False)  # (never prepared: as a COMMIT, below)
            yield

    def _run(
        self, sql: str, parameters: Sequence[Any], *, prepare: bool | None = None
    ) -> psycopg.Cursor[tuple[Any, ...]]:
        if not sql.startswith("SELECT"):
            self.writes += 1
        if not parameters:
            # never prepared (BEGIN, COMMIT): a COMMIT naming a lost one could not run its batch again
            return self.raw.execute(sql, prepare=False)
        return self.raw.execute(_format(sql), _params(parameters), prepare=prepare)

    def executemany(self, sql: str, parameters: Any, /) -> None:
        self.writes += 1
        rows = [_params(p) for p in parameters]
        try:
            with self._pipeline() if self._deferred else contextlib.nullcontext(), self.raw.cursor() as cur:
                cur.executemany(_format(sql), rows)
        except psycopg.errors.InvalidSqlStatementName:
            self._stale_prepared = True
            raise

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open, or a ``BEGIN`` waits to be sent (a rollback sends both)."""
        if self._deferred:
            return True
        status = self.raw.info.transaction_status
        return status in (TransactionStatus.INTRANS, TransactionStatus.INERROR, TransactionStatus.ACTIVE)

    def close(self) -> None:
        self._deferred.clear()
        self.raw.close()


def check_url(url: str) -> dict[str, str]:
    """The parts of a PostgreSQL URL (or libpq conninfo); a malformed one is refused naming what is wrong."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest(f"a PostgreSQL store needs a postgresql:// URL, got {url!r}")
    try:
        parts = {k: str(v) for k, v in conninfo.conninfo_to_dict(url).items() if v is not None}
    except psycopg.ProgrammingError as exc:
        reason = " ".join(str(exc).replace(url, "<the URL>").split())
        raise InvalidRequest(f"malformed PostgreSQL URL: {reason}") from None
    port = parts.get("port", "5432")
    if not all(p.isdigit() and 0 < int(p) < 65536 for p in port.split(",")):
        raise InvalidRequest(f"malformed PostgreSQL URL: port must be a number from 1 to 65535, got {port!r}")
    return parts


@attrs.frozen(kw_only=True)
class PostgresStore:
    """Where and how to reach a PostgreSQL database (a ``postgresql://`` URL or libpq conninfo).

    Every runtime on the same database is a node: they share the work (docs/backends.md).
    """

    url: str
    connect_timeout_s: int = 10
    reconnect_delays_s: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0)

    def __attrs_post_init__(self) -> None:
        check_url(self.url)

    @property
    def in_memory(self) -> bool:
        return False

    @property
    def dialect(self) -> Dialect:
        return POSTGRES

    def describe(self) -> str:
        try:
            parts = conninfo.conninfo_to_dict(self.url)
        except psycopg.ProgrammingError:
            return "a PostgreSQL database (unparsable URL)"
        parts.pop("password", None)
        return "postgresql:" + " ".join(f"{k}={v}" for k, v in sorted(parts.items()))

    def reconnect_delays(self) -> tuple[float, ...]:
        return self.reconnect_delays_s

    def connect(self, *, application_name: str = "loom") -> psycopg.Connection[tuple[Any, ...]]:
        try:
            return psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=self.connect_timeout_s,
                application_name=application_name,
            )
        except psycopg.Error as exc:
            raise StorageUnavailable(f"cannot connect to {self.describe()}: {exc}") from exc

    def open_writer(self) -> PostgresConnection:
        """Open the write connection, refusing a newer schema before writing anything; several nodes
        opening a fresh database at once migrate it once (under an advisory lock)."""
        raw = self.connect(application_name="loom writer")
        try:
            migrate(raw, self.describe())
        except BaseException as exc:
            raw.close()
            if isinstance(exc, psycopg.Error):
                raise StorageError(f"cannot open {self.describe()}: {exc}") from exc
            raise
        return PostgresConnection(raw)

    def close_writer(self, conn: PostgresConnection) -> None:
        conn.close()

    def relax(self, conn: PostgresConnection, relaxed: bool) -> None:
        """``synchronous_commit = off`` for the next commit (answered before its log reaches the disk: a
        server crash may take it back, never a commit before it), then the server's own setting."""
        conn.defer("SET synchronous_commit = off" if relaxed else "RESET synchronous_commit")

    async def listen(
        self,
        deliver: Callable[[str | None], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hear what other nodes commit (their payloads on the ``loom`` channel: see `_notify`) until
        cancelled, on a connection of its own, handing each payload to ``deliver``. A lost connection
        is opened again with the reconnect delays; then ``deliver(None)``: notifications may have been
        missed meanwhile."""
        delays = self.reconnect_delays()
        started = False
        attempt = 0
        while True:
            try:
                raw = await anyio.to_thread.run_sync(self._listening)
            except StorageError as exc:
                if not started:
                    raise
                delay = delays[min(attempt, len(delays) - 1)] if delays else 1.0
                attempt += 1
                log.warning("listening to %s failed (%s); next try in %.2fs", self.describe(), exc, delay)
                await trio.sleep(delay)
                continue
            attempt = 0
            try:
                if started:
                    deliver(None)  # whatever was committed while nobody listened
                else:
                    started = True
                    task_status.started()
                await _hear(raw, deliver)
            except (psycopg.Error, OSError) as exc:
                log.warning(
                    "the listening connection to %s was lost (%s); reconnecting", self.describe(), exc
                )
            finally:
                raw.close()

    def take_node(self, name: str) -> psycopg.Connection[tuple[Any, ...]]:
        """Hold the node name ``name`` on a connection of its own (a session advisory lock, released
        when the connection closes, with its process however it ends): `NodeInUse` when another
        running loom holds it. The caller closes the connection to let the name go."""
        raw = self.connect(application_name=f"loom node {name}"[:63])
        try:
            row = raw.execute(
                f"SELECT pg_try_advisory_lock({LOCK_CLASS}, hashtext(%s))", ("node:" + name,)
            ).fetchone()
        except psycopg.Error as exc:
            raw.close()
            raise StorageUnavailable(
                f"cannot take the node name {name!r} on {self.describe()}: {exc}"
            ) from exc
        if not row or not row[0]:
            raw.close()
            raise NodeInUse(
                f"node {name!r} is running already on {self.describe()}: give each loom process its own"
                " node name (loom serve --node NAME)"
            )
        return raw

    def release_node(self, raw: psycopg.Connection[tuple[Any, ...]], name: str) -> None:
        """Let the node name `take_node` took go, then close its connection. The server frees a closed
        session's locks only once it has seen the close, so without the unlock a runtime opened under
        the name right after this one closed could find it still held."""
        try:
            raw.execute(f"SELECT pg_advisory_unlock({LOCK_CLASS}, hashtext(%s))", ("node:" + name,))
        except psycopg.Error:
            pass  # the connection is gone already, and its session's locks with it
        finally:
            raw.close()

    def _listening(self) -> psycopg.Connection[tuple[Any, ...]]:
        raw = self.connect(application_name="loom listener")
        try:
            raw.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            raw.close()
            raise StorageUnavailable(f"cannot listen on {self.describe()}: {exc}") from exc
        return raw


async def _hear(raw: psycopg.Connection[tuple[Any, ...]], deliver: Callable[[str | None], None]) -> None:
    """Hand over each notification as it arrives, waiting on the connection's socket (no thread)."""
    pgconn = raw.pgconn
    while True:
        await trio.lowlevel.wait_readable(pgconn.socket)
        pgconn.consume_input()
        while (notify := pgconn.notifies()) is not None:
            deliver(notify.extra.decode())


def read_schema_version(raw: psycopg.Connection[tuple[Any, ...]]) -> int:
    exists = raw.execute("SELECT to_regclass('loom_schema') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = raw.execute("SELECT version FROM loom_schema").fetchone()
    return int(row[0]) if row else 0


def migrate(raw: psycopg.Connection[tuple[Any, ...]], where: str) -> None:
    """Apply every migration this database lacks, each atomically with its version bump."""
    raw.execute(f"SELECT pg_advisory_lock({LOCK_CLASS}, {MIGRATION_LOCK})")
    try:
        current = read_schema_version(raw)
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{where} has schema version {current}, newer than this loom supports "
                f"({SCHEMA_VERSION}); upgrade loom to open it (nothing was written)"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            with raw.transaction():
                for statement in statements(render(MIGRATIONS[version - 1], POSTGRES.name)):
                    raw.execute(statement)
                raw.execute("CREATE TABLE IF NOT EXISTS loom_schema (version BIGINT NOT NULL)")
                raw.execute("DELETE FROM loom_schema")
                raw.execute("INSERT INTO loom_schema (version) VALUES (%s)", (version,))
    finally:
        if not raw.closed:
            raw.execute(f"SELECT pg_advisory_unlock({LOCK_CLASS}, {MIGRATION_LOCK})")
