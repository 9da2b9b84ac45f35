"""Which database a benchmark measures on, chosen by the same two options in every script.

``--backend sqlite`` (the default) puts every database of a run in one temporary directory (under
``--dir`` where a script has it), so they share one disk. ``--backend postgres`` makes every database
fresh on the server at ``--url``, or on a throwaway cluster with ``fsync`` on (bench/pg.py); there,
every figure is given as a ratio to raw psycopg measured in the same run. See bench/README.md.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pg

from loom.store import SQLiteStore, Store, as_store
from loom.testing.postgres import PostgresCluster


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--backend sqlite|postgres`` and ``--url URL``, as accept.py takes them."""
    parser.add_argument(
        "--backend",
        default="sqlite",
        choices=["sqlite", "postgres"],
        help="the store under test (default sqlite; postgres: every baseline is raw psycopg)",
    )
    parser.add_argument(
        "--url",
        default=None,
        help="with --backend postgres: the server to measure on (default: a throwaway one, fsync on)",
    )


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--url`` without ``--backend postgres`` (it would be silently ignored)."""
    if args.url and args.backend != "postgres":
        parser.error("--url needs --backend postgres")


@attrs.frozen
class Backend:
    """Where a run's databases are made: files in ``tmp`` (SQLite), or databases on ``cluster``.

    ``tmp`` exists on both backends (scripts keep configuration files there)."""

    tmp: Path
    synchronous: str = "FULL"
    cluster: PostgresCluster | None = None

    @property
    def postgres(self) -> bool:
        return self.cluster is not None

    def location(self, name: str) -> str:
        """A fresh database: the file ``name`` in the run's directory, or a new empty database."""
        if self.cluster is not None:
            return self.cluster.create_database()
        return str(self.tmp / name)

    def open(self, location: str) -> Store:
        """The store at ``location`` (on SQLite with the run's ``synchronous``)."""
        if as_store(location).dialect.shared:
            return as_store(location)
        return SQLiteStore(path=location, synchronous=self.synchronous)

    def store(self, name: str) -> Store:
        """A store on a fresh database (``name``: its file on SQLite)."""
        return self.open(self.location(name))

    def copy(self, location: str, name: str) -> str:
        """A fresh database holding what ``location`` holds, which nothing may have open: a copy of
        the file, or a database made with ``location`` as its template."""
        if self.cluster is not None:
            from psycopg import conninfo

            return self.cluster.create_database(template=str(conninfo.conninfo_to_dict(location)["dbname"]))
        shutil.copy(location, self.tmp / name)
        return str(self.tmp / name)

    def discard(self, location: str) -> None:
        """Remove a database the run no longer needs: its file with its WAL (SQLite; a database on the
        server goes with the run)."""
        if self.cluster is None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{location}{suffix}").unlink(missing_ok=True)

    def server(self) -> str:
        """The PostgreSQL server and its durability settings, as a header line names them."""
        assert self.cluster is not None
        return pg.describe(self.cluster)


@contextmanager
def chosen(args: argparse.Namespace, prefix: str) -> Iterator[Backend]:
    """The backend ``args`` chose, for the length of a run: the temporary directory is removed, and
    a throwaway server stopped (the databases made on an external one dropped), at the end."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=getattr(args, "dir", None)))
    synchronous = getattr(args, "synchronous", "FULL")
    try:
        if args.backend == "postgres":
            with pg.server(args.url) as cluster:
                yield Backend(tmp, synchronous, cluster)
        else:
            yield Backend(tmp, synchronous)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class RawConnection:
    """A connection of a raw baseline, outside loom, to a SQLite file or a PostgreSQL URL.

    Statements are written once, with ``?`` parameters, and transactions with explicit ``BEGIN`` and
    ``COMMIT``: sqlite3 runs with ``isolation_level=None``, psycopg in autocommit mode (``?`` becomes
    ``%s``), so both commit exactly where the statements say.
    """

    def __init__(self, location: str) -> None:
        self.postgres = as_store(location).dialect.shared
        if self.postgres:
            import psycopg

            self._conn: Any = psycopg.connect(location, autocommit=True)
        else:
            self._conn = sqlite3.connect(location, isolation_level=None)

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement; its rows, if it returns any."""
        if self.postgres:
            cursor = self._conn.execute(self._sql(sql), params or None)
        else:
            cursor = self._conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description is not None else []

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        if self.postgres:
            with self._conn.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)
        else:
            self._conn.executemany(sql, rows)

    def script(self, sql: str) -> None:
        """Several statements without parameters (a schema)."""
        if self.postgres:
            self._conn.execute(sql)
        else:
            self._conn.executescript(sql)

    def close(self) -> None:
        self._conn.close()
