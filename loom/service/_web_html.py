"""The web console's HTML pieces: the page around every view, tables, links, times and action buttons.

Every value from the store passes through `text` (``html.escape``) or an escaping helper before it is
written into a page; the helpers take already-escaped cells only where they say so. Times are written
as `when` does: local time with its UTC offset and how far it is from the server's clock (``in 4 min``,
``3 s ago``), with the exact instant in the ``<time>`` element's ``datetime`` and ``data-ms``, which the
console's script rewrites in the browser's own time zone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

import attrs
from starlette.responses import HTMLResponse

from ..records.errors import InvalidRequest
from ..records.reprs import utc_moment
from ._render import local, relative
from ._wire import iso

NAV = (
    ("work", "Works", "/ui/work"),
    ("events", "Events", "/ui/events"),
    ("timers", "Timers", "/ui/timers"),
    ("schedules", "Schedules", "/ui/schedules"),
    ("diagnostics", "Diagnostics", "/ui/diagnostics"),
)
SECURITY_HEADERS = {
    # no inline script or style runs, whatever a value holds; the page talks to its own server only
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self';"
        " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


@attrs.frozen(kw_only=True)
class PageContext:
    """What every page needs beside its content: the server's time, its CSRF token, whether the clock
    is a test clock, and how it stays live (``watch``: the `/ui/watch` query; ``poll``: seconds)."""

    now_ms: int
    csrf: str
    test_clock: bool = False


def text(value: object) -> str:
    """A value as escaped text (``None``: nothing)."""
    return "" if value is None else escape(str(value))


def path_part(value: str) -> str:
    return quote(value, safe="")


def link(href: str, label: object, cls: str = "") -> str:
    """An anchor to ``href`` (escaped here) showing ``label`` (escaped here)."""
    klass = f' class="{cls}"' if cls else ""
    return f'<a{klass} href="{escape(href)}">{text(label)}</a>'


def work_link(work_id: str | None) -> str:
    return "" if not work_id else link(f"/ui/work/{path_part(work_id)}", work_id, "id")


def event_link(event_id: str | None) -> str:
    return "" if not event_id else link(f"/ui/events/{path_part(event_id)}", event_id, "id")


def timer_link(timer_id: str | None) -> str:
    return "" if not timer_id else link(f"/ui/timers/{path_part(timer_id)}", timer_id, "id")


def query_link(path: str, params: Mapping[str, object], label: object, cls: str = "") -> str:
    query = urlencode({k: str(v) for k, v in params.items() if v not in (None, "")})
    return link(f"{path}?{query}" if query else path, label, cls)


CURSOR = re.compile(r"([0-9]{1,15}):(.+)\Z", re.DOTALL)
CURSOR_SCHEMA = {"type": "string", "pattern": r"^[0-9]{1,15}:[^\u0000-\u001f\u007f]+$", "maxLength": 200}
"""A page cursor ``MS:ID``: the last row's time and id (an id may hold ``:`` itself)."""


def cursor(params: Mapping[str, str], name: str) -> tuple[int, str] | None:
    """The cursor ``MS:ID`` in query parameter ``name`` (``None``: left out); a malformed one is
    `InvalidRequest` naming it."""
    raw = params.get(name)
    if raw is None:
        return None
    found = CURSOR.match(raw)
    if found is None or len(raw) > 200:
        raise InvalidRequest(f"{name} must be a page cursor TIME:ID, as the Older link gives", field=name)
    return int(found[1]), found[2]


def cursor_text(ms: int, last_id: str) -> str:
    return f"{ms}:{last_id}"


def when(ms: int | None, now_ms: int) -> str:
    """An instant: local time with its offset and the relative form, in a ``<time>`` element."""
    if ms is None:
        return ""
    if utc_moment(ms) is None:
        # no date can show it (a row written past year 9999): its milliseconds, left as they are
        return f'<span class="ms">{escape(local(ms))}</span>'
    return (
        f'<time datetime="{iso(ms)}" data-ms="{ms}">{escape(local(ms))}'
        f' <span class="rel">({escape(relative(ms, now_ms))})</span></time>'
    )


def lateness(due_ms: int, now_ms: int) -> str:
    """How late an armed timer is (``3 s late``), or nothing when it is not due yet."""
    if due_ms > now_ms - 1000:
        return ""
    return f'<span class="late">{escape(relative(due_ms, now_ms).removesuffix(" ago"))} late</span>'


def state(value: object) -> str:
    name = text(value)
    return f'<span class="state s-{name}">{name}</span>'


def code(value: object) -> str:
    return f'<code class="id">{text(value)}</code>'


def pretty_json(value: Any) -> str:
    """A JSON value, indented, as escaped preformatted text."""
    return (
        f'<pre class="json">{escape(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))}</pre>'
    )


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, table_id: str, empty: str, note: str = ""
) -> str:
    """A table of already-escaped cells (``empty`` when there are no rows)."""
    rendered = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    if not rendered:
        return f'<p class="empty" id="{table_id}">{escape(empty)}</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    caption = f'<p class="note">{escape(note)}</p>' if note else ""
    return (
        f'{caption}<div class="scroll"><table id="{table_id}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{rendered}</tbody></table></div>"
    )


def facts(pairs: Iterable[tuple[str, str]], facts_id: str = "facts") -> str:
    """A definition list of (label, already-escaped value) pairs."""
    items = "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in pairs)
    return f'<dl id="{facts_id}">{items}</dl>'


def button(action: str, label: str, target: Mapping[str, object], *, confirm: str = "") -> str:
    """An action button: the console's script posts ``target`` as JSON to ``/ui/act/<action>`` (after
    asking ``confirm``, when given)."""
    data = escape(json.dumps(dict(target), separators=(",", ":")))
    ask = f' data-confirm="{escape(confirm)}"' if confirm else ""
    return (
        f'<button type="button" class="act act-{escape(action)}" data-action="{escape(action)}"'
        f' data-target="{data}"{ask}>{escape(label)}</button>'
    )


def page(
    ctx: PageContext,
    *,
    section: str,
    title: str,
    content: str,
    before: str = "",
    watch: str | None = None,
    poll: int | None = None,
    status: int = 200,
) -> HTMLResponse:
    """The whole page: navigation, ``before`` (forms that a live refresh must not reset) and the
    ``content`` a live refresh replaces (``#live``). ``watch``: the `/ui/watch` query this page follows;
    ``poll``: refresh every so many seconds instead."""
    nav = "".join(
        f'<a href="{href}"{" aria-current=page" if name == section else ""}>{label}</a>'
        for name, label, href in NAV
    )
    live = ""
    if watch is not None:
        live = f' data-watch="{escape("/ui/watch" + watch)}"'
    elif poll is not None:
        live = f' data-poll="{poll}"'
    clock = ' data-test-clock="1"' if ctx.test_clock else ""
    note = ' <span class="clock">test clock</span>' if ctx.test_clock else ""
    html = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="loom-csrf" content="{escape(ctx.csrf)}">'
        f"<title>{escape(title)} - loom</title>"
        '<link rel="icon" href="/ui/static/icon.svg"><link rel="stylesheet" href="/ui/static/console.css">'
        '<script src="/ui/static/console.js" defer></script></head>'
        f'<body data-now="{ctx.now_ms}"{clock}{live}>'
        f'<header><a class="brand" href="/ui/work">loom</a><nav>{nav}</nav>'
        f'<span id="live-status" class="live-off" title="live updates">not live</span>{note}</header>'
        f'<main><h1 id="title">{escape(title)}</h1><div id="flash" role="status"></div>{before}'
        f'<div id="live">{content}</div></main></body></html>'
    )
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)
