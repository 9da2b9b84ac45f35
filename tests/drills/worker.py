"""A child process for the recovery drills (tests/test_recovery_drill.py). The test kills it with SIGKILL.

``worker.py run DB SIDE SEED OFFSET_MS``: run every actor on the store ``DB`` (a SQLite file or a
``postgresql://`` URL) with the python executor. Its function sleeps a seeded 20-200 ms of real
time, appends ``work attempt epoch`` to the side file ``SIDE`` (open, append, flush, fsync) and
returns `Completed`. Business time is an `OffsetClock` shifted by ``OFFSET_MS``, so a restart can
start past the leases its killed predecessor held (they are then recovered at once). It prints,
flushed, one line per step::

    ready                       the runtime is open
    start WORK ATTEMPT EPOCH    the function began
    done WORK ATTEMPT EPOCH     its side effect is on disk (its completion is not committed yet)
    completed N                 N Works are completed in the store (after each commit that changes it)

``worker.py leave DB HANDLES START_MS``: leave three attempts behind, on a `ManualClock` at
``START_MS``: Works ``adopt`` and ``lost`` launched by the router through executor ``detached``, which
pins ``{"handle": HANDLES/<work>.handle}`` with its segment and creates that file (the detached process
it runs), and Work ``never``, claimed but never handed to its executor. It prints ``left`` once all
three are durable, then waits to be killed.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

import loom
from loom.kernel.executions import BindingRef, claim_in_tx, claim_request
from loom.notices import Committed
from loom.plugins.handlers import work_id_for_key
from loom.plugins.python_executor import PythonExecutor
from loom.testing.internals import storage_of

SCOPE = "drill"
LEASE_MS = 2_000
RETRY_ATTEMPTS = 10
RETRY_BACKOFF_MS = 100


def say(line: str) -> None:
    print(line, flush=True)


def run_config() -> loom.Config:
    """Route ``drill.*`` Events to one Work per key, run by the python function ``work``; a short
    retry backoff so a retry after a kill comes within the drill's time."""
    route = {"name": "r", "types": ["drill.*"], "create_work": True, "binding": "py", "work_kind": "job"}
    return loom.Config.from_dict(
        {
            "work_kinds": {
                "job": {
                    "retry_attempts": RETRY_ATTEMPTS,
                    "retry_backoff_ms": [RETRY_BACKOFF_MS] * (RETRY_ATTEMPTS - 1),
                }
            },
            "scopes": {
                SCOPE: {
                    "bindings": {"py": {"executor": "python", "config": {"function": "work"}}},
                    "routes": [route],
                }
            },
        }
    )


def append_line(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as side:
        side.write(line + "\n")
        side.flush()
        os.fsync(side.fileno())


async def run(db: str, side: str, seed: int, offset_ms: int) -> None:
    executor = PythonExecutor()

    async def work(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        step = f"{request.work_id} {request.attempt} {toolbelt.lease.epoch}"
        say(f"start {step}")
        await trio.sleep(random.Random(f"{seed} {step}").uniform(0.02, 0.2))
        await trio.to_thread.run_sync(append_line, side, step)
        say(f"done {step}")
        return loom.Completed()

    executor.register("work", work)
    clock = loom.OffsetClock()
    clock.shift(offset_ms)
    async with loom.open_runtime(
        db,
        clock=clock,
        config=run_config(),
        plugins=[executor],
        load_entry_points=False,
        lease_ms=LEASE_MS,
        owner=f"worker-{os.getpid()}",
    ) as rt:
        completed = -1

        async def count() -> None:
            nonlocal completed
            done = len(await rt.works(state=loom.WorkState.COMPLETED, limit=1000))
            if done != completed:
                completed = done
                say(f"completed {done}")

        async with rt.watch() as notices:
            say("ready")
            await count()
            async for notice in notices:
                if isinstance(notice, Committed):
                    await count()


class Detached:
    """Executor ``detached``: each launch starts a detached process (its handle file) and pins the
    handle with the segment, then runs until the process is killed."""

    capabilities = frozenset[str]()

    def __init__(self, handles: str) -> None:
        self.handles = Path(handles)

    @loom.hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        return {"detached": self}

    async def launch(self, request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        handle = self.handles / f"{request.work_id}.handle"
        handle.write_text(f"{request.work_id} {request.attempt}\n")
        await toolbelt.pin({"handle": str(handle)})
        say(f"pinned {request.work_id}")
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def inject(self, execution_id: str, event: loom.Event) -> None:
        raise loom.NotAccepting(f"execution {execution_id} takes no input")

    async def interrupt(self, execution_id: str) -> None:
        pass


def leave_config() -> loom.Config:
    routes = [
        {"name": "run", "types": ["drill.run"], "create_work": True, "binding": "detached"},
        {"name": "hold", "types": ["drill.hold"], "create_work": True},  # no binding: nothing starts it
    ]
    return loom.Config.from_dict(
        {"scopes": {SCOPE: {"bindings": {"detached": {"executor": "detached"}}, "routes": routes}}}
    )


async def leave(db: str, handles: str, start_ms: int) -> None:
    clock = loom.ManualClock(start_ms=start_ms)
    async with loom.open_runtime(
        db,
        clock=clock,
        config=leave_config(),
        plugins=[Detached(handles)],
        load_entry_points=False,
        lease_ms=LEASE_MS,
        owner="killed-node",
    ) as rt:
        pinned: set[str] = set()
        async with rt.watch() as notices:
            for key, kind in (("adopt", "drill.run"), ("lost", "drill.run"), ("never", "drill.hold")):
                await rt.publish(
                    loom.EventIn(source="drill", delivery_id=key, type=kind, scope=SCOPE, key=key)
                )
            await rt.wait_idle()
            never = await rt.work(work_id_for_key(SCOPE, "never"))
            request = claim_request(
                rt.config,
                never,
                owner="killed-node",
                token="never-handed",
                lease_ms=LEASE_MS,
                binding=BindingRef(name="detached", executor="detached"),
            )
            await storage_of(rt).submit(claim_in_tx, request)
            # both launches have pinned their handles once their executions carry metadata
            while len(pinned) < 2:
                for key in ("adopt", "lost"):
                    work = await rt.work(work_id_for_key(SCOPE, key))
                    if work.current_execution_id is not None:
                        execution = await rt.execution(work.current_execution_id)
                        if execution.metadata:
                            pinned.add(key)
                if len(pinned) < 2:
                    await notices.__anext__()
        say("left")
        await trio.sleep_forever()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "run":
        trio.run(run, args[0], args[1], int(args[2]), int(args[3]))
    elif mode == "leave":
        trio.run(leave, args[0], args[1], int(args[2]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
