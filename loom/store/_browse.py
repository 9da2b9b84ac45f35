"""Reads for browsing the store (the web console of ``loom serve``): newest first, each page one bounded
read along an index, whatever the store holds.

* Works by last change (``works_changed``: the ``(updated_at_ms, id, state, scope)`` index, so a page
  filtered by state or scope is read from the index alone), or those whose key starts with a prefix
  (the keys' primary index); counts by state (the ``(state, scope)`` index, each count capped).
* Events newest first with their routing checkpoints; diagnostics newest first; armed timers by due
  time; recurring timers (schedules) by id.

Cursors are the last row's sort key: ``(updated_at_ms, id)`` for Works, a sequence or an id otherwise.
"""

from __future__ import annotations

from typing import Any

from ..records.events import Diagnostic, Event
from ..records.timers import Timer
from ..records.work import Checkpoint, Work
from . import _sql

Rows = list[tuple[Any, ...]]
WORK_STATES = ("ready", "running", "waiting", "completed", "cancelled", "failed")
MAX_KEY = "\U0010ffff"
"""Sorts after every character: ``key >= p AND key < p + MAX_KEY`` is "starts with p" along an index
(text compares in code point order on both backends)."""


def scope_clause(scope: str | None, column: str = "scope") -> tuple[str, tuple[Any, ...]]:
    """``scope`` and the scopes below it, as a range an index on ``column`` can read ('0' follows '/')."""
    if scope is None:
        return "", ()
    return f" AND ({column} = ? OR ({column} > ? AND {column} < ?))", (scope, scope + "/", scope + "0")


class BrowseReads:
    """The browsing reads, mixed into every `Reader` (they run on its connection)."""

    async def _all(self, sql: str, params: tuple[Any, ...]) -> Rows:
        raise NotImplementedError

    async def _snapshot(self, queries: list[tuple[str, tuple[Any, ...]]]) -> list[Rows]:
        raise NotImplementedError

    async def _works_of_page(self, page: str, args: tuple[Any, ...], order: str) -> list[Work]:
        """The Works whose ids ``page`` selects (with ``args``), in ``order``, read in one snapshot."""
        rows, keys, pending, live, waits = await self._snapshot(
            [
                (f"{_sql.WORK_SELECT} WHERE id IN ({page}) ORDER BY {order}", args),
                (_sql.PAGE_KEYS.format(page=page), args),
                (_sql.PAGE_PENDING.format(page=page), args),
                (_sql.PAGE_LIVE_EXECUTIONS.format(page=page), args),
                (_sql.PAGE_OPEN_WAITS.format(page=page), args),
            ]
        )
        keys_of: dict[str, list[str]] = {}
        for work_id, key in keys:
            keys_of.setdefault(work_id, []).append(key)
        pending_of: dict[str, list[str]] = {}
        for work_id, event_id in pending:
            pending_of.setdefault(work_id, []).append(event_id)
        live_of = {row[0]: row[1:] for row in live}
        wait_of = {work_id: wait_id for work_id, wait_id in waits}
        return [
            _sql.work_from_row(
                row,
                tuple(keys_of.get(row[0], ())),
                tuple(pending_of.get(row[0], ())),
                live_of.get(row[0]),
                wait_of.get(row[0]),
            )
            for row in rows
        ]

    async def works_changed(
        self,
        *,
        state: str | None,
        scope: str | None,
        before: tuple[int, str] | None,
        limit: int,
        key_prefix: str | None = None,
    ) -> list[Work]:
        """Works by last change, newest first, before the cursor ``(updated_at_ms, id)``; ``key_prefix``:
        only those owning a key that starts with it (the first ``limit`` such keys)."""
        where = "1 = 1"
        params: tuple[Any, ...] = ()
        if before is not None:
            where += " AND (updated_at_ms < ? OR (updated_at_ms = ? AND id < ?))"
            params += (before[0], before[0], before[1])
        if state is not None:
            where += " AND state = ?"
            params += (state,)
        clause, scope_params = scope_clause(scope)
        where += clause
        params += scope_params
        if key_prefix is not None:
            where += (
                " AND id IN (SELECT work_id FROM work_keys WHERE key >= ? AND key < ? ORDER BY key LIMIT ?)"
            )
            params += (key_prefix, key_prefix + MAX_KEY, limit)
        page = f"SELECT id FROM works WHERE {where} ORDER BY updated_at_ms DESC, id DESC LIMIT ?"
        return await self._works_of_page(page, (*params, limit), "updated_at_ms DESC, id DESC")

    async def work_counts(self, scope: str | None, cap: int) -> dict[str, int]:
        """Works in each state (``scope``: that scope and those below it), each count stopping at ``cap``."""
        clause, scope_params = scope_clause(scope)
        rows = await self._snapshot(
            [
                (
                    f"SELECT count(*) FROM (SELECT 1 FROM works WHERE state = ?{clause} LIMIT ?) AS w",
                    (state, *scope_params, cap),
                )
                for state in WORK_STATES
            ]
        )
        return {state: int(found[0][0]) for state, found in zip(WORK_STATES, rows, strict=True)}

    async def events_newest(
        self, *, before_seq: int | None, type: str | None, limit: int
    ) -> list[tuple[Event, Checkpoint | None]]:
        """Events newest first, before ``before_seq``, each with its routing checkpoint (``None``: not
        routed yet)."""
        where = "1 = 1"
        params: tuple[Any, ...] = ()
        if before_seq is not None:
            where += " AND seq < ?"
            params += (before_seq,)
        if type is not None:
            where += " AND type = ?"
            params += (type,)
        page = f"SELECT seq FROM events WHERE {where} ORDER BY seq DESC LIMIT ?"
        args = (*params, limit)
        events, checkpoints = await self._snapshot(
            [
                (f"SELECT {_sql.EVENT_COLUMNS} FROM events WHERE {where} ORDER BY seq DESC LIMIT ?", args),
                (f"SELECT {_sql.CHECKPOINT_COLUMNS} FROM checkpoints WHERE seq IN ({page})", args),
            ]
        )
        routed = {cp.event_id: cp for cp in map(_sql.checkpoint_from_row, checkpoints)}
        return [(event, routed.get(event.id)) for event in map(_sql.event_from_row, events)]

    async def diagnostics_newest(
        self, *, kind: str | None, subject: str | None, before_id: int | None, limit: int
    ) -> list[Diagnostic]:
        where = "1 = 1"
        params: tuple[Any, ...] = ()
        for column, value in (("kind", kind), ("subject", subject)):
            if value is not None:
                where += f" AND {column} = ?"
                params += (value,)
        if before_id is not None:
            where += " AND id < ?"
            params += (before_id,)
        rows = await self._all(
            "SELECT id, kind, subject, message, detail, at_ms FROM diagnostics"
            f" WHERE {where} ORDER BY id DESC LIMIT ?",
            (*params, limit),
        )
        return [_sql.diagnostic_from_row(r) for r in rows]

    async def timers_due(self, *, after: tuple[int, str] | None, limit: int) -> list[Timer]:
        """Armed timers by due time, earliest first, after the cursor ``(fire_at_ms, id)``."""
        where = "state = 'armed'"
        params: tuple[Any, ...] = ()
        if after is not None:
            where += " AND (fire_at_ms > ? OR (fire_at_ms = ? AND id > ?))"
            params += (after[0], after[0], after[1])
        rows = await self._all(
            f"{_sql.TIMER_SELECT} WHERE {where} ORDER BY fire_at_ms, id LIMIT ?", (*params, limit)
        )
        return [_sql.timer_from_row(r) for r in rows]

    async def schedules(self, *, after_id: str, limit: int) -> list[Timer]:
        """Recurring timers (a recurrence policy or a fixed interval), by id, in any state."""
        rows = await self._all(
            f"{_sql.TIMER_SELECT} WHERE (recurrence IS NOT NULL OR interval_ms IS NOT NULL) AND id > ?"
            " ORDER BY id LIMIT ?",
            (after_id, limit),
        )
        return [_sql.timer_from_row(r) for r in rows]
