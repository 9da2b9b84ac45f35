"""Trusted time: integer Unix milliseconds from a `Clock`.

Nothing else in loom reads the wall clock. Kernel procedures receive ``now_ms`` as an
argument; actors sleep with ``await clock.sleep_until(ms)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs
import trio

from .errors import InvalidRequest
from .reprs import iso_utc
from .validation import MAX_TIME_MS, describe_value


@runtime_checkable
class Clock(Protocol):
    """What loom needs from time."""

    def now_ms(self) -> int:
        """Current trusted time in Unix milliseconds; never decreases."""
        ...

    async def sleep_until(self, deadline_ms: int) -> None:
        """Return once ``now_ms() >= deadline_ms`` (or at once if already so)."""
        ...


class SystemClock:
    """The wall clock, made monotonic: a backwards step of the OS clock is held flat."""

    def __init__(self) -> None:
        self._last = 0

    def now_ms(self) -> int:
        now = time.time_ns() // 1_000_000
        if now < self._last:
            return self._last
        self._last = now
        return now

    async def sleep_until(self, deadline_ms: int) -> None:
        """Return once `now_ms` reaches ``deadline_ms``: the sleep is measured from the nanosecond
        clock, so it ends at the deadline itself, not up to a millisecond after it (the whole
        milliseconds of `now_ms` are the deadline minus the part of a millisecond already gone)."""
        deadline_ns = deadline_ms * 1_000_000
        while True:
            if self.now_ms() >= deadline_ms:
                return
            await trio.sleep(max(deadline_ns - time.time_ns(), 0) / 1e9)


def iso_ms(ms: int) -> str:
    """Unix milliseconds as ISO 8601 UTC (``2026-01-01T00:00:00.000Z``), for messages: a pure
    function of ``ms`` (no clock is read); ``{ms} ms`` when no date can show it."""
    return iso_utc(ms) or f"{ms} ms"


def _check_whole_ms(what: str, ms: object) -> None:
    # Trusted time is integer milliseconds; a float or bool would leak into stored times.
    if not isinstance(ms, int) or isinstance(ms, bool):
        raise InvalidRequest(
            f"{what}: time must be an integer number of milliseconds, got {describe_value(ms)}"
        )


@attrs.define(eq=False)
class _Sleeper:
    deadline_ms: int
    event: trio.Event


class ManualClock:
    """A clock for tests: time moves only when told (``advance``/``set``), never backwards.

    Moving it wakes every sleeper whose deadline has come.
    """

    def __init__(self, start_ms: int = 0) -> None:
        _check_whole_ms("ManualClock start_ms", start_ms)
        if not 0 <= start_ms <= MAX_TIME_MS:
            raise InvalidRequest(
                f"ManualClock start_ms must be from 0 to {MAX_TIME_MS} (the year 9999), got {start_ms}"
            )
        self._now = start_ms
        self._sleepers: list[_Sleeper] = []
        self._on_change: list[Callable[[], None]] = []

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        """Move forward by ``ms`` (>= 0); return the new time."""
        _check_whole_ms("ManualClock.advance", ms)
        if ms < 0:
            raise InvalidRequest(f"ManualClock.advance: time never moves backwards (got {ms} ms)")
        return self.set(self._now + ms)

    def set(self, now_ms: int) -> int:
        """Move to ``now_ms``, which must not be earlier than now; return it."""
        _check_whole_ms("ManualClock.set", now_ms)
        if now_ms < self._now:
            raise InvalidRequest(
                f"ManualClock.set: time never moves backwards ({now_ms} is before {self._now})"
            )
        if now_ms > MAX_TIME_MS:
            raise InvalidRequest(
                f"ManualClock.set: {now_ms} is past the last instant loom keeps ({MAX_TIME_MS}, the"
                " year 9999)"
            )
        self._now = now_ms
        self._wake()
        for callback in list(self._on_change):
            callback()
        return now_ms

    def on_change(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` after every move (used like `OffsetClock.on_shift`)."""
        self._on_change.append(callback)

    def _wake(self) -> None:
        due = [s for s in self._sleepers if s.deadline_ms <= self._now]
        self._sleepers = [s for s in self._sleepers if s.deadline_ms > self._now]
        for sleeper in due:
            sleeper.event.set()

    async def sleep_until(self, deadline_ms: int) -> None:
        if deadline_ms <= self._now:
            await trio.lowlevel.checkpoint()
            return
        sleeper = _Sleeper(deadline_ms, trio.Event())
        self._sleepers.append(sleeper)
        try:
            await sleeper.event.wait()
        finally:
            if sleeper in self._sleepers:
                self._sleepers.remove(sleeper)

    @property
    def sleepers(self) -> int:
        """How many tasks are asleep on this clock (for tests that wait for quiescence)."""
        return len(self._sleepers)


class OffsetClock:
    """A base clock plus an offset that only grows (backs ``POST /debug/clock``).

    After each shift every ``on_shift`` callback runs, so a timer service can wake and
    fire what became due at once instead of at its old wall-clock instant.
    """

    def __init__(self, base: Clock | None = None) -> None:
        self._base: Clock = base if base is not None else SystemClock()
        self._offset = 0
        self._callbacks: list[Callable[[], None]] = []
        self._shifted = trio.Event()

    def now_ms(self) -> int:
        return self._base.now_ms() + self._offset

    @property
    def offset_ms(self) -> int:
        return self._offset

    def shift(self, ms: int) -> int:
        """Add ``ms`` (>= 0) to the offset; return the total offset."""
        if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
            raise InvalidRequest(
                f"OffsetClock.shift: offset_ms must be a non-negative integer, got {describe_value(ms)}"
            )
        self._offset += ms
        shifted, self._shifted = self._shifted, trio.Event()
        shifted.set()
        for callback in list(self._callbacks):
            callback()
        return self._offset

    def on_shift(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    async def sleep_until(self, deadline_ms: int) -> None:
        """Sleep on the base clock until the deadline, minus the offset; a shift re-aims it at once."""
        while self.now_ms() < deadline_ms:
            shifted = self._shifted
            async with trio.open_nursery() as nursery:

                async def base_sleep() -> None:
                    await self._base.sleep_until(deadline_ms - self._offset)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(base_sleep)
                await shifted.wait()
                nursery.cancel_scope.cancel()
