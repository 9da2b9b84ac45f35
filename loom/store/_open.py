"""Choosing a backend: a path or ``":memory:"`` is SQLite, a ``postgresql://`` URL is PostgreSQL."""

from __future__ import annotations

import importlib
import os
import secrets
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

from ..records.errors import InvalidRequest
from ._actor import StorageActor
from ._dialect import Store
from ._reader import ActorReader, Reader
from ._sqlite import SQLiteStore

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def _is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(POSTGRES_SCHEMES)


def check_location(location: str) -> None:
    """Refuse a store location that cannot be opened, before anything is: a malformed PostgreSQL URL
    (naming what is wrong, never the password), a SQLite path no file can have (a NUL character, a
    name the file system cannot encode), or a SQLite file in a directory that does not exist."""
    as_store(location)
    if _is_postgres_url(location):
        return
    if location != ":memory:" and Path(location).parent != Path() and not Path(location).parent.is_dir():
        raise InvalidRequest(f"{location}: the directory {Path(location).parent} does not exist")


def default_owner(store: Store) -> str:
    """The name a runtime holds its leases under when none is given: ``loom`` alone on its database; on
    a shared one, a name of this process's own (host, process id and a random part), so that a node's
    clean close releases its own leases only, never those of the nodes that go on running."""
    if not store.dialect.shared:
        return "loom"
    return f"loom@{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def as_store(store: Any, *, synchronous: str = "FULL") -> Store:
    """The store ``store`` names: a `SQLiteStore` or `PostgresStore` as it is, a ``postgresql://``
    URL, or a SQLite path (a string or a path object; ``":memory:"`` for a database that ends with the runtime; ``synchronous``:
    its SQLite level, the configuration's ``[store]``); anything else, and a path no file can have
    (`check_path`), is refused (`InvalidRequest`)."""
    if isinstance(store, SQLiteStore):
        return store
    if isinstance(store, os.PathLike) and isinstance(path := os.fspath(store), str):
        store = path  # (a `pathlib.Path`, as any file API takes one)
    if _is_postgres_url(store):
        return postgres_backend().PostgresStore(url=store)  # type: ignore[no-any-return]
    if isinstance(store, str) and store:
        return SQLiteStore(path=store, synchronous=synchronous)
    if type(store).__name__ == "PostgresStore":
        postgres = postgres_backend()
        if isinstance(store, postgres.PostgresStore):
            return store  # type: ignore[no-any-return]
    raise InvalidRequest(
        f"store must be a path, ':memory:', a postgresql:// URL, a SQLiteStore or a PostgresStore, got {store!r}"
    )


def open_reader(store: Store, storage: StorageActor) -> Reader:
    """The read side for ``store`` (not yet opened): its own connection where it can have one."""
    if isinstance(store, SQLiteStore):
        return ActorReader(storage) if store.in_memory else Reader(store.reader_uri())
    postgres_backend()  # (psycopg is there, or the error says how to install it)
    module: ModuleType = importlib.import_module("._postgres_reader", __package__)
    return module.PostgresReader(store)  # type: ignore[no-any-return]


def postgres_backend() -> Any:
    """The PostgreSQL backend's module, imported on first use: psycopg is an optional dependency, so
    SQLite users never need it."""
    try:
        module: ModuleType = importlib.import_module("._postgres", __package__)
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise InvalidRequest(
            f"PostgreSQL needs psycopg 3: pip install 'psycopg[binary]>=3.2' (loom's postgres extra) ({exc})"
        ) from exc
    return module
