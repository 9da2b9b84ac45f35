"""``loom demo``: a short tour of loom on a fresh SQLite file, told in words a newcomer follows.

It routes Events to Work, runs executions, parks one on a wait with a timeout and wakes it, lets
another time out, recovers a shell process after a simulated crash, and fires a cron schedule. Business
time runs on a test clock, so hours pass in an instant and the tour takes a second or two.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio
import typer

from ..config import Config
from ..plugins.python_executor import PythonExecutor
from ..plugins.schedule import ScheduleSpec, schedule_timer
from ..plugins.shell import ShellExecutor
from ..records.clock import ManualClock
from ..records.errors import NotFound
from ..records.events import EventIn
from ..records.executor import Toolbelt
from ..records.waits import Waiting, WaitSpec
from ..records.work import Completed, ExecutionState, Outcome, RunRequest, Work, WorkState
from ..runtime import Runtime, open_runtime
from ._client import UserError
from ._render import iso

START_MS = 1_767_258_000_000  # 2026-01-01T09:00:00Z
MINUTE = 60_000
HOUR = 60 * MINUTE
LEASE_MS = MINUTE
STEP_S = 20
"""The most a step may take (real seconds) before the demo gives up and says which step stalled."""

CONFIG = """
# Orders: each key (order/1, order/2) gets one long-lived Work; its Events run the `fulfil` function.
[scopes.shop.bindings.worker]
executor = "python"
config = { function = "fulfil" }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*", "approval.*"]
create_work = true
binding = "worker"

# Builds run as shell processes, which outlive a crash of the process that started them.
[scopes.ci.bindings.build]
executor = "shell"
config = { command = ["sh", "-c", "echo building; while [ ! -f \\"$LOOM_DIR/go\\" ]; do sleep 0.02; done"] }

[[scopes.ci.routes]]
name = "builds"
types = ["build.*"]
create_work = true
binding = "build"

# A cron schedule: each occurrence is one Event, and each starts a run of `report`.
[scopes.ops.bindings.reporter]
executor = "python"
config = { function = "report" }

[[scopes.ops.routes]]
name = "hourly-report"
types = ["report.due"]
handler = "schedule"
binding = "reporter"
"""


def say(text: str = "") -> None:
    typer.echo(text)


def step(number: int, title: str) -> None:
    say()
    say(f"{number}. {title}")


class Tour:
    """The executors' functions and what they saw, on one test clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.python = PythonExecutor()
        self.python.register("fulfil", self.fulfil)
        self.python.register("report", self.report)
        self.keys: dict[str, str] = {}

    async def fulfil(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        trigger = request.trigger
        kinds = ", ".join(e.type for e in request.inputs)
        if trigger is not None and trigger.key:
            self.keys[request.work_id] = trigger.key
        key = self.keys.get(request.work_id, request.work_id)
        say(f"   attempt {request.attempt} of {key} runs with [{kinds}]")
        if trigger is not None and trigger.type == "order.placed" and trigger.payload.get("total", 0) > 100:
            say("   the order is over 100: it waits for an approval.* Event, for at most one hour")
            return Waiting(wait=WaitSpec(types=("approval.*",), timeout_ms=HOUR))
        if trigger is not None and trigger.type == "approval.granted":
            say("   approved: the order ships")
        elif trigger is not None and trigger.type == "core.wait.timeout":
            say("   no approval came within the hour: the order is put on review")
        return Completed()

    async def report(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        trigger = request.trigger
        occurrence = trigger.delivery_id.rpartition("@")[2] if trigger is not None else ""
        when = iso(int(occurrence)) if occurrence.isdigit() else "-"
        say(f"   report run {request.attempt}, for the occurrence at {when}")
        return Completed()


def _order(n: int, type: str, key: str, **payload: object) -> EventIn:
    return EventIn(
        source="demo", delivery_id=f"{type}/{key}/{n}", type=type, scope="shop", key=key, payload=payload
    )


async def until(rt: Runtime, check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Until ``check()`` holds, woken by each commit; a step that stalls says which it was."""
    async with rt.watch() as notices:
        with trio.move_on_after(STEP_S) as scope:
            while not await check():
                await notices.__anext__()
        if scope.cancelled_caught:
            raise UserError(f"the demo stalled waiting for {what}")


async def work_for(rt: Runtime, key: str) -> Work:
    return await rt.work_for_key(key)


async def settled(rt: Runtime, key: str, attempts: int) -> None:
    """Until ``key``'s Work has run ``attempts`` attempts and none is running (an execution that is
    running does not keep `Runtime.wait_idle` from returning)."""

    async def done() -> bool:
        try:
            work = await rt.work_for_key(key)
        except NotFound:
            return False
        return work.attempts >= attempts and work.current_execution_id is None

    await rt.wait_idle()
    await until(rt, done, f"attempt {attempts} of {key} to end")


async def tour_routing_and_waits(rt: Runtime, tour: Tour) -> None:
    step(1, "Events are accepted exactly once and routed to Work by key")
    first = await rt.publish(_order(1, "order.placed", "order/1", total=40))
    say(
        f"   accepted order.placed for order/1 as {first.id} (sequence {first.seq}) at {iso(first.accepted_at_ms)}"
    )
    again = await rt.publish(_order(1, "order.placed", "order/1", total=40))
    say(
        f"   the same delivery again is recognised as a duplicate: still {again.id}, nothing new stored"
        if again.duplicate
        else f"   the same delivery again was stored anew as {again.id}: deduplication failed"
    )
    await settled(rt, "order/1", 1)
    work = await work_for(rt, "order/1")
    say(f"   order/1 got its own Work {work.id}: {work.state} after {work.attempts} attempt")

    step(2, "An execution waits for an Event, with a timeout")
    await rt.publish(_order(1, "order.placed", "order/2", total=250))
    await rt.publish(_order(1, "order.placed", "order/3", total=990))
    await settled(rt, "order/2", 1)
    await settled(rt, "order/3", 1)
    for key in ("order/2", "order/3"):
        work = await work_for(rt, key)
        say(f"   {key} is {work.state}: its attempt ended on a wait that holds no process")
    say("   20 minutes pass; an approval arrives for order/2 only")
    tour.clock.advance(20 * MINUTE)
    approval = await rt.publish(_order(1, "approval.granted", "order/2", by="alice"))
    await settled(rt, "order/2", 2)
    await say_wait(rt, "order/2", approval.id)
    say("   40 minutes later, an hour after order/3 started waiting, its timeout fires")
    tour.clock.advance(40 * MINUTE)
    await settled(rt, "order/3", 2)
    await say_wait(rt, "order/3", None)
    for key in ("order/2", "order/3"):
        work = await work_for(rt, key)
        say(f"   {key}: {work.state} after {work.attempts} attempts")


async def say_wait(rt: Runtime, key: str, winner: str | None) -> None:
    """What woke ``key``'s wait (exactly one Event: the approval, or the timeout)."""
    work = await work_for(rt, key)
    (wait,) = await rt.waits(work.id)
    woke = "its own timeout" if wait.winner_event_id != winner or winner is None else "the approval"
    say(f"   {key}'s wait is {wait.state} at {iso(wait.woken_at_ms or 0)} by {woke} ({wait.winner_event_id})")


async def _build_started(rt: Runtime) -> dict[str, object] | None:
    """The build's running attempt once its process is pinned (pid, start time, directory)."""
    try:
        work = await rt.work_for_key("build/7")
    except NotFound:
        return None
    if work.current_execution_id is None:
        return None
    execution = await rt.execution(work.current_execution_id)
    if not execution.metadata or "pid" not in execution.metadata:
        return None  # its directory is pinned before the process starts, its pid once it has
    return {**execution.metadata, "execution": execution.id, "epoch": execution.epoch}


async def _crash_child(db: str, state: str, now_ms: int) -> None:
    config = Config.from_toml(CONFIG, file="demo config")
    clock = ManualClock(start_ms=now_ms)
    plugins = [Tour(clock).python, ShellExecutor(state_dir=state)]
    async with open_runtime(db, clock=clock, config=config, plugins=plugins, lease_ms=LEASE_MS) as rt:
        await rt.publish(EventIn(source="demo", delivery_id="build-7", type="build.requested",
                                 scope="ci", key="build/7"))  # fmt: skip
        found: dict[str, object] = {}

        async def started() -> bool:
            found.update(await _build_started(rt) or {})
            return bool(found)

        await until(rt, started, "the build to start")
        sys.stdout.write(json.dumps(found) + "\n")
        sys.stdout.flush()
        await trio.sleep_forever()  # until it is killed


def crash_child(db: str, state: str, now_ms: int) -> None:
    """The runtime that the demo kills: it starts the build, says so on stdout, and waits."""
    trio.run(_crash_child, db, state, now_ms)


async def _start_and_kill(db: str, state: Path, now_ms: int) -> dict[str, Any]:
    """Run a runtime in a child process until the build runs, then kill it with SIGKILL."""
    code = f"from loom.service._demo import crash_child; crash_child({db!r}, {str(state)!r}, {now_ms})"
    process = await trio.lowlevel.open_process([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None
    try:
        line = b""
        with trio.move_on_after(STEP_S):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                line += chunk
        if not line.endswith(b"\n"):
            raise UserError("the demo stalled waiting for the build to start in the runtime it crashes")
        started: dict[str, Any] = json.loads(line)
        return started
    finally:
        process.kill()  # SIGKILL: no clean shutdown of any kind
        await process.wait()
        await process.stdout.aclose()


async def tour_recovery(
    db: str, clock: ManualClock, config: Config, python: PythonExecutor, state: Path
) -> None:
    step(3, "A crash: the process that runs an attempt outlives the runtime that started it")
    say("   a second loom process opens the file, accepts build.requested for build/7 and starts")
    say("   the build as a shell process...")
    pinned = await _start_and_kill(db, state, clock.now_ms())
    pid = pinned["pid"]
    say(f"   ...which runs as process {pid}; loom recorded its pid and start time with the attempt")
    say("   then that loom process is killed with SIGKILL: no shutdown, its lease is left behind")
    say(f"   the build process {pid} is still running")

    step(4, "Recovery: the next runtime adopts the running process instead of starting another")
    say("   loom opens the file again: holding its lock, it knows the killed process is gone, and recovers")
    say("   that process's attempts at once, without waiting for the lease to expire")
    shell = ShellExecutor(state_dir=state)
    async with open_runtime(db, clock=clock, config=config, plugins=[python, shell], lease_ms=LEASE_MS) as rt:
        execution_id = str(pinned["execution"])

        async def adopted() -> bool:
            execution = await rt.execution(execution_id)
            return execution.state is ExecutionState.RUNNING and execution.epoch > int(pinned["epoch"])

        await until(rt, adopted, "the recovery of the build")
        execution = await rt.execution(execution_id)
        say(f"   its recovery actor asked the shell executor to check process {pid}: same pid and same start")
        say(
            f"   time, so the same process; it adopted it under a new lease (epoch {pinned['epoch']} -> {execution.epoch})"
        )
        (Path(str(pinned["dir"])) / "go").touch()  # let the build finish

        async def finished() -> bool:
            return (await rt.work_for_key("build/7")).state is WorkState.COMPLETED

        await until(rt, finished, "the adopted build to finish")
        work = await rt.work_for_key("build/7")
        say(
            f"   the build exited 0: build/7 is {work.state} after {work.attempts} attempt (one process, never two)"
        )


async def tour_schedule(rt: Runtime, clock: ManualClock) -> None:
    step(5, "A cron schedule fires each occurrence once, on the test clock")
    spec = ScheduleSpec(schedule_id="hourly-report", cron="0 * * * *", timezone="UTC")
    timer = await rt.arm(
        schedule_timer(spec, now_ms=clock.now_ms(), source="demo", type="report.due", scope="ops")
    )
    say(f"   armed '0 * * * *' (every hour on the hour); first occurrence {iso(timer.fire_at_ms)}")
    for run in range(1, 4):
        timer = await rt.timer(timer.id)
        clock.set(timer.fire_at_ms)
        await settled(rt, "schedule/hourly-report", run)
    firings = await rt.firings(timer.id)
    work = await rt.work_for_key("schedule/hourly-report")
    say(
        f"   {len(firings)} occurrences fired, each once; the schedule's Work ran {work.attempts} times and is {work.state},"
    )
    say(f"   ready for the next one at {iso((await rt.timer(timer.id)).fire_at_ms)}")


async def tour(db: str, state: Path, *, kept: bool = True) -> None:
    clock = ManualClock(start_ms=START_MS)
    config = Config.from_toml(CONFIG, file="demo config")
    guide = Tour(clock)
    say("loom demo: a tour of a durable coordination runtime")
    say(f"database: {db} (a fresh SQLite file)")
    say(f"business time runs on a test clock from {iso(START_MS)}, so hours pass in an instant")
    async with open_runtime(db, clock=clock, config=config, plugins=[guide.python], lease_ms=LEASE_MS) as rt:
        await tour_routing_and_waits(rt, guide)
    await tour_recovery(db, clock, config, guide.python, state)
    async with open_runtime(db, clock=clock, config=config, plugins=[guide.python], lease_ms=LEASE_MS) as rt:
        await tour_schedule(rt, clock)
        events = await rt.events(limit=100_000)
    say()
    if kept:
        say(f"Everything above is in {db}: {len(events)} Events, each stored once, in order.")
    else:
        say(f"Everything above was in {db}: {len(events)} Events, each stored once, in order; the demo")
        say("removes it now and leaves nothing behind (loom demo --db FILE keeps its database).")
    say("Next: `loom serve --db <file>` runs loom as a service; see docs/getting-started.md.")


def run_demo(db: Path | None) -> None:
    """Run the tour on ``db`` (which must not exist yet) or on a fresh temporary file."""
    if db is not None:
        if db.exists():
            raise UserError(
                f"--db {db} already exists; the demo needs a fresh file (remove it or choose another)"
            )
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            db.touch(exist_ok=False)
            db.unlink()
        except OSError as exc:
            raise UserError(f"cannot create the demo database {db}: {exc.strerror or exc}") from None
        state = Path(tempfile.mkdtemp(prefix="loom-demo-shell-"))
        try:
            trio.run(tour, str(db), state)
        finally:
            shutil.rmtree(state, ignore_errors=True)
        return
    directory = Path(tempfile.mkdtemp(prefix="loom-demo-"))
    try:
        trio.run(partial(tour, str(directory / "demo.db"), directory / "shell", kept=False))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
