"""Pytest fixtures for testing against loom, registered by loom's ``pytest11`` entry point (no
``pytest_plugins`` line is needed, and one naming this module would register it twice).

* ``loom_backend``: ``"memory"`` and ``"file"`` (parametrised: tests using it run on each), and
  ``"postgres"`` only when asked: ``pytest --loom-postgres`` for every such test, or
  ``@pytest.mark.loom_postgres`` on one (a project's own suite never starts a server it did not ask for).
* ``loom_store``: the store of that backend: SQLite ``:memory:``, a file in ``tmp_path``, or the URL of
  a fresh PostgreSQL database (a copy of a migrated template).
* ``loom_postgres``: the session's `PostgresCluster`: ``LOOM_TEST_POSTGRES_URL`` if set, else a
  throwaway cluster started with ``initdb`` in a temporary directory (on a unix socket, as an
  unprivileged user when run as root) and stopped at the end. Without PostgreSQL binaries the
  ``postgres`` tests skip, unless ``CI=true``: there a missing server fails them.
* ``loom_drivers``: a factory of started drivers (`RuntimeDriver`) on that store:
  ``async with loom_drivers(config=..., plugins=...) as driver:`` (see `RuntimeDriver.open`).
* ``loom_driver``: one started driver with the default configuration.

Every driver's `ManualClock` starts at `T0_MS` (2026-01-01T00:00:00Z) unless told otherwise.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path

import pytest

from ._driver import RuntimeDriver
from .postgres import ENV_URL, PostgresCluster, PostgresUnavailable

DriverFactory = Callable[..., AbstractAsyncContextManager[RuntimeDriver]]


BACKENDS = ("memory", "file", "postgres")
ASKED = "loom_postgres"
"""The option (``--loom-postgres``) and the marker that add PostgreSQL to ``loom_backend``."""


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--loom-postgres",
        action="store_true",
        dest=ASKED,
        help="run loom's backend fixtures (loom_backend, loom_store, loom_drivers) on PostgreSQL too:"
        " a throwaway server, or LOOM_TEST_POSTGRES_URL",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{ASKED}: run this test's loom backend fixtures on PostgreSQL too")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "loom_backend" in metafunc.fixturenames:
        asked = metafunc.config.getoption(ASKED) or metafunc.definition.get_closest_marker(ASKED) is not None
        backends = BACKENDS if asked else tuple(b for b in BACKENDS if b != "postgres")
        metafunc.parametrize("loom_backend", backends, indirect=True)


@pytest.fixture(scope="session")
def loom_postgres() -> Iterator[PostgresCluster]:
    url = os.environ.get(ENV_URL)
    try:
        cluster = PostgresCluster.external(url) if url else PostgresCluster.start()
    except PostgresUnavailable as exc:
        if in_ci():
            pytest.fail(f"CI needs a PostgreSQL server and none could be started: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def loom_backend(request: pytest.FixtureRequest) -> str:
    """The backend a test runs on (parametrised by `pytest_generate_tests`)."""
    return str(request.param)


@pytest.fixture
def loom_store(loom_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if loom_backend == "memory":
        return ":memory:"
    if loom_backend == "file":
        return str(tmp_path / "loom.db")
    cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
    return cluster.create_database(template=cluster.migrated_template())


@pytest.fixture
def loom_drivers(loom_store: str) -> DriverFactory:
    return partial(RuntimeDriver.open, loom_store)


@pytest.fixture
async def loom_driver(loom_drivers: DriverFactory) -> AsyncIterator[RuntimeDriver]:
    async with loom_drivers() as driver:
        yield driver
