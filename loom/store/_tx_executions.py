"""The executions and intents part of `Tx`: attempts under their fences, lease expiry and release, and
the intents an attempt's results carry."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..records.notices import AttemptEnded, LeaseExpiry
from ..records.work import (
    CAPACITY_STATES,
    EXECUTION_LIFECYCLE,
    INTENT_LIFECYCLE,
    OPEN_INTENT_STATUSES,
    Execution,
    ExecutionState,
    Intent,
    IntentKind,
    IntentStatus,
    Policy,
)
from . import _sql
from ._tx_base import MISSING, TxBase

_OPEN_INTENTS_EXIST = f"SELECT EXISTS (SELECT 1 FROM intents WHERE status IN {_sql.OPEN_INTENTS})"

_LIVE = _sql.LIVE
ENDED_STATES = frozenset(
    {
        ExecutionState.COMPLETED,
        ExecutionState.HANDOFF,
        ExecutionState.FAILED,
        ExecutionState.CANCELLED,
        ExecutionState.WAITED,
        ExecutionState.PARKED,
    }
)
"""The states an attempt ends in (or pauses in, parked on a wait): reaching one announces `AttemptEnded`."""


def ended_as(state: ExecutionState, outcome: str | None) -> str:
    """How an attempt ended, for `AttemptEnded`: its state, told apart where the outcome says more
    (``not_adoptable``: failed because its executor could not verify it after its lease expired;
    ``timed_out``: failed at its execution deadline; ``interrupted``: stopped by an interrupt)."""
    if state is not ExecutionState.FAILED and state is not ExecutionState.CANCELLED:
        return state.value  # nothing in the outcome tells it apart: not read
    recorded = json.loads(outcome) if outcome else {}
    if state is ExecutionState.FAILED and recorded.get("recovery"):
        return "not_adoptable"
    if state is ExecutionState.FAILED and "timeout_event_id" in recorded:
        return "timed_out"
    if state is ExecutionState.CANCELLED and recorded.get("kind") == "interrupted":
        return "interrupted"
    return state.value


_EXECUTION_FIELDS = frozenset(
    {
        "epoch",
        "token",
        "owner",
        "expires_at_ms",
        "outcome",
        "interrupt_event_id",
        "ended_at_ms",
        "segment",
        "budget_ms",
        "used_ms",
        "segment_started_ms",
        "deadline_timer_id",
        "watermark",
        "authority_id",
        "inputs",
        "trigger_id",
        "handed_at_ms",
        "metadata",
        "retry_policy",
        "binding_config",
        "pool",
    }
)


class ExecutionsTx(TxBase):
    # -- executions -------------------------------------------------------------

    def execution(self, execution_id: str) -> Execution | None:
        known = self.recall("execution", execution_id)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._execution_row(execution_id)
        if row is None:
            return None
        execution: Execution = self.keep("execution", execution_id, _sql.execution_from_row(row))
        return execution

    def _execution_row(self, execution_id: str) -> tuple[Any, ...] | None:
        """An attempt's row, read; the token and the segment's clock that ride along are kept (a fenced
        call reads them next: one query fewer each), and so is ``None`` for no such attempt."""
        row = self._kept_attempt(execution_id) if self._kept is not None else None
        if row is None:
            row = self._one(_sql.EXECUTION_AND_CLOCK_BY_ID, (execution_id,))
            if row is not None and self._kept is not None:
                self._to_carry.attempts[execution_id] = row  # (until a write of it: `changed_attempt`)
        if row is None:
            self.keep("execution", execution_id, None)
            return None
        width = _sql.EXECUTION_WIDTH
        self.keep("execution_token", execution_id, row[width])
        self.keep("segment_clock", execution_id, (row[width + 1], row[width + 2]))
        return row

    def _kept_attempt(self, execution_id: str) -> tuple[Any, ...] | None:
        """The attempt's row as this transaction read, inserted or wrote it, else as a committed
        transaction that did left it (`Carried.attempts`: a database alone only) unless this one wrote
        it since; ``None`` otherwise."""
        assert self._kept is not None
        to_carry = self._to_carry
        row = to_carry.attempts.get(execution_id)
        if row is not None or to_carry.attempts_lost or execution_id in to_carry.attempts_changed:
            return row
        return self._kept.attempts.get(execution_id)

    def _writing_attempt(self, execution_id: str) -> tuple[Any, ...] | None:
        """A statement is about to write the attempt's row: what was kept of it no longer answers. Returns
        the row this transaction knew (`_kept_attempt`), for `_attempt_written` once the write is done."""
        row = self._kept_attempt(execution_id) if self._kept is not None else None
        self._to_carry.changed_attempt(execution_id)
        return row

    def _attempt_written(
        self, execution_id: str, row: tuple[Any, ...] | None, values: dict[str, Any]
    ) -> None:
        """``values`` (by column) were written to the attempt's row, known before as ``row``: keep the
        row as a read would give it now."""
        if row is not None:
            self._to_carry.attempts[execution_id] = _sql.execution_row_written(row, values)

    def execution_segment_clock(self, execution_id: str) -> tuple[int | None, str | None]:
        """When the active segment started, and its deadline timer."""
        known = self.recall("segment_clock", execution_id)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._one(
            "SELECT segment_started_ms, deadline_timer_id FROM executions WHERE id = ?", (execution_id,)
        )
        return (row[0], row[1]) if row else (None, None)

    def expired_leases(
        self, now_ms: int, after: tuple[int, str], limit: int
    ) -> list[tuple[str, int, int, tuple[str, str | None] | None]]:
        """(id, epoch, expires_at_ms, its Work's scope and kind or ``None``) of running or recovering
        attempts whose lease has expired (``now >= expires_at``: expiry is exclusive), in (expiry, id)
        order after ``after``: a bounded, fair page. On a shared database the rows are locked until the
        transaction ends, skipping those another node's pass holds (the Works' rows are not: scalar
        subqueries). Each row is read whole: the claim that follows reads none again (`_kept_attempt`;
        a database alone)."""
        width = _sql.EXECUTION_WIDTH + 3
        rows = self._all(
            f"{_sql.EXECUTION_AND_CLOCK_SELECT}, (SELECT w.scope FROM works w WHERE w.id = e.work_id),"
            " (SELECT w.kind FROM works w WHERE w.id = e.work_id) FROM executions e"
            " WHERE state IN (?, ?) AND expires_at_ms <= ? AND (expires_at_ms, id) > (?, ?)"
            f" ORDER BY expires_at_ms, id LIMIT ?{self.dialect.skip_locked}",
            (
                ExecutionState.RUNNING.value,
                ExecutionState.RECOVERING.value,
                now_ms,
                after[0],
                after[1],
                limit,
            ),
        )
        if self._kept is not None:
            for r in rows:
                self._to_carry.attempts[r[0]] = r[:width]
        at = _sql.EXECUTION_AT
        return [
            (
                r[0],
                r[at["epoch"]],
                r[at["expires_at_ms"]],
                None if r[width] is None else (r[width], r[width + 1]),
            )
            for r in rows
        ]

    def next_lease_expiry(self) -> int | None:
        """The earliest expiry among running and recovering attempts (``None``: there are none)."""
        row = self._one(
            "SELECT min(expires_at_ms) FROM executions WHERE state IN (?, ?)",
            (ExecutionState.RUNNING.value, ExecutionState.RECOVERING.value),
        )
        return int(row[0]) if row and row[0] is not None else None

    def work_retry_timer(self, work_id: str) -> str | None:
        row = self._one("SELECT retry_timer_id FROM works WHERE id = ?", (work_id,))
        return str(row[0]) if row and row[0] is not None else None

    def release_leases(self, owner: str | None, now_ms: int, *, executors_only: bool = False) -> int:
        """The leases ``owner`` holds (``None``: every lease) expire now: a clean close, so the next open
        recovers them at once; or an open that knows their holders are dead. With ``executors_only``,
        only attempts an executor ran (a host claim's holder is code outside the runtime)."""
        self._to_carry.lose_attempts()
        cur = self._conn.execute(
            "UPDATE executions SET expires_at_ms = ? WHERE (CAST(? AS TEXT) IS NULL OR owner = ?)"
            " AND state IN (?, ?) AND expires_at_ms > ?"
            + (" AND executor IS NOT NULL" if executors_only else ""),
            (now_ms, owner, owner, ExecutionState.RUNNING.value, ExecutionState.RECOVERING.value, now_ms),
        )
        if cur.rowcount:
            self.notify(LeaseExpiry(execution_id=None, expires_at_ms=now_ms))
        return int(cur.rowcount)

    def release_incarnations(self, node: str, owner: str, now_ms: int) -> int:
        """The leases of the node's earlier incarnations (owners ``<node>#...`` but ``owner``) expire now."""
        prefix = node + "#"
        self._to_carry.lose_attempts()
        cur = self._conn.execute(
            "UPDATE executions SET expires_at_ms = ? WHERE substr(owner, 1, ?) = ? AND owner <> ?"
            " AND state IN (?, ?) AND expires_at_ms > ?",
            (
                now_ms,
                len(prefix),
                prefix,
                owner,
                ExecutionState.RUNNING.value,
                ExecutionState.RECOVERING.value,
                now_ms,
            ),
        )
        return int(cur.rowcount)

    def execution_token(self, execution_id: str) -> str | None:
        known = self.recall("execution_token", execution_id)
        if known is not MISSING:
            return known  # type: ignore[no-any-return]
        row = self._one("SELECT token FROM executions WHERE id = ?", (execution_id,))
        return row[0] if row else None

    def execution_state(self, execution_id: str) -> ExecutionState | None:
        """An attempt's state alone (its whole row is read and decoded only when it is needed), answered
        from what the transaction keeps: the state its end told (`ended`), or the attempt it read."""
        told = self.recall("execution_state", execution_id)
        if told is not MISSING:
            return told  # type: ignore[no-any-return]
        known = self.recall("execution", execution_id)
        if known is not MISSING:
            return None if known is None else known.state
        # the whole row, kept to be decoded if asked for (a continuation's binding reads it next)
        row = self._execution_row(execution_id)
        if row is None:
            return None
        self.known_lazily("execution", execution_id, lambda: _sql.execution_from_row(row))
        return ExecutionState(row[3])

    def ended(self, execution_id: str, state: ExecutionState) -> None:
        """The attempt's end (its last write in this transaction) left it in ``state``: a later read of
        its state in this transaction, until a row changes, is answered without a query."""
        self.known("execution_state", execution_id, state)

    def live_execution(self, work_id: str) -> Execution | None:
        row = self._one(f"{_sql.EXECUTION_SELECT} WHERE work_id = ? AND state IN {_LIVE}", (work_id,))
        return _sql.execution_from_row(row) if row else None

    def insert_execution(
        self,
        *,
        id: str,
        work_id: str,
        attempt: int,
        token: str,
        owner: str,
        expires_at_ms: int,
        trigger_id: str | None,
        inputs: Sequence[str],
        binding: str | None,
        executor: str | None,
        capabilities: Sequence[str],
        generation: int,
        now_ms: int,
        watermark: int = 0,
        authority_id: str | None = None,
        pool: str | None = None,
        retry_policy: str | None = None,
        binding_config: str | None = None,
        handed_at_ms: int | None = None,
        budget_ms: int | None = None,
    ) -> None:
        inputs_json, capabilities_json = json.dumps(list(inputs)), json.dumps(sorted(capabilities))
        self._conn.execute(
            "INSERT INTO executions (id, work_id, attempt, state, epoch, token, owner, expires_at_ms, trigger_id,"
            " inputs, binding, executor, capabilities, generation, created_at_ms, watermark, authority_id, pool,"
            " retry_policy, binding_config, handed_at_ms, budget_ms)"
            " VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                id,
                work_id,
                attempt,
                ExecutionState.RUNNING.value,
                token,
                owner,
                expires_at_ms,
                trigger_id,
                inputs_json,
                binding,
                executor,
                capabilities_json,
                generation,
                now_ms,
                watermark,
                authority_id,
                pool,
                retry_policy,
                binding_config,
                handed_at_ms,
                budget_ms,
            ),
        )
        self.inserted(id)
        self.touch(work_id)
        self.notify(LeaseExpiry(execution_id=id, expires_at_ms=expires_at_ms))
        if self._kept is not None:  # (the row as a read gives it: `_kept_attempt` after its commit)
            for event_id in inputs:  # (claimed: no claim after this one needs them kept)
                self._to_carry.routed.pop(event_id, None)
                self._kept.take_routed(event_id)
            self._to_carry.attempts[id] = _sql.execution_read_row(
                dict(
                    id=id,
                    work_id=work_id,
                    attempt=attempt,
                    state=ExecutionState.RUNNING.value,
                    epoch=1,
                    owner=owner,
                    expires_at_ms=expires_at_ms,
                    trigger_id=trigger_id,
                    inputs=inputs_json,
                    binding=binding,
                    executor=executor,
                    capabilities=capabilities_json,
                    generation=generation,
                    created_at_ms=now_ms,
                    budget_ms=budget_ms,
                    watermark=watermark,
                    authority_id=authority_id,
                    handed_at_ms=handed_at_ms,
                    retry_policy=retry_policy,
                    binding_config=binding_config,
                    pool=pool,
                    token=token,
                )
            )

    def update_execution(self, execution_id: str, **fields: Any) -> None:
        """Set non-state ``fields`` on an execution (its state goes through `set_execution_state`)."""
        unknown = set(fields) - _EXECUTION_FIELDS
        assert not unknown, f"update_execution: unknown fields {unknown}"
        sets = ", ".join(f"{name} = ?" for name in fields)
        known = self._writing_attempt(execution_id)
        cur = self._conn.execute(
            f"UPDATE executions SET {sets} WHERE id = ?", (*fields.values(), execution_id)
        )
        if cur.rowcount == 1:
            self._attempt_written(execution_id, known, fields)
        if fields.get("expires_at_ms") is not None:
            self.notify(LeaseExpiry(execution_id=execution_id, expires_at_ms=fields["expires_at_ms"]))

    def set_execution_state(
        self, execution: Execution, new: ExecutionState, *, fence_only: bool = False, **fields: Any
    ) -> None:
        """Move ``execution`` from the state it was read in to ``new`` (checked against its lifecycle).
        ``fence_only``: a live attempt moves to another live state with a new fence (`TxBase.touch`)."""
        EXECUTION_LIFECYCLE.check(execution.id, execution.state, new)
        unknown = set(fields) - _EXECUTION_FIELDS
        assert not unknown, f"set_execution_state: unknown fields {unknown}"
        sets = "".join(f", {name} = ?" for name in fields)
        stored = self._states_later.pop(execution.id, execution.state)  # (a move that waited goes too)
        known = self._writing_attempt(execution.id)
        cur = self._conn.execute(
            f"UPDATE executions SET state = ?{sets} WHERE id = ? AND state = ?",
            (new.value, *fields.values(), execution.id, stored.value),
        )
        self._written(cur, f"execution {execution.id}", stored, new)
        self._attempt_written(execution.id, known, {"state": new.value, **fields})
        self.touch(execution.work_id, fence_only=fence_only)
        if new in ENDED_STATES and execution.state not in ENDED_STATES:
            self.notify(
                AttemptEnded(
                    execution_id=execution.id,
                    work_id=execution.work_id,
                    attempt=execution.attempt,
                    outcome=ended_as(new, fields.get("outcome")),
                )
            )
        if fields.get("expires_at_ms") is not None:
            self.notify(LeaseExpiry(execution_id=execution.id, expires_at_ms=fields["expires_at_ms"]))
        if execution.pool is not None and execution.state in CAPACITY_STATES and new not in CAPACITY_STATES:
            self.freed_pools.append(execution.pool)

    def set_execution_state_later(self, execution: Execution, new: ExecutionState) -> None:
        """`set_execution_state` from one running state to another (an adoption), written with the next
        move of the attempt's state in this transaction (one statement for both), which the caller makes
        sure comes (`write_state_later`). Its row reads as it was meanwhile."""
        EXECUTION_LIFECYCLE.check(execution.id, execution.state, new)
        assert execution.state in CAPACITY_STATES, "only from a running state"
        assert new in CAPACITY_STATES, "only to a running state"
        self._states_later[execution.id] = execution.state
        self.touch(execution.work_id)

    def write_state_later(self, execution: Execution) -> None:
        """Write the move `set_execution_state_later` left for ``execution`` (in the state it was moved
        to), unless a later move of its state took it."""
        if execution.id in self._states_later:
            self.set_execution_state(execution, execution.state)

    # -- intents ----------------------------------------------------------------

    def intent(self, intent_id: str) -> Intent | None:
        row = self._one(f"{_sql.INTENT_SELECT} WHERE id = ?", (intent_id,))
        return _sql.intent_from_row(row) if row else None

    def insert_intent(
        self,
        *,
        id: str,
        kind: IntentKind,
        work_id: str,
        event_id: str,
        execution_id: str,
        epoch: int,
        now_ms: int,
        error_fallback: Policy | None = None,
    ) -> None:
        self._conn.execute(
            "INSERT INTO intents (id, kind, work_id, event_id, execution_id, epoch, status,"
            " updated_at_ms, error_fallback) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (
                id,
                kind.value,
                work_id,
                event_id,
                execution_id,
                epoch,
                IntentStatus.PENDING.value,
                now_ms,
                error_fallback.value if error_fallback else None,
            ),
        )
        if self._open_intents is not None:
            self._open_intents = True

    def set_intent_status(
        self,
        intent: Intent,
        new: IntentStatus,
        now_ms: int,
        *,
        attempted: bool = False,
        next_attempt_ms: int | None = None,
    ) -> None:
        """Move ``intent`` from the status it was read in to ``new`` (checked against its lifecycle);
        ``attempted`` counts a dispatch attempt, ``next_attempt_ms`` schedules the next one."""
        INTENT_LIFECYCLE.check(intent.id, intent.status, new)
        cur = self._conn.execute(
            "UPDATE intents SET status = ?, attempts = attempts + ?, next_attempt_ms = ?, updated_at_ms = ?"
            " WHERE id = ? AND status = ?",
            (new.value, 1 if attempted else 0, next_attempt_ms, now_ms, intent.id, intent.status.value),
        )
        self._written(cur, f"intent {intent.id}", intent.status, new)
        if self._open_intents is not None and new in OPEN_INTENT_STATUSES:
            self._open_intents = True

    def open_intents_exist(self) -> bool:
        """Whether an intent may be open (undispatched, or dispatched and unanswered). ``False`` is sure:
        the first call of a transaction alone on its database reads it, and only its own writes (an intent
        inserted, or moved back to an open status) make it true again, so most attempts that end where
        no intent is open read none. On a shared database another node may add one: always true there."""
        if not self._caching:
            return True
        if self._open_intents is None:
            row = self._one(_OPEN_INTENTS_EXIST)
            assert row is not None
            self._open_intents = bool(row[0])
        return self._open_intents

    def open_intents_of_execution(self, execution_id: str) -> list[Intent]:
        """The attempt's open intents, by id (no read where none is open: `open_intents_exist`)."""
        if not self.open_intents_exist():
            return []
        return [i for i in self.intents_of_execution(execution_id) if i.status in OPEN_INTENT_STATUSES]

    def intents_of_execution(self, execution_id: str) -> list[Intent]:
        rows = self._all(f"{_sql.INTENT_SELECT} WHERE execution_id = ?", (execution_id,))
        return [_sql.intent_from_row(r) for r in sorted(rows, key=lambda r: r[0])]  # by id; none, mostly
