"""Retention and compaction through the runtime (docs/operations.md, "Retention"): what ended goes once
its scope's retention passed, a removed Event's identity keeps answering for it, a fired timer never
fires again, and nothing still referred to is removed. Each test names the wrong implementation it
catches. Crash points are in `test_crash_points_compaction`, the reference model in
`test_compaction_model`."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import loom
from loom import (
    Completed,
    Config,
    EventIn,
    FiringResult,
    ManualClock,
    NotFound,
    Runtime,
    TimerSpec,
    Waiting,
    WaitSpec,
    WaitState,
    open_runtime,
)
from loom.kernel.executions import BindingRef
from loom.records.compaction import CompactionReport
from loom.records.timers import FireRequest
from loom.store import Tx
from loom.testing import T0_MS
from loom.testing.internals import storage_of
from loom.testing.postgres import PostgresCluster

HOUR = 3_600_000
MINUTE = 60_000
LONG_LEASE = 24 * HOUR
SCOPE = "shop"


def config(
    retention: dict[str, Any] | None = None, scopes: dict[str, Any] | None = None, **more: Any
) -> Config:
    routes = [
        {"name": "skip", "types": ["d.*"], "policy": "drop", "reason": "not for this work"},
        {"name": "orders", "types": ["order.*", "w.*", "tick"], "create_work": True},
    ]
    declared: dict[str, Any] = {SCOPE: {"routes": routes}, "other": {"routes": routes}}
    for name, extra in (scopes or {}).items():
        declared[name] = {**declared.get(name, {"routes": routes}), **extra}
    return Config.from_dict(
        {
            "retention": {"works": "1h", "events": "1h", "timers": "1h", **(retention or {})},
            "scopes": declared,
            **more,
        }
    )


def order(delivery_id: str, key: str = "o/1", *, type: str = "order.placed", scope: str = SCOPE) -> EventIn:
    return EventIn(source="shop", delivery_id=delivery_id, type=type, scope=scope, key=key, payload={"n": 1})


@asynccontextmanager
async def host(store: str, cfg: Config, clock: ManualClock, **kwargs: Any) -> AsyncIterator[Runtime]:
    async with open_runtime(store, clock=clock, config=cfg, actors=(), **kwargs) as rt:
        yield rt


async def finish(rt: Runtime, event: EventIn) -> str:
    """Accept, route, run and complete one Work for ``event``; its id."""
    await rt.publish(event)
    await rt.poll()
    work = await rt.work_for_key(event.key or "")
    lease = await rt.claim(work.id, owner="host")
    await rt.complete(lease, Completed())
    return work.id


async def later(rt: Runtime, clock: ManualClock, ms: int) -> CompactionReport:
    clock.advance(ms)
    return await rt.compact()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=T0_MS)


# -- dedup keeps its promise -------------------------------------------------------------------------------


async def test_a_redelivery_after_compaction_returns_the_original_sequence_and_is_not_accepted_again(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches: a dedup lookup that reads only the events table (the redelivery would be accepted again,
    with a new sequence), and a removal that leaves no tombstone."""
    async with host(loom_store, config(), clock) as rt:
        await finish(rt, order("d-1"))
        first = await rt.event_by_delivery("shop", "d-1")
        report = await later(rt, clock, 2 * HOUR)
        assert (report.events, report.works) == (1, 1), report
        with pytest.raises(NotFound):
            await rt.event(first.id)
        again = await rt.publish(order("d-1"))
        assert (again.id, again.seq, again.duplicate, again.compacted) == (first.id, first.seq, True, True)
        assert again.accepted_at_ms == first.accepted_at_ms
        assert [e.id for e in await rt.events(after_seq=first.seq)] == [], "nothing was accepted again"


async def test_the_dedup_window_ends_and_only_then_the_identity_is_accepted_anew(clock: ManualClock) -> None:
    """A finite dedup window: a tombstone answers until the window (counted from acceptance) ends; an
    Event removed after its window leaves none. Catches: tombstones that never expire, ones that expire
    early, and a tombstone written for an Event whose window already ended."""
    async with host(":memory:", config({"dedup": "3h"}), clock) as rt:
        await finish(rt, order("d-1"))
        first = await rt.event_by_delivery("shop", "d-1")
        await later(rt, clock, 2 * HOUR)
        assert (await rt.publish(order("d-1"))).compacted, "inside the window the tombstone answers"
        report = await later(rt, clock, 2 * HOUR)
        assert report.tombstones == 1
        anew = await rt.publish(order("d-1"))
        assert (anew.duplicate, anew.seq > first.seq) == (False, True)
    async with host(":memory:", config({"dedup": "30m"}), clock) as rt:
        await finish(rt, order("d-9"))
        late = await rt.event_by_delivery("shop", "d-9")
        report = await later(rt, clock, 2 * HOUR)
        assert (report.events, report.tombstones) == (1, 0)
        assert not (await rt.publish(order("d-9"))).duplicate, f"no tombstone was due for {late.id}"


# -- per scope, with inheritance -----------------------------------------------------------------------


def test_each_setting_is_inherited_on_its_own_from_the_nearest_scope_that_declares_it() -> None:
    """Catches: a scope's retention taken as a whole (an undeclared setting would not come from its
    ancestor), the farthest ancestor winning, and an undeclared scope not getting the global table."""
    cfg = config(
        {"works": "2h"},
        scopes={
            "acme": {"retention": {"events": "forever", "works": "3h"}},
            "acme/web": {"retention": {"works": "30m"}},
        },
    )
    web = cfg.retention_in("acme/web/checkout")
    assert (web.works_ms, web.events_ms) == (30 * MINUTE, loom.config.retention.FOREVER)
    assert cfg.retention_in("acme").works_ms == 3 * HOUR
    other = cfg.retention_in("other")
    assert (other.works_ms, other.events_ms, other.attempt_logs_ms) == (2 * HOUR, HOUR, 7 * 24 * HOUR)


async def test_what_ends_in_a_scope_follows_its_retention(clock: ManualClock) -> None:
    """Catches: one retention for every scope."""
    cfg = config(scopes={SCOPE: {"retention": {"events": "forever", "works": "3h"}}})
    async with host(":memory:", cfg, clock) as rt:
        kept = await finish(rt, order("a", key="o/1"))
        gone = await finish(rt, order("b", key="o/2", scope="other"))
        await later(rt, clock, 2 * HOUR)
        assert (await rt.work(kept)).id == kept
        with pytest.raises(NotFound):
            await rt.work(gone)
        assert [e.delivery_id for e in await rt.events()] == ["a"]


# -- nothing still referred to is removed --------------------------------------------------------------


async def test_an_event_not_routed_yet_or_still_pending_is_never_removed(clock: ManualClock) -> None:
    """Catches: compaction by age alone (an unrouted Event, or a held Work's pending input, would go)."""
    async with host(":memory:", config(), clock) as rt:
        held = await rt.publish(order("held", key="o/held"))
        await rt.poll()
        await rt.hold((await rt.work_for_key("o/held")).id, reason="waiting for stock")
        unrouted = await rt.publish(order("late", key="o/late"))
        report = await later(rt, clock, 2 * HOUR)
        assert [(await rt.event(e.id)).id for e in (held, unrouted)] == [held.id, unrouted.id]
        assert report.kept >= 1
        await rt.poll()
        assert (await rt.work_for_key("o/late")).pending_inputs == (unrouted.id,)


class Exploding:
    """A route handler that fails: its Event is checkpointed ``unrouted`` for an operator's replay."""

    @loom.hookimpl
    def loom_route_handlers(self) -> dict[str, Any]:
        return {"exploding": self.exploding}

    def exploding(self, event: Any, scope: str, work: Any, route: Any) -> Any:
        raise RuntimeError("handler exploded")


async def test_an_event_stopped_unrouted_stays_for_the_operators_replay(clock: ManualClock) -> None:
    """Catches: removing an Event whose routing stopped with a diagnostic (a replay would find nothing)."""
    cfg = config(scopes={"ops": {"routes": [{"name": "x", "types": ["x.*"], "handler": "exploding"}]}})
    async with host(":memory:", cfg, clock, plugins=[Exploding()]) as rt:
        stuck = await rt.publish(order("x", key="o/x", type="x.boom", scope="ops"))
        await rt.poll()
        assert (await rt.checkpoint(stuck.id)).status is loom.CheckpointStatus.UNROUTED
        await later(rt, clock, 2 * HOUR)
        assert (await rt.event(stuck.id)).id == stuck.id


async def test_a_running_attempts_trigger_and_what_it_may_still_wait_on_are_kept(clock: ManualClock) -> None:
    """A live attempt may register a wait later, from its watermark: an Event on its Work's key after that
    (here one a drop route routed elsewhere) must still be there for the wait to find. Catches: a rule
    that protects only open waits (the wait registered after compaction would never wake)."""
    async with host(":memory:", config(), clock) as rt:
        await rt.publish(order("start"))
        await rt.poll()
        work = await rt.work_for_key("o/1")
        lease = await rt.claim(work.id, owner="host", lease_ms=LONG_LEASE)
        dropped = await rt.publish(order("aside", type="d.note"))
        await rt.poll()
        await later(rt, clock, 2 * HOUR)
        assert (await rt.event(dropped.id)).id == dropped.id
        assert (await rt.event(lease.request.inputs[0].id)).id, "the trigger of a live attempt stays"
        await rt.complete(lease, Waiting(wait=WaitSpec(types=("d.*",))))
        (wait,) = await rt.waits(work.id)
        assert (wait.state, wait.winner_event_id) == (WaitState.WOKEN, dropped.id)


async def test_an_open_subscriptions_cursor_keeps_what_it_has_not_decided(clock: ManualClock) -> None:
    """Catches: compaction that ignores subscription checkpoints (the alias would never be published)."""
    async with host(":memory:", config(), clock) as rt:
        await rt.publish(order("dep", key="o/dep"))
        await rt.poll()
        dependent = await rt.work_for_key("o/dep")
        spec = loom.SubscriptionSpec(namespace="test", id="src", source_key="o/src", types=("d.*",))
        await rt.subscribe(dependent.id, spec)
        await rt.reconcile_subscriptions()
        source = await rt.publish(order("src-1", key="o/src", type="d.built"))  # routed aside, no input
        await rt.poll()
        await later(rt, clock, 2 * HOUR)
        assert (await rt.event(source.id)).id == source.id
        await rt.reconcile_subscriptions()
        aliases = [e for e in await rt.events() if e.source == "test/src"]
        assert len(aliases) == 1


async def test_an_armed_timer_keeps_the_work_it_names_and_the_event_it_derives_from(
    clock: ManualClock,
) -> None:
    """Catches: a finished Work removed while a timer will still deliver to it (its firing would be
    refused as naming no Work instead of routed to the finished Work)."""
    async with host(":memory:", config(), clock) as rt:
        work_id = await finish(rt, order("a"))
        spec = TimerSpec(
            id="remind", fire_at_ms=T0_MS + 10 * HOUR, source="shop", type="order.remind", scope=SCOPE,
            work_id=work_id,
        )  # fmt: skip
        await rt.arm(spec)
        report = await later(rt, clock, 2 * HOUR)
        assert (await rt.work(work_id)).id == work_id
        assert report.kept >= 1
        await later(rt, clock, 9 * HOUR)
        (firing,) = (await rt.poll()).firings
        assert firing.result is FiringResult.ACCEPTED


# -- timers -------------------------------------------------------------------------------------------------


async def test_a_fired_timer_removed_by_compaction_never_fires_again_and_rearming_goes_on_from_its_revision(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches: a removed timer that leaves no revision behind (arming the id again would start at
    revision 1 and fire with the first firing's delivery identity: refused as a duplicate, the timer
    invalid)."""
    async with host(loom_store, config(), clock) as rt:
        spec = TimerSpec(
            id="t1", fire_at_ms=T0_MS + MINUTE, source="shop", type="tick", scope=SCOPE, key="o/t"
        )
        await rt.arm(spec)
        clock.advance(MINUTE)
        (fired,) = (await rt.poll()).firings
        report = await later(rt, clock, 2 * HOUR)
        assert (report.timers, report.firings) == (1, 1)
        with pytest.raises(NotFound):
            await rt.timer("t1")
        stale = await rt.fire(FireRequest(timer_id="t1", revision=1, fire_at_ms=T0_MS + MINUTE))
        assert (stale.result, stale.event_id) == (FiringResult.STALE, None)
        again = await rt.arm(attrs.evolve(spec, fire_at_ms=clock.now_ms() + MINUTE))
        assert (again.revision, again.delivery_id) == (2, "t1@r2")
        clock.advance(MINUTE)
        (refired,) = (await rt.poll()).firings
        assert refired.result is FiringResult.ACCEPTED
        assert refired.event_id != fired.event_id


async def test_a_recurring_timers_old_ledger_entries_go_and_their_occurrences_stay_answered(
    clock: ManualClock,
) -> None:
    """Catches: a ledger that grows with every occurrence, and an old occurrence that fires again once its
    ledger entry is gone."""
    async with host(":memory:", config(), clock) as rt:
        spec = TimerSpec(
            id="every", fire_at_ms=T0_MS + 10 * MINUTE, source="shop", type="tick", scope=SCOPE, key="o/t",
            interval_ms=10 * MINUTE,
        )  # fmt: skip
        await rt.arm(spec)
        for _ in range(18):
            clock.advance(10 * MINUTE)
            await rt.poll()
        first = (await rt.firings("every"))[0]
        await rt.compact()
        left = await rt.firings("every")
        assert 0 < len(left) < 18
        assert all(f.at_ms + HOUR > clock.now_ms() for f in left)
        stale = await rt.fire(FireRequest(timer_id="every", revision=1, fire_at_ms=first.fire_at_ms))
        assert stale.result is FiringResult.STALE
        occurrence = await rt.publish(
            EventIn(
                source="shop", delivery_id=f"every@{first.fire_at_ms}", type="tick", scope=SCOPE, key="o/t"
            )
        )
        assert (occurrence.duplicate, occurrence.id) == (True, first.event_id)


# -- finished Work -----------------------------------------------------------------------------------------


async def test_a_removed_works_key_starts_a_new_work_whose_own_events_are_its_own(clock: ManualClock) -> None:
    """The finished Work waited once (its wake's bridge has an identity derived from its id). After it is
    removed, its key starts a new Work, which waits and wakes too. Catches: giving the new Work the removed
    one's id (its wake's bridge would be answered by the old bridge's tombstone, and nothing continues)."""
    async with host(":memory:", config(), clock) as rt:
        old = await waited_once(rt, "1")
        report = await later(rt, clock, 2 * HOUR)
        assert (report.works, report.attempts) == (1, 2)
        with pytest.raises(NotFound):
            await rt.work(old)
        new = await waited_once(rt, "2")
        assert new != old
        bridges = [e for e in await rt.events() if e.type == "core.wait.woken"]
        assert [b.work_id for b in bridges] == [new]


async def waited_once(rt: Runtime, n: str) -> str:
    """A Work on ``o/1`` whose first attempt waits for ``w.go``, is woken, and whose continuation completes."""
    await rt.publish(order(f"start-{n}"))
    await rt.poll()
    work = await rt.work_for_key("o/1")
    first = await rt.claim(work.id, owner="host")
    await rt.complete(first, Waiting(wait=WaitSpec(types=("w.go",))))
    await rt.publish(order(f"go-{n}", type="w.go"))
    await rt.poll()
    second = await rt.claim(work.id, owner="host")
    await rt.complete(second, Completed())
    assert (await rt.work(work.id)).state.terminal
    return work.id


async def test_a_work_with_a_running_parent_or_a_running_child_is_kept(clock: ManualClock) -> None:
    """Catches: removing a child while its parent runs (create_child by the same name would make it
    again) and removing a parent before its children (a child would name a Work that is gone)."""
    async with host(":memory:", config(), clock) as rt:
        await rt.publish(order("p"))
        await rt.poll()
        parent = await rt.work_for_key("o/1")
        lease = await rt.claim(parent.id, owner="host", lease_ms=LONG_LEASE)
        toolbelt = rt.toolbelt(lease, lease_ms=LONG_LEASE)
        done = await toolbelt.create_child("done")
        running = await toolbelt.create_child("running")
        await rt.cancel(done.id)
        await later(rt, clock, 2 * HOUR)
        assert (await toolbelt.create_child("done")).id == done.id, "the running parent's child stays"
        await rt.complete(lease, Completed())
        report = await later(rt, clock, 2 * HOUR)
        assert report.works == 1, "only the finished child: the parent has a running child"
        assert (await rt.work(parent.id)).id == parent.id
        await rt.cancel(running.id)
        report = await later(rt, clock, 2 * HOUR)
        report += await rt.compact()  # the parent is looked at again once its last child is gone
        assert report.works == 2
        with pytest.raises(NotFound):
            await rt.work(parent.id)


async def test_a_standing_works_old_attempts_go_and_its_latest_stays(clock: ManualClock) -> None:
    """Catches: a long-lived Work whose attempts pile up forever, and trimming its latest attempt (the
    next attempt carries on its binding)."""
    cfg = config(work_kinds={"always": {"standing": True}})
    cfg = Config.from_dict(
        {**cfg.to_dict(), "scopes": {SCOPE: {"routes": [{"name": "t", "types": ["tick"], "create_work": True,
                                                         "work_kind": "always"}]}}}
    )  # fmt: skip
    async with host(":memory:", cfg, clock) as rt:
        for n in range(3):
            await rt.publish(order(f"tick-{n}", type="tick"))
            await rt.poll()
            work = await rt.work_for_key("o/1")
            await rt.complete(await rt.claim(work.id, owner="host"), Completed())
            clock.advance(HOUR)
        report = await rt.compact()
        executions = (await rt.history(work.id)).executions
        assert report.attempts == 2
        assert [x.attempt for x in executions] == [3]
        await rt.publish(order("tick-3", type="tick"))
        await rt.poll()
        assert (await rt.claim(work.id, owner="host")).attempt == 4


# -- the rest of what grows ----------------------------------------------------------------------------


async def test_diagnostics_causal_buckets_and_ended_budget_windows_expire(clock: ManualClock) -> None:
    """Catches: any of them kept forever."""
    cfg = config(
        {"diagnostics": "1h"},
        budgets=[{"name": "daily", "unit": "turns", "limit": 100, "per": "scope", "window": "day"}],
        causal={"max_depth": 1},
    )
    async with host(":memory:", cfg, clock) as rt:
        await finish(rt, order("a"))
        root = await rt.event_by_delivery("shop", "a")
        child = await rt.publish_derived(order("child", key="o/9"), parent_id=root.id)
        with pytest.raises(loom.CausalRefused):
            await rt.publish_derived(order("grandchild", key="o/9"), parent_id=child.id)
        assert await rt.budget_ledgers(budget="daily")
        assert await rt.causal_rejections()
        report = await later(rt, clock, 2 * 24 * HOUR)
        assert (report.buckets >= 1, report.ledgers, report.diagnostics) == (True, 1, 1)
        assert await rt.budget_ledgers(budget="daily") == []
        assert await rt.causal_rejections() == []


async def test_a_roots_pinned_limits_go_with_the_last_event_of_the_root(
    loom_store: str, clock: ManualClock
) -> None:
    """A root is found by its id and its descendants by the root's index. Catches: a look for what is
    left of a root that searches only the index (the pin would go while the root itself stays) or only
    the root's id (it would go with the root while a descendant stays)."""

    async def pinned() -> set[str]:
        def roots(tx: Tx, now_ms: int) -> set[str]:
            return {root for root in (kept.id, older.id) if tx.causal_root_limits(root) is not None}

        return await storage_of(rt).submit(roots)

    async with host(loom_store, config(causal={"max_depth": 8}), clock) as rt:
        kept = await rt.publish(order("kept"))  # a live Work's input: it stays
        await rt.poll()
        dropped = await rt.publish_derived(order("d-child", key="n/1", type="d.note"), parent_id=kept.id)
        older = await rt.publish(order("older", key="n/2", type="d.note"))
        await rt.poll()
        clock.advance(50 * MINUTE)
        younger = await rt.publish_derived(order("d-younger", key="n/3", type="d.note"), parent_id=older.id)
        await rt.poll()
        assert await pinned() == {kept.id, older.id}
        report = await later(rt, clock, 20 * MINUTE)  # past retention: ``dropped`` and ``older``
        assert report.events == 2, report
        for gone in (dropped, older):
            with pytest.raises(NotFound):
                await rt.event(gone.id)
        assert await pinned() == {kept.id, older.id}, "each root still has an Event"
        assert (await rt.event(younger.id)).root_id == older.id
        await later(rt, clock, 60 * MINUTE)
        assert await pinned() == {kept.id}, "the last Event of ``older``'s root went"


# -- attempt logs ------------------------------------------------------------------------------------------


class Forgetful:
    """An executor the host runs itself, that keeps logs and forgets them when asked."""

    capabilities = frozenset[str]()

    def __init__(self, *, fail: bool = False) -> None:
        self.forgotten: list[str] = []
        self.fail = fail

    @loom.hookimpl
    def loom_executors(self) -> dict[str, Any]:
        return {"keeper": self}

    async def launch(self, request: Any, toolbelt: Any) -> Any:  # pragma: no cover - the host runs it
        raise AssertionError("run by the host")

    async def forget(self, execution_id: str, metadata: Any) -> None:
        self.forgotten.append(execution_id)
        if self.fail:
            raise OSError("permission denied")


async def test_an_executor_forgets_an_attempts_logs_before_its_row_goes(clock: ManualClock) -> None:
    """Catches: removing an attempt whose executor still keeps its logs (they would be orphaned), asking
    before the attempt_logs retention passed, and asking twice."""
    cfg = config({"attempt_logs": "3h"})
    keeper = Forgetful()
    async with host(":memory:", cfg, clock, plugins=[keeper]) as rt:
        await rt.publish(order("a"))
        await rt.poll()
        work = await rt.work_for_key("o/1")
        lease = await rt.claim(work.id, owner="host", binding=BindingRef(name=None, executor="keeper"))
        await rt.complete(lease, Completed())
        report = await later(rt, clock, 2 * HOUR)
        assert (keeper.forgotten, report.works) == ([], 0)
        report = await later(rt, clock, 2 * HOUR)
        assert keeper.forgotten == [lease.execution_id]
        assert (report.logs, report.works) == (1, 1)
        await later(rt, clock, 2 * HOUR)
        assert keeper.forgotten == [lease.execution_id]


async def test_an_executor_that_fails_to_forget_is_contained_with_a_diagnostic(clock: ManualClock) -> None:
    """Catches: a failing plugin that stops compaction (or the runtime), or that is asked again forever."""
    keeper = Forgetful(fail=True)
    async with host(":memory:", config({"attempt_logs": "1h"}), clock, plugins=[keeper]) as rt:
        await rt.publish(order("a"))
        await rt.poll()
        work = await rt.work_for_key("o/1")
        lease = await rt.claim(work.id, owner="host", binding=BindingRef(name=None, executor="keeper"))
        await rt.complete(lease, Completed())
        report = await later(rt, clock, 2 * HOUR)
        await later(rt, clock, 2 * HOUR)
        assert keeper.forgotten == [lease.execution_id]
        assert report.works == 1
        (diagnostic,) = await rt.diagnostics(kind="forget_failed")
        assert diagnostic.subject == lease.execution_id
        assert "permission denied" in diagnostic.message


# -- dry runs and space ----------------------------------------------------------------------------------


async def test_a_dry_run_says_what_a_sweep_would_remove_and_removes_nothing(clock: ManualClock) -> None:
    """Catches: a dry run that writes (rows or cursors)."""
    async with host(":memory:", config(), clock) as rt:
        for n in range(3):
            await finish(rt, order(f"d-{n}", key=f"o/{n}"))
        clock.advance(2 * HOUR)
        before = await rt.store_size()
        dry = await rt.compact(dry_run=True)
        assert (await rt.store_size()).rows == before.rows
        assert (dry.dry_run, dry.works) == (True, 3)
        real = await rt.compact()
        assert real.works == dry.works
        assert (await rt.store_size()).rows["works"] == 0


async def test_a_dry_run_counts_what_the_sweep_removes_row_for_row(clock: ManualClock) -> None:
    """With attempt logs past their retention, a sweep has their executors forget them first, and the
    attempts, their Works and the Events only those referred to go in the same sweep. Catches a dry run
    that counts a Work as kept because its attempt's logs are not forgotten yet, and one that keeps the
    Events only a Work it would remove refers to (seen: works 0, events 0, kept 6 where the sweep
    removed 3 Works, 3 Events, 3 attempts)."""
    app = loom.App()

    @app.function("f")
    async def f(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> str:
        return "ok"

    retention = {name: "1s" for name in ("works", "events", "timers", "attempt_logs", "diagnostics")}
    cfg = loom.Config.from_dict({
        "retention": retention,
        "scopes": {SCOPE: {"bindings": {"w": {"executor": "python", "config": {"function": "f"}}},
                           "routes": [{"name": "r", "create_work": True, "binding": "w"}]}},
    })  # fmt: skip
    async with loom.open_runtime(
        ":memory:", config=cfg, clock=clock, plugins=[app], actors=("router",)
    ) as rt:
        for n in range(3):
            await rt.publish(order(f"d-{n}", key=f"o/{n}"))
        await rt.wait_idle()
        clock.advance(60_000)
        dry = await rt.compact(dry_run=True)
        real = await rt.compact()
    counted = ("events", "works", "attempts", "logs", "timers", "diagnostics", "kept")
    assert {k: getattr(dry, k) for k in counted} == {k: getattr(real, k) for k in counted}
    assert (real.works, real.events, real.attempts, real.logs) == (3, 3, 3, 3)


async def test_compaction_gives_freed_space_back_to_the_file_system(
    tmp_path: Any, clock: ManualClock
) -> None:
    """A new file is made with incremental vacuum. Catches: freed pages kept in the file forever."""
    store = str(tmp_path / "loom.db")
    async with host(store, config(), clock) as rt:
        for n in range(300):
            await rt.publish(EventIn(source="s", delivery_id=f"d-{n}", type="nobody.listens", scope=SCOPE,
                                     payload={"blob": "x" * 2000}))  # fmt: skip
        await rt.poll(limit=1000)
        grown = (await rt.store_size()).bytes
        report = await later(rt, clock, 2 * HOUR)
        assert report.events == 300
        assert report.released_bytes > 0
        assert (await rt.store_size()).bytes < grown - 300 * 2000 // 2


def test_vacuum_gives_a_file_made_without_incremental_vacuum_the_setting(tmp_path: Any) -> None:
    """Catches: a file made by an earlier loom never shrinking (auto_vacuum can only be set by a VACUUM)."""
    path = str(tmp_path / "old.db")
    store = loom.SQLiteStore(path=path)
    store.close_writer(store.open_writer())
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (0,)
    store.vacuum()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)


# -- several nodes -----------------------------------------------------------------------------------------


async def test_nodes_compacting_at_once_divide_the_work_and_remove_each_row_once(
    loom_postgres: PostgresCluster, clock: ManualClock
) -> None:
    """Two nodes sweep one database at the same time, in small pages. Catches: candidates taken without
    row locks (both nodes would remove, and count, the same rows: the counts would add up to more than
    there was), and a sweep that waits for the other node's instead of taking other rows."""
    url = loom_postgres.create_database(template=loom_postgres.migrated_template())
    async with host(url, config(), clock) as rt:
        for n in range(60):
            await rt.publish(order(f"d-{n}", key=f"o/{n}", type="nobody.listens"))
        for n in range(20):
            await finish(rt, order(f"w-{n}", key=f"w/{n}"))
        await rt.poll(limit=1000)
    clock.advance(2 * HOUR)
    reports: list[CompactionReport] = []
    async with host(url, config(), clock) as a, host(url, config(), clock) as b:

        async def sweep(rt: Runtime) -> None:
            reports.append(await rt.compact(limit=3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sweep, a)
            nursery.start_soon(sweep, b)
        reports.append(await a.compact())
        assert sum(r.events for r in reports) == 80
        assert sum(r.works for r in reports) == 20
        assert all(r.removed > 0 for r in reports[:2]), f"one node did all the work: {reports}"
        assert (await a.store_size()).rows["events"] == 0
        for n in range(60):
            assert (await b.publish(order(f"d-{n}", key=f"o/{n}", type="nobody.listens"))).compacted


async def test_a_sweep_takes_each_step_once_round_and_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows a step keeps stay at its head, so its rounds alternate a full page and an end; two such steps
    out of step never end a round in the same pass. The sweep tells each pass which steps went round
    already (`CompactRequest.finished`), and ends once both have. Catches: a sweep that does not pass
    them on (here it runs until the stand-in gives up, 50 passes)."""
    from loom.actors import compactor
    from loom.kernel.compaction import CompactPass, CompactRequest

    asked: list[frozenset[str]] = []

    def two_steps_out_of_step(tx: Tx, now_ms: int, req: CompactRequest) -> CompactPass:
        asked.append(req.finished)
        n = len(asked)
        ended = {"attempts": n % 2 == 0, "events": n % 2 == 1}  # never both in one pass
        ran = [step for step in ended if step not in req.finished]
        more = n < 50 and any(not ended[step] for step in ran)
        report = CompactionReport(kept=1, more=more)
        return CompactPass(report=report, cursors={}, finished=frozenset(s for s in ran if ended[s]))

    monkeypatch.setattr(compactor, "compact_in_tx", two_steps_out_of_step)
    async with loom.open_runtime(":memory:", load_entry_points=False, actors=()) as rt:
        report = await compactor.sweep(storage_of(rt), loom.Config(), {}, limit=10)
    assert asked == [frozenset(), frozenset({"events"})]
    assert report.kept == 2
