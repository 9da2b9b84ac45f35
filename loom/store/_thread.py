"""The storage actor's worker thread: one thread, started with the actor and kept for its life, that
runs the actor's blocking calls (open, each batch, close) one at a time.

Each call is one hand-off each way: the job goes on a queue the thread waits on, and the thread gives
the result back through the trio token (`trio.lowlevel.TrioToken.run_sync_soon`), which wakes the
waiting task. ``trio.to_thread.run_sync`` does the same with more on the way: a thread taken from its
cache for every call, the thread's name set and reset, a capacity limiter, the context copied
(bench/README.md, "The storage thread", has the figures). A call cannot be abandoned: a cancel that
arrives meanwhile is delivered once the call is over, as ``abandon_on_cancel=False`` would.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

R = TypeVar("R")

_Job = tuple[Callable[..., Any], tuple[Any, ...], trio.lowlevel.Task, trio.lowlevel.TrioToken]


class WorkerThread:
    """A thread of its own for blocking calls made one at a time (the storage actor's)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy = False

    async def run_sync(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn(*args)`` in the thread and return (or raise) what it did."""
        if self._busy:
            raise RuntimeError(f"{self._name}: one call at a time")  # the actor's own invariant
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._thread.start()
        self._busy = True
        try:
            self._jobs.put((fn, args, trio.lowlevel.current_task(), trio.lowlevel.current_trio_token()))
            result: R = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        finally:
            self._busy = False
        return result

    def stop(self) -> None:
        """Let the thread end once its current call (if any) is over; a later call starts a new one."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, task, token = job
            result = outcome.capture(fn, *args)
            del fn, args, job
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task, result)
            except trio.RunFinishedError:  # pragma: no cover - the run ended with the call in flight
                return
