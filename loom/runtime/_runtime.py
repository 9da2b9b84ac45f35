"""The `Runtime` handle: the public, trusted host API over a store and the actors running on it.

Its parts: acceptance, quiescence, notices and actors here; reads in `_reads`; executions, controls,
timers and the bounded host pass in `_host`. `open_runtime` (in `_open`) builds it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import trio

from ..actors.activity import Activity
from ..actors.compactor import Compactor
from ..actors.reconciler import SubscriptionReconciler
from ..actors.recoverer import LeaseRecoverer
from ..actors.router import RouterPool
from ..actors.shared import Shared
from ..actors.timers import TimerActor
from ..config import Config
from ..kernel._common import barrier_in_tx
from ..records.clock import Clock
from ..records.errors import ConfigError, InvalidRequest, LoomError, StorageClosed, StorageUnavailable
from ..records.events import Event, EventIn
from ..records.validation import check_int
from ..records.work import Checkpoint
from ._browse import Browse
from ._checks import Checks
from ._host import Host
from ._passes import Passes
from ._reads import Reads
from ._results import Results
from ._subscriptions import Subscriptions
from ._watch import Watch

ACTORS = ("router", "timers", "recovery", "subscriptions", "compaction")
MAX_BATCH = 1000
"""The most Events one `Runtime.publish_many` accepts (and one ``POST /events`` carries)."""
MAX_GRACE_S = 3600
"""The longest drain before a stop (`Runtime.drain`)."""


def check_grace(field: str, value: object) -> float:
    """A drain's grace: seconds from 0 to `MAX_GRACE_S` (`InvalidRequest` naming ``field`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_GRACE_S:
        raise InvalidRequest(f"{field} must be seconds from 0 to {MAX_GRACE_S}, got {value!r}", field=field)
    return float(value)


log = logging.getLogger("loom.runtime")


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost connection to the store and nothing else (alone or in a group)."""
    if isinstance(exc, BaseExceptionGroup):
        match, rest = exc.split(StorageUnavailable)
        return match is not None and rest is None
    return isinstance(exc, StorageUnavailable)


"""The background actors `open_runtime` starts by default (storage always runs; ingress runs in the
publisher's own task). ``router`` routes Events, starts, runs and completes attempts and dispatches
intents; ``timers`` fires due timers; ``recovery`` recovers attempts whose lease expired (adopting,
relaunching or failing them through their executors); ``subscriptions`` installs subscriptions and
publishes their aliases; ``compaction`` removes what ended once its retention passed. Each needs only
the store."""

MAX_WATCH_CAPACITY = 1_000_000
"""The most commit batches a watcher may fall behind before it gets `Lagged`."""


class Runtime(Reads, Results, Checks, Browse, Host, Passes, Subscriptions):
    """The trusted host API over a running store and the actors chosen for it."""

    @property
    def clock(self) -> Clock:
        return self._p.clock

    @property
    def owner(self) -> str:
        """The name this runtime holds its leases under (`open_runtime`'s ``owner``, or its default)."""
        return self._p.owner

    @property
    def backend(self) -> str:
        """The store's database: ``sqlite`` or ``postgresql``."""
        return str(self._p.storage.store.dialect.name)

    @property
    def plugin_names(self) -> list[str]:
        """The plugins loaded: the built-ins, those given to `open_runtime` and entry points."""
        return sorted(name for name, plugin in self._p.plugins.list_name_plugin() if plugin is not None)

    @property
    def config(self) -> Config:
        """The configuration generation in force."""
        return self._p.config()

    def reload(self, config: Config) -> Config:
        """Validate ``config`` against the plugins and make it the next generation.

        A refused config raises `ConfigError` naming file, key and reason; the old
        generation stays in force.
        """
        if not isinstance(config, Config):
            raise ConfigError(f"expected a Config, got {type(config).__name__}")
        self._open_or_closed()
        replaced = self._p.holder.replace(config)
        if self._p.router is not None:
            self._p.router.on_reload()  # a raised budget limit releases the Work it held
        else:
            self._p.readmit = True  # the host's next admission pass looks again at what it passed over
        if self._p.compaction is not None:
            self._p.compaction.on_reload()  # a shorter [compaction] every takes effect now
        return replaced

    # -- acceptance -----------------------------------------------------------------

    async def publish(self, event: EventIn) -> Event:
        """Durably accept an external root Event; a duplicate returns the original, marked."""
        router = self._p.router
        return await self._p.ingress.publish(event, routing=router.at_acceptance if router else None)

    async def publish_routed(self, event: EventIn) -> tuple[Event, Checkpoint | None]:
        """`publish`, and where its acceptance commit routed it: the routing checkpoint that commit wrote,
        known without a read. ``None``: that commit did not route it (a duplicate, whose checkpoint
        `checkpoint` reads; or an Event a router routes in a commit of its own, which `wait_routed`
        waits for, as on a shared database for most Events)."""
        router = self._p.router
        return await self._p.ingress.publish_routed(event, routing=router.at_acceptance if router else None)

    async def publish_many(self, events: Sequence[EventIn]) -> list[Event | LoomError]:
        """Durably accept external root Events in the order given, with one commit: the answers, in
        order, are each Event (a duplicate marked, whether of an earlier delivery or of an earlier item
        of ``events``) or the `LoomError` that refused it (a bad field is named; the others are
        accepted without it). A storage failure raises, and none of them is accepted."""
        if not isinstance(events, list | tuple):
            raise InvalidRequest(
                f"events must be a list of EventIn, got {type(events).__name__}", field="events"
            )
        if len(events) > MAX_BATCH:
            raise InvalidRequest(
                f"events holds {len(events)} Events; at most {MAX_BATCH} at once", field="events"
            )
        for index, event in enumerate(events):
            if not isinstance(event, EventIn):
                raise InvalidRequest(
                    f"events[{index}] must be an EventIn, got {type(event).__name__}",
                    field=f"events[{index}]",
                )
        return await self._p.ingress.publish_many(events)

    async def publish_derived(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        """Accept an Event derived from ``parent_id`` under the causal bounds (trusted host call).

        Raises `CausalRefused` (after committing its diagnostic) when the bounds refuse it.
        """
        return await self._p.ingress.publish_derived(event, parent_id=parent_id, cause_id=cause_id)

    # -- quiescence and notices ------------------------------------------------------

    async def wait_idle(self) -> None:
        """Return once nothing is in flight in the actors running now: no Event awaiting routing that
        can be routed now, no claim, launch or completion pending, no intent being dispatched, no timer
        due and no lease expired at the clock's current time, and no subscription pass pending. Running
        executions, future timers and live leases do not count.

        With no background actors this returns after one round trip through storage.
        """
        while True:
            for actor in self._actors():
                await actor.wait_idle()
            await self._submit(barrier_in_tx)
            if all(actor.idle for actor in self._actors()):
                return

    async def drain(self, grace_s: float) -> int:
        """Prepare a clean stop: start nothing more here, and wait up to ``grace_s`` seconds for the
        attempts this runtime runs whose executor cannot adopt them after a restart (a python
        function: it dies with its process) to return and their outcomes to commit. Answers how many
        still run at the end (0: none is lost to the stop). Leave the `open_runtime` block after it.

        Without a drain, closing cancels such an attempt: the next open recovers it, cannot adopt it,
        and fails it, so its Work spends a retry and waits out its backoff. During a drain Events are
        still accepted, routed and queued, timers fire and waits wake; what would start waits for
        the next open, and an attempt claimed just before is launched there (docs/operations.md
        "Stopping"). An adoptable attempt (a shell command) is not waited for: it goes on, and the
        next open adopts it."""
        check_grace("grace_s", grace_s)
        draining = self._p.draining
        draining.on = True
        with trio.move_on_after(grace_s):
            await draining.settled()
        return draining.unadoptable()

    def _actors(self) -> list[Any]:
        p = self._p
        actors = (p.router, p.timers, p.recovery, p.subscriptions, p.compaction)
        return [actor for actor in actors if actor is not None]

    def watch(self, *, capacity: int = 1024) -> Watch:
        """Committed notices, as an async iterator of frozen records, from now on.

        ``async with rt.watch() as notices: async for notice in notices: ...``. Every batch ends
        with `Committed`; a watcher more than ``capacity`` batches behind gets `Lagged` (reread
        what you need from the store). Notices are hints; the store is the truth.
        """
        check_int("capacity", capacity, 1, MAX_WATCH_CAPACITY)
        self._open_or_closed()
        return Watch(self._p.storage, capacity)

    def _open_or_closed(self) -> None:
        """`StorageClosed` once the runtime closed, for the calls that do not go through the store (a
        watch would wait for ever for a commit that never comes; a reload would answer for nothing)."""
        if not self._p.storage.running:
            raise StorageClosed("the runtime is closed")

    # -- actors -----------------------------------------------------------------------

    async def run_actor(
        self, name: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run one background actor (one of `ACTORS`) in the caller's nursery until cancelled:
        ``await nursery.start(rt.run_actor, "timers")``. At most one of each runs per runtime."""
        p = self._p
        if name not in ACTORS:
            raise InvalidRequest(f"unknown actor {name!r}; expected one of: {', '.join(ACTORS)}")
        if getattr(p, name) is not None:
            raise InvalidRequest(f"the {name} actor is already running in this runtime")
        # A lost connection to a shared database (a server restart) stops the actor with
        # `StorageUnavailable`: it starts again from the store, which holds everything it needs,
        # while the storage actor reconnects. Any other storage failure stops the runtime.
        started = False
        delays = p.storage.store.reconnect_delays()
        while True:
            actor = self._make_actor(name)
            setattr(p, name, actor)
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(actor.run)
                    if not started:
                        started = True
                        task_status.started()
                return
            except BaseException as exc:
                if not started or not connection_lost(exc):
                    raise
                log.warning("the %s actor lost the store's connection (%s); it starts again", name, exc)
            finally:
                setattr(p, name, None)
            await trio.sleep(delays[0] if delays else 0)

    def _make_actor(self, name: str) -> Any:
        p = self._p
        if name == "router":
            # its snapshot reads are tiny and frequent: served by the storage actor they share its
            # group-committed thread hops instead of queueing on one read connection
            return RouterPool(self._shared(p.actor_reader))
        elif name == "timers":
            return TimerActor(
                p.storage,
                p.clock,
                limits=lambda: p.config().causal,
                policies=p.extensions.recurrence_policies,
                routing=lambda: p.router.at_firing() if p.router is not None else None,
            )
        elif name == "recovery":
            return LeaseRecoverer(self._shared(p.actor_reader))
        elif name == "compaction":
            return Compactor(p.storage, p.clock, config=p.config, executors=p.extensions.executors)
        return SubscriptionReconciler(p.storage, p.extensions, limits=lambda: p.config().causal)

    def _shared(self, reader: Any) -> Shared:
        p = self._p
        return Shared(
            storage=p.storage,
            reader=reader,
            config=p.config,
            extensions=p.extensions,
            clock=p.clock,
            activity=Activity(),
            owner=p.owner,
            lease_ms=p.lease_ms,
            unlaunched=p.unlaunched,
            held=p.held,
            draining=p.draining,
        )
