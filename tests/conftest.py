"""Shared fixtures: the public ones from loom.testing, and a store path and clock for runtime tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.testing import T0_MS, ManualClock

pytest_plugins = ["loom.testing.pytest_plugin"]


@pytest.fixture(params=["memory", "file"])
def store_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite ``:memory:`` and a file: tests that take it run on both backends."""
    return ":memory:" if request.param == "memory" else str(tmp_path / "loom.db")


@pytest.fixture
def clock() -> ManualClock:
    """Business time starts at 2026-01-01T00:00:00Z, the first millisecond of a UTC minute."""
    return ManualClock(start_ms=T0_MS)
