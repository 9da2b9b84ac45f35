"""Routing through the runtime (docs/concepts.md "Work": routing and ownership, and the
``drop`` policy), on SQLite ``:memory:`` and on a file.

Route handlers under test are registered as a plugin, exactly as a third party would. Tests wait for the
router with `RouterPool.wait_idle`, or (while a handler is deliberately blocked, so the router is never idle)
on commit notices; never on time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
import trio

import loom
from loom import (
    CausalLimits,
    Config,
    ConfigError,
    Conflict,
    Event,
    EventIn,
    InvalidRequest,
    ManualClock,
    NotFound,
    Runtime,
    open_runtime,
)
from loom.kernel.executions import BindingRef
from loom.kernel.resolve import RouteRequest
from loom.kernel.routing import (
    OutOfOrder,
    RouteResult,
    route_in_tx,
    successor_key,
)
from loom.plugins.handlers import correlate, work_id_for_key
from loom.plugins.python_executor import PythonExecutor
from loom.records.core_events import WORK_CREATED
from loom.records.work import Checkpoint, CheckpointStatus, Completed, Deliver, Policy, Work, WorkState
from loom.testing import T0_MS, FakeExecutor
from loom.testing.internals import storage_of

T0 = T0_MS
SCOPE = "acme/web"
STALL_S = 10  # only detects a stalled test; nothing waits on time


def ev(delivery_id: str, *, type: str = "pr.opened", key: str | None = None, **fields: Any) -> EventIn:
    values: dict[str, Any] = {"source": "github", "scope": SCOPE, **fields}
    return EventIn(delivery_id=delivery_id, type=type, key=key, **values)


def config(*routes: dict[str, Any], **scope: Any) -> Config:
    """One scope with ``routes``; ``work_kinds`` goes to the root, anything else to the scope."""
    work_kinds = scope.pop("work_kinds", {})
    return Config.from_dict({"scopes": {SCOPE: {"routes": list(routes), **scope}}, "work_kinds": work_kinds})


MAIN = {"name": "main", "create_work": True}
SLOW = {"name": "slow", "types": ["slow"], "handler": "blocking"}


class Handlers:
    """Route handlers for the tests: one that counts, one that raises, one that blocks until released."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.entered = trio.Event()
        self.release = trio.Event()

    @loom.hookimpl
    def loom_route_handlers(self) -> dict[str, Any]:
        return {"counting": self.counting, "raising": self.raising, "blocking": self.blocking}

    def counting(self, event: Event, scope: str, work: Work | None, route: Any) -> Any:
        self.calls.append(("counting", event.id))
        return correlate(event, scope, work, route)

    def raising(self, event: Event, scope: str, work: Work | None, route: Any) -> Any:
        self.calls.append(("raising", event.id))
        raise RuntimeError("handler exploded")

    async def blocking(self, event: Event, scope: str, work: Work | None, route: Any) -> Any:
        self.calls.append(("blocking", event.id))
        self.entered.set()
        await self.release.wait()
        return correlate(event, scope, work, route)


OpenRuntime = Callable[..., AbstractAsyncContextManager[Runtime]]


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
def open_rt(loom_store: str, clock: ManualClock, handlers: Handlers) -> OpenRuntime:
    @asynccontextmanager
    async def opener(cfg: Config, *plugins: object) -> AsyncIterator[Runtime]:
        async with open_runtime(
            loom_store, clock=clock, config=cfg, plugins=[handlers, *plugins], load_entry_points=False
        ) as rt:
            yield rt

    return opener


async def publish(rt: Runtime, *events: EventIn) -> list[Event]:
    """Publish in order and wait until the router has handled every one."""
    accepted = [await rt.publish(event) for event in events]
    await rt.wait_idle()
    return accepted


async def checkpoint(rt: Runtime, event: Event) -> Checkpoint:
    found = await rt.checkpoint(event.id)
    assert found is not None, f"event {event.id} ({event.delivery_id}) has no routing checkpoint"
    return found


async def until(rt: Runtime, check: Callable[[], Awaitable[bool]]) -> None:
    """Wait on commit notices (never on time) until ``check()`` holds."""
    async with rt.watch() as notices:
        with trio.fail_after(STALL_S):
            while not await check():
                await notices.__anext__()


def routed_to(rt: Runtime, event: Event) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await rt.checkpoint(event.id) is not None

    return check


async def route_directly(rt: Runtime, event: Event, decision: Deliver, expected_revision: int | None) -> Any:
    request = RouteRequest(
        event_id=event.id, decision=decision, route=None, expected_revision=expected_revision, generation=1
    )
    return await storage_of(rt).submit(route_in_tx, request, CausalLimits())


# -- first match ------------------------------------------------------------------------------------------


async def test_an_event_no_route_matches_is_checkpointed_unmatched_and_kept(open_rt: OpenRuntime) -> None:
    async with open_rt(config({"name": "issues", "types": ["issue.*"], "create_work": True})) as rt:
        [event] = await publish(rt, ev("d-1", key="pr/1"))
        cp = await checkpoint(rt, event)
        assert cp.status is CheckpointStatus.UNMATCHED
        assert (cp.work_id, cp.route, cp.reason) == (None, None, "no route matched")
        assert await rt.event(event.id) == event
        assert await rt.works() == []
        with pytest.raises(NotFound):
            await rt.work_for_key("pr/1")


async def test_an_uncorrelated_event_never_goes_to_whichever_work_exists(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        await publish(rt, ev("d-1", key="pr/1"))
        [loose] = await publish(rt, ev("d-2"))
        cp = await checkpoint(rt, loose)
        assert cp.status is CheckpointStatus.UNMATCHED
        assert cp.work_id is None
        assert len(await rt.works()) == 1


async def test_the_first_matching_route_decides_and_later_routes_are_not_tried(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    cfg = config(
        {"name": "prs", "types": ["pr.*"], "create_work": True}, {"name": "later", "handler": "counting"}
    )
    async with open_rt(cfg) as rt:
        pr, issue = await publish(rt, ev("d-1", key="pr/1"), ev("d-2", type="issue.opened", key="issue/1"))
        cp = await checkpoint(rt, pr)
        assert (cp.status, cp.route, cp.route_scope) == (CheckpointStatus.ROUTED, "prs", SCOPE)
        # the later route's handler ran for the event only it matches, never for the first route's
        assert handlers.calls == [("counting", issue.id)]
        assert (await checkpoint(rt, issue)).route == "later"


async def test_a_first_match_that_decides_unmatched_still_stops_evaluation(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    cfg = config({"name": "known-prs", "types": ["pr.*"]}, {"name": "later", "handler": "counting"})
    async with open_rt(cfg) as rt:
        [pr] = await publish(rt, ev("d-1", key="pr/1"))
        cp = await checkpoint(rt, pr)
        assert (cp.status, cp.route) == (CheckpointStatus.UNMATCHED, "known-prs")
        assert "no work owns key 'pr/1'" in (cp.reason or "")
        assert handlers.calls == []


async def test_a_drop_route_commits_an_audited_drop_and_creates_no_work(open_rt: OpenRuntime) -> None:
    mute = {"name": "mute", "types": ["bot.*"], "policy": "drop", "reason": "bots are muted"}
    async with open_rt(config(mute, MAIN)) as rt:
        [bot] = await publish(rt, ev("d-1", type="bot.comment", key="pr/1", payload={"body": "hi"}))
        cp = await checkpoint(rt, bot)
        assert cp.status is CheckpointStatus.DROP
        assert (cp.route, cp.route_scope, cp.generation, cp.reason) == ("mute", SCOPE, 1, "bots are muted")
        assert cp.policy is Policy.DROP
        assert cp.work_id is None
        assert await rt.works() == []
        assert await rt.event(bot.id) == bot  # the envelope is kept for audit

        # replaying the delivery is a no-op: same Event, same checkpoint, still no Work
        again = await rt.publish(ev("d-1", type="bot.comment", key="pr/1", payload={"body": "hi"}))
        await rt.wait_idle()
        assert again.duplicate
        assert again.id == bot.id
        assert await checkpoint(rt, bot) == cp
        assert await rt.events() == [bot]
        assert await rt.works() == []

        # so is re-applying a routing decision to it
        result = await route_directly(rt, bot, Deliver(work_id="wk_other", create=True), None)
        assert result.replay
        assert result.checkpoint == cp
        assert await rt.works() == []


async def test_a_raising_handler_leaves_the_event_unrouted_with_a_diagnostic(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    cfg = config({"name": "boom", "handler": "raising"}, {"name": "later", "handler": "counting"})
    async with open_rt(cfg) as rt:
        [event] = await publish(rt, ev("d-1", key="pr/1"))
        cp = await checkpoint(rt, event)
        assert (cp.status, cp.route, cp.work_id) == (CheckpointStatus.UNROUTED, "boom", None)
        assert "handler exploded" in (cp.reason or "")
        [diagnostic] = await rt.diagnostics(kind="handler_error")
        assert diagnostic.subject == event.id
        assert "route 'boom' raised RuntimeError: handler exploded" in diagnostic.message
        assert handlers.calls == [("raising", event.id)]  # no later route was tried
        assert await rt.works() == []


# -- ownership ------------------------------------------------------------------------------------------


async def test_concurrent_events_with_one_key_create_exactly_one_work(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        go = trio.Event()
        accepted: list[Event] = []

        async def offer(i: int) -> None:
            await go.wait()
            accepted.append(await rt.publish(ev(f"d-{i}", key="pr/1")))

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(offer, i)
            go.set()
        await rt.wait_idle()

        [work] = await rt.works()
        assert work.id == work_id_for_key(SCOPE, "pr/1")
        assert work.keys == ("pr/1",)
        in_order = sorted(accepted, key=lambda e: e.seq)
        assert work.pending_inputs == tuple(e.id for e in in_order)
        for event in accepted:
            cp = await checkpoint(rt, event)
            assert (cp.status, cp.work_id) == (CheckpointStatus.ROUTED, work.id)


async def test_two_creates_proposing_one_id_make_one_work_and_the_loser_must_reevaluate(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    async with open_rt(config(SLOW, MAIN)) as rt:
        first = await rt.publish(ev("d-1", type="slow", key="pr/1"))
        second = await rt.publish(ev("d-2", type="slow", key="pr/1"))
        with trio.fail_after(STALL_S):
            await handlers.entered.wait()  # the router holds both, unrouted
        proposal = Deliver(work_id=work_id_for_key(SCOPE, "pr/1"), create=True, attach_keys=("pr/1",))

        outcomes: list[object] = []

        async def apply(event: Event) -> None:
            try:
                outcomes.append(await route_directly(rt, event, proposal, None))
            except Conflict as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(apply, first)
            nursery.start_soon(apply, second)
        # both saw "no Work" (expected_revision None): one creates; the other is told to reread, unless the
        # create already pulled it into the backlog (it was the earlier Event), which makes it a replay
        [created] = [o for o in outcomes if isinstance(o, RouteResult) and not o.replay]
        [other] = [o for o in outcomes if o is not created]
        assert isinstance(other, Conflict) or (isinstance(other, RouteResult) and other.replay)
        assert created.checkpoint.status is CheckpointStatus.ROUTED
        [work] = await rt.works()
        assert work.keys == ("pr/1",)
        handlers.release.set()
        await rt.wait_idle()
        assert (await rt.work(work.id)).pending_inputs == (first.id, second.id)


async def test_a_late_event_for_terminal_work_gets_terminal(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        await publish(rt, ev("d-1", key="pr/1"))
        work = await rt.work_for_key("pr/1")
        lease = await rt.claim(work.id, owner="host")
        await rt.complete(lease, Completed())
        done = await rt.work(work.id)
        assert done.state is WorkState.COMPLETED

        [late] = await publish(rt, ev("d-2", key="pr/1"))
        cp = await checkpoint(rt, late)
        assert (cp.status, cp.work_id) == (CheckpointStatus.TERMINAL, work.id)
        assert cp.reason == f"work {work.id} is completed"
        assert await rt.work(work.id) == done  # terminal Work is immutable
        assert (await rt.work_for_key("pr/1")).id == work.id
        assert len(await rt.works()) == 1  # no reopen policy, no successor


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"scope": "acme/other"}, "contradicts work"),
        ({"work_id": "wk_unknown"}, "names no existing work"),
        ({"key": "pr/2"}, "is owned by work"),
    ],
    ids=["wrong-scope", "unknown-work", "key-of-another-work"],
)
async def test_publish_refuses_an_explicit_work_id_that_contradicts_the_event(
    open_rt: OpenRuntime, fields: dict[str, Any], message: str
) -> None:
    async with open_rt(config(MAIN)) as rt:
        await publish(rt, ev("d-1", key="pr/1"), ev("d-2", key="pr/2"))
        target = await rt.work_for_key("pr/1")
        before = await rt.events()
        offered = {"work_id": target.id, **fields}
        with pytest.raises(InvalidRequest, match=message):
            await rt.publish(ev("d-3", **offered))
        await rt.wait_idle()
        assert await rt.events() == before
        with pytest.raises(NotFound):
            await rt.event_by_delivery("github", "d-3")
        assert await rt.work(target.id) == target


async def test_an_explicit_work_id_that_agrees_is_routed_to_that_work(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        await publish(rt, ev("d-1", key="pr/1"))
        target = await rt.work_for_key("pr/1")
        [named] = await publish(rt, ev("d-2", key="pr/1", work_id=target.id))
        assert (await checkpoint(rt, named)).work_id == target.id
        assert (await rt.work(target.id)).pending_inputs[-1] == named.id


# -- key attachment ---------------------------------------------------------------------------------------


async def test_key_attachment_pulls_earlier_unrouted_events_into_the_backlog_in_acceptance_order(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    note = {"name": "notes", "types": ["note"]}  # correlates, creates nothing: unmatched for unknown keys
    main = {**MAIN, "config": {"keys_field": "also"}}
    async with open_rt(config(SLOW, note, main)) as rt:
        [unmatched] = await publish(rt, ev("d-0", type="note", key="pr/3"))
        assert (await checkpoint(rt, unmatched)).status is CheckpointStatus.UNMATCHED
        a1 = await rt.publish(ev("d-1", type="slow", key="pr/2"))
        a2 = await rt.publish(ev("d-2", type="slow", key="pr/2"))
        with trio.fail_after(STALL_S):
            await handlers.entered.wait()  # a1 and a2 stay unrouted while the handler is blocked

        opener = await rt.publish(ev("d-3", key="pr/1", payload={"also": ["pr/2", "pr/3"]}))
        await until(rt, routed_to(rt, opener))

        work = await rt.work_for_key("pr/1")
        assert work.keys == ("pr/1", "pr/2", "pr/3")
        assert work.pending_inputs == (a1.id, a2.id, opener.id)
        for joined in (a1, a2):
            cp = await checkpoint(rt, joined)
            assert (cp.status, cp.work_id, cp.route) == (CheckpointStatus.ROUTED, work.id, "main")
            assert cp.reason == f"joined the backlog when event {opener.id} attached its key"
        # an Event already checkpointed unmatched is never resurrected by a later attachment
        assert (await checkpoint(rt, unmatched)).status is CheckpointStatus.UNMATCHED

        joined_a1 = await checkpoint(rt, a1)
        handlers.release.set()
        await rt.wait_idle()
        assert await checkpoint(rt, a1) == joined_a1  # the blocked handler's late decision was a replay
        assert (await rt.work(work.id)).pending_inputs == (a1.id, a2.id, opener.id)
        # routing said nothing; the only diagnostic is that no binding can start the Work
        assert [(d.kind, d.subject) for d in await rt.diagnostics()] == [("start_failed", work.id)]


async def test_key_attachment_leaves_an_unrouted_event_of_another_scope_alone(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    """An Event of another scope with the key never goes to the Work (an Event routes only within its
    scope). Catches an attachment that pulls it into the Work's backlog (seen: checkpointed routed to
    the Work, "joined the backlog"), while the same Event routed by itself is refused."""
    main = {**MAIN, "config": {"keys_field": "also"}}
    cfg = Config.from_dict({"scopes": {SCOPE: {"routes": [main]}, "other": {"routes": [SLOW]}}})
    async with open_rt(cfg) as rt:
        elsewhere = await rt.publish(ev("d-1", type="slow", key="pr/2", scope="other"))
        with trio.fail_after(STALL_S):
            await handlers.entered.wait()  # unrouted while its handler is blocked
        opener = await rt.publish(ev("d-2", key="pr/1", payload={"also": ["pr/2"]}))
        await until(rt, routed_to(rt, opener))
        work = await rt.work_for_key("pr/1")
        assert work.keys == ("pr/1", "pr/2")
        assert work.pending_inputs == (opener.id,)
        assert await rt.checkpoint(elsewhere.id) is None

        handlers.release.set()
        await rt.wait_idle()
        refused = await checkpoint(rt, elsewhere)
        assert refused.status is CheckpointStatus.UNROUTED
        assert (await rt.work(work.id)).pending_inputs == (opener.id,)


async def test_a_key_owned_by_another_work_aborts_every_effect(open_rt: OpenRuntime) -> None:
    async with open_rt(config({**MAIN, "config": {"keys_field": "also"}})) as rt:
        await publish(rt, ev("d-1", key="pr/1"), ev("d-2", key="pr/2"))
        one, two = await rt.work_for_key("pr/1"), await rt.work_for_key("pr/2")

        # creating Work for pr/3 would also take pr/2: nothing is created or attached at all
        [creating] = await publish(rt, ev("d-3", key="pr/3", payload={"also": ["pr/4", "pr/2"]}))
        # appending to pr/1's Work likewise: pr/5 is not attached and the Event is no input
        [appending] = await publish(rt, ev("d-4", key="pr/1", payload={"also": ["pr/5", "pr/2"]}))

        for event in (creating, appending):
            cp = await checkpoint(rt, event)
            assert cp.status is CheckpointStatus.UNROUTED
            assert cp.reason == f"owned_by_other: key 'pr/2' is owned by work {two.id}"
        for key in ("pr/3", "pr/4", "pr/5"):
            with pytest.raises(NotFound):
                await rt.work_for_key(key)
        assert await rt.works() == sorted([one, two], key=lambda w: w.id)
        diagnostics = await rt.diagnostics(kind="owned_by_other")
        assert sorted(d.subject for d in diagnostics) == sorted([creating.id, appending.id])


async def test_route_in_tx_with_a_stale_revision_raises_conflict_and_changes_nothing(
    open_rt: OpenRuntime, handlers: Handlers
) -> None:
    async with open_rt(config(SLOW, MAIN)) as rt:
        [opener] = await publish(rt, ev("d-1", key="pr/1"))
        work = await rt.work_for_key("pr/1")
        held = await rt.publish(ev("d-2", type="slow", key="pr/1"))
        with trio.fail_after(STALL_S):
            await handlers.entered.wait()

        with pytest.raises(Conflict, match="changed since the handler ran"):
            await route_directly(rt, held, Deliver(work_id=work.id), work.revision - 1)
        assert await rt.checkpoint(held.id) is None
        assert await rt.work(work.id) == work

        handlers.release.set()  # the router rereads and applies its own decision
        await rt.wait_idle()
        assert (await rt.work(work.id)).pending_inputs == (opener.id, held.id)


async def test_an_out_of_order_checkpoint_is_refused(open_rt: OpenRuntime, handlers: Handlers) -> None:
    async with open_rt(config(SLOW, MAIN)) as rt:
        [opener] = await publish(rt, ev("d-1", key="pr/1"))
        work = await rt.work_for_key("pr/1")
        earlier = await rt.publish(ev("d-2", type="slow", key="pr/1"))
        with trio.fail_after(STALL_S):
            await handlers.entered.wait()
        later = await rt.publish(ev("d-3", key="pr/1"))  # queued behind the blocked one

        with pytest.raises(OutOfOrder, match=f"before earlier unrouted event {earlier.id}"):
            await route_directly(rt, later, Deliver(work_id=work.id), work.revision)
        assert await rt.checkpoint(later.id) is None
        assert await rt.work(work.id) == work

        handlers.release.set()
        await rt.wait_idle()
        assert (await rt.work(work.id)).pending_inputs == (opener.id, earlier.id, later.id)


async def test_an_unsupported_control_is_unrouted_and_attaches_no_key(open_rt: OpenRuntime) -> None:
    """An inject route whose running attempt lacks inject, with no fallback: no effect at all."""
    cfg = config(
        {"name": "open", "types": ["pr.opened"], "create_work": True},
        {
            "name": "chat",
            "types": ["pr.comment"],
            "policy": "inject",
            "binding": "py",
            "config": {"keys_field": "also"},
        },
        bindings={"py": {"executor": "python", "capabilities": ["inject"]}},
    )
    async with open_rt(cfg, PythonExecutor()) as rt:
        await publish(rt, ev("d-1", key="pr/1"))
        work = await rt.work_for_key("pr/1")
        await rt.claim(work.id, owner="host", binding=BindingRef(name=None, executor=None))
        running = await rt.work(work.id)

        [comment] = await publish(rt, ev("d-2", type="pr.comment", key="pr/1", payload={"also": ["pr/9"]}))
        cp = await checkpoint(rt, comment)
        assert cp.status is CheckpointStatus.UNROUTED
        assert (cp.reason or "").startswith("unsupported_capability:")
        assert await rt.work(work.id) == running
        with pytest.raises(NotFound):
            await rt.work_for_key("pr/9")
        assert [d.subject for d in await rt.diagnostics(kind="unsupported_capability")] == [comment.id]


async def test_a_fallback_to_drop_drops_only_for_a_running_attempt(open_rt: OpenRuntime) -> None:
    """A route declared ``inject`` whose binding lacks inject falls back to ``drop`` (its effective
    policy): that is a policy for Work with a running attempt, not a drop route. Catches a fallback that
    turns the route into a drop route (seen: the first Event was dropped and made no Work; an Event
    for the idle Work was dropped too) and a drop that records no effective policy or fallback reason."""
    cfg = config(
        {"name": "chat", "types": ["pr.*"], "create_work": True, "policy": "inject", "fallback": ["drop"],
         "binding": "run"},
        bindings={"run": {"executor": "fake"}},
    )  # fmt: skip
    fake = FakeExecutor()
    async with open_rt(cfg, fake) as rt:
        [first] = await publish(rt, ev("d-1", key="pr/1"))
        assert (await checkpoint(rt, first)).status is CheckpointStatus.ROUTED
        work = await rt.work_for_key("pr/1")
        assert (await rt.work(work.id)).state is WorkState.RUNNING

        [during] = await publish(rt, ev("d-2", key="pr/1"))
        dropped = await checkpoint(rt, during)
        assert dropped.status is CheckpointStatus.DROP
        assert dropped.work_id == work.id
        assert dropped.effective_policy is Policy.DROP
        assert "does not pin inject" in (dropped.fallback_reason or "")

        fake.finish(work.id, loom.Handoff())  # idle and ready again
        await rt.wait_idle()
        [after] = await publish(rt, ev("d-3", key="pr/1"))
        queued = await checkpoint(rt, after)
        assert queued.status is CheckpointStatus.ROUTED
        assert queued.effective_policy is Policy.QUEUE
        assert [
            launch.request.trigger.id for launch in fake.launches_of(work.id) if launch.request.trigger
        ] == [
            first.id,
            after.id,
        ]


async def test_a_fallback_from_inject_to_interrupt_records_its_reason(open_rt: OpenRuntime) -> None:
    """Catches an effective policy taken by a fallback that its checkpoint records as if declared (no
    fallback reason: seen)."""
    cfg = config(
        {"name": "chat", "types": ["pr.*"], "create_work": True, "policy": "inject",
         "fallback": ["interrupt", "queue"], "binding": "run"},
        bindings={"run": {"executor": "fake", "capabilities": ["interrupt"]}},
    )  # fmt: skip
    fake = FakeExecutor()
    fake.capabilities = {"interrupt"}
    async with open_rt(cfg, fake) as rt:
        await publish(rt, ev("d-1", key="pr/1"))
        [during] = await publish(rt, ev("d-2", key="pr/1"))
        interrupting = await checkpoint(rt, during)
        assert interrupting.effective_policy is Policy.INTERRUPT
        assert "inject" in (interrupting.fallback_reason or "")


# -- reopen and generations --------------------------------------------------------------------------------


async def test_a_reopen_policy_creates_a_successor_with_a_generation_qualified_key(
    open_rt: OpenRuntime,
) -> None:
    cfg = config({**MAIN, "work_kind": "ticket"}, work_kinds={"ticket": {"reopen": True}})
    async with open_rt(cfg) as rt:
        await publish(rt, ev("d-1", key="issue/7"))
        old = await rt.work_for_key("issue/7")
        await rt.complete(await rt.claim(old.id, owner="host"), Completed())

        [late] = await publish(rt, ev("d-2", key="issue/7"))
        assert successor_key("issue/7", 1) == "issue/7/generation/reopen-1"
        successor = await rt.work_for_key("issue/7/generation/reopen-1")
        assert successor.id != old.id
        assert (successor.predecessor_id, successor.parent_id) == (old.id, None)
        assert (successor.kind, successor.state, successor.scope) == ("ticket", WorkState.READY, SCOPE)
        assert successor.pending_inputs == (late.id,)
        cp = await checkpoint(rt, late)
        assert (cp.status, cp.work_id) == (CheckpointStatus.ROUTED, successor.id)
        # the old key stays on the old, immutable Work
        assert (await rt.work_for_key("issue/7")).id == old.id
        assert (await rt.work(old.id)).keys == ("issue/7",)

        [created] = [e for e in await rt.events() if e.type == WORK_CREATED]
        assert created.payload == {"predecessor": old.id, "successor": successor.id, "key": "issue/7"}
        assert (created.parent_id, created.root_id, created.depth) == (late.id, late.id, 1)
        assert created.key == "issue/7/generation/reopen-1"
        assert created.id not in successor.pending_inputs  # a record, never input

        # later deliveries for the old key map consistently to the live successor
        [later] = await publish(rt, ev("d-3", key="issue/7"))
        assert (await checkpoint(rt, later)).work_id == successor.id
        assert len(await rt.works()) == 2

        # and once the successor is terminal too, the next reopen is generation 2 after it
        await rt.complete(await rt.claim(successor.id, owner="host"), Completed())
        await publish(rt, ev("d-4", key="issue/7"))
        second = await rt.work_for_key("issue/7/generation/reopen-2")
        assert second.predecessor_id == successor.id

        # a late event on a successor's own generation key names the next generation; keys never nest
        await rt.complete(await rt.claim(second.id, owner="host"), Completed())
        await publish(rt, ev("d-5", key="issue/7/generation/reopen-1"))
        third = await rt.work_for_key("issue/7/generation/reopen-3")
        assert third.predecessor_id == second.id


async def test_checkpoints_record_the_config_generation_they_used(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        [first] = await publish(rt, ev("d-1", key="pr/1"))
        assert (await checkpoint(rt, first)).generation == 1

        with pytest.raises(ConfigError, match="unknown route handler 'nope'"):
            rt.reload(config({"name": "bad", "handler": "nope"}))
        assert rt.config.generation == 1

        mute = {"name": "mute", "types": ["bot.*"], "policy": "drop", "reason": "muted"}
        assert rt.reload(config(mute, MAIN)).generation == 2
        second, bot = await publish(rt, ev("d-2", key="pr/1"), ev("d-3", type="bot.comment", key="pr/1"))
        assert (await checkpoint(rt, second)).generation == 2
        dropped = await checkpoint(rt, bot)
        assert (dropped.status, dropped.generation) == (CheckpointStatus.DROP, 2)
        # a replay keeps the committed decision and its generation
        await rt.publish(ev("d-1", key="pr/1"))
        await rt.wait_idle()
        assert (await checkpoint(rt, first)).generation == 1
        assert (await rt.work_for_key("pr/1")).generation == 1
