"""The shared subscription scenario (docs/testing.md) against both backends, and its negative controls: a runtime
that publishes cross-scope aliases without asking, one whose authoriser consents to everything, and one
that does not deduplicate aliases each fail it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import loom
import loom.kernel.subscriptions
from loom.records.subscriptions import Subscription
from loom.testing import ScenarioFailure, scenarios
from loom.testing.pytest_plugin import DriverFactory


class Authorizer:
    """``loom_authorize_alias`` answering ``answer`` and recording who was asked about what; asking
    from the storage actor's worker thread (inside a transaction) fails it."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, str]] = []

    @loom.hookimpl
    def loom_authorize_alias(self, source_scope: str, target_scope: str, subscription: Any) -> bool | None:
        trio.lowlevel.current_trio_token()  # RuntimeError outside the trio thread
        self.calls.append((source_scope, target_scope, subscription.name))
        return self.answer


@pytest.mark.parametrize("answer", [None, False], ids=["no-opinion", "refused"])
async def test_dependency_subscription_alias(loom_drivers: DriverFactory, answer: bool | None) -> None:
    authorizer = Authorizer(answer)
    async with loom_drivers(plugins=[authorizer]) as driver:
        await scenarios.dependency_subscription_alias(driver)
        if driver.reopenable:
            assert driver.reopens >= 1, "the scenario never closed and reopened its store"
    assert ("acme/web", "acme", "scenario/d2-on-wp") in authorizer.calls, "the authoriser was never asked"
    assert all(call[2] == "scenario/d2-on-wp" for call in authorizer.calls), "asked about a same-scope alias"


async def test_it_fails_when_cross_scope_aliases_skip_authorisation(
    loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: every subscription is treated as same-scope, so nobody asks."""
    monkeypatch.setattr(Subscription, "cross_scope", property(lambda self: False))
    async with loom_drivers() as driver:
        with pytest.raises(ScenarioFailure, match="without authorisation"):
            await scenarios.dependency_subscription_alias(driver)


async def test_it_fails_when_the_authoriser_consents(loom_drivers: DriverFactory) -> None:
    """Negative control: with consent the cross-scope alias is published, and the step notices it."""
    async with loom_drivers(plugins=[Authorizer(True)]) as driver:
        with pytest.raises(ScenarioFailure, match="without authorisation"):
            await scenarios.dependency_subscription_alias(driver)


async def test_it_fails_when_aliases_are_not_deduplicated(
    loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Negative control: each pass rescans the source from the start (no checkpoint) and gives each
    alias a fresh delivery identity, so reconciling again publishes the build's alias again."""
    passes = iter(range(1_000_000))
    original = loom.kernel.subscriptions.alias_event

    def fresh_identity(sub: Subscription, event: loom.Event) -> loom.EventIn:
        alias = original(sub, event)
        return loom.EventIn(
            source=alias.source,
            delivery_id=f"{alias.delivery_id}/{next(passes)}",
            type=alias.type,
            scope=alias.scope,
            key=alias.key,
            work_id=alias.work_id,
            payload=dict(alias.payload),
        )

    monkeypatch.setattr(loom.kernel.subscriptions, "alias_event", fresh_identity)
    monkeypatch.setattr(loom.store.Tx, "advance_subscription_checkpoint", lambda *args: None)
    async with loom_drivers() as driver:
        # whichever the scenario sees first: the second alias, or the identity that let it in
        with pytest.raises(
            ScenarioFailure, match=r"gave 2 aliases|second alias|delivery identity is not \(subscription"
        ):
            await scenarios.dependency_subscription_alias(driver)
