"""A drain before a clean stop (`Runtime.drain`, docs/operations.md "Stopping"): the runtime starts
nothing more, and its running python functions return and commit; the next open starts what waited.
Without it, closing cancels a running function, and the next open fails its attempt into a retry."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from loom import Completed, Config, EventIn, InvalidRequest, ManualClock, RunRequest, Runtime, open_runtime
from loom.plugins.python_executor import PythonExecutor
from loom.records.executor import Toolbelt
from loom.records.work import ExecutionState, Outcome, WorkState

CONFIG = Config.from_toml("""
[work_kinds.lane]
standing = true

[scopes.shop.bindings.py]
executor = "python"
config = { function = "run" }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
work_kind = "lane"
binding = "py"
""")


class Function:
    """The python function ``run``: each call is noted, and returns once ``go`` is set."""

    def __init__(self, *, go: bool = False) -> None:
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.started = trio.Event()
        self.go = trio.Event()
        if go:
            self.go.set()
        self._counted: tuple[int, trio.Event] | None = None

    def executor(self) -> PythonExecutor:
        executor = PythonExecutor()

        @executor.function("run")
        async def run(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
            self.calls.append((request.work_id, tuple(event.id for event in request.inputs)))
            self.started.set()
            if self._counted is not None and len(self.calls) >= self._counted[0]:
                self._counted[1].set()
            await self.go.wait()
            return Completed()

        return executor

    async def called(self, times: int) -> None:
        if len(self.calls) < times:
            self._counted = (times, trio.Event())
            await self._counted[1].wait()


@asynccontextmanager
async def running(
    store: str, clock: ManualClock, function: Function, *, started: bool = True
) -> AsyncIterator[Runtime]:
    """A runtime on ``store`` whose executor runs ``function``; with ``started``, order 1's attempt is
    running in it."""
    async with open_runtime(
        store, clock=clock, config=CONFIG, plugins=[function.executor()], load_entry_points=False
    ) as rt:
        if started:
            await rt.publish(order(1))
            await function.started.wait()
        yield rt


def order(n: int, delivery: str = "a") -> EventIn:
    return EventIn(
        source="shop", delivery_id=f"{n}-{delivery}", type="order.placed", scope="shop", key=f"order/{n}"
    )


async def test_a_drain_lets_a_running_function_commit_and_starts_nothing_new(
    durable_store: str, clock: ManualClock
) -> None:
    """Catches a stop that cancels a running function (its attempt then fails at the next open and
    its Work spends a retry: the control below), a drain that still starts a new Work or chains the
    next attempt into the running one's completion, and one that loses what waited for the next open."""
    first = Function()
    async with running(durable_store, clock, first) as rt:
        left: list[int] = []
        async with trio.open_nursery() as nursery:

            async def drain() -> None:
                left.append(await rt.drain(60))

            nursery.start_soon(drain)
            await trio.testing.wait_all_tasks_blocked()
            queued = await rt.publish(order(1, "b"))  # for the running Work: its next attempt's input
            new = await rt.publish(order(2))  # a new Work, which would start at once
            await rt.wait_idle()
            assert len(first.calls) == 1, "a draining runtime starts nothing"
            first.go.set()
        assert left == [0]
        one, two = await rt.work_for_key("order/1"), await rt.work_for_key("order/2")
        assert (one.attempts, one.pending_inputs, one.state) == (1, (queued.id,), WorkState.READY)
        assert (two.attempts, two.state) == (0, WorkState.READY)
        assert len(first.calls) == 1
    after = Function(go=True)
    async with running(durable_store, clock, after, started=False) as rt:
        await after.called(2)
        await rt.wait_idle()
        assert sorted(after.calls) == sorted([(one.id, (queued.id,)), (two.id, (new.id,))])
        for work, attempts in ((one, 2), (two, 1)):
            history = await rt.history(work.id)
            states = [execution.state for execution in history.executions]
            assert states == [ExecutionState.COMPLETED] * attempts, (work.id, states)


async def test_without_a_drain_a_stop_fails_the_running_function(
    durable_store: str, clock: ManualClock
) -> None:
    """The control: the same stop without `Runtime.drain` fails the running function's attempt (a
    Work of a kind with retries would spend one)."""
    first = Function()
    async with running(durable_store, clock, first) as rt:
        work_id = (await rt.work_for_key("order/1")).id
    after = Function(go=True)
    async with running(durable_store, clock, after, started=False) as rt:
        await rt.wait_idle()
        history = await rt.history(work_id)
        assert [execution.state for execution in history.executions] == [ExecutionState.FAILED]


async def test_a_drain_that_runs_out_of_grace_answers_what_still_runs(
    durable_store: str, clock: ManualClock
) -> None:
    """Catches a drain that waits past its grace, or answers 0 with a function still running."""
    first = Function()
    async with running(durable_store, clock, first) as rt:
        assert await rt.drain(0) == 1
        first.go.set()


@pytest.mark.parametrize("grace", [-1, math.nan, math.inf, 3601, True, "5", None])
async def test_a_drain_refuses_a_grace_that_is_no_seconds(grace: object) -> None:
    """Catches a refused drain that still stops the runtime from starting attempts."""
    function = Function(go=True)
    async with open_runtime(
        ":memory:", config=CONFIG, plugins=[function.executor()], load_entry_points=False
    ) as rt:
        with pytest.raises(InvalidRequest, match="grace_s must be seconds from 0 to 3600"):
            await rt.drain(grace)  # type: ignore[arg-type]
        await rt.publish(order(1))
        await function.called(1)
