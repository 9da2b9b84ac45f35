"""The HTTP JSON API of ``loom serve`` (Starlette): a table of operations over the `Runtime` host API
(docs/http-api.md). The service has no semantics of its own: each operation parses, calls the runtime
and renders; the OpenAPI document (`_openapi`) is generated from the same table.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ..records.clock import ManualClock
from ..records.core_events import CORE_PREFIX
from ..records.errors import InvalidRequest, NotFound
from ..records.events import EventIn
from ..records.timers import TimerSpec
from ..records.validation import MAX_KEY_LEN, MAX_LEASE_MS, MAX_RETRY_AFTER_MS, MAX_SEQ, MAX_TIME_MS
from ..records.waits import WaitSpec
from ..records.work import Completed, Failed, Handoff, Lease, Outcome
from ..runtime import Runtime
from . import _web
from ._metrics import CONTENT_TYPE, Metrics
from ._wire import (
    BAD_REQUEST,
    CAUSAL,
    CONFLICT,
    KEY,
    LOOKUP,
    MAX_BODY_BYTES,
    METHOD,
    NOT_FOUND,
    REASON_TEXT,
    SCOPE,
    STALE,
    TEXT,
    TIME,
    TOO_LARGE,
    TYPE,
    UNAUTHORIZED,
    UNAVAILABLE,
    ErrorKind,
    Field,
    HTTPError,
    classify,
    error_body,
    error_response,
    iso,
    json_response,
    parse_body,
    query_int,
    query_limit,
    query_text,
)
from ._wire import INTERNAL as INTERNAL

log = logging.getLogger("loom.service")


@attrs.define(kw_only=True)
class Service:
    """What every operation reaches: the runtime, the test clock (``None``: the wall clock), metrics."""

    rt: Runtime
    metrics: Metrics
    clock: ManualClock | None = None
    max_body: int = MAX_BODY_BYTES


@attrs.frozen(kw_only=True)
class Call:
    request: Request
    body: dict[str, Any]
    lease: Lease | None = None

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])

    @property
    def query(self) -> Any:
        return self.request.query_params


Handler = Callable[[Service, Call], Awaitable[Response]]


@attrs.frozen(kw_only=True)
class Query:
    name: str
    kind: str
    doc: str
    choices: tuple[str, ...] = ()
    schema: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Op:
    """One operation: its route, its inputs and the answers it documents."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    query: tuple[Query, ...] = ()
    body: tuple[Field, ...] | None = None
    body_required: bool = True
    body_schema: dict[str, Any] = attrs.field(factory=dict)
    """More of the body's JSON Schema, for the OpenAPI document (rules across fields)."""
    prefixes: tuple[str, ...] = ()
    renames: dict[str, str] = attrs.field(factory=dict)
    """The runtime's argument names that the API calls otherwise (``after_id`` is ``after``)."""
    ok: tuple[int, ...] = (200,)
    errors: tuple[ErrorKind, ...] = ()
    auth: bool = False
    media: str = "application/json"
    test_clock_only: bool = False

    @property
    def openapi_path(self) -> str:
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{(\w+)(?::\w+)?\}", self.path)

    @property
    def documented_errors(self) -> list[ErrorKind]:
        kinds = list(self.errors)
        if self.body is not None or self.query or self.path_params:
            kinds.append(BAD_REQUEST)
        if self.body is not None:
            kinds.append(TOO_LARGE)
        if self.auth:
            kinds += [UNAUTHORIZED, STALE]
        if self.test_clock_only:
            kinds.append(NOT_FOUND)
        return kinds


# -- shared parsing ---------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be longer than ``limit``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise HTTPError(TOO_LARGE, f"the body is {int(length)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > limit:
                raise HTTPError(TOO_LARGE, f"the body is larger than the limit of {limit} bytes")
            chunks.append(chunk)
    return b"".join(chunks)


_TOKEN = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_LEN}}}\Z")


def bearer_token(request: Request) -> str:
    """The bearer token of the ``Authorization`` header (never logged, never echoed)."""
    header = request.headers.get("authorization")
    if header is None:
        raise HTTPError(
            UNAUTHORIZED, "an Authorization: Bearer <token> header is required", field="Authorization"
        )
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN.match(token):
        raise HTTPError(
            UNAUTHORIZED,
            "the Authorization header must be 'Bearer <token>' with the execution's token",
            field="Authorization",
        )
    return token


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
            if op.body is not None:
                raw = await read_body(request, service.max_body)
                body = parse_body(raw, op.body, empty_ok=not op.body_required)
            return await op.handler(service, Call(request=request, body=body, lease=lease))
        except Exception as exc:
            kind, _ = classify(exc, op.prefixes, op.renames)
            if kind is INTERNAL:
                log.exception("%s %s failed", op.method, op.openapi_path)
            return error_response(exc, op.prefixes, op.renames)

    return endpoint


def _page(items: Sequence[Any], limit: int, cursor: Callable[[Any], object]) -> object:
    """The cursor of the next page: the last item's, when this page is full (there may be more)."""
    return cursor(items[-1]) if items and len(items) == limit else None


# -- events -----------------------------------------------------------------------------------------

EVENT_FIELDS = (
    Field("source", "string", required=True, doc="the sender's namespace", schema=TEXT),
    Field(
        "delivery_id",
        "string",
        required=True,
        doc="the sender's id: (source, delivery_id) is accepted once",
        schema=TEXT,
    ),
    Field("type", "string", required=True, doc="a dotted name like pr.opened (not core.*)", schema=TYPE),
    Field("scope", "string", required=True, doc="a scope path like org/team/repo", schema=SCOPE),
    Field("key", "string", nullable=True, doc="the correlation key", schema=KEY),
    Field("work_id", "string", nullable=True, doc="an explicit target Work", schema=TEXT),
    Field("payload", "object", doc="a JSON object, at most 1 MiB"),
)


def _event_in(body: dict[str, Any]) -> EventIn:
    return EventIn(
        source=body["source"],
        delivery_id=body["delivery_id"],
        type=body["type"],
        scope=body["scope"],
        key=body.get("key"),
        work_id=body.get("work_id"),
        payload=body.get("payload", {}),
    )


async def post_event(s: Service, call: Call) -> Response:
    event = await s.rt.publish(_event_in(call.body))
    return json_response(event, 200 if event.duplicate else 201)


async def list_events(s: Service, call: Call) -> Response:
    limit = query_limit(call.query)
    events = await s.rt.events(
        after_seq=query_int(call.query, "after", 0, 0, MAX_SEQ),
        limit=limit,
        type=query_text(call.query, "type"),
    )
    return json_response({"events": events, "next_after": _page(events, limit, lambda e: e.seq)})


async def get_event(s: Service, call: Call) -> Response:
    event = await s.rt.event(call.path("event_id"))
    return json_response({"event": event, "checkpoint": await s.rt.checkpoint(event.id)})


# -- work -------------------------------------------------------------------------------------------


async def list_work(s: Service, call: Call) -> Response:
    limit = query_limit(call.query)
    works = await s.rt.works(
        scope=query_text(call.query, "scope"),
        state=query_text(call.query, "state"),  # type: ignore[arg-type]  # checked by the runtime
        after_id=query_text(call.query, "after") or "",
        limit=limit,
    )
    return json_response({"work": works, "next_after": _page(works, limit, lambda w: w.id)})


async def work_view(rt: Runtime, work_id: str) -> dict[str, Any]:
    """A Work with everything a person or client needs about it (also behind the web view)."""
    history = await rt.history(work_id)
    work = history.work
    waits = await rt.waits(work.id)
    pending = [await rt.event(event_id) for event_id in work.pending_inputs[:100]]
    return {
        "work": work,
        "wait": next((w for w in waits if w.id == work.wait_id), None),
        "pending_inputs": pending,
        "waits": waits,
        "timers": await rt.timers(work_id=work.id, limit=1000),
        "history": {"checkpoints": history.checkpoints, "executions": history.executions},
    }


async def get_work(s: Service, call: Call) -> Response:
    return json_response(await work_view(s.rt, call.path("work_id")))


async def work_by_key(s: Service, call: Call) -> Response:
    work = await s.rt.work_for_key(call.path("key"))
    return json_response(await work_view(s.rt, work.id))


REASON = Field("reason", "string", doc="why, for the Work's history", schema=REASON_TEXT)
REQUEST_ID = Field(
    "request_id", "string", nullable=True, doc="repeating it returns the first answer", schema=TEXT
)


async def hold(s: Service, call: Call) -> Response:
    return json_response(await s.rt.hold(call.path("work_id"), reason=call.body["reason"]))


async def release(s: Service, call: Call) -> Response:
    return json_response(await s.rt.release(call.path("work_id")))


async def cancel(s: Service, call: Call) -> Response:
    return json_response(await s.rt.cancel(call.path("work_id")))


async def interrupt(s: Service, call: Call) -> Response:
    intent = await s.rt.interrupt(
        call.path("work_id"),
        reason=call.body.get("reason", "operator interrupt"),
        request_id=call.body.get("request_id"),
    )
    return json_response(intent)


async def retry(s: Service, call: Call) -> Response:
    requested = await s.rt.retry(
        call.path("work_id"),
        reason=call.body.get("reason", "operator retry"),
        request_id=call.body.get("request_id"),
    )
    return json_response(requested)


async def replay(s: Service, call: Call) -> Response:
    work = await s.rt.work(call.path("work_id"))
    event_id = call.body["event_id"]
    try:
        event = await s.rt.event(event_id)
    except (NotFound, InvalidRequest) as exc:
        raise HTTPError(BAD_REQUEST, str(exc), field="event_id") from None
    checkpoint = await s.rt.checkpoint(event.id)
    if not (
        event.work_id == work.id
        or (event.key is not None and event.key in work.keys)
        or (checkpoint is not None and checkpoint.work_id == work.id)
    ):
        raise HTTPError(BAD_REQUEST, f"event {event.id} is not an event of work {work.id}", field="event_id")
    replayed = await s.rt.replay(
        event.id, reason=call.body.get("reason", "operator replay"), request_id=call.body.get("request_id")
    )
    return json_response(replayed)


# -- timers and diagnostics -------------------------------------------------------------------------

TIMER_FIELDS = (
    Field("id", "string", required=True, doc="the timer's id (arming it again replaces it)", schema=TEXT),
    Field("fire_at_ms", "integer", required=True, doc="when it fires, Unix milliseconds", schema=TIME),
    Field("source", "string", required=True, schema=TEXT),
    Field("type", "string", required=True, schema=TYPE),
    Field("scope", "string", required=True, schema=SCOPE),
    Field("key", "string", nullable=True, schema=KEY),
    Field("work_id", "string", nullable=True, schema=TEXT),
    Field("payload", "object"),
    Field(
        "delivery_id",
        "string",
        nullable=True,
        doc="the firing's delivery identity (default: the id)",
        schema=TEXT,
    ),
    Field("interval_ms", "integer", nullable=True, doc="recur at this fixed interval", schema={"minimum": 1}),
    Field("recurrence", "string", nullable=True, doc="recur by this policy (cron, calendar)", schema=TEXT),
    Field("spec", "object", nullable=True, doc="the recurrence policy's spec"),
)


def _timer_spec(body: dict[str, Any]) -> TimerSpec:
    return TimerSpec(
        id=body["id"],
        fire_at_ms=body["fire_at_ms"],
        source=body["source"],
        type=body["type"],
        scope=body["scope"],
        key=body.get("key"),
        work_id=body.get("work_id"),
        payload=body.get("payload", {}),
        delivery_id=body.get("delivery_id"),
        interval_ms=body.get("interval_ms"),
        recurrence=body.get("recurrence"),
        spec=body.get("spec"),
    )


async def list_timers(s: Service, call: Call) -> Response:
    limit = query_limit(call.query)
    timers = await s.rt.timers(
        state=query_text(call.query, "state"),  # type: ignore[arg-type]  # checked by the runtime
        work_id=query_text(call.query, "work"),
        after_id=query_text(call.query, "after") or "",
        limit=limit,
    )
    return json_response({"timers": timers, "next_after": _page(timers, limit, lambda t: t.id)})


async def get_timer(s: Service, call: Call) -> Response:
    timer = await s.rt.timer(call.path("timer_id"))
    return json_response({"timer": timer, "firings": await s.rt.firings(timer.id)})


async def arm_timer(s: Service, call: Call) -> Response:
    spec = _timer_spec(call.body)
    if isinstance(spec.type, str) and spec.type.startswith(CORE_PREFIX):
        # the runtime's own control timers are armed by the runtime, never over the network
        raise HTTPError(BAD_REQUEST, f"type {spec.type!r} is in the privileged core.* family", field="type")
    return json_response(await s.rt.arm(spec), 201)


async def cancel_timer(s: Service, call: Call) -> Response:
    return json_response(await s.rt.cancel_timer(call.path("timer_id"), revision=call.body["revision"]))


async def list_diagnostics(s: Service, call: Call) -> Response:
    diagnostics = await s.rt.diagnostics(
        kind=query_text(call.query, "kind"),
        subject=query_text(call.query, "subject"),
        limit=query_limit(call.query),
    )
    return json_response({"diagnostics": diagnostics})


# -- the execution toolbelt (bearer token) ----------------------------------------------------------


def _lease(call: Call) -> Lease:
    assert call.lease is not None
    return call.lease


async def tool_emit(s: Service, call: Call) -> Response:
    body = dict(call.body)
    cause_id = body.pop("cause_id", None)
    event = await s.rt.toolbelt(_lease(call)).emit(_event_in(body), cause_id=cause_id)
    return json_response(event, 200 if event.duplicate else 201)


async def tool_child(s: Service, call: Call) -> Response:
    work = await s.rt.toolbelt(_lease(call)).create_child(
        call.body["name"], keys=call.body.get("keys", []), kind=call.body.get("kind")
    )
    return json_response(work)


async def tool_timer(s: Service, call: Call) -> Response:
    return json_response(await s.rt.toolbelt(_lease(call)).arm_timer(_timer_spec(call.body)))


async def tool_heartbeat(s: Service, call: Call) -> Response:
    lease_ms = call.body.get("lease_ms")
    toolbelt = (
        s.rt.toolbelt(_lease(call)) if lease_ms is None else s.rt.toolbelt(_lease(call), lease_ms=lease_ms)
    )
    await toolbelt.heartbeat()
    return json_response(
        {"execution_id": toolbelt.lease.execution_id, "expires_at_ms": toolbelt.lease.expires_at_ms}
    )


async def tool_wait(s: Service, call: Call) -> Response:
    body = call.body
    spec = WaitSpec(
        keys=tuple(body.get("keys", ())),
        types=tuple(body.get("types", ())),
        after_seq=body.get("after_seq"),
        timeout_ms=body.get("timeout_ms"),
    )
    execution = await s.rt.wait(
        _lease(call),
        spec,
        consumed_inputs=body.get("consumed_inputs", []),
        usage=body.get("usage"),
        artifacts=body.get("artifacts", []),
    )
    return json_response(execution)


_OUTCOMES = ("completed", "handoff", "failed")


def _outcome(body: dict[str, Any]) -> Outcome:
    kind = body["outcome"]
    consumed = tuple(body.get("consumed_inputs", ()))
    usage = body.get("usage", {})
    failure_fields = [name for name in ("error", "retry_after_ms", "rate_limited") if name in body]
    if kind == "failed":
        if "error" not in body:
            raise HTTPError(BAD_REQUEST, "error is required for a failed outcome", field="error")
        return Failed(
            error=body["error"],
            retry_after_ms=body.get("retry_after_ms"),
            rate_limited=body.get("rate_limited", False),
            consumed_inputs=consumed,
            usage=usage,
        )
    if failure_fields:
        raise HTTPError(
            BAD_REQUEST,
            f"{failure_fields[0]} belongs to a failed outcome, not {kind!r}",
            field=failure_fields[0],
        )
    if kind == "completed":
        return Completed(consumed_inputs=consumed, usage=usage)
    if kind == "handoff":
        return Handoff(consumed_inputs=consumed, usage=usage)
    raise HTTPError(
        BAD_REQUEST, f"outcome must be one of {', '.join(_OUTCOMES)}, got {kind[:40]!r}", field="outcome"
    )


async def tool_complete(s: Service, call: Call) -> Response:
    return json_response(await s.rt.complete(_lease(call), _outcome(call.body)))


# -- the service ------------------------------------------------------------------------------------


async def healthz(s: Service, call: Call) -> Response:
    await s.rt.events(limit=1)  # the store answers reads
    now = s.rt.clock.now_ms()
    return json_response({"status": "ok", "now_ms": now, "now": iso(now), "test_clock": s.clock is not None})


async def metrics(s: Service, call: Call) -> Response:
    return Response(s.metrics.render(), media_type=CONTENT_TYPE)


async def openapi(s: Service, call: Call) -> Response:
    from ._openapi import document

    return json_response(document(OPS, test_clock=s.clock is not None))


CLOCK_FIELDS = (
    Field(
        "advance_ms",
        "integer",
        doc="move the clock forward by this many milliseconds (>= 0)",
        schema={"minimum": 0},
    ),
    Field("now_ms", "integer", doc="move the clock to this time (never backwards)", schema=TIME),
)


def _clock_answer(clock: ManualClock, floor: int | None) -> Response:
    now = clock.now_ms()
    return json_response({"now_ms": now, "now": iso(now), "floor_ms": floor})


async def get_clock(s: Service, call: Call) -> Response:
    assert s.clock is not None
    return _clock_answer(s.clock, await s.rt.time_floor())


async def post_clock(s: Service, call: Call) -> Response:
    clock = s.clock
    assert clock is not None
    given = [name for name in ("advance_ms", "now_ms") if name in call.body]
    if len(given) != 1:
        raise HTTPError(
            BAD_REQUEST, "give exactly one of advance_ms and now_ms", field=given[1] if given else None
        )
    now = clock.now_ms()
    if given[0] == "advance_ms":
        step = call.body["advance_ms"]
        if not 0 <= step <= MAX_TIME_MS - now:
            raise HTTPError(
                BAD_REQUEST,
                f"advance_ms must be from 0 to {MAX_TIME_MS - now}, got {step}",
                field="advance_ms",
            )
        target = now + step
    else:
        target = call.body["now_ms"]
        if not now <= target <= MAX_TIME_MS:
            raise HTTPError(
                BAD_REQUEST,
                f"now_ms must be from the clock's time {now} to {MAX_TIME_MS}: time never moves backwards,"
                f" got {target}",
                field="now_ms",
            )
    clock.set(target)
    # recorded before the answer: a restart starts the clock here, never earlier
    floor = await s.rt.mark_time()
    return _clock_answer(clock, floor)


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

OPS: tuple[Op, ...] = (
    Op(method="GET", path="/healthz", handler=healthz, summary="Liveness: the store answers", tag="service",
       errors=(UNAVAILABLE,)),
    Op(method="GET", path="/metrics", handler=metrics, summary="Prometheus metrics", tag="service",
       media="text/plain"),
    Op(method="GET", path="/openapi.json", handler=openapi, summary="This document", tag="service"),
    Op(method="POST", path="/events", handler=post_event, summary="Accept an Event (exactly once)",
       tag="events", body=EVENT_FIELDS, prefixes=("event.",), ok=(201, 200)),
    Op(method="GET", path="/events", handler=list_events, summary="Accepted Events in sequence order",
       tag="events", query=(
           Query(name="after", kind="integer", doc="only Events after this sequence",
                 schema={"minimum": 0, "maximum": MAX_SEQ}),
           LIMIT,
           Query(name="type", kind="string", doc="only Events of this type"),
       )),
    Op(method="GET", path="/events/{event_id:path}", handler=get_event,
       summary="One Event and its routing checkpoint", tag="events", errors=(NOT_FOUND,)),
    Op(method="GET", path="/work", handler=list_work, summary="Work, by id", tag="work",
       renames={"after_id": "after"}, query=(
        Query(name="scope", kind="string", doc="only this scope and the scopes below it", schema=SCOPE),
        Query(name="state", kind="string", doc="only Work in this state", choices=_WORK_STATES),
        Query(name="after", kind="string", doc="only Work whose id sorts after this"),
        LIMIT,
    )),
    Op(method="GET", path="/work/by-key/{key:path}", handler=work_by_key,
       summary="The Work that owns a key, with its history", tag="work", errors=(NOT_FOUND,)),
    Op(method="POST", path="/work/{work_id:path}/hold", handler=hold, summary="Hold: no attempt starts",
       tag="controls", body=(attrs.evolve(REASON, required=True),), errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/release", handler=release, summary="Release a hold",
       tag="controls", body=(), body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/cancel", handler=cancel, summary="Cancel (terminal)",
       tag="controls", body=(), body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/interrupt", handler=interrupt,
       summary="Interrupt the running attempt", tag="controls", body=(REASON, REQUEST_ID),
       body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/retry", handler=retry, summary="Start the next attempt now",
       tag="controls", body=(REASON, REQUEST_ID), body_required=False, errors=(NOT_FOUND, CONFLICT)),
    Op(method="POST", path="/work/{work_id:path}/replay", handler=replay,
       summary="Route again one of the Work's Events that stayed unrouted", tag="controls",
       body=(Field("event_id", "string", required=True, schema=LOOKUP), REASON, REQUEST_ID),
       errors=(NOT_FOUND, CONFLICT)),
    Op(method="GET", path="/work/{work_id:path}", handler=get_work,
       summary="One Work: state, hold, keys, attempts, wait, pending input, timers, history", tag="work",
       errors=(NOT_FOUND,)),
    Op(method="GET", path="/timers", handler=list_timers, summary="Timers, by id", tag="timers",
       renames={"after_id": "after", "work_id": "work"}, query=(
        Query(name="state", kind="string", doc="only timers in this state", choices=_TIMER_STATES),
        Query(name="work", kind="string", doc="only timers of this Work"),
        Query(name="after", kind="string", doc="only timers whose id sorts after this"),
        LIMIT,
    )),
    Op(method="POST", path="/timers", handler=arm_timer, summary="Arm a root timer (a schedule, a reminder)",
       tag="timers", body=TIMER_FIELDS, prefixes=("timer.", "event."), ok=(201,), errors=(CONFLICT,)),
    Op(method="POST", path="/timers/{timer_id:path}/cancel", handler=cancel_timer,
       summary="Cancel a timer at its revision", tag="timers",
       body=(Field("revision", "integer", required=True, schema={"minimum": 1}),),
       errors=(NOT_FOUND, CONFLICT)),
    Op(method="GET", path="/timers/{timer_id:path}", handler=get_timer,
       summary="One timer and its firing ledger", tag="timers", errors=(NOT_FOUND,)),
    Op(method="GET", path="/diagnostics", handler=list_diagnostics, summary="Durable diagnostics",
       tag="service", query=(
           Query(name="kind", kind="string", doc="only this kind (handler_error, ...)"),
           Query(name="subject", kind="string", doc="only about this subject"),
           LIMIT,
       )),
    Op(method="POST", path="/executions/{execution_id:path}/emit", handler=tool_emit,
       summary="Emit a derived Event from the attempt", tag="toolbelt", auth=True, ok=(201, 200),
       body=(*EVENT_FIELDS, Field("cause_id", "string", nullable=True, doc="a cited cause", schema=LOOKUP)),
       prefixes=("event.",), errors=(*_TOOL_ERRORS, CAUSAL)),
    Op(method="POST", path="/executions/{execution_id:path}/child", handler=tool_child,
       summary="Create child Work (idempotent by name)", tag="toolbelt", auth=True,
       body=(Field("name", "string", required=True, schema=TEXT), Field("keys", "strings"),
             Field("kind", "string", nullable=True, schema=TEXT)),
       prefixes=("create_child: ",), errors=(*_TOOL_ERRORS, CAUSAL)),
    Op(method="POST", path="/executions/{execution_id:path}/timer", handler=tool_timer,
       summary="Arm a timer derived from the attempt", tag="toolbelt", auth=True, body=TIMER_FIELDS,
       prefixes=("timer.", "event."), errors=_TOOL_ERRORS),
    Op(method="POST", path="/executions/{execution_id:path}/wait", handler=tool_wait,
       summary="Park the attempt on a wait", tag="toolbelt", auth=True,
       body=(Field("keys", "strings"), Field("types", "strings"),
             Field("after_seq", "integer", nullable=True, schema={"minimum": 0, "maximum": MAX_SEQ}),
             Field("timeout_ms", "integer", nullable=True, schema={"minimum": 1, "maximum": MAX_TIME_MS}),
             Field("consumed_inputs", "strings"),
             Field("usage", "amounts"), Field("artifacts", "strings")),
       prefixes=("outcome.wait.", "outcome."), errors=_TOOL_ERRORS),
    Op(method="POST", path="/executions/{execution_id:path}/heartbeat", handler=tool_heartbeat,
       summary="Renew the attempt's lease", tag="toolbelt", auth=True,
       body=(Field("lease_ms", "integer", nullable=True, schema={"minimum": 1, "maximum": MAX_LEASE_MS}),),
       body_required=False, errors=_TOOL_ERRORS),
    Op(method="POST", path="/executions/{execution_id:path}/complete", handler=tool_complete,
       summary="End the attempt: completed, handoff or failed", tag="toolbelt", auth=True,
       body=(Field("outcome", "string", required=True, doc="completed, handoff or failed",
                   schema={"enum": list(_OUTCOMES)}),
             Field("consumed_inputs", "strings"), Field("usage", "amounts"),
             Field("error", "string", schema=REASON_TEXT),
             Field("retry_after_ms", "integer", nullable=True, schema={"minimum": 0, "maximum": MAX_RETRY_AFTER_MS}),
             Field("rate_limited", "boolean")),
       prefixes=("outcome.",), errors=_TOOL_ERRORS),
    Op(method="GET", path="/debug/clock", handler=get_clock, summary="The test clock", tag="debug",
       test_clock_only=True),
    Op(method="POST", path="/debug/clock", handler=post_clock, summary="Move the test clock forward",
       tag="debug", body=CLOCK_FIELDS, body_schema={"minProperties": 1, "maxProperties": 1},
       test_clock_only=True),
)  # fmt: skip


async def _not_found(request: Request, exc: Exception) -> Response:
    if isinstance(exc, HTTPException) and exc.status_code == 405:
        return json_response(
            error_body(METHOD, f"{request.method} is not allowed on {request.url.path}", None), 405
        )
    return json_response(error_body(NOT_FOUND, f"no route for {request.url.path}", None), 404)


def make_app(
    rt: Runtime,
    *,
    metrics: Metrics | None = None,
    clock: ManualClock | None = None,
    max_body: int = MAX_BODY_BYTES,
) -> Starlette:
    """The service's ASGI app over ``rt``: the JSON API, the web view and ``/metrics``.

    ``clock`` is the test clock ``POST /debug/clock`` moves (``None``: ``/debug/clock`` is 404).
    ``metrics`` are counted by the caller (`Metrics.run`); without them ``/metrics`` shows zeros.
    """
    service = Service(rt=rt, metrics=metrics or Metrics(), clock=clock, max_body=max_body)
    routes: list[Route] = [
        Route(op.path, _endpoint(service, op), methods=[op.method], name=f"{op.method} {op.path}")
        for op in OPS
    ]
    routes += _web.routes(rt, work_view)
    routes.append(Route("/", lambda request: RedirectResponse("/ui/work"), methods=["GET"]))
    return Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_found})
