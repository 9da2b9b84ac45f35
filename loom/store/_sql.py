"""Row shapes and read queries shared by the write-side `Tx` and the read-side `Reader`."""

from __future__ import annotations

import enum
import functools
import json
import operator
from typing import Any, TypeVar

from ..records.events import Diagnostic, Event, KVEntry
from ..records.frozen import freeze
from ..records.timers import Firing, FiringResult, Timer, TimerState
from ..records.work import (
    LIVE_EXECUTION_STATES,
    OPEN_INTENT_STATUSES,
    Checkpoint,
    CheckpointStatus,
    Execution,
    ExecutionState,
    InputState,
    Intent,
    IntentKind,
    IntentStatus,
    Policy,
    RetryState,
    Work,
    WorkState,
)

EVENT_COLUMNS = (
    "id, seq, source, delivery_id, type, scope, key, work_id, execution_id, payload, "
    "parent_id, cause_id, root_id, depth, accepted_at_ms"
)
EVENT_BY_ID = f"SELECT {EVENT_COLUMNS} FROM events WHERE id = ?"
EVENT_BY_DELIVERY = f"SELECT {EVENT_COLUMNS} FROM events WHERE source = ? AND delivery_id = ?"
EVENTS_AFTER = f"SELECT {EVENT_COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?"
EVENTS_OF_TYPE_AFTER = f"SELECT {EVENT_COLUMNS} FROM events WHERE type = ? AND seq > ? ORDER BY seq LIMIT ?"
EVENTS_OF_ROOT = (
    f"SELECT {EVENT_COLUMNS} FROM events WHERE id = ? AND root_id = id"
    " AND (CAST(? AS TEXT) IS NULL OR type = ?) AND seq > ?"
    f" UNION ALL SELECT {EVENT_COLUMNS} FROM events WHERE root_id = ? AND root_id != id"
    " AND (CAST(? AS TEXT) IS NULL OR type = ?) AND seq > ?"
    " ORDER BY seq LIMIT ?"
)
"""The Events under a causal root: the root itself, by its id (a root is its own root and is not in
``events_root``), and those derived from it, by the index."""
INSERT_EVENT = (
    "INSERT INTO events (id, source, delivery_id, type, scope, key, work_id, execution_id, payload,"
    " parent_id, cause_id, root_id, depth, accepted_at_ms)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
"""An Event's insert. Its sequence is the row's id: on SQLite the cursor's ``lastrowid`` (a ``RETURNING``
clause costs SQLite a fifth of the insert); elsewhere `INSERT_EVENT_RETURNING` answers it."""
INSERT_NEW_EVENT = (
    "INSERT INTO events (id, source, delivery_id, type, scope, key, work_id, execution_id, payload,"
    " parent_id, cause_id, root_id, depth, accepted_at_ms)"
    " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
    " WHERE NOT EXISTS (SELECT 1 FROM events e WHERE e.source = ? AND e.delivery_id = ?)"
    " AND NOT EXISTS (SELECT 1 FROM event_tombstones t WHERE t.source = ? AND t.delivery_id = ?)"
)
"""`INSERT_EVENT` unless an Event or a tombstone holds the delivery identity (no row is written, and no
sequence drawn: a conflict would spend one). Parameters: the Event's, then (source, delivery_id) twice."""
INSERT_EVENT_RETURNING = INSERT_EVENT + " RETURNING seq"
INSERT_NEW_EVENT_RETURNING = INSERT_NEW_EVENT + " RETURNING seq"
"""`INSERT_EVENT` and `INSERT_NEW_EVENT` answering the new Event's sequence (`Dialect.seq_by_rowid`)."""
DELIVERY = (
    "SELECT "
    + ", ".join(f"e.{column.strip()}" for column in EVENT_COLUMNS.split(","))
    + ", t.seq, t.accepted_at_ms FROM (SELECT 1 AS probe) AS p"
    " LEFT JOIN events e ON e.source = ? AND e.delivery_id = ?"
    " LEFT JOIN event_tombstones t ON t.source = ? AND t.delivery_id = ?"
)
"""One row for a delivery identity: the Event accepted with it (columns all null without one), then a
tombstone's sequence and acceptance time (null without one)."""
EVENT_COUNT = "SELECT count(*) FROM events"
KV_GET = "SELECT namespace, key, value, updated_at_ms FROM kv WHERE namespace = ? AND key = ?"
KV_LIST = "SELECT namespace, key, value, updated_at_ms FROM kv WHERE namespace = ? ORDER BY key LIMIT ?"
BUCKET_COUNT = "SELECT count FROM causal_buckets WHERE root_id = ? AND minute = ?"

Row = tuple[Any, ...]

E = TypeVar("E", bound=enum.Enum)


class _Members(dict[Any, E]):
    """An enum's members by value: a dict lookup where calling the enum takes a Python-level call (a
    row decodes several). A value no member has is refused as the enum refuses it."""

    def __init__(self, cls: type[E]) -> None:
        super().__init__((member.value, member) for member in cls)
        self._cls = cls

    def __missing__(self, value: Any) -> E:
        return self._cls(value)


_EXECUTION_STATES = _Members(ExecutionState)
_WORK_STATES = _Members(WorkState)
_RETRY_STATES = _Members(RetryState)
_TIMER_STATES = _Members(TimerState)
_CHECKPOINT_STATUSES = _Members(CheckpointStatus)
_POLICIES = _Members(Policy)


@functools.lru_cache(maxsize=1024)
def _shared_json(text: str) -> Any:
    """A JSON column whose texts repeat across rows (an attempt's pinned retry policy, its binding's
    configuration, its capabilities), decoded once and frozen: immutable, so every row may share it."""
    return freeze(json.loads(text))


@functools.lru_cache(maxsize=256)
def _capabilities(text: str) -> frozenset[str]:
    return frozenset(json.loads(text))


def event_from_row(row: Row) -> Event:
    return Event(
        id=row[0],
        seq=row[1],
        source=row[2],
        delivery_id=row[3],
        type=row[4],
        scope=row[5],
        key=row[6],
        work_id=row[7],
        execution_id=row[8],
        payload=json.loads(row[9]),
        parent_id=row[10],
        cause_id=row[11],
        root_id=row[12],
        depth=row[13],
        accepted_at_ms=row[14],
    )


def kv_from_row(row: Row) -> KVEntry:
    return KVEntry(namespace=row[0], key=row[1], value=json.loads(row[2]), updated_at_ms=row[3])


WORK_COLUMNS = (
    "id, scope, kind, state, revision, held, hold_reason, parent_id, predecessor_id, generation, attempts,"
    " started, created_at_ms, release_once, failures, retry, blocked, updated_at_ms"
)
WORK_SELECT = f"SELECT {WORK_COLUMNS} FROM works"
WORK_BY_ID = f"{WORK_SELECT} WHERE id = ?"
WORK_KEYS = "SELECT key FROM work_keys WHERE work_id = ? ORDER BY attached_seq, key"


def _sql_set(states: tuple[enum.Enum, ...]) -> str:
    """An SQL list literal of enum values (loom's own constants, never input)."""
    return "(" + ", ".join(f"'{state.value}'" for state in states) + ")"


LIVE = _sql_set(LIVE_EXECUTION_STATES)
OPEN_INTENTS = _sql_set(OPEN_INTENT_STATUSES)
WORK_PENDING = f"SELECT event_id FROM work_inputs WHERE work_id = ? AND state = '{InputState.PENDING.value}' ORDER BY seq"
WORK_PENDING_SEQ = f"SELECT event_id, seq FROM work_inputs WHERE work_id = ? AND state = '{InputState.PENDING.value}' ORDER BY seq"
WORK_LIVE_EXECUTION = f"SELECT id, state FROM executions WHERE work_id = ? AND state IN {LIVE}"
WORK_OPEN_WAIT = "SELECT id FROM waits WHERE work_id = ? AND state IN ('active', 'blocked')"
# the same, for every Work of a page (``{page}``: a query of the page's ids, which the caller fills in)
PAGE_KEYS = "SELECT work_id, key FROM work_keys WHERE work_id IN ({page}) ORDER BY work_id, attached_seq, key"
PAGE_PENDING = (
    f"SELECT work_id, event_id FROM work_inputs WHERE state = '{InputState.PENDING.value}'"
    " AND work_id IN ({page}) ORDER BY work_id, seq"
)
PAGE_LIVE_EXECUTIONS = (
    f"SELECT work_id, id, state FROM executions WHERE state IN {LIVE} AND work_id IN ({{page}})"
)
PAGE_OPEN_WAITS = "SELECT work_id, id FROM waits WHERE state IN ('active', 'blocked') AND work_id IN ({page})"
CHECKPOINT_COLUMNS = (
    "event_id, seq, status, work_id, route, route_scope, policy, effective_policy, fallback_reason, reason,"
    " generation, at_ms"
)
CHECKPOINT_BY_EVENT = (
    f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE seq = (SELECT seq FROM events WHERE id = ?)"
)
"""An Event's checkpoint, by the Event's sequence (checkpoints are keyed by it, not by the Event's id)."""
EVENT_TO_ROUTE = (
    "SELECT "
    + ", ".join(f"e.{column.strip()}" for column in EVENT_COLUMNS.split(","))
    + ", "
    + ", ".join(f"c.{column.strip()}" for column in CHECKPOINT_COLUMNS.split(","))
    + " FROM events e LEFT JOIN checkpoints c ON c.seq = e.seq WHERE e.id = ?"
)
"""An Event with its routing checkpoint, if it has one (columns of both, the checkpoint's all null
without one)."""
EVENTS_TO_ROUTE = EVENT_TO_ROUTE.removesuffix("= ?") + "IN ({ids})"
"""`EVENT_TO_ROUTE` for the Events whose ids ``{ids}`` lists (the caller fills it in)."""
CHECKPOINTS_OF_WORK = f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE work_id = ? ORDER BY commit_seq"
"""A Work's checkpoints in the order they were committed (each insert takes the next commit_seq)."""
UNROUTED_EVENTS = (
    f"SELECT {EVENT_COLUMNS} FROM events e WHERE e.seq > ?"
    " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.seq = e.seq) ORDER BY e.seq LIMIT ?"
)
FIRST_UNROUTED = (
    "SELECT e.seq FROM events e WHERE e.seq > ? AND e.seq <= ?"
    " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.seq = e.seq) ORDER BY e.seq LIMIT 1"
)
EXECUTION_COLUMNS = (
    "id, work_id, attempt, state, epoch, owner, expires_at_ms, trigger_id, inputs, binding, executor,"
    " capabilities, generation, outcome, interrupt_event_id, created_at_ms, ended_at_ms, segment, budget_ms, used_ms,"
    " watermark, authority_id, handed_at_ms, metadata, retry_policy, binding_config, pool"
)
EXECUTION_SELECT = f"SELECT {EXECUTION_COLUMNS} FROM executions"
EXECUTION_BY_ID = f"{EXECUTION_SELECT} WHERE id = ?"
EXECUTION_WIDTH = EXECUTION_COLUMNS.count(",") + 1
EXECUTION_AND_CLOCK_SELECT = f"SELECT {EXECUTION_COLUMNS}, token, segment_started_ms, deadline_timer_id"
EXECUTION_AND_CLOCK_BY_ID = f"{EXECUTION_AND_CLOCK_SELECT} FROM executions WHERE id = ?"
"""An attempt with its lease token and its active segment's clock, which a transaction asks for right
after (`ExecutionsTx.execution`)."""
_EXECUTION_READ = (
    *(c.strip() for c in EXECUTION_COLUMNS.split(",")),
    "token",
    "segment_started_ms",
    "deadline_timer_id",
)
_EXECUTION_DEFAULTS = {"segment": 1, "used_ms": 0}
"""The schema's defaults a new attempt's row takes (every other column left out is null)."""


_EXECUTION_BLANK = dict.fromkeys(_EXECUTION_READ) | _EXECUTION_DEFAULTS
_EXECUTION_PICK = operator.itemgetter(*_EXECUTION_READ)


def execution_read_row(values: dict[str, Any]) -> tuple[Any, ...]:
    """The row `EXECUTION_AND_CLOCK_BY_ID` reads of an attempt just inserted with ``values`` (by column)."""
    row: tuple[Any, ...] = _EXECUTION_PICK(_EXECUTION_BLANK | values)
    return row


EXECUTION_AT = {column: at for at, column in enumerate(_EXECUTION_READ)}
"""Where each column is in the row `EXECUTION_AND_CLOCK_BY_ID` reads."""


def execution_row_written(row: tuple[Any, ...], values: dict[str, Any]) -> tuple[Any, ...]:
    """The row `EXECUTION_AND_CLOCK_BY_ID` reads of an attempt read as ``row`` once ``values`` (by column,
    as the statement bound them) were written to it; a column that read does not take is left out."""
    patched = list(row)
    for column, value in values.items():
        at = EXECUTION_AT.get(column)
        if at is not None:
            # as SQLite answers it: an enum member by its value, a bool as an integer
            patched[at] = (
                value.value if isinstance(value, enum.Enum) else int(value) if type(value) is bool else value
            )
    return tuple(patched)


INTENT_SELECT = (
    "SELECT id, kind, work_id, event_id, execution_id, epoch, status, attempts, next_attempt_ms, error_fallback"
    " FROM intents"
)


@functools.lru_cache(maxsize=4)
def work_with_parts(json_pairs: str) -> str:
    """A Work's row with its keys, its live attempt and its open wait, in one query: ``json_pairs`` is
    the backend's aggregate of ``({a}, {b})`` pairs into a JSON array (`Dialect`). The keys come back in
    no order (`work_from_parts` sorts them: a Work has a key or two); at most one attempt is live
    (``executions_one_live``). Its pending inputs are read apart (`WORK_PENDING`, in the index's
    order): a Work may hold many, and one aggregate of them all costs more than the rows."""
    columns = ", ".join(f"w.{name.strip()}" for name in WORK_COLUMNS.split(","))
    keys = json_pairs.format(a="k.key", b="k.attached_seq")
    return (
        f"SELECT {columns}, x.id, x.state,"
        f" (SELECT {keys} FROM work_keys k WHERE k.work_id = w.id),"
        " (SELECT o.id FROM waits o WHERE o.work_id = w.id AND o.state IN ('active', 'blocked') LIMIT 1),"
        " w.ready_seq, w.ready_at_ms"
        f" FROM works w LEFT JOIN executions x ON x.work_id = w.id AND x.state IN {LIVE} WHERE w.id = ?"
    )


_WORK_WIDTH = WORK_COLUMNS.count(",") + 1
WORK_STATE = 3
WORK_REVISION = 4
WORK_UPDATED = _WORK_WIDTH - 1
"""Where a Work's row (`WORK_COLUMNS`) has its revision and its time of last change."""
WORK_QUEUE_PLACE = _WORK_WIDTH + 4
"""Where `work_with_parts` puts the Work's ``ready_seq`` and ``ready_at_ms`` (`Tx.queue_place`)."""


def _pairs(value: Any) -> list[Any]:
    """An aggregate of pairs as read: JSON text (SQLite), a list already (PostgreSQL), or none at all."""
    if value is None:
        return []
    return json.loads(value) if isinstance(value, str) else list(value)


def work_from_parts(row: Row, pending: tuple[str, ...]) -> Work:
    """A Work read by `work_with_parts`, with its pending inputs."""
    width = _WORK_WIDTH
    keys = tuple(key for key, _ in sorted(_pairs(row[width + 2]), key=lambda pair: (pair[1], pair[0])))
    live = row[width : width + 2] if row[width] is not None else None
    return work_from_row(row, keys, pending, live, row[width + 3])


def work_from_row(
    row: Row, keys: tuple[str, ...], pending: tuple[str, ...], live: Row | None, wait_id: str | None
) -> Work:
    return Work(
        id=row[0],
        scope=row[1],
        kind=row[2],
        state=_WORK_STATES[row[3]],
        revision=row[4],
        held=bool(row[5]),
        hold_reason=row[6],
        parent_id=row[7],
        predecessor_id=row[8],
        generation=row[9],
        attempts=row[10],
        started=bool(row[11]),
        created_at_ms=row[12],
        released=bool(row[13]),
        failures=row[14],
        retry=_RETRY_STATES[row[15]] if row[15] else None,
        blocked=row[16],
        updated_at_ms=row[17],
        keys=keys,
        pending_inputs=pending,
        current_execution_id=live[0] if live else None,
        execution_state=_EXECUTION_STATES[live[1]] if live else None,
        wait_id=wait_id,
    )


def checkpoint_from_row(row: Row) -> Checkpoint:
    return Checkpoint(
        event_id=row[0],
        seq=row[1],
        status=_CHECKPOINT_STATUSES[row[2]],
        work_id=row[3],
        route=row[4],
        route_scope=row[5],
        policy=_POLICIES[row[6]] if row[6] else None,
        effective_policy=_POLICIES[row[7]] if row[7] else None,
        fallback_reason=row[8],
        reason=row[9],
        generation=row[10],
        at_ms=row[11],
    )


def execution_from_row(row: Row) -> Execution:
    return Execution(
        id=row[0],
        work_id=row[1],
        attempt=row[2],
        state=_EXECUTION_STATES[row[3]],
        epoch=row[4],
        owner=row[5],
        expires_at_ms=row[6],
        trigger_id=row[7],
        inputs=tuple(json.loads(row[8])),
        binding=row[9],
        executor=row[10],
        capabilities=_capabilities(row[11]),
        generation=row[12],
        outcome=json.loads(row[13]) if row[13] else None,
        interrupt_event_id=row[14],
        created_at_ms=row[15],
        ended_at_ms=row[16],
        segment=row[17],
        budget_ms=row[18],
        used_ms=row[19],
        watermark=row[20],
        authority_id=row[21],
        handed_at_ms=row[22],
        metadata=json.loads(row[23]) if row[23] else None,
        retry_policy=_shared_json(row[24]) if row[24] else None,
        binding_config=_shared_json(row[25]) if row[25] else None,
        pool=row[26],
    )


def intent_from_row(row: Row) -> Intent:
    return Intent(
        id=row[0],
        kind=IntentKind(row[1]),
        work_id=row[2],
        event_id=row[3],
        execution_id=row[4],
        epoch=row[5],
        status=IntentStatus(row[6]),
        attempts=row[7],
        next_attempt_ms=row[8],
        error_fallback=Policy(row[9]) if row[9] else None,
    )


# the figures of /metrics: each a count capped by LIMIT on an index (never a scan of the whole table)
COUNT_WORKS_IN_STATE = "SELECT count(*) FROM (SELECT 1 FROM works WHERE state = ? LIMIT ?) AS w"
COUNT_READY = "SELECT count(*) FROM (SELECT 1 FROM works WHERE ready_seq IS NOT NULL LIMIT ?) AS w"
COUNT_ARMED_TIMERS = "SELECT count(*) FROM (SELECT 1 FROM timers WHERE state = 'armed' LIMIT ?) AS t"
COUNT_OVERDUE_TIMERS = (
    "SELECT count(*) FROM (SELECT 1 FROM timers WHERE state = 'armed' AND fire_at_ms <= ? LIMIT ?) AS t"
)
EARLIEST_ARMED_TIMER = "SELECT min(fire_at_ms) FROM timers WHERE state = 'armed'"
COUNT_RECENT_UNROUTED = (
    "SELECT count(*) FROM (SELECT 1 FROM events e"
    " WHERE e.seq > (SELECT coalesce(max(seq), 0) FROM events) - ?"
    " AND NOT EXISTS (SELECT 1 FROM checkpoints c WHERE c.seq = e.seq) LIMIT ?) AS u"
)
KEY_OWNER = "SELECT work_id FROM work_keys WHERE key = ?"
DIAGNOSTICS_ABOUT = "SELECT id, kind, subject, message, detail, at_ms FROM diagnostics WHERE subject = ? ORDER BY id DESC LIMIT ?"
"""A subject's diagnostics, newest first (the ``diagnostics_subject`` index)."""
DIAGNOSTICS = (
    "SELECT id, kind, subject, message, detail, at_ms FROM diagnostics WHERE (CAST(? AS TEXT) IS NULL OR kind = ?)"
    " AND (CAST(? AS TEXT) IS NULL OR subject = ?) AND id > ? ORDER BY id LIMIT ?"
)


def diagnostic_from_row(row: Row) -> Diagnostic:
    return Diagnostic(
        id=row[0], kind=row[1], subject=row[2], message=row[3], detail=json.loads(row[4]), at_ms=row[5]
    )


TIMER_COLUMNS = (
    "id, revision, state, fire_at_ms, source, type, scope, key, work_id, payload, delivery_id, interval_ms,"
    " recurrence, spec, parent_id, execution_id, occurrences, reason, created_at_ms, updated_at_ms"
)
TIMER_SELECT = f"SELECT {TIMER_COLUMNS} FROM timers"
TIMER_BY_ID = f"{TIMER_SELECT} WHERE id = ?"
TIMER_OR_REMOVED = (
    "SELECT "
    + ", ".join(f"t.{column.strip()}" for column in TIMER_COLUMNS.split(","))
    + ", (SELECT r.revision FROM removed_timers r WHERE r.id = ?)"
    " FROM (SELECT 1 AS probe) AS p LEFT JOIN timers t ON t.id = ?"
)
"""A timer's row (nulls without one), then the revision compaction removed under its id (or null), in one
read. Parameters: the id twice."""
FIRING_COLUMNS = "timer_id, revision, fire_at_ms, result, event_id, next_fire_at_ms, detail, at_ms"
FIRINGS_OF_TIMER = f"SELECT {FIRING_COLUMNS} FROM timer_firings WHERE timer_id = ? ORDER BY commit_seq"
"""A timer's firing ledger in the order it was committed (each insert takes the timer's next commit_seq)."""


def timer_from_row(row: Row) -> Timer:
    return Timer(
        id=row[0],
        revision=row[1],
        state=_TIMER_STATES[row[2]],
        fire_at_ms=row[3],
        source=row[4],
        type=row[5],
        scope=row[6],
        key=row[7],
        work_id=row[8],
        payload=json.loads(row[9]),
        delivery_id=row[10],
        interval_ms=row[11],
        recurrence=row[12],
        spec=json.loads(row[13]) if row[13] is not None else None,
        parent_id=row[14],
        execution_id=row[15],
        occurrences=row[16],
        reason=row[17],
        created_at_ms=row[18],
        updated_at_ms=row[19],
    )


def firing_from_row(row: Row) -> Firing:
    return Firing(
        timer_id=row[0],
        revision=row[1],
        fire_at_ms=row[2],
        result=FiringResult(row[3]),
        event_id=row[4],
        next_fire_at_ms=row[5],
        detail=row[6],
        at_ms=row[7],
    )
