"""The `Runtime` handle: the public, trusted host API over a store and the actors running on it.

Its parts: acceptance, quiescence, notices and actors here; reads in `_reads`; executions, controls,
timers and the bounded host pass in `_host`. `open_runtime` (in `_open`) builds it.
"""

from __future__ import annotations

import trio

from ..actors.activity import Activity
from ..actors.reconciler import SubscriptionReconciler
from ..actors.router import RouterPool
from ..actors.shared import Shared
from ..actors.timer_service import TimerService
from ..actors.timers import TimerActor
from ..config import Config
from ..records.clock import Clock
from ..records.errors import ConfigError, InvalidRequest
from ..records.events import Event, EventIn
from ..records.validation import check_int
from ..store import Tx
from ._host import Host
from ._reads import Reads
from ._subscriptions import Subscriptions
from ._watch import Watch

ACTORS = ("router", "timers", "subscriptions")
"""The background actors `open_runtime` starts by default (storage always runs; ingress runs in the
publisher's own task). ``router`` routes Events, starts, runs and completes attempts and dispatches
intents; ``timers`` fires due timers; ``subscriptions`` installs subscriptions and publishes their
aliases. Each needs only the store."""

MAX_WATCH_CAPACITY = 1_000_000
"""The most commit batches a watcher may fall behind before it gets `Lagged`."""


def _barrier_in_tx(tx: Tx, now_ms: int) -> None:
    """A no-op procedure: its reply follows every earlier commit's notices."""


class Runtime(Reads, Host, Subscriptions):
    """The trusted host API over a running store and the actors chosen for it."""

    @property
    def clock(self) -> Clock:
        return self._p.clock

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
        return self._p.holder.replace(config)

    # -- acceptance -----------------------------------------------------------------

    async def publish(self, event: EventIn) -> Event:
        """Durably accept an external root Event; a duplicate returns the original, marked."""
        return await self._p.ingress.publish(event)

    async def publish_derived(self, event: EventIn, *, parent_id: str, cause_id: str | None = None) -> Event:
        """Accept an Event derived from ``parent_id`` under the causal bounds (trusted host call).

        Raises `CausalRefused` (after committing its diagnostic) when the bounds refuse it.
        """
        return await self._p.ingress.publish_derived(event, parent_id=parent_id, cause_id=cause_id)

    # -- quiescence and notices ------------------------------------------------------

    async def wait_idle(self) -> None:
        """Return once nothing is in flight in the actors running now: no Event awaiting routing that
        can be routed now, no claim, launch or completion pending, no intent being dispatched, no timer
        due at the clock's current time, and no subscription pass pending. Running executions and future
        timers do not count.

        With no background actors this returns after one round trip through storage.
        """
        while True:
            router, timers, subscriptions = self._p.router, self._p.timers, self._p.subscriptions
            if router is not None:
                await router.wait_idle()
            if timers is not None:
                await timers.wait_idle()
            if subscriptions is not None:
                await subscriptions.wait_idle()
            await self._submit(_barrier_in_tx)
            router, timers, subscriptions = self._p.router, self._p.timers, self._p.subscriptions
            if (
                (router is None or router.idle)
                and (timers is None or timers.idle)
                and (subscriptions is None or subscriptions.idle)
            ):
                return

    def watch(self, *, capacity: int = 1024) -> Watch:
        """Committed notices, as an async iterator of frozen records, from now on.

        ``async with rt.watch() as notices: async for notice in notices: ...``. Every batch ends
        with `Committed`; a watcher more than ``capacity`` batches behind gets `Lagged` (reread
        what you need from the store). Notices are hints; the store is the truth.
        """
        check_int("capacity", capacity, 1, MAX_WATCH_CAPACITY)
        return Watch(self._p.storage, capacity)

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
        if name == "router":
            shared = Shared(
                storage=p.storage,
                # its snapshot reads are tiny and frequent: served by the storage actor they share
                # its group-committed thread hops instead of queueing on one read connection
                reader=p.actor_reader,
                config=p.config,
                extensions=p.extensions,
                clock=p.clock,
                activity=Activity(),
                owner=p.owner,
                lease_ms=p.lease_ms,
            )
            router = RouterPool(shared)
            p.router = router
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(router.run)
                    task_status.started()
            finally:
                p.router = None
        elif name == "subscriptions":
            reconciler = SubscriptionReconciler(p.storage, p.extensions, limits=lambda: p.config().causal)
            p.subscriptions = reconciler
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(reconciler.run)
                    task_status.started()
            finally:
                p.subscriptions = None
        else:
            actor = TimerActor(
                p.storage,
                TimerService[str](p.clock),
                limits=lambda: p.config().causal,
                policies=p.extensions.recurrence_policies,
            )
            p.timers = actor
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(actor.run)
                    task_status.started()
            finally:
                p.timers = None
