"""The in-memory timer service.

It holds armed timers in a `TimerHeap` and calls ``fire(key)`` once each is due on the injected
`Clock`. It is not durable and does not need to be: the store records every armed timer, the
runtime re-arms the pending ones at start, and exactly-once lives in the kernel's firing
procedure, which ignores a fire for a timer that is no longer pending. So the service may fire a
key again (after a failed fire, or a re-arm by recovery) but must never drop one.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import trio

from ..records.clock import Clock
from ..records.errors import InvalidRequest
from ._heap import Entry, TimerHeap

K = TypeVar("K", bound=Hashable)

logger = logging.getLogger(__name__)

DEFAULT_RETRY_MS = 1000


class TimerService(Generic[K]):
    """Arms keys at deadlines and fires each due one, in ``(deadline, schedule order)``.

    ``schedule``, ``cancel`` and ``wake`` are plain methods, safe to call from any task of the
    same trio run (and from clock callbacks such as `OffsetClock.on_shift`).
    """

    def __init__(self, clock: Clock, *, retry_ms: int = DEFAULT_RETRY_MS) -> None:
        if isinstance(retry_ms, bool) or not isinstance(retry_ms, int) or retry_ms <= 0:
            raise InvalidRequest(f"TimerService: retry_ms must be a positive integer, got {retry_ms!r}")
        self._clock = clock
        self._retry_ms = retry_ms
        self._heap: TimerHeap[K] = TimerHeap()
        # Set on every change; the run loop replaces it before each pass, so a change made
        # while it fires or computes its next deadline is never missed.
        self._changed = trio.Event()
        # The key whose fire is running -> whether it was scheduled or cancelled meanwhile.
        self._in_flight: dict[K, bool] = {}
        self._running = False
        self._passed = trio.Event()

    @property
    def idle(self) -> bool:
        """Nothing firing and nothing due at the clock's current time."""
        head = self._heap.peek()
        return not self._in_flight and (head is None or head.deadline_ms > self._clock.now_ms())

    @property
    def next_pass(self) -> trio.Event:
        """An event set when the run loop completes its next pass over what is due (capture it before
        checking `idle`, so a pass that ends in between is not missed)."""
        return self._passed

    def __len__(self) -> int:
        return len(self._heap)

    def __contains__(self, key: object) -> bool:
        return key in self._heap

    def deadline(self, key: K) -> int | None:
        """When ``key`` is armed to fire, or ``None`` if it is not armed."""
        entry = self._heap.get(key)
        return None if entry is None else entry.deadline_ms

    def schedule(self, key: K, at_ms: int) -> None:
        """Arm ``key`` at ``at_ms``; a key already armed moves (there is never a second entry)."""
        entry = self._heap.get(key)
        if entry is not None:
            self._heap.remove(entry)
        self._heap.push(key, at_ms)
        self._touch(key)

    def cancel(self, key: K) -> bool:
        """Disarm ``key``; return whether it was armed."""
        entry = self._heap.get(key)
        if entry is not None:
            self._heap.remove(entry)
        self._touch(key)
        return entry is not None

    def wake(self) -> None:
        """Make the run loop look at the clock again (after the clock jumped)."""
        self._changed.set()

    def _touch(self, key: K) -> None:
        if key in self._in_flight:
            self._in_flight[key] = True
        self._changed.set()

    async def run(
        self,
        fire: Callable[[K], Awaitable[None]],
        *,
        fire_many: Callable[[list[K]], Awaitable[list[K]]] | None = None,
        batch: int = 500,
        task_status: trio.TaskStatus[TimerService[K]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Fire due keys until cancelled.

        ``fire`` is awaited once per due key, one at a time, after the key was disarmed. If it
        raises an `Exception`, the error is logged and the key is armed again ``retry_ms`` later
        (unless it was scheduled or cancelled while ``fire`` ran), so a failed fire is retried,
        never lost, and never stops the service.

        With ``fire_many``, due keys are popped up to ``batch`` at a time, in order, and handed
        over together (one storage request, one commit); it returns the keys that failed, and
        those are re-armed by the same rule (all of them if it raises).
        """
        if self._running:
            raise RuntimeError("TimerService.run: already running (a second loop would fire keys twice)")
        self._running = True
        try:
            task_status.started(self)
            while True:
                changed = self._changed = trio.Event()
                if fire_many is None:
                    await self._fire_due(fire)
                else:
                    await self._fire_due_batched(fire_many, batch)
                passed, self._passed = self._passed, trio.Event()
                passed.set()
                head = self._heap.peek()
                if head is None:
                    await changed.wait()
                else:
                    await self._sleep_until_or_changed(head.deadline_ms, changed)
        finally:
            self._running = False

    async def _fire_due(self, fire: Callable[[K], Awaitable[None]]) -> None:
        now = self._clock.now_ms()
        # Pop one at a time rather than collecting a batch: a fire may cancel or move a key
        # that is due in this same pass, and that must take effect.
        while (head := self._heap.peek()) is not None and head.deadline_ms <= now:
            self._heap.pop()
            key = head.key
            self._in_flight[key] = False
            try:
                await fire(key)
            except Exception:
                retry_at = self._clock.now_ms() + self._retry_ms
                if not self._in_flight.pop(key):
                    logger.exception("timer %r: fire failed; retrying at %d", key, retry_at)
                    self._heap.push(key, retry_at)
                else:
                    logger.exception("timer %r: fire failed; it was re-armed or cancelled meanwhile", key)
            except BaseException:
                # Cancelled mid-fire: keep the key armed so a later run still fires it.
                if not self._in_flight.pop(key):
                    self._heap.push(key, head.deadline_ms)
                raise
            else:
                self._in_flight.pop(key)

    async def _fire_due_batched(self, fire_many: Callable[[list[K]], Awaitable[list[K]]], batch: int) -> None:
        now = self._clock.now_ms()
        while (head := self._heap.peek()) is not None and head.deadline_ms <= now:
            entries: list[Entry[K] | None] = []
            while (
                len(entries) < batch and (head := self._heap.peek()) is not None and head.deadline_ms <= now
            ):
                entries.append(self._heap.pop())
            keys = [entry.key for entry in entries if entry is not None]
            for key in keys:
                self._in_flight[key] = False
            try:
                failed = set(await fire_many(keys))
            except Exception:
                logger.exception("timers: a batch of %d fires failed", len(keys))
                failed = set(keys)
            except BaseException:
                for entry in entries:
                    if entry is not None and not self._in_flight.pop(entry.key):
                        self._heap.push(entry.key, entry.deadline_ms)
                raise
            retry_at = self._clock.now_ms() + self._retry_ms
            for key in keys:
                moved = self._in_flight.pop(key)
                if key in failed and not moved:
                    # a failure was logged where it happened; on a shared database this is also a
                    # timer another node is firing right now, which is no failure at all
                    logger.info("timer %r: not fired; looking again at %d", key, retry_at)
                    self._heap.push(key, retry_at)

    async def _sleep_until_or_changed(self, deadline_ms: int, changed: trio.Event) -> None:
        async with trio.open_nursery() as nursery:

            async def sleeper() -> None:
                await self._clock.sleep_until(deadline_ms)
                nursery.cancel_scope.cancel()

            nursery.start_soon(sleeper)
            await changed.wait()
            nursery.cancel_scope.cancel()
