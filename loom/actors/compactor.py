"""The compactor: removes what ended once its retention passed (`kernel.compaction`), and asks executors
to forget the logs of attempts whose ``attempt_logs`` retention passed (docs/operations.md).

It wakes every ``[compaction] every`` of the clock (and once at start) and makes a sweep: compaction
passes, each one short transaction, until no step has a full page. Each step goes on from its durable
cursor, so a sweep cut short by a crash or a stop goes on where it was. While other requests share the
storage actor (the hot path: acceptance, routing, firing), it pauses between passes `FAIR` times as
long as the pass took, so compaction takes at most a ninth of the actor's time; alone, it goes on at
once. `Runtime.compact` makes the same sweep for a host.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import trio

from ..config import Config
from ..kernel.compaction import (
    CompactPass,
    CompactRequest,
    LogsPage,
    Rehearsed,
    compact_in_tx,
    logs_due_in_tx,
    logs_forgotten_in_tx,
    raise_watermark_in_tx,
    rehearse_in_tx,
)
from ..records.clock import Clock
from ..records.compaction import CompactionReport
from ..records.errors import StorageClosed, StorageError, StorageLost, StorageUnavailable
from ..records.events import DiagnosticKind
from ..store import StorageActor
from .supervision import contained, describe

log = logging.getLogger("loom.compaction")

FAIR = 8
"""While the hot path is busy, a pause of this many times a pass's own time follows it."""
MAX_PAUSE_S = 1.0
"""The longest pause between two passes of a sweep (wall time: it shares the storage actor fairly)."""


async def sweep(
    storage: StorageActor,
    config: Config,
    executors: Mapping[str, Any],
    *,
    limit: int,
    dry_run: bool = False,
    sole: bool = True,
) -> CompactionReport:
    """Compaction passes until each step went once through its rows (`CompactRequest.finished`) and no
    expiry had a full page; first, the executors forget the logs whose retention passed, so their
    attempts may go in the same sweep. Returns what it removed, summed. A dry run rehearses the whole
    sweep in one transaction rolled back at its end (`rehearse_in_tx`): what it would remove, writing
    nothing and asking no executor to forget anything."""
    if dry_run:
        try:
            await storage.submit(rehearse_in_tx, config, limit, frozenset(executors), sole=sole)
        except Rehearsed as rehearsed:
            return rehearsed.report
        raise AssertionError("a rehearsal always ends by rolling back")  # pragma: no cover
    report = CompactionReport(logs=await forget_logs(storage, config, executors, limit=limit, sole=sole))
    await storage.submit(raise_watermark_in_tx)
    finished: frozenset[str] = frozenset()
    while True:
        started, committed = trio.current_time(), storage.stats.requests
        request = CompactRequest(config=config, limit=limit, finished=finished)
        done: CompactPass = await storage.submit(compact_in_tx, request)
        report += done.report
        finished |= done.finished
        if not done.report.more:
            return report
        busy = storage.stats.requests - committed > 1  # others committed while this pass ran
        await trio.sleep(min(FAIR * (trio.current_time() - started), MAX_PAUSE_S) if busy else 0)


async def forget_logs(
    storage: StorageActor, config: Config, executors: Mapping[str, Any], *, limit: int, sole: bool
) -> int:
    """Ask each installed executor to forget the logs of its attempts whose retention passed (an
    executor's optional ``forget(execution_id, metadata)``; one without it keeps nothing to forget), then
    mark them forgotten. A crash in between asks again: forgetting is idempotent. An executor that
    raises is contained: a ``forget_failed`` diagnostic, and the attempt counts as forgotten."""
    forgotten = 0
    while True:
        page: LogsPage = await storage.submit(logs_due_in_tx, config, limit, frozenset(executors), sole=sole)
        done: list[str] = []
        for due in page.due:
            forget = getattr(executors.get(due.executor), "forget", None)
            if forget is not None:
                try:
                    await forget(due.execution_id, due.metadata)
                except Exception as exc:
                    await contained(
                        storage,
                        DiagnosticKind.FORGET_FAILED,
                        plugin=due.executor,
                        hook="forget",
                        item=due.execution_id,
                        reason=describe(exc),
                        exc=exc,
                        logger=log,
                    )
            done.append(due.execution_id)
        if done:
            await storage.submit(logs_forgotten_in_tx, done)
        forgotten += len(done) + page.forgotten
        if not page.more:
            return forgotten


class Compactor:
    def __init__(
        self,
        storage: StorageActor,
        clock: Clock,
        *,
        config: Callable[[], Config],
        executors: Mapping[str, Any],
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._config = config
        self._executors = executors
        self.next_ms: int | None = None
        """When the next sweep is due (``None``: one is running, or the actor has not started)."""
        self.last: CompactionReport | None = None
        """What the last sweep removed."""
        self._progress = trio.Event()
        self._reloaded = trio.Event()

    def on_reload(self) -> None:
        """A new configuration is in force: the wait for the next sweep is measured again by its
        ``[compaction] every`` (from the end of the last sweep)."""
        self._reloaded.set()

    @property
    def idle(self) -> bool:
        """No sweep running and none due at the clock's current time."""
        return self.next_ms is not None and self.next_ms > self._clock.now_ms()

    async def wait_idle(self) -> None:
        while True:
            progress = self._progress
            if self.idle:
                return
            await progress.wait()

    def _signal(self) -> None:
        progress, self._progress = self._progress, trio.Event()
        progress.set()

    async def run(self, *, task_status: trio.TaskStatus[Compactor] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(self)
        while True:
            self.next_ms = None
            config = self._config()
            try:
                self.last = await sweep(
                    self._storage,
                    config,
                    self._executors,
                    limit=config.compaction.batch,
                    sole=not self._storage.shared,
                )
            except (StorageClosed, StorageUnavailable, StorageLost):
                # stopping, or a lost connection (the actor starts again from its cursors), or a file
                # gone or corrupt for good (the runtime stops)
                raise
            except StorageError as exc:
                log.error("compaction: a pass failed (%s); trying again at the next sweep", exc)
            except Exception as exc:
                # housekeeping never stops the runtime: the pass rolled back, and says why
                await contained(
                    self._storage,
                    DiagnosticKind.COMPACTION_FAILED,
                    plugin="core",
                    hook="compaction",
                    item="compaction",
                    reason=describe(exc),
                    exc=exc,
                    logger=log,
                )
            await self._until_due(self._clock.now_ms())

    async def _until_due(self, ended_ms: int) -> None:
        """Until the next sweep is due: ``[compaction] every`` after the last one ended, by the
        configuration in force (a reload that shortens it is obeyed at once, not after the old wait)."""
        while True:
            self.next_ms = ended_ms + self._config().compaction.every_ms
            self._signal()
            reloaded = self._reloaded = trio.Event()
            due = False
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when, reloaded, nursery.cancel_scope)
                await self._clock.sleep_until(self.next_ms)
                due = True
                nursery.cancel_scope.cancel()
            if due:
                return


async def _cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
