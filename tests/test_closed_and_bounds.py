"""The embedded API at its edges: calls on a closed runtime, the test clock's range, arguments of the
wrong shape, and a reload that shortens the compaction interval (docs/testing.md, docs/configuration.md
"[compaction]"). Each refusal is a `LoomError` that names what is wrong; none waits for ever."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import loom
from loom.records.validation import MAX_TIME_MS
from loom.testing import T0_MS, ManualClock
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, CrashAt

DEADLINE_S = 10


async def test_a_watch_opened_on_a_closed_runtime_is_refused() -> None:
    """Catches a watch that waits for ever for a commit a closed runtime never makes (seen: blocked
    with no error and no end)."""
    async with loom.open_runtime(":memory:", actors=()) as rt:
        pass

    async def watch() -> None:
        async with rt.watch() as notices:
            async for _ in notices:
                pass

    with trio.fail_after(DEADLINE_S), pytest.raises(loom.StorageClosed):
        await watch()


async def test_a_reload_on_a_closed_runtime_is_refused() -> None:
    """Catches a reload a closed runtime accepts, answering a generation that rules nothing."""
    async with loom.open_runtime(":memory:", actors=()) as rt:
        pass
    with pytest.raises(loom.StorageClosed):
        rt.reload(loom.Config())


@pytest.mark.parametrize(
    "move",
    [
        lambda clock: clock.set(MAX_TIME_MS + 1),
        lambda clock: clock.advance(10**30),
        lambda clock: ManualClock(start_ms=MAX_TIME_MS + 1),
    ],
    ids=["set", "advance", "start"],
)
def test_the_manual_clock_stops_at_the_last_instant_loom_keeps(move: object) -> None:
    """Catches a clock moved past the year 9999: the next commit raised `OverflowError` from the
    database driver and the runtime stopped with it."""
    clock = ManualClock(start_ms=T0_MS)
    with pytest.raises(loom.InvalidRequest, match="year 9999"):
        move(clock)  # type: ignore[operator]
    assert clock.now_ms() == T0_MS
    assert clock.set(MAX_TIME_MS) == MAX_TIME_MS  # the last instant itself is kept


async def test_actors_given_as_one_string_are_refused_naming_it() -> None:
    """Catches ``actors="timers"`` read letter by letter ("unknown actor 't'")."""
    with pytest.raises(loom.InvalidRequest, match="got the string 'timers'"):
        async with loom.open_runtime(":memory:", actors="timers"):
            pass


@pytest.mark.parametrize(
    ("args", "says"),
    [(("sideways", 1), "boundary"), ((BEFORE_COMMIT, 0), "batch"), ((AFTER_COMMIT, "x"), "batch")],
)
def test_a_crash_point_that_could_never_fire_as_meant_is_refused(
    args: tuple[object, object], says: str
) -> None:
    """Catches a crash point with an unknown boundary (it never fires: the test that set it passes
    without its crash), and a batch that is not a whole number from 1 (0 crashed at batch 1)."""
    with pytest.raises(loom.InvalidRequest, match=f"CrashAt {says}"):
        CrashAt(*args)  # type: ignore[arg-type]


async def test_a_reload_that_shortens_the_compaction_interval_takes_effect_at_once() -> None:
    """Catches a compaction actor that goes on sleeping the old ``[compaction] every`` (seen: an
    Event past its retention stayed for the hour the old interval said)."""

    def config(every: str) -> loom.Config:
        return loom.Config.from_dict({
            "retention": {"events": "1s"},
            "compaction": {"every": every},
            "scopes": {"s": {"routes": [{"name": "r", "types": ["a"], "policy": "drop"}]}},
        })  # fmt: skip

    clock = ManualClock(start_ms=T0_MS)
    async with loom.open_runtime(":memory:", config=config("1h"), clock=clock) as rt:
        event = await rt.publish(loom.EventIn(source="x", delivery_id="1", type="a", scope="s"))
        await rt.wait_idle()
        rt.reload(config("1s"))
        clock.advance(2_000)  # past the Event's retention and the new interval, not the old one
        await rt.wait_idle()
        with pytest.raises(loom.NotFound):
            await rt.event(event.id)


async def test_a_timer_for_a_work_that_does_not_exist_is_refused_when_armed() -> None:
    """Catches a timer armed for a Work id nothing has (a typo): it was accepted and went invalid
    only when it fired, while an Event naming the same id is refused at once."""
    async with loom.open_runtime(":memory:", actors=()) as rt:
        spec = loom.TimerSpec(
            id="t", fire_at_ms=T0_MS, source="x", type="a", scope="s", work_id="wk_neverexisted"
        )
        with pytest.raises(loom.InvalidRequest, match="names no existing work") as refused:
            await rt.arm(spec)
        assert refused.value.field == "work_id"
        assert await rt.timers() == []


async def test_a_driver_waits_on_a_plain_condition_as_on_an_async_one(loom_drivers: Any) -> None:
    """Catches ``driver.until`` refusing a plain function (``TypeError: object bool can't be used in
    'await' expression``, inside two exception groups)."""
    async with loom_drivers() as driver:
        seen: list[loom.Event] = []
        await driver.runtime.publish(loom.EventIn(source="x", delivery_id="1", type="a", scope="s"))

        async def read() -> bool:
            seen[:] = await driver.runtime.events()
            return bool(seen)

        await driver.until(read, "the Event")
        await driver.until(lambda: len(seen) == 1, "the Event, read")
