"""The storage actor's worker thread: one thread, started with the actor and kept for its life, that
runs the actor's blocking calls (open, each batch, close) one at a time.

Each call is one hand-off each way: the job goes on a queue the thread waits on, and the thread writes
one byte to a socket pair whose other end the waiting task reads (``trio.lowlevel.wait_readable``).
That wakes the task itself in the loop's next pass. Answering through the run's `TrioToken`
(``run_sync_soon``) costs a pass more: the token's own wakeup socket wakes trio's entry-queue task,
which then reschedules the waiting one (bench/README.md, "The storage thread", has the figures).
``trio.to_thread.run_sync`` does that and more on the way: a thread taken from its cache for every call,
the thread's name set and reset, a capacity limiter, the context copied. A call cannot be abandoned: a
cancel that arrives meanwhile is delivered once the call is over, as ``abandon_on_cancel=False`` would.
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import outcome
import trio

R = TypeVar("R")

_Job = tuple[Callable[..., Any], tuple[Any, ...]]


class WorkerThread:
    """A thread of its own for blocking calls made one at a time (the storage actor's)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._busy = False
        self._result: outcome.Outcome[Any] | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        """The socket pair the thread answers through: it writes a byte to the first when a call is
        over, the waiting task reads it from the second. Made with the thread, closed by `stop`."""

    async def run_sync(
        self, fn: Callable[..., R], *args: Any, interrupt: Callable[[], object] | None = None
    ) -> R:
        """Run ``fn(*args)`` in the thread and return (or raise) what it did.

        With ``interrupt``, a cancel that arrives meanwhile calls it (from this thread: it must make the
        call end soon), waits for the call to end all the same, and is raised then, whatever the call
        did; without, the call's result is returned and the cancel is delivered at the next checkpoint."""
        if self._busy:
            raise RuntimeError(f"{self._name}: one call at a time")  # the actor's own invariant
        if self._thread is None:
            self._start()
        assert self._wake is not None
        reader = self._wake[1]
        self._busy = True
        cancelled: trio.Cancelled | None = None
        try:
            self._jobs.put((fn, args))
            answered = False
            if interrupt is not None:
                try:
                    await self._answered(reader)
                    answered = True
                except trio.Cancelled as exc:
                    cancelled = exc
                    interrupt()
            if not answered:
                # the call is never abandoned: a cancel waits for it
                with trio.CancelScope(shield=True):
                    await self._answered(reader)
            result, self._result = self._result, None
        finally:
            self._busy = False
            if self._thread is None:  # stopped meanwhile: its answer has come
                self._close_wake()
        if cancelled is not None:
            raise cancelled
        assert result is not None
        return result.unwrap()  # type: ignore[no-any-return]

    @staticmethod
    async def _answered(reader: socket.socket) -> None:
        """Wait for the thread's byte saying its call is over."""
        while True:
            await trio.lowlevel.wait_readable(reader)
            try:
                if reader.recv(16):
                    return
            except BlockingIOError:  # pragma: no cover - woken with nothing to read
                continue

    def stop(self) -> None:
        """Let the thread end once its current call (if any) is over; a later call starts a new one."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None
            # the next thread's own queue: the ended one may not have read its stop yet
            self._jobs = queue.SimpleQueue()
            if not self._busy:  # else once the call in flight has answered
                self._close_wake()

    def _close_wake(self) -> None:
        if self._wake is not None:
            for end in self._wake:
                end.close()  # the thread writes through a duplicate of its own
            self._wake = None

    def _start(self) -> None:
        writer, reader = socket.socketpair()
        writer.setblocking(False)
        reader.setblocking(False)
        self._wake = (writer, reader)
        self._thread = threading.Thread(
            target=self._work, args=(self._jobs, writer.dup()), name=self._name, daemon=True
        )
        self._thread.start()

    def _work(self, jobs: queue.SimpleQueue[_Job | None], writer: socket.socket) -> None:
        with writer:
            while (job := jobs.get()) is not None:
                fn, args = job
                self._result = outcome.capture(fn, *args)
                del fn, args, job
                writer.send(b"\0")
