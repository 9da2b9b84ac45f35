"""`Watch`: committed notices as an async iterator (see `Runtime.watch`)."""

from __future__ import annotations

from collections import deque
from types import TracebackType

import trio

from ..records.notices import Notice
from ..store import StorageActor


class Watch:
    """Every notice of every batch committed after it was opened, in commit order; each batch ends
    with `Committed`, and `Lagged` says this watcher fell behind and should reread the store.

    Use ``async with rt.watch() as notices: async for notice in notices: ...``; leaving the block (or
    `aclose`) unsubscribes. Iteration ends when the runtime closes.
    """

    def __init__(self, storage: StorageActor, capacity: int) -> None:
        self._storage = storage
        self._feed = storage.feed(capacity, commits=True)
        self._buffer: deque[Notice] = deque()
        self._closed = False

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Notice:
        while not self._buffer:
            if self._closed:
                raise StopAsyncIteration
            try:
                batch = await self._feed.next_batch()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                self._closed = True
                raise StopAsyncIteration from None
            self._buffer.extend(batch)
        return self._buffer.popleft()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop watching (idempotent)."""
        if not self._closed:
            self._closed = True
            self._storage.unsubscribe(self._feed)
        await trio.lowlevel.checkpoint()
