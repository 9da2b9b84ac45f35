"""The lease recoverer: recovers attempts whose lease expired (docs/recovery.md).

It keeps one deadline, the earliest lease expiry in the store, and sleeps until then or until a commit
sets a lease to expire earlier (`LeaseExpiry`: a lease taken, renewed or released; or another node's
commit). Then it makes recovery passes (`recovery.recover_expired_in_tx`: up to a page of expired
attempts, each claimed at a higher epoch in one transaction), and hands each claimed attempt to an
attempt runner of its own: relaunched when nothing was ever handed to its executor, otherwise adopted
through the executor's ``recover`` or failed as not adoptable. At start it recovers what a previous
process left: expired leases, and those a clean close released.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from ..kernel.authority import Authority
from ..kernel.recovery import RecoverPass, next_expiry_in_tx, not_adoptable_in_tx, recover_expired_in_tx
from ..records.errors import InvalidRequest, StaleAuthority
from ..records.events import DiagnosticKind
from ..records.notices import Lagged, LeaseExpiry, StoreChanged
from ..records.seeds import token_seed
from ..records.validation import MAX_KEY_LEN, check_text
from ..records.work import Execution, ExecutionState, Lease, Recovery
from ..store import NoticeFeed
from .attempts import AttemptRunner
from .shared import Shared
from .supervision import contained, describe

log = logging.getLogger("loom.recovery")

PAGE = 100

LIVE = frozenset({ExecutionState.RUNNING, ExecutionState.RECOVERING})
"""An attempt in these states has its lease's holder, or a recovery, to watch its process."""


class LeaseRecoverer:
    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self.attempts = AttemptRunner(shared)
        self._next: int | None = None
        self._passing = True
        self._feed_pending = False
        self._progress = trio.Event()
        self._moved = trio.Event()

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
        feed = storage.feed(wants=(LeaseExpiry,))
        try:
            async with trio.open_nursery() as nursery:
                self._s.activity.bind(nursery)
                task_status.started(self)
                self._s.activity.enter()  # (busy until it has looked: `wait_idle` waits for it)
                nursery.start_soon(self.end_lingering, nursery)
                while True:
                    self._passing = True
                    self._signal()
                    await self.recover_pass()
                    self._next = await storage.submit(next_expiry_in_tx)
                    self._passing = False
                    self._feed_pending = feed.pending
                    self._signal()
                    await self._sleep(feed)
        except* trio.EndOfChannel:
            pass  # the storage actor stopped: the runtime is going down (the rest, if any, goes on)
        finally:
            storage.unsubscribe(feed)

    async def _sleep(self, feed: NoticeFeed) -> None:
        """Until the earliest lease expires, a commit sets one to expire earlier, or the store must be
        looked at again (missed notices, another node's leases)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._until_expiry, nursery.cancel_scope)
            nursery.start_soon(self._read, feed, nursery.cancel_scope)

    async def _until_expiry(self, done: trio.CancelScope) -> None:
        while True:
            moved = self._moved = trio.Event()
            deadline = self._next
            if deadline is None:
                await moved.wait()
                continue
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._expire_at, deadline, done)
                await moved.wait()
                nursery.cancel_scope.cancel()

    async def _expire_at(self, deadline: int, done: trio.CancelScope) -> None:
        await self._s.clock.sleep_until(deadline)
        done.cancel()

    async def _read(self, feed: NoticeFeed, done: trio.CancelScope) -> None:
        while True:
            self._feed_pending = feed.pending
            self._signal()
            batch = await feed.next_batch()
            self._feed_pending = True
            for notice in batch:
                expiry = (
                    notice.expires_at_ms
                    if isinstance(notice, LeaseExpiry)
                    else notice.lease_expiry_ms
                    if isinstance(notice, StoreChanged)
                    else None
                )
                if expiry is not None and (self._next is None or expiry < self._next):
                    self._next = expiry
                    self._moved.set()
                if isinstance(notice, Lagged) or (
                    isinstance(notice, StoreChanged) and (notice.everything or notice.check)
                ):
                    done.cancel()
                    return

    async def recover_pass(self) -> int:
        """Recover every attempt whose lease has expired now, a page per storage request; return how
        many were claimed."""
        recovered = 0
        while True:
            done: RecoverPass = await self._s.storage.submit(
                recover_expired_in_tx,
                PAGE,
                owner=self._s.owner,
                token_seed=token_seed(),
                lease_ms=self._s.lease_ms,
                executors=frozenset(self._s.extensions.executors),
            )
            for recovery in done.recoveries:
                await self._hand_over(recovery)
            recovered += len(done.recoveries)
            if not done.more:
                return recovered

    async def end_lingering(self, nursery: trio.Nursery) -> None:
        try:
            await self._end_lingering(nursery)
        finally:
            self._s.activity.leave()

    async def _end_lingering(self, nursery: trio.Nursery) -> None:
        """Once, at the start: each executor that can (``lingering``, ``end_lingering``) names the attempts
        whose processes run here unwatched, left by a loom that died; those of this store's attempts
        that have ended (completed through the service's toolbelt just before the kill, cancelled,
        parked ...) are stopped, each in a task of its own. A live or recovering attempt is left to its
        lease's holder or to the recovery."""
        for name, executor in self._s.extensions.executors.items():
            lingering = getattr(executor, "lingering", None)
            end = getattr(executor, "end_lingering", None)
            if lingering is None or end is None:
                continue
            try:
                found = list(await lingering())
            except Exception as exc:
                await self._contain(name, "lingering", name, describe(exc), exc)
                continue
            for execution_id in found:
                try:
                    check_text("execution_id", execution_id, max_len=MAX_KEY_LEN, strip=False)
                except InvalidRequest as exc:
                    await self._contain(name, "lingering", name, f"a malformed answer: {exc}", exc)
                    continue
                execution = await self._s.reader.execution(execution_id)
                if (
                    execution is not None
                    and execution.executor == name
                    and execution.metadata is not None
                    and execution.state not in LIVE
                ):
                    self._s.activity.enter()  # busy until its processes are gone: `wait_idle` waits
                    nursery.start_soon(self._end, name, end, execution)

    async def _end(self, name: str, end: Callable[..., Awaitable[object]], execution: Execution) -> None:
        try:
            await end(execution.id, dict(execution.metadata or {}), dict(execution.binding_config or {}))
        except Exception as exc:
            reason = f"stopping what a loom that died left running failed: {describe(exc)}"
            await self._contain(name, "end_lingering", execution.id, reason, exc)
        finally:
            self._s.activity.leave()

    async def _contain(self, plugin: str, hook: str, item: str, reason: str, exc: BaseException) -> None:
        kind = DiagnosticKind.INTERRUPT_FAILED if hook == "end_lingering" else DiagnosticKind.EXECUTOR_FAILED
        await contained(
            self._s.storage, kind, plugin=plugin, hook=hook, item=item, reason=reason, exc=exc, logger=log
        )

    async def _hand_over(self, recovery: Recovery) -> None:
        executors = self._s.extensions.executors
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
