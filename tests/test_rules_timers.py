"""Firing rules of durable timers (docs/concepts.md, "Timers"): a timer never fires before its instant,
a firing's delivery identity is its own, and a firing that raises retires only the identity it was
asked to fire. A host drives the runtime by hand (``actors=()``): firing happens only when the test
calls `Runtime.fire` or submits the firing procedure itself, so each answer arrives exactly when the
test says. Each test names the rule and the wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

from loom import EventIn, FireRequest, FiringResult, ManualClock, Runtime, TimerSpec, TimerState, open_runtime
from loom.config import CausalLimits
from loom.kernel import firing as kernel_firing
from loom.kernel.firing import fire_timers_in_tx
from loom.records.timers import Firing
from loom.store import Tx
from loom.testing.internals import storage_of

SCOPE = "acme"
MINUTE = 60_000


def tick(timer_id: str, at_ms: int, **fields: Any) -> TimerSpec:
    return TimerSpec(id=timer_id, fire_at_ms=at_ms, source="clock", type="clock.tick", scope=SCOPE, **fields)


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    async with open_runtime(loom_store, clock=clock, actors=(), load_entry_points=False) as rt:
        yield rt


async def test_a_timer_is_not_due_a_millisecond_before_its_instant(rt: Runtime, clock: ManualClock) -> None:
    """A timer fires at its instant, never earlier: a firing request a millisecond early is not due
    and writes nothing. Catches a due check that tolerates a little earliness (``now < fire_at - 1``)."""
    at = clock.now_ms() + MINUTE
    await rt.arm(tick("t", at))
    request = FireRequest(timer_id="t", revision=1, fire_at_ms=at)
    clock.advance(MINUTE - 1)
    early = await rt.fire(request)
    assert (early.result, early.event_id) == (FiringResult.NOT_DUE, None)
    assert await rt.firings("t") == []
    assert (await rt.timer("t")).state is TimerState.ARMED
    clock.advance(1)
    assert (await rt.fire(request)).result is FiringResult.ACCEPTED


async def test_a_firing_whose_delivery_identity_a_publisher_took_retires_the_timer(
    rt: Runtime, clock: ManualClock
) -> None:
    """A firing's Event is its own: when its delivery identity already names another Event (here a
    publisher's), the timer is retired as invalid with a diagnostic, and the ledger points at no Event.
    Catches a firing that takes the duplicate answer as its own acceptance (the ledger would claim the
    publisher's Event, and the timer would count as fired)."""
    published = await rt.publish(EventIn(source="clock", delivery_id="d", type="clock.tick", scope=SCOPE))
    await rt.arm(tick("t", clock.now_ms(), delivery_id="d"))
    firing = await rt.fire(FireRequest(timer_id="t", revision=1, fire_at_ms=clock.now_ms()))
    assert (firing.result, firing.event_id) == (FiringResult.INVALID, None)
    assert f"already accepted as event {published.id}" in (firing.detail or "")
    timer = await rt.timer("t")
    assert (timer.state, timer.occurrences) == (TimerState.INVALID, 0)
    (diagnostic,) = await rt.diagnostics(kind="invalid_timer")
    assert diagnostic.subject == "t"
    assert [e.id for e in await rt.events(limit=100)] == [published.id]


async def test_a_stale_request_whose_firing_raised_leaves_the_current_revision_armed(
    rt: Runtime, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A firing that raises retires its timer only if the request still names the armed revision: a
    leftover request for an older revision must not retire the timer re-armed since. Catches a failure
    path that checks the timer is armed but not which revision the request named."""
    at = clock.now_ms()
    await rt.arm(tick("t", at))
    rearmed = await rt.arm(tick("t", at, payload={"v": 2}))
    assert rearmed.revision == 2

    def raising(tx: Tx, now_ms: int, request: FireRequest, *args: Any) -> Firing:
        raise RuntimeError("a broken timer kind")

    monkeypatch.setattr(kernel_firing, "fire_timer_in_tx", raising)
    stale = FireRequest(timer_id="t", revision=1, fire_at_ms=at)
    (answer,) = await storage_of(rt).submit(fire_timers_in_tx, [stale], CausalLimits(), {})
    assert answer == "RuntimeError: a broken timer kind"
    timer = await rt.timer("t")
    assert (timer.state, timer.revision) == (TimerState.ARMED, 2)
    assert await rt.diagnostics(kind="invalid_timer") == []
    monkeypatch.undo()
    fired = await rt.fire(FireRequest(timer_id="t", revision=2, fire_at_ms=at))
    assert fired.result is FiringResult.ACCEPTED


async def test_an_interval_timer_rearmed_with_its_delivery_id_after_it_fired_keeps_firing(
    rt: Runtime, clock: ManualClock
) -> None:
    """A recurring timer's occurrence is named by its delivery identity: re-arming the timer with the
    same explicit ``delivery_id`` after it fired must neither fire an occurrence twice nor lose the
    timer. Unchanged, the re-arm is a no-op (its next tick stays); changed (a new template), the new
    revision starts at the given tick, whose occurrence, already accepted, is skipped (the ledger
    names its Event), and it fires its next one. Catches: a firing that takes the earlier revision's
    Event for a foreign identity and retires the timer as invalid (a recurring timer silently never
    fires again)."""
    at = clock.now_ms()
    spec = tick("t", at, interval_ms=MINUTE, delivery_id="d")
    await rt.arm(spec)
    first = await rt.fire(FireRequest(timer_id="t", revision=1, fire_at_ms=at))
    assert first.result is FiringResult.ACCEPTED
    unchanged = await rt.arm(spec)
    assert (unchanged.revision, unchanged.fire_at_ms) == (1, at + MINUTE)
    rearmed = await rt.arm(attrs.evolve(spec, payload={"v": 2}))
    assert (rearmed.revision, rearmed.state, rearmed.fire_at_ms) == (2, TimerState.ARMED, at)
    again = await rt.fire(FireRequest(timer_id="t", revision=2, fire_at_ms=at))
    assert (again.result, again.event_id, again.next_fire_at_ms) == (FiringResult.SKIPPED, None, at + MINUTE)
    assert f"already accepted as event {first.event_id}" in (again.detail or "")
    clock.advance(MINUTE)
    nxt = await rt.fire(FireRequest(timer_id="t", revision=2, fire_at_ms=at + MINUTE))
    assert nxt.result is FiringResult.ACCEPTED
    ticks = [e for e in await rt.events(limit=100) if e.type == "clock.tick"]
    assert [e.delivery_id for e in ticks] == [f"d@{at}", f"d@{at + MINUTE}"]
    timer = await rt.timer("t")
    assert (timer.state, timer.fire_at_ms) == (TimerState.ARMED, at + 2 * MINUTE)
    assert await rt.diagnostics(kind="invalid_timer") == []


async def test_a_timers_firings_are_listed_in_commit_order(rt: Runtime, clock: ManualClock) -> None:
    """`Runtime.firings` lists the ledger in the order it was committed. Here revision 2 is armed for an
    instant before revision 1's and fired at the same clock reading after it. Catches: a ledger sorted
    by the clock and the firing instant (revision 2's firing would be listed first, as if it came
    before the one it followed)."""
    at = clock.now_ms()
    await rt.arm(tick("t", at + MINUTE))
    clock.advance(MINUTE)
    assert (await rt.fire(FireRequest(timer_id="t", revision=1, fire_at_ms=at + MINUTE))).result is (
        FiringResult.ACCEPTED
    )
    await rt.arm(tick("t", at))
    assert (
        await rt.fire(FireRequest(timer_id="t", revision=2, fire_at_ms=at))
    ).result is FiringResult.ACCEPTED
    assert [(f.revision, f.fire_at_ms) for f in await rt.firings("t")] == [(1, at + MINUTE), (2, at)]
