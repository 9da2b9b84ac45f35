"""`open_runtime`: the actors composed in one nursery, and the `Runtime` handle.

The handle's methods are the public, trusted host API. An actor crash cancels the
nursery (fail fast); durable state means a restart loses nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import pluggy
import trio

from ._clock import Clock, SystemClock
from ._config import Config
from ._errors import InvalidRequest, NotFound
from ._records import CausalRejection, Event, EventIn, KVEntry
from ._serde import structure
from .actors.ingress import IngressActor
from .kernel.causal import REJECTIONS_NAMESPACE
from .plugins import make_plugin_manager
from .store import ActorReader, FaultHook, Reader, SQLiteStore, StorageActor

StoreLike = str | SQLiteStore


def as_store(store: StoreLike) -> SQLiteStore:
    if isinstance(store, SQLiteStore):
        return store
    if isinstance(store, str) and store:
        return SQLiteStore(path=store)
    raise InvalidRequest(f"store must be a path, ':memory:' or a SQLiteStore, got {store!r}")


class Runtime:
    """The trusted host API over a running set of actors."""

    def __init__(
        self,
        *,
        storage: StorageActor,
        reader: Reader | ActorReader,
        ingress: IngressActor,
        clock: Clock,
        config: Config,
        plugins: pluggy.PluginManager,
    ) -> None:
        self.storage = storage
        self._reader = reader
        self._ingress = ingress
        self.clock = clock
        self.config = config
        self.plugins = plugins

    # -- acceptance -------------------------------------------------------

    async def publish(self, event: EventIn) -> Event:
        """Durably accept an external root Event; a duplicate returns the original, marked."""
        return await self._ingress.publish(event)

    async def publish_derived(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        """Accept an Event derived from ``parent_id`` under the causal bounds (trusted host call).

        Raises `CausalRefused` (after committing its diagnostic) when the bounds refuse it.
        """
        return await self._ingress.publish_derived(event, parent_id=parent_id, cause_id=cause_id)

    # -- reads ------------------------------------------------------------

    async def event(self, event_id: str) -> Event:
        found = await self._reader.event(event_id)
        if found is None:
            raise NotFound(f"no event with id {event_id!r}")
        return found

    async def event_by_delivery(self, source: str, delivery_id: str) -> Event:
        found = await self._reader.event_by_delivery(source, delivery_id)
        if found is None:
            raise NotFound(f"no event from source {source!r} with delivery id {delivery_id!r}")
        return found

    async def events(
        self, *, after_seq: int = 0, limit: int = 1000, root_id: str | None = None
    ) -> list[Event]:
        """Accepted Events in sequence order (optionally those of one causal root)."""
        if limit < 1 or limit > 100_000:
            raise InvalidRequest(f"limit must be from 1 to 100000, got {limit}")
        if root_id is not None:
            return await self._reader.events_of_root(root_id, after_seq, limit)
        return await self._reader.events_after(after_seq, limit)

    async def kv(self, namespace: str, *, limit: int = 1000) -> list[KVEntry]:
        return await self._reader.kv_list(namespace, limit)

    async def causal_rejections(self, *, limit: int = 1000) -> list[CausalRejection]:
        """The durable, redacted diagnostics of causal refusals."""
        entries = await self._reader.kv_list(REJECTIONS_NAMESPACE, limit)
        return [structure(entry.value, CausalRejection) for entry in entries]


@asynccontextmanager
async def open_runtime(
    store: StoreLike = "loom.db",
    *,
    clock: Clock | None = None,
    config: Config | None = None,
    plugins: Iterable[object] = (),
    load_entry_points: bool = True,
    fault: FaultHook | None = None,
) -> AsyncIterator[Runtime]:
    """Open the store, start the actors, and yield the `Runtime` handle.

    Leaving the block stops every actor; the store is closed on the way out.
    """
    sqlite_store = as_store(store)
    clock = clock if clock is not None else SystemClock()
    config = config if config is not None else Config()
    pm = make_plugin_manager(plugins, load_entry_points=load_entry_points)
    async with trio.open_nursery() as nursery:
        storage: StorageActor = await nursery.start(StorageActor(sqlite_store, clock, fault=fault).run)
        reader: Reader | ActorReader
        reader = ActorReader(storage) if sqlite_store.in_memory else Reader(sqlite_store.reader_uri())
        await reader.open()
        try:
            ingress: IngressActor = await nursery.start(IngressActor(storage, config.causal).run)
            yield Runtime(
                storage=storage, reader=reader, ingress=ingress, clock=clock, config=config, plugins=pm
            )
        finally:
            with trio.CancelScope(shield=True):
                await reader.aclose()
            nursery.cancel_scope.cancel()
