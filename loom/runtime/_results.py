"""A Work's outcome: `Runtime.result` reads it, `Runtime.wait_for` waits until it is settled; and
`Runtime.wait_routed` waits for an Event's routing checkpoint.

Waiting costs no polling loop. A waiter registers an event under its Work's (or Event's) id before it
reads; the storage actor hands every commit's notices to `Waiters`, which sets the events of the Works
a commit changed (`WorkChanged`, `WorkSettled`) and of the Events it routed (`EventRouted`), and on a
shared database of those another node settled or routed (a `StoreChanged` naming them, saying it
routed some, or that some may have been missed: ``everything``). Each wake-up is one read; nothing is
read while nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import trio

from ..kernel.retry import retry_timer_id
from ..records.errors import InvalidRequest, NotFound, StorageClosed, WaitTimedOut
from ..records.events import Diagnostic
from ..records.executor import AttemptLogs
from ..records.ids import stable_id
from ..records.notices import EventRouted, Notice, StoreChanged, WorkChanged, WorkSettled
from ..records.results import WorkResult
from ..records.validation import MAX_INT, check_int
from ..records.work import Checkpoint, Execution, ExecutionState, RetryState, Work
from ..store import StorageActor
from ._base import RuntimeBase, lookup

STREAMS = ("stdout", "stderr")
MAX_LOG_TAIL = 16 * 1_048_576
MAX_WAIT_S = 366 * 24 * 3600.0
"""The longest `Runtime.wait_for` may be asked to wait (a year); ``None`` waits without limit."""


WORK = "w:"
EVENT = "e:"


class Waiters:
    """The events of the tasks waiting for a Work's outcome or an Event's checkpoint, by ``w:<work id>``
    and ``e:<event id>``, set by commits (see the module)."""

    def __init__(self, storage: StorageActor) -> None:
        self._by_id: dict[str, set[trio.Event]] = {}
        self._stop: Callable[[], None] | None = storage.on_commit(self._heard)
        self.closed = False

    def add(self, key: str) -> trio.Event:
        event = trio.Event()
        self._by_id.setdefault(key, set()).add(event)
        return event

    def discard(self, key: str, event: trio.Event) -> None:
        events = self._by_id.get(key)
        if events is not None:
            events.discard(event)
            if not events:
                del self._by_id[key]

    def close(self) -> None:
        """The runtime closes: every waiter wakes (and finds the store closed)."""
        self.closed = True
        if self._stop is not None:
            self._stop()
            self._stop = None
        self._wake_all()

    def _wake_all(self, prefix: str = "") -> None:
        for key, events in self._by_id.items():
            if key.startswith(prefix):
                for event in events:
                    event.set()

    def _heard(self, notices: list[Notice]) -> None:
        if not self._by_id:
            return
        for notice in notices:
            if isinstance(notice, WorkChanged | WorkSettled):
                self._wake(WORK + notice.work_id)
            elif isinstance(notice, EventRouted):
                self._wake(EVENT + notice.event_id)
            elif isinstance(notice, StoreChanged):
                if notice.everything:
                    self._wake_all()
                elif notice.routed:
                    self._wake_all(EVENT)  # another node routed Events: it does not say which
                for work_id in notice.settled:
                    self._wake(WORK + work_id)

    def _wake(self, key: str) -> None:
        for event in self._by_id.get(key, ()):
            event.set()


def _deadline(timeout: float | None) -> float:
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout <= MAX_WAIT_S:
        raise InvalidRequest(
            f"timeout must be seconds from 0 to {MAX_WAIT_S:g} (or None: no limit), got {timeout!r}",
            field="timeout",
        )
    return trio.current_time() + timeout


class Results(RuntimeBase):
    async def result(self, work_id: str) -> WorkResult:
        """The Work's outcome as it stands now (see `WorkResult`); `NotFound` for an unknown id."""
        return await self._outcome(await self._known_work(work_id))

    async def wait_for(
        self,
        work_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109  # its answer is loom's own, with the outcome
    ) -> WorkResult:
        """Wait until the Work's outcome is settled (`WorkResult.settled`: terminal, or its retry budget
        spent) and return it; after ``timeout`` seconds (``None``: no limit) raise `WaitTimedOut`, which
        carries the outcome as it stood. It wakes on the commits that change the Work (on a shared
        database, on other nodes' too), and reads nothing in between."""
        deadline = _deadline(timeout)
        lookup("work_id", work_id)
        waiters = self._waiters()
        while True:
            wake = waiters.add(WORK + work_id)
            try:
                current = await self.result(work_id)
                if current.settled:
                    return current
                if waiters.closed:
                    raise StorageClosed("the runtime closed while waiting for the result")
                with trio.move_on_at(deadline):
                    await wake.wait()
            finally:
                waiters.discard(WORK + work_id, wake)
            if trio.current_time() >= deadline:
                current = await self.result(work_id)
                if current.settled:
                    return current
                raise WaitTimedOut(
                    f"work {work_id} is {current.state} after waiting {timeout:g}s: its outcome is not settled",
                    result=current,
                )

    async def wait_routed(
        self,
        event_id: str,
        *,
        timeout: float = 2.0,  # noqa: ASYNC109  # running out of time is an answer (None), not an error
    ) -> Checkpoint | None:
        """The Event's routing checkpoint (which route matched it and what it did), waiting up to
        ``timeout`` seconds for it; ``None``: it is accepted and not routed yet (a router routes it in
        acceptance order). `NotFound` for an unknown Event."""
        deadline = _deadline(timeout)
        lookup("event_id", event_id)
        if await self._p.reader.event(event_id) is None:
            raise NotFound(f"no event with id {event_id!r}")
        waiters = self._waiters()
        while True:
            wake = waiters.add(EVENT + event_id)
            try:
                found = await self._p.reader.checkpoint(event_id)
                if found is not None or trio.current_time() >= deadline or waiters.closed:
                    return found
                with trio.move_on_at(deadline):
                    await wake.wait()
            finally:
                waiters.discard(EVENT + event_id, wake)

    async def latest_diagnostics(self, subject: str, *, limit: int = 20) -> list[Diagnostic]:
        """The latest diagnostics about ``subject`` (a Work: why it cannot start, its failed attempts),
        newest first."""
        lookup("subject", subject)
        check_int("limit", limit, 1, 1000)
        return await self._p.reader.diagnostics_about(subject, limit)

    async def attempt_logs(
        self, work_id: str, attempt: int, *, stream: str | None = None, tail: int = 65_536
    ) -> AttemptLogs:
        """What attempt ``attempt`` of the Work wrote (its ``stdout`` and ``stderr``, or only ``stream``;
        the last ``tail`` bytes of each), as its executor kept it (the `shell` executor keeps them in
        the attempt's directory until their retention passes). `NotFound` when there is no such attempt,
        or its executor keeps no logs, or they are gone."""
        lookup("work_id", work_id)
        check_int("attempt", attempt, 1, MAX_INT)
        check_int("tail", tail, 1, MAX_LOG_TAIL)
        if stream is not None and stream not in STREAMS:
            raise InvalidRequest(
                f"stream must be one of {', '.join(STREAMS)}, got {stream!r}", field="stream"
            )
        if await self._p.reader.work(work_id) is None:
            raise NotFound(f"no work with id {work_id!r}")
        execution = await self._p.reader.execution(stable_id("ex", work_id, str(attempt)))
        if execution is None:
            raise NotFound(f"work {work_id} has no attempt {attempt}")
        executor = self._p.extensions.executors.get(execution.executor or "")
        read = getattr(executor, "logs", None)
        if read is None:
            raise NotFound(
                f"attempt {attempt} of work {work_id} ran under executor {execution.executor!r}, "
                "which keeps no logs of its attempts"
            )
        found = await read(execution.id, dict(execution.metadata or {}), tail=tail)
        logs = {name: str(text) for name, text in dict(found).items() if stream is None or name == stream}
        return AttemptLogs(
            work_id=work_id,
            attempt=attempt,
            execution_id=execution.id,
            executor=execution.executor,
            logs=logs,
        )

    def _waiters(self) -> Waiters:
        waiters = self._p.waiters
        if not isinstance(waiters, Waiters):
            waiters = self._p.waiters = Waiters(self._p.storage)
        return waiters

    async def _outcome(self, work: Work) -> WorkResult:
        last = await self._last_ended(work)
        outcome = dict(last.outcome or {}) if last is not None else {}
        next_retry = None
        if work.retry is RetryState.BACKOFF and work.attempts:
            timer = await self._p.reader.timer(retry_timer_id(work.id, work.attempts))
            next_retry = timer.fire_at_ms if timer is not None else None
        error = outcome.get("error") if last is not None and last.state is ExecutionState.FAILED else None
        return WorkResult(
            work_id=work.id,
            state=work.state,
            done=work.state.terminal,
            settled=work.state.terminal or work.retry is RetryState.EXHAUSTED,
            value=outcome.get("value")
            if last is not None and last.state is ExecutionState.COMPLETED
            else None,
            error=str(error) if error is not None else None,
            attempts=work.attempts,
            failures=work.failures,
            retry=work.retry,
            next_retry_at_ms=next_retry,
            held=work.held,
            hold_reason=work.hold_reason,
            execution_id=last.id if last is not None else None,
            ended_at_ms=last.ended_at_ms if last is not None else None,
        )

    async def _last_ended(self, work: Work) -> Execution | None:
        """The latest attempt that ended: the last one, or the one before it while the last runs."""
        for attempt in (work.attempts, work.attempts - 1):
            if attempt < 1:
                return None
            execution = await self._p.reader.execution(stable_id("ex", work.id, str(attempt)))
            if execution is not None and execution.state.terminal:
                return execution
        return None
