"""Lease recovery and adoption (docs/recovery.md "Leases and their expiry", "Recovery").

Kernel rules are checked one transaction at a time on an in-memory store; the runtime's part (the
recovery actor, `Runtime.poll`, the clean close) through the public API. Each test names the wrong
implementation it catches.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import pytest
from test_tx_reads import counting_queries

from loom import (
    CausalLimits,
    Completed,
    Config,
    EventIn,
    ExecutionState,
    Policy,
    RetryState,
    StaleAuthority,
    WorkState,
    open_runtime,
)
from loom.actors.toolbelt import RuntimeToolbelt
from loom.kernel.accept import accept_in_tx
from loom.kernel.authority import Authority
from loom.kernel.chains import adopt_then_complete_in_tx
from loom.kernel.executions import (
    BindingRef,
    ClaimRequest,
    KindPolicy,
    claim_in_tx,
    complete_in_tx,
    renew_in_tx,
)
from loom.kernel.recovery import (
    Expired,
    adopt_in_tx,
    expired_in_tx,
    not_adoptable_in_tx,
    pin_metadata_in_tx,
    recover_claim_in_tx,
    release_leases_in_tx,
)
from loom.kernel.resolve import RouteRef, RouteRequest
from loom.kernel.routing import route_in_tx
from loom.plugins.handlers import work_id_for_key
from loom.records.work import Deliver, Lease
from loom.store import SQLiteStore, Tx
from loom.testing import T0_MS, ManualClock, RecoverAnswer, RuntimeDriver

R = TypeVar("R")
LEASE = 1_000
SCOPE = "acme"
FAKE = BindingRef(name="fake", executor="fake")


class Kernel:
    """Kernel procedures run one transaction each on an in-memory store."""

    def __init__(self) -> None:
        self.conn = SQLiteStore(path=":memory:").open_writer()
        self.now = T0_MS
        self.tokens = 0

    def run(self, proc: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            result = proc(Tx(self.conn), self.now, *args, **kwargs)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result

    def token(self) -> str:
        self.tokens += 1
        return f"token-{self.tokens}"

    def work_with_input(self, key: str) -> str:
        event = self.run(
            accept_in_tx,
            EventIn(source="t", delivery_id=f"{key}-0", type="t.start", scope=SCOPE, key=key),
            CausalLimits(),
        )
        ref = RouteRef(name="r", scope=SCOPE, declared=Policy.QUEUE, policy=Policy.QUEUE)
        decision = Deliver(work_id=f"w-{key}", create=True, attach_keys=(key,))
        request = RouteRequest(
            event_id=event.id, decision=decision, route=ref, expected_revision=None, generation=1
        )
        self.run(route_in_tx, request, CausalLimits())
        return f"w-{key}"

    def claim(
        self, key: str, *, owner: str = "node-1", handed: bool = True, timeout_ms: int | None = None
    ) -> Lease:
        work_id = self.work_with_input(key)
        request = ClaimRequest(
            work_id=work_id,
            owner=owner,
            token=self.token(),
            lease_ms=LEASE,
            binding=FAKE,
            kind=KindPolicy(),
            capacity=None,
            generation=1,
            handed=handed,
            timeout_ms=timeout_ms,
        )
        return self.run(claim_in_tx, request)

    def recover(
        self, seen: Expired, *, owner: str = "node-2", executors: frozenset[str] = frozenset()
    ) -> Any:
        return self.run(
            recover_claim_in_tx, seen, owner=owner, token=self.token(), lease_ms=LEASE, executors=executors
        )

    def execution(self, execution_id: str) -> Any:
        return self.run(lambda tx, now: tx.execution(execution_id))

    def work(self, work_id: str) -> Any:
        return self.run(lambda tx, now: tx.work(work_id))


@pytest.fixture
def kernel() -> Any:
    k = Kernel()
    yield k
    k.conn.close()


def complete(kernel: Kernel, lease: Lease) -> Any:
    return kernel.run(complete_in_tx, Authority.of(lease), Completed(), KindPolicy(), CausalLimits())


# -- expiry is exclusive, and makes the same attempt recoverable ---------------------------------------


def test_a_live_lease_is_never_stolen_and_expiry_is_exclusive(kernel: Kernel) -> None:
    """Catches: recovery at ``now > expires_at`` only (the lease's last instant would still be live for
    its holder while a recoverer waits), or a recoverer taking a lease that has not expired."""
    lease = kernel.claim("a")
    kernel.now = lease.expires_at_ms - 1
    assert kernel.run(expired_in_tx, 10) == []
    assert kernel.recover(Expired(execution_id=lease.execution_id, epoch=1)) is None
    kernel.now = lease.expires_at_ms
    with pytest.raises(StaleAuthority):
        kernel.run(renew_in_tx, Authority.of(lease), LEASE)
    (seen,) = kernel.run(expired_in_tx, 10)
    recovery = kernel.recover(seen)
    assert recovery is not None
    assert (recovery.lease.attempt, recovery.lease.epoch) == (1, 2), "not the same attempt at a higher epoch"
    assert recovery.lease.token != lease.token
    execution = kernel.execution(lease.execution_id)
    assert execution.state is ExecutionState.RECOVERING, "recovery-in-progress authority is not persisted"
    assert kernel.work(lease.work_id).attempts == 1, "recovery launched another attempt"


def test_a_recovery_lease_is_exclusive_at_its_expiry_too(kernel: Kernel) -> None:
    """A recoverer's lease over an expired attempt has lost authority at ``now == expires_at``, as any
    lease. Catches: a recovery authority checked with ``now > expires_at`` (at that instant the old
    recoverer could still adopt or fail the attempt while the next recoverer is entitled to take it)."""
    lease = kernel.claim("a")
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0])
    kernel.now = recovery.lease.expires_at_ms
    with pytest.raises(StaleAuthority):
        kernel.run(adopt_in_tx, Authority.of(recovery.lease))
    with pytest.raises(StaleAuthority):
        kernel.run(not_adoptable_in_tx, Authority.of(recovery.lease), "gone")
    assert kernel.execution(lease.execution_id).state is ExecutionState.RECOVERING
    kernel.now = recovery.lease.expires_at_ms - 1
    adopted = kernel.run(adopt_in_tx, Authority.of(recovery.lease))
    assert adopted.state is ExecutionState.RUNNING


def test_competing_recoverers_never_both_win(kernel: Kernel) -> None:
    """Catches: a recovery claim that does not compare-and-set on the epoch it saw (both recoverers
    would hold a live epoch)."""
    lease = kernel.claim("a")
    kernel.now = lease.expires_at_ms
    (seen,) = kernel.run(expired_in_tx, 10)
    first = kernel.recover(seen, owner="node-2")
    second = kernel.recover(seen, owner="node-3")
    assert first is not None
    assert second is None
    assert kernel.execution(lease.execution_id).owner == "node-2"


def test_a_recovery_that_loses_its_lease_is_recovered_again_at_another_epoch(kernel: Kernel) -> None:
    """Catches: a recovery that, once started, is never retried (a recoverer that crashes mid-way
    would strand the attempt in ``recovering``), or a retried one reusing the epoch."""
    lease = kernel.claim("a")
    kernel.now = lease.expires_at_ms
    first = kernel.recover(kernel.run(expired_in_tx, 10)[0])
    kernel.now = first.lease.expires_at_ms  # the recoverer crashed: its recovery lease expires
    (seen,) = kernel.run(expired_in_tx, 10)
    again = kernel.recover(seen, owner="node-3")
    assert again is not None
    assert again.lease.epoch == 3
    with pytest.raises(StaleAuthority):
        kernel.run(adopt_in_tx, Authority.of(first.lease))
    adopted = kernel.run(adopt_in_tx, Authority.of(again.lease))
    assert (adopted.state, adopted.epoch) == (ExecutionState.RUNNING, 3)


def test_stale_results_fail_even_when_the_owner_name_is_reused(kernel: Kernel) -> None:
    """Catches: authority checked by owner name (a restarted node with the same name would pass), not
    by the token and epoch."""
    lease = kernel.claim("a", owner="node-1")
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0], owner="node-1")
    kernel.run(adopt_in_tx, Authority.of(recovery.lease))
    before = kernel.execution(lease.execution_id)
    # the old lease, and the old token presented at the new epoch
    for stale in (lease, attrs.evolve(lease, epoch=recovery.lease.epoch)):
        with pytest.raises(StaleAuthority):
            complete(kernel, stale)
        with pytest.raises(StaleAuthority):
            kernel.run(renew_in_tx, Authority.of(stale), LEASE)
    assert kernel.execution(lease.execution_id) == before
    done = complete(kernel, recovery.lease)
    assert done.state is ExecutionState.COMPLETED


def test_a_launch_never_handed_is_relaunched_as_the_same_attempt_spending_no_retry(kernel: Kernel) -> None:
    """Catches: a relaunch that starts attempt N+1 or counts a failure, or relaunching an attempt
    that was handed to its executor (its process may still run: only `recover` may judge)."""
    lease = kernel.claim("a", handed=False)
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0], executors=frozenset({"fake"}))
    assert recovery.relaunch
    assert (recovery.lease.attempt, recovery.lease.epoch) == (1, 2)
    assert kernel.execution(lease.execution_id).state is ExecutionState.RUNNING
    work = kernel.work(lease.work_id)
    assert (work.attempts, work.failures, work.retry) == (1, 0, None)
    # the relaunch is handed to its executor at once, so its commit marked it: a second loss is
    # recovered through the executor, never relaunched blindly
    assert kernel.execution(lease.execution_id).handed_at_ms == kernel.now
    kernel.now = recovery.lease.expires_at_ms
    again = kernel.recover(kernel.run(expired_in_tx, 10)[0], executors=frozenset({"fake"}))
    assert not again.relaunch
    assert kernel.execution(lease.execution_id).state is ExecutionState.RECOVERING


def test_a_clean_close_unmarks_only_the_attempts_it_never_launched(kernel: Kernel) -> None:
    """A runtime's claim marks its attempt handed in its own commit (it launches it at once); a clean
    close names the attempts it claimed and never launched, and only those, still under the lease it
    claimed, are unmarked, so the next open relaunches them. Catches: a close that unmarks every lease
    it holds (an attempt whose executor ran would be relaunched beside its process), one that unmarks
    a lease it no longer holds (another epoch), and a claim that is not marked at its commit."""
    never = kernel.claim("never")
    launched = kernel.claim("launched")
    moved_on = kernel.claim("moved-on")
    for lease in (never, launched, moved_on):
        assert kernel.execution(lease.execution_id).handed_at_ms == kernel.now, "a claim left unmarked"
    released = kernel.run(
        release_leases_in_tx,
        "node-1",
        {never.execution_id: never.epoch, moved_on.execution_id: moved_on.epoch + 1},
    )
    assert released == 3
    assert kernel.execution(never.execution_id).handed_at_ms is None
    assert kernel.execution(launched.execution_id).handed_at_ms is not None
    assert kernel.execution(moved_on.execution_id).handed_at_ms is not None
    seen = {e.execution_id: e for e in kernel.run(expired_in_tx, 10)}
    assert set(seen) == {never.execution_id, launched.execution_id, moved_on.execution_id}
    fake = frozenset({"fake"})
    assert kernel.recover(seen[never.execution_id], executors=fake).relaunch
    assert not kernel.recover(seen[launched.execution_id], executors=fake).relaunch
    assert not kernel.recover(seen[moved_on.execution_id], executors=fake).relaunch


def test_the_relaunched_request_keeps_its_binding_configuration(kernel: Kernel) -> None:
    """Catches: a relaunch whose request lost the binding configuration the attempt was claimed with
    (a python-executor attempt would not know its function)."""
    work_id = kernel.work_with_input("cfg")
    request = ClaimRequest(
        work_id=work_id,
        owner="node-1",
        token=kernel.token(),
        lease_ms=LEASE,
        binding=BindingRef(name="fake", executor="fake", config={"function": "fulfil"}),
        kind=KindPolicy(),
        capacity=None,
        generation=1,
    )
    lease = kernel.run(claim_in_tx, request)
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0], executors=frozenset({"fake"}))
    assert recovery.relaunch
    assert dict(recovery.lease.request.config) == {"function": "fulfil"}


def test_not_adoptable_fails_the_attempt_under_the_new_fence_and_applies_retry(kernel: Kernel) -> None:
    """Catches: a not-adoptable attempt left recovering, failed under the old epoch, or failed with no
    retry armed (the Work would sit ready and never run again)."""
    lease = kernel.claim("a")
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0])
    failed = kernel.run(not_adoptable_in_tx, Authority.of(recovery.lease), "no such process")
    assert (failed.state, failed.epoch) == (ExecutionState.FAILED, 2)
    assert "no such process" in json.dumps(failed.outcome)
    work = kernel.work(lease.work_id)
    assert (work.state, work.failures, work.retry) == (WorkState.READY, 1, RetryState.BACKOFF)
    timer = kernel.run(lambda tx, now: tx.timer(f"retry:{work.id}:1"))
    assert timer is not None
    assert timer.fire_at_ms == kernel.now + 5 * 60_000
    with pytest.raises(StaleAuthority):
        complete(kernel, lease)
    with pytest.raises(StaleAuthority):
        kernel.run(adopt_in_tx, Authority.of(recovery.lease))


def test_a_not_adoptable_attempt_consumes_the_inputs_it_was_handed(kernel: Kernel) -> None:
    """A not-adoptable attempt fails as any failed attempt does: its claimed inputs are consumed by it.
    Catches: a recovery failure that leaves them pending (the retry would hand the same input to a
    second attempt, as if it had never been taken in)."""
    lease = kernel.claim("a")
    assert kernel.work(lease.work_id).pending_inputs != ()
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0])
    kernel.run(not_adoptable_in_tx, Authority.of(recovery.lease), "no such process")
    assert kernel.work(lease.work_id).pending_inputs == ()


def test_an_attempt_with_pinned_metadata_is_never_relaunched_blindly(kernel: Kernel) -> None:
    """An attempt whose executor pinned metadata (a process id, a handle) may have a live process even
    if it was never marked handed: only the executor's `recover` may judge it. Catches: a relaunch
    decided on the handed mark alone (a second process could run beside the first)."""
    lease = kernel.claim("a", handed=False)
    kernel.run(pin_metadata_in_tx, Authority.of(lease), {"pid": 42})
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0], executors=frozenset({"fake"}))
    assert not recovery.relaunch
    assert recovery.metadata == {"pid": 42}
    assert kernel.execution(lease.execution_id).state is ExecutionState.RECOVERING


def test_a_finished_attempt_is_not_recovered_from_a_stale_sighting(kernel: Kernel) -> None:
    """Recovery claims only a running (or recovering) attempt. Catches: a recovery claim that checks
    the epoch and the expiry but not the state (an attempt that completed after it was listed as
    expired would be dragged back into recovery, its Work's outcome reopened)."""
    lease = kernel.claim("a")
    kernel.now = lease.expires_at_ms - 1
    complete(kernel, lease)
    kernel.now = lease.expires_at_ms
    assert kernel.recover(Expired(execution_id=lease.execution_id, epoch=lease.epoch)) is None
    assert kernel.execution(lease.execution_id).state is ExecutionState.COMPLETED


def test_expired_leases_are_listed_fairly_across_calls(kernel: Kernel) -> None:
    """Catches: a scan that always starts from the earliest expiry (a page of attempts that cannot be
    recovered would starve the rest)."""
    leases = [kernel.claim(f"k{i}") for i in range(5)]
    kernel.now = max(lease.expires_at_ms for lease in leases)
    pages = [[e.execution_id for e in kernel.run(expired_in_tx, 2)] for _ in range(3)]
    seen = {execution for page in pages for execution in page}
    assert seen == {lease.execution_id for lease in leases}, (
        f"some expired attempts were never listed: {pages}"
    )


# -- the runtime: the recovery actor, poll, the clean close ---------------------------------------------

ROUTE = {"name": "r", "types": ["r.*"], "create_work": True, "binding": "fake"}
HOST_ROUTE = {"name": "r", "types": ["r.*"], "create_work": True}
"""No binding: the host claims and runs the attempts itself."""


def config() -> Config:
    return Config.from_dict(
        {"scopes": {SCOPE: {"bindings": {"fake": {"executor": "fake"}}, "routes": [ROUTE]}}}
    )


def start(key: str) -> EventIn:
    return EventIn(source="t", delivery_id=f"{key}-0", type="r.start", scope=SCOPE, key=key)


async def launched(driver: RuntimeDriver, work_id: str, n: int = 1) -> Any:
    async def enough() -> bool:
        return len(driver.fake.launches_of(work_id)) >= n

    await driver.until(enough, f"launch {n} of {work_id}")
    return driver.fake.launches_of(work_id)[n - 1]


async def test_a_lost_lease_stops_observing_the_launch_without_interrupting_its_process(
    loom_drivers: Any,
) -> None:
    """Catches: a runner that goes on with its launch after losing the lease (it would commit, or
    keep emitting, beside the recoverer), or one that interrupts the process the recoverer is about
    to adopt."""
    async with loom_drivers(config=config(), lease_ms=LEASE) as driver:
        await driver.runtime.publish(start("a"))
        work_id = work_id_for_key(SCOPE, "a")
        first = await launched(driver, work_id)
        driver.fake.recover_answers[work_id] = RecoverAnswer.ADOPT
        driver.clock.set(first.lease.expires_at_ms)
        adopted = await launched(driver, work_id, 2)
        assert adopted.recovered
        assert first.cancelled
        assert driver.fake.interrupted == [], "the lost lease interrupted the process being adopted"
        driver.fake.finish(work_id, Completed())
        await driver.settle()
        execution = await driver.runtime.execution(first.lease.execution_id)
        assert (execution.state, execution.epoch, execution.attempt) == (ExecutionState.COMPLETED, 2, 1)


async def test_running_attempts_keep_their_leases_renewed_until_they_end(loom_drivers: Any) -> None:
    """Two attempts claimed at different moments run across several of their renewals (two thirds of
    the way through each lease): each lease is renewed each time, neither is recovered, and both
    complete under their first epoch. Catches: a renewal made once only (the second round's lease runs
    out and recovery takes the attempt), renewals in the wrong order (the later attempt's renewal
    holding back the earlier's), and an ended attempt still renewed."""
    async with loom_drivers(config=config(), lease_ms=LEASE) as driver:
        clock = driver.clock
        await driver.runtime.publish(start("a"))
        a = await launched(driver, work_id_for_key(SCOPE, "a"))
        clock.advance(LEASE // 4)
        await driver.runtime.publish(start("b"))
        b = await launched(driver, work_id_for_key(SCOPE, "b"))
        renewed = {a.lease.execution_id: a.lease.expires_at_ms, b.lease.execution_id: b.lease.expires_at_ms}
        for _ in range(3):
            due = min(expires - LEASE * 2 // 3 for expires in renewed.values())
            clock.set(due)
            (execution_id,) = [e for e, expires in renewed.items() if expires - LEASE * 2 // 3 == due]
            before = renewed[execution_id]

            async def moved(execution_id: str = execution_id, before: int = before) -> bool:
                execution = await driver.runtime.execution(execution_id)
                return execution.expires_at_ms is not None and execution.expires_at_ms > before

            await driver.until(moved, f"the lease of {execution_id} to be renewed")
            renewed[execution_id] = (await driver.runtime.execution(execution_id)).expires_at_ms
        assert all(expires > clock.now_ms() for expires in renewed.values())
        driver.fake.finish(a.request.work_id, Completed())
        driver.fake.finish(b.request.work_id, Completed())
        await driver.settle()
        for launch in (a, b):
            execution = await driver.runtime.execution(launch.lease.execution_id)
            assert (execution.state, execution.epoch) == (ExecutionState.COMPLETED, 1)
        assert len(driver.fake.launches) == 2, "an attempt was recovered while its runner renewed it"


async def test_a_finished_detached_result_commits_under_the_recovered_lease(
    loom_drivers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches: a finished result committed with the old credentials, or without the adoption that
    fences them, or adopted in a request of its own before its completion (one commit does both)."""
    adoptions: list[str] = []
    adopt = RuntimeToolbelt.adopt

    async def counted(self: RuntimeToolbelt) -> None:
        adoptions.append(self.lease.execution_id)
        await adopt(self)

    monkeypatch.setattr(RuntimeToolbelt, "adopt", counted)
    async with loom_drivers(config=config(), lease_ms=LEASE) as driver:
        await driver.runtime.publish(start("a"))
        work_id = work_id_for_key(SCOPE, "a")
        first = await launched(driver, work_id)
        driver.fake.recover_answers[work_id] = Completed()
        driver.clock.set(first.lease.expires_at_ms)

        async def completed() -> bool:
            execution = await driver.runtime.execution(first.lease.execution_id)
            return execution.state is ExecutionState.COMPLETED

        await driver.until(completed, "the finished result to commit")
        execution = await driver.runtime.execution(first.lease.execution_id)
        assert execution.epoch == 2
        assert (await driver.runtime.work(work_id)).state is WorkState.COMPLETED
        assert adoptions == [], "the adoption is the completion's own commit, not a request before it"


async def test_poll_claims_expired_leases_for_a_host_that_adopts_or_refuses(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches: a `poll` that ignores expired leases (a host-driven runtime would strand them), or an
    adoption that leaves the old token valid."""
    cfg = Config.from_dict({"scopes": {SCOPE: {"routes": [HOST_ROUTE]}}})
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        for key in ("keep", "drop"):
            await rt.publish(start(key))
        await rt.poll()
        keep = await rt.claim(work_id_for_key(SCOPE, "keep"), owner="host", lease_ms=LEASE)
        drop = await rt.claim(work_id_for_key(SCOPE, "drop"), owner="host", lease_ms=LEASE)
        clock.set(keep.expires_at_ms - 1)
        assert (await rt.poll()).recoveries == ()
        clock.set(keep.expires_at_ms)
        report = await rt.poll()
        by_work = {r.lease.work_id: r for r in report.recoveries}
        assert set(by_work) == {keep.work_id, drop.work_id}
        assert not any(r.relaunch for r in report.recoveries), "a host's own claim was relaunched"
        adopted = await rt.adopt(by_work[keep.work_id].lease)
        assert await rt.adopt(by_work[keep.work_id].lease) == adopted, "adoption is not idempotent"
        with pytest.raises(StaleAuthority):
            await rt.complete(keep, Completed())
        assert (await rt.complete(adopted, Completed())).state is ExecutionState.COMPLETED
        failed = await rt.not_adoptable(by_work[drop.work_id].lease, "the host lost its process table")
        assert failed.state is ExecutionState.FAILED
        work = await rt.work(drop.work_id)
        assert (work.state, work.retry) == (WorkState.READY, RetryState.BACKOFF)


async def test_a_recovery_left_alone_is_recovered_again_by_a_later_poll(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches: a recovery that is never repeated once claimed (the host that polled crashed)."""
    cfg = Config.from_dict({"scopes": {SCOPE: {"routes": [HOST_ROUTE]}}})
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        await rt.publish(start("a"))
        await rt.poll()
        lease = await rt.claim(work_id_for_key(SCOPE, "a"), owner="host", lease_ms=LEASE)
        clock.set(lease.expires_at_ms)
        (first,) = (await rt.poll()).recoveries
        clock.set(first.lease.expires_at_ms)
        (second,) = (await rt.poll()).recoveries
        assert second.lease.epoch == first.lease.epoch + 1
        with pytest.raises(StaleAuthority):
            await rt.adopt(first.lease)


async def test_a_clean_close_releases_leases_so_the_next_open_recovers_at_once(tmp_path: Any) -> None:
    """Catches: a clean close that leaves its attempts' leases to run out (the next open would wait a
    lease length, or forever for a Work left ``running``)."""
    store = str(tmp_path / "loom.db")
    async with RuntimeDriver.open(store, config=config(), lease_ms=60_000) as driver:
        await driver.runtime.publish(start("a"))
        work_id = work_id_for_key(SCOPE, "a")
        first = await launched(driver, work_id)
        driver.fake.recover_answers[work_id] = RecoverAnswer.ADOPT
        await driver.reopen()  # the clock does not move: only the release makes it recoverable now
        adopted = await launched(driver, work_id, 2)
        assert adopted.recovered
        assert adopted.request.attempt == 1
        assert adopted.lease.epoch == first.lease.epoch + 1
        assert driver.clock.now_ms() < first.lease.expires_at_ms
        driver.fake.finish(work_id, Completed())
        await driver.settle()
        assert (await driver.runtime.work(work_id)).state is WorkState.COMPLETED


async def test_an_attempt_claimed_and_never_launched_before_a_clean_close_is_relaunched(
    tmp_path: Any,
) -> None:
    """The publish's own commit starts the attempt, and the runtime closes before its runner hands it to
    the executor: the claim marked it handed, the close unmarks it, and the next open relaunches it as
    the same attempt, spending no retry. Catches: a close that leaves it marked (the next open would
    ask the executor to verify what it never had: the fake cannot, so the attempt would fail into
    retry; seen failing so), and a runner that launches after the close began."""
    store = str(tmp_path / "loom.db")
    async with RuntimeDriver.open(store, config=config(), lease_ms=60_000) as driver:
        await driver.runtime.publish(start("a"))
        # no checkpoint in between: the attempt's runner has not run yet when the close begins
        await driver.reopen()
        work_id = work_id_for_key(SCOPE, "a")
        first = await launched(driver, work_id)
        assert len(driver.fake.launches_of(work_id)) == 1
        assert not first.recovered, "the attempt never launched was given to recover, not relaunched"
        assert (first.request.attempt, first.lease.epoch) == (1, 2)
        driver.fake.finish(work_id, Completed())
        await driver.settle()
        work = await driver.runtime.work(work_id)
        assert (work.state, work.attempts, work.failures) == (WorkState.COMPLETED, 1, 0)


async def test_an_executor_not_installed_fails_the_attempt_as_not_adoptable(tmp_path: Any) -> None:
    """Catches: an attempt whose executor is gone after a restart left ``recovering`` (or ``running``)
    for good, with no diagnostic."""
    store = str(tmp_path / "loom.db")
    async with RuntimeDriver.open(store, config=config(), lease_ms=60_000) as driver:
        await driver.runtime.publish(start("a"))
        work_id = work_id_for_key(SCOPE, "a")
        first = await launched(driver, work_id)
    clock = ManualClock(start_ms=T0_MS)
    # reopened without the executor (and so without the binding that needs it)
    async with open_runtime(store, clock=clock, config=Config(), load_entry_points=False) as rt:
        await rt.wait_idle()
        execution = await rt.execution(first.lease.execution_id)
        assert execution.state is ExecutionState.FAILED
        assert "executor 'fake' is not installed" in json.dumps(execution.outcome)
        (diagnostic,) = await rt.diagnostics(kind="recovery_failed")
        assert diagnostic.subject == execution.id
        assert (await rt.work(work_id)).retry is RetryState.BACKOFF


async def test_a_recover_that_raises_fails_that_attempt_into_retry_and_nothing_else(
    loom_drivers: Any,
) -> None:
    """Catches: a raising ``recover`` that stops the runtime, or one left to be recovered again every
    lease length for good (a diagnostic a minute, and the Work never moves)."""
    async with loom_drivers(config=config(), lease_ms=LEASE) as driver:
        await driver.runtime.publish(start("a"))
        work_id = work_id_for_key(SCOPE, "a")
        first = await launched(driver, work_id)

        async def broken(request: Any, toolbelt: Any, metadata: Any) -> Any:
            raise OSError("the process table is unreadable")

        driver.fake.recover = broken  # type: ignore[method-assign]
        driver.clock.set(first.lease.expires_at_ms)

        async def failed() -> bool:
            execution = await driver.runtime.execution(first.lease.execution_id)
            return execution.state is ExecutionState.FAILED

        await driver.until(failed, "the attempt to fail as not adoptable")
        work = await driver.runtime.work(work_id)
        assert (work.state, work.retry, work.failures) == (WorkState.READY, RetryState.BACKOFF, 1)
        (diagnostic,) = await driver.runtime.diagnostics(kind="executor_failed")
        assert "the process table is unreadable" in diagnostic.message
        await driver.runtime.publish(start("b"))
        assert (await launched(driver, work_id_for_key(SCOPE, "b"))).request.attempt == 1


def test_an_adopted_attempts_outcome_reads_no_segment_clock(kernel: Kernel) -> None:
    """`chains.adopt_then_complete_in_tx`: the adoption tells the attempt's segment clock (only its
    state moved), so the outcome's end of the segment reads none, and counts the segment's time all the
    same. Catches: the clock read again (a statement per recovered attempt); a clock told wrong
    (conftest's check of every told record, and the time counted)."""
    lease = kernel.claim("a", timeout_ms=60_000)  # (its active time is counted in segments)
    kernel.now = lease.expires_at_ms
    recovery = kernel.recover(kernel.run(expired_in_tx, 10)[0])
    before = kernel.execution(lease.execution_id)
    kernel.now += 500

    def adopt_complete(tx: Tx, now_ms: int) -> list[str]:
        queries = counting_queries(tx)
        auth = Authority.of(recovery.lease)
        adopt_then_complete_in_tx(tx, now_ms, auth, Completed(), KindPolicy(), CausalLimits(), ())
        return queries

    queries = kernel.run(adopt_complete)
    assert [q for q in queries if q.startswith("SELECT segment_started_ms")] == []
    after = kernel.execution(lease.execution_id)
    assert after.state is ExecutionState.COMPLETED
    assert after.used_ms == before.used_ms + LEASE + 500, "the segment's time from the claim on"
