"""The routing scenarios of seed 003 against both backends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from loom.testing import RuntimeDriver, scenarios

Scenario = Callable[[RuntimeDriver], Awaitable[None]]


@pytest.mark.parametrize("scenario", scenarios.ROUTING_SCENARIOS, ids=lambda s: s.__name__)
async def test_routing_scenario(scenario: Scenario, loom_driver: RuntimeDriver) -> None:
    await scenario(loom_driver)
