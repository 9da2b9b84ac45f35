"""Lease recovery and adoption, retry with backoff, and the cancellation orders of retry and recovery
.

Work runs under the test executor ``fake``. A lease is lost by moving the clock to its expiry (the
runtime's own renewal then fails too: expiry is exclusive); the recovery actor takes the attempt from
there and asks the fake's ``recover``, which adopts or answers `NotAdoptable` as
`FakeExecutor.recover_answers` says.
"""

from __future__ import annotations

from typing import Any

import trio

from ... import (
    Completed,
    EventIn,
    ExecutionState,
    Failed,
    StaleAuthority,
    TimerState,
    WorkState,
)
from ...plugins.handlers import work_id_for_key
from ...records.work import RetryState
from .._driver import Driver
from .._fake import Launch, RecoverAnswer
from .._scenario import expect
from ._common import SCOPE, _config

MINUTE = 60_000


def _route(work_kinds: dict[str, Any] | None = None, kind: str | None = None) -> Any:
    route: dict[str, Any] = {"name": "r", "types": ["r.*"], "create_work": True, "binding": "fake"}
    if kind is not None:
        route["work_kind"] = kind
    return _config([route], work_kinds=work_kinds)


def _r(delivery_id: str, *, key: str) -> EventIn:
    return EventIn(source="scenario", delivery_id=delivery_id, type="r.start", scope=SCOPE, key=key)


async def _launched(driver: Driver, work_id: str, n: int, *, recovered: bool = False) -> Launch:
    """Wait for the Work's ``n``-th launch (counting adoptions); return it."""

    async def enough() -> bool:
        return len(driver.fake.launches_of(work_id)) >= n

    await driver.until(enough, f"launch {n} of {work_id}")
    launch = driver.fake.launches_of(work_id)[n - 1]
    expect(launch.recovered is recovered, f"launch {n} of {work_id}: recovered={launch.recovered}")
    return launch


async def _start(driver: Driver, key: str) -> tuple[str, Launch]:
    await driver.runtime.publish(_r(f"{key}-0", key=key))
    work_id = work_id_for_key(SCOPE, key)
    return work_id, await _launched(driver, work_id, 1)


async def _execution_state(driver: Driver, execution_id: str, state: ExecutionState, what: str) -> Any:
    async def reached() -> bool:
        return (await driver.runtime.execution(execution_id)).state is state

    await driver.until(reached, what)
    return await driver.runtime.execution(execution_id)


async def _stale(call: Any, what: str) -> str:
    try:
        await call
    except StaleAuthority as exc:
        return str(exc)
    raise AssertionError(f"{what} was accepted under a lost lease")


async def lease_loss_adoption_and_stale_result(driver: Driver) -> None:
    """Expiry is exclusive; recovery claims the same attempt at a higher epoch and an adopting executor
    gets a new token (the old one's completion fails and changes nothing); `NotAdoptable` fails the
    attempt under the new fence with retry applied; a cancelled Work's attempt is never recovered."""
    await driver.configure(_route())
    fake = driver.fake

    # 1. at now == expires_at the lease has lost authority: its renewal fails
    adopt, first = await _start(driver, "adopt")
    fake.recover_answers[adopt] = RecoverAnswer.ADOPT
    fake.recover_gates[adopt] = gate = trio.Event()
    old = first.lease
    driver.clock.set(old.expires_at_ms)
    await _stale(driver.runtime.renew(old), "a renewal at the lease's expiry")

    # 2. recovery claims the same attempt at a higher epoch; the adoption replaces the token
    recovering = await _execution_state(
        driver, old.execution_id, ExecutionState.RECOVERING, "recovery to claim the expired attempt"
    )
    expect(
        recovering.epoch == old.epoch + 1, f"recovery claimed epoch {recovering.epoch}, not {old.epoch + 1}"
    )
    expect(recovering.attempt == old.attempt, "recovery started another attempt instead of the same one")
    gate.set()
    adopted = await _launched(driver, adopt, 2, recovered=True)
    expect(adopted.lease.token != old.token, "the adoption kept the old token")
    before = await driver.runtime.execution(old.execution_id)
    expect(before.state is ExecutionState.RUNNING, f"the adopted attempt is {before.state}, not running")
    await _stale(driver.runtime.complete(old, Completed()), "the old token's completion")
    await _stale(first.toolbelt.emit(_r("adopt-stale", key="adopt")), "the old token's emission")
    await _stale(first.toolbelt.heartbeat(), "the old token's heartbeat")
    expect(
        await driver.runtime.execution(old.execution_id) == before,
        "a stale result changed the adopted attempt",
    )
    fake.finish(adopt, Completed())
    done = await _execution_state(driver, old.execution_id, ExecutionState.COMPLETED, "the adopted attempt")
    expect(done.epoch == old.epoch + 1, "the adopted attempt completed under another epoch")
    work = await driver.runtime.work(adopt)
    expect(work.attempts == 1, f"recovery spent an attempt number: {work.attempts}")
    await driver.reopen()

    # 3. an executor that cannot verify: the attempt fails under the new fence, and retry applies
    lost, launch = await _start(driver, "lost")
    driver.clock.set(launch.lease.expires_at_ms + 1)
    failed = await _execution_state(
        driver, launch.lease.execution_id, ExecutionState.FAILED, "the unverifiable attempt to fail"
    )
    expect(failed.epoch == launch.lease.epoch + 1, f"it failed under epoch {failed.epoch}, not the new fence")
    expect(
        bool(failed.outcome and failed.outcome.get("recovery")), f"not failed by recovery: {failed.outcome}"
    )
    work = await driver.runtime.work(lost)
    expect(work.state is WorkState.READY and work.retry is RetryState.BACKOFF, f"no retry applied: {work}")
    expect(work.failures == 1, f"the failure was not counted: {work.failures}")
    await _stale(
        driver.runtime.complete(launch.lease, Completed()), "the unverifiable attempt's old completion"
    )
    driver.clock.advance(5 * MINUTE)
    retried = await _launched(driver, lost, 2)
    expect(retried.request.attempt == 2, f"the retry is attempt {retried.request.attempt}, not 2")
    fake.finish(lost, Completed())
    await driver.reopen()

    # 4. recovery and cancellation: whichever commits first decides
    # (a) recovery claimed, then the Work is cancelled: the adoption is refused
    gone, launch = await _start(driver, "gone")
    fake.recover_answers[gone] = RecoverAnswer.ADOPT
    fake.recover_gates[gone] = gate = trio.Event()
    driver.clock.set(launch.lease.expires_at_ms)
    await _execution_state(driver, launch.lease.execution_id, ExecutionState.RECOVERING, "recovery of gone")
    await driver.runtime.cancel(gone)
    gate.set()
    await driver.settle()
    execution = await driver.runtime.execution(launch.lease.execution_id)
    expect(execution.state is ExecutionState.CANCELLED, f"a cancelled attempt was adopted: {execution.state}")
    expect(len(fake.launches_of(gone)) == 1, "the cancelled Work's attempt was adopted and ran again")
    # (b) cancelled first: recovery of its attempt is refused (it is never even asked)
    first_cancel, launch = await _start(driver, "cancelled")
    await driver.runtime.cancel(first_cancel)
    driver.clock.set(launch.lease.expires_at_ms + MINUTE)
    await driver.settle()
    asked = [e for e, _ in fake.recovered if e == launch.lease.execution_id]
    expect(not asked, "recovery was attempted for a cancelled Work's attempt")
    execution = await driver.runtime.execution(launch.lease.execution_id)
    expect(
        execution.state is ExecutionState.CANCELLED and execution.epoch == launch.lease.epoch,
        f"recovery changed a cancelled attempt: {execution.state} at epoch {execution.epoch}",
    )


async def retry_backoff_exhaustion_and_manual_event(driver: Driver) -> None:
    """A four-attempt budget: failures 1, 2, 3 arm retries at +5, +10, +15 minutes and the next attempt
    starts only when ``core.retry.due`` fires; failure 4 exhausts (no timer) and the Work stays
    nonterminal; a manual ``core.retry.requested`` starts the next attempt and resets the budget."""
    await driver.configure(_route({"job": {"retry_attempts": 4}}, kind="job"))
    fake = driver.fake
    work_id, launch = await _start(driver, "job")
    for failure, minutes in ((1, 5), (2, 10), (3, 15)):
        failed_at = driver.clock.now_ms()
        fake.finish(work_id, Failed(error=f"failure {failure}"))
        await driver.settle()
        work = await driver.runtime.work(work_id)
        expect(
            work.state is WorkState.READY and work.retry is RetryState.BACKOFF and work.failures == failure,
            f"after failure {failure}: {work.state}, retry {work.retry}, failures {work.failures}",
        )
        timer = await driver.runtime.timer(f"retry:{work_id}:{failure}")
        expect(
            timer.state is TimerState.ARMED and timer.fire_at_ms == failed_at + minutes * MINUTE,
            f"failure {failure} armed {timer.state} at {timer.fire_at_ms}, not +{minutes} minutes",
        )
        if failure == 2:
            await driver.reopen()  # the backoff is durable
        # input arriving during the backoff queues; it does not start an attempt
        await driver.runtime.publish(_r(f"job-during-{failure}", key="job"))
        driver.clock.set(timer.fire_at_ms - 1)
        await driver.settle()
        expect(
            len(fake.launches_of(work_id)) == failure, f"an attempt started before retry {failure} was due"
        )
        driver.clock.set(timer.fire_at_ms)
        launch = await _launched(driver, work_id, failure + 1)
        expect(launch.request.attempt == failure + 1, f"attempt {launch.request.attempt} after {failure}")
        due = [e for e in launch.request.inputs if e.type == "core.retry.due"]
        expect(len(due) == 1, f"attempt {failure + 1} was not started by its core.retry.due Event")
    fake.finish(work_id, Failed(error="failure 4"))
    await driver.settle()
    work = await driver.runtime.work(work_id)
    expect(
        not work.state.terminal and work.retry is RetryState.EXHAUSTED and work.failures == 4,
        f"failure 4 did not exhaust the budget: {work.state}, {work.retry}, {work.failures}",
    )
    expect(work.held and "retry" in (work.hold_reason or ""), f"no actionable hold: {work.hold_reason!r}")
    armed = [
        t for t in await driver.runtime.timers(state=TimerState.ARMED) if t.id.startswith(f"retry:{work_id}:")
    ]
    expect(not armed, f"an exhausted budget armed a retry timer: {armed}")
    driver.clock.advance(60 * MINUTE)
    await driver.settle()
    expect(len(fake.launches_of(work_id)) == 4, "an attempt started after the budget was spent")
    await driver.reopen()

    # 2. a manual retry starts attempt 5 and resets the budget
    requested = await driver.runtime.retry(work_id, reason="fixed the credentials", request_id="manual-1")
    launch = await _launched(driver, work_id, 5)
    expect(launch.request.attempt == 5, f"the manual retry started attempt {launch.request.attempt}")
    expect(
        requested.id in [e.id for e in launch.request.inputs],
        "the manual core.retry.requested Event is not the next attempt's input",
    )
    work = await driver.runtime.work(work_id)
    expect(work.failures == 0 and work.retry is None and not work.held, f"the budget was not reset: {work}")
    fake.finish(work_id, Failed(error="failure after the reset"))
    await driver.settle()
    work = await driver.runtime.work(work_id)
    expect(
        work.failures == 1 and work.retry is RetryState.BACKOFF,
        f"after the reset a failure is the first again: {work}",
    )
    await driver.runtime.cancel(work_id)


async def retry_cancel_orders(driver: Driver) -> None:
    """Retry due accepted, then cancel: the due Event stays in history, the attempt and eligibility are
    cancelled. Cancel, then the retry timer's firing: nothing rearms or claims."""
    await driver.configure(_route())
    fake = driver.fake

    # 1. the retry is due and its attempt started; then the Work is cancelled
    first, _ = await _start(driver, "due-first")
    fake.recover_answers.clear()
    fake.launch_gates[first] = gate = trio.Event()  # the retried attempt is claimed, not yet running
    fake.finish(first, Failed(error="boom"))
    await driver.settle()
    timer = await driver.runtime.timer(f"retry:{first}:1")
    driver.clock.set(timer.fire_at_ms)
    retried = await _launched(driver, first, 2)
    due = [e for e in retried.request.inputs if e.type == "core.retry.due"]
    expect(len(due) == 1, "the retried attempt was not started by its core.retry.due Event")
    await driver.runtime.cancel(first)
    gate.set()
    await driver.settle()
    history = await driver.runtime.history(first)
    expect(
        due[0].id in [c.event_id for c in history.checkpoints],
        "the accepted core.retry.due Event left the Work's history",
    )
    execution = await driver.runtime.execution(retried.request.execution_id)
    expect(execution.state is ExecutionState.CANCELLED, f"the retried attempt is {execution.state}")
    await _stale(driver.runtime.complete(retried.lease, Completed()), "the cancelled attempt's completion")
    work = await driver.runtime.work(first)
    expect(
        work.state is WorkState.CANCELLED and work.retry is None, f"eligibility survived the cancel: {work}"
    )
    await driver.reopen()

    # 2. cancel during the backoff; the retry timer's time passes: nothing rearms or claims
    second, _ = await _start(driver, "cancel-first")
    fake.finish(second, Failed(error="boom"))
    await driver.settle()
    timer = await driver.runtime.timer(f"retry:{second}:1")
    expect(timer.state is TimerState.ARMED, f"the retry timer is {timer.state}")
    await driver.runtime.cancel(second)
    timer = await driver.runtime.timer(timer.id)
    expect(timer.state is TimerState.CANCELLED, f"cancel left the retry timer {timer.state}")
    driver.clock.set(timer.fire_at_ms + 60 * MINUTE)
    await driver.settle()
    expect(len(fake.launches_of(second)) == 1, "an attempt started after the Work was cancelled")
    expect(
        (await driver.runtime.timer(timer.id)).state is TimerState.CANCELLED, "the retry timer was rearmed"
    )
    armed = [
        t for t in await driver.runtime.timers(state=TimerState.ARMED) if t.id.startswith(f"retry:{second}:")
    ]
    expect(not armed, f"a retry timer was armed for cancelled Work: {armed}")
    work = await driver.runtime.work(second)
    expect(work.state is WorkState.CANCELLED and work.attempts == 1, f"the cancelled Work moved: {work}")
    expect(work.retry is None, f"the cancelled Work kept its retry eligibility: {work.retry}")


RECOVERY_SCENARIOS = (
    lease_loss_adoption_and_stale_result,
    retry_backoff_exhaustion_and_manual_event,
    retry_cancel_orders,
)
