"""Trusted time (docs/concepts.md "Time", docs/testing.md "Clocks"): ManualClock, OffsetClock, SystemClock."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from loom import Clock, InvalidRequest, ManualClock, OffsetClock, SystemClock
from loom.testing import T0_MS

T0 = T0_MS


async def finishes_without_waiting(fn: Callable[[], Awaitable[None]]) -> bool:
    """Run ``fn`` in a task; say whether it finished once every task is blocked (no time passes)."""
    done = False

    async def run() -> None:
        nonlocal done
        await fn()
        done = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return done


class Sleepers:
    """Tasks asleep on a clock, recording which deadlines woke."""

    def __init__(self, clock: Clock, nursery: trio.Nursery) -> None:
        self.clock = clock
        self.nursery = nursery
        self.woken: list[int] = []

    def sleep(self, deadline_ms: int) -> None:
        async def sleeper() -> None:
            await self.clock.sleep_until(deadline_ms)
            self.woken.append(deadline_ms)

        self.nursery.start_soon(sleeper)


# -- every clock ----------------------------------------------------------


def test_every_clock_satisfies_the_clock_protocol() -> None:
    for clock in (SystemClock(), ManualClock(start_ms=T0), OffsetClock(ManualClock(start_ms=T0))):
        assert isinstance(clock, Clock)


# -- ManualClock ----------------------------------------------------------


def test_manual_clock_starts_where_told_and_moves_only_when_told() -> None:
    clock = ManualClock(start_ms=T0)
    assert clock.now_ms() == T0
    assert clock.now_ms() == T0
    assert clock.advance(1_500) == T0 + 1_500
    assert clock.now_ms() == T0 + 1_500
    assert clock.set(T0 + 60_000) == T0 + 60_000
    assert clock.now_ms() == T0 + 60_000


def test_manual_clock_accepts_standing_still() -> None:
    clock = ManualClock(start_ms=T0)
    assert clock.advance(0) == T0
    assert clock.set(T0) == T0


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_manual_clock_refuses_a_start_that_is_not_a_non_negative_integer(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="start_ms"):
        ManualClock(start_ms=bad)  # type: ignore[arg-type]


def test_manual_clock_advance_never_moves_backwards() -> None:
    clock = ManualClock(start_ms=T0)
    with pytest.raises(InvalidRequest, match="backwards"):
        clock.advance(-1)
    assert clock.now_ms() == T0


def test_manual_clock_set_never_moves_backwards() -> None:
    clock = ManualClock(start_ms=T0)
    clock.advance(10)
    with pytest.raises(InvalidRequest, match="backwards"):
        clock.set(T0)
    assert clock.now_ms() == T0 + 10


@pytest.mark.parametrize("bad", [1.5, True, "10", None])
def test_manual_clock_refuses_non_integer_moves(bad: object) -> None:
    clock = ManualClock(start_ms=T0)
    with pytest.raises(InvalidRequest, match="integer"):
        clock.advance(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="integer"):
        clock.set(bad)  # type: ignore[arg-type]
    assert clock.now_ms() == T0
    assert type(clock.now_ms()) is int


async def test_manual_clock_wakes_the_sleepers_whose_deadline_came_and_only_those(
    nursery: trio.Nursery,
) -> None:
    clock = ManualClock(start_ms=T0)
    sleepers = Sleepers(clock, nursery)
    for offset in (300, 100, 200, 400):
        sleepers.sleep(T0 + offset)
    await wait_all_tasks_blocked()
    assert sleepers.woken == []
    assert clock.sleepers == 4

    clock.advance(99)
    await wait_all_tasks_blocked()
    assert sleepers.woken == []

    clock.advance(101)  # T0 + 200: the 100 and 200 deadlines came (200 exactly on time)
    await wait_all_tasks_blocked()
    assert sorted(sleepers.woken) == [T0 + 100, T0 + 200]
    assert clock.sleepers == 2

    clock.set(T0 + 10_000)
    await wait_all_tasks_blocked()
    assert sorted(sleepers.woken) == [T0 + 100, T0 + 200, T0 + 300, T0 + 400]
    assert clock.sleepers == 0


async def test_manual_clock_sleep_until_now_or_the_past_returns_at_once() -> None:
    clock = ManualClock(start_ms=T0)
    assert await finishes_without_waiting(lambda: clock.sleep_until(T0))
    assert await finishes_without_waiting(lambda: clock.sleep_until(T0 - 60_000))
    assert not await finishes_without_waiting(lambda: clock.sleep_until(T0 + 1))


async def test_manual_clock_forgets_a_cancelled_sleeper() -> None:
    clock = ManualClock(start_ms=T0)
    assert not await finishes_without_waiting(lambda: clock.sleep_until(T0 + 1_000))
    assert clock.sleepers == 0


def test_manual_clock_runs_change_callbacks_after_each_move() -> None:
    clock = ManualClock(start_ms=T0)
    seen: list[int] = []
    clock.on_change(lambda: seen.append(clock.now_ms()))
    clock.advance(5)
    clock.set(T0 + 50)
    assert seen == [T0 + 5, T0 + 50]


# -- OffsetClock ----------------------------------------------------------


def test_offset_clock_reads_its_base_plus_the_offset() -> None:
    base = ManualClock(start_ms=T0)
    clock = OffsetClock(base)
    assert clock.now_ms() == T0
    assert clock.shift(3_600_000) == 3_600_000
    assert clock.shift(1) == 3_600_001
    assert clock.offset_ms == 3_600_001
    base.advance(10)
    assert clock.now_ms() == T0 + 10 + 3_600_001


@pytest.mark.parametrize("bad", [-1, -3_600_000, 1.5, True, "10", None])
def test_offset_clock_shifts_only_forward_by_whole_milliseconds(bad: object) -> None:
    clock = OffsetClock(ManualClock(start_ms=T0))
    clock.shift(1_000)
    with pytest.raises(InvalidRequest, match="offset_ms"):
        clock.shift(bad)  # type: ignore[arg-type]
    assert clock.offset_ms == 1_000
    assert clock.now_ms() == T0 + 1_000


def test_offset_clock_runs_shift_callbacks_after_the_offset_applies() -> None:
    clock = OffsetClock(ManualClock(start_ms=T0))
    seen: list[tuple[str, int]] = []
    clock.on_shift(lambda: seen.append(("first", clock.now_ms())))
    clock.on_shift(lambda: seen.append(("second", clock.now_ms())))
    clock.shift(60_000)
    assert seen == [("first", T0 + 60_000), ("second", T0 + 60_000)]
    with pytest.raises(InvalidRequest):
        clock.shift(-1)
    assert len(seen) == 2, "a refused shift runs no callback"


def test_offset_clock_defaults_to_the_wall_clock() -> None:
    before = time.time_ns() // 1_000_000
    now = OffsetClock().now_ms()
    after = time.time_ns() // 1_000_000
    assert before <= now <= after


async def test_offset_clock_shift_past_a_deadline_wakes_the_sleeper_at_once(nursery: trio.Nursery) -> None:
    # The base is a ManualClock that never moves here, so only a shift can wake the
    # sleeper before its (one hour, real time) fallback timeout.
    clock = OffsetClock(ManualClock(start_ms=T0))
    sleepers = Sleepers(clock, nursery)
    sleepers.sleep(T0 + 3_600_000)
    await wait_all_tasks_blocked()
    assert sleepers.woken == []

    clock.shift(1_800_000)  # halfway: the sleeper checks and sleeps on
    await wait_all_tasks_blocked()
    assert sleepers.woken == []

    clock.shift(1_800_000)  # exactly at the deadline
    await wait_all_tasks_blocked()
    assert sleepers.woken == [T0 + 3_600_000]


async def test_offset_clock_sleep_until_the_past_returns_at_once() -> None:
    clock = OffsetClock(ManualClock(start_ms=T0))
    clock.shift(10_000)
    assert await finishes_without_waiting(lambda: clock.sleep_until(T0 + 10_000))
    assert await finishes_without_waiting(lambda: clock.sleep_until(T0))
    assert not await finishes_without_waiting(lambda: clock.sleep_until(T0 + 10_001))


# -- SystemClock ----------------------------------------------------------


def test_system_clock_reads_the_wall_clock_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_767_225_600_123_456_789)
    assert SystemClock().now_ms() == 1_767_225_600_123


def test_system_clock_never_goes_backwards(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([T0 + 5_000, T0 + 4_000, T0 + 4_999, T0 + 5_000, T0 + 6_000, T0 + 1])
    monkeypatch.setattr(time, "time_ns", lambda: next(readings) * 1_000_000)
    clock = SystemClock()
    assert [clock.now_ms() for _ in range(6)] == [T0 + 5_000] * 4 + [T0 + 6_000, T0 + 6_000]


async def test_system_clock_sleep_until_the_past_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: T0 * 1_000_000)
    clock = SystemClock()
    assert await finishes_without_waiting(lambda: clock.sleep_until(T0))
    assert await finishes_without_waiting(lambda: clock.sleep_until(T0 - 1))
    assert not await finishes_without_waiting(lambda: clock.sleep_until(T0 + 60_000))


async def test_system_clock_sleep_until_ends_at_the_deadline_not_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A timer due at a millisecond fires at that millisecond. Wrong implementation caught: a sleep of
    the whole milliseconds between `now_ms` and the deadline, which ends as much later as the part of
    a millisecond already gone when it began (0.4 ms here; up to 1 ms of lateness for every timer)."""
    now_ns = [T0 * 1_000_000 + 400_000]  # 0.4 ms into millisecond T0
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)
        now_ns[0] += round(seconds * 1e9)

    monkeypatch.setattr(time, "time_ns", lambda: now_ns[0])
    monkeypatch.setattr(trio, "sleep", fake_sleep)
    await SystemClock().sleep_until(T0 + 10)
    assert now_ns[0] == (T0 + 10) * 1_000_000, f"woke {(now_ns[0] - (T0 + 10) * 1_000_000) / 1e6} ms late"
    assert slept == [pytest.approx(0.0096)]


async def test_an_offset_clock_sleeper_wakes_when_its_base_clock_reaches_the_deadline() -> None:
    base = ManualClock(start_ms=T0)
    clock = OffsetClock(base)
    clock.shift(1_000)
    woke = trio.Event()

    async def sleeper() -> None:
        await clock.sleep_until(T0 + 5_000)
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sleeper)
        await trio.testing.wait_all_tasks_blocked()
        base.advance(3_999)  # offset time T0 + 4_999: not yet
        await trio.testing.wait_all_tasks_blocked()
        assert not woke.is_set()
        base.advance(1)  # offset time T0 + 5_000: due
        await trio.testing.wait_all_tasks_blocked()
        assert woke.is_set()
