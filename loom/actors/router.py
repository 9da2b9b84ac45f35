"""The router: routing lanes, starting attempts, running them and dispatching intents, driven by
commit notices.

It owns no rule of its own: each part (`lanes`, `starter`, `attempts`, `dispatch`) submits kernel
procedures and calls plugins outside transactions; this module reads the commit feed and hands
each notice to the part it concerns. At start, and whenever the feed lags, it rescans the store.
"""

from __future__ import annotations

from functools import partial

import trio

from ..kernel._common import barrier_in_tx
from ..kernel.admission import readmit_in_tx
from ..kernel.budgets import rebudget_in_tx
from ..kernel.resolve import DeferredRoute, RouteRequest
from ..records.events import Event, EventIn
from ..records.notices import (
    EventAccepted,
    EventReplayed,
    EventRouted,
    ExecutionFenced,
    IntentPending,
    Lagged,
    Notice,
    StoreChanged,
    WorkChanged,
    WorkReady,
)
from ..records.work import Lease
from .activity import Coalesced
from .attempts import AttemptRunner
from .dispatch import IntentDispatcher
from .ingress import RouteAtAcceptance, RouteAtFiring
from .lanes import RoutingLanes, routes_by_checkpoint_alone
from .shared import Shared
from .starter import Starter, admit_request


class RouterPool:
    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self.attempts = AttemptRunner(shared, chain=True)
        self.starter = Starter(shared, self.attempts.start)
        self.lanes = RoutingLanes(shared, self.attempts.start)
        self.dispatcher = IntentDispatcher(shared)
        self._accepting = False
        """Publishers may route their Events in their acceptance commits (`at_acceptance`)."""
        activity = shared.activity
        self._unrouted = Coalesced(activity, self.lanes.resync, _wider)
        """Another node's unrouted Events (``None``: every one), or, at a check, those accepted
        before a time: looked for by one pass at a time however often asked (`Coalesced`)."""
        self._intents = Coalesced(activity, self._resync_intents)
        self._reloads = Coalesced(activity, self._reconfigured)
        """What a new configuration generation asks for: one pass at a time, however often reloaded."""

    def at_acceptance(self, event: EventIn) -> RouteAtAcceptance | None:
        """How ``event`` routes in its own acceptance commit (`chains.accept_then_route_in_tx`), when it
        can: the router runs and has read the store, and the Event routes outside its lane
        (`RoutingLanes.plan`). On a shared database the acceptance commit holds the order lock every
        node's acceptance waits on, so only an Event whose routing is its checkpoint alone routes
        there (`lanes.routes_by_checkpoint_alone`): its own routing commit would take the same lock for
        the same insert, after a read of the Event and a transaction of its own.
        ``None``: it is accepted alone and routed from its notice."""
        if not self._accepting:
            return None
        plan = self.lanes.plan(event)
        if plan is None:
            return None
        if self._s.storage.shared and not routes_by_checkpoint_alone(event, plan):
            return None
        admit = admit_request(self._s) if plan.decide is not None else None
        return RouteAtAcceptance(plan=plan, admit=admit, launch=self._launch_routed)

    def at_firing(self) -> RouteAtFiring | None:
        """How a firing pass routes the Events it accepts in its own commit
        (`chains.fire_then_route_in_tx`), when it can (as `at_acceptance`: on a shared database, only
        those whose routing is their checkpoint alone); ``None``: they are routed from their notices."""
        if not self._accepting:
            return None
        return RouteAtFiring(
            planner=self.lanes.planner(checkpoint_only=self._s.storage.shared),
            admit=admit_request(self._s),
            launch=self._launch_routed,
        )

    def _launch_routed(self, lease: Lease, executor: str) -> None:
        """Launch an attempt an acceptance or firing commit started, unless this router has stopped
        meanwhile (the runtime is closing): then the close unmarks it, and the next open relaunches it
        as never handed to its executor."""
        if self._accepting:
            self.attempts.start(lease, executor)
        else:
            self.attempts.unlaunched(lease)

    @property
    def idle(self) -> bool:
        return self._s.activity.idle

    async def wait_idle(self) -> None:
        """Return once nothing is in flight: no routing, start check, claim, completion or dispatch,
        and no unread commit notice (running executions and clock sleeps do not count)."""
        activity = self._s.activity
        while True:
            await activity.wait_quiet()
            # A commit's notices are handed straight to the waiting feed reader, which has not
            # run yet, so the pool can look idle with a notice in flight. Once a round trip
            # through storage returns, every earlier commit's notices have been taken.
            await self._s.storage.submit(barrier_in_tx)
            if activity.idle:
                return

    async def run(self, *, task_status: trio.TaskStatus[RouterPool] = trio.TASK_STATUS_IGNORED) -> None:
        storage, activity = self._s.storage, self._s.activity
        feed = storage.feed(concerns=self.concerned_by)
        storage.routing = True
        try:
            async with trio.open_nursery() as nursery:
                activity.bind(nursery)
                await self._resync()
                self._accepting = True
                task_status.started(self)
                while True:
                    activity.feed_pending = feed.pending
                    if not activity.feed_pending:
                        activity.mark_quiet()
                    notices = await feed.next_batch()
                    activity.feed_pending = True
                    activity.enter()
                    try:
                        quick: list[RouteRequest | DeferredRoute] = []
                        quick_events: list[Event] = []
                        # Events routed in their own acceptance commit need nothing more here
                        routed = {n.event_id for n in notices if isinstance(n, EventRouted)}
                        for notice in notices:
                            if isinstance(notice, EventAccepted) and notice.event.id in routed:
                                continue
                            if isinstance(notice, Lagged) or (
                                isinstance(notice, StoreChanged) and notice.everything
                            ):
                                activity.wake_all()
                                await self._resync()
                            elif isinstance(notice, StoreChanged):
                                self._on_remote(notice)
                            else:
                                self._on_notice(notice, quick, quick_events)
                        if quick:
                            activity.spawn(self.lanes.route_quick, quick_events, quick)
                    finally:
                        activity.leave()
        except* trio.EndOfChannel:
            pass  # the storage actor stopped: the runtime is going down (the rest, if any, goes on)
        finally:
            self._accepting = False
            storage.routing = False
            storage.unsubscribe(feed)

    def concerned_by(self, notices: list[Notice]) -> bool:
        """Whether a committed batch gives the router anything to do (`NoticeFeed.concerns`). One that
        only accepted Events and routed each in its own commit (as most acceptance commits do) does
        not, unless a step waits for an Event's routing (`Activity.wait_routed`); a notice the router
        takes no action on (a Work changed) does not either."""
        if self._s.activity.routed_waiters:
            return True
        routed: set[str] | None = None
        for notice in notices:
            if isinstance(notice, EventRouted | WorkChanged):
                continue
            if isinstance(notice, EventAccepted):
                if routed is None:
                    routed = {n.event_id for n in notices if isinstance(n, EventRouted)}
                if notice.event.id in routed:
                    continue
            return True
        return False

    def on_reload(self) -> None:
        """A new configuration generation is in force: Work a budget held is released if its ledgers
        are below the limits now, and the admission pass looks again at every Work it passed over
        (capacities, routes and bindings may have changed). Reloads that come while a pass runs ask
        for one more pass after it, which reads the generation then in force."""
        self._reloads.ask(None)

    async def _reconfigured(self, _: None) -> None:
        self.starter.forget_elsewhere()
        await self._rebudget()
        await self._s.storage.submit(readmit_in_tx)

    async def _rebudget(self) -> None:
        await self._s.storage.submit(rebudget_in_tx, self._s.config().budgets)

    async def _resync(self) -> None:
        """Rebuild in-memory work lists from the store (at start, and after a lagging feed)."""
        await self._rebudget()
        await self.lanes.resync()
        self.starter.kick()
        await self.dispatcher.resync()

    def _on_remote(self, notice: StoreChanged) -> None:
        """Another node committed (or the periodic check of a shared database came round)."""
        activity = self._s.activity
        if notice.routed or notice.check:
            activity.wake_all()  # a lane or completion waiting for another node's Event looks again
        if notice.check:
            self.starter.forget_elsewhere()
        if notice.work_ready or notice.check:
            self.starter.kick()
        if notice.intents or notice.check:
            self._intents.ask(None)
        for execution_id in notice.fenced:
            activity.spawn(partial(self.dispatcher.stop, execution_id, None, remote=True))
        if notice.unrouted:
            self._unrouted.ask(None)  # a node that routes nothing: its Events are routed here
        elif notice.check:
            # Events another node accepted and has not routed for a whole check period (it may have
            # stopped): routed here, in order, from the routing watermark
            self._unrouted.ask(self._s.clock.now_ms() - self._s.storage.check_ms)

    async def _resync_intents(self, _: None) -> None:
        await self.dispatcher.resync()

    def _on_notice(
        self, notice: Notice, quick: list[RouteRequest | DeferredRoute], quick_events: list[Event]
    ) -> None:
        if isinstance(notice, EventAccepted):
            event = notice.event
            request = self.lanes.quick(event)
            if request is not None:
                quick.append(request)
                quick_events.append(event)
            else:
                self.lanes.enqueue(event.id, event.seq, event.work_id, event.key, event)
        elif isinstance(notice, EventReplayed):
            event = notice.event
            self.lanes.enqueue(event.id, event.seq, event.work_id, event.key)
        elif isinstance(notice, EventRouted):
            self._s.activity.routed(notice.event_id)  # a lane or a completion may wait for this one
        elif isinstance(notice, WorkReady):
            self.starter.kick()
        elif isinstance(notice, IntentPending):
            self.dispatcher.dispatch(notice.intent_id)
        elif isinstance(notice, ExecutionFenced):
            self.dispatcher.stop_fenced(notice)


def _wider(earlier: int | None, later: int | None) -> int | None:
    """Two asks for unrouted Events merged: every one (``None``) if either asks it, else those
    accepted before the later time."""
    return None if earlier is None or later is None else max(earlier, later)
