"""`TxBase`: the plumbing every part of `Tx` shares (the connection, notices, savepoints)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from ..records.errors import IllegalTransition

Params = Sequence[Any]

STORAGE_FAILURES = (sqlite3.OperationalError, sqlite3.InternalError, sqlite3.NotSupportedError)
"""Errors that mean the store itself failed, not one request's logic."""


def written(cursor: sqlite3.Cursor, what: str, old: object, new: object) -> None:
    """A compare-and-set wrote nothing: the record was not in the state it was read in."""
    if cursor.rowcount != 1:
        raise IllegalTransition(f"{what}: {old} -> {new} found it no longer {old} (a stale read)")


STORAGE_FAILURES = (sqlite3.OperationalError, sqlite3.InternalError, sqlite3.NotSupportedError)
"""Errors that mean the store itself failed, not one request's logic."""


class TxBase:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.notices: list[object] = []
        self._savepoints = 0

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        """Run a block atomically inside the transaction: an exception undoes only its effects
        (and its notices), then propagates."""
        name = f"nested_{self._savepoints}"
        self._savepoints += 1
        mark = len(self.notices)
        self._conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException as exc:
            if not self.is_storage_failure(exc):
                self._conn.execute(f"ROLLBACK TO {name}")
                self._conn.execute(f"RELEASE {name}")
                del self.notices[mark:]
            raise
        else:
            self._conn.execute(f"RELEASE {name}")
        finally:
            self._savepoints -= 1

    @staticmethod
    def is_storage_failure(exc: BaseException) -> bool:
        """I/O errors, a full disk, a locked or corrupt database: the store failed, not the request."""
        return isinstance(exc, STORAGE_FAILURES) or type(exc) is sqlite3.DatabaseError

    # -- plumbing ---------------------------------------------------------

    def _one(self, sql: str, params: Params = ()) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._conn.execute(sql, params).fetchone()
        return row

    def _all(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()

    def notify(self, notice: object) -> None:
        """Queue a notice for publication after this batch commits."""
        self.notices.append(notice)
