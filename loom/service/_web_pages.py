"""The web console's Work pages: the list (by last change, counts by state, search by key, filters) and
one Work (its facts, the actions an operator may take, pending input, waits, timers, attempts with
their last error, routing history and diagnostics). See docs/http-api.md "Web console"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from ..kernel.timers import control_timer
from ..records.errors import InvalidRequest, NotFound
from ..records.events import Diagnostic, Event
from ..records.timers import Timer, TimerState
from ..records.waits import Wait
from ..records.work import Checkpoint, Execution, ExecutionState, Work, WorkState
from ..runtime import Runtime
from ._web_html import (
    PageContext,
    button,
    code,
    cursor,
    cursor_text,
    event_link,
    facts,
    lateness,
    page,
    query_link,
    state,
    table,
    text,
    timer_link,
    when,
    work_link,
)
from ._wire import query_limit, query_text

HISTORY_SHOWN = 200
"""The most routed Events and attempts a Work page shows (the newest)."""
LIVE_EXECUTIONS = (ExecutionState.RUNNING,)
"""The attempt states an operator interrupt applies to."""


def _hold(work: Work) -> str:
    return f'<span class="held">held</span>: {text(work.hold_reason)}' if work.held else ""


def _count(n: int) -> str:
    return f"{n:,}" + ("+" if n >= 1_000_000 else "")


async def work_list(rt: Runtime, ctx: PageContext, params: Mapping[str, str]) -> Any:
    scope = query_text(params, "scope")
    chosen = query_text(params, "state")
    key = query_text(params, "key")
    limit = query_limit(params)
    before = cursor(params, "before")
    works = await rt.works_changed(
        state=chosen,  # type: ignore[arg-type]  # checked by the runtime
        scope=scope,
        key_prefix=key,
        before=before,
        limit=limit + 1,
    )
    counts = await rt.work_counts(scope=scope)
    exact: Work | None = None
    if key is not None and before is None:
        try:
            exact = await rt.work(key)  # the search box also takes a Work's id
        except (NotFound, InvalidRequest):
            exact = None
    more = len(works) > limit
    works = works[:limit]

    kept = {"scope": scope, "key": key}
    chips = [
        f'<li><a href="/ui/work?{_query(kept)}"'
        f"{' aria-current=page' if chosen is None else ''}>all {_count(sum(counts.values()))}</a></li>"
    ]
    for name in WorkState:
        current = " aria-current=page" if chosen == name.value else ""
        chips.append(
            f'<li><a class="count-{name.value}" href="/ui/work?{_query({**kept, "state": name.value})}"'
            f"{current}>{name.value} {_count(counts.get(name.value, 0))}</a></li>"
        )
    options = "".join(
        f'<option value="{s.value}"{" selected" if s.value == chosen else ""}>{s.value}</option>'
        for s in WorkState
    )
    form = (
        '<form class="filters" method="get" action="/ui/work">'
        f'<label>Key or id <input name="key" value="{text(key)}" placeholder="order/12 (a prefix)"></label>'
        f'<label>Scope <input name="scope" value="{text(scope)}" placeholder="org/team"></label>'
        f'<label>State <select name="state"><option value="">any</option>{options}</select></label>'
        '<button type="submit">Filter</button></form>'
    )
    rows = [
        (
            work_link(w.id),
            text(w.scope),
            text(w.kind),
            state(w.state),
            _hold(w),
            text(", ".join(w.keys[:5]) + (f" (+{len(w.keys) - 5})" if len(w.keys) > 5 else "")),
            str(w.attempts),
            str(len(w.pending_inputs)),
            when(w.updated_at_ms, ctx.now_ms),
            when(w.created_at_ms, ctx.now_ms),
        )
        for w in works
    ]
    found = ""
    if exact is not None:
        found = f'<p id="exact">The Work with this id: {work_link(exact.id)} ({state(exact.state)})</p>'
    listing = table(
        ("id", "scope", "kind", "state", "hold", "keys", "attempts", "pending", "last change", "created"),
        rows,
        table_id="work",
        empty="No Work matches.",
    )
    pager = []
    if before is not None:
        pager.append(query_link("/ui/work", {**kept, "state": chosen}, "Newest", "newest"))
    if more and works:
        last = works[-1]
        older = {**kept, "state": chosen, "before": cursor_text(last.updated_at_ms, last.id), "limit": limit}
        pager.append(query_link("/ui/work", older, "Older", "older"))
    counts_html = f'<ul class="counts" id="counts">{"".join(chips)}</ul>'
    content = counts_html + found + listing + f'<p class="pager" id="pager">{" ".join(pager)}</p>'
    watch = "?" + urlencode({"scope": scope}) if scope else ""
    return page(ctx, section="work", title="Works", before=form, content=content, watch=watch)


def _query(params: Mapping[str, object]) -> str:
    return urlencode({k: str(v) for k, v in params.items() if v not in (None, "")})


# -- one Work ---------------------------------------------------------------------------------------


def _actions(work: Work, current: Execution | None) -> str:
    target = {"work_id": work.id}
    interruptible = (
        current is not None and current.state in LIVE_EXECUTIONS and "interrupt" in current.capabilities
    )
    buttons: list[str] = []
    if not work.state.terminal:
        if work.held:
            buttons.append(button("release", "Release", target))
        else:
            buttons.append(button("hold", "Hold", target))
        if interruptible:  # its binding pinned the capability: the executor can stop it
            buttons.append(
                button(
                    "interrupt",
                    "Interrupt",
                    target,
                    confirm=f"Interrupt the running attempt of {work.id}? It stops; the Work stays ready"
                    " with its input.",
                )
            )
        if work.current_execution_id is None:
            buttons.append(
                button(
                    "retry",
                    "Retry now",
                    target,
                    confirm=f"Start the next attempt of {work.id} now, with a fresh retry budget?",
                )
            )
        buttons.append(
            button(
                "cancel",
                "Cancel",
                target,
                confirm=f"Cancel {work.id}? Cancelling is terminal: it never runs again, and its running"
                " attempt loses its authority.",
            )
        )
    if not buttons:
        return '<p class="note" id="actions">No action applies: this Work is over.</p>'
    return f'<div class="actions" id="actions">{"".join(buttons)}</div>'


def _outcome(ex: Execution) -> tuple[str, str]:
    """An attempt's outcome kind and its error (escaped)."""
    outcome = ex.outcome or {}
    kind = outcome.get("kind", "")
    error = outcome.get("error")
    return text(kind), (f'<span class="error">{text(error)}</span>' if error else "")


def _duration(ex: Execution) -> str:
    if ex.ended_at_ms is None:
        return ""
    seconds = max(0, ex.ended_at_ms - ex.created_at_ms) / 1000
    return f"{seconds:.3f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _attempt_rows(executions: Sequence[Execution], now_ms: int) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for ex in reversed(executions[-HISTORY_SHOWN:]):
        kind, error = _outcome(ex)
        rows.append(
            (
                str(ex.attempt),
                code(ex.id),
                state(ex.state),
                str(ex.epoch),
                text(ex.executor),
                kind,
                error,
                when(ex.created_at_ms, now_ms),
                when(ex.ended_at_ms, now_ms),
                _duration(ex),
            )
        )
    return rows


def _history_rows(checkpoints: Sequence[Checkpoint], now_ms: int) -> list[tuple[str, ...]]:
    return [
        (
            str(cp.seq),
            event_link(cp.event_id),
            state(cp.status),
            text(cp.route),
            text(cp.effective_policy or cp.policy),
            text(cp.reason or cp.fallback_reason),
            when(cp.at_ms, now_ms),
        )
        for cp in reversed(checkpoints[-HISTORY_SHOWN:])
    ]


def _wait_rows(waits: Sequence[Wait], now_ms: int) -> list[tuple[str, ...]]:
    return [
        (
            code(w.id),
            state(w.state),
            str(w.attempt),
            text(", ".join(w.types) or "any"),
            text(", ".join(w.keys)),
            when(w.timeout_at_ms, now_ms),
            event_link(w.winner_event_id),
            when(w.created_at_ms, now_ms),
            when(w.woken_at_ms, now_ms),
            text(w.reason),
        )
        for w in reversed(waits)
    ]


def timer_rows(timers: Sequence[Timer], now_ms: int, *, with_work: bool = True) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for t in timers:
        armed = t.state == TimerState.ARMED
        due = when(t.fire_at_ms, now_ms) + (" " + lateness(t.fire_at_ms, now_ms) if armed else "")
        recurs = t.recurrence or (f"every {t.interval_ms / 1000:g} s" if t.interval_ms else "")
        cancel = ""
        if armed and control_timer(t.id) is None:  # the runtime's own timers are its to end
            cancel = button(
                "cancel_timer",
                "Cancel",
                {"timer_id": t.id, "revision": t.revision},
                confirm=f"Cancel timer {t.id}? It will not fire.",
            )
        cells = [timer_link(t.id), state(t.state), text(t.type), due, text(recurs), str(t.occurrences)]
        if with_work:
            cells.insert(3, work_link(t.work_id))
        rows.append((*cells, cancel))
    return rows


def _diagnostic_rows(diagnostics: Sequence[Diagnostic], now_ms: int) -> list[tuple[str, ...]]:
    return [(str(d.id), text(d.kind), text(d.message), when(d.at_ms, now_ms)) for d in diagnostics]


async def work_page(rt: Runtime, ctx: PageContext, work_id: str) -> Any:
    history = await rt.history(work_id, newest=HISTORY_SHOWN + 1)  # (one more: are there more?)
    work = history.work
    waits = await rt.waits(work.id)
    wait = next((w for w in waits if w.id == work.wait_id), None)
    pending: list[Event] = [await rt.event(event_id) for event_id in work.pending_inputs[:HISTORY_SHOWN]]
    timers = await rt.timers(work_id=work.id, limit=HISTORY_SHOWN)
    diagnostics = await rt.diagnostics_newest(subject=work.id, limit=20)
    now = ctx.now_ms
    last = history.executions[-1] if history.executions else None
    running = code(work.current_execution_id) if work.current_execution_id else "none"
    if work.execution_state:
        running += f" ({text(work.execution_state)})"
    waiting = "nothing"
    if wait is not None:
        waiting = f"{code(wait.id)} ({text(wait.state)}), for {text(', '.join(wait.types) or 'any type')}"
        if wait.timeout_at_ms is not None:
            waiting += f", times out {when(wait.timeout_at_ms, now)}"
    keys = ", ".join(query_link("/ui/work", {"key": k}, k) for k in work.keys[:50])
    summary = facts(
        [
            ("state", f'<span id="state">{state(work.state)}</span>'),
            ("hold", f'<span id="hold">{_hold(work) or "not held"}</span>'),
            ("scope", text(work.scope)),
            ("kind", text(work.kind)),
            ("keys", f'<span id="keys">{keys}</span>'),
            ("attempts", f'<span id="attempt-count">{work.attempts}</span>'),
            ("running attempt", f'<span id="running">{running}</span>'),
            ("waiting for", f'<span id="wait">{waiting}</span>'),
            ("retry", text(work.retry) or "-"),
            ("parent", work_link(work.parent_id) or "-"),
            ("predecessor", work_link(work.predecessor_id) or "-"),
            ("created", when(work.created_at_ms, now)),
            ("last change", f'<span id="changed">{when(work.updated_at_ms, now)}</span>'),
        ]
    )
    result = '<p class="note" id="result">No attempt has ended yet.</p>'
    if last is not None and last.outcome:
        kind, error = _outcome(last)
        result = (
            f'<p id="result">Attempt {last.attempt} ended {when(last.ended_at_ms, now)}: <b>{kind}</b>'
            f"{' - ' + error if error else ''}</p>"
        )
    shown = f"the newest {HISTORY_SHOWN} of {{}}"
    sections = [
        _actions(work, next((x for x in history.executions if x.id == work.current_execution_id), None)),
        summary,
        "<h2>Outcome</h2>",
        result,
        "<h2>Pending input</h2>",
        table(
            ("event", "type", "seq", "accepted"),
            [(event_link(e.id), text(e.type), str(e.seq), when(e.accepted_at_ms, now)) for e in pending],
            table_id="pending",
            empty="No pending input.",
        ),
        "<h2>Attempts</h2>",
        table(
            ("attempt", "execution", "state", "epoch", "executor", "outcome", "last error", "started", "ended",
             "took"),
            _attempt_rows(history.executions, now),
            table_id="attempts",
            empty="No attempts yet.",
            note=shown.format(work.attempts) if len(history.executions) > HISTORY_SHOWN else "",
        ),
        "<h2>Waits</h2>",
        table(
            ("wait", "state", "attempt", "types", "keys", "times out", "winner", "registered", "woken",
             "reason"),
            _wait_rows(waits, now),
            table_id="waits",
            empty="No waits.",
        ),
        "<h2>Timers</h2>",
        table(
            ("timer", "state", "type", "due", "recurs", "fired", ""),
            timer_rows(timers, now, with_work=False),
            table_id="timers",
            empty="No timers.",
        ),
        "<h2>History</h2>",
        table(
            ("seq", "event", "status", "route", "policy", "reason", "at"),
            _history_rows(history.checkpoints, now),
            table_id="history",
            empty="No routed events.",
            note=f"the newest {HISTORY_SHOWN} (GET /work/{{id}} has them all)"
            if len(history.checkpoints) > HISTORY_SHOWN
            else "",
        ),
        "<h2>Diagnostics</h2>",
        table(
            ("id", "kind", "message", "at"),
            _diagnostic_rows(diagnostics, now),
            table_id="diagnostics",
            empty="No diagnostics about this Work.",
        ),
    ]  # fmt: skip
    reason = (
        '<div class="actions"><label>Reason <input id="reason" size="40"'
        ' placeholder="why (for the history; a hold needs one)"></label></div>'
        if not work.state.terminal
        else ""
    )
    watch = "?" + urlencode({"work": work.id})
    return page(
        ctx, section="work", title=f"Work {work.id}", before=reason, content="".join(sections), watch=watch
    )
