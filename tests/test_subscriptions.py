"""Dependency subscriptions and alias Events (docs/concepts.md "Subscription": dependent
prerequisites and cross-scope aliases). Most tests drive the runtime by hand (``actors=()``): Events
are routed by `Runtime.poll`, attempts claimed and parked by the host, and aliases published by
`Runtime.reconcile_subscriptions`, so each step is one visible call. The shared scenario
``dependency_subscription_alias`` runs in `test_scenarios_subscriptions`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import loom
from loom import (
    CausalLimits,
    Config,
    Conflict,
    Event,
    EventIn,
    InvalidRequest,
    ManualClock,
    Runtime,
    SubscriptionSpec,
    SubscriptionState,
    WaitSpec,
    WaitState,
)
from loom.kernel.subscriptions import alias_event, is_candidate, reconcile_in_tx
from loom.notices import SubscriptionChanged
from loom.plugins.handlers import work_id_for_key
from loom.records.subscriptions import SUBSCRIPTION_LIFECYCLE, AliasAuthorization
from loom.testing import RuntimeDriver
from loom.testing.internals import storage_of
from loom.testing.pytest_plugin import DriverFactory

SCOPE = "acme"
WEB = "acme/web"


def config(*, causal: dict[str, int] | None = None) -> Config:
    """Every Event type is routed to the Work that owns its key (created on first sight); no binding,
    so the host claims attempts itself. ``acme/web`` inherits the route."""
    return Config.from_dict({
        "causal": causal or {},
        "scopes": {SCOPE: {"routes": [{"name": "all", "types": ["*"], "create_work": True}]}, WEB: {}},
    })  # fmt: skip


def ev(delivery_id: str, type: str, key: str, *, scope: str = SCOPE, **payload: Any) -> EventIn:
    return EventIn(source="t", delivery_id=delivery_id, type=type, scope=scope, key=key, payload=payload)


def spec(id: str = "d-on-p", *, source_key: str = "p", **fields: Any) -> SubscriptionSpec:
    """A subscription to ``build.*`` Events (not the ``w.start`` that created the source's Work)."""
    return SubscriptionSpec(
        namespace="deps", id=id, source_key=source_key, **{"types": ("build.*",), **fields}
    )


@asynccontextmanager
async def host(
    clock: ManualClock,
    *,
    store: str = ":memory:",
    plugins: Iterable[object] = (),
    causal: dict[str, int] | None = None,
    actors: tuple[str, ...] = (),
) -> AsyncIterator[Runtime]:
    async with loom.open_runtime(
        store,
        clock=clock,
        config=config(causal=causal),
        plugins=plugins,
        load_entry_points=False,
        actors=actors,
    ) as rt:
        yield rt


async def work_on(rt: Runtime, key: str, *, scope: str = SCOPE) -> str:
    """The Work that owns ``key`` (created by routing its first Event)."""
    await rt.publish(ev(f"{scope}/{key}/start", "w.start", key, scope=scope))
    await rt.poll()
    return work_id_for_key(scope, key)


async def aliases_of(rt: Runtime, name: str = "deps/d-on-p") -> list[Event]:
    return [e for e in await rt.events(limit=10_000) if e.source == name]


async def park(rt: Runtime, work_id: str, *subs: SubscriptionSpec) -> None:
    """Claim the Work's next attempt and park it on a wait for ``build.*`` declaring ``subs``."""
    lease = await rt.claim(work_id, owner="host")
    await rt.wait(lease, WaitSpec(types=("build.*",), subscriptions=subs))


class Authorizer:
    """``loom_authorize_alias`` answering ``answer``; it records each question, and fails when asked
    from a thread other than trio's (the storage actor's worker thread)."""

    def __init__(self, answer: object) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, str, int]] = []

    @loom.hookimpl
    def loom_authorize_alias(self, source_scope: str, target_scope: str, subscription: Any) -> Any:
        trio.lowlevel.current_trio_token()  # RuntimeError outside the trio thread
        self.calls.append((source_scope, target_scope, subscription.name, subscription.revision))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Filters:
    """``loom_alias_filters``: ``at_least`` passes Events whose ``n`` reaches the filter's ``min``;
    ``boom`` raises."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Mapping[str, Any] | None]] = []

    @loom.hookimpl
    def loom_alias_filters(self) -> Mapping[str, Any]:
        return {"at_least": self.at_least, "boom": self.boom}

    def at_least(self, event: Event, filter: Mapping[str, Any] | None) -> bool:
        self.seen.append((event.id, filter))
        assert filter is not None
        return bool(event.payload.get("n", 0) >= filter["min"])

    def boom(self, event: Event, filter: Mapping[str, Any] | None) -> bool:
        raise RuntimeError("the filter is broken")


# -- aliases: identity, lineage, backscan, after, filters ---------------------------------------------


async def test_subscribing_backscans_history_into_one_alias_per_source_event(clock: ManualClock) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        done = await rt.publish(ev("p1", "build.done", "p", body="the provider's own payload"))
        started = await rt.publish(ev("p2", "build.started", "p"))
        sub = await rt.subscribe(d, spec(types=("build.done",), label="needs p"))
        [alias] = await aliases_of(rt)
        assert (alias.source, alias.delivery_id) == ("deps/d-on-p", done.id), "the stable delivery identity"
        assert (alias.type, alias.scope, alias.key, alias.work_id) == ("build.done", SCOPE, "d", d)
        assert (alias.parent_id, alias.root_id, alias.depth) == (done.id, done.root_id, done.depth + 1), (
            "an alias is derived from the original: its causal chain and budget"
        )
        assert dict(alias.payload) == {
            "subscription": "deps/d-on-p",
            "event": done.id,
            "source_type": "build.done",
            "label": "needs p",
        }, "lineage only, never the provider's body"
        assert sub.state is SubscriptionState.ACTIVE
        assert sub.checkpoint_seq == started.seq, "the backscan decided the whole history, aliased or not"
        later = await rt.publish(ev("p3", "build.done", "p"))
        report = await rt.reconcile_subscriptions(10)
        assert [(await rt.event(a)).delivery_id for a in report.aliases] == [later.id]
        assert (await rt.subscription("deps", "d-on-p")).checkpoint_seq == later.seq


async def test_after_starts_the_scan_after_that_sequence(clock: ManualClock) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        old = await rt.publish(ev("p1", "build.done", "p"))
        new = await rt.publish(ev("p2", "build.done", "p"))
        await rt.subscribe(d, spec(after=old.seq))
        assert [a.delivery_id for a in await aliases_of(rt)] == [new.id]


async def test_a_filter_decides_each_source_event_with_its_opaque_filter(clock: ManualClock) -> None:
    filters = Filters()
    async with host(clock, plugins=[filters]) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        small = await rt.publish(ev("p1", "build.done", "p", n=1))
        big = await rt.publish(ev("p2", "build.done", "p", n=5))
        await rt.subscribe(d, spec(filter_name="at_least", filter={"min": 3}))
        assert [a.delivery_id for a in await aliases_of(rt)] == [big.id]
        assert filters.seen == [(small.id, {"min": 3}), (big.id, {"min": 3})]
        assert (await rt.subscription("deps", "d-on-p")).checkpoint_seq == big.seq, (
            "a filtered-out Event is decided too: it is not asked about again"
        )


def test_only_matching_non_core_source_events_are_candidates() -> None:
    sub = attrs.evolve(_stored(), types=("build.*",))
    event = Event(
        id="ev_1", seq=1, source="s", delivery_id="1", type="build.done", scope=SCOPE, key="p",
        work_id=None, execution_id=None, payload={}, parent_id=None, cause_id=None, root_id="ev_1",
        depth=0, accepted_at_ms=0,
    )  # fmt: skip
    assert is_candidate(sub, event)
    assert not is_candidate(sub, attrs.evolve(event, type="deploy.done"))
    assert not is_candidate(attrs.evolve(sub, types=()), attrs.evolve(event, type="core.work.created"))
    alias = alias_event(sub, event)
    assert (alias.source, alias.delivery_id, alias.key, alias.work_id) == ("deps/d-on-p", "ev_1", "d", "wk_d")


def _stored() -> loom.Subscription:
    return loom.Subscription(
        namespace="deps", id="d-on-p", work_id="wk_d", dependent_key="d", wait_id=None, source_key="p",
        source_scope=SCOPE, target_scope=SCOPE, types=(), after=0, filter_name=None, filter=None,
        label="", state=SubscriptionState.ACTIVE, checkpoint_seq=0, revision=1, authorized=None,
        reason=None, created_at_ms=0, updated_at_ms=0,
    )  # fmt: skip


async def test_a_replay_or_another_pass_adds_no_second_alias(clock: ManualClock) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.subscribe(d, spec())
        original = ev("p1", "build.done", "p")
        await rt.publish(original)
        assert len((await rt.reconcile_subscriptions(10)).aliases) == 1
        replayed = await rt.publish(original)
        assert replayed.duplicate
        for _ in range(2):
            assert (await rt.reconcile_subscriptions(10)).aliases == ()
        assert len(await aliases_of(rt)) == 1


async def test_the_delivery_identity_alone_prevents_a_second_alias_when_the_checkpoint_is_lost(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: with a checkpoint that never advances, every pass rescans the original, and
    its alias is found by its identity (not refused, not published again)."""
    monkeypatch.setattr(loom.store.Tx, "advance_subscription_checkpoint", lambda *args: None)
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.publish(ev("p1", "build.done", "p"))
        await rt.subscribe(d, spec())
        for _ in range(3):
            report = await rt.reconcile_subscriptions(10)
            assert (report.aliases, report.refused) == ((), ())
        assert len(await aliases_of(rt)) == 1
        assert await rt.diagnostics(kind="alias_refused") == []


async def test_an_idle_subscription_does_not_starve_the_others(clock: ManualClock) -> None:
    """At ``limit=1`` the durable cursor moves past the idle subscription, which sorts first."""
    async with host(clock) as rt:
        await work_on(rt, "p")
        await work_on(rt, "q")
        idle, busy = await work_on(rt, "d1"), await work_on(rt, "d2")
        await rt.subscribe(idle, spec("a-idle", source_key="q"))
        await rt.subscribe(busy, spec("b-busy"))
        await rt.publish(ev("p1", "build.done", "p"))
        visited = []
        for _ in range(2):
            report = await rt.reconcile_subscriptions(1)
            visited.append(report.visited)
        assert visited == [1, 1], "each pass is bounded by its limit"
        assert len(await aliases_of(rt, "deps/b-busy")) == 1


async def test_a_refused_alias_is_diagnosed_and_checkpointed_not_retried(clock: ManualClock) -> None:
    async with host(clock, causal={"max_depth": 1}) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.subscribe(d, spec())
        root = await rt.publish(ev("r1", "x.root", "r"))
        deep = await rt.publish_derived(ev("p-deep", "build.done", "p"), parent_id=root.id)
        report = await rt.reconcile_subscriptions(10)
        assert report.refused == (deep.id,)
        [diagnostic] = await rt.diagnostics(kind="alias_refused")
        assert "depth" in diagnostic.message
        assert deep.id in diagnostic.message
        assert (await rt.subscription("deps", "d-on-p")).checkpoint_seq == deep.seq
        assert (await rt.reconcile_subscriptions(10)).refused == (), "a refused branch is not retried"
        assert len(await rt.diagnostics(kind="alias_refused")) == 1
        shallow = await rt.publish(ev("p-root", "build.done", "p"))
        assert [a.delivery_id for a in await aliases_of(rt)] == []
        await rt.reconcile_subscriptions(10)
        assert [a.delivery_id for a in await aliases_of(rt)] == [shallow.id], "the subscription goes on"


async def test_an_identity_taken_by_another_event_is_refused_not_taken_for_the_alias(
    clock: ManualClock,
) -> None:
    """An alias is found again by its delivery identity (``namespace/id``, original Event id), but
    only an Event that is that alias (for the dependent Work, derived from the original) counts as
    one; any other Event holding the identity makes the alias refused and diagnosed
    (docs/architecture.md, "Dependency subscriptions and alias Events"). Here one impostor names the
    dependent Work but derives from nothing, another derives from its original but names no Work.
    Catches: an identity check that takes whatever holds the identity for the alias, or checks only
    one of the two (the alias would be lost without a word: the dependent never hears of the source
    Event, and nothing says why)."""
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.subscribe(d, spec())
        first = await rt.publish(ev("p1", "build.done", "p"))
        second = await rt.publish(ev("p2", "build.done", "p"))
        named = await rt.publish(
            EventIn(
                source="deps/d-on-p", delivery_id=first.id, type="build.done", scope=SCOPE, key="d", work_id=d
            )
        )
        derived = await rt.publish_derived(
            EventIn(source="deps/d-on-p", delivery_id=second.id, type="build.done", scope=SCOPE, key="x"),
            parent_id=second.id,
        )
        report = await rt.reconcile_subscriptions(10)
        assert (report.aliases, report.refused) == ((), (first.id, second.id))
        messages = [d.message for d in await rt.diagnostics(kind="alias_refused")]
        for impostor in (named, derived):
            assert any(f"its delivery identity is taken by event {impostor.id}" in m for m in messages)
        assert (await rt.subscription("deps", "d-on-p")).checkpoint_seq >= second.seq, "not retried"
        assert {a.id for a in await aliases_of(rt)} == {named.id, derived.id}


# -- cross-scope aliases --------------------------------------------------------------------------------


async def test_a_cross_scope_alias_needs_the_authorisers_consent(clock: ManualClock) -> None:
    async with host(clock) as rt:  # no plugin answers: a refusal
        await work_on(rt, "p", scope=WEB)
        d = await work_on(rt, "d")
        await rt.publish(ev("p1", "build.done", "p", scope=WEB))
        sub = await rt.subscribe(d, spec(source_scope=WEB))
        await rt.reconcile_subscriptions(10)
        assert await aliases_of(rt) == []
        stored = await rt.subscription("deps", "d-on-p")
        assert (sub.authorized, stored.authorized) == (False, False)
        assert "no loom_authorize_alias plugin answered" in (stored.reason or "")
        assert len(await rt.diagnostics(kind="alias_unauthorized")) == 1, "diagnosed once, not every pass"


async def test_an_authorised_cross_scope_alias_is_published_and_asked_outside_storage(
    clock: ManualClock,
) -> None:
    authorizer = Authorizer(True)
    async with host(clock, plugins=[authorizer]) as rt:
        await work_on(rt, "p", scope=WEB)
        d = await work_on(rt, "d")
        done = await rt.publish(ev("p1", "build.done", "p", scope=WEB))
        sub = await rt.subscribe(d, spec(source_scope=WEB))
        [alias] = await aliases_of(rt)
        assert (alias.delivery_id, alias.scope, alias.parent_id) == (done.id, SCOPE, done.id)
        assert authorizer.calls == [(WEB, SCOPE, "deps/d-on-p", sub.revision)]
        assert sub.authorized is True


async def test_authorisation_is_asked_again_on_every_pass(clock: ManualClock) -> None:
    authorizer = Authorizer(True)
    async with host(clock, plugins=[authorizer]) as rt:
        await work_on(rt, "p", scope=WEB)
        d = await work_on(rt, "d")
        await rt.subscribe(d, spec(source_scope=WEB))
        first = await rt.publish(ev("p1", "build.done", "p", scope=WEB))
        await rt.reconcile_subscriptions(10)
        authorizer.answer = False  # revoked
        second = await rt.publish(ev("p2", "build.done", "p", scope=WEB))
        await rt.reconcile_subscriptions(10)
        assert [a.delivery_id for a in await aliases_of(rt)] == [first.id], (
            "a revoked consent stops new aliases"
        )
        assert len(authorizer.calls) == 3, "asked at subscribe and on each pass"
        authorizer.answer = True
        await rt.reconcile_subscriptions(10)
        assert [a.delivery_id for a in await aliases_of(rt)] == [first.id, second.id], (
            "nothing was checkpointed while refused: the backlog follows the consent"
        )


async def test_the_kernel_publishes_only_under_an_answer_that_still_covers_the_subscription(
    clock: ManualClock,
) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p", scope=WEB)
        d = await work_on(rt, "d")
        await rt.publish(ev("p1", "build.done", "p", scope=WEB))
        sub = await rt.subscribe(d, spec(source_scope=WEB))
        granted = AliasAuthorization(
            namespace=sub.namespace, id=sub.id, revision=sub.revision, source_scope=WEB,
            target_scope=SCOPE, allowed=True, reason="test",
        )  # fmt: skip
        storage = storage_of(rt)
        for stale in (
            attrs.evolve(granted, revision=sub.revision - 1),
            attrs.evolve(granted, source_scope=SCOPE),
        ):
            result = await storage.submit(reconcile_in_tx, [sub], {sub.name: stale}, {}, CausalLimits())
            assert result.report.skipped == (sub.name,)
            assert await aliases_of(rt) == [], f"published under an answer about another snapshot: {stale}"
        await storage.submit(reconcile_in_tx, [sub], {sub.name: granted}, {}, CausalLimits())
        assert len(await aliases_of(rt)) == 1


async def test_a_same_scope_alias_needs_no_authorisation(clock: ManualClock) -> None:
    authorizer = Authorizer(False)
    async with host(clock, plugins=[authorizer]) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.publish(ev("p1", "build.done", "p"))
        await rt.subscribe(d, spec())
        assert len(await aliases_of(rt)) == 1
        assert authorizer.calls == []


# -- lifecycle: woken, cancelled, blocked and released, pending across a reopen -----------------------


async def test_a_subscription_declared_with_a_wait_wakes_it_and_then_emits_nothing(
    clock: ManualClock,
) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await park(rt, d, spec(types=("build.done",)))
        [pending] = await rt.subscriptions(d)
        assert pending.state is SubscriptionState.PENDING
        assert pending.wait_id == (await rt.waits(d))[-1].id
        await rt.publish(ev("p1", "build.done", "p"))
        report = await rt.reconcile_subscriptions(10)
        assert report.installed == ("deps/d-on-p",)
        assert len(report.aliases) == 1
        wait = (await rt.waits(d))[-1]
        assert (wait.state, wait.winner_event_id) == (WaitState.WOKEN, report.aliases[0]), (
            "the alias wakes the wait in its own transaction"
        )
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.WOKEN
        await rt.publish(ev("p2", "build.done", "p"))
        assert (await rt.reconcile_subscriptions(10)).visited == 0
        assert len(await aliases_of(rt)) == 1, "a woken subscription emits nothing"


async def test_a_cancelled_works_subscriptions_emit_nothing(clock: ManualClock) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.subscribe(d, spec())
        await rt.cancel(d)
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.CANCELLED
        await rt.publish(ev("p1", "build.done", "p"))
        await rt.reconcile_subscriptions(10)
        assert await aliases_of(rt) == []
        with pytest.raises(Conflict, match="cancelled"):
            await rt.subscribe(d, spec("again"))


async def test_a_completed_works_subscription_ends_at_its_next_visit(clock: ManualClock) -> None:
    """A subscription aliases only for Work that can still take input: a visit that finds its Work
    terminal (here completed, which, unlike a cancel, ends no subscription itself) cancels it, and it
    emits nothing. Catches: a visit that goes on scanning for terminal Work (aliases would keep being
    published for a completed Work, each one checkpointed as terminal)."""
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await rt.subscribe(d, spec())
        await rt.complete(await rt.claim(d, owner="host"), loom.Completed())
        assert (await rt.work(d)).state is loom.WorkState.COMPLETED
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.ACTIVE
        await rt.publish(ev("p1", "build.done", "p"))
        report = await rt.reconcile_subscriptions(10)
        assert (report.visited, report.aliases) == (1, ())
        assert await aliases_of(rt) == []
        ended = await rt.subscription("deps", "d-on-p")
        assert (ended.state, ended.reason) == (SubscriptionState.CANCELLED, "its work is completed")
        assert (await rt.reconcile_subscriptions(10)).visited == 0


async def test_a_visit_chosen_before_the_subscription_ended_emits_nothing(clock: ManualClock) -> None:
    """A reconcile pass rereads each subscription it was given and judges it as it is now: one whose
    wait woke since it was chosen emits nothing (docs/architecture.md: the wait's wake ends its
    subscriptions, and those emit nothing). Catches: a visit that acts on a subscription without
    checking its state (a woken one would alias the next source Event to its Work, which no longer
    waits on it)."""
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await park(rt, d, spec())
        [chosen] = await rt.subscriptions(d)
        await rt.publish(ev("p1", "build.done", "p"))
        assert len((await rt.reconcile_subscriptions(10)).aliases) == 1
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.WOKEN
        await rt.publish(ev("p2", "build.done", "p"))
        result = await storage_of(rt).submit(reconcile_in_tx, [chosen], {}, {}, CausalLimits())
        assert (result.report.installed, result.report.aliases) == ((), ())
        assert len(await aliases_of(rt)) == 1
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.WOKEN


async def test_a_blocked_wait_disables_its_subscriptions_and_the_release_rearms_them(
    clock: ManualClock,
) -> None:
    async with host(clock, causal={"max_depth": 1}) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await park(rt, d, spec())
        await rt.publish(ev("p1", "build.done", "p"))
        await rt.reconcile_subscriptions(10)  # the alias (depth 1) is accepted, its wake (depth 2) refused
        assert (await rt.waits(d))[-1].state is WaitState.BLOCKED
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.DISABLED
        await rt.publish(ev("p2", "build.done", "p"))
        assert (await rt.reconcile_subscriptions(10)).visited == 0
        assert len(await aliases_of(rt)) == 1, "a disabled subscription emits nothing"
        rt.reload(config())
        async with rt.watch() as notices:
            await rt.release(d)
            changed = []
            while not changed:
                changed = [n async for n in _batch(notices) if isinstance(n, SubscriptionChanged)]
        assert [(n.namespace, n.id) for n in changed] == [("deps", "d-on-p")], "the release rearms it"
        assert (await rt.waits(d))[-1].state is WaitState.WOKEN
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.WOKEN


async def _batch(notices: Any) -> AsyncIterator[object]:
    """The notices of one committed batch."""
    async for notice in notices:
        yield notice
        if isinstance(notice, loom.notices.Committed):
            return


async def test_a_pending_subscription_is_installed_by_the_actor_after_a_reopen(
    clock: ManualClock, tmp_path: Path
) -> None:
    """Declared with a wait and never reconciled before the store closed (as if the process died
    right after the waiting outcome): the subscriptions actor installs it at start."""
    store = str(tmp_path / "loom.db")
    async with host(clock, store=store) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await park(rt, d, spec())
        done = await rt.publish(ev("p1", "build.done", "p"))
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.PENDING
    async with host(clock, store=store, actors=("subscriptions",)) as rt:
        await rt.wait_idle()
        [alias] = await aliases_of(rt)
        assert alias.delivery_id == done.id
        assert (await rt.waits(d))[-1].winner_event_id == alias.id
        assert (await rt.subscription("deps", "d-on-p")).state is SubscriptionState.WOKEN


async def test_the_actor_publishes_aliases_as_source_events_arrive(loom_drivers: DriverFactory) -> None:
    async with loom_drivers(config=config()) as driver:
        rt = driver.runtime
        await rt.publish(ev("p0", "w.start", "p"))
        await rt.publish(ev("d0", "w.start", "d"))
        await driver.settle()
        await rt.subscribe(work_id_for_key(SCOPE, "d"), spec())
        done = await rt.publish(ev("p1", "build.done", "p"))

        async def aliased() -> bool:
            return len(await aliases_of(rt)) == 1

        await driver.until(aliased, "the alias of p1")
        assert (await aliases_of(rt))[0].delivery_id == done.id
        await driver.settle()
        assert len(await aliases_of(rt)) == 1


# -- failures at the plugin boundary ------------------------------------------------------------------


async def test_a_raising_filter_skips_only_its_subscription(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with host(clock, plugins=[Filters()]) as rt:
        await work_on(rt, "p")
        broken, fine = await work_on(rt, "d1"), await work_on(rt, "d2")
        await rt.subscribe(broken, spec("a-broken", filter_name="boom"))
        await rt.subscribe(fine, spec("b-fine", filter_name="at_least", filter={"min": 0}))
        failing = await rt.publish(ev("p1", "build.done", "p"))
        with caplog.at_level(logging.ERROR, logger="loom.subscriptions"):
            report = await rt.reconcile_subscriptions(10)
        assert len(report.aliases) == 1
        assert report.skipped == ("deps/a-broken",)
        assert len(await aliases_of(rt, "deps/b-fine")) == 1
        [record] = [r for r in caplog.records if "deps/a-broken" in r.getMessage()]
        assert record.exc_info is not None
        assert "the filter is broken" in str(record.exc_info[1])
        [diagnostic] = await rt.diagnostics(kind="subscription_failed")
        assert diagnostic.subject == "deps/a-broken"
        assert "the filter is broken" in diagnostic.message
        stored = await rt.subscription("deps", "a-broken")
        assert stored.checkpoint_seq < failing.seq, "neither the failing Event nor any after it is decided"
        await rt.reconcile_subscriptions(10)
        assert len(await rt.diagnostics(kind="subscription_failed")) == 1, "diagnosed once per reason"


@pytest.mark.parametrize(
    "answer", [RuntimeError("the authoriser is down"), "yes"], ids=["raises", "nonsense"]
)
async def test_a_failing_authoriser_skips_only_its_subscription(
    clock: ManualClock, caplog: pytest.LogCaptureFixture, answer: object
) -> None:
    async with host(clock, plugins=[Authorizer(answer)]) as rt:
        await work_on(rt, "p", scope=WEB)
        await work_on(rt, "p2")
        cross, same = await work_on(rt, "d1"), await work_on(rt, "d2")
        with caplog.at_level(logging.ERROR, logger="loom.subscriptions"):
            await rt.subscribe(cross, spec("a-cross", source_scope=WEB))
            await rt.subscribe(same, spec("b-same", source_key="p2"))
            await rt.publish(ev("p1", "build.done", "p", scope=WEB))
            await rt.publish(ev("p2-1", "build.done", "p2"))
            report = await rt.reconcile_subscriptions(10)
        assert report.skipped == ("deps/a-cross",)
        assert len(report.aliases) == 1
        assert await aliases_of(rt, "deps/a-cross") == []
        diagnostics = await rt.diagnostics(kind="subscription_failed")
        assert diagnostics
        assert all(d.subject == "deps/a-cross" for d in diagnostics)
        assert "loom_authorize_alias" in diagnostics[0].message
        assert any("deps/a-cross" in r.getMessage() for r in caplog.records)


# -- declarations ---------------------------------------------------------------------------------------


async def test_a_dependent_never_takes_the_source_key(clock: ManualClock) -> None:
    async with host(clock) as rt:
        p = await work_on(rt, "p")
        d = await work_on(rt, "d")
        with pytest.raises(
            InvalidRequest, match=rf"dependent_key: key 'p' is owned by work {p}, not by work {d}"
        ):
            await rt.subscribe(d, spec(), dependent_key="p")
        with pytest.raises(InvalidRequest, match=r"source_key: key 'd' is work .*'s own"):
            await rt.subscribe(d, spec(source_key="d"))
        assert await rt.subscriptions(d) == []


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"namespace": "a/b"}, "subscription.namespace"),
        ({"id": " padded"}, "subscription.id"),
        ({"source_key": "\x00"}, "subscription.source_key"),
        ({"source_scope": "not a scope"}, "subscription.source_scope"),
        ({"types": "build.*"}, "subscription.types"),
        ({"after": -1}, "subscription.after"),
        ({"filter": {"min": 1}}, "subscription.filter"),
        ({"filter_name": "f", "filter": {"x": float("nan")}}, "subscription.filter"),
        ({"label": 7}, "subscription.label"),
    ],
)
async def test_a_malformed_spec_is_refused_naming_its_field(
    clock: ManualClock, fields: dict[str, Any], field: str
) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        bad = SubscriptionSpec(**{"namespace": "deps", "id": "x", "source_key": "p", **fields})
        with pytest.raises(InvalidRequest, match=field):
            await rt.subscribe(d, bad)
        lease = await rt.claim(d, owner="host")
        with pytest.raises(InvalidRequest, match=r"wait\.subscriptions\[0\]"):
            await rt.wait(lease, WaitSpec(subscriptions=(bad,)))
        assert await rt.subscriptions(d) == []


async def test_an_identity_belongs_to_one_declaration(clock: ManualClock) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d, other = await work_on(rt, "d"), await work_on(rt, "o")
        first = await rt.subscribe(d, spec(label="one"))
        assert await rt.subscribe(d, spec(label="one")) == first, "subscribing again is idempotent"
        with pytest.raises(Conflict, match="another declaration"):
            await rt.subscribe(d, spec(label="two"))
        with pytest.raises(InvalidRequest, match=f"belongs to work {d}"):
            await rt.subscribe(other, spec(label="one"))


async def test_a_later_wait_declares_a_woken_subscription_again_keeping_its_checkpoint(
    clock: ManualClock,
) -> None:
    async with host(clock) as rt:
        await work_on(rt, "p")
        d = await work_on(rt, "d")
        await park(rt, d, spec())
        first = await rt.publish(ev("p1", "build.done", "p"))
        await rt.reconcile_subscriptions(10)
        await rt.poll()
        await park(rt, d, spec())  # attempt 2 waits on the same dependency
        again = await rt.subscription("deps", "d-on-p")
        assert again.state is SubscriptionState.PENDING
        assert again.checkpoint_seq >= first.seq
        second = await rt.publish(ev("p2", "build.done", "p"))
        await rt.reconcile_subscriptions(10)
        assert [a.delivery_id for a in await aliases_of(rt)] == [first.id, second.id]
        assert [w.state for w in await rt.waits(d)] == [WaitState.WOKEN, WaitState.WOKEN]


def test_the_subscription_lifecycle() -> None:
    S = SubscriptionState
    assert SUBSCRIPTION_LIFECYCLE.terminal(S.CANCELLED)
    assert not SUBSCRIPTION_LIFECYCLE.allows(S.WOKEN, S.ACTIVE), "a woken one is only ever declared again"
    assert not SUBSCRIPTION_LIFECYCLE.allows(S.DISABLED, S.ACTIVE), "a rearmed one is installed again"
    assert SUBSCRIPTION_LIFECYCLE.allows(S.DISABLED, S.PENDING)


async def test_subscribe_needs_an_existing_work(loom_driver: RuntimeDriver) -> None:
    with pytest.raises(loom.NotFound):
        await loom_driver.runtime.subscribe("wk_nope", spec())
