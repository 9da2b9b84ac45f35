"""What the storage actor tells after each commit: the notice feeds of watchers and actors, and the
listeners it calls at once (see `StorageActor.feed` and `StorageActor.on_commit`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import trio

from ..records.notices import Committed, Lagged, Notice, StoreChanged
from ._notify import parse

log = logging.getLogger("loom.storage")

CommitListener = Callable[[list[Notice]], None]
"""Called with each committed batch's notices (and each `StoreChanged` heard from another node), at
once, in the storage actor's task: it must not block (it sets events, counts, logs)."""


@attrs.define(eq=False)
class NoticeFeed:
    """One subscriber's view of commit notices.

    Notices are hints; durable state is the truth. A subscriber that falls more than
    ``capacity`` batches behind gets `Lagged` and must resynchronise from the store. With
    ``commits``, every committed batch ends with a `Committed` notice, even one with nothing else.
    With ``wants``, a batch is offered only if it holds a notice of one of these types (a
    `StoreChanged` always is, and `Lagged` always comes): a subscriber that reads a few kinds is not
    woken by every commit. With ``concerns``, a batch is offered only if ``concerns(notices)`` is true,
    or batches offered earlier wait unread: what the subscriber learns from those may make this one
    concern it, and ``concerns`` answers from what it knows now (it runs in the storage actor's task at
    each commit, so it must be quick and must not block).
    """

    _send: trio.MemorySendChannel[list[Notice]]
    _receive: trio.MemoryReceiveChannel[list[Notice]]
    commits: bool = False
    wants: tuple[type[Notice], ...] | None = None
    concerns: Callable[[list[Notice]], bool] | None = None
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


class Notices:
    """The storage actor's telling side: the feeds it offers each committed batch's notices (and what
    other nodes committed), and the listeners it calls at once."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        """This actor's name in the payloads it sends other nodes (they ignore their own)."""
        self._feeds: list[NoticeFeed] = []
        self._listeners: list[CommitListener] = []

    def feed(
        self,
        capacity: int = 1024,
        *,
        commits: bool = False,
        wants: tuple[type[Notice], ...] | None = None,
        concerns: Callable[[list[Notice]], bool] | None = None,
    ) -> NoticeFeed:
        """Subscribe to commit notices (see `NoticeFeed`); `unsubscribe` when done."""
        send, receive = trio.open_memory_channel[list[Notice]](capacity)
        feed = NoticeFeed(
            send,
            receive,
            commits=commits,
            wants=None if wants is None else (*wants, StoreChanged),
            concerns=concerns,
        )
        self._feeds.append(feed)
        return feed

    def unsubscribe(self, feed: NoticeFeed) -> None:
        if feed in self._feeds:
            self._feeds.remove(feed)
        feed.close()

    def on_commit(self, listener: CommitListener) -> Callable[[], None]:
        """Call ``listener`` with every batch's notices from now on (see `CommitListener`); returns the
        function that stops it."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def announce(self, notice: StoreChanged) -> None:
        """Hand every feed what another node committed (or, with ``everything``, a call to look at the
        store again from its cursors). A feed with notices still unread skips a check: its reader is
        busy and will look anyway, and checks must not pile up."""
        for feed in list(self._feeds):
            if not (notice.check and feed.pending):
                feed._offer([notice])
        self._tell([notice])

    def _heard(self, payload: str | None) -> None:
        notice = StoreChanged(everything=True) if payload is None else parse(payload, self.origin)
        if notice is not None:
            self.announce(notice)

    def _committed(self, notices: list[Notice], committed: Committed) -> None:
        """Tell what a batch committed: its notices to every listener and feed, and ``committed`` after
        them to each feed that asked for every commit."""
        if notices:
            self._tell(notices)
        with_commit = [*notices, committed]
        for feed in list(self._feeds):
            if feed.commits:
                feed._offer(with_commit)
            elif (
                notices
                and (feed.wants is None or any(isinstance(n, feed.wants) for n in notices))
                and (feed.concerns is None or feed.pending or feed.concerns(notices))
            ):
                feed._offer(notices)

    def _tell(self, notices: list[Notice]) -> None:
        for listener in list(self._listeners):
            try:
                listener(notices)
            except Exception:
                log.exception("a commit listener failed; it is dropped")
                self._listeners.remove(listener)

    def _close_feeds(self) -> None:
        for feed in self._feeds:
            feed.close()
        self._feeds.clear()
