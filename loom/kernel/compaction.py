"""Compaction: removing what ended once its retention passed, never what something still refers to
(docs/operations.md, "Retention").

A pass (`compact_in_tx`) takes one page of each kind of row from a durable cursor, in the order the
rows ended, and decides for each whether it may go: it must have ended, its scope's retention must
have passed, and nothing may still refer to it. What it removes leaves a tombstone of its identity:

* an **Event** (routed, at or below the routing watermark, not stopped ``unrouted`` for an operator)
  leaves its delivery identity and sequence, so a redelivery within the dedup window is answered with
  the original sequence and never accepted again. It stays while it is a pending input, an attempt's
  trigger, a live attempt's causal authority, an open intent's, a timer's parent, an untaken wake's
  bridge, the accepted timeout of an open wait, or could still be what a wait finds: an open wait on
  its key has not looked past it, the Work that owns its key has a live attempt that may wait on it,
  or an open subscription on its key has not decided it;
* a finished **Work** goes with its attempts, waits, intents, inputs, keys and per-Work budget
  ledgers (its Events follow their own retention; their checkpoints no longer name it), and its id is
  never given to another Work while its tombstone lasts (`new_work_id`). It stays while it has a
  live attempt, a child or a successor, a parent still running, an armed timer that names it, an open
  subscription, an attempt whose logs its executor has not forgotten, or an Event not yet routed that
  names it or one of its keys;
* an **ended attempt** (not its Work's latest) goes on its own once the Work's retention passed,
  unless a wait of it is open or its continuation has not started, its Work waits (a wait's scan
  tells the Work's own Events by their attempts), a timer names it, or an intent of it is open;
* an **ended timer** goes with its ledger, leaving its last revision (arming it again goes on from
  there); ledger entries of a timer still armed go on their own: a firing request for them is stale.

Each pass is one transaction: a crash before its commit removes nothing, after it leaves nothing half
done. On a shared database each page locks the rows it takes and skips those another node holds, so
nodes divide the work. Deterministic: no clock but ``now_ms``, no I/O but ``tx``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

import attrs

from ..config import Config
from ..config.retention import DEFAULTS, FOREVER, ScopeRetention, global_setting
from ..records.compaction import CompactionReport
from ..records.core_events import CORE_SOURCE, WAIT_TIMEOUT
from ..records.notices import Compacted
from ..store import AttemptRow, EventRow, Tx
from .causal import REJECTIONS_NAMESPACE, utc_minute
from .unrouted import routing_watermark, unrouted_in_tx

NAMESPACE = "core.compaction"
DEFAULT_LIMIT = 100
RELEASE_PAGES = 1000
"""Free pages a pass gives back to the file system at most (SQLite with incremental vacuum)."""
_START: dict[str, list[Any]] = {
    "attempts": [-1, ""],
    "works": [-1, ""],
    "timers": [-1, ""],
    "firings": ["", 0, 0],
    "events": [0],
    "ledgers": ["", "", ""],
    "logs": [-1, ""],
    "rejections": [""],
}


@attrs.frozen(kw_only=True)
class CompactRequest:
    config: Config
    limit: int = DEFAULT_LIMIT
    """Rows each step looks at in this pass, at most."""
    finished: frozenset[str] = frozenset()
    """Steps that went once through their rows in this sweep: not taken again. Rows a step keeps stay
    at its head, so a step taken at every pass would find a full page of them again at each second
    round: a sweep goes through each step's rows once, and ends."""


@attrs.frozen(kw_only=True)
class CompactPass:
    report: CompactionReport
    cursors: dict[str, Any]
    """Where each step stands after this pass."""
    finished: frozenset[str] = frozenset()
    """Steps whose page in this pass was their last (their cursor is back at the start)."""


@attrs.define
class _Pass:
    """One pass's running state: the request, what it counted, and the retention of each scope."""

    tx: Tx
    now_ms: int
    req: CompactRequest
    counts: dict[str, int] = attrs.Factory(dict)
    more: bool = False
    _scopes: dict[str, ScopeRetention] = attrs.Factory(dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def retention(self, scope: str) -> ScopeRetention:
        if scope not in self._scopes:
            self._scopes[scope] = self.req.config.retention_in(scope)
        return self._scopes[scope]

    def due(self, scope: str, setting: str, ended_ms: int) -> bool:
        """Whether what ended at ``ended_ms`` in ``scope`` is past its retention now."""
        keep = getattr(self.retention(scope), f"{setting}_ms")
        return bool(keep != FOREVER and ended_ms + keep <= self.now_ms)

    def page(self, rows: int) -> bool:
        """Whether a step's page was full (it goes on from its cursor at the next pass)."""
        full = rows >= self.req.limit
        self.more = self.more or full
        return full


def shortest(config: Config, setting: str) -> int | None:
    """The shortest retention of ``setting`` in force anywhere (``None``: forever everywhere). Nothing
    that ended later than ``now`` minus this can be due, so each page stops there."""
    global_ = getattr(config.retention, f"{setting}_ms")
    declared = [getattr(DEFAULTS, f"{setting}_ms") if global_ is None else global_]
    declared += [
        getattr(scope.retention, f"{setting}_ms")
        for scope in config.scopes.values()
        if scope.retention is not None
    ]
    values = [v for v in declared if v is not None and v != FOREVER]
    return min(values) if values else None


def compact_in_tx(tx: Tx, now_ms: int, req: CompactRequest) -> CompactPass:
    """One bounded compaction pass: a page of each kind of row (see the module)."""
    cursors: dict[str, Any] = dict(_START)
    stored = _stored_cursors(tx)
    cursors.update({step: value for step, value in stored.items() if step in _START})
    run = _Pass(tx, now_ms, req)
    finished: set[str] = set()
    for step, take in _STEPS.items():
        if step not in req.finished:
            cursors[step] = take(run, cursors[step])
            if cursors[step] == _START[step]:
                finished.add(step)
    _expiry(run)
    released = 0
    for step, value in cursors.items():
        if step != "logs" and value != stored.get(step, _START[step]):
            tx.kv_put(NAMESPACE, step, {"at": value}, now_ms)
    if any(run.counts.get(name) for name in ("events", "works", "attempts", "timers", "diagnostics")):
        released = tx.release_pages(RELEASE_PAGES)
    report = CompactionReport(
        **{name: n for name, n in run.counts.items() if name != "looked_at"},
        released_bytes=released,
        more=run.more,
        dry_run=False,
    )
    if report.removed:
        tx.notify(Compacted(report=report))
    return CompactPass(report=report, cursors=cursors, finished=frozenset(finished))


def _stored_cursors(tx: Tx) -> dict[str, Any]:
    return {entry.key: entry.value["at"] for entry in tx.kv_list(NAMESPACE)}


# -- the steps: each takes a page from its cursor and answers with the cursor it reached ---------------


def _attempts(run: _Pass, cursor: list[Any]) -> list[Any]:
    floor = shortest(run.req.config, "works")
    if floor is None:
        return _START["attempts"]
    rows = run.tx.ended_attempts((cursor[0], cursor[1]), run.now_ms - floor, run.req.limit)
    for row in rows:
        if row.attempt < row.latest and run.due(row.scope, "works", row.ended_at_ms):
            if _attempt_kept(run, row):
                run.count("kept")
            else:
                run.count("attempts")
                run.tx.remove_attempt(row.id)
    return [rows[-1].ended_at_ms, rows[-1].id] if run.page(len(rows)) else _START["attempts"]


def _attempt_kept(run: _Pass, row: AttemptRow) -> bool:
    """(A Work's latest attempt is never looked at: it carries on what the Work ran with, its binding
    and its continuation, and goes with the Work.)"""
    if row.executor is not None and not row.logs_removed:
        return True  # its executor still keeps its logs: forgotten first (`logs_due_in_tx`)
    refs = run.tx.attempt_refs(row.id, row.work_id)
    return refs.open_wait or refs.work_waiting or refs.timer or refs.open_intent


def _works(run: _Pass, cursor: list[Any]) -> list[Any]:
    floor = shortest(run.req.config, "works")
    if floor is None:
        return _START["works"]
    rows = run.tx.ended_works((cursor[0], cursor[1]), run.now_ms - floor, run.req.limit)
    watermark = routing_watermark(run.tx)
    for work_id, scope, ended_ms in rows:
        if not run.due(scope, "works", ended_ms):
            continue
        work = run.tx.work(work_id)
        if work is None:
            continue
        refs = run.tx.work_refs(work_id, work.keys, watermark)
        if any(attrs.astuple(refs)):
            run.count("kept")
            continue
        run.count("works")
        run.count("attempts", run.tx.remove_work(work_id, run.now_ms))
    return [rows[-1][2], rows[-1][0]] if run.page(len(rows)) else _START["works"]


def _timers(run: _Pass, cursor: list[Any]) -> list[Any]:
    floor = shortest(run.req.config, "timers")
    if floor is None:
        return _START["timers"]
    rows = run.tx.ended_timers((cursor[0], cursor[1]), run.now_ms - floor, run.req.limit)
    for timer_id, revision, scope, ended_ms in rows:
        if run.due(scope, "timers", ended_ms):
            run.count("timers")
            run.count("firings", run.tx.remove_timer(timer_id, revision, run.now_ms))
    return [rows[-1][3], rows[-1][0]] if run.page(len(rows)) else _START["timers"]


def _firings(run: _Pass, cursor: list[Any]) -> list[Any]:
    if shortest(run.req.config, "timers") is None:
        return _START["firings"]
    rows = run.tx.armed_firings((cursor[0], cursor[1], cursor[2]), run.req.limit)
    due = [(t, r, f) for t, r, f, at_ms, scope in rows if run.due(scope, "timers", at_ms)]
    run.count("firings", len(due))
    if due:
        run.tx.remove_firings(due)
    return list(rows[-1][:3]) if run.page(len(rows)) else _START["firings"]


def _events(run: _Pass, cursor: list[Any]) -> list[Any]:
    floor = shortest(run.req.config, "events")
    if floor is None:
        return _START["events"]
    rows = run.tx.routed_events(cursor[0], _routed_upto(run), run.req.limit)
    dedup = global_setting(run.req.config.retention, "dedup")
    for row in rows:
        if row.accepted_at_ms > run.now_ms - floor:
            # sequence follows acceptance time: nothing further on can be due yet
            return _START["events"]
        if row.status in ("", "unrouted") or not run.due(row.scope, "events", row.routed_at_ms):
            continue  # being routed again, or stopped for an operator's replay; or inside its retention
        if _event_kept(run, row):
            run.count("kept")
            continue
        run.count("events")
        tombstone = dedup == FOREVER or row.accepted_at_ms + dedup > run.now_ms
        run.tx.remove_event(row, tombstone=tombstone)
    return [rows[-1].seq] if run.page(len(rows)) else _START["events"]


def _routed_upto(run: _Pass) -> int:
    """The routing watermark (`raise_watermark_in_tx` raised it at the sweep's start): the Events a pass
    may remove are at or below it, so the last sequence accepted stays known."""
    return routing_watermark(run.tx)


def raise_watermark_in_tx(tx: Tx, now_ms: int) -> int:
    """Raise the routing watermark as far as every Event is routed, in a transaction of its own (on a
    shared database its row is locked while it moves: not for the length of a compaction pass). A sweep
    does this first; its passes remove Events up to it."""
    unrouted_in_tx(tx, now_ms, 1)
    return routing_watermark(tx)


def _event_kept(run: _Pass, row: EventRow) -> bool:
    refs = run.tx.event_refs(row)
    if any(attrs.astuple(refs)):
        return True
    prefix = "wait.timeout/"
    if row.source == CORE_SOURCE and row.type == WAIT_TIMEOUT and row.delivery_id.startswith(prefix):
        return run.tx.wait_open(row.delivery_id[len(prefix) :])  # a blocked wait arbitrates again
    return False


def _ledgers(run: _Pass, cursor: list[Any]) -> list[Any]:
    keep = global_setting(run.req.config.retention, "works")
    if keep == FOREVER:
        return _START["ledgers"]
    rows = run.tx.ended_ledgers((cursor[0], cursor[1], cursor[2]), run.req.limit)
    for budget, subject, window in rows:
        end = window_end_ms(window)
        if end is not None and end + keep <= run.now_ms:
            run.count("ledgers")
            run.tx.remove_ledger(budget, subject, window)
    return list(rows[-1]) if run.page(len(rows)) else _START["ledgers"]


def _rejections(run: _Pass, cursor: list[Any]) -> list[Any]:
    """The redacted records of causal refusals are diagnostics too (``Runtime.causal_rejections``)."""
    keep = global_setting(run.req.config.retention, "diagnostics")
    if keep == FOREVER:
        return _START["rejections"]
    rows = run.tx.kv_page(REJECTIONS_NAMESPACE, cursor[0], run.req.limit)
    due = [key for key, at_ms in rows if at_ms + keep <= run.now_ms]
    run.count("diagnostics", len(due))
    if due:
        run.tx.kv_delete(REJECTIONS_NAMESPACE, due)
    return [rows[-1][0]] if run.page(len(rows)) else _START["rejections"]


_STEPS = {
    "attempts": _attempts,
    "works": _works,
    "timers": _timers,
    "firings": _firings,
    "events": _events,
    "ledgers": _ledgers,
    "rejections": _rejections,
}
"""The steps with a cursor, in the order a pass takes them."""


def window_end_ms(window: str) -> int | None:
    """When a budget ledger's window (``day:YYYY-MM-DD`` or ``week:YYYY-Www``, UTC) ends; ``None``: never
    (``life``, or a window this version does not know)."""
    kind, _, value = window.partition(":")
    try:
        if kind == "day":
            start = dt.date.fromisoformat(value)
            end = start + dt.timedelta(days=1)
        elif kind == "week":
            year, week = value.split("-W")
            end = dt.date.fromisocalendar(int(year), int(week), 1) + dt.timedelta(weeks=1)
        else:
            return None
    except ValueError:
        return None
    return int(dt.datetime(end.year, end.month, end.day, tzinfo=dt.UTC).timestamp() * 1000)


def _expiry(run: _Pass) -> None:
    """Tombstones past the dedup window, diagnostics past theirs, causal buckets of past minutes (from
    the head of their tables)."""
    tx, now, limit = run.tx, run.now_ms, run.req.limit
    dedup = global_setting(run.req.config.retention, "dedup")
    diagnostics = global_setting(run.req.config.retention, "diagnostics")
    if dedup != FOREVER:
        for n in (
            tx.expire_event_tombstones(now - dedup, limit),
            tx.expire_removed("removed_works", now - dedup, limit),
            tx.expire_removed("removed_timers", now - dedup, limit),
        ):
            run.count("tombstones", n)
            run.page(n)
    if diagnostics != FOREVER:
        n = tx.expire_diagnostics(now - diagnostics, limit)
        run.count("diagnostics", n)
        run.page(n)
    n = tx.expire_buckets(utc_minute(now) - 1, limit)
    run.count("buckets", n)
    run.page(n)


# -- a dry run: the sweep rehearsed in a transaction that is rolled back ----------------------------------


class Rehearsed(Exception):
    """Carries a rehearsed sweep's report out of its transaction, which it rolls back (`rehearse_in_tx`)."""

    def __init__(self, report: CompactionReport) -> None:
        super().__init__("a dry run writes nothing")
        self.report = report


def rehearse_in_tx(
    tx: Tx, now_ms: int, config: Config, limit: int, installed: Collection[str], *, sole: bool
) -> NoReturn:
    """A dry run: the whole sweep as it would go now, in one transaction, then `Rehearsed` with its
    report, which rolls every write back. The logs whose retention passed count as forgotten (a sweep
    has their executors forget them first, and their attempts and Works may then go in the same sweep);
    nothing is asked of an executor. What is reported is what the sweep would remove, row for row, the
    Events only a removed Work referred to included."""
    report = CompactionReport(dry_run=True)
    while True:
        page = logs_due_in_tx(tx, now_ms, config, limit, installed, sole=sole)
        tx.mark_logs_removed([due.execution_id for due in page.due], now_ms)
        report += CompactionReport(logs=len(page.due) + page.forgotten)
        if not page.more:
            break
    raise_watermark_in_tx(tx, now_ms)
    finished: frozenset[str] = frozenset()
    while True:
        done = compact_in_tx(tx, now_ms, CompactRequest(config=config, limit=limit, finished=finished))
        report += attrs.evolve(done.report, released_bytes=0, more=False)
        finished |= done.finished
        if not done.report.more:
            raise Rehearsed(report)


# -- attempt logs: what executors keep, forgotten outside any transaction ------------------------------


@attrs.frozen(kw_only=True)
class LogsDue:
    """An ended attempt whose logs its executor should forget now (`Executor.forget`)."""

    execution_id: str
    executor: str
    metadata: Mapping[str, Any]


@attrs.frozen(kw_only=True)
class LogsPage:
    due: tuple[LogsDue, ...]
    forgotten: int
    """Attempts marked forgotten at once: nothing here could forget them (their executor is installed
    nowhere this runtime knows of, and it is alone on its store)."""
    more: bool


def logs_due_in_tx(
    tx: Tx, now_ms: int, config: Config, limit: int, installed: Collection[str], *, sole: bool
) -> LogsPage:
    """A page of ended attempts whose ``attempt_logs`` retention passed, for their executors (installed
    here) to forget; marked forgotten by `logs_forgotten_in_tx` once they did. An attempt whose executor
    is not installed here is left to a node that has it, or, alone on the store, marked at once."""
    floor = shortest(config, "attempt_logs")
    if floor is None:
        return LogsPage(due=(), forgotten=0, more=False)
    entry = tx.kv_get(NAMESPACE, "logs")
    cursor = entry.value["at"] if entry is not None else _START["logs"]
    rows = tx.attempts_with_logs((cursor[0], cursor[1]), now_ms - floor, limit)
    run = _Pass(tx, now_ms, CompactRequest(config=config, limit=limit))
    due: list[LogsDue] = []
    orphans: list[str] = []
    for execution_id, _, executor, metadata, ended_ms, scope in rows:
        if not run.due(scope, "attempt_logs", ended_ms):
            continue
        if executor in installed:
            due.append(LogsDue(execution_id=execution_id, executor=executor, metadata=_json(metadata)))
        elif sole:
            orphans.append(execution_id)
    tx.mark_logs_removed(orphans, now_ms)
    more = len(rows) >= limit
    after = [rows[-1][4], rows[-1][0]] if more else _START["logs"]
    if after != cursor:
        tx.kv_put(NAMESPACE, "logs", {"at": after}, now_ms)
    return LogsPage(due=tuple(due), forgotten=len(orphans), more=more)


def logs_forgotten_in_tx(tx: Tx, now_ms: int, execution_ids: Collection[str]) -> None:
    """Their executors forgot these attempts' logs (or failed to, with a diagnostic): their rows may go."""
    tx.mark_logs_removed(sorted(execution_ids), now_ms)
    if execution_ids:
        tx.notify(Compacted(report=CompactionReport(logs=len(execution_ids))))


def _json(metadata: Any) -> Mapping[str, Any]:
    if not metadata:
        return {}
    value = json.loads(metadata) if isinstance(metadata, str) else metadata
    return value if isinstance(value, dict) else {}
