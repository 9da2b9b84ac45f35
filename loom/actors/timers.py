"""The timer actor: the in-memory `TimerService` kept in step with the store.

At start it re-arms every armed timer from the store; afterwards commit notices arm,
move and cancel entries. When one is due it submits ``fire_timer_in_tx`` for that
timer's current identity; a firing whose commit fails raises, and the service re-arms it
(a storage error never loses a wakeup). Exactly-once lives in the kernel's ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial

import trio

from ..config import CausalLimits
from ..kernel.firing import fire_timers_in_tx
from ..records.notices import Lagged, TimerArmed, TimerCancelled
from ..records.timers import FireRequest, FiringResult, RecurrencePolicy
from ..store import StorageActor, Tx
from .timer_service import TimerService

log = logging.getLogger("loom.timers")

REBUILD_PAGE = 50_000


def _armed_page(tx: Tx, now_ms: int, after_id: str, limit: int) -> list[tuple[str, int, int]]:
    return tx.armed_timers(after_id, limit)


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class TimerActor:
    def __init__(
        self,
        storage: StorageActor,
        service: TimerService[str],
        *,
        limits: Callable[[], CausalLimits],
        policies: Mapping[str, RecurrencePolicy],
    ) -> None:
        self._storage = storage
        self.service = service
        self._limits = limits
        self.policies = dict(policies)
        self._armed: dict[str, tuple[int, int]] = {}
        self._feed_pending = False
        self._progress = trio.Event()

    async def rebuild(self) -> int:
        """Re-arm every armed timer from the store; return how many."""
        self._armed.clear()
        after = ""
        while page := await self._storage.submit(_armed_page, after, REBUILD_PAGE):
            for timer_id, revision, fire_at in page:
                self._arm(timer_id, revision, fire_at)
            after = page[-1][0]
        return len(self._armed)

    def _arm(self, timer_id: str, revision: int, fire_at_ms: int) -> None:
        self._armed[timer_id] = (revision, fire_at_ms)
        self.service.schedule(timer_id, fire_at_ms)

    def _disarm(self, timer_id: str) -> None:
        self._armed.pop(timer_id, None)
        self.service.cancel(timer_id)

    async def run(self, *, task_status: trio.TaskStatus[TimerActor] = trio.TASK_STATUS_IGNORED) -> None:
        feed = self._storage.feed(capacity=4096)
        try:
            await self.rebuild()
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(self.service.run, self._fire, fire_many=self._fire_many))
                task_status.started(self)
                while True:
                    self._feed_pending = feed.pending
                    self._signal_progress()
                    batch = await feed.next_batch()
                    self._feed_pending = True
                    for notice in batch:
                        if isinstance(notice, Lagged):
                            await self.rebuild()
                        elif isinstance(notice, TimerArmed):
                            self._arm(notice.timer_id, notice.revision, notice.fire_at_ms)
                        elif isinstance(notice, TimerCancelled):
                            self._disarm(notice.timer_id)
        except trio.EndOfChannel:
            return  # the storage actor stopped: the runtime is going down
        finally:
            self._storage.unsubscribe(feed)

    @property
    def idle(self) -> bool:
        """No unread notice, nothing firing, nothing due at the clock's current time."""
        return not self._feed_pending and self.service.idle

    def _signal_progress(self) -> None:
        progress, self._progress = self._progress, trio.Event()
        progress.set()

    async def wait_idle(self) -> None:
        """Return once `idle` (a host's quiescence check; timers due later do not count)."""
        while True:
            # capture both wakeups before checking, so a change in between is never missed
            progress, passed = self._progress, self.service.next_pass
            if self.idle:
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when_set, passed, nursery.cancel_scope)
                await progress.wait()
                nursery.cancel_scope.cancel()

    async def _fire_many(self, timer_ids: list[str]) -> list[str]:
        """Fire due timers together: one storage request, each firing atomic on its own."""
        pending = [(timer_id, self._armed[timer_id]) for timer_id in timer_ids if timer_id in self._armed]
        requests = [FireRequest(timer_id=t, revision=r, fire_at_ms=f) for t, (r, f) in pending]
        results = await self._storage.submit(fire_timers_in_tx, requests, self._limits(), self.policies)
        failed = []
        for (timer_id, armed), result in zip(pending, results, strict=True):
            if isinstance(result, str):
                log.error("timer %s: firing failed: %s", timer_id, result)
                failed.append(timer_id)
                continue
            if result.result is FiringResult.TAKEN:
                failed.append(timer_id)  # another node is firing it: look again later (the ledger answers)
                continue
            if result.result is FiringResult.INVALID:
                log.error("timer %s is invalid and left the due set: %s", timer_id, result.detail)
            if self._armed.get(timer_id) == armed and result.next_fire_at_ms is None:
                self._armed.pop(timer_id, None)
        return failed

    async def _fire(self, timer_id: str) -> None:
        if await self._fire_many([timer_id]):
            raise RuntimeError(f"timer {timer_id}: firing failed (see the log)")
