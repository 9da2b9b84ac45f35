"""The API's routes for what became of Work: its result (with a bounded long-poll), an attempt's logs,
and where an accepted Event was routed (docs/http-api.md, "Results").

A long-poll waits on the commits that change the Work (`Runtime.wait_for`), never in a polling loop,
and ends early when the server stops, so a stop never waits for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio
from starlette.responses import Response

from ..records.errors import WaitTimedOut
from ..records.events import Event
from ..records.executor import AttemptLogs
from ..records.results import WorkResult
from ..records.validation import MAX_INT
from ..records.work import Checkpoint
from . import _schemas as S
from ._ops import Call, Op, Query, Service
from ._wire import NOT_FOUND, json_response, query_int, query_text

MAX_WAIT_S = 60
"""The longest a request may wait for a result or a routing checkpoint (``?wait=``)."""
MAX_LOG_BYTES = 1_048_576
"""The most of each log an answer carries (its end: ``?tail=`` bytes)."""
DEFAULT_LOG_BYTES = 65_536

T = TypeVar("T")


async def _unless_stopping(s: Service, wait: Callable[[], Awaitable[T]]) -> T | None:
    """``wait()``, or ``None`` once the server is stopping (a stop never waits for a long-poll)."""
    if s.stopping is None:
        return await wait()
    result: list[T] = []
    failed: list[Exception] = []
    async with trio.open_nursery() as nursery:

        async def waiting() -> None:
            try:
                result.append(await wait())
            except Exception as exc:  # raised as itself below, not wrapped in the nursery's group
                failed.append(exc)
            nursery.cancel_scope.cancel()

        async def stopping() -> None:
            assert s.stopping is not None
            await s.stopping.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(waiting)
        nursery.start_soon(stopping)
    if failed:
        raise failed[0]
    return result[0] if result else None


async def get_result(s: Service, call: Call) -> Response:
    work_id = call.path("work_id")
    wait = query_int(call.query, "wait", 0, 0, MAX_WAIT_S)
    if wait == 0:
        return json_response(await s.rt.result(work_id))

    async def settled() -> Any:
        try:
            return await s.rt.wait_for(work_id, timeout=wait)
        except WaitTimedOut as exc:
            return exc.result

    answer = await _unless_stopping(s, settled)
    return json_response(answer if answer is not None else await s.rt.result(work_id))


async def get_logs(s: Service, call: Call) -> Response:
    attempt = query_int({"attempt": call.path("attempt")}, "attempt", 1, 1, MAX_INT)
    logs = await s.rt.attempt_logs(
        call.path("work_id"),
        attempt,
        stream=query_text(call.query, "stream"),
        tail=query_int(call.query, "tail", DEFAULT_LOG_BYTES, 1, MAX_LOG_BYTES),
    )
    return json_response(logs)


def routing(event: Event, checkpoint: Checkpoint | None) -> dict[str, Any]:
    """Where an accepted Event went, for the answer to ``POST /events``: its checkpoint's status (``routed``,
    ``unmatched``, ``drop``, ``terminal``, ``unrouted``), the route and its scope, the Work; or
    ``pending``: accepted and not routed yet."""
    if checkpoint is None:
        return {"status": "pending", "route": None, "route_scope": None, "work_id": None, "reason": None}
    return {
        "status": checkpoint.status.value,
        "route": checkpoint.route,
        "route_scope": checkpoint.route_scope,
        "work_id": checkpoint.work_id,
        "reason": checkpoint.reason,
    }


def routing_wait(call: Call) -> int:
    """``?wait=`` of a ``POST /events``: read (and a bad one refused) before anything is published."""
    return query_int(call.query, "wait", 0, 0, MAX_WAIT_S)


async def routing_of(
    s: Service, wait: int, event: Event, checkpoint: Checkpoint | None = None
) -> dict[str, Any]:
    """The routing of the Event just accepted: ``checkpoint`` when its acceptance commit wrote one (no
    read: most Events on a database alone), else its checkpoint read, waiting up to ``wait`` seconds
    for it (by default not at all: a duplicate delivery's is known already). Without a wait it is read
    once, in the request's own task (a duplicate's checkpoint is one query)."""
    if event.compacted:  # the original and its checkpoint were removed: only its identity is kept
        return {
            "status": "compacted",
            "route": None,
            "route_scope": None,
            "work_id": None,
            "reason": "the original Event was removed by compaction; where it went is no longer kept",
        }
    if checkpoint is not None:
        return routing(event, checkpoint)
    if wait == 0:
        return routing(event, await s.rt.checkpoint(event.id))
    found = await _unless_stopping(s, lambda: s.rt.wait_routed(event.id, timeout=wait))
    return routing(event, found)


WAIT = Query(
    name="wait",
    kind="integer",
    doc=f"seconds to wait until the outcome is settled, 0 to {MAX_WAIT_S} (default 0: answer at once)",
    schema={"minimum": 0, "maximum": MAX_WAIT_S},
)
EVENT_WAIT = Query(
    name="wait",
    kind="integer",
    doc=f"seconds to wait for the Event's routing checkpoint, 0 to {MAX_WAIT_S} (default 0)",
    schema={"minimum": 0, "maximum": MAX_WAIT_S},
)

ROUTING = S.obj(
    status={"type": "string", "enum": ["routed", "unmatched", "drop", "terminal", "unrouted", "pending"]},
    route=S.nullable(S.STRING),
    route_scope=S.nullable(S.STRING),
    work_id=S.nullable(S.STRING),
    reason=S.nullable(S.STRING),
)
"""Where an accepted Event went (`routing`)."""


def _routed_event() -> dict[str, Any]:
    """An Event as ``POST /events`` answers one: the record, and ``routing``."""
    answers = S.Answers()
    answers.record(Event)
    event = answers.components["Event"]
    return {
        **event,
        "properties": {**event["properties"], "routing": ROUTING},
        "required": [*event["required"], "routing"],
    }


ROUTED_OR_BATCH = {"anyOf": [_routed_event(), S.BATCH]}

OPS: tuple[Op, ...] = (
    Op(method="GET", path="/work/{work_id:path}/result", handler=get_result,
       summary="The Work's outcome: state, value or error, attempts (long-poll with ?wait=)", tag="work",
       query=(WAIT,), answer=S.ref(WorkResult), errors=(NOT_FOUND,)),
    Op(method="GET", path="/work/{work_id:path}/attempts/{attempt}/logs", handler=get_logs,
       summary="An attempt's stdout and stderr (their ends)", tag="work",
       path_schemas={"attempt": {"type": "integer", "minimum": 1, "maximum": MAX_INT}},
       answer=S.ref(AttemptLogs),
       query=(
           Query(name="stream", kind="string", doc="only this one", choices=("stdout", "stderr")),
           Query(name="tail", kind="integer",
                 doc=f"bytes of the end of each, 1 to {MAX_LOG_BYTES} (default {DEFAULT_LOG_BYTES})",
                 schema={"minimum": 1, "maximum": MAX_LOG_BYTES}),
       ), errors=(NOT_FOUND,)),
)  # fmt: skip
