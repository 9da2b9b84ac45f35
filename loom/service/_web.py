"""The web console of ``loom serve`` (docs/http-api.md "Web console"): server-rendered pages for Works,
one Work, Events, timers, schedules and diagnostics, kept live by a small script (`_web_static`), and
the operator's actions on them.

* **Live.** Work pages follow ``GET /ui/watch`` (the server-sent events of ``/watch``, opened by a
  ``ready`` event once the watch is in place); the others poll. On a change the script fetches the
  page again and swaps its ``#live`` part: no reload, the filters and a typed reason stay.
* **Actions.** ``POST /ui/act/{action}`` (hold, release, cancel, interrupt, retry, cancel_timer) takes
  a JSON body naming its target, with the page's CSRF token in ``X-Loom-CSRF``. Like every request
  that changes state it passes the access checks first (`_access`): the operator token when the
  server has one, and no page of another origin (a body must be JSON, which another site's page
  cannot send without this server's consent). The token in the page is one more check: only a page
  this server rendered knows it. Destructive buttons ask for a confirmation first.
* **Escaping.** Every value is escaped where it is written (`_web_html`); the pages run no inline
  script and load nothing from elsewhere (Content-Security-Policy).
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from ..records.clock import ManualClock
from ..records.validation import MAX_INT, validate_scope
from ..runtime import Runtime
from . import _web_more as more
from . import _web_pages as pages
from ._ops import Watches, read_json_body
from ._stream import changes, sse
from ._web_html import PageContext, page, text
from ._web_static import ICON, SCRIPT, STYLE
from ._wire import (
    FORBIDDEN,
    LOOKUP,
    NOT_FOUND,
    REASON_TEXT,
    Field,
    HTTPError,
    classify,
    error_response,
    form_params,
    json_response,
    parse_body,
    query_text,
)

log = logging.getLogger("loom.service.web")

CSRF_HEADER = "X-Loom-CSRF"
WORK = Field("work_id", "string", required=True, schema=LOOKUP)
REASON = Field("reason", "string", schema=REASON_TEXT)
ACTIONS: dict[str, tuple[Field, ...]] = {
    "hold": (WORK, Field("reason", "string", required=True, schema=REASON_TEXT)),
    "release": (WORK,),
    "cancel": (WORK, REASON),
    "interrupt": (WORK, REASON),
    "retry": (WORK, REASON),
    "cancel_timer": (
        Field("timer_id", "string", required=True, schema=LOOKUP),
        Field("revision", "integer", required=True, schema={"minimum": 1, "maximum": MAX_INT}),
    ),
}


async def act(rt: Runtime, action: str, body: dict[str, Any]) -> str:
    """Carry out one console action; what happened, in a sentence."""
    if action == "cancel_timer":
        timer = await rt.cancel_timer(body["timer_id"], revision=body["revision"])
        return f"Timer {timer.id} is {timer.state}."
    work_id = body["work_id"]
    if action == "hold":
        await rt.hold(work_id, reason=body["reason"])
        return f"Work {work_id} is held: no attempt starts until it is released."
    if action == "release":
        await rt.release(work_id)
        return f"Work {work_id} is released."
    if action == "cancel":
        work = await rt.cancel(work_id)
        return f"Work {work.id} is {work.state}."
    if action == "interrupt":
        await rt.interrupt(work_id, reason=body.get("reason", "operator interrupt (web console)"))
        return f"The running attempt of {work_id} is asked to stop."
    requested = await rt.retry(work_id, reason=body.get("reason", "operator retry (web console)"))
    return f"Work {work_id}: the next attempt is requested ({requested.id})."


class Console:
    """The console's routes over one runtime; ``clock`` is the test clock, if the server has one."""

    def __init__(self, rt: Runtime, clock: ManualClock | None, watches: Watches) -> None:
        self.rt = rt
        self.clock = clock
        self.watches = watches
        self.csrf = secrets.token_urlsafe(24)

    def context(self) -> PageContext:
        return PageContext(now_ms=self.rt.clock.now_ms(), csrf=self.csrf, test_clock=self.clock is not None)

    def _page(
        self, render: Callable[..., Awaitable[Any]], *names: str
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            ctx = self.context()
            try:
                if names:
                    response: Response = await render(
                        self.rt, ctx, *(str(request.path_params[n]) for n in names)
                    )
                else:
                    response = await render(self.rt, ctx, form_params(request.query_params))
                return response
            except Exception as exc:
                return self._error_page(ctx, exc)

        return endpoint

    def _error_page(self, ctx: PageContext, exc: Exception) -> Response:
        kind, field = classify(exc, renames={"before_seq": "before", "after_id": "after"})
        if kind.status >= 500:
            log.exception("web console page failed")
            message = "internal error (logged)"
        else:
            message = exc.message if isinstance(exc, HTTPError) else str(exc)
        where = f" ({text(field)})" if field else ""
        content = f'<p id="error" class="error">{text(message)}{where}</p>'
        return page(ctx, section="", title=f"{kind.status} {kind.name}", content=content, status=kind.status)

    async def act_endpoint(self, request: Request) -> Response:
        action = str(request.path_params["action"])
        try:
            fields = ACTIONS.get(action)
            if fields is None:
                raise HTTPError(NOT_FOUND, f"no console action {action!r}; the actions: {', '.join(ACTIONS)}")
            given = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode("utf-8", "replace"), self.csrf.encode()):
                raise HTTPError(
                    FORBIDDEN,
                    f"the console's actions need the {CSRF_HEADER} header of a page this server rendered"
                    " (reload the page)",
                    field=CSRF_HEADER,
                )
            body = parse_body(await read_json_body(request, 64 * 1024), fields)
            message = await act(self.rt, action, body)
        except Exception as exc:
            kind, _ = classify(exc)
            if kind.status >= 500:
                log.exception("web console action %s failed", action)
            return error_response(exc)
        log.info("console: %s %s", action, body.get("work_id") or body.get("timer_id"))
        return json_response({"ok": True, "message": message})

    async def watch_endpoint(self, request: Request) -> Response:
        try:
            params = form_params(request.query_params)
            scope = query_text(params, "scope")
            if scope is not None:
                validate_scope(scope, field="scope")
            work_id = query_text(params, "work")
        except Exception as exc:
            return error_response(exc)

        async def stream() -> AsyncIterator[bytes]:
            first = True
            async for chunk in changes(
                self.rt, scope=scope, work_id=work_id, limit=float("inf"), watches=self.watches
            ):
                yield chunk
                if first:  # the watch is in place: the page refreshes once, then on each change
                    first = False
                    yield sse("ready", {"now_ms": self.rt.clock.now_ms()})

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    def routes(self) -> list[Route]:
        static = {
            "console.js": (SCRIPT, "text/javascript; charset=utf-8"),
            "console.css": (STYLE, "text/css; charset=utf-8"),
            "icon.svg": (ICON, "image/svg+xml"),
        }

        async def static_endpoint(request: Request) -> Response:
            found = static.get(str(request.path_params["name"]))
            if found is None:
                return Response("not found", status_code=404, media_type="text/plain")
            body, media = found
            return Response(body, media_type=media, headers={"Cache-Control": "no-cache"})

        async def home(request: Request) -> Response:
            return RedirectResponse("/ui/work")

        return [
            Route("/ui", home, methods=["GET"]),
            Route("/ui/", home, methods=["GET"]),
            Route("/ui/static/{name}", static_endpoint, methods=["GET"]),
            Route("/ui/watch", self.watch_endpoint, methods=["GET"]),
            Route("/ui/act/{action}", self.act_endpoint, methods=["POST"]),
            Route("/ui/work", self._page(pages.work_list), methods=["GET"]),
            Route("/ui/work/{work_id:path}", self._page(pages.work_page, "work_id"), methods=["GET"]),
            Route("/ui/events", self._page(more.event_list), methods=["GET"]),
            Route("/ui/events/{event_id:path}", self._page(more.event_page, "event_id"), methods=["GET"]),
            Route("/ui/timers", self._page(more.timer_list), methods=["GET"]),
            Route("/ui/timers/{timer_id:path}", self._page(more.timer_page, "timer_id"), methods=["GET"]),
            Route("/ui/schedules", self._page(more.schedule_list), methods=["GET"]),
            Route("/ui/diagnostics", self._page(more.diagnostic_list), methods=["GET"]),
        ]


def routes(rt: Runtime, clock: ManualClock | None, watches: Watches) -> list[Route]:
    return Console(rt, clock, watches).routes()
