"""The wait part of `Tx`: waits, their watched keys, and the matching-Event scan."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from ..records.events import Event
from ..records.waits import WAIT_LIFECYCLE, Wait, WaitState
from ..records.work import InputState
from . import _sql
from ._tx_base import TxBase

WAIT_COLUMNS = (
    "id, work_id, execution_id, attempt, epoch, state, keys, types, after_seq, resume, timeout_at_ms,"
    " timeout_timer_id, timeout_delivery_id, winner_event_id, bridge_event_id, reason, created_at_ms,"
    " woken_at_ms, detail"
)
WAIT_SELECT = f"SELECT {WAIT_COLUMNS} FROM waits"
_WOKEN_AT = WAIT_COLUMNS.replace(" ", "").split(",").index("woken_at_ms")
_UNTAKEN_WAKE = (
    f"{WAIT_SELECT} WHERE work_id = ? AND state = '{WaitState.WOKEN.value}' AND taken_at_ms IS NULL"
)
_OPEN_STATES = (WaitState.ACTIVE.value, WaitState.BLOCKED.value)
_OPEN = f"('{WaitState.ACTIVE.value}', '{WaitState.BLOCKED.value}')"
_WAITS_EXIST = (
    f"SELECT EXISTS (SELECT 1 FROM waits WHERE state IN {_OPEN}),"
    f" EXISTS (SELECT 1 FROM waits WHERE state = '{WaitState.WOKEN.value}' AND taken_at_ms IS NULL)"
)


def wait_from_row(row: tuple[Any, ...]) -> Wait:
    return Wait(
        id=row[0],
        work_id=row[1],
        execution_id=row[2],
        attempt=row[3],
        epoch=row[4],
        state=WaitState(row[5]),
        keys=tuple(json.loads(row[6])),
        types=tuple(json.loads(row[7])),
        after_seq=row[8],
        resume=bool(row[9]),
        timeout_at_ms=row[10],
        timeout_timer_id=row[11],
        timeout_delivery_id=row[12],
        winner_event_id=row[13],
        bridge_event_id=row[14],
        reason=row[15],
        created_at_ms=row[16],
        woken_at_ms=row[17],
        detail=json.loads(row[18]),
    )


_WAIT_FIELDS = frozenset(
    {
        "winner_event_id",
        "bridge_event_id",
        "reason",
        "woken_at_ms",
        "timeout_timer_id",
        "taken_at_ms",
        "detail",
    }
)


class WaitsTx(TxBase):
    def wait(self, wait_id: str) -> Wait | None:
        row = self._one(f"{WAIT_SELECT} WHERE id = ?", (wait_id,))
        return wait_from_row(row) if row else None

    def open_wait_of_work(self, work_id: str) -> Wait | None:
        """The Work's active or blocked wait (at most one: one per attempt, one live attempt per Work)."""
        row = self._one(f"{WAIT_SELECT} WHERE work_id = ? AND state IN {_OPEN}", (work_id,))
        return wait_from_row(row) if row else None

    def waits_exist(self) -> tuple[bool, bool]:
        """Whether any wait may be open, and whether any woken wait's continuation may not have started.
        ``False`` is sure: the first call of a transaction alone on its database reads both, and only its
        own writes make either true again (a wait it inserts or opens, a wake), so most Events routed and
        attempts started where nothing waits read no wait at all. On a shared database another node may
        add one at any time: both are always true there."""
        if not self._caching:
            return True, True
        if self._waits_exist is None:
            row = self._one(_WAITS_EXIST)
            assert row is not None
            self._waits_exist = [bool(row[0]), bool(row[1])]
            # none untaken now: every one from here on is this transaction's wake (`untaken_wake`)
            self._untaken = None if row[1] else {}
        return self._waits_exist[0], self._waits_exist[1]

    def _wait_written(self, state: str, *, taken: bool) -> None:
        """This transaction wrote a wait, leaving it in ``state`` (``taken``: its continuation started)."""
        self._waits_on_key.clear()
        if self._waits_exist is not None:
            if state in _OPEN_STATES:
                self._waits_exist[0] = True
            elif state == WaitState.WOKEN.value and not taken:
                self._waits_exist[1] = True

    def open_waits_on_key(self, key: str) -> list[Wait]:
        """Active or blocked waits watching ``key``. A repeated read is answered from the first until the
        transaction writes a wait (routing reads them before and after it routes an Event; SQLite only)."""
        known = self._waits_on_key.get(key)
        if known is not None:
            return list(known)
        if not self.waits_exist()[0]:
            return []
        rows = self._all(
            f"{WAIT_SELECT} w WHERE w.state IN {_OPEN} AND w.id IN (SELECT wait_id FROM wait_keys WHERE key = ?)",
            (key,),
        )
        waits = [wait_from_row(r) for r in rows]
        if self._caching:
            self._waits_on_key[key] = tuple(waits)
        return waits

    def untaken_wake(self, work_id: str) -> Wait | None:
        """The Work's woken wait whose continuation has not started yet."""
        # at most a row or two: the latest is picked here, which spares SQLite a sort of its own per claim.
        # The state is written into the statement: a parameter compared with a column that a partial
        # index's WHERE compares with a constant (waits_untaken) makes SQLite prepare the statement again
        # at every use (about 20 us), a literal lets it keep the prepared one
        if not self.waits_exist()[1]:
            return None
        if self._untaken is not None:  # each one this transaction's own wake, kept as it wrote it
            made = self._untaken.get(work_id)
            if not made:
                return None
            newest: Wait = max(made.values(), key=lambda w: (w.woken_at_ms or 0, w.id))
            return newest
        rows = self._all(_UNTAKEN_WAKE, (work_id,))
        if not rows:
            return None
        return wait_from_row(max(rows, key=lambda r: (r[_WOKEN_AT] or 0, r[0])))

    def take_wake(self, wait: Wait, now_ms: int) -> None:
        """The continuation of a woken wait started: it is not handed to another attempt."""
        self._update_wait(wait, wait.state.value, {"taken_at_ms": now_ms})

    def waits_of_work(self, work_id: str) -> list[Wait]:
        return [
            wait_from_row(r)
            for r in self._all(f"{WAIT_SELECT} WHERE work_id = ? ORDER BY attempt, epoch, id", (work_id,))
        ]

    def insert_wait(self, wait: Wait) -> None:
        self._wait_written(wait.state.value, taken=False)
        self._to_carry.work_written(wait.work_id)  # (its open wait is a part of the Work)
        if wait.state is WaitState.WOKEN:
            self._untaken = None  # (not kept: read them)
        self._conn.execute(
            f"INSERT INTO waits ({WAIT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                wait.id,
                wait.work_id,
                wait.execution_id,
                wait.attempt,
                wait.epoch,
                wait.state.value,
                json.dumps(list(wait.keys)),
                json.dumps(list(wait.types)),
                wait.after_seq,
                int(wait.resume),
                wait.timeout_at_ms,
                wait.timeout_timer_id,
                wait.timeout_delivery_id,
                wait.winner_event_id,
                wait.bridge_event_id,
                wait.reason,
                wait.created_at_ms,
                wait.woken_at_ms,
                json.dumps(dict(wait.detail), sort_keys=True),
            ),
        )
        self._conn.executemany(
            "INSERT INTO wait_keys (key, wait_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(key, wait.id) for key in wait.keys],
        )

    def set_wait_state(self, wait: Wait, new: WaitState, **fields: Any) -> None:
        """Move ``wait`` from the state it was read in to ``new`` (checked against its lifecycle)."""
        WAIT_LIFECYCLE.check(wait.id, wait.state, new)
        self._update_wait(wait, new.value, fields)

    def update_wait(self, wait: Wait, **fields: Any) -> None:
        """Set non-state fields on a wait it is still in the state it was read in."""
        self._update_wait(wait, wait.state.value, fields)

    def _update_wait(self, wait: Wait, state: str, fields: dict[str, Any]) -> None:
        unknown = set(fields) - _WAIT_FIELDS
        assert not unknown, f"wait: unknown fields {unknown}"
        values = [json.dumps(v, sort_keys=True) if k == "detail" else v for k, v in fields.items()]
        sets = "".join(f", {name} = ?" for name in fields)
        self._wait_written(state, taken=fields.get("taken_at_ms") is not None)
        self._to_carry.work_written(wait.work_id)
        cur = self._conn.execute(
            f"UPDATE waits SET state = ?{sets} WHERE id = ? AND state = ?",
            (state, *values, wait.id, wait.state.value),
        )
        self._written(cur, f"wait {wait.id}", wait.state, state)
        if self._untaken is not None:
            self._keep_untaken(wait, state, fields)

    def _keep_untaken(self, wait: Wait, state: str, fields: dict[str, Any]) -> None:
        """Keep `_untaken` true to what this write did: a wake adds the wait as written, a continuation's
        start takes it out, any other write of a kept one writes it there too."""
        made = self._untaken
        assert made is not None
        of_work = made.setdefault(wait.work_id, {})
        kept = of_work.pop(wait.id, None)
        if fields.get("taken_at_ms") is not None or state != WaitState.WOKEN.value:
            return
        if kept is None and wait.state is WaitState.WOKEN:
            return  # woken before this transaction read that none is untaken: taken then
        base = wait if kept is None else kept
        changes = {k: v for k, v in fields.items() if k != "taken_at_ms"}
        of_work[wait.id] = attrs.evolve(base, state=WaitState.WOKEN, **changes)

    def matching_candidates(
        self, work_id: str, keys: Sequence[str], after_seq: int, limit: int
    ) -> list[Event]:
        """Accepted Events after ``after_seq`` on ``keys``, in sequence order, that are not the Work's own
        (published by one of its executions), not core control Events, and not input it already took in."""
        if not keys:
            return []
        marks = ", ".join("?" for _ in keys)
        rows = self._all(
            f"SELECT {_sql.EVENT_COLUMNS} FROM events e WHERE e.key IN ({marks}) AND e.seq > ?"
            " AND e.type NOT LIKE 'core.%'"
            " AND NOT (e.execution_id IS NOT NULL AND e.execution_id IN (SELECT id FROM executions WHERE work_id = ?))"
            " AND NOT EXISTS (SELECT 1 FROM work_inputs i WHERE i.work_id = ? AND i.event_id = e.id AND i.state != ?)"
            " ORDER BY e.seq LIMIT ?",
            (*keys, after_seq, work_id, work_id, InputState.PENDING.value, limit),
        )
        return [_sql.event_from_row(r) for r in rows]
