"""Restart recovery, and a SIGKILL process drill through lease recovery and retry (docs/recovery.md).

Opening a runtime recovers, without an operator, every attempt a previous process left: with an
expired lease (the process was killed) or a released one (it closed cleanly). Each goes through its
executor: adopted when the executor verifies its detached process from the metadata pinned with its
segment, relaunched as the same attempt when it was never handed to its executor, failed into retry
otherwise. A host-driven runtime (``actors=()``) gets the same recoveries from `Runtime.poll`.

The drill kills a worker process (tests/drills/worker.py: every actor, the python executor, a function
with a side effect) with SIGKILL at seeded moments, ten times, restarting it each time; the python
executor cannot adopt, so an attempt caught by a kill fails into retry and its retry runs the function
again. At the end every Work is completed once, and no side effect belongs to two runs of one
attempt under one authority.

Every test runs on a SQLite file and on a PostgreSQL database (a copy of the migrated template): the
worker processes get its path or URL, and the checks read the database itself (`loom.testing.raw`).
The drill takes a few seconds on either, so it runs its ten cycles on both.

Wrong implementations these tests catch (those marked * were each put in and seen to fail here):

* a clean close that leaves its leases to run out (the reopen would recover nothing at once) *;
* recovery at ``now > expires_at`` only (nothing is recovered at the exact expiry), or before it;
* `recover_claim_in_tx` keeping the old epoch (the adopted and relaunched attempts stay at epoch 1) *;
* a recovery that relaunches an attempt handed to its executor (its process may still run) or asks
  the executor to recover one never handed, or a relaunch that starts attempt 2 or counts a failure;
* `recover` not given the pinned metadata (the fake cannot verify, so nothing is adopted) *;
* a not-adoptable attempt failed without its retry timer: its Work never runs again (the restart
  tests find no timer; the drill's last worker never sees every Work completed) *;
* in the drill: one attempt run twice under one (attempt, epoch), a completion committed twice, a
  side effect from an attempt the store never had, an acknowledged Event lost.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from drills.worker import LEASE_MS, SCOPE, leave_config, run_config

from loom import (
    Completed,
    EventIn,
    ExecutionState,
    Lease,
    OffsetClock,
    Outcome,
    RetryState,
    RunRequest,
    Runtime,
    Toolbelt,
    WorkState,
    open_runtime,
)
from loom.kernel.executions import BindingRef, claim_in_tx, claim_request
from loom.plugins.handlers import work_id_for_key
from loom.plugins.python_executor import PythonExecutor
from loom.testing import T0_MS, FakeExecutor, ManualClock, RecoverAnswer, raw
from loom.testing.internals import storage_of

WORKER = Path(__file__).parent / "drills" / "worker.py"
MINUTE = 60_000
STALL_SECONDS = 30.0
"""Real-time bound on any one wait for the runtime or a child: a failure, never a synchronisation."""
ADOPT, LOST, NEVER = (work_id_for_key(SCOPE, key) for key in ("adopt", "lost", "never"))


class Child:
    """A worker process whose stdout is read line by line."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    @classmethod
    async def start(cls, *args: str) -> Child:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(WORKER), *args], stdout=subprocess.PIPE
        )
        return cls(process)

    async def line(self) -> str:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(65536)
            assert chunk, f"the worker exited with {await self.process.wait()} before it was killed"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    async def kill(self) -> None:
        self.process.kill()  # SIGKILL: no cleanup, no lease released, the WAL left as it is
        assert await self.process.wait() == -signal.SIGKILL, "the worker ended before it was killed"
        assert self.process.stdout is not None
        await self.process.stdout.aclose()


@asynccontextmanager
async def worker(*args: str) -> AsyncIterator[Child]:
    """A started worker, killed on the way out however the block ends (a failed test leaves none)."""
    child = await Child.start(*args)
    try:
        yield child
    finally:
        if child.process.returncode is None:
            with trio.CancelScope(shield=True):
                child.process.kill()
                await child.process.wait()


# -- restart recovery ----------------------------------------------------------------------------------


class VerifyingExecutor(FakeExecutor):
    """Executor ``detached`` of the restarted runtime: it verifies an attempt's detached process by
    the handle pinned with its segment (the handle file is there and names that attempt), adopting it
    if so and answering `NotAdoptable` if not. ``handles``: when set, each launch starts such a process
    (writes its handle) and pins it, as the killed worker's executor did."""

    def __init__(self, handles: Path | None = None) -> None:
        super().__init__("detached")
        self.handles = handles

    async def launch(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        if self.handles is not None:
            handle = self.handles / f"{request.work_id}.handle"
            handle.write_text(f"{request.work_id} {request.attempt}\n")
            await toolbelt.pin({"handle": str(handle)})
        return await super().launch(request, toolbelt)

    def verifies(self, request: RunRequest, metadata: Mapping[str, Any]) -> bool:
        handle = Path(str(metadata.get("handle") or "/nonexistent"))
        return handle.is_file() and handle.read_text().split() == [request.work_id, str(request.attempt)]

    async def recover(self, request: RunRequest, toolbelt: Toolbelt, metadata: Mapping[str, Any]) -> Outcome:
        verified = self.verifies(request, metadata)
        self.recover_answers[request.work_id] = (
            RecoverAnswer.ADOPT if verified else RecoverAnswer.NOT_ADOPTABLE
        )
        return await super().recover(request, toolbelt, metadata)


async def until(rt: Runtime, fake: FakeExecutor, check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait on commits and the fake's launches (never on a timer) until ``check()`` holds."""
    with trio.move_on_after(STALL_SECONDS) as guard:
        async with rt.watch() as notices:
            while not await check():
                async with trio.open_nursery() as nursery:

                    async def on_commit() -> None:
                        await notices.__anext__()
                        nursery.cancel_scope.cancel()

                    async def on_launch() -> None:
                        await fake.next_launch()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(on_commit)
                    nursery.start_soon(on_launch)
    if guard.cancelled_caught:
        raise AssertionError(f"timed out waiting for {what}")


async def leave_attempts(db: str, tmp_path: Path) -> Path:
    """A worker leaves three attempts behind in ``db`` and is killed: ``adopt`` and ``lost`` launched
    with their handles pinned, ``never`` claimed but never handed. Only ``adopt``'s process outlives it."""
    handles = tmp_path / "handles"
    handles.mkdir()
    async with worker("leave", db, str(handles), str(T0_MS)) as child:
        with trio.fail_after(STALL_SECONDS):
            while await child.line() != "left":
                pass
        await child.kill()
    (handles / f"{LOST}.handle").unlink()  # its process died with the node
    return handles


async def recovered_without_an_operator(
    rt: Runtime, fake: VerifyingExecutor, clock: ManualClock, handles: Path
) -> None:
    """What the recovery actor does with the three attempts, with nobody calling anything: ``adopt``
    verified and adopted, ``never`` relaunched as the same attempt, ``lost`` failed into retry (its
    retry runs attempt 2); then every Work completes once its launch finishes."""

    async def all_recovered() -> bool:
        lost = await rt.work(LOST)
        return (
            any(launch.recovered for launch in fake.launches_of(ADOPT))
            and bool(fake.launches_of(NEVER))
            and lost.retry is RetryState.BACKOFF
        )

    await until(rt, fake, all_recovered, "the three attempts to be recovered")
    asked = {execution_id for execution_id, _ in fake.recovered}
    (adopted,) = fake.launches_of(ADOPT)
    assert adopted.recovered
    assert (adopted.request.attempt, adopted.lease.epoch) == (1, 2)
    assert dict(adopted.metadata) == {"handle": str(handles / f"{ADOPT}.handle")}, "recover lost the metadata"
    (relaunched,) = fake.launches_of(NEVER)
    assert not relaunched.recovered, "an attempt never handed was given to recover, not relaunched"
    assert relaunched.request.execution_id not in asked
    assert (relaunched.request.attempt, relaunched.lease.epoch) == (1, 2), "the relaunch is another attempt"
    lost = await rt.work(LOST)
    assert (lost.state, lost.failures, lost.attempts) == (WorkState.READY, 1, 1)
    (failed,) = (await rt.history(LOST)).executions
    assert (failed.state, failed.epoch) == (ExecutionState.FAILED, 2), "not failed under the new fence"
    assert failed.outcome is not None
    assert failed.outcome.get("recovery") is True
    assert failed.id in asked, "the lost attempt was failed without asking its executor"
    retry = await rt.timer(f"retry:{LOST}:1")
    assert retry.fire_at_ms == clock.now_ms() + 5 * MINUTE

    fake.finish(ADOPT, Completed())
    fake.finish(NEVER, Completed())

    async def finished() -> bool:
        return all([(await rt.work(w)).state is WorkState.COMPLETED for w in (ADOPT, NEVER)])

    await until(rt, fake, finished, "the adopted and the relaunched attempts to complete")
    clock.set(retry.fire_at_ms)

    async def retried() -> bool:
        return any(launch.request.attempt == 2 for launch in fake.launches_of(LOST))

    await until(rt, fake, retried, "the lost Work's retry")
    fake.finish(LOST, Completed())

    async def all_done() -> bool:
        return all([(await rt.work(w)).state is WorkState.COMPLETED for w in (ADOPT, LOST, NEVER)])

    await until(rt, fake, all_done, "every Work to complete")
    for work_id, attempts, failures in ((ADOPT, 1, 0), (NEVER, 1, 0), (LOST, 2, 0)):
        history = await rt.history(work_id)
        assert history.work.attempts == attempts
        assert history.work.failures == failures  # a success resets the count
        assert [e.state for e in history.executions][-1] is ExecutionState.COMPLETED
    assert (await rt.history(NEVER)).executions[0].epoch == 2


async def test_an_open_recovers_what_a_killed_process_left_through_its_executors(
    durable_store: str, tmp_path: Path
) -> None:
    """Leases a killed process left. On a SQLite file, the open's own lock proves that process dead:
    everything is recovered at once, each attempt by its own path (docs/recovery.md). On a shared
    database the lease may be a live node's: nothing is recovered a millisecond before it expires, and
    everything at the exact expiry."""
    db = durable_store
    handles = await leave_attempts(db, tmp_path)
    fake = VerifyingExecutor()
    clock = ManualClock(start_ms=T0_MS + LEASE_MS - 1)
    async with open_runtime(
        db, clock=clock, config=leave_config(), plugins=[fake], load_entry_points=False, lease_ms=LEASE_MS
    ) as rt:
        if db.startswith("postgresql"):
            await rt.wait_idle()
            assert fake.recovered == []
            assert fake.launches == []
            clock.advance(1)  # the killed process's leases end now: expiry is exclusive
        await recovered_without_an_operator(rt, fake, clock, handles)


async def test_an_open_after_a_clean_close_recovers_every_attempt_at_once(
    durable_store: str, tmp_path: Path
) -> None:
    """Released leases: the close made them expire, so the reopen recovers every attempt at once, the
    clock unmoved."""
    db, handles = durable_store, tmp_path / "handles"
    handles.mkdir()
    clock = ManualClock(start_ms=T0_MS)
    first = VerifyingExecutor(handles)
    async with open_runtime(
        db, clock=clock, config=leave_config(), plugins=[first], load_entry_points=False, lease_ms=LEASE_MS
    ) as rt:
        for key, kind in (("adopt", "drill.run"), ("lost", "drill.run"), ("never", "drill.hold")):
            await rt.publish(EventIn(source="drill", delivery_id=key, type=kind, scope=SCOPE, key=key))
        await never_handed(rt)

        async def pinned() -> bool:
            return len(first.launches) == 2

        await until(rt, first, pinned, "both launches to pin their handles")
    expiries = [row["expires_at_ms"] for row in raw.query(db, "SELECT expires_at_ms FROM executions")]
    assert expiries == [T0_MS] * 3, f"the clean close did not release every lease: {expiries}"
    (handles / f"{LOST}.handle").unlink()  # its process stopped with the node

    fake = VerifyingExecutor()
    async with open_runtime(
        db, clock=clock, config=leave_config(), plugins=[fake], load_entry_points=False, lease_ms=LEASE_MS
    ) as rt:
        await recovered_without_an_operator(rt, fake, clock, handles)


async def never_handed(rt: Runtime) -> Lease:
    """Claim Work ``never`` for executor ``detached`` and hand it nothing (its route has no binding, so
    no router starts it): what a runner that lost its lease before launching leaves behind."""
    await rt.wait_idle()
    request = claim_request(
        rt.config,
        await rt.work(NEVER),
        owner=rt.owner,
        token="never-handed",
        lease_ms=LEASE_MS,
        binding=BindingRef(name="detached", executor="detached"),
    )
    lease: Lease = await storage_of(rt).submit(claim_in_tx, request)
    return lease


async def test_poll_recovers_what_a_killed_process_left_for_a_host(
    durable_store: str, tmp_path: Path
) -> None:
    """Host mode: `Runtime.poll` claims every expired lease (on a shared database none before the exact
    expiry; on a SQLite file at once, its lock proving the killed process dead); the host verifies with
    the executor, adopts, declares not adoptable, or relaunches, and the retry runs."""
    db = durable_store
    await leave_attempts(db, tmp_path)
    fake = VerifyingExecutor()
    clock = ManualClock(start_ms=T0_MS + LEASE_MS - 1)
    async with open_runtime(
        db,
        clock=clock,
        config=leave_config(),
        plugins=[fake],
        load_entry_points=False,
        lease_ms=LEASE_MS,
        actors=(),
    ) as rt:
        if db.startswith("postgresql"):
            assert (await rt.poll()).recoveries == ()
            clock.advance(1)
        recoveries = {r.lease.work_id: r for r in (await rt.poll()).recoveries}
        assert set(recoveries) == {ADOPT, LOST, NEVER}
        assert [w for w, r in recoveries.items() if r.relaunch] == [NEVER]
        assert all(r.lease.epoch == 2 and r.lease.attempt == 1 for r in recoveries.values())
        adopt, lost, never = recoveries[ADOPT], recoveries[LOST], recoveries[NEVER]
        assert fake.verifies(adopt.lease.request, adopt.metadata)
        assert not fake.verifies(lost.lease.request, lost.metadata)
        assert lost.metadata, "the lost attempt's pinned metadata was not handed back"
        adopted = await rt.adopt(adopt.lease)
        await rt.complete(adopted, Completed())
        await rt.not_adoptable(lost.lease, "its handle is gone")
        await rt.complete(never.lease, Completed())  # the relaunch runs the same attempt
        assert (await rt.poll()).recoveries == (), "a recovered attempt was claimed again"
        work = await rt.work(LOST)
        assert (work.retry, work.failures) == (RetryState.BACKOFF, 1)
        clock.advance(5 * MINUTE)
        (firing,) = (await rt.poll()).firings
        assert (await rt.event(firing.event_id or "")).type == "core.retry.due"
        retry = await rt.claim(LOST, owner="host")
        assert retry.attempt == 2
        await rt.complete(retry, Completed())
        for work_id, attempts in ((ADOPT, 1), (NEVER, 1), (LOST, 2)):
            work = await rt.work(work_id)
            assert (work.state, work.attempts) == (WorkState.COMPLETED, attempts)


# -- the SIGKILL drill --------------------------------------------------------------------------------------

SEED = 20260101
WORKS = 20
CYCLES = 10
CYCLE_SECONDS = 20.0


async def publish(db: str, offset_ms: int, keys: list[str]) -> set[str]:
    """Publish while no worker runs; return the acknowledged delivery ids."""
    clock = OffsetClock()
    clock.shift(offset_ms)
    async with open_runtime(
        db,
        clock=clock,
        config=run_config(),
        plugins=[PythonExecutor()],
        load_entry_points=False,
        actors=(),
        owner="publisher",
    ) as rt:
        acked = set()
        for key in keys:
            event = await rt.publish(
                EventIn(source="drill", delivery_id=key, type="drill.job", scope=SCOPE, key=key)
            )
            acked.add(event.delivery_id)
        return acked


async def test_sigkill_through_recovery_and_retry_completes_every_work_once(
    durable_store: str, tmp_path: Path
) -> None:
    """Ten cycles: the parent publishes two more Works, starts the worker (its clock past every lease
    the killed one held) and kills it after a seeded number of ``start`` or ``done`` lines; then one
    last worker runs until every Work is completed."""
    rng = random.Random(SEED)
    db, side = durable_store, str(tmp_path / "side.txt")
    await trio.Path(side).touch()
    acked: set[str] = set()
    offset = 0
    for cycle in range(CYCLES + 1):
        last = cycle == CYCLES
        if not last:
            acked |= await publish(db, offset, [f"job-{n}" for n in range(2 * cycle, 2 * cycle + 2)])
        trigger, after = rng.choice(("start", "done")), rng.randint(1, 4)
        async with worker("run", db, side, str(SEED), str(offset)) as child:
            seen = "nothing"
            with trio.move_on_after(CYCLE_SECONDS) as guard:
                while True:
                    seen = await child.line()
                    kind, _, rest = seen.partition(" ")
                    if kind == "completed" and int(rest) == len(acked):
                        break  # nothing left to run (for the last worker: the end)
                    if kind == trigger and not last:
                        after -= 1
                        if after == 0:
                            break
            assert not guard.cancelled_caught, (
                f"worker {cycle + 1} stalled with {len(acked)} Works published; its last line: {seen}"
            )
            await child.kill()
        offset += LEASE_MS + 1_000  # the next worker starts past every lease this one held

    lines = Counter(tuple(line.split()) for line in (await trio.Path(side).read_text()).splitlines())
    twice = [line for line, n in lines.items() if n > 1]
    assert not twice, f"one attempt ran twice under one authority: {twice}"
    with raw.snapshot(db) as store:
        for delivery_id in acked:
            stored = store.value(
                "SELECT count(*) FROM events WHERE source = 'drill' AND delivery_id = ?", (delivery_id,)
            )
            assert stored == 1, f"acknowledged Event {delivery_id} is stored {stored} times"
        works = store.query("SELECT * FROM works")
        assert len(works) == WORKS
        recovered_failures = 0
        for work in works:
            executions = store.query(
                "SELECT * FROM executions WHERE work_id = ? ORDER BY attempt", (work["id"],)
            )
            assert work["state"] == "completed", f"work {work['id']} ended {work['state']}"
            done = [e for e in executions if e["state"] == "completed"]
            assert len(done) == 1, f"work {work['id']} completed {len(done)} times"
            committed = (work["id"], str(done[0]["attempt"]), str(done[0]["epoch"]))
            assert lines[committed] == 1, (
                f"the completed run {committed} left {lines[committed]} side effects"
            )
            by_attempt = {e["attempt"]: e for e in executions}
            for w, attempt, epoch in (line for line in lines if line[0] == work["id"]):
                execution = by_attempt.get(int(attempt))
                assert execution is not None, (
                    f"a side effect of attempt {attempt} of {w}, which never existed"
                )
                assert int(epoch) <= execution["epoch"], f"a side effect at epoch {epoch} of {w}/{attempt}"
            for e in executions:
                if e["state"] == "failed":
                    assert json.loads(e["outcome"]).get("recovery") is True, e["outcome"]
                    recovered_failures += 1
            assert work["failures"] == 0  # each Work ended with a success
    assert recovered_failures > 0, "no kill caught an attempt: the drill exercised no recovery"
