"""Shared fixtures: the public ones from loom.testing (``loom_backend``, ``loom_store``, ``loom_drivers``,
``loom_driver``, registered by loom's ``pytest11`` entry point), and a clock at the one business-time
origin, ``T0_MS``."""

from __future__ import annotations

import pytest

from loom.testing import T0_MS, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """Business time starts at 2026-01-01T00:00:00Z, the first millisecond of a UTC minute."""
    return ManualClock(start_ms=T0_MS)
