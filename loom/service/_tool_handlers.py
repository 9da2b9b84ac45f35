"""The API's handlers for the execution toolbelt (bearer token), health, metrics and the test clock
(docs/http-api.md)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..records.clock import ManualClock
from ..records.validation import MAX_TIME_MS
from ..records.waits import WaitSpec
from ..records.work import Completed, Failed, Handoff, Lease, Outcome
from ._handlers import event_in, timer_spec
from ._metrics import CONTENT_TYPE
from ._ops import Call, Service
from ._wire import (
    BAD_REQUEST,
    CONFLICT,
    TIME,
    Field,
    HTTPError,
    iso,
    json_response,
)
from ._wire import INTERNAL as INTERNAL

# -- the execution toolbelt (bearer token) ----------------------------------------------------------


def _lease(call: Call) -> Lease:
    assert call.lease is not None
    return call.lease


async def tool_emit(s: Service, call: Call) -> Response:
    body = dict(call.body)
    cause_id = body.pop("cause_id", None)
    event = await s.rt.toolbelt(_lease(call)).emit(event_in(body), cause_id=cause_id)
    return json_response(event, 200 if event.duplicate else 201)


async def tool_child(s: Service, call: Call) -> Response:
    work = await s.rt.toolbelt(_lease(call)).create_child(
        call.body["name"], keys=call.body.get("keys", []), kind=call.body.get("kind")
    )
    return json_response(work)


async def tool_timer(s: Service, call: Call) -> Response:
    return json_response(await s.rt.toolbelt(_lease(call)).arm_timer(timer_spec(call.body)))


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


OUTCOMES = ("completed", "handoff", "failed")


def _outcome(body: dict[str, Any]) -> Outcome:
    kind = body["outcome"]
    if kind not in OUTCOMES:  # first: the other fields are judged by it
        raise HTTPError(
            BAD_REQUEST, f"outcome must be one of {', '.join(OUTCOMES)}, got {kind[:40]!r}", field="outcome"
        )
    consumed = tuple(body.get("consumed_inputs", ()))
    usage = body.get("usage", {})
    failure_fields = [
        name for name in ("error", "retry_after_ms", "rate_limited", "retryable") if name in body
    ]
    if "value" in body and kind != "completed":
        raise HTTPError(BAD_REQUEST, f"value belongs to a completed outcome, not {kind!r}", field="value")
    if kind == "failed":
        if "error" not in body:
            raise HTTPError(BAD_REQUEST, "error is required for a failed outcome", field="error")
        return Failed(
            error=body["error"],
            retry_after_ms=body.get("retry_after_ms"),
            rate_limited=body.get("rate_limited", False),
            retryable=body.get("retryable", True),
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
        return Completed(consumed_inputs=consumed, usage=usage, value=body.get("value"))
    return Handoff(consumed_inputs=consumed, usage=usage)


async def tool_complete(s: Service, call: Call) -> Response:
    return json_response(await s.rt.complete(_lease(call), _outcome(call.body)))


# -- the service ------------------------------------------------------------------------------------


async def healthz(s: Service, call: Call) -> Response:
    # the store answers a read and commits a write (the time floor, which only ever moves up): a
    # store that is corrupt, full, deleted or closed answers 503 here as every write would
    await s.rt.events(limit=1)
    await s.rt.mark_time()
    now = s.rt.clock.now_ms()
    return json_response({"status": "ok", "now_ms": now, "now": iso(now), "test_clock": s.clock is not None})


async def metrics(s: Service, call: Call) -> Response:
    s.metrics.set_gauges(await s.rt.gauges(), s.rt.clock.now_ms())
    await s.metrics.read_sizes(s.rt)
    return Response(s.metrics.render(), media_type=CONTENT_TYPE)


CLOCK_FIELDS = (
    Field(
        "advance_ms",
        "integer",
        doc="move the clock forward by this many milliseconds (>= 0)",
        schema={"minimum": 0, "maximum": MAX_TIME_MS},
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
            raise HTTPError(  # well formed, but too far from where the clock is
                CONFLICT if 0 <= step <= MAX_TIME_MS else BAD_REQUEST,
                f"advance_ms must be from 0 to {MAX_TIME_MS - now}, got {step}",
                field="advance_ms",
            )
        target = now + step
    else:
        target = call.body["now_ms"]
        if not now <= target <= MAX_TIME_MS:
            why = "time never moves backwards" if target < now else "no later time is kept (the year 9999)"
            raise HTTPError(  # well formed, but behind where the clock is (or past the last instant)
                CONFLICT if 0 <= target <= MAX_TIME_MS else BAD_REQUEST,
                f"now_ms must be from the clock's time {now} to {MAX_TIME_MS}: {why}, got {target}",
                field="now_ms",
            )
    clock.set(target)
    # recorded before the answer: a restart starts the clock here, never earlier
    floor = await s.rt.mark_time()
    return _clock_answer(clock, floor)
