"""The HTTP JSON API of ``loom serve`` (Starlette): a table of operations over the `Runtime` host API
(docs/http-api.md). The service has no semantics of its own: each operation parses, calls the runtime
and renders; the OpenAPI document (`_openapi`) is generated from the same table."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Match, Route

from ..records.clock import ManualClock
from ..records.validation import (
    CORE_UNITS,
    MAX_INT,
    MAX_LEASE_MS,
    MAX_REASON_LEN,
    MAX_RETRY_AFTER_MS,
    MAX_SEQ,
    MAX_TIME_MS,
)
from ..runtime import Runtime
from . import _batch as batch
from . import _handlers as handlers
from . import _results as results
from . import _schemas as S
from . import _stream as stream
from . import _tool_handlers as tools
from . import _web
from ._access import Access, Guard
from ._batch import MAX_BATCH_BYTES, batch_items
from ._compaction import COMPACT_FIELDS, COMPACTED, compact
from ._handlers import EVENT_FIELDS, REASON, REQUEST_ID, TIMER_FIELDS, TIMER_RULES
from ._logs import AccessLog
from ._metrics import Metrics
from ._openapi import document
from ._ops import Call, Op, Query, Service, bearer_token, read_json_body
from ._tool_handlers import CLOCK_FIELDS, OUTCOMES
from ._wire import (
    CALL_PARKED,
    CALL_REFUSED,
    CAUSAL,
    CONFLICT,
    JSON_VALUE_REF,
    KEY,
    LOOKUP,
    MAX_BODY_BYTES,
    METHOD,
    NOT_FOUND,
    REASON_TEXT,
    SCOPE,
    TEXT,
    TOO_LARGE,
    UNAVAILABLE,
    Field,
    HTTPError,
    classify,
    error_body,
    error_response,
    json_response,
    parse_body,
)
from ._wire import INTERNAL as INTERNAL

log = logging.getLogger("loom.service")


async def openapi(s: Service, call: Call) -> Response:
    return json_response(
        document(OPS, test_clock=s.clock is not None, operator_token=s.access.token is not None)
    )


# -- the table --------------------------------------------------------------------------------------

_WORK_STATES = ("ready", "running", "waiting", "completed", "cancelled", "failed")
_TIMER_STATES = ("armed", "fired", "cancelled", "disabled", "invalid")
LIMIT = Query(
    name="limit",
    kind="integer",
    doc="page size, 1 to 1000 (default 100)",
    schema={"minimum": 1, "maximum": 1000},
)
_TOOL_ERRORS = (NOT_FOUND, CONFLICT)
_GATED = (CALL_REFUSED, CALL_PARKED)
"""What the call gates may answer a gated toolbelt call (docs/recovery.md "Gated calls")."""
KEYS = Field("keys", "strings", doc="correlation keys", schema={"items": KEY})
CONSUMED = Field(
    "consumed_inputs", "strings", doc="ids of the input Events it consumed", schema={"items": TEXT}
)
USAGE = Field(
    "usage",
    "amounts",
    doc="what it consumed, by unit (turns and attempts are counted by the runtime)",
    schema={
        "propertyNames": {**TEXT, "not": {"enum": list(CORE_UNITS)}},
        "additionalProperties": {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_INT},
                {"type": "number", "minimum": 0, "not": {"type": "integer"}},
            ]
        },
    },
)
OUTCOME_RULES = {  # error is required by a failed outcome, and it and the retry hints belong to one only
    "if": {"properties": {"outcome": {"const": "failed"}}},
    "then": {"required": ["error"]},
    "else": {
        "properties": {"error": False, "retry_after_ms": False, "rate_limited": False, "retryable": False}
    },
}
VALUE_RULE = {  # a value belongs to a completed outcome only
    "if": {"required": ["value"]},
    "then": {"properties": {"outcome": {"const": "completed"}}},
}

OPS: tuple[Op, ...] = (
    # a key may end as the results' paths do (kk/result): looked up by key before they take it for an id
    Op(method="GET", path="/work/by-key/{key:path}", handler=handlers.work_by_key,
       answer=S.WORK_VIEW, summary="The Work that owns a key, with its history", tag="work", errors=(NOT_FOUND,)),
    *results.OPS,  # before GET /work/{work_id:path}, which would take their paths for ids
    Op(method="GET", path="/healthz", handler=tools.healthz, answer=S.HEALTH, summary="Health: the store answers reads and writes",
       tag="service", public=True, errors=(UNAVAILABLE,)),
    Op(method="GET", path="/metrics", handler=tools.metrics, answer={"type": "string"}, summary="Prometheus metrics", tag="service",
       media="text/plain"),
    Op(method="GET", path="/openapi.json", handler=openapi, answer={"type": "object"}, summary="This document", tag="service", public=True),
    Op(method="POST", path="/events", handler=batch.post_event, answer=results.ROUTED_OR_BATCH,
       summary="Accept an Event (exactly once), or a batch of them in order; one Event's answer says where"
       " it was routed", tag="events", query=(results.EVENT_WAIT,), body=EVENT_FIELDS,
       prefixes=("event.",), ok=(201, 200), batch=True),
    Op(method="GET", path="/events", handler=handlers.list_events, answer=S.EVENTS_PAGE, summary="Accepted Events in sequence order",
       tag="events", query=(
           Query(name="after", kind="integer", doc="only Events after this sequence",
                 schema={"minimum": 0, "maximum": MAX_SEQ}),
           LIMIT,
           Query(name="type", kind="string", doc="only Events of this type", schema=LOOKUP),
       )),
    Op(method="GET", path="/events/{event_id:path}", handler=handlers.get_event,
       answer=S.EVENT_VIEW, summary="One Event and its routing checkpoint", tag="events", errors=(NOT_FOUND,)),
    Op(method="GET", path="/watch", handler=stream.watch, answer={"type": "string"},
       summary="Work changes as server-sent events (event: work, lagged, changed)", tag="work",
       media="text/event-stream", query=(
        Query(name="scope", kind="string", doc="only Work in this scope and the scopes below it", schema=SCOPE),
        Query(name="work", kind="string", doc="only this Work", schema=LOOKUP),
        Query(name="limit", kind="integer", doc="end the stream after this many Work changes (default: never)",
              schema={"minimum": 1, "maximum": 1_000_000}),
    )),
    Op(method="GET", path="/work", handler=handlers.list_work, answer=S.WORK_PAGE, summary="Work, by id", tag="work",
       renames={"after_id": "after"}, query=(
        Query(name="scope", kind="string", doc="only this scope and the scopes below it", schema=SCOPE),
        Query(name="state", kind="string", doc="only Work in this state", choices=_WORK_STATES),
        Query(name="after", kind="string", doc="only Work whose id sorts after this", schema=LOOKUP),
        LIMIT,
    )),
    Op(method="POST", path="/work/{work_id:path}/hold", handler=handlers.hold, answer=S.WORK, summary="Hold: no attempt starts",
       tag="controls", body=(attrs.evolve(REASON, required=True),), errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/release", handler=handlers.release, answer=S.WORK, summary="Release a hold",
       tag="controls", body=(), body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/cancel", handler=handlers.cancel, answer=S.WORK, summary="Cancel (terminal)",
       tag="controls", body=(), body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/interrupt", handler=handlers.interrupt,
       answer=S.INTENT, summary="Interrupt the running attempt", tag="controls", body=(REASON, REQUEST_ID),
       body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/retry", handler=handlers.retry, answer=S.EVENT, summary="Start the next attempt now",
       tag="controls", body=(REASON, REQUEST_ID), body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/replay", handler=handlers.replay,
       answer=S.EVENT, summary="Route again one of the Work's Events that stayed unrouted", tag="controls",
       body=(Field("event_id", "string", required=True, schema=LOOKUP), REASON, REQUEST_ID),
       errors=(NOT_FOUND, CONFLICT)),
    Op(method="GET", path="/work/{work_id:path}", handler=handlers.get_work,
       answer=S.WORK_VIEW, summary="One Work: state, hold, keys, attempts, wait, pending input, timers, history", tag="work",
       errors=(NOT_FOUND,)),
    Op(method="GET", path="/timers", handler=handlers.list_timers, answer=S.TIMERS_PAGE, summary="Timers, by id", tag="timers",
       renames={"after_id": "after", "work_id": "work"}, query=(
        Query(name="state", kind="string", doc="only timers in this state", choices=_TIMER_STATES),
        Query(name="work", kind="string", doc="only timers of this Work", schema=LOOKUP),
        Query(name="after", kind="string", doc="only timers whose id sorts after this", schema=LOOKUP),
        LIMIT,
    )),
    Op(method="POST", path="/timers", handler=handlers.arm_timer, answer=S.TIMER, summary="Arm a root timer (a schedule, a reminder)",
       tag="timers", body=TIMER_FIELDS, body_schema=TIMER_RULES, prefixes=("timer.", "event."), ok=(201,),
       errors=(CONFLICT,)),
    Op(method="POST", path="/timers/{timer_id:path}/cancel", handler=handlers.cancel_timer,
       answer=S.TIMER, summary="Cancel a timer at its revision", tag="timers",
       body=(Field("revision", "integer", required=True, schema={"minimum": 1, "maximum": MAX_INT}),),
       errors=(NOT_FOUND, CONFLICT)),
    Op(method="GET", path="/timers/{timer_id:path}", handler=handlers.get_timer,
       answer=S.TIMER_VIEW, summary="One timer and its firing ledger", tag="timers", errors=(NOT_FOUND,)),
    Op(method="GET", path="/diagnostics", handler=handlers.list_diagnostics, answer=S.DIAGNOSTICS_PAGE, summary="Durable diagnostics",
       tag="service", query=(
           Query(name="kind", kind="string", doc="only this kind (handler_error, ...)", schema=LOOKUP),
           Query(name="subject", kind="string", doc="only about this subject", schema=LOOKUP),
           Query(name="after", kind="integer", doc="only diagnostics recorded after this id",
                 schema={"minimum": 0, "maximum": MAX_SEQ}),
           LIMIT,
       )),
    Op(method="POST", path="/compact", handler=compact, answer=COMPACTED, tag="service", body=COMPACT_FIELDS, body_required=False,
       summary="Compact now: remove what ended once its retention passed (or, dry run, say what)"),
    Op(method="POST", path="/executions/{execution_id:path}/emit", handler=tools.tool_emit,
       answer=S.EVENT, summary="Emit a derived Event from the attempt", tag="toolbelt", auth=True, ok=(201, 200),
       body=(*EVENT_FIELDS, Field("cause_id", "string", nullable=True, doc="a cited cause", schema=LOOKUP)),
       prefixes=("event.",), errors=(*_TOOL_ERRORS, CAUSAL, *_GATED)),
    Op(method="POST", path="/executions/{execution_id:path}/child", handler=tools.tool_child,
       answer=S.WORK, summary="Create child Work (idempotent by name)", tag="toolbelt", auth=True,
       body=(Field("name", "string", required=True, schema=TEXT), KEYS,
             Field("kind", "string", nullable=True, schema=TEXT)),
       prefixes=("create_child: ",), errors=(*_TOOL_ERRORS, CAUSAL, *_GATED)),
    Op(method="POST", path="/executions/{execution_id:path}/timer", handler=tools.tool_timer,
       answer=S.TIMER, summary="Arm a timer derived from the attempt", tag="toolbelt", auth=True, body=TIMER_FIELDS,
       body_schema=TIMER_RULES, prefixes=("timer.", "event."), errors=(*_TOOL_ERRORS, *_GATED)),
    Op(method="POST", path="/executions/{execution_id:path}/wait", handler=tools.tool_wait,
       answer=S.EXECUTION, summary="Park the attempt on a wait", tag="toolbelt", auth=True,
       body=(KEYS, Field("types", "strings", doc="type patterns like order.*", schema={"items": TEXT}),
             Field("after_seq", "integer", nullable=True, schema={"minimum": 0, "maximum": MAX_SEQ}),
             Field("timeout_ms", "integer", nullable=True, schema={"minimum": 1, "maximum": MAX_TIME_MS}),
             CONSUMED, USAGE,
             Field("artifacts", "strings", schema={"items": {**TEXT, "maxLength": MAX_REASON_LEN}})),
       prefixes=("outcome.wait.", "outcome."), errors=_TOOL_ERRORS),
    Op(method="POST", path="/executions/{execution_id:path}/heartbeat", handler=tools.tool_heartbeat,
       answer=S.HEARTBEAT, summary="Renew the attempt's lease", tag="toolbelt", auth=True,
       body=(Field("lease_ms", "integer", nullable=True, schema={"minimum": 1, "maximum": MAX_LEASE_MS}),),
       body_required=False, errors=_TOOL_ERRORS),
    Op(method="POST", path="/executions/{execution_id:path}/complete", handler=tools.tool_complete,
       answer=S.EXECUTION, summary="End the attempt: completed, handoff or failed", tag="toolbelt", auth=True,
       body=(Field("outcome", "string", required=True, doc="completed, handoff or failed",
                   schema={"enum": list(OUTCOMES)}),
             CONSUMED, USAGE,
             Field("error", "string", doc="why it failed (a failed outcome only)", schema=REASON_TEXT),
             Field("retry_after_ms", "integer", nullable=True, schema={"minimum": 0, "maximum": MAX_RETRY_AFTER_MS}),
             Field("rate_limited", "boolean"),
             Field("retryable", "boolean", doc="false: it would fail again; no automatic retry (a failed"
                   " outcome only)"),
             Field("value", "json", doc="the result (a completed outcome only), any JSON value up"
                   " to 1 MiB", schema=JSON_VALUE_REF)),
       body_schema={"allOf": [OUTCOME_RULES, VALUE_RULE]}, prefixes=("outcome.",), errors=_TOOL_ERRORS),
    Op(method="GET", path="/debug/clock", handler=tools.get_clock, answer=S.CLOCK, summary="The test clock", tag="debug",
       test_clock_only=True),
    Op(method="POST", path="/debug/clock", handler=tools.post_clock, answer=S.CLOCK, summary="Move the test clock forward",
       tag="debug", body=CLOCK_FIELDS, body_schema={"minProperties": 1, "maxProperties": 1},
       errors=(CONFLICT,), test_clock_only=True),
)  # fmt: skip


def _endpoint(service: Service, op: Op) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            if op.test_clock_only and service.clock is None:
                raise HTTPError(NOT_FOUND, f"{op.openapi_path} exists only under loom serve --test-clock")
            lease = None
            if op.auth:
                token = bearer_token(request)
                lease = await service.rt.lease_for(str(request.path_params["execution_id"]), token)
            body: dict[str, Any] = {}
            items = None
            if op.body is not None:
                limit = max(service.max_body, MAX_BATCH_BYTES) if op.batch else service.max_body
                try:
                    raw = await read_json_body(request, limit, ndjson=op.batch)
                except HTTPError as refused:
                    if refused.kind is not TOO_LARGE or not op.batch:
                        raise
                    raise HTTPError(
                        TOO_LARGE,
                        f"{refused.message} (for a batch; {service.max_body} bytes for one Event)",
                    ) from None
                items = batch_items(raw, request.headers.get("content-type")) if op.batch else None
                if items is None:
                    if len(raw) > service.max_body:
                        raise HTTPError(
                            TOO_LARGE, f"the body is {len(raw)} bytes; the limit is {service.max_body}"
                        )
                    body = parse_body(raw, op.body, empty_ok=not op.body_required)
            return await op.handler(service, Call(request=request, body=body, lease=lease, items=items))
        except Exception as exc:
            kind, _ = classify(exc, op.prefixes, op.renames)
            if kind is INTERNAL:
                log.exception("%s %s failed", op.method, op.openapi_path)
            if kind is NOT_FOUND and all(route.endpoint is not endpoint for route in _routes_of(request)):
                # no object has this id with its '/': the path is an action's, in another method
                return _method_not_allowed(request)
            return error_response(exc, op.prefixes, op.renames)

    return endpoint


def match_whole_path(route: Route) -> Route:
    """Make ``route`` match only the whole path, newlines included. Starlette compiles a path template
    to a regex ending in ``$``, which also matches before a final newline, and its ``{name:path}`` is
    ``.*``, which stops at a newline: ``/timers/t1%0a`` was read as the timer ``t1``, and
    ``/work/wk%0ax`` matched no route at all. Matched whole, an id holding a newline reaches the
    runtime as sent and is refused (400, naming it) like any other control character."""
    pattern = route.path_regex.pattern
    assert pattern.endswith("$"), pattern
    route.path_regex = re.compile(pattern[:-1] + r"\Z", route.path_regex.flags | re.DOTALL)
    return route


def _routes_of(request: Request) -> list[Any]:
    """The routes whose path template matches this path, whatever the method. A template that matches
    only by taking a ``/`` into an id (``/work/{work_id:path}`` for ``/work/wk_1/hold``) yields to one
    that matches it as written (``/work/{work_id:path}/hold``)."""
    found: list[tuple[bool, Any]] = []
    for route in request.app.routes:
        match, child = route.matches(request.scope)
        if match is not Match.NONE:
            swallows = any("/" in str(value) for value in child.get("path_params", {}).values())
            found.append((swallows, route))
    exact = [route for swallows, route in found if not swallows]
    return exact or [route for _, route in found]


def _allowed(request: Request) -> list[str]:
    """Every method the path takes (several routes may serve one path)."""
    return sorted(
        {method for route in _routes_of(request) for method in getattr(route, "methods", None) or ()}
    )


def requested_path(request: Request) -> str:
    """The path as requested (decoded, as the routes read it), quoted with its control characters
    escaped. Not ``request.url.path``: building the URL drops tabs and newlines (as ``urllib`` does),
    so ``/work/wk%0ax`` would be answered as ``/work/wkx``, a path no one asked for."""
    return repr(str(request.scope["path"]))


def _method_not_allowed(request: Request) -> Response:
    allowed = _allowed(request)
    message = f"{request.method} is not allowed on {requested_path(request)}; it takes {', '.join(allowed)}"
    return json_response(error_body(METHOD, message, None), 405, headers={"Allow": ", ".join(allowed)})


async def _not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return _method_not_allowed(request)
    return json_response(error_body(NOT_FOUND, f"no route for {requested_path(request)}", None), 404)


def make_app(
    rt: Runtime,
    *,
    metrics: Metrics | None = None,
    clock: ManualClock | None = None,
    max_body: int = MAX_BODY_BYTES,
    access: Access | None = None,
    stopping: trio.Event | None = None,
) -> Starlette:
    """The service's ASGI app over ``rt``: the JSON API, the web view and ``/metrics``.

    ``clock`` is the test clock ``POST /debug/clock`` moves (``None``: ``/debug/clock`` is 404).
    ``metrics`` are counted by the caller (`Metrics.run`); without them ``/metrics`` shows zeros.
    ``access``: the host names served and the operator token (default: loopback names, no token).
    ``stopping``: set when the server stops, so long-polls answer at once.
    """
    access = access if access is not None else Access()
    service = Service(
        rt=rt, metrics=metrics or Metrics(), clock=clock, max_body=max_body, access=access, stopping=stopping
    )
    by_op = [
        (op, Route(op.path, _endpoint(service, op), methods=[op.method], name=f"{op.method} {op.path}"))
        for op in OPS
    ]
    routes = [route for _, route in by_op]
    routes += _web.routes(rt, clock, service.watches)
    routes.append(Route("/", lambda request: RedirectResponse("/ui/work"), methods=["GET"]))
    for route in routes:
        match_whole_path(route)
    open_routes = [route for op, route in by_op if not op.needs_operator_token]

    def is_open(scope: Any) -> bool:
        return any(route.matches(scope)[0] is not Match.NONE for route in open_routes)  # its path, any method

    app = Starlette(
        routes=routes,
        exception_handlers={404: _not_found, 405: _not_found},
        middleware=[Middleware(AccessLog), Middleware(Guard, access=access, is_open=is_open)],
    )
    app.state.watches = service.watches  # ended by a stopping server (`serve.run_http`)
    return app
