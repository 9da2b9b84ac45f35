"""The web console's pages beside Work: Events (newest first, with where each was routed) and one Event
with its payload; timers (armed ones by due time, with how late) and one timer with its firing ledger;
schedules (recurring timers); diagnostics (newest first). See docs/http-api.md "Web console"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kernel.timers import control_timer
from ..records.timers import TimerState
from ..records.validation import MAX_SEQ
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
    pretty_json,
    query_link,
    state,
    table,
    text,
    timer_link,
    when,
    work_link,
)
from ._web_pages import HISTORY_SHOWN, timer_rows
from ._wire import query_int, query_limit, query_text

POLL_S = 5
"""How often a page that no watch covers (Events, timers, diagnostics) refreshes itself."""


def _pager(path: str, params: Mapping[str, object], older: Mapping[str, object] | None, paged: bool) -> str:
    links = []
    if paged:
        links.append(query_link(path, params, "Newest" if path != "/ui/timers" else "First", "newest"))
    if older is not None:
        links.append(
            query_link(path, {**params, **older}, "Older" if path != "/ui/timers" else "Later", "older")
        )
    return f'<p class="pager" id="pager">{" ".join(links)}</p>'


async def event_list(rt: Runtime, ctx: PageContext, params: Mapping[str, str]) -> Any:
    kind = query_text(params, "type")
    limit = query_limit(params)
    before = query_int(params, "before", 0, 0, MAX_SEQ) or None
    found = await rt.events_newest(before_seq=before, type=kind, limit=limit + 1)
    more = len(found) > limit
    found = found[:limit]
    now = ctx.now_ms
    rows = []
    for event, checkpoint in found:
        routed = '<span class="note">not routed yet</span>'
        if checkpoint is not None:
            routed = state(checkpoint.status) + (
                " " + work_link(checkpoint.work_id) if checkpoint.work_id else ""
            )
            if checkpoint.route:
                routed += f" by {text(checkpoint.route)}"
        rows.append(
            (
                str(event.seq),
                event_link(event.id),
                text(event.type),
                text(event.scope),
                text(event.key),
                text(event.source),
                when(event.accepted_at_ms, now),
                routed,
            )
        )
    form = (
        '<form class="filters" method="get" action="/ui/events">'
        f'<label>Type <input name="type" value="{text(kind)}" placeholder="order.placed"></label>'
        '<button type="submit">Filter</button></form>'
    )
    listing = table(
        ("seq", "event", "type", "scope", "key", "source", "accepted", "routed"),
        rows,
        table_id="events",
        empty="No Events.",
    )
    older = {"before": found[-1][0].seq, "limit": limit} if more and found else None
    content = listing + _pager("/ui/events", {"type": kind}, older, before is not None)
    return page(ctx, section="events", title="Events", before=form, content=content, poll=POLL_S)


async def event_page(rt: Runtime, ctx: PageContext, event_id: str) -> Any:
    event = await rt.event(event_id)
    checkpoint = await rt.checkpoint(event.id)
    now = ctx.now_ms
    about = facts(
        [
            ("seq", str(event.seq)),
            ("type", text(event.type)),
            ("scope", text(event.scope)),
            ("key", query_link("/ui/work", {"key": event.key}, event.key) if event.key else "-"),
            ("source", text(event.source)),
            ("delivery id", code(event.delivery_id)),
            ("addressed to", work_link(event.work_id) or "-"),
            ("emitted by attempt", code(event.execution_id) if event.execution_id else "-"),
            ("parent", event_link(event.parent_id) or "-"),
            ("cause", event_link(event.cause_id) or "-"),
            ("root", event_link(event.root_id) if event.root_id != event.id else "itself"),
            ("depth", str(event.depth)),
            ("accepted", when(event.accepted_at_ms, now)),
        ]
    )
    if checkpoint is None:
        routing = '<p class="note" id="routing">Not routed yet.</p>'
    else:
        routing = facts(
            [
                ("status", state(checkpoint.status)),
                ("work", work_link(checkpoint.work_id) or "-"),
                ("route", text(checkpoint.route) or "-"),
                ("route scope", text(checkpoint.route_scope) or "-"),
                ("policy", text(checkpoint.policy) or "-"),
                ("effective policy", text(checkpoint.effective_policy) or "-"),
                ("fallback", text(checkpoint.fallback_reason) or "-"),
                ("reason", text(checkpoint.reason) or "-"),
                ("routed", when(checkpoint.at_ms, now)),
            ],
            "routing",
        )
    content = about + "<h2>Routing</h2>" + routing + "<h2>Payload</h2>" + pretty_json(dict(event.payload))
    return page(ctx, section="events", title=f"Event {event.id}", content=content, poll=POLL_S)


async def timer_list(rt: Runtime, ctx: PageContext, params: Mapping[str, str]) -> Any:
    chosen = query_text(params, "state") or TimerState.ARMED.value
    limit = query_limit(params)
    now = ctx.now_ms
    more: dict[str, object] | None = None
    if chosen == TimerState.ARMED.value:  # by due time: what fires next, and what is late
        after = cursor(params, "due_after")
        timers = await rt.timers_due(after=after, limit=limit + 1)
        paged = after is not None
        if len(timers) > limit:
            last = timers[limit - 1]
            more = {"due_after": cursor_text(last.fire_at_ms, last.id), "limit": limit}
    else:
        after_text = query_text(params, "after") or ""
        timers = await rt.timers(state=chosen, after_id=after_text, limit=limit + 1)  # type: ignore[arg-type]
        paged = after_text != ""
        if len(timers) > limit:
            more = {"after": timers[limit - 1].id, "limit": limit}
    timers = timers[:limit]
    options = "".join(
        f'<option value="{s.value}"{" selected" if s.value == chosen else ""}>{s.value}</option>'
        for s in TimerState
    )
    form = (
        '<form class="filters" method="get" action="/ui/timers">'
        f'<label>State <select name="state">{options}</select></label>'
        '<button type="submit">Show</button></form>'
    )
    order = "by due time" if chosen == TimerState.ARMED.value else "by id"
    listing = table(
        ("timer", "state", "type", "work", "due", "recurs", "fired", ""),
        timer_rows(timers, now),
        table_id="timers",
        empty=f"No {chosen} timers.",
        note=f"{chosen.capitalize()} timers {order}.",
    )
    content = listing + _pager("/ui/timers", {"state": chosen}, more, paged)
    return page(ctx, section="timers", title="Timers", before=form, content=content, poll=POLL_S)


async def timer_page(rt: Runtime, ctx: PageContext, timer_id: str) -> Any:
    timer = await rt.timer(timer_id)
    firings = await rt.firings(timer.id, newest=HISTORY_SHOWN + 1)  # (one more: are there more?)
    now = ctx.now_ms
    armed = timer.state == TimerState.ARMED
    action = ""
    control = control_timer(timer.id)
    if control is not None:
        action = f'<p class="note">{text(f"The runtime arms and ends this timer itself ({control}).")}</p>'
    elif armed:
        action = (
            '<div class="actions" id="actions">'
            + button(
                "cancel_timer",
                "Cancel timer",
                {"timer_id": timer.id, "revision": timer.revision},
                confirm=f"Cancel timer {timer.id}? It will not fire.",
            )
            + "</div>"
        )
    about = facts(
        [
            ("state", f'<span id="state">{state(timer.state)}</span>'),
            ("due", when(timer.fire_at_ms, now) + (" " + lateness(timer.fire_at_ms, now) if armed else "")),
            ("revision", str(timer.revision)),
            ("fires", f"{text(timer.type)} in {text(timer.scope)}"),
            ("key", text(timer.key) or "-"),
            ("work", work_link(timer.work_id) or "-"),
            ("armed by attempt", code(timer.execution_id) if timer.execution_id else "-"),
            (
                "recurs",
                text(timer.recurrence or (f"every {timer.interval_ms} ms" if timer.interval_ms else "no")),
            ),
            ("fired", str(timer.occurrences)),
            ("reason", text(timer.reason) or "-"),
            ("armed", when(timer.created_at_ms, now)),
            ("last change", when(timer.updated_at_ms, now)),
        ]
    )
    spec = pretty_json(dict(timer.spec)) if timer.spec else ""
    ledger = table(
        ("due", "result", "event", "next due", "detail", "committed"),
        [
            (
                when(f.fire_at_ms, now),
                state(f.result),
                event_link(f.event_id),
                when(f.next_fire_at_ms, now),
                text(f.detail),
                when(f.at_ms, now),
            )
            for f in reversed(firings[-HISTORY_SHOWN:])
        ],
        table_id="firings",
        empty="Not fired yet.",
        note=f"the newest {HISTORY_SHOWN} (GET /timers/{{id}} has them all)"
        if len(firings) > HISTORY_SHOWN
        else "",
    )
    content = action + about + (("<h2>Schedule</h2>" + spec) if spec else "")
    content += "<h2>Firings</h2>" + ledger + "<h2>Payload</h2>" + pretty_json(dict(timer.payload))
    return page(ctx, section="timers", title=f"Timer {timer.id}", content=content, poll=POLL_S)


async def schedule_list(rt: Runtime, ctx: PageContext, params: Mapping[str, str]) -> Any:
    after = query_text(params, "after") or ""
    limit = query_limit(params)
    timers = await rt.schedules(after_id=after, limit=limit + 1)
    more = len(timers) > limit
    timers = timers[:limit]
    now = ctx.now_ms
    rows = []
    for t in timers:
        spec = dict(t.spec or {})
        rule = (
            spec.get("cron")
            or spec.get("calendar")
            or (f"every {t.interval_ms / 1000:g} s" if t.interval_ms else "")
        )
        zone = spec.get("timezone", "") if t.recurrence else ""
        armed = t.state == TimerState.ARMED
        cancel = ""
        if armed and control_timer(t.id) is None:
            cancel = button(
                "cancel_timer",
                "Cancel",
                {"timer_id": t.id, "revision": t.revision},
                confirm=f"Cancel schedule {t.id}? No further occurrence fires.",
            )
        rows.append(
            (
                timer_link(t.id),
                state(t.state),
                text(t.recurrence or "interval"),
                text(rule if isinstance(rule, str) else str(rule)),
                text(zone),
                (when(t.fire_at_ms, now) + " " + lateness(t.fire_at_ms, now)) if armed else "",
                str(t.occurrences),
                text(t.type),
                cancel,
            )
        )
    listing = table(
        ("schedule", "state", "kind", "rule", "time zone", "next", "fired", "fires", ""),
        rows,
        table_id="schedules",
        empty="No schedules: recurring timers (cron, calendar or a fixed interval) appear here.",
    )
    older = {"after": timers[-1].id, "limit": limit} if more and timers else None
    content = listing + _pager("/ui/schedules", {}, older, after != "")
    return page(ctx, section="schedules", title="Schedules", content=content, poll=POLL_S)


async def diagnostic_list(rt: Runtime, ctx: PageContext, params: Mapping[str, str]) -> Any:
    kind = query_text(params, "kind")
    subject = query_text(params, "subject")
    limit = query_limit(params)
    before = query_int(params, "before", 0, 0, MAX_SEQ) or None
    found = await rt.diagnostics_newest(kind=kind, subject=subject, before_id=before, limit=limit + 1)
    more = len(found) > limit
    found = found[:limit]
    now = ctx.now_ms
    rows = []
    for d in found:
        about = text(d.subject)
        if d.subject.startswith("wk_"):
            about = work_link(d.subject)
        elif d.subject.startswith("ev_"):
            about = event_link(d.subject)
        detail = (
            f"<details><summary>detail</summary>{pretty_json(dict(d.detail))}</details>" if d.detail else ""
        )
        rows.append((str(d.id), text(d.kind), about, text(d.message) + detail, when(d.at_ms, now)))
    form = (
        '<form class="filters" method="get" action="/ui/diagnostics">'
        f'<label>Kind <input name="kind" value="{text(kind)}" placeholder="handler_error"></label>'
        f'<label>Subject <input name="subject" value="{text(subject)}" placeholder="a Work or Event id"></label>'
        '<button type="submit">Filter</button></form>'
    )
    listing = table(
        ("id", "kind", "subject", "message", "at"), rows, table_id="diagnostics", empty="No diagnostics."
    )
    older = {"before": found[-1].id, "limit": limit} if more and found else None
    content = listing + _pager(
        "/ui/diagnostics", {"kind": kind, "subject": subject}, older, before is not None
    )
    return page(ctx, section="diagnostics", title="Diagnostics", before=form, content=content, poll=POLL_S)
