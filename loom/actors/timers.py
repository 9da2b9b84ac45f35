"""The timer actor: fires due timers, taking them from the database at the earliest deadline.

The store keeps every armed timer, indexed by due time; the actor keeps only the next deadline. It
sleeps on the clock until then, or until a commit arms a timer earlier (`TimerArmed`, or another
node's commit), and then makes firing passes (`firing.fire_due_in_tx`: up to a page of due timers,
earliest first, each firing atomic with its Event and ledger entry) until nothing more is due. Each
pass answers with the next deadline, so nothing is ever rebuilt: a restart with a million armed timers
reads one index entry. Exactly-once lives in the kernel's ledger; on a shared database the pass skips
rows another node is firing, so nodes divide the due timers.

A firing that fails without an answer (its error, not a ledger entry) is looked at again
``retry_ms`` later, never in a loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

import trio

from ..config import CausalLimits
from ..kernel.chains import fire_then_route_in_tx
from ..kernel.firing import FirePass, fire_due_in_tx, next_due_in_tx
from ..records.clock import Clock
from ..records.errors import StorageClosed, StorageError, StorageLost, StorageUnavailable
from ..records.notices import Lagged, StoreChanged, TimerArmed
from ..records.timers import RecurrencePolicy
from ..records.work import Lease
from ..store import NoticeFeed, StorageActor
from .activity import Progress
from .ingress import RouteAtFiring

log = logging.getLogger("loom.timers")

PAGE = 500
"""Due timers one pass fires at most (one storage request, one commit)."""
DEFAULT_RETRY_MS = 1000


class TimerActor:
    def __init__(
        self,
        storage: StorageActor,
        clock: Clock,
        *,
        limits: Callable[[], CausalLimits],
        policies: Mapping[str, RecurrencePolicy],
        retry_ms: int = DEFAULT_RETRY_MS,
        routing: Callable[[], RouteAtFiring | None] | None = None,
    ) -> None:
        """``routing``: asked at each firing pass (the router's `at_firing`); with an answer, the Events
        the pass accepts are routed, and their Works started, in its commit."""
        self._storage = storage
        self._routing = routing
        self._clock = clock
        self._limits = limits
        self.policies = dict(policies)
        self._retry_ms = retry_ms
        self.next_due_ms: int | None = None
        """When the actor makes its next pass (the earliest armed deadline it knows of)."""
        self._retrying: dict[str, int] = {}
        """Timers whose firing failed without an answer -> when to look at them again."""
        self._feed_pending = False
        self._firing = True
        self._changed = trio.Event()
        self._progress = Progress()

    @property
    def idle(self) -> bool:
        """No unread notice, no pass running, and nothing due at the clock's current time."""
        due = self._wake_at()
        return (
            not self._feed_pending
            and not self._firing
            and not self._changed.is_set()
            and (due is None or due > self._clock.now_ms())
        )

    async def wait_idle(self) -> None:
        """Return once `idle` (a host's quiescence check; timers due later do not count)."""
        await self._progress.wait_until(lambda: self.idle)

    def _wake_at(self) -> int | None:
        times = [t for t in (self.next_due_ms, *self._retrying.values()) if t is not None]
        return min(times) if times else None

    def _earlier(self, fire_at_ms: int) -> None:
        if self._firing:
            # a pass in flight may answer from before this commit (its deadline is what it read then):
            # look again once it is over, or a timer armed meanwhile waits for the next commit
            self._changed.set()
        if self.next_due_ms is None or fire_at_ms < self.next_due_ms:
            self.next_due_ms = fire_at_ms
            self._changed.set()

    async def run(self, *, task_status: trio.TaskStatus[TimerActor] = trio.TASK_STATUS_IGNORED) -> None:
        feed = self._storage.feed(capacity=4096, wants=(TimerArmed,))
        try:
            self.next_due_ms = await self._storage.submit(next_due_in_tx)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_notices, feed)
                task_status.started(self)
                while True:
                    self._changed = trio.Event()
                    self._firing = True
                    await self._fire_due()
                    self._firing = False
                    self._progress.signal()
                    await self._sleep()
        except* trio.EndOfChannel:
            pass  # the storage actor stopped: the runtime is going down (the rest, if any, goes on)
        finally:
            self._storage.unsubscribe(feed)

    async def _read_notices(self, feed: NoticeFeed) -> None:
        while True:
            self._feed_pending = feed.pending
            self._progress.signal()
            batch = await feed.next_batch()
            self._feed_pending = True
            for notice in batch:
                if isinstance(notice, TimerArmed):
                    self._earlier(notice.fire_at_ms)
                elif isinstance(notice, StoreChanged) and notice.timer_due_ms is not None:
                    self._earlier(notice.timer_due_ms)
                elif isinstance(notice, Lagged) or (
                    isinstance(notice, StoreChanged) and (notice.everything or notice.check)
                ):
                    self._earlier(self._clock.now_ms())  # a pass answers with the true next deadline

    async def _sleep(self) -> None:
        """Until the next pass is due, or a commit may have armed something earlier."""
        wake = self._wake_at()
        if wake is not None and wake <= self._clock.now_ms():
            return
        changed = self._changed
        async with trio.open_nursery() as nursery:

            async def on_clock() -> None:
                if wake is None:
                    await trio.sleep_forever()
                await self._clock.sleep_until(wake or 0)
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_clock)
            await changed.wait()
            nursery.cancel_scope.cancel()

    async def _fire_due(self) -> None:
        """Fire until nothing more is due now (each pass a page, one commit)."""
        while True:
            now = self._clock.now_ms()
            for timer_id in [t for t, at in self._retrying.items() if at <= now]:
                del self._retrying[timer_id]
            routing = self._routing() if self._routing is not None else None
            started: tuple[Lease, ...] = ()
            try:
                if routing is None:
                    done: FirePass = await self._storage.submit(
                        fire_due_in_tx, PAGE, self._limits(), self.policies, frozenset(self._retrying)
                    )
                else:
                    done, started = await self._storage.submit(
                        fire_then_route_in_tx,
                        PAGE,
                        self._limits(),
                        self.policies,
                        frozenset(self._retrying),
                        routing.planner,
                        routing.admit,
                    )
            except (StorageClosed, StorageUnavailable, StorageLost):
                # stopping, or a lost connection (the actor starts again from the store), or a file
                # gone or corrupt for good (the runtime stops)
                raise
            except StorageError as exc:
                # the batch failed as a whole and committed nothing: every due timer is still armed
                self.next_due_ms = self._clock.now_ms() + self._retry_ms
                log.error("timers: a firing pass failed (%s); looking again at %d", exc, self.next_due_ms)
                return
            if routing is not None:
                for lease in started:
                    routing.launch(lease, lease.request.executor or "")
            now = self._clock.now_ms()
            for request, result in zip(done.requests, done.results, strict=True):
                if isinstance(result, str):
                    log.error(
                        "timer %s: firing failed: %s; looking again at %d",
                        request.timer_id,
                        result,
                        now + self._retry_ms,
                    )
                    self._retrying[request.timer_id] = now + self._retry_ms
            self.next_due_ms = done.next_due_ms
            if done.more:
                continue
            if done.next_due_ms is not None and done.next_due_ms <= done.at_ms:
                if done.requests:
                    continue  # a firing re-armed its timer due already (a catch-up): go on
                # due, yet the pass took nothing: another node is firing it now (its commit tells us)
                self.next_due_ms = now + self._retry_ms
            return
