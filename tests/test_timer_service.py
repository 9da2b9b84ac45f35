"""The timer service on loom clocks (docs/architecture.md "Who owns which loop")."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from loom import InvalidRequest
from loom.actors.timer_service import TimerService
from loom.records.clock import ManualClock, OffsetClock


class Recorder:
    """A ``fire`` callback that records keys and (optionally) fails the first tries of some."""

    def __init__(self, clock: ManualClock | OffsetClock, failures: dict[str, int] | None = None) -> None:
        self.clock = clock
        self.fired: list[str] = []
        self.at: list[tuple[str, int]] = []
        self.failures = dict(failures or {})

    async def __call__(self, key: str) -> None:
        self.at.append((key, self.clock.now_ms()))
        if self.failures.get(key, 0) > 0:
            self.failures[key] -= 1
            raise OSError(f"disk full while firing {key}")
        self.fired.append(key)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=0)


@pytest.fixture
def recorder(clock: ManualClock) -> Recorder:
    return Recorder(clock)


@pytest.fixture
async def service(clock: ManualClock, recorder: Recorder) -> AsyncIterator[TimerService[str]]:
    async with trio.open_nursery() as nursery:
        svc: TimerService[str] = await nursery.start(TimerService[str](clock).run, recorder)
        yield svc
        nursery.cancel_scope.cancel()


async def settle() -> None:
    """Return once every task is blocked; a service that spins instead fails the test."""
    with trio.fail_after(5):
        await trio.testing.wait_all_tasks_blocked()


async def test_service_hand_example(
    clock: ManualClock, recorder: Recorder, service: TimerService[str]
) -> None:
    for key, at_ms in [("a", 5000), ("b", 3000), ("c", 8000), ("d", 3000), ("e", 1000)]:
        service.schedule(key, at_ms)
    await settle()
    assert recorder.fired == []
    assert len(service) == 5

    clock.set(3000)
    await settle()
    assert recorder.fired == ["e", "b", "d"]

    clock.set(4999)
    await settle()
    assert recorder.fired == ["e", "b", "d"]

    clock.set(8000)
    await settle()
    assert recorder.fired == ["e", "b", "d", "a", "c"]
    assert len(service) == 0

    clock.advance(60_000)
    await settle()
    assert recorder.fired == ["e", "b", "d", "a", "c"], "each timer fires once"


async def test_timer_due_at_exactly_now_fires_without_another_tick(
    clock: ManualClock, recorder: Recorder, service: TimerService[str]
) -> None:
    service.schedule("x", 1000)
    await settle()
    clock.set(1000)
    await settle()
    assert recorder.at == [("x", 1000)]


async def test_service_reschedule_and_cancel(
    clock: ManualClock, recorder: Recorder, service: TimerService[str]
) -> None:
    service.schedule("moved", 1000)
    service.schedule("moved", 5000)  # a re-arm moves the key: never two entries
    service.schedule("cancelled", 2000)
    service.schedule("kept", 3000)
    assert len(service) == 3
    assert service.deadline("moved") == 5000
    assert service.cancel("cancelled") is True
    assert service.cancel("cancelled") is False
    await settle()

    clock.set(4000)
    await settle()
    assert recorder.at == [("kept", 4000)]

    clock.set(10_000)
    await settle()
    assert recorder.at == [("kept", 4000), ("moved", 10_000)]

    service.schedule("past-due", 1)
    await settle()
    assert recorder.at[-1] == ("past-due", 10_000), "a past-due timer fires at once"
    assert recorder.fired.count("moved") == 1
    assert "cancelled" not in recorder.fired
    assert len(service) == 0


async def test_reschedule_earlier_wakes_the_sleeping_service(
    clock: ManualClock, recorder: Recorder, service: TimerService[str]
) -> None:
    service.schedule("k", 10_000)
    await settle()
    service.schedule("k", 2000)
    await settle()
    clock.set(2000)
    await settle()
    assert recorder.at == [("k", 2000)]


async def test_fire_rearmed_when_fire_fails(clock: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder(clock, failures={"flaky": 1})
    async with trio.open_nursery() as nursery:
        service: TimerService[str] = await nursery.start(
            TimerService[str](clock, retry_ms=1000).run, recorder
        )
        service.schedule("flaky", 500)
        service.schedule("fine", 700)
        await settle()

        with caplog.at_level(logging.ERROR, logger="loom.actors.timer_service"):
            clock.set(700)
            await settle()
        assert recorder.at == [("flaky", 700), ("fine", 700)]
        assert recorder.fired == ["fine"]
        assert service.deadline("flaky") == 1700, "re-armed retry_ms after the failure"
        assert "flaky" in caplog.text
        assert "disk full" in caplog.text

        clock.set(1699)
        await settle()
        assert recorder.fired == ["fine"]

        clock.set(1700)
        await settle()
        assert recorder.fired == ["fine", "flaky"]
        assert len(service) == 0

        clock.advance(10_000)
        await settle()
        assert recorder.fired == ["fine", "flaky"], "succeeds once, then stays disarmed"
        nursery.cancel_scope.cancel()


async def test_failed_fire_not_rearmed_when_cancelled_meanwhile(clock: ManualClock) -> None:
    service: TimerService[str] = TimerService(clock)

    async def fire(key: str) -> None:
        service.cancel(key)
        raise OSError("disk full")

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, fire)
        service.schedule("k", 0)
        await settle()
        assert len(service) == 0
        nursery.cancel_scope.cancel()


async def test_run_cancelled_mid_fire_keeps_the_key_armed(clock: ManualClock) -> None:
    service: TimerService[str] = TimerService(clock)
    started = trio.Event()

    async def fire(key: str) -> None:
        started.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, fire)
        service.schedule("k", 0)
        await started.wait()
        assert len(service) == 0, "a key is disarmed before its fire runs"
        nursery.cancel_scope.cancel()
    assert service.deadline("k") == 0


async def test_offset_clock_shift_wakes_service(clock: ManualClock) -> None:
    offset = OffsetClock(clock)
    recorder = Recorder(offset)
    async with trio.open_nursery() as nursery:
        service: TimerService[str] = await nursery.start(TimerService[str](offset).run, recorder)
        offset.on_shift(service.wake)
        service.schedule("soon", 30_000)
        service.schedule("later", 120_000)
        await settle()

        offset.shift(60_000)
        await settle()
        assert recorder.at == [("soon", 60_000)]

        offset.shift(59_999)
        await settle()
        assert recorder.at == [("soon", 60_000)], "a timer not yet due waits"

        offset.shift(1)
        await settle()
        assert recorder.at == [("soon", 60_000), ("later", 120_000)]
        assert offset.offset_ms == 120_000
        nursery.cancel_scope.cancel()


async def test_manual_clock_on_change_wake_is_harmless(clock: ManualClock, recorder: Recorder) -> None:
    async with trio.open_nursery() as nursery:
        service: TimerService[str] = await nursery.start(TimerService[str](clock).run, recorder)
        clock.on_change(service.wake)
        service.schedule("k", 100)
        clock.set(50)
        await settle()
        clock.set(100)
        await settle()
        assert recorder.fired == ["k"]
        nursery.cancel_scope.cancel()


class JumpingClock:
    """A clock whose sleeps do not notice jumps (like a wall clock stepped by the OS)."""

    def __init__(self) -> None:
        self.now = 0

    def now_ms(self) -> int:
        return self.now

    async def sleep_until(self, deadline_ms: int) -> None:
        await trio.sleep_forever()


async def test_wake_rechecks_the_clock() -> None:
    clock = JumpingClock()
    fired: list[str] = []

    async def fire(key: str) -> None:
        fired.append(key)

    async with trio.open_nursery() as nursery:
        service: TimerService[str] = await nursery.start(TimerService[str](clock).run, fire)
        service.schedule("k", 1000)
        await settle()
        clock.now = 5000
        await settle()
        assert fired == []
        service.wake()
        await settle()
        assert fired == ["k"]
        nursery.cancel_scope.cancel()


async def test_a_second_run_loop_is_refused(service: TimerService[str], recorder: Recorder) -> None:
    with pytest.raises(RuntimeError, match="already running"):
        await service.run(recorder)


def test_retry_ms_must_be_positive(clock: ManualClock) -> None:
    with pytest.raises(InvalidRequest, match="retry_ms"):
        TimerService[str](clock, retry_ms=0)
