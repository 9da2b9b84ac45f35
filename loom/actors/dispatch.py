"""Intent dispatch: inject and interrupt controls sent to executors outside any transaction, and the cleanup
interrupt after a control fenced an attempt (it cannot restore authority).
"""

from __future__ import annotations

import logging
from functools import partial

from ..kernel.intents import DispatchResult, begin_dispatch_in_tx, finish_dispatch_in_tx
from ..records.errors import NotAccepting
from ..records.events import DiagnosticKind
from ..records.notices import ExecutionFenced
from ..records.work import IntentKind
from .shared import Shared
from .supervision import contained, describe

log = logging.getLogger("loom.router")


class IntentDispatcher:
    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._dispatching: set[str] = set()

    def dispatch(self, intent_id: str) -> None:
        if intent_id not in self._dispatching:
            self._dispatching.add(intent_id)
            self._s.activity.spawn(self._dispatch, intent_id)

    def stop_fenced(self, notice: ExecutionFenced) -> None:
        self._s.activity.spawn(self.stop, notice.execution_id, notice.work_id)

    async def resync(self) -> None:
        for intent in await self._s.reader.open_intents(None, 10_000):
            self.dispatch(intent.id)

    async def _dispatch(self, intent_id: str) -> None:
        """Dispatch one intent; an ambiguous answer is retried, when the kernel schedules it, with the
        same intent identity."""
        storage = self._s.storage
        try:
            while True:
                dispatch = await storage.submit(begin_dispatch_in_tx, intent_id)
                if dispatch is None:
                    return
                executor = self._s.extensions.executors.get(dispatch.execution.executor or "")
                result = DispatchResult.AMBIGUOUS
                if executor is not None:
                    try:
                        if dispatch.intent.kind is IntentKind.INJECT:
                            await executor.inject(dispatch.execution.id, dispatch.event)
                        else:
                            await executor.interrupt(dispatch.execution.id)
                        result = DispatchResult.ACCEPTED
                    except NotAccepting:
                        result = DispatchResult.NOT_ACCEPTING
                    except Exception:
                        # ambiguous: retried with the same intent identity on the kernel's schedule
                        log.exception("intent %s: executor %r answered ambiguously", intent_id, executor)
                intent = await storage.submit(finish_dispatch_in_tx, intent_id, result)
                retry_at = intent.next_attempt_ms
                if result is not DispatchResult.AMBIGUOUS or retry_at is None:
                    return
                await self._s.activity.outside(partial(self._s.clock.sleep_until, retry_at))
        finally:
            self._dispatching.discard(intent_id)

    async def stop(self, execution_id: str, work_id: str | None, *, remote: bool = False) -> None:
        """Cleanup after a control fenced an attempt; it cannot restore authority. ``remote``: another
        node's control, so only an attempt this runtime holds is stopped here."""
        execution = await self._s.reader.execution(execution_id)
        if remote and (execution is None or execution.owner != self._s.owner):
            return
        name = execution.executor or "" if execution else ""
        executor = self._s.extensions.executors.get(name)
        if executor is not None:
            try:
                await executor.interrupt(execution_id)
            except Exception as exc:
                await contained(
                    self._s.storage,
                    DiagnosticKind.INTERRUPT_FAILED,
                    plugin=f"executor {name!r}",
                    hook="interrupt",
                    item=execution_id,
                    reason=f"stopping a fenced attempt failed: {describe(exc)}",
                    exc=exc,
                    logger=log,
                    work=work_id or (execution.work_id if execution else None),
                )
