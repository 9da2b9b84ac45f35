"""Executions through the runtime (docs/concepts.md "Execution"; "Active-event policies and acknowledgements", "Generic inject
acknowledgement", "Pending-job coalescing and standing Work", "Gated starts", "Lease recovery" (claim, lease,
epoch, exclusive expiry), "Causal bounds", "Cited causation"), on SQLite ``:memory:`` and on a file.

Most tests route to Work with no executor binding, so nothing launches by itself, and drive claim and
complete as a host would. The launch tests bind a `PythonExecutor` and let the router start attempts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

import loom
from loom import (
    CausalRefused,
    Config,
    Conflict,
    Event,
    EventIn,
    InvalidRequest,
    ManualClock,
    NotAccepting,
    NotFound,
    Runtime,
    StaleAuthority,
    open_runtime,
)
from loom.kernel.executions import BindingRef
from loom.plugins.handlers import correlate
from loom.plugins.python_executor import PythonExecutor
from loom.records.core_events import MANUAL_INTERRUPT, WORK_CREATED
from loom.records.executor import Toolbelt
from loom.records.work import (
    CheckpointStatus,
    Completed,
    ExecutionState,
    Failed,
    Handoff,
    Intent,
    IntentKind,
    IntentStatus,
    Lease,
    Outcome,
    Policy,
    RunRequest,
    Work,
    WorkState,
)
from loom.store._tx_executions import ended_as
from loom.testing import T0_MS

T0 = T0_MS
SCOPE = "acme/web"
STALL_S = 10  # only detects a stalled test; nothing waits on time
LEASE_MS = 30_000


def ev(delivery_id: str, *, type: str = "pr.opened", key: str | None = "pr/1", **fields: Any) -> EventIn:
    values: dict[str, Any] = {"source": "github", "scope": SCOPE, **fields}
    return EventIn(delivery_id=delivery_id, type=type, key=key, **values)


def config(*routes: dict[str, Any], **scope: Any) -> Config:
    """One scope with ``routes``; ``work_kinds`` and ``causal`` go to the root, anything else to the scope."""
    root = {name: scope.pop(name) for name in ("work_kinds", "causal") if name in scope}
    return Config.from_dict({"scopes": {SCOPE: {"routes": list(routes), **scope}}, **root})


MAIN = {"name": "main", "create_work": True}
PY = {"py": {"executor": "python", "capabilities": ["inject", "interrupt"], "config": {"function": "run"}}}


class Blocking:
    """A route handler that blocks until released, so its Event stays accepted but unrouted."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    @loom.hookimpl
    def loom_route_handlers(self) -> dict[str, Any]:
        return {"blocking": self.blocking}

    async def blocking(self, event: Event, scope: str, work: Work | None, route: Any) -> Any:
        self.entered.set()
        await self.release.wait()
        return correlate(event, scope, work, route)


OpenRuntime = Callable[..., AbstractAsyncContextManager[Runtime]]


@pytest.fixture
def open_rt(loom_store: str, clock: ManualClock) -> OpenRuntime:
    @asynccontextmanager
    async def opener(
        cfg: Config, *plugins: object, actors: tuple[str, ...] | None = None
    ) -> AsyncIterator[Runtime]:
        async with open_runtime(
            loom_store,
            clock=clock,
            config=cfg,
            plugins=plugins,
            load_entry_points=False,
            **({} if actors is None else {"actors": actors}),
        ) as rt:
            yield rt

    return opener


async def publish(rt: Runtime, *events: EventIn) -> list[Event]:
    """Publish in order and wait until the router has handled every one."""
    accepted = [await rt.publish(event) for event in events]
    await rt.wait_idle()
    return accepted


async def work_with_input(rt: Runtime, *events: EventIn) -> tuple[Work, list[Event]]:
    accepted = await publish(rt, *(events or (ev("d-1"),)))
    return await rt.work_for_key(accepted[0].key or ""), accepted


async def until(rt: Runtime, check: Callable[[], Awaitable[bool]]) -> None:
    """Wait on commit notices (never on time) until ``check()`` holds."""
    async with rt.watch() as notices:
        with trio.fail_after(STALL_S):
            while not await check():
                await notices.__anext__()


async def stale(rt: Runtime, lease: Lease) -> None:
    """Every fenced call with ``lease`` is refused."""
    with pytest.raises(StaleAuthority):
        await rt.renew(lease)
    with pytest.raises(StaleAuthority):
        await rt.complete(lease, Completed())
    with pytest.raises(StaleAuthority):
        await rt.toolbelt(lease).emit(ev("emitted", type="note.posted", key=None))


# -- claims and leases -------------------------------------------------------------------------------------


async def test_a_claim_grants_one_fenced_lease_with_every_pending_input(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, [first, second] = await work_with_input(rt, ev("d-1"), ev("d-2"))
        lease = await rt.claim(work.id, owner="node-a", lease_ms=LEASE_MS)
        assert (lease.attempt, lease.epoch, lease.owner) == (1, 1, "node-a")
        assert lease.expires_at_ms == T0 + LEASE_MS
        assert lease.token
        assert lease.request.work_id == work.id
        assert lease.request.trigger == first
        assert lease.request.inputs == (first, second)

        running = await rt.work(work.id)
        assert (running.state, running.attempts) == (WorkState.RUNNING, 1)
        assert running.current_execution_id == lease.execution_id
        execution = await rt.execution(lease.execution_id)
        assert (execution.state, execution.attempt, execution.epoch) == (ExecutionState.RUNNING, 1, 1)
        assert (execution.trigger_id, execution.inputs) == (first.id, (first.id, second.id))


async def test_ten_concurrent_claims_grant_exactly_one_lease(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        go = trio.Event()
        leases: list[Lease] = []
        conflicts: list[Conflict] = []

        async def claim(owner: str) -> None:
            await go.wait()
            try:
                leases.append(await rt.claim(work.id, owner=owner))
            except Conflict as exc:
                conflicts.append(exc)

        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(claim, f"node-{i}")
            go.set()
        assert (len(leases), len(conflicts)) == (1, 9)
        assert [x.id for x in (await rt.history(work.id)).executions] == [leases[0].execution_id]


async def test_a_work_has_one_nonterminal_attempt_at_a_time(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        first = await rt.claim(work.id, owner="a")
        await publish(rt, ev("d-2"))  # pending input does not allow a second attempt
        with pytest.raises(Conflict, match="already has a nonterminal attempt"):
            await rt.claim(work.id, owner="b")
        await rt.complete(first, Completed())
        second = await rt.claim(work.id, owner="b")
        assert second.attempt == 2
        assert second.execution_id != first.execution_id


async def test_scope_capacity_defers_claims_until_a_slot_frees(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN, capacity=1)) as rt:
        await publish(rt, ev("d-1", key="pr/1"), ev("d-2", key="pr/2"))
        one, two = await rt.work_for_key("pr/1"), await rt.work_for_key("pr/2")
        lease = await rt.claim(one.id, owner="a")
        with pytest.raises(Conflict, match=f"scope '{SCOPE}' is at its capacity of 1"):
            await rt.claim(two.id, owner="b")
        assert await rt.work(two.id) == two
        await rt.complete(lease, Completed())
        assert (await rt.claim(two.id, owner="b")).attempt == 1


async def test_lease_expiry_is_exclusive(open_rt: OpenRuntime, clock: ManualClock) -> None:
    # Without the recovery actor, so the expired lease stays as it was.
    async with open_rt(config(MAIN), actors=("router", "timers")) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a", lease_ms=1_000)
        before = await rt.execution(lease.execution_id)
        clock.set(lease.expires_at_ms)  # now == expires_at: the authority is already gone
        with pytest.raises(StaleAuthority, match="expired"):
            await rt.renew(lease)
        with pytest.raises(StaleAuthority, match="expired"):
            await rt.complete(lease, Completed())
        assert await rt.execution(lease.execution_id) == before
        assert (await rt.work(work.id)).state is WorkState.RUNNING


async def test_renew_extends_a_live_lease(open_rt: OpenRuntime, clock: ManualClock) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a", lease_ms=1_000)
        clock.set(lease.expires_at_ms - 1)
        renewed = await rt.renew(lease, lease_ms=1_000)
        assert renewed.expires_at_ms == lease.expires_at_ms - 1 + 1_000
        assert (await rt.execution(lease.execution_id)).expires_at_ms == renewed.expires_at_ms
        clock.set(lease.expires_at_ms)  # the old deadline no longer applies
        assert (await rt.complete(renewed, Completed())).state is ExecutionState.COMPLETED


@pytest.mark.parametrize(
    "change",
    [{"token": "forged-token"}, {"epoch": 2}, {"attempt": 2}, {"execution_id": "ex_unknown"}],
    ids=["token", "epoch", "attempt", "execution"],
)
async def test_a_stale_token_epoch_or_attempt_is_refused(
    open_rt: OpenRuntime, change: dict[str, Any]
) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        before = await rt.execution(lease.execution_id)
        await stale(rt, attrs.evolve(lease, **change))
        assert await rt.execution(lease.execution_id) == before
        assert await rt.events(limit=100) == [lease.request.trigger]  # nothing emitted
        assert (await rt.complete(lease, Completed())).state is ExecutionState.COMPLETED


# -- outcomes ---------------------------------------------------------------------------------------------


async def test_completed_with_no_pending_input_completes_the_work(
    open_rt: OpenRuntime, clock: ManualClock
) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        clock.advance(500)
        execution = await rt.complete(lease, Completed(usage={"usd": 0.25}))
        assert (execution.state, execution.ended_at_ms) == (ExecutionState.COMPLETED, T0 + 500)
        assert execution.outcome == {"kind": "completed", "consumed_inputs": [], "usage": {"usd": 0.25}}
        done = await rt.work(work.id)
        assert (done.state, done.pending_inputs, done.current_execution_id) == (WorkState.COMPLETED, (), None)
        await stale(rt, lease)  # a completed attempt's authority ended


async def test_completion_is_refused_while_an_accepted_event_for_the_work_is_unrouted(
    open_rt: OpenRuntime,
) -> None:
    blocking = Blocking()
    cfg = config({"name": "slow", "types": ["slow"], "handler": "blocking"}, MAIN)
    async with open_rt(cfg, blocking) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        late = await rt.publish(ev("d-2", type="slow"))
        with trio.fail_after(STALL_S):
            await blocking.entered.wait()
        before = await rt.execution(lease.execution_id)

        with pytest.raises(Conflict, match=f"accepted event {late.id} resolving to it is not routed yet"):
            await rt.complete(lease, Completed())
        assert await rt.execution(lease.execution_id) == before
        assert (await rt.work(work.id)).state is WorkState.RUNNING

        blocking.release.set()  # routing wins: the input keeps the Work ready for attempt 2
        await rt.wait_idle()
        await rt.complete(lease, Completed())
        ready = await rt.work(work.id)
        assert (ready.state, ready.pending_inputs) == (WorkState.READY, (late.id,))
        assert (await rt.claim(work.id, owner="a")).request.inputs == (late,)


@pytest.mark.parametrize(("trigger", "expected"), [("first", 0), ("newest", 2)])
async def test_pending_input_makes_the_next_attempt_with_every_input_and_the_selected_trigger(
    open_rt: OpenRuntime, trigger: str, expected: int
) -> None:
    cfg = config({**MAIN, "work_kind": "job"}, work_kinds={"job": {"trigger": trigger}})
    async with open_rt(cfg) as rt:
        work, _ = await work_with_input(rt)
        first = await rt.claim(work.id, owner="a")
        queued = await publish(rt, ev("d-2"), ev("d-3"), ev("d-4"))
        await rt.complete(first, Completed())
        ready = await rt.work(work.id)
        assert (ready.state, ready.pending_inputs) == (WorkState.READY, tuple(e.id for e in queued))

        second = await rt.claim(work.id, owner="a")
        assert second.attempt == 2
        assert second.request.inputs == tuple(queued)  # acceptance order
        assert second.request.trigger == queued[expected]
        assert (await rt.execution(second.execution_id)).trigger_id == queued[expected].id
        # every trigger stays in that attempt's consumption history: one run for all of them
        await rt.complete(second, Completed())
        assert (await rt.work(work.id)).state is WorkState.COMPLETED


async def test_standing_work_stays_ready_after_a_completed_attempt(open_rt: OpenRuntime) -> None:
    cfg = config({**MAIN, "work_kind": "objective"}, work_kinds={"objective": {"standing": True}})
    async with open_rt(cfg) as rt:
        work, _ = await work_with_input(rt)
        execution = await rt.complete(await rt.claim(work.id, owner="a"), Completed())
        assert execution.state is ExecutionState.COMPLETED
        idle = await rt.work(work.id)
        assert (idle.state, idle.pending_inputs, idle.current_execution_id) == (WorkState.READY, (), None)
        [nxt] = await publish(rt, ev("d-2"))
        assert (await rt.claim(work.id, owner="a")).request.inputs == (nxt,)


@pytest.mark.parametrize(
    ("run_once", "execution_state", "work_state"),
    [(True, ExecutionState.COMPLETED, WorkState.COMPLETED), (False, ExecutionState.HANDOFF, WorkState.READY)],
    ids=["run-once", "plain"],
)
async def test_a_handoff_settles_as_completed_only_for_run_once_work(
    open_rt: OpenRuntime, run_once: bool, execution_state: ExecutionState, work_state: WorkState
) -> None:
    cfg = config({**MAIN, "work_kind": "task"}, work_kinds={"task": {"run_once": run_once}})
    async with open_rt(cfg) as rt:
        work, _ = await work_with_input(rt)
        execution = await rt.complete(await rt.claim(work.id, owner="a"), Handoff())
        assert execution.state is execution_state
        assert (await rt.work(work.id)).state is work_state


async def test_a_failed_attempt_is_recorded_with_its_retry_hint_and_the_work_stays_ready(
    open_rt: OpenRuntime,
) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        execution = await rt.complete(lease, Failed(error="rate limited", retry_after_ms=120_000))
        assert execution.state is ExecutionState.FAILED
        assert execution.outcome == {
            "kind": "failed",
            "error": "rate limited",
            "retry_after_ms": 120_000,
            "rate_limited": False,
            "consumed_inputs": [],
            "usage": {},
        }
        ready = await rt.work(work.id)
        assert (ready.state, ready.pending_inputs, ready.current_execution_id) == (WorkState.READY, (), None)
        assert ready.retry is loom.records.work.RetryState.BACKOFF, "ready, but not eligible before its retry"
        timer = await rt.timer(f"retry:{work.id}:1")
        assert timer.fire_at_ms == rt.clock.now_ms() + 120_000 + 120_000, "the hint, plus two minutes"
        await stale(rt, lease)


# -- operator controls ------------------------------------------------------------------------------------


async def test_a_hold_with_a_reason_blocks_claims_until_released(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        with pytest.raises(InvalidRequest, match="reason"):
            await rt.hold(work.id, reason=" ")
        held = await rt.hold(work.id, reason="budget review")
        assert (held.held, held.hold_reason) == (True, "budget review")
        with pytest.raises(Conflict, match="held: budget review"):
            await rt.claim(work.id, owner="a")
        released = await rt.release(work.id)
        assert (released.held, released.hold_reason) == (False, None)
        with pytest.raises(Conflict, match="not held"):
            await rt.release(work.id)
        assert (await rt.claim(work.id, owner="a")).attempt == 1


async def test_a_hold_left_on_work_that_completed_cannot_be_released(open_rt: OpenRuntime) -> None:
    """Terminal Work is never rewritten: a Work held while its attempt ran keeps the hold when the attempt
    completes it, and releasing it then is refused (`Conflict` naming its state), the Work unchanged.
    Catches ``release_in_tx`` without its terminal check (it would clear the hold and set a one-shot
    start on completed Work)."""
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        await rt.hold(work.id, reason="review")
        await rt.complete(lease, Completed())
        done = await rt.work(work.id)
        assert (done.state, done.held) == (WorkState.COMPLETED, True)
        with pytest.raises(Conflict, match=r"cannot release work .*: it is completed"):
            await rt.release(work.id)
        assert await rt.work(work.id) == done


async def test_cancel_is_terminal_fences_the_token_and_later_events_get_terminal(
    open_rt: OpenRuntime,
) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        cancelled = await rt.cancel(work.id)
        assert (cancelled.state, cancelled.current_execution_id) == (WorkState.CANCELLED, None)
        assert (await rt.execution(lease.execution_id)).state is ExecutionState.CANCELLED
        await stale(rt, lease)
        with pytest.raises(Conflict, match="already cancelled"):
            await rt.cancel(work.id)
        with pytest.raises(Conflict, match="is cancelled"):
            await rt.claim(work.id, owner="a")

        [late] = await publish(rt, ev("d-2"))
        cp = await rt.checkpoint(late.id)
        assert cp is not None
        assert (cp.status, cp.work_id) == (CheckpointStatus.TERMINAL, work.id)
        assert (await rt.work(work.id)).state is WorkState.CANCELLED


async def test_attempts_record_the_config_generation_they_used(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        first = await rt.claim(work.id, owner="a")
        assert (await rt.execution(first.execution_id)).generation == 1
        await publish(rt, ev("d-2"))
        await rt.complete(first, Completed())
        rt.reload(config(MAIN))
        second = await rt.claim(work.id, owner="a")
        assert (await rt.execution(second.execution_id)).generation == 2


# -- the toolbelt -----------------------------------------------------------------------------------------


async def test_an_emission_derives_from_the_trigger_and_is_charged_to_the_causal_bounds(
    open_rt: OpenRuntime,
) -> None:
    async with open_rt(config(MAIN, causal={"per_minute": 3})) as rt:
        work, [trigger] = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        toolbelt = rt.toolbelt(lease)

        emitted = await toolbelt.emit(ev("out-1", type="note.posted", key=None))
        assert (emitted.parent_id, emitted.root_id) == (trigger.id, trigger.id)
        assert (emitted.depth, emitted.execution_id) == (trigger.depth + 1, lease.execution_id)

        with pytest.raises(InvalidRequest, match="not the emitting work's scope"):
            await toolbelt.emit(ev("out-x", type="note.posted", key=None, scope="acme/other"))
        with pytest.raises(InvalidRequest, match=r"core\.\* family"):
            await toolbelt.emit(ev("out-y", type=WORK_CREATED, key=None))

        await toolbelt.emit(ev("out-2", type="note.posted", key=None))
        await toolbelt.emit(ev("out-3", type="note.posted", key=None))
        assert (await toolbelt.emit(ev("out-1", type="note.posted", key=None))).duplicate  # replay is free
        with pytest.raises(CausalRefused, match="rate_limit"):
            await toolbelt.emit(ev("out-4", type="note.posted", key=None))
        [rejection] = await rt.causal_rejections()
        assert (rejection.delivery_id, rejection.parent_id) == ("out-4", trigger.id)
        assert rejection.execution_id == lease.execution_id
        delivered = {e.delivery_id for e in await rt.events(limit=100)}
        assert delivered == {"d-1", "out-1", "out-2", "out-3"}


async def test_create_child_makes_work_in_the_same_scope_atomically_and_idempotently(
    open_rt: OpenRuntime,
) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, [trigger] = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        toolbelt = rt.toolbelt(lease)

        child = await toolbelt.create_child("review", keys=["review/1"], kind="review")
        assert (child.scope, child.parent_id, child.kind) == (SCOPE, work.id, "review")
        assert (child.keys, child.state, child.predecessor_id) == (("review/1",), WorkState.READY, None)
        [created] = [e for e in await rt.events(limit=100) if e.type == WORK_CREATED]
        assert created.payload == {"parent": work.id, "child": child.id, "name": "review"}
        assert (created.parent_id, created.depth, created.execution_id) == (trigger.id, 1, lease.execution_id)
        cp = await rt.checkpoint(created.id)
        assert cp is not None
        assert (cp.status, cp.work_id) == (CheckpointStatus.ROUTED, child.id)
        assert created.id not in (await rt.work(child.id)).pending_inputs  # a record, never input

        assert (await toolbelt.create_child("review", keys=["review/1"])).id == child.id
        with pytest.raises(Conflict, match="already owned by work"):
            await toolbelt.create_child("other", keys=["pr/1"])
        await rt.wait_idle()
        assert len([e for e in await rt.events(limit=100) if e.type == WORK_CREATED]) == 1
        assert {w.id for w in await rt.works()} == {work.id, child.id}


async def test_create_child_is_charged_to_the_causal_bounds(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN, causal={"per_minute": 1})) as rt:
        work, _ = await work_with_input(rt)
        toolbelt = rt.toolbelt(await rt.claim(work.id, owner="a"))
        await toolbelt.emit(ev("out-1", type="note.posted", key=None))
        with pytest.raises(CausalRefused, match="rate_limit"):
            await toolbelt.create_child("review", keys=["review/1"])
        assert [w.id for w in await rt.works()] == [work.id]
        with pytest.raises(NotFound):
            await rt.work_for_key("review/1")
        assert WORK_CREATED not in {e.type for e in await rt.events(limit=100)}


# -- launching through an executor ------------------------------------------------------------------------


class Recorder:
    """A python-executor function whose attempts the test steers: each records itself and waits."""

    def __init__(self) -> None:
        self.requests: list[RunRequest] = []
        self.leases: list[Lease] = []
        self.started: dict[int, trio.Event] = {}
        self.finish: dict[int, trio.Event] = {}
        self.outcomes: dict[int, Outcome] = {}
        self.inbox_events: list[Event] = []

    def started_event(self, n: int) -> trio.Event:
        return self.started.setdefault(n, trio.Event())

    def finish_event(self, n: int) -> trio.Event:
        return self.finish.setdefault(n, trio.Event())

    async def wait_started(self, n: int) -> RunRequest:
        with trio.fail_after(STALL_S):
            await self.started_event(n).wait()
        return self.requests[n - 1]


def launching(recorder: Recorder, executor: PythonExecutor | None = None, *, read_inbox: bool = False) -> Any:
    executor = executor or PythonExecutor()

    @executor.function("run")
    async def run(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        n = len(recorder.requests) + 1
        recorder.requests.append(request)
        recorder.leases.append(toolbelt.lease)
        recorder.started_event(n).set()
        if read_inbox:
            recorder.inbox_events.append(await executor.inbox(request.execution_id).receive())
        await recorder.finish_event(n).wait()
        return recorder.outcomes.get(n, Completed())

    return executor


def execution_ended(rt: Runtime, execution_id: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await rt.execution(execution_id)).state.terminal

    return check


async def test_a_bound_route_launches_the_attempt_and_commits_its_outcome(open_rt: OpenRuntime) -> None:
    recorder = Recorder()
    async with open_rt(config({**MAIN, "binding": "py"}, bindings=PY), launching(recorder)) as rt:
        work, [first] = await work_with_input(rt)
        request = await recorder.wait_started(1)
        assert (request.work_id, request.attempt, request.trigger, request.inputs) == (
            work.id,
            1,
            first,
            (first,),
        )
        assert (request.binding, request.config) == ("py", {"function": "run"})
        execution = await rt.execution(request.execution_id)
        assert (execution.executor, execution.capabilities) == ("python", frozenset({"inject", "interrupt"}))
        assert recorder.leases[0].owner == rt.owner

        recorder.finish_event(1).set()
        await until(rt, execution_ended(rt, request.execution_id))
        assert (await rt.execution(request.execution_id)).state is ExecutionState.COMPLETED
        assert (await rt.work(work.id)).state is WorkState.COMPLETED


async def test_a_start_deferred_by_scope_capacity_starts_when_the_slot_frees(open_rt: OpenRuntime) -> None:
    recorder = Recorder()
    cfg = config({**MAIN, "binding": "py"}, bindings=PY, capacity=1)
    async with open_rt(cfg, launching(recorder)) as rt:
        await publish(rt, ev("d-1", key="pr/1"))
        first = await recorder.wait_started(1)
        await publish(rt, ev("d-2", key="pr/2"))
        waiting = await rt.work_for_key("pr/2")
        assert (waiting.state, waiting.attempts) == (WorkState.READY, 0)  # deferred, not refused for good

        recorder.finish_event(1).set()
        second = await recorder.wait_started(2)
        assert second.work_id == waiting.id
        assert (await rt.execution(first.execution_id)).state is ExecutionState.COMPLETED


class Gate:
    """A start gate that holds every first start with a reason."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    @loom.hookimpl
    def loom_start_gates(self) -> dict[str, Any]:
        return {"budget": self.check}

    def check(self, work: Work) -> str | None:
        self.asked.append(work.id)
        return "awaiting approval"


async def test_a_start_gate_holds_the_first_start_until_a_release_lets_one_through(
    open_rt: OpenRuntime,
) -> None:
    recorder, gate = Recorder(), Gate()
    async with open_rt(config({**MAIN, "binding": "py"}, bindings=PY), launching(recorder), gate) as rt:
        work, [first] = await work_with_input(rt)
        held = await rt.work(work.id)
        assert (held.held, held.hold_reason) == (True, "start gate budget: awaiting approval")
        assert (held.state, held.attempts) == (WorkState.READY, 0)
        assert recorder.requests == []
        [second] = await publish(rt, ev("d-2"))  # input keeps queueing while held
        assert (await rt.work(work.id)).pending_inputs == (first.id, second.id)

        await rt.release(work.id)
        request = await recorder.wait_started(1)
        assert request.inputs == (first, second)
        assert gate.asked == [work.id]  # the release let this start through without asking again
        recorder.finish_event(1).set()
        await until(rt, execution_ended(rt, request.execution_id))
        assert (await rt.work(work.id)).state is WorkState.COMPLETED


# -- inject, interrupt --------------------------------------------------------------------------------------


class RecordingInject(PythonExecutor):
    """Records the intents committed for an execution at the moment its inject is called."""

    def __init__(self, rt_box: list[Runtime], *, refuse: bool = False) -> None:
        super().__init__()
        self._rt_box = rt_box
        self._refuse = refuse
        self.seen: list[tuple[str, list[Intent]]] = []

    async def inject(self, execution_id: str, event: Event) -> None:
        self.seen.append((event.id, await self._rt_box[0].intents(execution_id)))
        if self._refuse:
            raise NotAccepting(f"execution {execution_id} takes no input")
        await super().inject(execution_id, event)


INJECT_ROUTES = (
    {"name": "queued", "types": ["queued"]},
    {**MAIN, "binding": "py", "policy": "inject"},
)


async def test_an_inject_route_commits_the_intent_before_calling_the_executor(open_rt: OpenRuntime) -> None:
    box: list[Runtime] = []
    recorder = Recorder()
    executor = launching(recorder, RecordingInject(box), read_inbox=True)
    async with open_rt(config(*INJECT_ROUTES, bindings=PY), executor) as rt:
        box.append(rt)
        work, [first] = await work_with_input(rt)
        request = await recorder.wait_started(1)

        [comment] = await publish(rt, ev("d-2", type="pr.comment"))
        [(injected, intents)] = executor.seen
        assert injected == comment.id
        [intent] = intents  # committed, and marked dispatched, before the executor was asked
        assert (intent.kind, intent.event_id, intent.execution_id) == (
            IntentKind.INJECT,
            comment.id,
            request.execution_id,
        )
        assert (intent.status, intent.epoch) == (IntentStatus.DISPATCHING, 1)
        [settled] = await rt.intents(request.execution_id)
        assert settled.status is IntentStatus.ACCEPTED  # accepted for delivery, not consumed
        cp = await rt.checkpoint(comment.id)
        assert cp is not None
        assert (cp.policy, cp.effective_policy) == (Policy.INJECT, Policy.INJECT)
        assert recorder.inbox_events == [comment]
        assert (await rt.work(work.id)).pending_inputs == (first.id, comment.id)

        # the proof names the injected input and one that was never injected: only the first counts
        [queued] = await publish(rt, ev("d-3", type="queued"))
        recorder.outcomes[1] = Completed(consumed_inputs=(comment.id, queued.id, "ev_unknown"))
        recorder.finish_event(1).set()
        await until(rt, execution_ended(rt, request.execution_id))

        [consumed] = await rt.intents(request.execution_id)
        assert consumed.status is IntentStatus.CONSUMED
        # what is left for the next attempt (under the binding the last ran with) is the queued input
        following = await recorder.wait_started(2)
        assert [e.id for e in following.inputs] == [queued.id]


async def test_an_attempt_that_proves_it_took_its_injected_input_completes_its_work(
    open_rt: OpenRuntime,
) -> None:
    # catches a completion that decides "nothing pending" from the inputs pending before the attempt
    # less its claimed ones, forgetting what its proof consumed: the Work would run again for an input
    # already taken in
    box: list[Runtime] = []
    recorder = Recorder()
    executor = launching(recorder, RecordingInject(box), read_inbox=True)
    async with open_rt(config(*INJECT_ROUTES, bindings=PY), executor) as rt:
        box.append(rt)
        work, [first] = await work_with_input(rt)
        request = await recorder.wait_started(1)
        [comment] = await publish(rt, ev("d-2", type="pr.comment"))
        [settled] = await rt.intents(request.execution_id)
        assert settled.status is IntentStatus.ACCEPTED
        assert (await rt.work(work.id)).pending_inputs == (first.id, comment.id)

        recorder.outcomes[1] = Completed(consumed_inputs=(comment.id,))
        recorder.finish_event(1).set()
        await until(rt, execution_ended(rt, request.execution_id))
        done = await rt.work(work.id)
        assert (done.state, done.pending_inputs) == (WorkState.COMPLETED, ())
        assert len(recorder.requests) == 1


async def test_a_proof_without_an_attempted_dispatch_consumes_nothing(open_rt: OpenRuntime) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="a")
        [later] = await publish(rt, ev("d-2"))
        await rt.complete(lease, Completed(consumed_inputs=(later.id,)))
        assert (await rt.work(work.id)).pending_inputs == (later.id,)


async def test_not_accepting_settles_the_intent_and_keeps_the_input_for_the_next_attempt(
    open_rt: OpenRuntime,
) -> None:
    box: list[Runtime] = []
    recorder = Recorder()
    executor = launching(recorder, RecordingInject(box, refuse=True))
    async with open_rt(config({**MAIN, "binding": "py", "policy": "inject"}, bindings=PY), executor) as rt:
        box.append(rt)
        work, [first] = await work_with_input(rt)
        request = await recorder.wait_started(1)

        [comment] = await publish(rt, ev("d-2", type="pr.comment"))
        [intent] = await rt.intents(request.execution_id)
        assert (intent.status, intent.attempts) == (IntentStatus.NOT_ACCEPTING, 1)  # not retried
        assert len(executor.seen) == 1
        cp = await rt.checkpoint(comment.id)
        assert cp is not None
        assert cp.effective_policy is Policy.INJECT  # no queue inferred

        recorder.outcomes[1] = Completed(consumed_inputs=(comment.id,))  # an over-claim is ignored
        recorder.finish_event(1).set()
        second = await recorder.wait_started(2)
        assert second.inputs == (comment,)
        assert (await rt.execution(request.execution_id)).inputs == (first.id,)
        recorder.finish_event(2).set()
        await until(rt, execution_ended(rt, second.execution_id))
        assert (await rt.work(work.id)).state is WorkState.COMPLETED


async def test_an_interrupt_route_fences_the_old_attempt_before_a_replacement_starts(
    open_rt: OpenRuntime,
) -> None:
    recorder = Recorder()
    box: list[Runtime] = []
    seen: dict[str, Any] = {}
    executor = PythonExecutor()

    @executor.function("run")
    async def run(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        n = len(recorder.requests) + 1
        recorder.requests.append(request)
        recorder.leases.append(toolbelt.lease)
        if n == 2:
            rt = box[0]
            seen["first"] = await rt.execution(recorder.requests[0].execution_id)
            try:
                await rt.renew(recorder.leases[0])
            except StaleAuthority as exc:
                seen["renew"] = exc
        recorder.started_event(n).set()
        await recorder.finish_event(n).wait()
        return Completed()

    async with open_rt(config({**MAIN, "binding": "py", "policy": "interrupt"}, bindings=PY), executor) as rt:
        box.append(rt)
        work, [first] = await work_with_input(rt)
        old = await recorder.wait_started(1)

        stop = await rt.publish(ev("d-2", type="pr.pushed"))
        new = await recorder.wait_started(2)
        assert new.attempt == 2
        assert new.inputs == (first, stop)  # the pending input is retained for the replacement
        assert seen["first"].state is ExecutionState.CANCELLED
        assert seen["first"].interrupt_event_id == stop.id
        assert isinstance(seen["renew"], StaleAuthority)
        await stale(rt, recorder.leases[0])

        await rt.wait_idle()
        cp = await rt.checkpoint(stop.id)
        assert cp is not None
        assert (cp.policy, cp.effective_policy) == (Policy.INTERRUPT, Policy.INTERRUPT)
        [intent] = await rt.intents(old.execution_id)
        assert (intent.kind, intent.status, intent.event_id) == (
            IntentKind.INTERRUPT,
            IntentStatus.DONE,
            stop.id,
        )
        recorder.finish_event(2).set()
        await until(rt, execution_ended(rt, new.execution_id))
        assert (await rt.work(work.id)).state is WorkState.COMPLETED


async def test_an_operator_interrupt_is_refused_unless_the_attempt_pinned_the_capability(
    open_rt: OpenRuntime,
) -> None:
    async with open_rt(config(MAIN)) as rt:
        work, _ = await work_with_input(rt)
        with pytest.raises(Conflict, match="no running attempt"):
            await rt.interrupt(work.id)
        lease = await rt.claim(work.id, owner="host")
        before = await rt.events(limit=100)
        with pytest.raises(Conflict, match="not pinned with the interrupt capability"):
            await rt.interrupt(work.id, request_id="op-1")
        assert await rt.events(limit=100) == before
        assert (await rt.execution(lease.execution_id)).state is ExecutionState.RUNNING
        assert await rt.intents(lease.execution_id) == []


async def test_an_operator_interrupt_records_its_event_and_ends_the_attempt_keeping_the_input(
    open_rt: OpenRuntime,
) -> None:
    pinned = BindingRef(name="py", executor="python", capabilities=frozenset({"interrupt"}))
    async with open_rt(config(MAIN), PythonExecutor()) as rt:
        work, [first] = await work_with_input(rt)
        lease = await rt.claim(work.id, owner="host", binding=pinned)

        intent = await rt.interrupt(work.id, reason="runaway", request_id="op-1")
        control = await rt.event_by_delivery("core", "manual.interrupt/op-1")
        assert (control.type, control.work_id, control.scope) == (MANUAL_INTERRUPT, work.id, SCOPE)
        assert control.payload == {"reason": "runaway", "execution": lease.execution_id}
        assert (intent.kind, intent.event_id, intent.execution_id) == (
            IntentKind.INTERRUPT,
            control.id,
            lease.execution_id,
        )
        await stale(rt, lease)  # fenced at the commit, before the executor is even asked

        await rt.wait_idle()
        ended = await rt.execution(lease.execution_id)
        assert (ended.state, ended.interrupt_event_id) == (ExecutionState.CANCELLED, control.id)
        ready = await rt.work(work.id)
        assert (ready.state, ready.pending_inputs) == (WorkState.READY, (first.id,))  # control is no input

        # a replay of the same request targets the attempt it first targeted, never the next one
        second = await rt.claim(work.id, owner="host", binding=pinned)
        replayed = await rt.interrupt(work.id, reason="runaway", request_id="op-1")
        assert replayed.execution_id == lease.execution_id
        assert (await rt.execution(second.execution_id)).state is ExecutionState.RUNNING
        await publish(rt, ev("d-2", key="pr/2"))
        with pytest.raises(InvalidRequest, match="'op-1' was already used for work"):
            await rt.interrupt((await rt.work_for_key("pr/2")).id, request_id="op-1")


@pytest.mark.parametrize(
    ("state", "outcome", "told"),
    [
        (ExecutionState.COMPLETED, '{"kind":"completed"}', "completed"),
        (ExecutionState.FAILED, '{"kind":"failed","error":"boom"}', "failed"),
        (ExecutionState.FAILED, '{"kind":"failed","error":"gone","recovery":true}', "not_adoptable"),
        (ExecutionState.FAILED, '{"kind":"failed","timeout_event_id":"ev_1"}', "timed_out"),
        (ExecutionState.CANCELLED, '{"kind":"interrupted"}', "interrupted"),
        (ExecutionState.CANCELLED, None, "cancelled"),
        (ExecutionState.HANDOFF, None, "handoff"),
    ],
)
def test_an_ended_attempt_is_told_apart_by_what_its_outcome_says(
    state: ExecutionState, outcome: str | None, told: str
) -> None:
    # catches an `AttemptEnded` (and the metric counting it) that reads the outcome only for failures:
    # an interrupted attempt would be counted as cancelled
    assert ended_as(state, outcome) == told
