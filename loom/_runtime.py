"""`open_runtime`: the actors composed in one nursery, and the `Runtime` handle.

The handle's methods are the public, trusted host API. An actor crash cancels the
nursery (fail fast); durable state means a restart loses nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pluggy
import trio

from ._clock import Clock, SystemClock
from ._config import Config, ConfigHolder
from ._errors import InvalidRequest, NotFound
from ._records import CausalRejection, Diagnostic, Event, EventIn, KVEntry
from ._serde import structure
from ._timers import FireRequest, Firing, Timer, TimerSpec, TimerState
from ._work import Checkpoint, Execution, Intent, Lease, Outcome, Work, WorkState
from .actors.ingress import IngressActor
from .actors.router import RouterPool, merged
from .actors.timer_service import TimerService
from .actors.timers import TimerActor
from .actors.toolbelt import RuntimeToolbelt
from .kernel.causal import REJECTIONS_NAMESPACE
from .kernel.executions import (
    TRIGGER_SELECTORS,
    Authority,
    BindingRef,
    ClaimRequest,
    cancel_in_tx,
    claim_in_tx,
    complete_in_tx,
    hold_in_tx,
    kind_policy,
    manual_interrupt_in_tx,
    release_in_tx,
    renew_in_tx,
)
from .kernel.timers import arm_in_tx, cancel_timer_in_tx, due_in_tx, fire_timer_in_tx, fire_timers_in_tx
from .plugins import make_plugin_manager
from .store import ActorReader, FaultHook, Reader, SQLiteStore, StorageActor, Tx

StoreLike = str | SQLiteStore

DEFAULT_LEASE_MS = 60_000


def as_store(store: StoreLike) -> SQLiteStore:
    if isinstance(store, SQLiteStore):
        return store
    if isinstance(store, str) and store:
        return SQLiteStore(path=store)
    raise InvalidRequest(f"store must be a path, ':memory:' or a SQLiteStore, got {store!r}")


@attrs.frozen(kw_only=True)
class WorkHistory:
    """A Work with its routing checkpoints and attempts, in order."""

    work: Work
    checkpoints: tuple[Checkpoint, ...]
    executions: tuple[Execution, ...]


class Runtime:
    """The trusted host API over a running set of actors."""

    def __init__(
        self,
        *,
        storage: StorageActor,
        reader: Reader,
        ingress: IngressActor,
        router: RouterPool,
        timers: TimerActor,
        clock: Clock,
        config: ConfigHolder,
        plugins: pluggy.PluginManager,
    ) -> None:
        self.storage = storage
        self._reader = reader
        self._ingress = ingress
        self.router = router
        self.timer_actor = timers
        self.clock = clock
        self._config = config
        self.plugins = plugins

    @property
    def config(self) -> Config:
        return self._config.current

    def reload(self, config: Config) -> Config:
        """Validate ``config`` against the plugins and make it the next generation.

        A refused config raises `ConfigError` naming file, key and reason; the old
        generation stays in force.
        """
        return self._config.replace(config)

    # -- acceptance -----------------------------------------------------------------

    async def publish(self, event: EventIn) -> Event:
        """Durably accept an external root Event; a duplicate returns the original, marked."""
        return await self._ingress.publish(event)

    async def publish_derived(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        """Accept an Event derived from ``parent_id`` under the causal bounds (trusted host call).

        Raises `CausalRefused` (after committing its diagnostic) when the bounds refuse it.
        """
        return await self._ingress.publish_derived(event, parent_id=parent_id, cause_id=cause_id)

    # -- reads ----------------------------------------------------------------------

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
        _check_limit(limit)
        if root_id is not None:
            return await self._reader.events_of_root(root_id, after_seq, limit)
        return await self._reader.events_after(after_seq, limit)

    async def checkpoint(self, event_id: str) -> Checkpoint | None:
        """The Event's routing checkpoint (``None``: not routed yet)."""
        await self.event(event_id)
        return await self._reader.checkpoint(event_id)

    async def work(self, work_id: str) -> Work:
        found = await self._reader.work(work_id)
        if found is None:
            raise NotFound(f"no work with id {work_id!r}")
        return found

    async def work_for_key(self, key: str) -> Work:
        owner = await self._reader.key_owner(key)
        if owner is None:
            raise NotFound(f"no work owns key {key!r}")
        return await self.work(owner)

    async def works(
        self, *, state: WorkState | None = None, after_id: str = "", limit: int = 100
    ) -> list[Work]:
        _check_limit(limit)
        return await self._reader.works(state=state.value if state else None, after_id=after_id, limit=limit)

    async def history(self, work_id: str) -> WorkHistory:
        work = await self.work(work_id)
        return WorkHistory(
            work=work,
            checkpoints=tuple(await self._reader.checkpoints_of_work(work_id)),
            executions=tuple(await self._reader.executions_of_work(work_id)),
        )

    async def execution(self, execution_id: str) -> Execution:
        found = await self._reader.execution(execution_id)
        if found is None:
            raise NotFound(f"no execution with id {execution_id!r}")
        return found

    async def intents(self, execution_id: str) -> list[Intent]:
        return await self._reader.intents_of_execution(execution_id)

    async def diagnostics(
        self, *, kind: str | None = None, subject: str | None = None, limit: int = 1000
    ) -> list[Diagnostic]:
        _check_limit(limit)
        return await self._reader.diagnostics(kind, subject, limit)

    async def kv(self, namespace: str, *, limit: int = 1000) -> list[KVEntry]:
        return await self._reader.kv_list(namespace, limit)

    async def causal_rejections(self, *, limit: int = 1000) -> list[CausalRejection]:
        """The durable, redacted diagnostics of causal refusals."""
        entries = await self._reader.kv_list(REJECTIONS_NAMESPACE, limit)
        return [structure(entry.value, CausalRejection) for entry in entries]

    # -- executions (for hosts that run their own executors, and tests) --------------

    async def claim(
        self, work_id: str, *, owner: str, lease_ms: int = DEFAULT_LEASE_MS, binding: BindingRef | None = None
    ) -> Lease:
        """Start the Work's next attempt under a fresh lease (scope capacity applies)."""
        config = self.config
        work = await self.work(work_id)
        if binding is None:
            binding = await self.router.binding_for(work, config) or BindingRef(name=None, executor=None)
        capacity = config.scopes[work.scope].capacity if work.scope in config.scopes else None
        request = ClaimRequest(
            work_id=work_id, owner=owner, token=secrets.token_urlsafe(24), lease_ms=lease_ms, binding=binding,
            kind=(kind := kind_policy(config, work.kind)), capacity=capacity,
            generation=config.generation, timeout_ms=kind.timeout_ms,
        )  # fmt: skip
        return await self.storage.submit(claim_in_tx, request)

    async def renew(self, lease: Lease, *, lease_ms: int = DEFAULT_LEASE_MS) -> Lease:
        expires = await self.storage.submit(renew_in_tx, Authority.of(lease), lease_ms)
        return attrs.evolve(lease, expires_at_ms=expires)

    async def complete(self, lease: Lease, outcome: Outcome) -> Execution:
        """Commit an attempt's outcome under its fence (`StaleAuthority` if the lease is stale)."""
        kind = kind_policy(self.config, lease.request.kind)
        return await self.storage.submit(complete_in_tx, Authority.of(lease), outcome, kind)

    def toolbelt(self, lease: Lease, *, lease_ms: int = DEFAULT_LEASE_MS) -> RuntimeToolbelt:
        config = self.config
        return RuntimeToolbelt(
            self.storage, lease, limits=config.causal, generation=config.generation, lease_ms=lease_ms
        )

    # -- operator controls ----------------------------------------------------------

    # -- timers ---------------------------------------------------------------------

    async def arm(self, spec: TimerSpec) -> Timer:
        """Arm a root timer (trusted: an independent schedule or an operator action).

        With ``interval_ms`` it recurs at a fixed interval; with ``recurrence`` (a policy kind
        such as ``cron``) and an opaque ``spec`` it recurs by that policy.
        """
        return await self.storage.submit(arm_in_tx, spec)

    async def arm_recurring(self, spec: TimerSpec) -> Timer:
        """Arm a root timer that recurs every ``spec.interval_ms``; each occurrence has its own
        delivery identity ``{delivery_id}@{occurrence_ms}``."""
        if spec.interval_ms is None:
            raise InvalidRequest("arm_recurring: timer.interval_ms is required")
        return await self.arm(spec)

    async def arm_recurrence(
        self,
        kind: str,
        spec: Mapping[str, Any],
        *,
        timer_id: str,
        fire_at_ms: int,
        source: str,
        type: str,
        scope: str,
        key: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Timer:
        """Arm a configured root timer whose recurrence policy ``kind`` (a plugin's, e.g. ``cron``)
        interprets the opaque ``spec`` at each firing."""
        return await self.arm(TimerSpec(
            id=timer_id, fire_at_ms=fire_at_ms, source=source, type=type, scope=scope, key=key,
            payload=dict(payload or {}), recurrence=kind, spec=dict(spec),
        ))  # fmt: skip

    async def cancel_timer(self, timer_id: str, *, revision: int) -> Timer:
        """Cancel a timer at ``revision`` (a stale revision is a `Conflict`)."""
        return await self.storage.submit(cancel_timer_in_tx, timer_id, revision)

    async def timer(self, timer_id: str) -> Timer:
        found = await self._reader.timer(timer_id)
        if found is None:
            raise NotFound(f"no timer with id {timer_id!r}")
        return found

    async def timers(
        self, *, state: TimerState | None = None, after_id: str = "", limit: int = 100
    ) -> list[Timer]:
        _check_limit(limit)
        return await self._reader.timers(state=state.value if state else None, after_id=after_id, limit=limit)

    async def firings(self, timer_id: str) -> list[Firing]:
        """The timer's firing ledger, in commit order."""
        return await self._reader.firings_of_timer(timer_id)

    async def due(self, limit: int = 100) -> list[FireRequest]:
        """Up to ``limit`` due firing requests (bounded; a durable cursor keeps it fair)."""
        return await self.storage.submit(due_in_tx, limit)

    async def fire(self, request: FireRequest) -> Firing:
        """Fire one timer identity (idempotent: a committed firing is answered from the ledger)."""
        return await self.storage.submit(
            fire_timer_in_tx, request, self.config.causal, self.timer_actor.policies
        )

    async def poll(self, limit: int = 100) -> PollReport:
        """One bounded host pass: fire up to ``limit`` due timers (fairly, by the durable cursor).

        One item's failure is recorded as a safe diagnostic and the pass goes on; a storage
        failure is raised.
        """
        requests = await self.due(limit)
        results = await self.storage.submit(
            fire_timers_in_tx, requests, self.config.causal, self.timer_actor.policies
        )
        firings: list[Firing] = []
        failures: list[str] = []
        for request, result in zip(requests, results, strict=True):
            if isinstance(result, str):
                message = f"timer {request.timer_id}: firing failed: {result}"
                failures.append(message)
                await self.storage.submit(_diagnose, "poll_item_failed", request.timer_id, message)
            else:
                firings.append(result)
        return PollReport(firings=tuple(firings), failures=tuple(failures))

    async def hold(self, work_id: str, *, reason: str) -> Work:
        return await self.storage.submit(hold_in_tx, work_id, reason)

    async def release(self, work_id: str) -> Work:
        return await self.storage.submit(release_in_tx, work_id)

    async def cancel(self, work_id: str) -> Work:
        """Cancel Work (terminal): every token of its attempts loses authority at this commit."""
        return await self.storage.submit(cancel_in_tx, work_id)

    async def interrupt(
        self, work_id: str, *, reason: str = "operator interrupt", request_id: str | None = None
    ) -> Intent:
        """Interrupt the running attempt (``core.manual.interrupt``); the Work stays ready with its input."""
        return await self.storage.submit(
            manual_interrupt_in_tx, work_id, request_id or secrets.token_hex(8), reason, self.config.causal
        )


class _Advertised(Mapping[str, frozenset[str]]):
    """Executor name -> the capabilities it advertises now (read live at each validation)."""

    def __init__(self, executors: Mapping[str, Any]) -> None:
        self._executors = executors

    def __getitem__(self, name: str) -> frozenset[str]:
        return frozenset(str(c) for c in getattr(self._executors[name], "capabilities", ()))

    def __iter__(self) -> Iterator[str]:
        return iter(self._executors)

    def __len__(self) -> int:
        return len(self._executors)


@attrs.frozen(kw_only=True)
class PollReport:
    """What one `Runtime.poll` pass did."""

    firings: tuple[Firing, ...]
    failures: tuple[str, ...]


def _diagnose(tx: Tx, now_ms: int, kind: str, subject: str, message: str) -> None:
    tx.add_diagnostic(kind, subject, message, {}, now_ms)


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 100_000:
        raise InvalidRequest(f"limit must be an integer from 1 to 100000, got {limit!r}")


@asynccontextmanager
async def open_runtime(
    store: StoreLike = "loom.db",
    *,
    clock: Clock | None = None,
    config: Config | None = None,
    plugins: Iterable[object] = (),
    load_entry_points: bool = True,
    fault: FaultHook | None = None,
    owner: str = "loom",
    lease_ms: int = DEFAULT_LEASE_MS,
) -> AsyncIterator[Runtime]:
    """Open the store, start the actors, and yield the `Runtime` handle.

    Leaving the block stops every actor; the store is closed on the way out.
    """
    sqlite_store = as_store(store)
    clock = clock if clock is not None else SystemClock()
    pm = make_plugin_manager(plugins, load_entry_points=load_entry_points)
    executors = merged(pm.hook.loom_executors())
    holder = ConfigHolder(
        config if config is not None else Config(),
        executors=_Advertised(executors),
        handlers=frozenset(merged(pm.hook.loom_route_handlers())),
        triggers=frozenset(TRIGGER_SELECTORS),
    )
    readers: list[Reader] = []
    try:
        async with trio.open_nursery() as nursery:
            storage: StorageActor = await nursery.start(StorageActor(sqlite_store, clock, fault=fault).run)
            reader = ActorReader(storage) if sqlite_store.in_memory else Reader(sqlite_store.reader_uri())
            await reader.open()
            readers.append(reader)
            try:
                ingress: IngressActor = await nursery.start(
                    IngressActor(storage, lambda: holder.current.causal).run
                )
                router: RouterPool = await nursery.start(
                    RouterPool(
                        storage=storage,
                        # its snapshot reads are tiny and frequent: served by the storage actor they share
                        # its group-committed thread hops instead of queueing on one read connection
                        reader=ActorReader(storage),
                        config=lambda: holder.current,
                        plugins=pm,
                        clock=clock,
                        owner=owner,
                        lease_ms=lease_ms,
                    ).run
                )
                timer_actor: TimerActor = await nursery.start(
                    TimerActor(
                        storage, TimerService[str](clock), limits=lambda: holder.current.causal,
                        policies=merged(pm.hook.loom_recurrence_policies()),
                    ).run
                )  # fmt: skip
                yield Runtime(storage=storage, reader=reader, ingress=ingress, router=router, timers=timer_actor,
                              clock=clock, config=holder, plugins=pm)  # fmt: skip
            finally:
                nursery.cancel_scope.cancel()
    finally:
        # readers close after every actor has stopped using them
        with trio.CancelScope(shield=True):
            for reader in readers:
                await reader.aclose()
