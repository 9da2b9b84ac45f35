"""The API's handlers for Events, Work and its operator controls, timers and diagnostics (docs/http-api.md)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..kernel.timers import MAX_INTERVAL_MS, MAX_TIMER_ID_LEN
from ..records.core_events import CORE_PREFIX
from ..records.errors import InvalidRequest, NotFound
from ..records.events import Event, EventIn
from ..records.timers import TimerSpec
from ..records.validation import MAX_SEQ, check_reason, check_text
from ..runtime import Runtime
from ._ops import Call, Service, page
from ._wire import (
    BAD_REQUEST,
    CONFLICT,
    JSON_OBJECT,
    KEY,
    NOT_FOUND,
    OUTSIDE_CORE,
    REASON_TEXT,
    SCOPE,
    TEXT,
    TIME,
    Field,
    HTTPError,
    json_bytes,
    json_response,
    query_int,
    query_limit,
    query_text,
)
from ._wire import INTERNAL as INTERNAL

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
    Field(
        "type", "string", required=True, doc="a dotted name like pr.opened (not core.*)", schema=OUTSIDE_CORE
    ),
    Field("scope", "string", required=True, doc="a scope path like org/team/repo", schema=SCOPE),
    Field("key", "string", nullable=True, doc="the correlation key", schema=KEY),
    Field("work_id", "string", nullable=True, doc="an explicit target Work", schema=TEXT),
    Field("payload", "object", doc="a JSON object, at most 1 MiB", schema=JSON_OBJECT),
)


def event_in(body: dict[str, Any]) -> EventIn:
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
    event = await s.rt.publish(event_in(call.body))
    return json_response(event, 200 if event.duplicate else 201)


PAGE_BYTES = 8 * 1024 * 1024
"""A page of ``GET /events`` ends once its payloads reach this many bytes (Events of up to 1 MiB each
would make a page of 1,000 about 1 GB, all held in the server's memory)."""
EVENTS_CHUNK = 50
"""Events read at a time while a page fills: with the largest payloads, what one read holds."""


async def list_events(s: Service, call: Call) -> Response:
    """A page of at most ``limit`` Events, fewer once their payloads reach `PAGE_BYTES`;
    ``next_after`` is the last one's sequence while more follow."""
    limit = query_limit(call.query)
    after = query_int(call.query, "after", 0, 0, MAX_SEQ)
    kind = query_text(call.query, "type")
    events: list[Event] = []
    size = 0
    while True:
        want = min(EVENTS_CHUNK, limit - len(events))
        chunk = await s.rt.events(after_seq=events[-1].seq if events else after, limit=want + 1, type=kind)
        taken = 0
        for event in chunk[:want]:
            events.append(event)
            taken += 1
            size += len(json_bytes(event.payload))
            if size >= PAGE_BYTES:
                break
        more = taken < len(chunk)  # it stopped before the chunk's last Event: more follow
        if not more or size >= PAGE_BYTES or len(events) == limit:
            break
    return json_response({"events": events, "next_after": events[-1].seq if more and events else None})


async def get_event(s: Service, call: Call) -> Response:
    event = await s.rt.event(call.path("event_id"))
    return json_response({"event": event, "checkpoint": await s.rt.checkpoint(event.id)})


# -- work -------------------------------------------------------------------------------------------


async def list_work(s: Service, call: Call) -> Response:
    limit = query_limit(call.query)
    works, next_after = page(
        await s.rt.works(
            scope=query_text(call.query, "scope"),
            state=query_text(call.query, "state"),  # type: ignore[arg-type]  # checked by the runtime
            after_id=query_text(call.query, "after") or "",
            limit=limit + 1,
        ),
        limit,
        lambda w: w.id,
    )
    return json_response({"work": works, "next_after": next_after})


async def work_view(rt: Runtime, work_id: str) -> dict[str, Any]:
    """A Work with everything a person or client needs about it (also behind the web view): its outcome
    (value, or the last error and when the next attempt starts) and its latest diagnostics (why it
    cannot start, its failed attempts) besides its waits, input, timers and history."""
    history = await rt.history(work_id)
    work = history.work
    waits = await rt.waits(work.id)
    pending = [await rt.event(event_id) for event_id in work.pending_inputs[:100]]
    return {
        "work": work,
        "result": await rt.result(work.id),
        "wait": next((w for w in waits if w.id == work.wait_id), None),
        "pending_inputs": pending,
        "waits": waits,
        "timers": await rt.timers(work_id=work.id, limit=1000),
        "diagnostics": await rt.latest_diagnostics(work.id, limit=20),
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
    reason = call.body.get("reason", "operator replay")
    check_reason("reason", reason)  # bad input is named before the Event is looked at
    if call.body.get("request_id") is not None:
        check_text("request_id", call.body["request_id"])
    work = await s.rt.work(call.path("work_id"))
    event_id = call.body["event_id"]
    try:
        event = await s.rt.event(event_id)
    except NotFound as exc:
        raise HTTPError(NOT_FOUND, str(exc), field="event_id") from None
    except InvalidRequest as exc:
        raise HTTPError(BAD_REQUEST, str(exc), field="event_id") from None
    checkpoint = await s.rt.checkpoint(event.id)
    if not (
        event.work_id == work.id
        or (event.key is not None and event.key in work.keys)
        or (checkpoint is not None and checkpoint.work_id == work.id)
    ):
        raise HTTPError(CONFLICT, f"event {event.id} is not an event of work {work.id}", field="event_id")
    replayed = await s.rt.replay(event.id, reason=reason, request_id=call.body.get("request_id"))
    return json_response(replayed)


# -- timers and diagnostics -------------------------------------------------------------------------

TIMER_ID = {**TEXT, "maxLength": MAX_TIMER_ID_LEN}
TIMER_FIELDS = (
    Field("id", "string", required=True, doc="the timer's id (arming it again replaces it)", schema=TIMER_ID),
    Field("fire_at_ms", "integer", required=True, doc="when it fires, Unix milliseconds", schema=TIME),
    Field("source", "string", required=True, schema=TEXT),
    Field(
        "type",
        "string",
        required=True,
        doc="the type of the Event it fires (not core.*)",
        schema=OUTSIDE_CORE,
    ),
    Field("scope", "string", required=True, schema=SCOPE),
    Field("key", "string", nullable=True, schema=KEY),
    Field("work_id", "string", nullable=True, schema=TEXT),
    Field("payload", "object", doc="the Event's payload, a JSON object", schema=JSON_OBJECT),
    Field(
        "delivery_id",
        "string",
        nullable=True,
        doc="the firing's delivery identity (default: the id)",
        schema=TIMER_ID,
    ),
    Field(
        "interval_ms",
        "integer",
        nullable=True,
        doc="recur at this fixed interval (not with recurrence)",
        schema={"minimum": 1, "maximum": MAX_INTERVAL_MS},
    ),
    Field(
        "recurrence",
        "string",
        nullable=True,
        doc="recur by this policy (cron, calendar), which reads and checks spec",
        schema=TEXT,
    ),
    Field(
        "spec",
        "object",
        nullable=True,
        doc="the recurrence policy's spec (with recurrence only)",
        schema=JSON_OBJECT,
    ),
)
TIMER_RULES = {
    "allOf": [
        {  # a fixed interval or a recurrence policy, not both
            "not": {
                "required": ["interval_ms", "recurrence"],
                "properties": {"interval_ms": {"type": "integer"}, "recurrence": {"type": "string"}},
            }
        },
        {  # a spec goes with a recurrence, and a recurrence with a spec
            "if": {"required": ["recurrence"], "properties": {"recurrence": {"type": "string"}}},
            "then": {"required": ["spec"], "properties": {"spec": {"type": "object"}}},
            "else": {"properties": {"spec": {"type": "null"}}},
        },
    ]
}
"""The rules across a timer's fields, for the OpenAPI document (the runtime checks them)."""


def timer_spec(body: dict[str, Any]) -> TimerSpec:
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
    timers, next_after = page(
        await s.rt.timers(
            state=query_text(call.query, "state"),  # type: ignore[arg-type]  # checked by the runtime
            work_id=query_text(call.query, "work"),
            after_id=query_text(call.query, "after") or "",
            limit=limit + 1,
        ),
        limit,
        lambda t: t.id,
    )
    return json_response({"timers": timers, "next_after": next_after})


async def get_timer(s: Service, call: Call) -> Response:
    timer = await s.rt.timer(call.path("timer_id"))
    return json_response({"timer": timer, "firings": await s.rt.firings(timer.id)})


async def arm_timer(s: Service, call: Call) -> Response:
    spec = timer_spec(call.body)
    if isinstance(spec.type, str) and spec.type.startswith(CORE_PREFIX):
        # the runtime's own control timers are armed by the runtime, never over the network
        raise HTTPError(BAD_REQUEST, f"type {spec.type!r} is in the privileged core.* family", field="type")
    return json_response(await s.rt.arm(spec), 201)


async def cancel_timer(s: Service, call: Call) -> Response:
    return json_response(await s.rt.cancel_timer(call.path("timer_id"), revision=call.body["revision"]))


async def list_diagnostics(s: Service, call: Call) -> Response:
    limit = query_limit(call.query)
    diagnostics, next_after = page(
        await s.rt.diagnostics(
            kind=query_text(call.query, "kind"),
            subject=query_text(call.query, "subject"),
            after_id=query_int(call.query, "after", 0, 0, MAX_SEQ),
            limit=limit + 1,
        ),
        limit,
        lambda d: d.id,
    )
    return json_response({"diagnostics": diagnostics, "next_after": next_after})
