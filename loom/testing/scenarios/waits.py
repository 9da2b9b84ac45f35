"""Event waits: registration in both orders, the timeout tie, cancellation orders, watermarks, and
resume against attempt N+1.

Work runs under the test executor ``fake``: a scenario finishes a launch with a `Waiting` outcome to
park it (or end it, without the resume capability), and observes the continuation as the fake's next
launch of that Work.
"""

from __future__ import annotations

from typing import Any

from ... import (
    Completed,
    Conflict,
    EventIn,
    ExecutionState,
    RunRequest,
    StaleAuthority,
    Waiting,
    WaitSpec,
    WaitState,
    WorkState,
)
from ...plugins.handlers import work_id_for_key
from .._driver import Driver, wait_routed
from .._scenario import expect
from ._common import SCOPE, _config

SECOND = 1_000


def _route(*capabilities: str) -> Any:
    return _config(
        [{"name": "w", "types": ["w.*", "v.*"], "create_work": True, "binding": "fake"}],
        capabilities=capabilities,
    )


def _w(delivery_id: str, type: str = "w.note", *, key: str = "wk") -> EventIn:
    return EventIn(source="scenario", delivery_id=delivery_id, type=type, scope=SCOPE, key=key)


async def _launches(driver: Driver, work_id: str, n: int) -> None:
    async def enough() -> bool:
        return len(driver.fake.launches_of(work_id)) >= n

    await driver.until(enough, f"launch {n} of {work_id}")


async def _woken(driver: Driver, work_id: str, what: str) -> Any:
    """Let the runtime settle, then the Work's latest wait must be woken (a wake is part of the
    transaction that routes its winner, fires its timeout or registers it: never later)."""
    await driver.settle()
    waits = await driver.runtime.waits(work_id)
    expect(waits and waits[-1].state is WaitState.WOKEN, f"{what}: the wait did not wake ({waits[-1:]})")
    return waits[-1]


async def _continued(driver: Driver, work_id: str, n: int) -> None:
    """Let the runtime settle; the Work's continuation (launch ``n``) must have started."""
    await driver.settle()
    expect(len(driver.fake.launches_of(work_id)) >= n, f"{work_id}'s continuation (launch {n}) did not start")


async def _wait_state(driver: Driver, work_id: str, state: WaitState, what: str) -> Any:
    async def reached() -> bool:
        waits = await driver.runtime.waits(work_id)
        return bool(waits) and waits[-1].state is state

    await driver.until(reached, what)
    return (await driver.runtime.waits(work_id))[-1]


def _trigger_id(request: RunRequest) -> str | None:
    return request.trigger.id if request.trigger is not None else None


async def _finish_all(driver: Driver) -> None:
    """Complete every launch still running, then let the runtime settle."""
    for launch in driver.fake.launches:
        if not launch.done.is_set():
            launch.outcome, launch.answered = Completed(), True
            launch.done.set()
    await driver.settle()


async def _start(driver: Driver, key: str, delivery_id: str) -> str:
    """Publish the first Event of ``key`` and wait for its attempt to launch; return the Work id."""
    await driver.runtime.publish(_w(delivery_id, "w.start", key=key))
    work_id = work_id_for_key(SCOPE, key)
    await _launches(driver, work_id, 1)
    return work_id


async def wait_event_registration_orders(driver: Driver) -> None:
    """Match first (found by registration's own scan) and wait first both wake exactly once; an Event
    the Work's own execution published never matches its own wait but wakes another Work."""
    await driver.configure(_route())
    # 1. match first: accepted after the attempt's watermark, before registration
    a = await _start(driver, "a", "a0")
    early = await driver.runtime.publish(_w("a1", key="a"))
    await wait_routed(driver, early)
    driver.fake.finish(a, Waiting(wait=WaitSpec(types=("w.*",))))
    wait = await _woken(driver, a, "the wait registered after its match to wake")
    expect(
        wait.winner_event_id == early.id, f"registration's scan did not wake with the earlier match: {wait}"
    )
    expect(
        wait.woken_at_ms == wait.created_at_ms,
        "a match already accepted at registration must wake in the registration transaction",
    )
    await _continued(driver, a, 2)
    expect(
        _trigger_id(driver.fake.launches_of(a)[1].request) == early.id,
        "attempt 2 is not triggered by the winner",
    )
    await driver.reopen()

    # 2. wait first: the match arrives after registration
    b = await _start(driver, "b", "b0")
    driver.fake.finish(b, Waiting(wait=WaitSpec(types=("w.*",))))
    await _wait_state(driver, b, WaitState.ACTIVE, "b's wait to be registered")
    expect((await driver.runtime.work(b)).state is WorkState.WAITING, "b is not waiting")
    late = await driver.runtime.publish(_w("b1", key="b"))
    again = await driver.runtime.publish(_w("b2", key="b"))
    wait = await _woken(driver, b, "the later match to wake b")
    expect(wait.winner_event_id == late.id, f"b was not woken by the first match after registration: {wait}")
    await _continued(driver, b, 2)
    await wait_routed(driver, again)
    waits = await driver.runtime.waits(b)
    expect(len(waits) == 1 and waits[0].state is WaitState.WOKEN, f"b's wait woke more than once: {waits}")
    await driver.reopen()

    # 3. the Work's own Event never matches its own wait, but wakes another Work waiting on its key
    v = await _start(driver, "v", "v0")
    driver.fake.finish(v, Waiting(wait=WaitSpec(types=("v.*",))))
    await _wait_state(driver, v, WaitState.ACTIVE, "v's wait to be registered")
    o = await _start(driver, "o", "o0")
    own = driver.fake.running(o)
    await own.toolbelt.emit(_w("o-own", "v.done", key="o"))
    await own.toolbelt.emit(_w("o-for-v", "v.done", key="v"))
    driver.fake.finish(o, Waiting(wait=WaitSpec(types=("v.*",))))
    await _woken(driver, v, "o's Event on v's key to wake v")
    o_wait = await _wait_state(driver, o, WaitState.ACTIVE, "o's own wait to stay active")
    expect(o_wait.winner_event_id is None, "an Event the Work's own execution published woke its own wait")
    await driver.runtime.cancel(o)
    await _finish_all(driver)


async def wait_timeout_acceptance_tie(driver: Driver) -> None:
    """The lowest accepted sequence wins: a match accepted at T-1 beats the timeout due at T; a timeout
    accepted first beats a later match; a clock deadline alone wakes nothing; an accepted timeout stays
    recognised after its timer is gone."""
    await driver.configure(_route())
    # 1. a normal match accepted at T-1 ms wins over the timeout due at T
    a = await _start(driver, "ta", "ta0")
    driver.fake.finish(a, Waiting(wait=WaitSpec(types=("w.*",), timeout_ms=10 * SECOND)))
    wait = await _wait_state(driver, a, WaitState.ACTIVE, "a's wait with a timeout")
    deadline = wait.timeout_at_ms
    expect(deadline is not None, "the wait recorded no timeout")
    driver.clock.set(deadline - 1)
    match = await driver.runtime.publish(_w("ta1", key="ta"))
    driver.clock.set(deadline)
    wait = await _woken(driver, a, "a's wait to wake")
    expect(wait.winner_event_id == match.id, f"the timeout beat a match accepted 1 ms before it: {wait}")
    await driver.settle()
    expect(
        (await driver.runtime.waits(a))[-1].winner_event_id == match.id,
        "a timeout accepted at the deadline rewrote the wake of the earlier match",
    )

    # 2. the timeout accepted first wins over a later match
    b = await _start(driver, "tb", "tb0")
    driver.fake.finish(b, Waiting(wait=WaitSpec(types=("w.*",), timeout_ms=10 * SECOND)))
    wait = await _wait_state(driver, b, WaitState.ACTIVE, "b's wait with a timeout")
    driver.clock.set(wait.timeout_at_ms or 0)
    woken = await _woken(driver, b, "b's timeout to wake it")
    await driver.runtime.publish(_w("tb1", key="tb"))
    timeout = await driver.runtime.event(woken.winner_event_id or "")
    expect(timeout.type == "core.wait.timeout", f"b was not woken by its timeout: {timeout.type}")
    await driver.reopen()

    # 3. the clock passing a deadline with no accepted timeout Event wakes nothing; an accepted timeout
    # is recognised after its timer fired and was deleted
    c = await _start(driver, "tc", "tc0")
    driver.fake.finish(c, Waiting(wait=WaitSpec(types=("w.*",))))
    await _wait_state(driver, c, WaitState.ACTIVE, "c's wait without timeout")
    driver.clock.advance(3_600 * SECOND)
    await driver.settle()
    waits = await driver.runtime.waits(c)
    expect(waits[-1].state is WaitState.ACTIVE, "the clock alone woke a wait with no accepted Event")
    timer = await driver.runtime.timer(woken.timeout_timer_id or "")
    expect(timer.state.value != "armed", "b's timeout timer is still armed after firing")
    history = await driver.runtime.waits(b)
    expect(
        history[0].timeout_delivery_id is not None and history[0].winner_event_id == timeout.id,
        "b's wait does not recognise its accepted timeout after the timer is gone",
    )
    await driver.runtime.cancel(c)
    await _finish_all(driver)


async def wait_cancel_orders(driver: Driver) -> None:
    """Cancel first: wait, timer and attempts cancelled, Work terminal, later matches audit-only. Wake
    first: the woken history stays and cancelling fences the continuation; no start follows."""
    driver.fake.capabilities.add("resume")
    await driver.configure(_route("resume"))
    # 1. cancel first
    a = await _start(driver, "ca", "ca0")
    driver.fake.finish(a, Waiting(wait=WaitSpec(types=("w.*",), timeout_ms=5 * SECOND)))
    wait = await _wait_state(driver, a, WaitState.ACTIVE, "a's wait")
    await driver.runtime.cancel(a)
    waits = await driver.runtime.waits(a)
    expect(waits[-1].state is WaitState.CANCELLED, f"cancelling did not cancel the wait: {waits[-1]}")
    timer = await driver.runtime.timer(wait.timeout_timer_id or "")
    expect(timer.state.value == "cancelled", f"cancelling left the wait's timeout {timer.state}")
    history = await driver.runtime.history(a)
    expect(all(x.state.terminal for x in history.executions), "cancelling left a parked attempt")
    expect(history.work.state is WorkState.CANCELLED, "the Work is not terminal after cancel")
    late = await driver.runtime.publish(_w("ca1", key="ca"))
    driver.clock.advance(10 * SECOND)
    await wait_routed(driver, late)
    await driver.settle()
    expect(
        (await driver.runtime.waits(a))[-1].state is WaitState.CANCELLED,
        "a later match rewrote a cancelled wait",
    )
    expect(len(driver.fake.launches_of(a)) == 1, "a cancelled Work started again")
    await driver.reopen()

    # 2. wake first: the woken history stays, cancel fences the resumed attempt
    b = await _start(driver, "cb", "cb0")
    driver.fake.finish(b, Waiting(wait=WaitSpec(types=("w.*",))))
    await _wait_state(driver, b, WaitState.ACTIVE, "b's wait")
    match = await driver.runtime.publish(_w("cb1", key="cb"))
    woken = await _woken(driver, b, "b's wake")
    await _continued(driver, b, 2)
    resumed = driver.fake.launches_of(b)[1]
    await driver.runtime.cancel(b)
    waits = await driver.runtime.waits(b)
    expect(waits[-1] == woken and woken.winner_event_id == match.id, "cancelling rewrote the woken history")
    try:
        await driver.runtime.complete(resumed.toolbelt.lease, Completed())
        fenced = False
    except StaleAuthority:
        fenced = True
    expect(fenced, "cancelling after the wake did not fence the resumed attempt")
    await driver.runtime.publish(_w("cb2", key="cb"))
    await driver.settle()
    expect(len(driver.fake.launches_of(b)) == 2, "a start followed the cancellation")


async def wait_watermark_and_timeout_only(driver: Driver) -> None:
    """Watermarks beyond accepted history or behind the acknowledged one are refused; a match at or
    below the watermark is not used; a timeout-only wait wakes from its timeout; a resume-capable
    binding resumes the same attempt at a higher epoch (the old token fails), otherwise attempt N+1."""
    await driver.configure(_route())
    # 1. watermarks out of range are refused
    a = await _start(driver, "ma", "ma0")
    launch = driver.fake.running(a)
    watermark = max(e.seq for e in launch.request.inputs)
    accepted = (await driver.runtime.events(limit=10_000))[-1].seq
    for after, why in ((accepted + 1_000, "beyond accepted history"), (watermark - 1, "behind the attempt")):
        try:
            await driver.runtime.wait(launch.toolbelt.lease, WaitSpec(after_seq=after))
            refused = ""
        except Conflict as exc:  # (refused by where history and the attempt stand: a conflict)
            refused = str(exc)
        expect(why in refused, f"a watermark {after} was not refused as {why!r}: {refused!r}")
    # 2. a match at or below the watermark is not used
    below = await driver.runtime.publish(_w("ma1", key="ma"))
    await wait_routed(driver, below)
    driver.fake.finish(a, Waiting(wait=WaitSpec(after_seq=below.seq)))
    wait = await _wait_state(driver, a, WaitState.ACTIVE, "a's wait above its watermark")
    expect(wait.winner_event_id is None, "a match at the watermark woke the wait")
    above = await driver.runtime.publish(_w("ma2", key="ma"))
    wait = await _woken(driver, a, "a's wake on the match above its watermark")
    expect(
        wait.winner_event_id == above.id, f"the wait woke on {wait.winner_event_id}, not the match above it"
    )
    await _continued(driver, a, 2)
    expect(
        driver.fake.launches_of(a)[1].request.attempt == 2, "without resume the continuation is attempt N+1"
    )
    await driver.reopen()

    # 3. a timeout-only wait wakes from its timeout
    t = await _start(driver, "mt", "mt0")
    driver.fake.finish(t, Waiting(wait=WaitSpec(types=("never.*",), timeout_ms=SECOND)))
    await _wait_state(driver, t, WaitState.ACTIVE, "the timeout-only wait to be registered")
    driver.clock.advance(SECOND)
    wait = await _woken(driver, t, "the timeout-only wait to wake")
    timeout = await driver.runtime.event(wait.winner_event_id or "")
    expect(timeout.type == "core.wait.timeout", f"the timeout-only wait woke on {timeout.type}")

    # 4. a resume-capable binding resumes the same attempt at a higher epoch with a new token
    driver.fake.capabilities.add("resume")
    await driver.configure(_route("resume"))
    r = await _start(driver, "mr", "mr0")
    first = driver.fake.running(r)
    driver.fake.finish(r, Waiting(wait=WaitSpec(types=("w.*",))))
    await _wait_state(driver, r, WaitState.ACTIVE, "r's wait")
    parked = (await driver.runtime.history(r)).executions[-1]
    expect(parked.state is ExecutionState.PARKED, f"a resume-capable attempt did not park: {parked.state}")
    winner = await driver.runtime.publish(_w("mr1", key="mr"))
    await _continued(driver, r, 2)
    second = driver.fake.launches_of(r)[1]
    lease = second.toolbelt.lease
    expect(
        lease.attempt == first.request.attempt and lease.epoch == first.toolbelt.lease.epoch + 1,
        f"the resume is not the same attempt at a higher epoch: {lease}",
    )
    expect(
        second.request.resumed and _trigger_id(second.request) == winner.id,
        "the resume is not triggered by the winner",
    )
    expect(lease.token != first.toolbelt.lease.token, "the resume kept the old token")
    resumed = await driver.runtime.execution(lease.execution_id)
    expect(
        resumed.trigger_id == _trigger_id(first.request), "resuming changed the attempt's immutable trigger"
    )
    try:
        await driver.runtime.complete(first.toolbelt.lease, Completed())
        stale = False
    except StaleAuthority:
        stale = True
    expect(stale, "the old token was accepted after the resume")
    await _finish_all(driver)


WAIT_SCENARIOS = (
    wait_event_registration_orders,
    wait_timeout_acceptance_tie,
    wait_cancel_orders,
    wait_watermark_and_timeout_only,
)
