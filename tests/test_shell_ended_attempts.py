"""A shell attempt's process once its attempt is over (docs/plugins.md, "The shell executor": however an
attempt ends, what is left of its process group is killed).

A process may end its own attempt through the service's toolbelt (``/complete``, ``/wait``) and go on
running. The runner that launched it learns that the lease is gone, and why: at once when the call
reached its own runtime, at its next renewal otherwise. An attempt that ended under that very lease is
over, so its process group is stopped; an attempt lost to a recovery is left running for the
recovering executor to adopt.

The tests stand in for the process's HTTP calls with the embedded calls the service makes for them
(`Runtime.lease_for` with the token the process holds, then `complete` or `wait`). Processes are waited
on through pidfds under a deadline; the renewal is brought on by moving the manual clock.
"""

from __future__ import annotations

import os
import select
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing
from test_shell_executor import (
    DEADLINE_S,
    WAIT_FOR_GO,
    Toolbelt,
    appears,
    job,
    left_running,
    runtime_config,
    sh,
    until_adopted,
    until_work,
)

import loom
from loom.kernel.authority import Authority
from loom.kernel.executions import KindPolicy, complete_in_tx
from loom.plugins.shell import ShellExecutor
from loom.testing import T0_MS
from loom.testing.internals import storage_of

LEASE_MS = 30_000
RENEWAL_MS = LEASE_MS // 3 + 1
"""Past the moment the runner renews a lease it took at the start (two thirds of the way before it expires)."""

SCRIPT = 'sleep 600 & echo $$ $! > "$LOOM_DIR/pids.tmp"; mv "$LOOM_DIR/pids.tmp" "$LOOM_DIR/pids"; wait'
"""The command and a background process in its group, both told to the test through a file."""


@asynccontextmanager
async def running_attempt(
    tmp_path: Path, clock: loom.ManualClock
) -> AsyncIterator[tuple[loom.Runtime, loom.Execution, list[int]]]:
    """A runtime whose attempt runs ``SCRIPT``; the attempt (pinned) and pidfds of its three processes.
    They are killed at the end whatever happened."""
    pids: list[int] = []
    fds: list[int] = []
    try:
        async with open_shell_runtime(":memory:", tmp_path, clock) as rt:
            execution = await started(rt, pids)
            fds = [os.pidfd_open(pid) for pid in pids]
            yield rt, execution, fds
    finally:
        end(pids, fds)


def open_shell_runtime(
    db: str | Path, tmp_path: Path, clock: loom.ManualClock
) -> AbstractAsyncContextManager[loom.Runtime]:
    config = runtime_config(["sh", "-c", SCRIPT])
    executor = ShellExecutor(state_dir=tmp_path / "state")
    return loom.open_runtime(db, clock=clock, config=config, plugins=[executor], lease_ms=LEASE_MS)


async def started(rt: loom.Runtime, pids: list[int]) -> loom.Execution:
    """Publish a job and wait for its attempt's process to start; its pids go into ``pids``: the
    wrapper (the group's leader), the command and its background process."""
    await rt.publish(job(1))
    work = await until_work(rt, "job/1", loom.WorkState.RUNNING)
    assert work.current_execution_id is not None
    async with rt.watch() as notices:
        with trio.fail_after(DEADLINE_S):
            while True:  # its pid is pinned just after the process starts
                execution = await rt.execution(work.current_execution_id)
                if execution.metadata is not None and "pid" in execution.metadata:
                    break
                await notices.__anext__()
    directory = Path(execution.metadata["dir"])
    await appears(directory / "pids")
    pids.extend([execution.metadata["pid"], *(int(pid) for pid in (directory / "pids").read_text().split())])
    return execution


def end(pids: list[int], fds: list[int]) -> None:
    """Kill the processes, and wait until each has exited (a process just sent SIGKILL is still
    running for a moment: the suite's check for processes left behind saw one)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for fd in fds:
        select.select([fd], [], [], DEADLINE_S)
        os.close(fd)


def reaped(pid: int) -> None:
    """Wait for this process's child ``pid`` to exit, and reap it (its pid then names no process)."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass  # reaped already


def alive(fd: int) -> bool:
    """Whether the process behind the pidfd ``fd`` still runs (its pidfd is readable once it exits)."""
    return not select.select([fd], [], [], 0)[0]


@pytest.mark.parametrize("how", ["complete", "wait"])
async def test_a_process_that_ended_its_own_attempt_is_stopped_at_once(tmp_path: Path, how: str) -> None:
    """The process ends its attempt through this runtime's service (`Runtime.complete`, `Runtime.wait`),
    and nothing else happens: no clock moves. Catches a runner that, on losing the lease of an attempt
    its process ended, only stops watching (the command and its background process ran on beside the
    next attempts: both stayed alive past the deadline), and one that finds out only at its next
    renewal."""
    clock = loom.ManualClock(start_ms=T0_MS)
    async with running_attempt(tmp_path, clock) as (rt, execution, fds):
        token = (Path(execution.metadata["dir"]) / "token").read_text()
        lease = await rt.lease_for(execution.id, token)
        if how == "complete":
            ended = await rt.complete(lease, loom.Completed())
            assert ended.state is loom.ExecutionState.COMPLETED
        else:
            ended = await rt.wait(lease, loom.WaitSpec(types=("job.more",)))
            assert ended.state is loom.ExecutionState.WAITED
        with trio.fail_after(DEADLINE_S):
            for fd in fds:
                await trio.lowlevel.wait_readable(fd)  # each process of the attempt ended
        (recorded,) = (await rt.history(execution.work_id)).executions
        assert recorded.state is ended.state, "the outcome the process committed stands"


async def test_an_attempt_ended_through_another_node_is_stopped_at_the_next_renewal(tmp_path: Path) -> None:
    """The process's completion reached another node (committed to the shared store, not through this
    runtime): the runner learns of it when it next renews the lease. Catches a runner that only stops
    watching an attempt whose lease it lost (seen: the processes stayed alive past the deadline)."""
    clock = loom.ManualClock(start_ms=T0_MS)
    async with running_attempt(tmp_path, clock) as (rt, execution, fds):
        token = (Path(execution.metadata["dir"]) / "token").read_text()
        lease = await rt.lease_for(execution.id, token)
        kind = KindPolicy()
        await storage_of(rt).submit(complete_in_tx, Authority.of(lease), loom.Completed(), kind)
        assert all(alive(fd) for fd in fds), "nothing here knows of it before the renewal"
        clock.advance(RENEWAL_MS)
        with trio.fail_after(DEADLINE_S):
            for fd in fds:
                await trio.lowlevel.wait_readable(fd)
        (recorded,) = (await rt.history(execution.work_id)).executions
        assert recorded.state is loom.ExecutionState.COMPLETED


async def test_a_process_whose_lease_expired_is_left_for_the_recovery_to_adopt(tmp_path: Path) -> None:
    """The other side: a lease lost because it expired (the clock jumped past it before the renewal)
    is not an ended attempt. Catches a runner that stops the process on any lost lease (the recovery
    then finds it killed, and the attempt fails instead of being adopted)."""
    clock = loom.ManualClock(start_ms=T0_MS)
    async with running_attempt(tmp_path, clock) as (rt, execution, fds):
        clock.advance(LEASE_MS + 1)
        now = await until_adopted(rt, execution)
        assert all(alive(fd) for fd in fds), "the adopted process runs on"
        assert now.attempt == execution.attempt


async def test_a_recovery_cancelled_after_a_second_one_adopted_leaves_the_process_to_interrupt(
    tmp_path: Path,
) -> None:
    """One runtime may recover the same attempt twice: its clock jumped past the first recovery's lease,
    so a second recovery adopted the process while the first one's watch was being cancelled. Catches
    the first watch's end dropping the second's entry: an operator's cancel then found nothing to
    interrupt, and the process ran on (seen under load in a restarted ``loom serve``)."""
    req, metadata = await left_running(tmp_path, sh(WAIT_FOR_GO))
    executor = ShellExecutor(state_dir=tmp_path)
    first, second = Toolbelt(req, token="token-2"), Toolbelt(req, token="token-3")
    watching_first = trio.CancelScope()
    outcomes: list[loom.Outcome] = []

    async def recover(toolbelt: Toolbelt, scope: trio.CancelScope) -> None:
        with scope:
            outcomes.append(await executor.recover(req, toolbelt, metadata))

    pidfd = os.pidfd_open(metadata["pid"])
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(recover, first, watching_first)
            await first.adopted.wait()
            nursery.start_soon(recover, second, trio.CancelScope())
            await second.adopted.wait()
            watching_first.cancel()
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(DEADLINE_S):
                await executor.interrupt(req.execution_id)
                await trio.lowlevel.wait_readable(pidfd)
        (ended,) = outcomes  # the second watch's; the first was cancelled
        assert isinstance(ended, loom.Failed)
        assert ended.error.startswith("interrupted")
    finally:
        os.close(pidfd)


async def test_an_attempt_whose_command_ended_while_loom_was_down_leaves_no_process_behind(
    tmp_path: Path,
) -> None:
    """The command exited while no loom watched it, leaving a background process in its session
    (``work; sleep 600 &``); the next loom reads its status and adopts the result. Catches a recovery
    that reads the status and leaves the background process running (seen: the ``sleep`` outlived the
    attempt)."""
    left = tmp_path / "left"
    script = f'sleep 600 & echo $! > "{left}.tmp"; mv "{left}.tmp" "{left}"; {WAIT_FOR_GO}'
    req, metadata = await left_running(tmp_path, sh(script))  # (its launch gone, the command goes on)
    (Path(metadata["dir"]) / "go").touch()  # now it exits, watched by no one
    await appears(left)
    sleeper = int(left.read_text())
    fd = os.pidfd_open(sleeper)
    try:
        await appears(Path(metadata["dir"]) / "status.json")
        with trio.fail_after(DEADLINE_S):
            await trio.to_thread.run_sync(reaped, metadata["pid"])  # the wrapper is gone for good
        assert alive(fd)
        outcome = await ShellExecutor(state_dir=tmp_path).recover(
            req, Toolbelt(req, token="token-2"), metadata
        )
        assert outcome == loom.Completed()
        with trio.fail_after(DEADLINE_S):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)
        try:
            os.kill(sleeper, signal.SIGKILL)
        except ProcessLookupError:
            pass


@asynccontextmanager
async def left_by_a_closed_loom(
    tmp_path: Path, *, completed: bool
) -> AsyncIterator[tuple[Callable[[], AbstractAsyncContextManager[loom.Runtime]], loom.Execution, list[int]]]:
    """A runtime on a file ran ``SCRIPT`` and closed, its processes going on (``completed``: the
    attempt was completed first, straight in the store, as the service's ``/complete`` does). Yields
    how to open the store again, the attempt, and pidfds of its processes, killed at the end."""
    clock = loom.ManualClock(start_ms=T0_MS)
    db = tmp_path / "loom.db"
    pids: list[int] = []
    fds: list[int] = []
    try:
        async with open_shell_runtime(db, tmp_path, clock) as rt:
            execution = await started(rt, pids)
            fds = [os.pidfd_open(pid) for pid in pids]
            if completed:
                token = (Path(execution.metadata["dir"]) / "token").read_text()
                lease = await rt.lease_for(execution.id, token)
                await storage_of(rt).submit(
                    complete_in_tx, Authority.of(lease), loom.Completed(), KindPolicy()
                )
        yield (lambda: open_shell_runtime(db, tmp_path, clock)), execution, fds
    finally:
        end(pids, fds)


async def test_an_attempt_that_ended_just_before_its_loom_died_is_stopped_by_the_next_open(
    tmp_path: Path,
) -> None:
    """The process completed its attempt through the service, and its loom died before it stopped the
    process (here: the completion is committed to the store, not through the runtime, which then
    closes before its next renewal, the process going on as after a kill -9). The next open of the
    store stops what runs of the ended attempt. Catches an open that looks only at attempts still
    running (seen: the three processes stayed alive past the deadline)."""
    async with left_by_a_closed_loom(tmp_path, completed=True) as (reopen, execution, fds):
        assert all(alive(fd) for fd in fds), "a closed loom leaves its processes running (on_close)"
        async with reopen() as rt:
            with trio.fail_after(DEADLINE_S):
                for fd in fds:
                    await trio.lowlevel.wait_readable(fd)
            (recorded,) = (await rt.history(execution.work_id)).executions
            assert recorded.state is loom.ExecutionState.COMPLETED


async def test_a_running_attempt_is_left_to_its_recovery_by_an_open(tmp_path: Path) -> None:
    """The other side: the attempt of a loom that closed (or died) is still running in the store, its
    processes going on; the next open leaves them to the recovery, which adopts them. Catches an open
    that stops every process no task of it watches (seen: the adopted attempt's processes ended)."""
    async with left_by_a_closed_loom(tmp_path, completed=False) as (reopen, execution, fds):
        async with reopen() as rt:
            adopted = await until_adopted(rt, execution)
            await rt.wait_idle()
            assert adopted.state is loom.ExecutionState.RUNNING
            assert all(alive(fd) for fd in fds)
