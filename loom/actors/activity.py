"""`Activity`: what the router's parts have in flight, so a host can wait until nothing is.

Every task the router starts counts as busy until it returns; a task that waits for something
outside the runtime (a running execution, a change it depends on, a clock) steps out of the count
while it waits.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import trio

A = TypeVar("A")


class Activity:
    def __init__(self) -> None:
        self._busy = 0
        self._quiet = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.feed_pending = False
        """A committed notice batch waits to be read (the pool is not idle until it is)."""
        self._routed: dict[str, trio.Event] = {}

    def bind(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    @property
    def idle(self) -> bool:
        return self._busy == 0 and not self.feed_pending

    def enter(self) -> None:
        self._busy += 1

    def leave(self) -> None:
        self._busy -= 1
        if self._busy == 0:
            quiet, self._quiet = self._quiet, trio.Event()
            quiet.set()

    def mark_quiet(self) -> None:
        """Wake quiet-waiters if nothing is busy (after the feed was drained)."""
        if self._busy == 0:
            self.enter()
            self.leave()

    async def wait_quiet(self) -> None:
        while not self.idle:
            await self._quiet.wait()

    def routed(self, event_id: str) -> None:
        """``event_id`` got its checkpoint: wake whoever waits for it."""
        waiter = self._routed.pop(event_id, None)
        if waiter is not None:
            waiter.set()

    @property
    def routed_waiters(self) -> bool:
        """Whether a step waits for an Event's routing checkpoint (`wait_routed`)."""
        return bool(self._routed)

    def wake_all(self) -> None:
        """Notices were missed: every waiter looks again."""
        waiters, self._routed = self._routed, {}
        for waiter in waiters.values():
            waiter.set()

    async def wait_routed(self, event_id: str, is_routed: Callable[[], Awaitable[bool]]) -> None:
        """Wait (not busy) until ``event_id`` has its routing checkpoint: the condition a step blocked
        behind an earlier Event waits for, however many unrelated changes happen meanwhile."""
        waiter = self._routed.setdefault(event_id, trio.Event())
        if await is_routed():
            return
        await self.outside(waiter.wait)

    async def outside(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Await ``fn()`` without counting as busy (it waits on the outside world)."""
        self.leave()
        try:
            return await fn()
        finally:
            self.enter()

    def start_uncounted(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start a task that never counts as busy (it sleeps on the clock, as a lease renewal does)."""
        assert self._nursery is not None, "Activity.bind() was not called"
        self._nursery.start_soon(fn, *args)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start a task that counts as busy until it returns."""
        assert self._nursery is not None, "Activity.bind() was not called"
        self.enter()

        async def counted() -> None:
            try:
                await fn(*args)
            finally:
                self.leave()

        self._nursery.start_soon(counted)


class Coalesced(Generic[A]):
    """An ask for ``run(arg)`` that runs it one at a time: asked while a run is in progress, it runs
    once more when that run ends, with the asks' arguments combined by ``merge`` (by default the
    latest), however many asks came meanwhile. For a rescan the store may be asked for faster than it
    answers (a shared database's periodic check, another node's commits): one task per ask would pile
    requests up in the storage actor's mailbox without bound, ahead of the work they are meant to
    unblock. The run counts as busy (`Activity.spawn`) until no ask is left."""

    def __init__(
        self,
        activity: Activity,
        run: Callable[[A], Awaitable[object]],
        merge: Callable[[A, A], A] = lambda earlier, later: later,
    ) -> None:
        self._activity = activity
        self._run = run
        self._merge = merge
        self._running = False
        self._asked: tuple[A] | None = None

    def ask(self, arg: A) -> None:
        self._asked = (arg,) if self._asked is None else (self._merge(self._asked[0], arg),)
        if not self._running:
            self._running = True
            self._activity.spawn(self._runs)

    async def _runs(self) -> None:
        try:
            while self._asked is not None:
                (arg,), self._asked = self._asked, None
                await self._run(arg)
        finally:
            self._running = False


class Progress:
    """A signal that what an actor's idle check looks at may have changed: `wait_until` checks, and
    waits for the next signal if the check fails, never missing one given in between."""

    def __init__(self) -> None:
        self._event = trio.Event()

    def signal(self) -> None:
        event, self._event = self._event, trio.Event()
        event.set()

    async def wait_until(self, idle: Callable[[], bool]) -> None:
        while True:
            changed = self._event  # taken before the check, so a change in between is seen
            if idle():
                return
            await changed.wait()
