"""The web view of ``loom serve``: server-rendered HTML (no scripts) listing Work and showing one Work
with its history, waits and timers (docs/http-api.md). Every value is escaped with `html.escape`;
times are ISO 8601 UTC.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from ..records.events import Event
from ..records.timers import Timer
from ..records.waits import Wait
from ..records.work import Checkpoint, Execution, Work, WorkState
from ..runtime import Runtime
from ._wire import HTTPError, classify, form_params, iso, query_limit, query_text

log = logging.getLogger("loom.service.web")

WorkView = Callable[[Runtime, str], Awaitable[dict[str, Any]]]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #1b1b1b; }
table { border-collapse: collapse; margin: .5rem 0 1.5rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
code, .id { font-family: ui-monospace, monospace; font-size: .9em; }
.held { color: #a40000; font-weight: bold; }
dl { display: grid; grid-template-columns: max-content auto; gap: .2rem 1rem; }
dt { font-weight: bold; }
"""


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    html = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)} - loom</title>'
        f'<style>{_STYLE}</style></head><body><nav><a href="/ui/work">Work</a></nav>'
        f"<h1>{escape(title)}</h1>{body}</body></html>"
    )
    return HTMLResponse(html, status_code=status)


def _text(value: object) -> str:
    return "" if value is None else escape(str(value))


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, table_id: str, empty: str) -> str:
    """A table of already-escaped cells (``empty`` when there are no rows)."""
    rendered = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not rendered:
        return f'<p id="{table_id}">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{rendered}</tbody></table>'


def _work_link(work_id: str) -> str:
    return f'<a class="id" href="/ui/work/{escape(quote(work_id, safe=""))}">{escape(work_id)}</a>'


def _hold(work: Work) -> str:
    if not work.held:
        return ""
    return f'<span class="held">held</span>: {_text(work.hold_reason)}'


def _error_page(exc: Exception) -> HTMLResponse:
    kind, field = classify(exc, renames={"after_id": "after"})
    if kind.status >= 500:
        log.exception("web view failed")
        message = "internal error (logged)"
    else:
        message = exc.message if isinstance(exc, HTTPError) else str(exc)
    where = f" ({escape(field)})" if field else ""
    return _page(f"{kind.status} {kind.name}", f'<p id="error">{escape(message)}{where}</p>', kind.status)


async def work_list(rt: Runtime, request: Request) -> Response:
    try:
        params = form_params(request.query_params)  # the filter form sends its empty fields
        scope = query_text(params, "scope")
        state = query_text(params, "state")
        after = query_text(params, "after") or ""
        limit = query_limit(params)
        works = await rt.works(scope=scope, state=state, after_id=after, limit=limit)  # type: ignore[arg-type]
    except Exception as exc:
        return _error_page(exc)
    options = "".join(
        f'<option value="{s.value}"{" selected" if s.value == state else ""}>{s.value}</option>'
        for s in WorkState
    )
    form = (
        '<form method="get" action="/ui/work">'
        f'<label>Scope <input name="scope" value="{_text(scope)}" placeholder="org/team"></label> '
        f'<label>State <select name="state"><option value="">any</option>{options}</select></label> '
        '<button type="submit">Filter</button></form>'
    )
    rows = [
        (
            _work_link(w.id),
            _text(w.scope),
            _text(w.kind),
            f'<span class="state">{_text(w.state)}</span>',
            _hold(w),
            _text(", ".join(w.keys)),
            str(w.attempts),
            str(len(w.pending_inputs)),
            _text(iso(w.created_at_ms)),
        )
        for w in works
    ]
    table = _table(
        ("id", "scope", "kind", "state", "hold", "keys", "attempts", "pending", "created (UTC)"),
        rows,
        table_id="work",
        empty="No Work matches.",
    )
    more = ""
    if works and len(works) == limit:
        query = {k: v for k, v in (("scope", scope), ("state", state)) if v}
        query |= {"after": works[-1].id, "limit": str(limit)}
        more = f'<p><a id="next" href="/ui/work?{escape(urlencode(query))}">Next page</a></p>'
    return _page("Work", form + table + more)


def _event_cell(event: Event) -> str:
    return f'<span class="id">{_text(event.id)}</span> {_text(event.type)} (seq {event.seq})'


def _checkpoint_rows(checkpoints: Sequence[Checkpoint]) -> list[tuple[str, ...]]:
    return [
        (
            str(cp.seq),
            f'<span class="id">{_text(cp.event_id)}</span>',
            _text(cp.status),
            _text(cp.route),
            _text(cp.effective_policy or cp.policy),
            _text(cp.reason or cp.fallback_reason),
            _text(iso(cp.at_ms)),
        )
        for cp in checkpoints
    ]


def _execution_rows(executions: Sequence[Execution]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for ex in executions:
        outcome = ex.outcome or {}
        summary = outcome.get("kind", "")
        if outcome.get("error"):
            summary = f"{summary}: {outcome['error']}"
        rows.append(
            (
                str(ex.attempt),
                f'<span class="id">{_text(ex.id)}</span>',
                _text(ex.state),
                str(ex.epoch),
                _text(ex.executor),
                _text(summary),
                _text(iso(ex.created_at_ms)),
                _text(iso(ex.ended_at_ms)),
            )
        )
    return rows


def _wait_rows(waits: Sequence[Wait]) -> list[tuple[str, ...]]:
    return [
        (
            f'<span class="id">{_text(w.id)}</span>',
            _text(w.state),
            str(w.attempt),
            _text(", ".join(w.types) or "any"),
            _text(", ".join(w.keys)),
            _text(iso(w.timeout_at_ms)),
            f'<span class="id">{_text(w.winner_event_id)}</span>',
            _text(iso(w.created_at_ms)),
            _text(iso(w.woken_at_ms)),
            _text(w.reason),
        )
        for w in waits
    ]


def _timer_rows(timers: Sequence[Timer]) -> list[tuple[str, ...]]:
    return [
        (
            f'<span class="id">{_text(t.id)}</span>',
            _text(t.state),
            _text(t.type),
            _text(iso(t.fire_at_ms)),
            _text(t.recurrence or (f"every {t.interval_ms} ms" if t.interval_ms else "")),
            str(t.occurrences),
            _text(t.reason),
        )
        for t in timers
    ]


async def work_page(rt: Runtime, view: WorkView, request: Request) -> Response:
    try:
        data = await view(rt, str(request.path_params["work_id"]))
    except Exception as exc:
        return _error_page(exc)
    work: Work = data["work"]
    wait: Wait | None = data["wait"]
    facts = [
        ("id", f'<span class="id" id="work-id">{_text(work.id)}</span>'),
        ("scope", _text(work.scope)),
        ("kind", _text(work.kind)),
        ("state", f'<span id="state">{_text(work.state)}</span>'),
        ("hold", f'<span id="hold">{_hold(work) or "not held"}</span>'),
        ("keys", f'<span id="keys">{_text(", ".join(work.keys))}</span>'),
        ("attempts", f'<span id="attempt-count">{work.attempts}</span>'),
        ("running attempt", _text(work.current_execution_id) + (f" ({_text(work.execution_state)})" if work.execution_state else "")),
        ("waiting for", f'<span id="wait">{_text(wait.id) + " (" + _text(wait.state) + ")" if wait else "nothing"}</span>'),
        ("retry", _text(work.retry)),
        ("parent", _work_link(work.parent_id) if work.parent_id else ""),
        ("created", _text(iso(work.created_at_ms))),
    ]  # fmt: skip
    summary = "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    pending = _table(
        ("event",),
        [(_event_cell(e),) for e in data["pending_inputs"]],
        table_id="pending",
        empty="No pending input.",
    )
    history = data["history"]
    sections = [
        summary,
        "<h2>Pending input</h2>",
        pending,
        "<h2>Waits</h2>",
        _table(
            ("wait", "state", "attempt", "types", "keys", "timeout (UTC)", "winner", "registered (UTC)",
             "woken (UTC)", "reason"),
            _wait_rows(data["waits"]),
            table_id="waits",
            empty="No waits.",
        ),
        "<h2>Timers</h2>",
        _table(
            ("timer", "state", "type", "fires at (UTC)", "recurs", "occurrences", "reason"),
            _timer_rows(data["timers"]),
            table_id="timers",
            empty="No timers.",
        ),
        "<h2>Attempts</h2>",
        _table(
            ("attempt", "execution", "state", "epoch", "executor", "outcome", "started (UTC)", "ended (UTC)"),
            _execution_rows(history["executions"]),
            table_id="attempts",
            empty="No attempts yet.",
        ),
        "<h2>History</h2>",
        _table(
            ("seq", "event", "status", "route", "policy", "reason", "at (UTC)"),
            _checkpoint_rows(history["checkpoints"]),
            table_id="history",
            empty="No routed events.",
        ),
    ]  # fmt: skip
    return _page(f"Work {work.id}", "".join(sections))


def routes(rt: Runtime, view: WorkView) -> list[Route]:
    async def list_endpoint(request: Request) -> Response:
        return await work_list(rt, request)

    async def work_endpoint(request: Request) -> Response:
        return await work_page(rt, view, request)

    return [
        Route("/ui/work", list_endpoint, methods=["GET"]),
        Route("/ui/work/{work_id:path}", work_endpoint, methods=["GET"]),
    ]
