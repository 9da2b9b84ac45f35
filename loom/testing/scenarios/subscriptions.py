"""Dependency subscriptions and alias Events (docs/concepts.md, "Subscription").

Work runs under the test executor ``fake``. The scenario reads aliases back as the Events whose source
is the subscription's ``namespace/id``. Its cross-scope step expects no authorisation: run it with no
``loom_authorize_alias`` plugin, or one that does not consent to ``scenario/d2-on-wp``.
"""

from __future__ import annotations

from typing import Any

from ... import (
    CheckpointStatus,
    Completed,
    Deliver,
    Event,
    EventIn,
    InvalidRequest,
    SubscriptionSpec,
    Waiting,
    WaitSpec,
    WaitState,
)
from ...plugins.handlers import work_id_for_key
from .._driver import Driver, wait_routed
from .._scenario import expect
from ._common import SCOPE, WEB, _config
from .waits import _finish_all, _launches, _start, _wait_state

NAMESPACE = "scenario"


def _routes() -> Any:
    return _config(
        [
            {"name": "attach", "types": ["dep.attach"], "handler": "scenario", "config": {"fn": "attach_p"}},
            {"name": "w", "types": ["w.*", "build.*"], "create_work": True, "binding": "fake"},
        ]
    )


def _ev(delivery_id: str, type: str, key: str, *, scope: str = SCOPE, **payload: Any) -> EventIn:
    return EventIn(
        source="scenario", delivery_id=delivery_id, type=type, scope=scope, key=key, payload=payload
    )


async def _aliases(driver: Driver, subscription: str) -> list[Event]:
    """The alias Events of ``subscription`` (``namespace/id``), in acceptance order."""
    return [e for e in await driver.runtime.events(limit=100_000) if e.source == subscription]


async def dependency_subscription_alias(driver: Driver) -> None:
    """A foreign key cannot be stolen: the dependent subscribes to it instead, and a deduplicated alias
    on its own key, caused by the original, wakes it; a cross-scope alias needs authorisation."""
    await driver.configure(_routes())
    # 1. Work D depends on key p owned by Work P: attaching p to D is refused
    p = await _start(driver, "p", "p0")
    d = await _start(driver, "d", "d0")
    driver.handlers.table["attach_p"] = lambda *args: Deliver(work_id=d, attach_keys=("p",))
    attach = await driver.runtime.publish(_ev("d-attach", "dep.attach", "d"))
    [checkpoint] = await wait_routed(driver, attach)
    expect(
        checkpoint.status is CheckpointStatus.UNROUTED and f"owned by work {p}" in (checkpoint.reason or ""),
        f"attaching P's key to D was not refused as owned by P: {checkpoint}",
    )
    expect((await driver.runtime.work_for_key("p")).id == p, "key p changed owner")
    expect((await driver.runtime.work(d)).keys == ("d",), "D took key p")
    dependency = SubscriptionSpec(
        namespace=NAMESPACE, id="d-on-p", source_key="p", types=("build.done",), label="p built"
    )
    try:
        await driver.runtime.subscribe(d, dependency, dependent_key="p")
        refused = ""
    except InvalidRequest as exc:
        refused = str(exc)
    expect(f"owned by work {p}" in refused, "a subscription may publish its aliases on P's key")

    # 2. D subscribes to p: one alias on D's key, caused by the original, wakes D; no second alias
    await driver.runtime.subscribe(d, dependency)
    driver.fake.finish(d, Waiting(wait=WaitSpec(types=("build.done",))))
    await _wait_state(driver, d, WaitState.ACTIVE, "D's wait on its own key")
    await driver.reopen()
    await driver.runtime.publish(_ev("p-started", "build.started", "p"))
    original = _ev("p-built", "build.done", "p", log="the provider's body")
    built = await driver.runtime.publish(original)
    await _launches(driver, d, 2)
    aliases = await _aliases(driver, f"{NAMESPACE}/d-on-p")
    expect(
        len(aliases) == 1, f"one build on p gave {len(aliases)} aliases: {[a.delivery_id for a in aliases]}"
    )
    alias = aliases[0]
    expect(
        (alias.source, alias.delivery_id) == (f"{NAMESPACE}/d-on-p", built.id),
        f"the alias's delivery identity is not (subscription, original Event): {alias}",
    )
    expect((alias.key, alias.work_id) == ("d", d), f"the alias is not on D's own key for D: {alias}")
    expect(alias.parent_id == built.id, f"the alias is not caused by the original: {alias.parent_id}")
    expect(
        dict(alias.payload)
        == {
            "subscription": f"{NAMESPACE}/d-on-p",
            "event": built.id,
            "source_type": "build.done",
            "label": "p built",
        },
        f"the alias's payload is not the minimal lineage: {dict(alias.payload)}",
    )
    woken = (await driver.runtime.waits(d))[-1]
    expect(woken.winner_event_id == alias.id, f"D was not woken by the alias: {woken}")
    trigger = driver.fake.launches_of(d)[1].request.trigger
    expect(trigger is not None and trigger.id == alias.id, "D's next attempt is not triggered by the alias")
    expect((await driver.runtime.publish(original)).duplicate, "replaying the original accepted it again")
    driver.fake.finish(d, Completed())
    await driver.runtime.reconcile_subscriptions(100)
    await driver.settle()
    await driver.reopen()
    await driver.runtime.reconcile_subscriptions(100)
    await driver.settle()
    aliases = await _aliases(driver, f"{NAMESPACE}/d-on-p")
    expect(
        len(aliases) == 1, f"replaying the original or reconciling again made a second alias: {len(aliases)}"
    )

    # 3. a cross-scope subscription without authorisation produces no alias
    await driver.runtime.publish(_ev("wp0", "w.start", "wp", scope=WEB))
    await _launches(driver, work_id_for_key(WEB, "wp"), 1)
    d2 = await _start(driver, "d2", "d2-0")
    cross = SubscriptionSpec(
        namespace=NAMESPACE, id="d2-on-wp", source_key="wp", source_scope=WEB, types=("build.done",)
    )
    driver.fake.finish(d2, Waiting(wait=WaitSpec(types=("build.done",), subscriptions=(cross,))))
    await _wait_state(driver, d2, WaitState.ACTIVE, "D2's wait declaring the cross-scope subscription")
    await driver.runtime.publish(_ev("wp-built", "build.done", "wp", scope=WEB))
    await driver.settle()
    await driver.runtime.reconcile_subscriptions(100)
    await driver.settle()
    leaked = await _aliases(driver, f"{NAMESPACE}/d2-on-wp")
    expect(not leaked, f"a cross-scope alias was published without authorisation: {leaked}")
    expect(
        (await driver.runtime.waits(d2))[-1].state is WaitState.ACTIVE,
        "D2 woke from another scope without authorisation",
    )
    stored = await driver.runtime.subscription(NAMESPACE, "d2-on-wp")
    expect(stored.authorized is False, f"the refused authorisation is not recorded: {stored}")
    await driver.runtime.cancel(d2)
    await _finish_all(driver)


SUBSCRIPTION_SCENARIOS = (dependency_subscription_alias,)
