"""Pytest fixtures for testing against loom (``pytest_plugins = ["loom.testing.pytest_plugin"]``).

* ``loom_backend``: ``"memory"`` or ``"file"`` (parametrised: tests using it run on both).
* ``loom_driver``: a started `RuntimeDriver` on SQLite ``:memory:`` or on a file in
  ``tmp_path`` that scenarios close and reopen between steps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from ._driver import RuntimeDriver


@pytest.fixture(params=["memory", "file"])
def loom_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def loom_store(loom_backend: str, tmp_path: Path) -> str:
    return ":memory:" if loom_backend == "memory" else str(tmp_path / "loom.db")


@pytest.fixture
async def loom_driver(loom_store: str, nursery: trio.Nursery) -> AsyncIterator[RuntimeDriver]:
    driver = RuntimeDriver(nursery, loom_store)
    await driver.start()
    yield driver
    await driver.stop()
