"""The shared routing scenarios (docs/testing.md) against both backends; on the file backend each scenario must
close and reopen its store at least once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from loom.testing import RuntimeDriver, scenarios

Scenario = Callable[[RuntimeDriver], Awaitable[None]]


@pytest.mark.parametrize("scenario", scenarios.ROUTING_SCENARIOS, ids=lambda s: s.__name__)
async def test_routing_scenario(scenario: Scenario, loom_driver: RuntimeDriver) -> None:
    await scenario(loom_driver)
    if loom_driver.reopenable:
        assert loom_driver.reopens >= 1, f"{scenario.__name__} never closed and reopened its store"
