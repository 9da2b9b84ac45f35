"""The storage actor's worker thread (loom/store/_thread.py): every blocking call runs there, one at a
time, a call in flight is never abandoned by a cancel, an error comes back as itself, and the thread
ends with the actor."""

from __future__ import annotations

import threading

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

import loom
from loom.store._thread import WorkerThread
from loom.testing import T0_MS

GATE_TIMEOUT_S = 10


async def test_each_call_runs_in_the_one_thread_and_answers_its_result() -> None:
    """Wrong implementations caught: a call run on the trio thread (blocking the loop), or a new thread
    per call (the actor's connection would be used from several)."""
    worker = WorkerThread("test storage")
    try:
        seen = [await worker.run_sync(threading.get_ident) for _ in range(3)]
        assert await worker.run_sync(pow, 2, 10) == 1024
    finally:
        worker.stop()
    assert len(set(seen)) == 1
    assert seen[0] != threading.get_ident()


async def test_an_error_in_the_call_is_raised_to_its_caller_and_the_thread_goes_on() -> None:
    worker = WorkerThread("test storage")
    try:
        with pytest.raises(ZeroDivisionError):
            await worker.run_sync(divmod, 1, 0)
        assert await worker.run_sync(divmod, 7, 2) == (3, 1)
    finally:
        worker.stop()


async def test_a_cancel_waits_for_the_call_in_flight_to_end() -> None:
    """A batch's commit must not be abandoned half-way by a cancel: the caller stays until the call is
    over (its effects done) and gets its result; the cancel reaches it at its next checkpoint. Wrong
    implementation caught: an abort that succeeds at once (the caller would leave before the call
    ended, the commit still running, its result lost)."""
    worker = WorkerThread("test storage")
    inside, release = threading.Event(), threading.Event()
    done: list[str] = []

    def call() -> str:
        inside.set()
        assert release.wait(GATE_TIMEOUT_S), "the test never released the call"
        done.append("committed")
        return "committed"

    outcome: list[str] = []

    async def caller(scope: trio.CancelScope) -> None:
        with scope:
            outcome.append(await worker.run_sync(call))
            await trio.lowlevel.checkpoint()
            outcome.append("not cancelled")
        assert scope.cancelled_caught

    try:
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller, scope)
            assert await trio.to_thread.run_sync(inside.wait, GATE_TIMEOUT_S)
            scope.cancel()
            await wait_all_tasks_blocked()
            assert outcome == [], "the caller left before its call ended"
            assert done == []
            release.set()
        assert done == ["committed"]
        assert outcome == ["committed"]
    finally:
        release.set()
        worker.stop()


@pytest.mark.timeout(60)
async def test_a_stop_during_a_call_lets_it_answer_and_a_later_call_gets_a_new_thread() -> None:
    """Wrong implementations caught: a stop that closes the way back to the waiting caller while its call
    runs (the caller waits forever for an answer that cannot come: the test's timeout fails it), and one
    that leaves the next call to the ended thread."""
    worker = WorkerThread("test storage")
    inside, release = threading.Event(), threading.Event()

    def call() -> threading.Thread:
        inside.set()
        assert release.wait(GATE_TIMEOUT_S), "the test never released the call"
        return threading.current_thread()

    answers: list[threading.Thread] = []

    async def caller() -> None:
        answers.append(await worker.run_sync(call))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            assert await trio.to_thread.run_sync(inside.wait, GATE_TIMEOUT_S)
            worker.stop()
            release.set()
        (first,) = answers
        second = await worker.run_sync(threading.current_thread)
        assert second is not first, "the call after the stop ran on the stopped thread"
        first.join(GATE_TIMEOUT_S)
        assert not first.is_alive(), "the stopped thread did not end"
    finally:
        release.set()
        worker.stop()


async def test_the_thread_ends_with_the_runtime() -> None:
    """Wrong implementation caught: a thread left waiting for calls after its actor stopped (one more
    per runtime a process opens)."""
    before = {t for t in threading.enumerate() if t.name == "loom storage"}
    async with loom.open_runtime(":memory:", clock=loom.ManualClock(start_ms=T0_MS)) as rt:
        await rt.publish(loom.EventIn(source="test", delivery_id="d-1", type="t", scope="s"))
        ours = {t for t in threading.enumerate() if t.name == "loom storage"} - before
        assert len(ours) == 1
    (thread,) = ours
    thread.join(GATE_TIMEOUT_S)
    assert not thread.is_alive()


async def test_a_cancel_interrupts_an_interruptible_call_and_is_raised_once_it_ended() -> None:
    """A read may be stopped (``interrupt``): a cancel calls it, still waits for the call to end (the
    thread holds the connection until then), and is raised then rather than the call's answer. Wrong
    implementations caught: a cancel that leaves at once (the reader's connection still in use by the
    call), one that never interrupts (the caller waits for the whole call), one that answers."""
    worker = WorkerThread("test reader")
    inside, stop = threading.Event(), threading.Event()
    ended: list[str] = []

    def call() -> str:
        inside.set()
        assert stop.wait(GATE_TIMEOUT_S), "the call was never interrupted"
        ended.append("interrupted")
        return "an answer nobody asked for any more"

    def interrupt() -> None:
        assert ended == [], "interrupted after the call had ended"
        stop.set()

    got: list[str] = []
    try:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_inside() -> None:
                    assert await trio.to_thread.run_sync(inside.wait, GATE_TIMEOUT_S)
                    scope.cancel()

                nursery.start_soon(cancel_once_inside)
                got.append(await worker.run_sync(call, interrupt=interrupt))
        assert scope.cancelled_caught
        assert got == []
        assert ended == ["interrupted"], "the cancel was raised before the call ended"
        assert await worker.run_sync(pow, 3, 2) == 9  # the thread goes on
    finally:
        stop.set()
        worker.stop()
