"""Pytest fixtures for testing against loom (``pytest_plugins = ["loom.testing.pytest_plugin"]``).

* ``loom_backend``: ``"memory"`` or ``"file"`` (parametrised: tests using it run on both).
* ``loom_store``: the store of that backend: SQLite ``:memory:``, or a file in ``tmp_path``.
* ``loom_drivers``: a factory of started drivers (`RuntimeDriver`) on that store:
  ``async with loom_drivers(config=..., plugins=...) as driver:`` (see `RuntimeDriver.open`).
* ``loom_driver``: one started driver with the default configuration.

Every driver's `ManualClock` starts at `T0_MS` (2026-01-01T00:00:00Z) unless told otherwise.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path

import pytest

from ._driver import RuntimeDriver

DriverFactory = Callable[..., AbstractAsyncContextManager[RuntimeDriver]]


@pytest.fixture(params=["memory", "file"])
def loom_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def loom_store(loom_backend: str, tmp_path: Path) -> str:
    return ":memory:" if loom_backend == "memory" else str(tmp_path / "loom.db")


@pytest.fixture
def loom_drivers(loom_store: str) -> DriverFactory:
    return partial(RuntimeDriver.open, loom_store)


@pytest.fixture
async def loom_driver(loom_drivers: DriverFactory) -> AsyncIterator[RuntimeDriver]:
    async with loom_drivers() as driver:
        yield driver
