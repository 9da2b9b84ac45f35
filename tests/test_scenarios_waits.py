"""The shared wait scenarios (docs/testing.md) against both backends, and their negative control: a runtime that
suppresses wakes fails every one of them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import loom.kernel.routing
import loom.kernel.waits
from loom.testing import RuntimeDriver, ScenarioFailure, scenarios
from loom.testing.pytest_plugin import DriverFactory

Scenario = Callable[[RuntimeDriver], Awaitable[None]]


@pytest.mark.parametrize("scenario", scenarios.WAIT_SCENARIOS, ids=lambda s: s.__name__)
async def test_wait_scenario(scenario: Scenario, loom_driver: RuntimeDriver) -> None:
    await scenario(loom_driver)
    if loom_driver.reopenable:
        assert loom_driver.reopens >= 1, f"{scenario.__name__} never closed and reopened its store"


@pytest.mark.parametrize("scenario", scenarios.WAIT_SCENARIOS, ids=lambda s: s.__name__)
async def test_wait_scenarios_fail_when_wakes_are_suppressed(
    scenario: Scenario, loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a runtime whose wake never happens (registration, routing and timeouts all
    arbitrate, and nothing is ever woken) must fail each wait scenario with a diagnostic."""

    def never(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(loom.kernel.waits, "wake_wait_in_tx", never)
    async with loom_drivers() as driver:
        with pytest.raises(ScenarioFailure, match=r"wake|woke|resume|winner|timed out waiting"):
            await scenario(driver)
