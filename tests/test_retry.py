"""Retry with backoff (docs/recovery.md "Retry with backoff").

A host-driven runtime (no background actors): the host routes and fires with `poll`, claims and
completes attempts itself, so every step is one call. Each test names the wrong implementation it
catches.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

from loom import (
    CausalLimits,
    Completed,
    Config,
    Conflict,
    EventIn,
    ExecutionState,
    Failed,
    FiringResult,
    InvalidRequest,
    Lease,
    RetryState,
    Runtime,
    TimerState,
    Waiting,
    WaitSpec,
    WorkState,
    open_runtime,
)
from loom.kernel import retry as kernel_retry
from loom.kernel.kinds import KindPolicy, pin_retry, pinned_retry, pinned_retry_text
from loom.plugins.handlers import work_id_for_key
from loom.testing import ManualClock

SCOPE = "acme"
MINUTE = 60_000


def config(**kind: Any) -> Config:
    route: dict[str, Any] = {"name": "r", "types": ["r.*"], "create_work": True}
    data: dict[str, Any] = {"scopes": {SCOPE: {"routes": [route]}}}
    if kind:
        route["work_kind"] = "job"
        data["work_kinds"] = {"job": kind}
    return Config.from_dict(data)


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    async with open_runtime(
        loom_store, clock=clock, config=config(), actors=(), load_entry_points=False
    ) as rt:
        yield rt


async def started(rt: Runtime, key: str = "a", n: int = 0) -> Lease:
    await rt.publish(EventIn(source="t", delivery_id=f"{key}-{n}", type="r.start", scope=SCOPE, key=key))
    await rt.poll()
    return await rt.claim(work_id_for_key(SCOPE, key), owner="host")


async def fail(rt: Runtime, lease: Lease, **hint: Any) -> None:
    await rt.complete(lease, Failed(error="boom", **hint))


async def retry_timer(rt: Runtime, lease: Lease) -> Any:
    return await rt.timer(f"retry:{lease.work_id}:{lease.attempt}")


async def test_a_failure_ends_the_attempt_and_arms_the_retry_in_one_commit(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: a failure that leaves the Work claimable at once (the next Event, or a poll, would start
    an attempt during the backoff), or one that forgets the failure count."""
    lease = await started(rt)
    await fail(rt, lease)
    work = await rt.work(lease.work_id)
    assert (work.state, work.retry, work.failures, work.attempts) == (
        WorkState.READY,
        RetryState.BACKOFF,
        1,
        1,
    )
    assert (await rt.execution(lease.execution_id)).state is ExecutionState.FAILED
    timer = await retry_timer(rt, lease)
    assert (timer.state, timer.fire_at_ms) == (TimerState.ARMED, clock.now_ms() + 5 * MINUTE)
    # input arriving during the backoff queues, and does not make the Work claimable
    await rt.publish(EventIn(source="t", delivery_id="a-late", type="r.start", scope=SCOPE, key="a"))
    await rt.poll()
    with pytest.raises(Conflict, match="retry backoff"):
        await rt.claim(lease.work_id, owner="host")


async def test_the_default_budget_is_three_attempts_five_then_ten_minutes(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: jitter, a doubling backoff (5, 10, 20 ...), or a budget counted from the attempt number
    rather than the failure count."""
    lease = await started(rt)
    for minutes in (5, 10):
        await fail(rt, lease)
        timer = await retry_timer(rt, lease)
        assert timer.fire_at_ms == clock.now_ms() + minutes * MINUTE
        clock.set(timer.fire_at_ms - 1)
        assert (await rt.poll()).firings == ()
        clock.set(timer.fire_at_ms)
        (firing,) = (await rt.poll()).firings
        due = await rt.event(firing.event_id or "")
        assert due.type == "core.retry.due"
        lease = await rt.claim(lease.work_id, owner="host")
        assert lease.request.trigger is not None
        assert lease.request.trigger.id == due.id, "the retry is not triggered by its due Event"
    await fail(rt, lease)
    work = await rt.work(lease.work_id)
    assert (work.retry, work.failures, work.state) == (RetryState.EXHAUSTED, 3, WorkState.READY)
    assert work.held
    assert "request a retry" in (work.hold_reason or "")
    assert await rt.diagnostics(kind="retry_exhausted")
    with pytest.raises(Exception, match="no timer"):
        await _no_timer(rt, lease)


async def _no_timer(rt: Runtime, lease: Lease) -> None:
    try:
        await retry_timer(rt, lease)
    except Exception as exc:
        raise LookupError("no timer") from exc


async def test_a_retry_names_what_the_failed_attempt_was_about_as_its_origin(
    rt: Runtime, clock: ManualClock
) -> None:
    """``request.origin`` (docs/recovery.md): a retry's trigger is its ``core.retry.due`` Event, and its
    origin the first attempt's trigger, through every retry; a first attempt has none, and a recovered
    retry keeps it. Catches a served function that cannot find its order on a retry (seen: the
    getting-started sample failed every retry with ``KeyError: 'items'``), and an origin that names the
    previous retry's due Event."""
    first = await started(rt)
    assert first.request.origin is None
    assert first.request.trigger is not None
    order = first.request.trigger
    lease = first
    for _ in range(2):
        await fail(rt, lease)
        clock.set((await retry_timer(rt, lease)).fire_at_ms)
        await rt.poll()
        lease = await rt.claim(lease.work_id, owner="host", lease_ms=MINUTE)
        assert lease.request.trigger is not None
        assert lease.request.trigger.type == "core.retry.due"
        assert lease.request.origin == order
    clock.advance(MINUTE)  # its lease expires: a recovery hands the same request on
    (recovered,) = await rt.recover_expired(owner="recoverer")
    assert recovered.lease.request.origin == order


async def test_the_due_event_carries_the_failed_triggers_ancestry(rt: Runtime, clock: ManualClock) -> None:
    """Catches: a retry Event accepted as a new root (a failing loop would escape the causal bounds
    that stop runaway chains)."""
    lease = await started(rt)
    await fail(rt, lease)
    clock.set((await retry_timer(rt, lease)).fire_at_ms)
    (firing,) = (await rt.poll()).firings
    due = await rt.event(firing.event_id or "")
    trigger = lease.request.trigger
    assert trigger is not None
    assert due.parent_id == trigger.id
    assert due.root_id == trigger.root_id
    assert due.depth == trigger.depth + 1


async def test_a_continued_attempts_retry_derives_from_its_wake_bridge(
    rt: Runtime, clock: ManualClock
) -> None:
    """A retry derives from the failed attempt's causal authority: for attempt N+1 after a wait, that is
    the wake's ``core.wait.woken`` bridge, not the winner that triggered it. Catches: a retry timer that
    prefers the attempt's trigger (the retry chain would skip the bridge and its causal charging)."""
    lease = await started(rt)
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("r.go",))))
    await rt.publish(EventIn(source="t", delivery_id="go", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    continued = await rt.claim(lease.work_id, owner="host")
    execution = await rt.execution(continued.execution_id)
    assert continued.request.trigger is not None
    assert execution.authority_id not in (None, continued.request.trigger.id)
    await fail(rt, continued)
    assert (await retry_timer(rt, continued)).parent_id == execution.authority_id


async def test_a_manual_retry_keeps_an_operators_hold(rt: Runtime) -> None:
    """A manual retry lifts only the hold a spent budget put on the Work; a hold an operator placed
    stays until it is released. Catches: a manual retry that lifts any hold (it would start the next
    attempt of Work an operator stopped)."""
    lease = await started(rt)
    await fail(rt, lease)
    await rt.hold(lease.work_id, reason="investigating")
    await rt.retry(lease.work_id, reason="try again", request_id="op-1")
    work = await rt.work(lease.work_id)
    assert (work.retry, work.failures) == (None, 0)
    assert (work.held, work.hold_reason) == (True, "investigating")


async def test_a_cancelled_work_keeps_no_hold_reason(rt: Runtime) -> None:
    """A cancel ends every hold: the Work shows neither one nor its reason. Catches a cancelled Work
    answered ``held: false`` beside the reason of the hold it no longer has (seen for an operator's
    hold, and for a spent retry budget's)."""
    lease = await started(rt)
    await fail(rt, lease)
    await rt.hold(lease.work_id, reason="investigating")
    cancelled = await rt.cancel(lease.work_id)
    assert (cancelled.state, cancelled.held, cancelled.hold_reason) == (WorkState.CANCELLED, False, None)
    assert (await rt.work(lease.work_id)).hold_reason is None


async def test_a_retry_refused_by_the_causal_limits_holds_the_work(
    loom_store: str, clock: ManualClock
) -> None:
    """A retry whose Event the causal limits refuse wakes nothing: the Work is held, saying so, with its
    budget marked spent until a manual retry. Catches: a refusal that marks the budget spent but leaves
    the Work unheld (nothing would say why it never runs again)."""
    async with open_runtime(
        loom_store,
        clock=clock,
        config=attrs.evolve(config(), causal=CausalLimits(max_depth=1)),
        actors=(),
        load_entry_points=False,
    ) as rt:
        lease = await started(rt)  # the trigger is a root: its retry Event would be at depth 1
        parent = lease.request.trigger
        assert parent is not None
        deeper = await rt.publish_derived(
            EventIn(source="t", delivery_id="a-1", type="r.more", scope=SCOPE, key="a"), parent_id=parent.id
        )
        await rt.poll()
        await rt.complete(lease, Completed())
        second = await rt.claim(lease.work_id, owner="host")
        assert second.request.trigger is not None
        assert second.request.trigger.id == deeper.id
        await fail(rt, second)
        clock.set((await retry_timer(rt, second)).fire_at_ms)
        (firing,) = (await rt.poll()).firings
        assert (firing.result, firing.event_id) == (FiringResult.REFUSED, None)
        work = await rt.work(second.work_id)
        assert (work.retry, work.held) == (RetryState.EXHAUSTED, True)
        assert "refused by the causal limits" in (work.hold_reason or "")


async def test_a_configured_four_attempt_budget_adds_fifteen_minutes(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches: a budget that ignores the Work kind's configuration."""
    async with open_runtime(
        loom_store, clock=clock, config=config(retry_attempts=4), actors=(), load_entry_points=False
    ) as rt:
        lease = await started(rt)
        for minutes in (5, 10, 15):
            await fail(rt, lease)
            timer = await retry_timer(rt, lease)
            assert timer.fire_at_ms == clock.now_ms() + minutes * MINUTE
            clock.set(timer.fire_at_ms)
            await rt.poll()
            lease = await rt.claim(lease.work_id, owner="host")
        await fail(rt, lease)
        work = await rt.work(lease.work_id)
        assert (work.retry, work.failures) == (RetryState.EXHAUSTED, 4)


async def test_fail_on_exhaustion_makes_the_spent_budget_terminal(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches: the optional terminal policy ignored (the Work would be held instead)."""
    cfg = config(retry_attempts=1, fail_on_exhaustion=True)
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        lease = await started(rt)
        await fail(rt, lease)
        work = await rt.work(lease.work_id)
        assert (work.state, work.retry) == (WorkState.FAILED, RetryState.EXHAUSTED)


@pytest.mark.parametrize(
    ("hint", "wait_ms"),
    [({"retry_after_ms": 10 * MINUTE}, 12 * MINUTE), ({"rate_limited": True}, 30 * MINUTE)],
    ids=["known-reset", "rate-limited"],
)
async def test_executor_hints_wait_for_the_reset(
    rt: Runtime, clock: ManualClock, hint: dict[str, Any], wait_ms: int
) -> None:
    """Catches: a hint taken as it is (no two-minute margin), or a rate limit retried on the normal
    backoff."""
    lease = await started(rt)
    await fail(rt, lease, **hint)
    assert (await retry_timer(rt, lease)).fire_at_ms == clock.now_ms() + wait_ms


@pytest.mark.parametrize("bad", [-1, 24 * 3_600_000 + 1, "soon", 1.5])
async def test_an_invalid_or_excessive_hint_is_refused_and_changes_nothing(rt: Runtime, bad: Any) -> None:
    """Catches: an invalid hint clamped to zero (an immediate retry) or accepted as it is."""
    lease = await started(rt)
    with pytest.raises(InvalidRequest, match="retry_after_ms"):
        await rt.complete(lease, Failed(error="boom", retry_after_ms=bad))
    assert (await rt.execution(lease.execution_id)).state is ExecutionState.RUNNING
    assert (await rt.work(lease.work_id)).failures == 0


async def test_a_stale_retry_event_cannot_clear_a_later_failures_backoff(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: a retry timer that makes the Work eligible whatever failure it answers for (a manual
    retry, then a new failure, then the first timer's leftover firing would cut the new backoff)."""
    lease = await started(rt)
    await fail(rt, lease)
    first = await retry_timer(rt, lease)
    # the first retry fires (its Event is accepted) but, before it is applied, the operator retries
    await rt.retry(lease.work_id, request_id="op-1")
    assert (await rt.timer(first.id)).state is TimerState.CANCELLED
    clock.advance(MINUTE)
    lease = await rt.claim(lease.work_id, owner="host")
    await fail(rt, lease)
    second = await retry_timer(rt, lease)
    assert second.fire_at_ms == first.fire_at_ms + MINUTE
    clock.set(first.fire_at_ms)  # the cancelled first timer's time: nothing fires, nothing clears
    assert (await rt.poll()).firings == ()
    # and were the first failure's retry Event applied now (a duplicate, or one fired before the
    # manual retry and applied late), it answers for a past failure: audit only
    stale = await rt.timer(first.id)
    late = await rt.publish(
        EventIn(
            source="t", delivery_id="late-due", type="x.late", scope=SCOPE, payload={"work": lease.work_id}
        )
    )

    def apply_stale(tx: Any, now_ms: int) -> None:
        kernel_retry.TIMER_KIND.on_fired(tx, now_ms, stale, late, CausalLimits())

    await rt._p.storage.submit(apply_stale)
    work = await rt.work(lease.work_id)
    assert (work.retry, work.failures) == (RetryState.BACKOFF, 1)
    with pytest.raises(Conflict):
        await rt.claim(lease.work_id, owner="host")
    clock.set(second.fire_at_ms)
    await rt.poll()
    assert (await rt.claim(lease.work_id, owner="host")).attempt == 3


async def test_a_manual_retry_clears_exhaustion_and_resets_the_budget(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: a manual retry that keeps the hold, keeps the old failure count (the next failure would
    exhaust at once), or restarts the attempt numbering."""
    lease = await started(rt)
    for _ in range(2):
        await fail(rt, lease)
        clock.set((await retry_timer(rt, lease)).fire_at_ms)
        await rt.poll()
        lease = await rt.claim(lease.work_id, owner="host")
    await fail(rt, lease)
    assert (await rt.work(lease.work_id)).retry is RetryState.EXHAUSTED
    with pytest.raises(Conflict, match="request a retry"):
        await rt.release(lease.work_id)  # a release would lift the hold and start nothing
    requested = await rt.retry(lease.work_id, reason="fixed", request_id="op-1")
    assert await rt.retry(lease.work_id, reason="fixed", request_id="op-1") == requested, "not idempotent"
    work = await rt.work(lease.work_id)
    assert (work.retry, work.failures, work.held) == (None, 0, False)
    lease = await rt.claim(lease.work_id, owner="host")
    assert lease.attempt == 4
    assert lease.request.trigger is not None
    assert lease.request.trigger.id == requested.id
    await fail(rt, lease)
    assert (await rt.work(lease.work_id)).failures == 1


async def test_a_successful_attempt_resets_the_failure_count(rt: Runtime, clock: ManualClock) -> None:
    """Catches: a failure count that only grows (a Work that failed twice last week would exhaust on
    its next failure)."""
    lease = await started(rt)
    await fail(rt, lease)
    clock.set((await retry_timer(rt, lease)).fire_at_ms)
    await rt.poll()
    lease = await rt.claim(lease.work_id, owner="host")
    await rt.complete(lease, Completed())
    work = await rt.work(lease.work_id)
    assert (work.failures, work.retry) == (0, None)


async def test_a_manual_retry_is_refused_while_an_attempt_runs_or_once_terminal(rt: Runtime) -> None:
    """Catches: a manual retry that starts a second live attempt, or revives terminal Work."""
    lease = await started(rt)
    with pytest.raises(Conflict, match="is not over"):
        await rt.retry(lease.work_id)
    await rt.cancel(lease.work_id)
    with pytest.raises(Conflict, match="cancelled"):
        await rt.retry(lease.work_id)


async def test_a_failed_standing_attempt_arms_no_retry_and_its_next_input_is_its_next_attempt(
    loom_store: str, clock: ManualClock
) -> None:
    """Standing Work arms no automatic retry: its next input is its next attempt. Catches: a failure
    on standing Work treated as a spent budget (no backoff delay exists for it, so a failure policy
    that does not skip standing Work first holds it as exhausted, and its next input starts nothing)."""
    async with open_runtime(
        loom_store, clock=clock, config=config(standing=True), actors=(), load_entry_points=False
    ) as rt:
        lease = await started(rt)
        await fail(rt, lease)
        work = await rt.work(lease.work_id)
        assert (work.state, work.retry, work.held) == (WorkState.READY, None, False)
        assert not await rt.diagnostics(kind="retry_exhausted")
        with pytest.raises(LookupError, match="no timer"):
            await _no_timer(rt, lease)
        nxt = await rt.publish(EventIn(source="t", delivery_id="a-1", type="r.start", scope=SCOPE, key="a"))
        await rt.poll()
        lease = await rt.claim(lease.work_id, owner="host")
        assert (lease.attempt, lease.request.inputs) == (2, (nxt,))


async def test_cancelling_work_in_backoff_cancels_its_retry_timer(rt: Runtime, clock: ManualClock) -> None:
    """Cancellation ends the Work's retry eligibility and every timer armed for it. Catches: a cancel
    that leaves the retry timer armed (it would fire a retry Event for cancelled Work)."""
    lease = await started(rt)
    await fail(rt, lease)
    timer = await retry_timer(rt, lease)
    await rt.cancel(lease.work_id)
    assert (await retry_timer(rt, lease)).state is TimerState.CANCELLED
    work = await rt.work(lease.work_id)
    assert (work.state, work.retry) == (WorkState.CANCELLED, None)
    clock.set(timer.fire_at_ms)
    assert (await rt.poll()).firings == ()


@pytest.mark.parametrize(
    ("hint", "wait_ms"),
    [({"retry_after_ms": 10 * MINUTE}, 12 * MINUTE), ({"rate_limited": True}, 30 * MINUTE)],
    ids=["known-reset", "rate-limited"],
)
async def test_standing_work_honours_its_executors_retry_hint_and_spends_no_budget(
    loom_store: str, clock: ManualClock, hint: dict[str, Any], wait_ms: int
) -> None:
    """A busy or rate-limited job asks to be tried again: standing Work honours the hint, with no
    failure budget (docs/recovery.md). Catches: a hint ignored on standing Work (no timer: the job
    waits for its next input, however far off), a hint that counts a failure (the budget would run out
    and hold the Work), and input during the backoff starting the attempt early."""
    async with open_runtime(
        loom_store, clock=clock, config=config(standing=True), actors=(), load_entry_points=False
    ) as rt:
        lease = await started(rt)
        for attempt in (1, 2, 3, 4):  # more than any budget: a standing Work spends none
            assert lease.attempt == attempt
            await fail(rt, lease, **hint)
            work = await rt.work(lease.work_id)
            assert (work.retry, work.failures, work.held) == (RetryState.BACKOFF, 0, False)
            timer = await retry_timer(rt, lease)
            assert timer.fire_at_ms == clock.now_ms() + wait_ms
            early = EventIn(source="t", delivery_id=f"early-{attempt}", type="r.start", scope=SCOPE, key="a")
            await rt.publish(early)
            clock.advance(wait_ms - 1)
            await rt.poll()
            with pytest.raises(Conflict):
                await rt.claim(lease.work_id, owner="host")
            clock.advance(1)
            await rt.poll()
            lease = await rt.claim(lease.work_id, owner="host")
            assert lease.request.trigger.type == "core.retry.due" or any(
                e.type == "core.retry.due" for e in lease.request.inputs
            )
        assert not await rt.diagnostics(kind="retry_exhausted")


async def test_idle_standing_work_without_input_cannot_be_claimed(
    loom_store: str, clock: ManualClock
) -> None:
    """An attempt starts only with pending input. Catches: a claim of ready standing Work with nothing
    pending (an attempt with no input and no trigger would start)."""
    async with open_runtime(
        loom_store, clock=clock, config=config(standing=True), actors=(), load_entry_points=False
    ) as rt:
        lease = await started(rt)
        await rt.complete(lease, Completed())
        assert (await rt.work(lease.work_id)).state is WorkState.READY
        with pytest.raises(Conflict, match="no pending input"):
            await rt.claim(lease.work_id, owner="host")


@pytest.mark.parametrize(
    "kind",
    [
        KindPolicy(),
        KindPolicy(standing=True, retry_backoff_ms=(5, 10), fail_on_exhaustion=True),
        KindPolicy(retry_backoff_ms=()),
    ],
)
def test_the_retry_policy_pinned_at_a_claim_reads_back_as_the_kind(kind: KindPolicy) -> None:
    """The text a claim pins on its attempt (made once per policy) reads back as the policy it was
    made of, and as `pin_retry` writes it. Catches: a cached text shared by policies that differ (the
    attempt retried under another kind's budget)."""
    text = pinned_retry_text(kind)
    assert text == json.dumps(pin_retry(kind))
    again = pinned_retry(json.loads(text))
    assert (again.standing, again.retry_backoff_ms, again.fail_on_exhaustion) == (
        kind.standing,
        kind.retry_backoff_ms,
        kind.fail_on_exhaustion,
    )


async def test_a_failure_marked_final_arms_no_retry_and_holds_the_work_at_once(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches `Failed(retryable=False)` spending the budget as any failure would (three attempts over
    fifteen minutes for a failure that can only happen again), a hint honoured against it, and a hold
    no requested retry lifts."""
    lease = await started(rt)
    await fail(rt, lease, retryable=False, retry_after_ms=MINUTE)
    work = await rt.work(lease.work_id)
    assert (work.state, work.retry, work.held) == (WorkState.READY, RetryState.EXHAUSTED, True)
    assert work.hold_reason is not None
    assert work.hold_reason.startswith("no automatic retry after a failure its executor marked final")
    assert await rt.timers(state=TimerState.ARMED) == []
    execution = await rt.execution(lease.execution_id)
    assert execution.outcome is not None
    assert execution.outcome["retryable"] is False
    await rt.retry(lease.work_id, reason="the record is there now")
    await rt.poll()
    again = await rt.claim(lease.work_id, owner="host")
    assert again.attempt == 2


async def test_a_final_failure_fails_a_work_whose_kind_fails_on_exhaustion(
    loom_store: str, clock: ManualClock
) -> None:
    cfg = config(retry_attempts=5, fail_on_exhaustion=True)
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        lease = await started(rt)
        await fail(rt, lease, retryable=False)
        work = await rt.work(lease.work_id)
        assert (work.state, work.retry, work.failures) == (WorkState.FAILED, RetryState.EXHAUSTED, 1)


@pytest.mark.parametrize("bad", [None, 0, "no"])
async def test_a_retryable_flag_that_is_not_a_boolean_is_refused(rt: Runtime, bad: object) -> None:
    lease = await started(rt)
    with pytest.raises(InvalidRequest, match="retryable must be true or false"):
        await fail(rt, lease, retryable=bad)
    assert (await rt.execution(lease.execution_id)).state is ExecutionState.RUNNING
