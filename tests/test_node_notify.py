"""Nodes hear each other's commits at once (docs/backends.md, "How nodes hear each other"): each commit
on a shared database sends a small PostgreSQL notification naming what changed, and the other nodes
read just that from their cursors. The periodic check is turned off here (``resync_ms`` of an hour on
a clock that never gets there), so only a notification can carry what each test needs.

Catches: a node that learns of another node's timers, ready Work, routing or leases only at the next
rescan, and a node that takes its own notifications for another's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import pytest
import trio
import trio.lowlevel

from loom import Config, EventIn, ManualClock, NotFound, Runtime, open_runtime
from loom.plugins.python_executor import PythonExecutor
from loom.records.events import Event
from loom.records.executor import Toolbelt
from loom.records.notices import (
    EventAccepted,
    ExecutionFenced,
    LeaseExpiry,
    StoreChanged,
    TimerArmed,
    WorkReady,
)
from loom.records.timers import TimerSpec
from loom.records.waits import Waiting, WaitSpec
from loom.records.work import Completed, Outcome, RunRequest, WorkState
from loom.store._notify import parse, summarize
from loom.testing import T0_MS
from loom.testing.internals import timer_actor_of
from loom.testing.postgres import PostgresCluster

HOUR = 3_600_000
STALL_S = 30  # a watchdog only


def config(*, binding: bool) -> Config:
    route: dict[str, Any] = {"name": "orders", "types": ["order.*"], "create_work": True}
    scope: dict[str, Any] = {"routes": [route]}
    if binding:
        route["binding"] = "py"
        scope["bindings"] = {"py": {"executor": "python", "config": {"function": "run"}}}
    return Config.from_dict({"scopes": {"shop": scope}})


@pytest.fixture
def shared_db(loom_postgres: PostgresCluster) -> str:
    return loom_postgres.create_database(template=loom_postgres.migrated_template())


@asynccontextmanager
async def node(url: str, clock: ManualClock, name: str, **options: Any) -> AsyncIterator[Runtime]:
    async with open_runtime(
        url, clock=clock, owner=name, load_entry_points=False, resync_ms=HOUR, **options
    ) as rt:
        yield rt


async def heard(rt: Runtime, check: Callable[[StoreChanged], bool]) -> StoreChanged:
    """The first notification from another node that ``check`` accepts (a watch sees them too)."""
    async with rt.watch() as notices:
        with trio.fail_after(STALL_S):
            async for notice in notices:
                if isinstance(notice, StoreChanged) and check(notice):
                    return notice
    raise AssertionError("the runtime closed")


async def until(rts: list[Runtime], check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait on the commits of every node (never on a timer) until ``check()`` holds."""
    async with AsyncExitStack() as stack:
        watches = [await stack.enter_async_context(rt.watch()) for rt in rts]
        with trio.move_on_after(STALL_S) as scope:
            while not await check():
                async with trio.open_nursery() as nursery:
                    for watch in watches:
                        nursery.start_soon(_next, watch, nursery.cancel_scope)
        if scope.cancelled_caught:
            raise AssertionError(f"timed out waiting for {what}")


async def _next(watch: Any, done: trio.CancelScope) -> None:
    await watch.__anext__()
    done.cancel()


def order(key: str) -> EventIn:
    return EventIn(source="shop", delivery_id=key, type="order.placed", scope="shop", key=key)


async def test_a_timer_armed_on_one_node_is_known_to_another_at_once(shared_db: str) -> None:
    """Catches: the deadline of a timer another node armed learned only at a rescan."""
    clock = ManualClock(start_ms=T0_MS)
    async with (
        node(shared_db, clock, "a", actors=()) as a,
        node(shared_db, clock, "b", actors=("timers",)) as b,
    ):
        assert timer_actor_of(b).next_due_ms is None
        async with trio.open_nursery() as nursery:
            got: list[StoreChanged] = []

            async def listen() -> None:
                got.append(await heard(b, lambda n: n.timer_due_ms is not None))

            nursery.start_soon(listen)
            await trio.lowlevel.checkpoint()
            await a.arm(TimerSpec(id="t", fire_at_ms=T0_MS + 1_000, source="c", type="c.tick", scope="shop"))
        assert got[0].timer_due_ms == T0_MS + 1_000

        await until(
            [a, b], lambda: _is(timer_actor_of(b).next_due_ms, T0_MS + 1_000), "b to know the deadline"
        )
        clock.advance(1_000)
        await until([a, b], lambda: _fired(a, "t"), "b to fire a's timer")
        (firing,) = await a.firings("t")
        assert firing.at_ms == T0_MS + 1_000


async def _is(value: object, expected: object) -> bool:
    return value == expected


async def _fired(rt: Runtime, timer_id: str) -> bool:
    return bool(await rt.firings(timer_id))


class Steps:
    """The executor function: each attempt waits for an ``order.paid`` first, then completes."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []

    async def run(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        self.runs.append((request.work_id, request.attempt))
        if request.attempt == 1:
            return Waiting(wait=WaitSpec(types=("order.paid",)))
        return Completed()


async def test_a_node_that_only_publishes_has_its_events_routed_and_run_by_another(shared_db: str) -> None:
    """A publisher with no actors (it routes nothing) hands its Events to a node that routes them, at
    once, and the wait its second Event wakes continues there. Catches: Events of a node without a
    router left unrouted until a rescan."""
    clock = ManualClock(start_ms=T0_MS)
    steps = Steps()
    executor = PythonExecutor()
    executor.register("run", steps.run)
    async with (
        node(shared_db, clock, "publisher", actors=(), config=config(binding=False)) as publisher,
        node(shared_db, clock, "worker", config=config(binding=True), plugins=[executor]) as worker,
    ):
        both = [publisher, worker]
        await publisher.publish(order("o/1"))
        work = await _work(both, "o/1")
        await until(both, lambda: _waiting(worker, work), "attempt 1 to run and wait")
        await publisher.publish(
            EventIn(source="shop", delivery_id="paid-1", type="order.paid", scope="shop", key="o/1")
        )
        await until(both, lambda: _completed(worker, work), "the wake, and attempt 2")
        assert steps.runs == [(work, 1), (work, 2)]


class Holding:
    def __init__(self) -> None:
        self.started = trio.Event()

    async def run(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        self.started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_leases_a_closing_node_releases_are_recovered_by_another_at_once(shared_db: str) -> None:
    """A clean close lets its leases expire now; another node's recoverer hears of it and takes the
    attempt up without waiting for the lease to run out. Catches: a recoverer that learns of another
    node's leases only at a rescan (it would sleep until the original expiry, a lease length later)."""
    clock = ManualClock(start_ms=T0_MS)
    holding = Holding()
    executor = PythonExecutor()
    executor.register("run", holding.run)
    async with node(shared_db, clock, "b", actors=("recovery",), config=config(binding=False)) as b:
        async with node(shared_db, clock, "a", config=config(binding=True), plugins=[executor]) as a:
            await a.publish(order("o/1"))
            with trio.fail_after(STALL_S):
                await holding.started.wait()
            work = (await a.work_for_key("o/1")).id
            execution_id = (await a.work(work)).current_execution_id
            assert execution_id is not None

        async def recovered() -> bool:
            execution = await b.execution(execution_id)
            return execution.epoch == 2 and execution.owner == "b"

        await until([b], recovered, "b to recover a's attempt")
        assert clock.now_ms() == T0_MS, "at once: no lease ran out"


async def _work(rts: list[Runtime], key: str) -> str:
    async def owned() -> bool:
        try:
            await rts[0].work_for_key(key)
        except NotFound:
            return False
        return True

    await until(rts, owned, f"a Work for {key}")
    return (await rts[0].work_for_key(key)).id


async def _waiting(rt: Runtime, work_id: str) -> bool:
    return (await rt.work(work_id)).state is WorkState.WAITING


async def _completed(rt: Runtime, work_id: str) -> bool:
    return (await rt.work(work_id)).state is WorkState.COMPLETED


def test_a_payload_names_what_changed_and_its_own_node_ignores_it() -> None:
    """Catches: a node reacting to its own commits twice (once by notice, once by notification), and
    a payload that grows with the batch."""
    event = Event(
        id="ev",
        seq=41,
        source="s",
        delivery_id="d",
        type="t",
        scope="shop",
        key=None,
        work_id=None,
        execution_id=None,
        payload={},
        parent_id=None,
        cause_id=None,
        root_id="ev",
        depth=0,
        accepted_at_ms=0,
    )
    notices = [
        EventAccepted(event=event),
        TimerArmed(timer_id="t", revision=1, fire_at_ms=500),
        TimerArmed(timer_id="u", revision=1, fire_at_ms=300),
        LeaseExpiry(execution_id="x", expires_at_ms=900),
        WorkReady(work_id="w"),
        *[ExecutionFenced(execution_id=f"x{i}", work_id="w") for i in range(3)],
    ]
    payload = summarize(notices, "me")
    assert payload is not None
    assert parse(payload, "me") is None, "its own"
    theirs = parse(payload, "other")
    assert theirs == StoreChanged(
        origin="me",
        events_through=41,
        timer_due_ms=300,
        lease_expiry_ms=900,
        work_ready=True,
        fenced=("x0", "x1", "x2"),
    )
    many = [ExecutionFenced(execution_id=f"x{i:04}", work_id="w") for i in range(500)]
    big = summarize(many, "me")
    assert big is not None
    assert len(big) < 200
    assert parse(big, "other") == StoreChanged(origin="me", everything=True)
    assert summarize([], "me") is None
    assert parse("not json", "me") == StoreChanged(everything=True)


async def test_nodes_get_lease_owners_of_their_own_by_default(shared_db: str, tmp_path: Any) -> None:
    """Alone on a SQLite file a runtime holds its leases as ``loom``; on a shared database each node
    gets a name of its own, so a node's clean close releases its own leases only. Catches: every node
    named ``loom`` (one node's close would let the others' running attempts be taken up)."""
    clock = ManualClock(start_ms=T0_MS)
    async with open_runtime(str(tmp_path / "alone.db"), clock=clock, load_entry_points=False) as alone:
        assert alone.owner == "loom"
    async with (
        open_runtime(shared_db, clock=clock, load_entry_points=False, actors=()) as a,
        open_runtime(shared_db, clock=clock, load_entry_points=False, actors=()) as b,
    ):
        assert a.owner != b.owner
        assert a.owner.startswith("loom@")
