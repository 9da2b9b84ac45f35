"""The lease recoverer: recovers attempts whose lease expired (docs/recovery.md).

It sleeps until the earliest lease expiry (or until a commit may have changed it), then runs bounded
passes over expired leases (`recovery.expired_in_tx`, a durable fair cursor). Each expired attempt is
claimed at a higher epoch (`recover_claim_in_tx`) and handed to an attempt runner of its own: relaunched
when nothing was ever handed to its executor, otherwise adopted through the executor's ``recover`` or
failed as not adoptable. At start it recovers what a previous process left: expired leases, and those a
clean close released.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable

import trio

from ..kernel.authority import Authority
from ..kernel.recovery import Expired, expired_in_tx, not_adoptable_in_tx, recover_claim_in_tx
from ..records.errors import StaleAuthority
from ..records.work import Lease
from ..store import NoticeFeed, Tx
from .attempts import AttemptRunner
from .shared import Shared

log = logging.getLogger("loom.recovery")

PAGE = 100


def _next_expiry(tx: Tx, now_ms: int) -> int | None:
    return tx.next_lease_expiry()


class LeaseRecoverer:
    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self.attempts = AttemptRunner(shared)
        self._next: int | None = None
        self._passing = True
        self._feed_pending = False
        self._progress = trio.Event()

    @property
    def idle(self) -> bool:
        """No pass running, no unread notice, and no lease expired at the clock's current time."""
        expired = self._next is not None and self._next <= self._s.clock.now_ms()
        return not self._passing and not self._feed_pending and not expired and self._s.activity.idle

    async def wait_idle(self) -> None:
        while True:
            progress = self._progress
            if self.idle:
                return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_after, self._s.activity.wait_quiet, nursery.cancel_scope)
                await progress.wait()
                nursery.cancel_scope.cancel()

    def _signal(self) -> None:
        progress, self._progress = self._progress, trio.Event()
        progress.set()

    async def run(self, *, task_status: trio.TaskStatus[LeaseRecoverer] = trio.TASK_STATUS_IGNORED) -> None:
        storage = self._s.storage
        feed = storage.feed()
        try:
            async with trio.open_nursery() as nursery:
                self._s.activity.bind(nursery)
                task_status.started(self)
                while True:
                    self._passing = True
                    self._signal()
                    await self.recover_pass()
                    self._next = await storage.submit(_next_expiry)
                    self._passing = False
                    self._feed_pending = feed.pending
                    self._signal()
                    await self._sleep(feed)
        except trio.EndOfChannel:
            return  # the storage actor stopped: the runtime is going down
        finally:
            storage.unsubscribe(feed)

    async def _sleep(self, feed: NoticeFeed) -> None:
        """Until the earliest lease expires, or a commit (a claim, a renewal) may have moved it."""
        async with trio.open_nursery() as nursery:

            async def on_expiry() -> None:
                if self._next is None:
                    await trio.sleep_forever()
                await self._s.clock.sleep_until(self._next or 0)
                nursery.cancel_scope.cancel()

            async def on_commit() -> None:
                await feed.next_batch()
                self._feed_pending = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(on_expiry)
            nursery.start_soon(on_commit)

    async def recover_pass(self) -> int:
        """Recover every attempt whose lease has expired now, in bounded pages; return how many.

        A page's claims are submitted together, so the storage actor commits them in a few batches
        (each in its own savepoint) rather than one commit per attempt."""
        recovered = 0
        while True:
            expired = await self._s.storage.submit(expired_in_tx, PAGE)
            claimed: list[bool] = []
            async with trio.open_nursery() as nursery:
                for seen in expired:
                    nursery.start_soon(self._recover_one, seen, claimed)
            recovered += len(claimed)
            if len(expired) < PAGE:
                return recovered

    async def _recover_one(self, seen: Expired, claimed: list[bool]) -> None:
        executors = self._s.extensions.executors
        recovery = await self._s.storage.submit(
            recover_claim_in_tx,
            seen,
            owner=self._s.owner,
            token=secrets.token_urlsafe(24),
            lease_ms=self._s.lease_ms,
            executors=frozenset(executors),
        )
        if recovery is None:
            return  # renewed, ended or claimed by another recoverer since it was seen
        claimed.append(True)
        name = recovery.lease.request.executor or ""
        if name in executors:
            self.attempts.start(
                recovery.lease, name, metadata=None if recovery.relaunch else recovery.metadata
            )
        else:
            await self._not_installed(recovery.lease, name)

    async def _not_installed(self, lease: Lease, name: str) -> None:
        """No executor here can verify the attempt (none is named, or it is not installed): it is not
        adoptable, and fails under the new fence."""
        reason = f"executor {name!r} is not installed in this runtime" if name else "it ran under no executor"
        try:
            await self._s.storage.submit(not_adoptable_in_tx, Authority.of(lease), reason)
        except StaleAuthority:
            pass


async def _cancel_after(wait: Callable[[], Awaitable[object]], scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()
