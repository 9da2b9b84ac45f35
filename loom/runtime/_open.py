"""`open_runtime`: open the store, start the chosen actors in one nursery, and yield the `Runtime`.

Supervision: a storage failure or an invariant violation inside an actor cancels the nursery (fail
fast); durable state means a restart loses nothing.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from ..actors.ingress import IngressActor
from ..config import Config, ConfigHolder
from ..kernel.admission import settle_in_tx
from ..kernel.executions import TRIGGER_SELECTORS
from ..kernel.recovery import release_dead_leases_in_tx, release_incarnations_in_tx, release_leases_in_tx
from ..plugins import make_plugin_manager
from ..plugins.registry import Extensions, LiveCapabilities
from ..records.clock import Clock, SystemClock
from ..records.errors import InvalidRequest, StorageClosed, StorageError
from ..records.notices import AttemptFailed, Notice
from ..records.validation import MAX_LEASE_MS, check_int, check_text
from ..store import (
    ActorReader,
    CrashPoint,
    FaultHook,
    Reader,
    SQLiteStore,
    StorageActor,
    Store,
    as_store,
    default_owner,
    open_reader,
)
from ._base import DEFAULT_LEASE_MS, Parts
from ._runtime import ACTORS, Runtime

DEFAULT_RESYNC_MS = 1000


@asynccontextmanager
async def unwrapped() -> AsyncIterator[None]:
    """Let a lone exception out of the nurseries as itself: the caller's own exception from the block,
    or the one failure that stopped the runtime, is caught as what it is, not inside an
    `ExceptionGroup` (which is kept when more than one exception happened)."""
    try:
        yield
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        # the store's failure (a crash point, a storage error) is what stopped the runtime: the actors'
        # closed feeds and refused requests that follow it are its consequences, not news
        causes = [leaf for leaf in leaves if not isinstance(leaf, _CONSEQUENCES)]
        if len(causes) == 1 and isinstance(causes[0], CrashPoint | StorageError):
            raise causes[0] from None
        raise


_CONSEQUENCES = (StorageClosed, trio.EndOfChannel, trio.Cancelled)
"""What the actors raise once the storage actor has stopped."""


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return out


StoreLike = str | os.PathLike[str] | SQLiteStore | Store


@asynccontextmanager
async def open_runtime(
    store: StoreLike = "loom.db",
    *,
    clock: Clock | None = None,
    config: Config | None = None,
    plugins: Iterable[object] = (),
    load_entry_points: bool = True,
    actors: Iterable[str] = ACTORS,
    fault: FaultHook | None = None,
    owner: str | None = None,
    lease_ms: int = DEFAULT_LEASE_MS,
    resync_ms: int = DEFAULT_RESYNC_MS,
    node: str | None = None,
) -> AsyncIterator[Runtime]:
    """Open the store, start the ``actors`` (by default all of them: see `ACTORS`),
    and yield the `Runtime` handle.

    With ``actors=()`` nothing runs in the background: the host drives the runtime through the bounded
    host calls (`Runtime.poll`, `Runtime.claim`, ...), or starts actors in its own nursery with
    `Runtime.run_actor`. Leaving the block stops every actor; the store is closed on the way out.

    An exception raised in the block, or the one failure that stopped the runtime (a store that
    cannot be opened: `StorageError`), leaves as itself; an `ExceptionGroup` only when several
    happened together. A failure or cancel while the runtime opens ends the open, every part of it
    closed; a location no store can have (a path holding a NUL character) is refused before
    anything is opened (`InvalidRequest`).

    ``owner`` names the leases this runtime holds (default: ``loom`` alone on its database, a name of
    its own process on a shared one: see `loom.store.default_owner`).

    A restart recovers the attempts its killed predecessor left at once, not a lease length later: on
    a SQLite file always (its lock proves that process dead); on a shared database when both run as the
    same ``node``, a name only one live process may hold (`NodeInUse` otherwise): its leases are then
    held as ``<node>#<incarnation>``, and an open expires those of the node's earlier incarnations.

    On a database several runtimes share (PostgreSQL), each is a node: each commit tells the others
    what it changed (LISTEN/NOTIFY), so they hear of each other's Events, timers, ready Work and leases
    at once and read just that from their cursors; every ``resync_ms`` of the clock's time the actors
    also look from their cursors for anything a notification could not carry (a node that stopped in
    the middle). See docs/backends.md.
    """
    if config is not None and not isinstance(config, Config):
        raise InvalidRequest(f"config must be a Config, got {type(config).__name__}")
    if clock is not None and not isinstance(clock, Clock):
        raise InvalidRequest(f"clock must be a Clock, got {type(clock).__name__}")
    if owner is not None:
        check_text("owner", owner)
    if node is not None:
        check_text("node", node)
        if "#" in node:
            raise InvalidRequest(f"node must not hold '#', got {node!r}", field="node")
    check_int("lease_ms", lease_ms, 1, MAX_LEASE_MS)
    check_int("resync_ms", resync_ms, 1, MAX_LEASE_MS)
    if isinstance(actors, str | bytes):
        raise InvalidRequest(
            f"actors must be a list of actor names, got the string {actors!r}", field="actors"
        )
    chosen = tuple(dict.fromkeys(actors))
    unknown = [name for name in chosen if name not in ACTORS]
    if unknown:
        raise InvalidRequest(f"unknown actor {unknown[0]!r}; expected some of: {', '.join(ACTORS)}")
    # a path opens with the configuration's [store] level (a store object keeps its own)
    opened = as_store(store, synchronous=(config or Config()).store.synchronous.value)
    incarnation = node is not None and opened.dialect.shared and owner is None
    if owner is None:
        owner = f"{node}#{secrets.token_hex(6)}" if incarnation else node or default_owner(opened)
    clock = clock if clock is not None else SystemClock()
    pm = make_plugin_manager(plugins, load_entry_points=load_entry_points)
    extensions = Extensions.of(pm)
    holder = ConfigHolder(
        config if config is not None else Config(),
        executors=LiveCapabilities(extensions.executors),
        handlers=frozenset(extensions.handlers),
        work_kinds=frozenset(extensions.work_kinds),
        triggers=frozenset(TRIGGER_SELECTORS),
        kinds=extensions.work_kinds,
        standing_handlers=extensions.standing_handlers(),
    )
    readers: list[Reader] = []
    held: list[Any] = []
    try:
        if incarnation:
            assert node is not None
            held.append(await trio.to_thread.run_sync(opened.take_node, node))  # type: ignore[attr-defined]
        async with unwrapped(), trio.open_nursery() as nursery:
            # the storage actor outlives an outer cancellation until the leases are released
            storage_scope = trio.CancelScope()
            try:
                storage: StorageActor = await nursery.start(
                    _shielded,
                    StorageActor(
                        opened,
                        clock,
                        fault=fault,
                        settle=settle_in_tx,
                        check_ms=resync_ms,
                        on_open=_dead_leases(opened, node if incarnation else None, owner),
                    ).run,
                    storage_scope,
                )
            except BaseException:
                # cancelled just as the actor started (and was shielded): it ends with the open
                storage_scope.cancel()
                raise
            try:  # from here on, whatever fails (or is cancelled) also ends the shielded storage actor
                storage.on_commit(_log_failures)
                reader = open_reader(opened, storage)
                await reader.open()  # (a reader that fails to open leaves nothing to close)
                readers.append(reader)
                unlaunched: dict[str, int] = {}
                try:
                    parts = Parts(
                        storage=storage,
                        reader=reader,
                        actor_reader=ActorReader(storage),
                        clock=clock,
                        holder=holder,
                        plugins=pm,
                        extensions=extensions,
                        ingress=IngressActor(storage, lambda: holder.current.causal),
                        owner=owner,
                        lease_ms=lease_ms,
                        unlaunched=unlaunched,
                    )
                    runtime = Runtime(parts)
                    async with trio.open_nursery() as actors_nursery:
                        for name in chosen:
                            await actors_nursery.start(runtime.run_actor, name)
                        try:
                            yield runtime
                        finally:
                            actors_nursery.cancel_scope.cancel()
                            if parts.waiters is not None:
                                parts.waiters.close()
                finally:
                    # every actor (and the attempts it ran) has stopped: nothing renews these leases now
                    await _release_leases(storage, owner, unlaunched)
            finally:
                storage_scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        # readers close after every actor has stopped using them
        with trio.CancelScope(shield=True):
            for reader in readers:
                await reader.aclose()
            for connection in held:  # the node name goes with its runtime
                await trio.to_thread.run_sync(opened.release_node, connection, node)  # type: ignore[attr-defined]


def _dead_leases(store: Store, node: str | None, owner: str) -> Callable[[Any, int], object] | None:
    """What an open does first: a SQLite file's lock is this process's alone, so whoever held a lease
    before is dead, and its attempts are recovered now (adopted, relaunched, or failed), not a lease
    length later. On a shared database a lease may be another live node's: only this node's earlier
    incarnations' leases (it holds the node name: they are dead) expire now; the rest wait."""
    if store.in_memory:
        return None
    if store.dialect.shared:
        return partial(release_incarnations_in_tx, node=node, owner=owner) if node is not None else None
    return release_dead_leases_in_tx


attempts_log = logging.getLogger("loom.attempts")
MAX_LOGGED_ERROR = 2000


def _log_failures(notices: list[Notice]) -> None:
    """Every failed attempt is logged once, by the node that committed its failure: its Work, attempt,
    error and what follows (when it is retried, or that it is held)."""
    for notice in notices:
        if isinstance(notice, AttemptFailed):
            error = notice.error
            if len(error) > MAX_LOGGED_ERROR:
                error = error[: MAX_LOGGED_ERROR - 3] + "..."
            attempts_log.warning(
                "work %s: attempt %d (%s) failed: %s; %s",
                notice.work_id,
                notice.attempt,
                notice.execution_id,
                error,
                notice.then,
            )


async def _shielded(
    run: Callable[..., Awaitable[None]], scope: trio.CancelScope, *, task_status: trio.TaskStatus[Any]
) -> None:
    """Run the storage actor in ``scope``, shielded from the moment it has started (so it outlives an
    outer cancellation until the leases are released), not before: an open cancelled while the store
    opens ends with the actor. (Shielded from the first, an actor whose starter was cancelled would
    serve for ever: trio does not move a task that starts under a cancelled starter, and the open
    would wait for it.)"""
    with scope:
        await run(task_status=_ShieldOnStart(task_status, scope))


class _ShieldOnStart:
    """The storage actor's task status: shields its scope as it reports started, unless its starter was
    cancelled meanwhile (its next checkpoint then ends it)."""

    def __init__(self, status: trio.TaskStatus[Any], scope: trio.CancelScope) -> None:
        self._status = status
        self._scope = scope

    def started(self, value: Any = None) -> None:
        if trio.current_effective_deadline() != -math.inf:  # (-inf: the starter was cancelled)
            self._scope.shield = True
        self._status.started(value)


async def _release_leases(storage: StorageActor, owner: str, unlaunched: dict[str, int]) -> None:
    """Closing releases the leases this runtime holds: the attempts it was running are recovered at
    once (through their executors: adopted or failed into retry) by the next open, not a lease length
    later, and those it claimed and never handed to their executor (``unlaunched``) are relaunched
    as never handed. After a storage failure the store is gone, and the leases expire by themselves."""
    with trio.move_on_after(5), trio.CancelScope(shield=True):
        try:
            await storage.submit(release_leases_in_tx, owner, dict(unlaunched))
        except StorageError:
            pass  # the store is gone: the leases expire by themselves
