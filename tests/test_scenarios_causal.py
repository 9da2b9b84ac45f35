"""The shared causal scenarios (docs/testing.md) against both backends, and their negative control."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from loom import CausalLimits, Event, EventIn
from loom.kernel.accept import _insert
from loom.store import Tx
from loom.testing import RuntimeDriver, ScenarioFailure, scenarios
from loom.testing.internals import storage_of

Scenario = Callable[[RuntimeDriver], Awaitable[None]]


@pytest.mark.parametrize("scenario", scenarios.CAUSAL_SCENARIOS, ids=lambda s: s.__name__)
async def test_causal_scenario(scenario: Scenario, loom_driver: RuntimeDriver) -> None:
    await scenario(loom_driver)
    if loom_driver.reopenable:
        assert loom_driver.reopens >= 1


def _accept_without_bounds(tx: Tx, now_ms: int, event: EventIn, parent_id: str) -> Event:
    """Derived acceptance that skips the causal check (what the negative control drives)."""
    existing = tx.event_by_delivery(event.source, event.delivery_id)
    if existing is not None:
        return existing
    parent = tx.event(parent_id)
    assert parent is not None
    from loom.records.ids import event_id
    from loom.records.validation import checked_payload

    return _insert(
        tx,
        now_ms,
        event,
        event_id(event.source, event.delivery_id),
        parent_id=parent.id,
        cause_id=None,
        root_id=parent.root_id,
        depth=parent.depth + 1,
        execution_id=None,
        checked=checked_payload(event, allow_core=True),
    )


class BypassingDriver(RuntimeDriver):
    """A driver whose derived acceptance bypasses the causal bounds."""

    async def derive(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        return await storage_of(self.runtime).submit(_accept_without_bounds, event, parent_id)


@pytest.mark.parametrize("scenario", scenarios.CAUSAL_SCENARIOS, ids=lambda s: s.__name__)
async def test_causal_scenarios_fail_when_bounds_are_bypassed(
    scenario: Scenario, loom_store: str, nursery: trio.Nursery
) -> None:
    driver = BypassingDriver(nursery, loom_store)
    await driver.start()
    with pytest.raises(ScenarioFailure, match=r"accepted"):
        await scenario(driver)
    await driver.stop()


def test_default_limits_are_the_seed_defaults() -> None:
    assert CausalLimits() == CausalLimits(max_depth=32, per_minute=128)
