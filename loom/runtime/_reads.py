"""The read half of the `Runtime` handle: Events, Work and its history, timers and diagnostics.

Reads use read-only connections (a file store) and never block the writer; an unknown id raises
`NotFound` naming it.
"""

from __future__ import annotations

import attrs

from ..kernel.causal import REJECTIONS_NAMESPACE
from ..kernel.time_floor import FLOOR, TIME_NAMESPACE
from ..records.budgets import BudgetLedger
from ..records.compaction import StoreSize
from ..records.errors import NotFound
from ..records.events import CausalRejection, Diagnostic, Event, KVEntry
from ..records.serde import structure
from ..records.timers import Firing, Timer, TimerState
from ..records.validation import MAX_SEQ, check_int, validate_scope
from ..records.waits import Wait
from ..records.work import Checkpoint, Execution, Intent, Work, WorkState
from ._base import MAX_LIMIT, RuntimeBase, after, check_limit, lookup, member

GAUGE_CAP = 1_000_000
UNROUTED_WINDOW = 100_000


@attrs.frozen(kw_only=True)
class WorkHistory:
    """A Work with its routing checkpoints and attempts, in order."""

    work: Work
    checkpoints: tuple[Checkpoint, ...]
    executions: tuple[Execution, ...]


class Reads(RuntimeBase):
    async def event(self, event_id: str) -> Event:
        lookup("event_id", event_id)
        found = await self._p.reader.event(event_id)
        if found is None:
            raise NotFound(f"no event with id {event_id!r}")
        return found

    async def event_by_delivery(self, source: str, delivery_id: str) -> Event:
        lookup("source", source)
        lookup("delivery_id", delivery_id)
        found = await self._p.reader.event_by_delivery(source, delivery_id)
        if found is None:
            raise NotFound(f"no event from source {source!r} with delivery id {delivery_id!r}")
        return found

    async def events(
        self, *, after_seq: int = 0, limit: int = 1000, root_id: str | None = None, type: str | None = None
    ) -> list[Event]:
        """Accepted Events in sequence order (optionally those of one causal root, or of one type)."""
        check_limit(limit)
        check_int("after_seq", after_seq, 0, MAX_SEQ)
        if type is not None:
            lookup("type", type)
        if root_id is not None:
            lookup("root_id", root_id)
            return await self._p.reader.events_of_root(root_id, after_seq, limit, type)
        return await self._p.reader.events_after(after_seq, limit, type)

    async def checkpoint(self, event_id: str) -> Checkpoint | None:
        """The Event's routing checkpoint (``None``: not routed yet). `NotFound` for an unknown Event."""
        lookup("event_id", event_id)
        found = await self._p.reader.checkpoint(event_id)
        if found is None:
            await self.event(event_id)  # (no checkpoint: is there such an Event?)
        return found

    async def work(self, work_id: str) -> Work:
        return await self._known_work(work_id)

    async def work_for_key(self, key: str) -> Work:
        lookup("key", key)
        owner = await self._p.reader.key_owner(key)
        if owner is None:
            raise NotFound(f"no work owns key {key!r}")
        return await self.work(owner)

    async def works(
        self,
        *,
        state: WorkState | None = None,
        scope: str | None = None,
        after_id: str = "",
        limit: int = 100,
    ) -> list[Work]:
        """Works in id order after ``after_id``; ``scope`` keeps that scope and the scopes below it."""
        check_limit(limit)
        chosen = member("state", WorkState, state)
        if scope is not None:
            validate_scope(scope, field="scope")
        return await self._p.reader.works(
            state=chosen.value if chosen else None,
            after_id=after("after_id", after_id),
            limit=limit,
            scope=scope,
        )

    async def history(self, work_id: str, *, newest: int | None = None) -> WorkHistory:
        """The Work with its checkpoints (in the order they were committed) and attempts (in attempt
        order); ``newest``: only the last so many of each (a standing Work's may be many)."""
        if newest is not None:
            check_int("newest", newest, 1, MAX_LIMIT)
        work = await self.work(work_id)
        return WorkHistory(
            work=work,
            checkpoints=tuple(await self._p.reader.checkpoints_of_work(work_id, newest)),
            executions=tuple(await self._p.reader.executions_of_work(work_id, newest)),
        )

    async def waits(self, work_id: str) -> list[Wait]:
        """The Work's waits, oldest first: the open one (if any) and the history of woken, blocked and
        cancelled ones (winner, bridge, timeout identity, reason)."""
        lookup("work_id", work_id)
        return await self._p.reader.waits_of_work(work_id)

    async def execution(self, execution_id: str) -> Execution:
        lookup("execution_id", execution_id)
        found = await self._p.reader.execution(execution_id)
        if found is None:
            raise NotFound(f"no execution with id {execution_id!r}")
        return found

    async def intents(self, execution_id: str) -> list[Intent]:
        lookup("execution_id", execution_id)
        return await self._p.reader.intents_of_execution(execution_id)

    async def diagnostics(
        self, *, kind: str | None = None, subject: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[Diagnostic]:
        """Diagnostics in the order they were recorded (``after_id``: only those recorded after it)."""
        check_limit(limit)
        check_int("after_id", after_id, 0, MAX_SEQ)
        if kind is not None:
            lookup("kind", kind)
        if subject is not None:
            lookup("subject", subject)
        return await self._p.reader.diagnostics(kind, subject, limit, after_id)

    async def store_size(self) -> StoreSize:
        """How big the store is: rows per table and bytes (what ``/metrics`` shows; it counts every row,
        so read it now and then, not in a loop)."""
        return await self._p.reader.store_size()

    async def kv(self, namespace: str, *, limit: int = 1000) -> list[KVEntry]:
        check_limit(limit)
        lookup("namespace", namespace)
        return await self._p.reader.kv_list(namespace, limit)

    async def budget_ledgers(
        self, *, budget: str | None = None, subject: str | None = None, limit: int = 1000
    ) -> list[BudgetLedger]:
        """What the budgets have counted: one ledger per budget, subject (a Work id, a scope, or ``*``
        across every scope) and window (``life``, ``day:YYYY-MM-DD``, ``week:YYYY-Www``)."""
        check_limit(limit)
        if budget is not None:
            lookup("budget", budget)
        if subject is not None:
            lookup("subject", subject)
        return await self._p.reader.ledgers(budget, subject, limit)

    async def causal_rejections(self, *, limit: int = 1000) -> list[CausalRejection]:
        """The durable, redacted diagnostics of causal refusals."""
        check_limit(limit)
        entries = await self._p.reader.kv_list(REJECTIONS_NAMESPACE, limit)
        return [structure(entry.value, CausalRejection) for entry in entries]

    async def timer(self, timer_id: str) -> Timer:
        lookup("timer_id", timer_id)
        found = await self._p.reader.timer(timer_id)
        if found is None:
            raise NotFound(f"no timer with id {timer_id!r}")
        return found

    async def timers(
        self,
        *,
        state: TimerState | None = None,
        work_id: str | None = None,
        after_id: str = "",
        limit: int = 100,
    ) -> list[Timer]:
        """Timers in id order after ``after_id``; ``work_id`` keeps those that name the Work or that its
        attempts armed (deadlines, derived timers)."""
        check_limit(limit)
        chosen = member("state", TimerState, state)
        if work_id is not None:
            lookup("work_id", work_id)
        return await self._p.reader.timers(
            state=chosen.value if chosen else None,
            after_id=after("after_id", after_id),
            limit=limit,
            work_id=work_id,
        )

    async def gauges(self) -> dict[str, int | None]:
        """What the store holds now, for monitoring (``loom serve``'s /metrics): Works by state
        (``works_ready``, ...), the ready queue (``ready``), armed and overdue timers, the earliest armed
        timer's time (``earliest_timer_ms``), and Events not yet routed among the last 100,000 accepted
        (``unrouted``). Each count stops at 1,000,000, so a read stays bounded whatever the store holds."""
        return await self._p.reader.gauges(self._p.clock.now_ms(), GAUGE_CAP, UNROUTED_WINDOW)

    async def time_floor(self) -> int | None:
        """The latest clock reading recorded with `Runtime.mark_time` (``None``: none was)."""
        entry = await self._p.reader.kv_get(TIME_NAMESPACE, FLOOR)
        return int(entry.value["now_ms"]) if entry is not None else None

    async def firings(self, timer_id: str, *, newest: int | None = None) -> list[Firing]:
        """The timer's firing ledger, in commit order; ``newest``: only its last so many entries."""
        lookup("timer_id", timer_id)
        if newest is not None:
            check_int("newest", newest, 1, MAX_LIMIT)
        return await self._p.reader.firings_of_timer(timer_id, newest)
