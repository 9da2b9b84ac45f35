"""The shared recovery and retry scenarios (docs/testing.md) against both backends, and their negative controls: a
runtime that never recovers expired leases, or whose retry timer claims at once, fails them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import loom.kernel.recovery
import loom.kernel.retry
import loom.store
from loom.testing import RuntimeDriver, ScenarioFailure, scenarios
from loom.testing.pytest_plugin import DriverFactory

Scenario = Callable[[RuntimeDriver], Awaitable[None]]


@pytest.mark.parametrize("scenario", scenarios.RECOVERY_SCENARIOS, ids=lambda s: s.__name__)
async def test_recovery_scenario(scenario: Scenario, loom_driver: RuntimeDriver) -> None:
    await scenario(loom_driver)
    if loom_driver.reopenable:
        assert loom_driver.reopens >= 1, f"{scenario.__name__} never closed and reopened its store"


async def test_lease_loss_scenario_fails_when_expired_leases_are_never_recovered(
    loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a runtime with no lease recovery (the issue this scenario was written for: an
    attempt whose lease expired stays running for good) fails it."""

    def never(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(loom.kernel.recovery, "recover_claim_in_tx", never)
    async with loom_drivers(stall_s=2) as driver:  # the stall is certain: no need to wait long
        with pytest.raises(ScenarioFailure, match="recovery to claim the expired attempt"):
            await scenarios.lease_loss_adoption_and_stale_result(driver)


async def test_retry_scenario_fails_when_a_failure_retries_at_once(
    loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a retry policy with no backoff (the next attempt due as soon as the failure
    commits) fails the backoff scenario."""
    real = loom.kernel.retry.retry_delay_ms

    def at_once(*args: Any, **kwargs: Any) -> int | None:
        delay = real(*args, **kwargs)
        return None if delay is None else 0

    monkeypatch.setattr(loom.kernel.retry, "retry_delay_ms", at_once)
    async with loom_drivers() as driver:
        with pytest.raises(ScenarioFailure, match=r"after failure 1: running|not \+5 minutes"):
            await scenarios.retry_backoff_exhaustion_and_manual_event(driver)


async def test_retry_cancel_scenario_fails_when_cancel_leaves_timers_armed(
    loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: a cancel that terminalises the Work but leaves its retry timer armed fails
    the cancel-orders scenario."""

    def none(self: Any, work_id: str) -> list[Any]:
        return []

    monkeypatch.setattr(loom.store.Tx, "armed_timers_of_work", none)
    async with loom_drivers() as driver:
        with pytest.raises(ScenarioFailure, match="cancel left the retry timer armed"):
            await scenarios.retry_cancel_orders(driver)
