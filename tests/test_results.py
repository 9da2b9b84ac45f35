"""Results (docs/concepts.md "Results"): an attempt completes with a JSON value, the Work's outcome is read
with `Runtime.result` and awaited with `Runtime.wait_for`, which wakes on the commit that settles it and
reads nothing while nothing changes; a watch on a ``:memory:`` runtime waits instead of waking itself."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

import loom
from loom import Completed, Config, EventIn, Failed, InvalidRequest, ManualClock, WaitTimedOut, open_runtime
from loom.notices import AttemptFailed, Committed, EventAccepted
from loom.plugins.python_executor import PythonExecutor
from loom.records.validation import MAX_VALUE_BYTES
from loom.records.work import RetryState, WorkState
from loom.testing import T0_MS
from loom.testing.internals import storage_of

CONFIG = Config.from_toml("""
[work_kinds.quick]
retry_attempts = 2
retry_backoff_ms = [1000]

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
""")
PY_CONFIG = Config.from_toml("""
[work_kinds.quick]
retry_attempts = 2
retry_backoff_ms = [1000]

[scopes.shop.bindings.py]
executor = "python"
config = { function = "run" }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
work_kind = "quick"
binding = "py"
""")


def order(n: int) -> EventIn:
    return EventIn(source="shop", delivery_id=f"o-{n}", type="order.placed", scope="shop", key=f"order/{n}")


@asynccontextmanager
async def host(store: str, **kwargs: Any) -> AsyncIterator[loom.Runtime]:
    """A runtime whose host drives routing and attempts itself (no background actor)."""
    async with open_runtime(
        store, clock=ManualClock(start_ms=T0_MS), config=CONFIG, load_entry_points=False, actors=(), **kwargs
    ) as rt:
        yield rt


async def started(rt: loom.Runtime, n: int) -> loom.Lease:
    await rt.publish(order(n))
    await rt.poll()
    work = await rt.work_for_key(f"order/{n}")
    return await rt.claim(work.id, owner="host")


async def test_a_completed_attempt_value_is_the_work_result(loom_store: str) -> None:
    """Catches a value that is dropped on the way to the store (or read from the wrong attempt)."""
    async with host(loom_store) as rt:
        lease = await started(rt, 1)
        before = await rt.result(lease.work_id)
        assert (before.state, before.done, before.settled, before.value) == (
            WorkState.RUNNING,
            False,
            False,
            None,
        )
        await rt.complete(lease, Completed(value={"total": 42, "items": ["a", "b"]}))
        result = await rt.result(lease.work_id)
        assert result.state is WorkState.COMPLETED
        assert (result.done, result.settled) == (True, True)
        assert result.value == {"total": 42, "items": ["a", "b"]}
        assert (result.error, result.attempts, result.execution_id) == (None, 1, lease.execution_id)


async def test_a_value_larger_than_a_payload_is_refused_and_changes_nothing(loom_store: str) -> None:
    """Catches a result limit that is not enforced, or one that stores part of the outcome first."""
    async with host(loom_store) as rt:
        lease = await started(rt, 1)
        big = "x" * MAX_VALUE_BYTES
        with pytest.raises(InvalidRequest, match=r"outcome\.value is larger than") as refused:
            await rt.complete(lease, Completed(value=big))
        assert refused.value.field == "outcome.value"
        with pytest.raises(InvalidRequest, match="not JSON data"):
            await rt.complete(lease, Completed(value={1, 2}))
        assert (await rt.work(lease.work_id)).state is WorkState.RUNNING
        await rt.complete(lease, Completed(value="x" * (MAX_VALUE_BYTES - 2)))  # with its quotes: the limit
        assert (await rt.result(lease.work_id)).value == "x" * (MAX_VALUE_BYTES - 2)


async def test_wait_for_wakes_on_the_commit_and_reads_nothing_while_nothing_changes() -> None:
    """Catches a waiter that polls the store (its reads keep coming while nothing changes), and one that
    misses the commit that settles the Work."""
    async with host(":memory:") as rt:
        lease = await started(rt, 1)
        storage = rt._p.storage  # counting the store's requests is the point
        got: list[loom.WorkResult] = []

        async def waiter() -> None:
            got.append(await rt.wait_for(lease.work_id, timeout=60))

        async def quiet() -> None:
            # every task blocked, and none on a call in the storage thread (a task waiting for the
            # thread counts as blocked, and the read it waits for is counted once it is answered); a
            # waiter that keeps the thread busy (it polls) fails here instead of hanging the test
            with trio.fail_after(10):
                await trio.testing.wait_all_tasks_blocked()
                while storage._thread._busy:
                    await trio.testing.wait_all_tasks_blocked()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await quiet()
            requests = storage.stats.requests + storage.stats.reads
            for _ in range(20):
                await quiet()
            done = storage.stats.requests + storage.stats.reads
            assert done == requests, "the waiter read the store while nothing changed"
            assert not got
            await rt.complete(lease, Completed(value=7))
        assert got[0].value == 7
        assert got[0].state is WorkState.COMPLETED


async def test_wait_for_times_out_with_the_outcome_as_it_stood(loom_store: str) -> None:
    """Catches a timeout that hangs, or that loses what the Work looked like."""
    async with host(loom_store) as rt:
        lease = await started(rt, 1)
        with pytest.raises(WaitTimedOut, match="is running") as timed_out:
            await rt.wait_for(lease.work_id, timeout=0)
        assert isinstance(timed_out.value, TimeoutError)
        assert timed_out.value.result.state is WorkState.RUNNING  # type: ignore[attr-defined]
        with pytest.raises(InvalidRequest, match="timeout must be seconds"):
            await rt.wait_for(lease.work_id, timeout=-1)
        with pytest.raises(loom.NotFound):
            await rt.wait_for("wk_nope", timeout=0)


async def test_a_failed_attempt_shows_its_error_and_backoff_and_a_spent_budget_settles_the_wait(
    loom_store: str,
) -> None:
    """Catches a result without the failure (its error, the retry time), a failure nobody is told of
    (no diagnostic, no notice), and a wait that never ends for a Work whose retries are spent."""
    executor = PythonExecutor()
    clock = ManualClock(start_ms=T0_MS)

    @executor.function("run")
    async def run(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        return Failed(error=f"no stock (attempt {request.attempt})")

    async with open_runtime(
        loom_store, clock=clock, config=PY_CONFIG, plugins=[executor], load_entry_points=False
    ) as rt:
        async with rt.watch() as notices:
            await rt.publish(order(1))
            await rt.wait_idle()
            work = await rt.work_for_key("order/1")
            first = await rt.result(work.id)
            assert (first.state, first.retry, first.failures) == (WorkState.READY, RetryState.BACKOFF, 1)
            assert first.error == "no stock (attempt 1)"
            assert first.next_retry_at_ms == T0_MS + 1000
            assert not first.settled
            failed = [n async for n in _until(notices, AttemptFailed)]
            assert failed[-1].retry_at_ms == T0_MS + 1000
            assert "retry 1 of 1 due at 2026-01-01T00:00:01.000Z" in failed[-1].then
        diagnostics = await rt.diagnostics(kind="attempt_failed", subject=work.id)
        assert [d.detail["attempt"] for d in diagnostics] == [1]
        assert "no stock (attempt 1)" in diagnostics[0].message

        async def waiter(result: list[loom.WorkResult]) -> None:
            result.append(await rt.wait_for(work.id, timeout=60))

        got: list[loom.WorkResult] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, got)
            await trio.testing.wait_all_tasks_blocked()
            clock.advance(1000)  # the retry is due: attempt 2 fails too, and the budget is spent
        settled = got[0]
        assert (settled.settled, settled.done, settled.retry) == (True, False, RetryState.EXHAUSTED)
        assert settled.error == "no stock (attempt 2)"
        assert settled.held
        assert "retries exhausted" in (settled.hold_reason or "")
        assert len(await rt.diagnostics(kind="attempt_failed", subject=work.id)) == 2


async def _until(notices: loom.Watch, kind: type[Any]) -> AsyncIterator[Any]:
    async for notice in notices:
        if isinstance(notice, kind):
            yield notice
            return


async def test_a_watch_on_memory_is_not_woken_by_reads() -> None:
    """Catches the spin of a watcher that reads at each notice: on ``:memory:`` every read is a storage
    request, and a batch of reads alone used to announce itself as `Committed`, waking the watcher."""
    async with host(":memory:") as rt:
        lease = await started(rt, 1)
        async with rt.watch() as notices:
            await rt.work(lease.work_id)  # a read: it commits nothing
            await rt.publish(order(2))
            first = await notices.__anext__()
        assert isinstance(first, EventAccepted), first
        assert not isinstance(first, Committed)


async def test_publish_routed_answers_the_checkpoint_its_acceptance_commit_wrote(loom_store: str) -> None:
    """`Runtime.publish_routed`: the checkpoint the acceptance commit wrote is what a read answers after
    it; on a database alone every Event a running router plans routes in that commit, on a shared one
    at least those whose routing is their checkpoint alone (no route matched). ``None``: a duplicate, or
    no router. Catches a checkpoint that is not the committed one, and an answer that hides a routing
    the commit did."""
    async with open_runtime(loom_store, config=CONFIG, load_entry_points=False) as rt:
        alone = not storage_of(rt).shared
        routed, routing = await rt.publish_routed(order(1))
        stray, unmatched = await rt.publish_routed(
            EventIn(source="shop", delivery_id="x", type="refund.asked", scope="shop")
        )
        assert unmatched is not None
        assert (unmatched.status.value, unmatched.route) == ("unmatched", None)
        assert unmatched == await rt.checkpoint(stray.id)
        if alone:
            assert routing is not None
            assert (routing.status.value, routing.route) == ("routed", "orders")
        if routing is not None:
            assert routing == await rt.checkpoint(routed.id)
        again, known = await rt.publish_routed(order(1))
        assert again.duplicate
        assert known is None, "a duplicate's checkpoint is an earlier commit's: read it"
    async with host(loom_store) as rt:  # no router: accepted, not routed yet
        pending, none = await rt.publish_routed(order(3))
        assert none is None
        assert await rt.checkpoint(pending.id) is None


async def test_wait_routed_says_which_route_matched_or_that_none_did(loom_store: str) -> None:
    """Catches a send that cannot tell a routed Event from one that matched nothing."""
    async with open_runtime(loom_store, config=CONFIG, load_entry_points=False) as rt:
        routed = await rt.publish(order(1))
        checkpoint = await rt.wait_routed(routed.id, timeout=30)
        assert checkpoint is not None
        assert (checkpoint.status.value, checkpoint.route) == ("routed", "orders")
        stray = await rt.publish(EventIn(source="shop", delivery_id="x", type="refund.asked", scope="shop"))
        checkpoint = await rt.wait_routed(stray.id, timeout=30)
        assert checkpoint is not None
        assert (checkpoint.status.value, checkpoint.route) == ("unmatched", None)
    async with host(loom_store) as rt:  # no router: accepted, not routed yet
        pending = await rt.publish(order(3))
        assert await rt.wait_routed(pending.id, timeout=0) is None
