"""Process hygiene of shell attempts (docs/plugins.md, "The shell executor"): an attempt starts with only
its own descriptors, and however it ends (it exits, or is interrupted, cancelled, timed out, or stopped by
a close) nothing of its process group outlives it, grandchildren included.

The command tells the test its grandchild's pid through a FIFO (a blocking read, in a thread), and the
test waits for that process to end on a pidfd under a deadline: nothing sleeps to synchronise.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

import loom
from loom.plugins.shell import ShellExecutor
from loom.records.work import WorkState
from loom.testing import T0_MS

DEADLINE_S = 20
"""Only detects a process that never ends; nothing waits on time."""


def config(command: list[str], *, timeout_ms: int | None = None, on_close: str = "leave") -> loom.Config:
    kind = {"retry_attempts": 1, **({"timeout_ms": timeout_ms} if timeout_ms else {})}
    return loom.Config.from_dict({
        "work_kinds": {"job": kind},
        "scopes": {"ops": {
            "bindings": {"sh": {"executor": "shell", "capabilities": ["interrupt"],
                                "config": {"command": command, "grace_s": 5, "on_close": on_close}}},
            "routes": [{"name": "jobs", "types": ["job.*"], "create_work": True, "work_kind": "job",
                        "binding": "sh"}],
        }},
    })  # fmt: skip


@asynccontextmanager
async def runtime(tmp_path: Path, cfg: loom.Config, clock: loom.ManualClock) -> AsyncIterator[loom.Runtime]:
    executor = ShellExecutor(state_dir=tmp_path / "shell")
    async with loom.open_runtime(
        str(tmp_path / "loom.db"), clock=clock, config=cfg, plugins=[executor], load_entry_points=False
    ) as rt:
        yield rt


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"  # a zombie has ended: its parent has not reaped it


async def ended(pidfd: int) -> None:
    with trio.fail_after(DEADLINE_S):
        await trio.lowlevel.wait_readable(pidfd)  # readable once the process has exited


async def processes(fifo: Path) -> list[tuple[int, int]]:
    """The pids the attempt's command wrote to ``fifo`` (its background child and its parent, the
    wrapper), each with a pidfd of it."""
    with trio.fail_after(DEADLINE_S):
        text = await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
    return [(int(pid), os.pidfd_open(int(pid))) for pid in text.split()]


async def start_job(rt: loom.Runtime) -> loom.Work:
    await rt.publish(loom.EventIn(source="t", delivery_id="j-1", type="job.run", scope="ops", key="job/1"))
    checkpoint = await rt.wait_routed(loom.records.ids.event_id("t", "j-1"), timeout=DEADLINE_S)
    assert checkpoint is not None
    assert checkpoint.work_id is not None
    return await rt.work(checkpoint.work_id)


# the command leaves a grandchild (a background sleep) and waits for it, or exits at once
WAITS = 'sleep 600 & echo $! $PPID > "$FIFO"; wait'
EXITS = 'sleep 600 & echo $! $PPID > "$FIFO"'


@pytest.mark.parametrize("how", ["exit", "interrupt", "cancel", "timeout", "close"])
async def test_no_process_of_an_attempt_outlives_it(tmp_path: Path, how: str) -> None:
    """Catches a stop that signals the wrapper (or the command) alone: ``sh -c "work; sleep 600"`` left
    its sleep running after an interrupt, a cancel, a timeout, a close, or its own exit."""
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    os.environ["FIFO"] = str(fifo)  # the attempt's environment is this process's, and its binding's
    clock = loom.ManualClock(start_ms=T0_MS)
    script = EXITS if how == "exit" else WAITS
    cfg = config(["sh", "-c", script], timeout_ms=1_000 if how == "timeout" else None,
                 on_close="stop" if how == "close" else "leave")  # fmt: skip
    try:
        async with runtime(tmp_path, cfg, clock) as rt:
            work = await start_job(rt)
            found = await processes(fifo)
            try:
                assert all(alive(pid) for pid, _ in found)
                if how == "interrupt":
                    await rt.hold(work.id, reason="no next attempt")  # the input it keeps waits
                    await rt.interrupt(work.id, reason="test")
                elif how == "cancel":
                    await rt.cancel(work.id)
                elif how == "timeout":
                    clock.advance(1_000)  # its one attempt times out: no retry follows
                if how != "close":
                    for _, pidfd in found:
                        await ended(pidfd)
                if how in ("exit", "cancel"):
                    result = await rt.wait_for(work.id, timeout=DEADLINE_S)
                    assert result.state is (WorkState.COMPLETED if how == "exit" else WorkState.CANCELLED)
                    await rt.wait_idle()
            except BaseException:
                for _, pidfd in found:
                    os.close(pidfd)
                raise
        for pid, pidfd in found:
            await ended(pidfd)
            os.close(pidfd)
            assert not alive(pid)
    finally:
        os.environ.pop("FIFO", None)


async def test_an_attempt_starts_with_only_its_own_descriptors(tmp_path: Path) -> None:
    """Catches a spawn that passes this process's open descriptors on (a listening socket among them,
    which then keeps the port bound while the attempt runs)."""
    leaked_read, leaked_write = os.pipe()
    os.set_inheritable(leaked_write, True)  # as a library might leave one (Hypercorn does its sockets)
    leak = f"pipe:[{os.fstat(leaked_write).st_ino}]"
    out = tmp_path / "fds"
    script = (  # the command's parent is the wrapper loom spawned: what did it inherit?
        "import json, os\n"
        "fds = {}\n"
        "for fd in os.listdir(f'/proc/{os.getppid()}/fd'):\n"
        "    fds[fd] = os.readlink(f'/proc/{os.getppid()}/fd/{fd}')\n"
        f"open({str(out)!r}, 'w').write(json.dumps(fds))\n"
    )
    cfg = config([sys.executable, "-c", script])
    try:
        async with runtime(tmp_path, cfg, loom.ManualClock(start_ms=T0_MS)) as rt:
            work = await start_job(rt)
            result = await rt.wait_for(work.id, timeout=DEADLINE_S)
            assert result.state is WorkState.COMPLETED, result
    finally:
        os.close(leaked_read)
        os.close(leaked_write)
    fds: dict[str, Any] = json.loads(out.read_text())
    assert leak not in fds.values(), f"the attempt's process inherited the pipe: {fds}"
    others = {fd: target for fd, target in fds.items() if int(fd) > 2}
    assert not others, f"the attempt's process holds descriptors beyond its own: {others}"
