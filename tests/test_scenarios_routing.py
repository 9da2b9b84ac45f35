"""The routing scenarios of seed 003 against both backends (the file one reopened between steps).

A scenario that finds a product bug is marked ``xfail(strict=True)`` here, and
`test_known_bug_is_its_only_failure` runs it again requiring that bug's message only, so the steps
before the bug keep guarding their rules until the product is fixed (then both tests say so).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import pytest

from loom.testing import RuntimeDriver, ScenarioFailure, scenarios

Scenario = Callable[[RuntimeDriver], Awaitable[None]]


@attrs.frozen
class KnownBug:
    scenario: Scenario
    match: str
    """A pattern of the one failure message expected until the product is fixed."""
    reason: str


KNOWN_BUGS = (
    KnownBug(
        scenarios.first_match_replay_and_drop_audit,
        r"a drop decided from a stale Work snapshot \(running\) was applied after the Work stopped running",
        "loom/kernel/routing.py route_in_tx applies a handler's Drop decision before the Work revision "
        "check, so a drop decided from a Work snapshot that changed before it applied is committed "
        "instead of re-evaluated (seed 003: a revision conflict requires reread/re-evaluation)",
    ),
)
_KNOWN = {bug.scenario: bug for bug in KNOWN_BUGS}


def _param(scenario: Scenario) -> object:
    known = _KNOWN.get(scenario)
    marks = [pytest.mark.xfail(strict=True, reason=known.reason)] if known else []
    return pytest.param(scenario, id=scenario.__name__, marks=marks)


@pytest.mark.parametrize("scenario", [_param(s) for s in scenarios.ROUTING_SCENARIOS])
async def test_routing_scenario(scenario: Scenario, loom_driver: RuntimeDriver) -> None:
    await scenario(loom_driver)
    if loom_driver.reopenable:
        assert loom_driver.reopens >= 1, f"{scenario.__name__} never closed and reopened its store"


@pytest.mark.parametrize("bug", KNOWN_BUGS, ids=lambda b: b.scenario.__name__)
async def test_known_bug_is_its_only_failure(bug: KnownBug, loom_driver: RuntimeDriver) -> None:
    with pytest.raises(ScenarioFailure, match=bug.match):
        await bug.scenario(loom_driver)
    if loom_driver.reopenable:
        assert loom_driver.reopens >= 1, f"{bug.scenario.__name__} never closed and reopened its store"
