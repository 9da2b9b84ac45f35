"""What the storage actor tells after each commit: the notice feeds of watchers and actors, and the
listeners it calls at once (see `StorageActor.feed` and `StorageActor.on_commit`)."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from ..records.notices import Lagged, Notice

CommitListener = Callable[[list[Notice]], None]
"""Called with each committed batch's notices (and each `StoreChanged` heard from another node), at
once, in the storage actor's task: it must not block (it sets events, counts, logs)."""


@attrs.define(eq=False)
class NoticeFeed:
    """One subscriber's view of commit notices.

    Notices are hints; durable state is the truth. A subscriber that falls more than
    ``capacity`` batches behind gets `Lagged` and must resynchronise from the store. With
    ``commits``, every committed batch ends with a `Committed` notice, even one with nothing else.
    """

    _send: trio.MemorySendChannel[list[Notice]]
    _receive: trio.MemoryReceiveChannel[list[Notice]]
    commits: bool = False
    lagged: bool = False
    _buffered: int = 0
    """Batches offered and not yet read (what the channel holds; cheaper than asking it)."""

    async def next_batch(self) -> list[Notice]:
        """The notices of the next committed batch (``[Lagged()]``: you missed some, rescan)."""
        if self.lagged:
            self.lagged = False
            return [Lagged()]
        notices = await self._receive.receive()
        self._buffered -= 1
        return notices

    @property
    def pending(self) -> bool:
        """Whether committed notices wait to be read."""
        return self.lagged or self._buffered > 0

    def _offer(self, notices: list[Notice]) -> None:
        try:
            self._send.send_nowait(notices)
        except trio.WouldBlock:
            self.lagged = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        else:
            self._buffered += 1

    def close(self) -> None:
        self._send.close()
        self._receive.close()
