"""Browsing reads of the `Runtime` handle, for the web console: newest first, one bounded indexed read
per page (`store._browse`), whatever the store holds."""

from __future__ import annotations

from ..records.errors import InvalidRequest
from ..records.events import Diagnostic, Event
from ..records.timers import Timer
from ..records.validation import MAX_INT, MAX_SEQ, check_int, validate_scope
from ..records.work import Checkpoint, Work, WorkState
from ._base import RuntimeBase, after, check_limit, lookup, member

COUNT_CAP = 1_000_000
"""Counts by state stop here, so a count stays a bounded read."""


def _cursor(field: str, value: object) -> tuple[int, str]:
    """A page cursor ``(ms, id)``: the last row's time and id."""
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise InvalidRequest(f"{field} must be a pair (ms, id), the last row's", field=field)
    check_int(field, value[0], 0, MAX_INT)
    lookup(field, value[1])
    return int(value[0]), str(value[1])


class Browse(RuntimeBase):
    async def works_changed(
        self,
        *,
        state: WorkState | None = None,
        scope: str | None = None,
        key_prefix: str | None = None,
        before: tuple[int, str] | None = None,
        limit: int = 100,
    ) -> list[Work]:
        """Works by last change (``updated_at_ms``), newest first, before the cursor ``before`` (the
        last Work's ``(updated_at_ms, id)``). ``scope`` keeps that scope and those below it;
        ``key_prefix`` keeps Works owning a key that starts with it (among the first ``limit`` such
        keys)."""
        check_limit(limit)
        chosen = member("state", WorkState, state)
        if scope is not None:
            validate_scope(scope, field="scope")
        if key_prefix is not None:
            lookup("key_prefix", key_prefix)
        if before is not None:
            before = _cursor("before", before)
        return await self._p.reader.works_changed(
            state=chosen.value if chosen else None,
            scope=scope,
            before=before,
            limit=limit,
            key_prefix=key_prefix,
        )

    async def work_counts(self, *, scope: str | None = None) -> dict[str, int]:
        """How many Works are in each state (``scope``: that scope and those below it); each count
        stops at `COUNT_CAP`."""
        if scope is not None:
            validate_scope(scope, field="scope")
        return await self._p.reader.work_counts(scope, COUNT_CAP)

    async def events_newest(
        self, *, before_seq: int | None = None, type: str | None = None, limit: int = 100
    ) -> list[tuple[Event, Checkpoint | None]]:
        """Accepted Events newest first (before ``before_seq``), each with its routing checkpoint
        (``None``: not routed yet)."""
        check_limit(limit)
        if before_seq is not None:
            check_int("before_seq", before_seq, 1, MAX_SEQ)
        if type is not None:
            lookup("type", type)
        return await self._p.reader.events_newest(before_seq=before_seq, type=type, limit=limit)

    async def diagnostics_newest(
        self,
        *,
        kind: str | None = None,
        subject: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[Diagnostic]:
        """Diagnostics newest first (before ``before_id``)."""
        check_limit(limit)
        if kind is not None:
            lookup("kind", kind)
        if subject is not None:
            lookup("subject", subject)
        if before_id is not None:
            check_int("before_id", before_id, 1, MAX_SEQ)
        return await self._p.reader.diagnostics_newest(
            kind=kind, subject=subject, before_id=before_id, limit=limit
        )

    async def timers_due(self, *, after: tuple[int, str] | None = None, limit: int = 100) -> list[Timer]:
        """Armed timers by due time, earliest first, after the cursor ``(fire_at_ms, id)``."""
        check_limit(limit)
        if after is not None:
            after = _cursor("after", after)
        return await self._p.reader.timers_due(after=after, limit=limit)

    async def schedules(self, *, after_id: str = "", limit: int = 100) -> list[Timer]:
        """Recurring timers (a recurrence policy such as cron, or a fixed interval), by id, in any state."""
        check_limit(limit)
        return await self._p.reader.schedules(after_id=after("after_id", after_id), limit=limit)
