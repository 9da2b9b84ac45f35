"""Firing rules of durable timers (docs/concepts.md, "Timers"): a timer never fires before its instant,
a firing's delivery identity is its own, and a firing that raises retires only the identity it was
asked to fire. A host drives the runtime by hand (``actors=()``): firing happens only when the test
calls `Runtime.fire` or submits the firing procedure itself, so each answer arrives exactly when the
test says. Each test names the rule and the wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

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
