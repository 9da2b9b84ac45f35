"""Rules of waits and their continuations (docs/concepts.md, "Wait"): which Event a wake takes and how
the routing history records it, how far a wait may look, how a wait the causal limits blocked is
released, which authority each later attempt runs under, and what a turn that ends on a wait does to
the retry budget. A host drives the runtime by hand (``actors=()``): it claims the attempts and routes
with `Runtime.poll`, so each step happens exactly when the test says. Each test names the rule and the
wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from loom import (
    CheckpointStatus,
    Completed,
    Config,
    Conflict,
    Event,
    EventIn,
    Failed,
    Lease,
    ManualClock,
    Runtime,
    Waiting,
    WaitSpec,
    WaitState,
    WorkState,
    open_runtime,
)
from loom.plugins.handlers import work_id_for_key
from loom.records.work import RetryState

SCOPE = "acme"
SECOND = 1_000
MINUTE = 60 * SECOND
WORK = work_id_for_key(SCOPE, "k")


def config(causal: dict[str, int], *, standing: bool = True) -> Config:
    """Work on key ``k`` (standing: a completed turn leaves it ready for the next Event's turn); only
    ``w.*`` Events have a route."""
    route = {"name": "w", "types": ["w.*"], "create_work": True, "work_kind": "job"}
    return Config.from_dict(
        {
            "causal": causal,
            "work_kinds": {"job": {"standing": standing}},
            "scopes": {SCOPE: {"routes": [route]}},
        }
    )


@pytest.fixture
def causal() -> dict[str, int]:
    return {}


@pytest.fixture
def standing() -> bool:
    return True


@pytest.fixture
async def rt(
    loom_store: str, clock: ManualClock, causal: dict[str, int], standing: bool
) -> AsyncIterator[Runtime]:
    cfg = config(causal, standing=standing)
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        yield rt


def ev(delivery_id: str, type: str = "w.note", *, key: str = "k", **fields: Any) -> EventIn:
    return EventIn(source="t", delivery_id=delivery_id, type=type, scope=SCOPE, key=key, **fields)


async def publish(rt: Runtime, delivery_id: str, type: str = "w.note", **fields: Any) -> Event:
    event = await rt.publish(ev(delivery_id, type, **fields))
    await rt.poll()
    return event


async def claim(rt: Runtime) -> Lease:
    return await rt.claim(WORK, owner="host")


async def waiting(rt: Runtime, **spec: Any) -> Lease:
    """Work ``k``'s first attempt, ended on a wait for ``w.reply`` (or ``spec``)."""
    await publish(rt, "start", "w.start")
    lease = await claim(rt)
    await rt.complete(lease, Waiting(wait=WaitSpec(**{"types": ("w.reply",), **spec})))
    return lease


# -- the wake and its routing record ---------------------------------------------------------------


async def test_an_event_no_route_matches_that_wakes_a_wait_is_recorded_as_its_works_input(
    rt: Runtime,
) -> None:
    """A wait takes the first matching Event on its keys whatever the routes say, and that Event becomes
    the Work's input; its routing checkpoint says so (routed to the Work), never ``unmatched``. An Event
    no route matches and the wait does not take stays unmatched. Catches: a checkpoint written from the
    routes alone (the history would call the Event that woke the Work input it never saw)."""
    await waiting(rt, types=("x.reply",))
    stray = await publish(rt, "stray", "x.other")
    reply = await publish(rt, "reply", "x.reply")
    [wait] = await rt.waits(WORK)
    assert (wait.state, wait.winner_event_id) == (WaitState.WOKEN, reply.id)
    checkpoint = await rt.checkpoint(reply.id)
    assert checkpoint is not None
    assert (checkpoint.status, checkpoint.work_id) == (CheckpointStatus.ROUTED, WORK)
    assert wait.id in (checkpoint.reason or "")
    assert (await rt.checkpoint(stray.id)).status is CheckpointStatus.UNMATCHED  # type: ignore[union-attr]
    assert reply.id in [c.event_id for c in (await rt.history(WORK)).checkpoints]
    continuation = await claim(rt)
    assert continuation.request.trigger is not None
    assert continuation.request.trigger.id == reply.id


async def test_a_continuation_takes_its_inputs_in_acceptance_order(rt: Runtime) -> None:
    """An Event accepted for the Work before the wait's winner, still unrouted when the wait registers
    (another lane is behind), is the continuation's input before the winner, never after it: the wake
    is decided at once from accepted history, and the continuation starts once routing has caught up.
    Catches: a continuation started with the winner alone (it would take the earlier Event in a later
    turn, out of acceptance order)."""
    await publish(rt, "start", "w.start")
    lease = await claim(rt)
    earlier = await rt.publish(ev("earlier", "w.note", key="k2", work_id=WORK))  # its own lane, unrouted
    winner = await rt.publish(ev("winner", "w.reply"))  # on the wait's key, unrouted too
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("w.reply",))))
    (wait,) = await rt.waits(WORK)
    assert (wait.state, wait.winner_event_id) == (WaitState.WOKEN, winner.id), "history wakes it at once"
    with pytest.raises(Conflict, match=f"waits until event {earlier.id}"):
        await claim(rt)
    assert await rt.admit(owner="host") == [], "nor does the admission pass start it"
    await rt.poll()  # routes both, in acceptance order
    (continuation,) = await rt.admit(owner="host")
    assert [e.id for e in continuation.request.inputs] == [earlier.id, winner.id]
    assert continuation.request.trigger is not None
    assert continuation.request.trigger.id == winner.id


async def test_a_wake_is_taken_by_exactly_one_continuation(rt: Runtime) -> None:
    """The wake's bridge is the causal authority of the one continuation that takes it; a later attempt,
    started by a fresh outside Event, runs under that Event (docs/concepts.md, "Causal bounds": a wake
    on independent input is charged to that input's root). Catches: a claim that leaves the wake
    untaken (every later attempt would run on the old wake's chain, and be charged to its root)."""
    await waiting(rt)
    reply = await publish(rt, "reply", "w.reply")
    [wait] = await rt.waits(WORK)
    continuation = await claim(rt)
    assert (await rt.execution(continuation.execution_id)).authority_id == wait.bridge_event_id
    await rt.complete(continuation, Completed())
    fresh = await publish(rt, "fresh", "w.next")
    later = await claim(rt)
    assert later.request.trigger is not None
    assert later.request.trigger.id == fresh.id
    execution = await rt.execution(later.execution_id)
    assert execution.authority_id == fresh.id, "the old wake's bridge is taken once"
    assert reply.id not in [e.id for e in later.request.inputs]


async def test_a_wait_may_not_look_past_accepted_history_by_even_one(rt: Runtime) -> None:
    """A wait's ``after_seq`` is a watermark in accepted history: the last accepted sequence is the
    furthest it may name, one more is refused (`Conflict`: it depends on history now) and changes nothing. Catches a bound
    off by one (a wait past history would miss the next Event accepted, the one it should see)."""
    await publish(rt, "start", "w.start")
    lease = await claim(rt)
    last = (await rt.events(limit=1000))[-1].seq
    beyond = Waiting(wait=WaitSpec(types=("w.reply",), after_seq=last + 1))
    with pytest.raises(Conflict, match=rf"after_seq {last + 1} is beyond accepted history"):
        await rt.complete(lease, beyond)
    assert await rt.waits(WORK) == []
    assert (await rt.work(WORK)).state is WorkState.RUNNING, "the refused outcome changed nothing"
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("w.reply",), after_seq=last)))
    reply = await publish(rt, "reply", "w.reply")
    [wait] = await rt.waits(WORK)
    assert (wait.after_seq, wait.winner_event_id) == (last, reply.id)


# -- a wait blocked by its refused timeout --------------------------------------------------------------


@pytest.mark.parametrize("causal", [{"per_minute": 2}])
async def test_a_wait_blocked_by_its_refused_timeout_names_the_figures_and_is_released(
    rt: Runtime, clock: ManualClock
) -> None:
    """The causal limits refuse a wait's timeout (its root spent its per-minute budget): the wait is
    blocked and the Work held with a reason that names the limit, the count observed against it and
    the window. Releasing the hold rearms the timeout as the operator's own input (derived from the
    release), so it fires and wakes the wait. Catches: a reason without the figures (an operator cannot
    tell which limit to raise), and a release that rearms the timeout on the refused chain (refused
    again at once: the Work is held again and can never be released)."""
    root = await rt.publish(ev("root", "x.root", key="elsewhere"))
    await rt.publish_derived(ev("start", "w.start"), parent_id=root.id)  # the root's 1st derived Event
    await rt.poll()
    lease = await claim(rt)
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("w.reply",), timeout_ms=10 * SECOND)))
    await rt.publish_derived(ev("sibling", "x.other", key="elsewhere"), parent_id=root.id)  # its 2nd
    clock.advance(10 * SECOND)  # the same UTC minute: the timeout would be the root's 3rd
    await rt.poll()
    [wait] = await rt.waits(WORK)
    assert wait.state is WaitState.BLOCKED
    work = await rt.work(WORK)
    assert work.held
    reason = work.hold_reason or ""
    minute = clock.now_ms() // MINUTE
    for figure in ("refused its timeout", f"root {root.id} already accepted 2 derived events",
                   f"UTC minute {minute} (2026-01-01T00:00Z", "at its limit of 2 per minute (rate_limit)"):  # fmt: skip
        assert figure in reason, f"{figure!r} not in {reason!r}"

    release = await rt.release(WORK)
    assert not release.held
    await rt.poll()  # the timeout, rearmed at the release, fires now
    [wait] = await rt.waits(WORK)
    assert wait.state is WaitState.WOKEN, wait.reason
    work = await rt.work(WORK)
    assert not work.held, work.hold_reason
    timeout = await rt.event(wait.winner_event_id or "")
    assert timeout.type == "core.wait.timeout"
    released = [e for e in await rt.events(limit=1000) if e.type == "core.work.released"]
    assert [timeout.root_id] == [e.id for e in released], "the rearmed timeout is the release's own"
    continuation = await claim(rt)
    assert continuation.request.trigger is not None
    assert continuation.request.trigger.id == timeout.id


@pytest.mark.parametrize("causal", [{"max_depth": 2}])
async def test_a_wait_timeout_refused_at_the_depth_limit_names_it_and_is_released(
    rt: Runtime, clock: ManualClock
) -> None:
    """The same for the depth limit: the reason names the depth the timeout would reach and the limit,
    and the release lets the timeout fire on a shallow chain of its own. Catches what the rate test
    catches, for a chain at its depth limit (no minute passing would ever unblock it)."""
    root = await rt.publish(ev("root", "x.root", key="elsewhere"))
    middle = await rt.publish_derived(ev("middle", "x.mid", key="elsewhere"), parent_id=root.id)
    await rt.publish_derived(ev("start", "w.start"), parent_id=middle.id)  # the trigger: depth 2
    await rt.poll()
    lease = await claim(rt)
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("w.reply",), timeout_ms=10 * SECOND)))
    clock.advance(10 * SECOND)
    await rt.poll()
    work = await rt.work(WORK)
    assert work.held
    assert "its chain would reach depth 3, over the limit of 2" in (work.hold_reason or "")
    await rt.release(WORK)
    await rt.poll()
    [wait] = await rt.waits(WORK)
    assert wait.state is WaitState.WOKEN, wait.reason
    assert not (await rt.work(WORK)).held


# -- the retry budget counts consecutive failed turns ----------------------------------------------------


@pytest.mark.parametrize("standing", [False])  # standing Work arms no automatic retry
async def test_a_turn_that_ends_on_a_wait_resets_the_failure_count(rt: Runtime, clock: ManualClock) -> None:
    """Retry bounds consecutive failures (docs/recovery.md, "Retry"): a turn that ends on its wait
    succeeded, so the failures before it no longer count. Here failed, waited, failed, failed: the
    last failure is the second in a row, and the default budget of three still retries it. Catches a
    wait that leaves the count as it was (failures days apart would exhaust the budget and hold the
    Work)."""
    await publish(rt, "start", "w.start")
    await rt.complete(await claim(rt), Failed(error="first"))
    assert (await rt.work(WORK)).failures == 1
    clock.advance(5 * MINUTE)
    await rt.poll()  # the retry is due
    await rt.complete(await claim(rt), Waiting(wait=WaitSpec(types=("w.reply",))))
    assert (await rt.work(WORK)).failures == 0, "a turn ended on its wait is no failure"
    await publish(rt, "reply", "w.reply")
    await rt.complete(await claim(rt), Failed(error="days later"))
    clock.advance(5 * MINUTE)
    await rt.poll()
    await rt.complete(await claim(rt), Failed(error="again"))
    work = await rt.work(WORK)
    assert (work.failures, work.retry, work.held) == (2, RetryState.BACKOFF, False), work.hold_reason
