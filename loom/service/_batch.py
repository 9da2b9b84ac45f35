"""Batch ingestion: ``POST /events`` with a JSON array, or JSON lines (``application/x-ndjson``), of
Events, accepted in order with one commit; each item is checked, deduplicated and answered on its own
(docs/http-api.md "Events").

One Event per request costs a whole HTTP exchange for one small row; a batch carries up to
`MAX_BATCH` of them in one request and one storage commit (`Runtime.publish_many`), so a sender that
has many Events at hand is limited by the store, not by the HTTP stack (bench/http.py).
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from ..records.errors import LoomError
from ..runtime import MAX_BATCH
from ._handlers import EVENT_FIELDS, event_in
from ._ops import NDJSON, Call, Service
from ._results import routing_of, routing_wait
from ._wire import (
    BAD_REQUEST,
    HTTPError,
    classify,
    error_body,
    json_response,
    parse_fields,
    parse_json,
    to_data,
)

MAX_BATCH_BYTES = 16 * 1024 * 1024
"""The largest batch body (a single Event's body is at most `MAX_BODY_BYTES`)."""
NDJSON_TYPES = NDJSON
PREFIXES = ("event.",)


def is_ndjson(content_type: str | None) -> bool:
    return (content_type or "").partition(";")[0].strip().lower() in NDJSON_TYPES


def batch_items(raw: bytes, content_type: str | None) -> list[tuple[str, Any]] | None:
    """The items of a batch body, each named as a refusal names it (``line N`` of JSON lines, blank
    lines counted; ``item N`` of an array) with its decoded JSON value, or the `HTTPError` of a JSON
    line that does not parse (that item alone is refused). ``None``: the body is one Event, not a
    batch."""
    items: list[tuple[str, Any]]
    if is_ndjson(content_type):
        items = []
        for number, line in enumerate(raw.split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                items.append((f"line {number}", parse_json(line)))
            except HTTPError as exc:
                items.append(("", HTTPError(BAD_REQUEST, f"line {number}: {exc.message}", field=exc.field)))
    elif raw.lstrip()[:1] == b"[":
        array = parse_json(raw)
        if not isinstance(array, list):  # pragma: no cover - a body starting with [ decodes to a list
            raise HTTPError(BAD_REQUEST, "the body must be an Event object or an array of them")
        items = [(f"item {number}", value) for number, value in enumerate(array, 1)]
    else:
        return None
    if not items:
        raise HTTPError(BAD_REQUEST, "the batch holds no Events")
    if len(items) > MAX_BATCH:
        raise HTTPError(BAD_REQUEST, f"the batch holds {len(items)} Events; at most {MAX_BATCH} at once")
    return items


def _refusal(exc: BaseException) -> dict[str, Any]:
    kind, field = classify(exc, PREFIXES)
    message = exc.message if isinstance(exc, HTTPError) else str(exc)
    return {"status": kind.status, "error": error_body(kind, message, field)}


async def post_events(s: Service, items: list[tuple[str, Any]]) -> Response:
    """Accept a batch: ``200`` with ``results``, one per item in order (``{status, event}`` for an
    Event accepted (201) or a duplicate (200), ``{status, error}`` for a refusal), and the counts."""
    results: list[dict[str, Any] | None] = []
    events = []
    for name, item in items:
        try:
            if isinstance(item, HTTPError):
                raise item
            events.append(event_in(parse_fields(item, EVENT_FIELDS, name)))
            results.append(None)
        except HTTPError as exc:
            results.append(_refusal(exc))
    answers = iter(await s.rt.publish_many(events) if events else [])
    for index, result in enumerate(results):
        if result is None:
            answer = next(answers)
            if isinstance(answer, LoomError):
                results[index] = _refusal(answer)
            else:
                results[index] = {"status": 200 if answer.duplicate else 201, "event": to_data(answer)}
    done = [r for r in results if r is not None]
    counts = {status: sum(1 for r in done if r["status"] == status) for status in (201, 200)}
    return json_response(
        {
            "results": done,
            "accepted": counts[201],
            "duplicates": counts[200],
            "refused": len(done) - counts[201] - counts[200],
        }
    )


async def post_event(s: Service, call: Call) -> Response:
    """``POST /events``: one Event (``201``, or ``200`` for a duplicate), or a batch (`post_events`)."""
    wait = routing_wait(call)  # (a bad one is refused before anything is published)
    if call.items is not None:
        return await post_events(s, call.items)
    event, checkpoint = await s.rt.publish_routed(event_in(call.body))
    answer = to_data(event)
    # where it went: known from its acceptance commit when that routed it, else read (?wait= for it)
    answer["routing"] = await routing_of(s, wait, event, checkpoint)
    return json_response(answer, 200 if event.duplicate else 201)
