"""``loom send`` and ``loom events list|get``: Events on a running server (docs/http-api.md "Events")."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import typer

from ._cli_base import (
    ALL,
    AS_JSON,
    LIMIT,
    MAX_BATCH_BYTES,
    MAX_BODY_BYTES,
    TOKEN_FILE,
    URL,
    RepeatedMember,
    Unreadable,
    UserError,
    client,
    dump,
    group,
    json_object,
    list_command,
    loads,
    read_text,
    show,
    user_errors,
)

events_app = group("List and inspect accepted Events; `loom send` sends one.")


@user_errors
def send(
    type: str | None = typer.Argument(None, help="The Event type, e.g. order.placed."),
    scope: str | None = typer.Option(None, "--scope", help="The scope path it belongs to, e.g. shop."),
    key: str | None = typer.Option(None, "--key", help="The correlation key, e.g. order/42."),
    work: str | None = typer.Option(None, "--work", help="Deliver to this Work id explicitly."),
    payload: str | None = typer.Option(
        None, "--payload", help="A JSON object, @file.json, or @- to read it from stdin."
    ),
    source: str = typer.Option("cli", "--source", help="Who sends it (dedup is per source)."),
    delivery_id: str | None = typer.Option(
        None, "--delivery-id", help="The delivery's id (default: a new one); resend with it to dedup."
    ),
    batch: str | None = typer.Option(
        None,
        "--batch",
        help="Send many Events in one request: a file (or - for stdin) of JSON lines, one Event object"
        " each, as POST /events takes them. Each is accepted or refused on its own.",
    ),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Send an Event to a running server; it is durable once this returns, and the answer says which
    route matched it (waiting a moment for its routing)."""
    api = client(url, token_file)
    if batch is not None:
        if type is not None or scope is not None:
            raise UserError("--batch sends the Events of its file: give no TYPE or --scope with it")
        _send_batch(api, batch, as_json)
        return
    if type is None or scope is None:
        raise UserError("send needs an Event TYPE and --scope (or --batch FILE)")
    if delivery_id == "":  # (not a new one: a resend with it would not be deduplicated)
        raise UserError("--delivery-id is empty: give the delivery's id, or leave it out for a new one")
    body: dict[str, Any] = {
        "source": source,
        "delivery_id": delivery_id if delivery_id is not None else uuid.uuid4().hex,
        "type": type,
        "scope": scope,
        "payload": json_object(payload, "--payload"),
    }
    if key is not None:
        body["key"] = key
    if work is not None:
        body["work_id"] = work
    answer = api.post(f"/events?wait={ROUTE_WAIT_S}", body, max_bytes=MAX_BODY_BYTES, what="the Event")
    if as_json or not isinstance(answer, dict):
        dump(answer)
        return
    typer.echo(_said(answer, body["source"], body["delivery_id"]))
    typer.echo(routing_line(answer.get("routing")))


ROUTE_WAIT_S = 2
"""How long ``loom send`` lets the server wait for its Event's routing checkpoint."""


def routing_line(routing: Any) -> str:
    """Where an accepted Event went, for ``loom send``. An Event routed by no route (it won a wait
    that no route passed it to) is said with the checkpoint's reason, which says so."""
    from ._render import printable as p

    if not isinstance(routing, dict):
        return "routing: unknown"
    status = routing.get("status")
    route = _route(routing)
    by = f" by {route}" if route else ""
    reason = f": {p(routing['reason'])}" if routing.get("reason") else ""
    work = p(routing.get("work_id"))
    if status == "routed":
        return f"routed{by} to work {work}{'' if route else reason}"
    if status == "unmatched":
        return f"matched no route in its scope: nothing will act on it{reason}"
    if status == "drop":
        return f"dropped{by}{reason}"
    if status == "terminal":
        return f"matched {route or 'no route'}, but work {work} has ended{reason}"
    if status == "compacted":
        return "routed long ago: the original Event was removed by compaction"
    if status == "unrouted":
        return f"could not be routed{reason} (loom diagnostics; loom work replay)"
    return "accepted, not routed yet (the router routes it in acceptance order)"


def _route(routing: dict[str, Any]) -> str:
    """``route 'orders' (scope shop)``, or ``""`` when no route took the Event."""
    from ._render import printable as p

    if not routing.get("route"):
        return ""
    scope = f" (scope {p(routing['route_scope'])})" if routing.get("route_scope") else ""
    return f"route '{p(routing['route'])}'{scope}"


def _said(answer: dict[str, Any], source: str, delivery_id: str) -> str:
    from ._render import printable as p
    from ._render import when

    what = "already accepted (a duplicate delivery)" if answer.get("duplicate") else "accepted"
    return (
        f"{what}: event {p(answer.get('id'))} seq {p(answer.get('seq'))} at {when(answer.get('accepted_at_ms'))} "
        f"(source {p(source)}, delivery {p(delivery_id)})"
    )


def _send_batch(api: Any, batch: str, as_json: bool) -> None:
    """Send the Events of a file of JSON lines as one batch, and print each one's outcome in order:
    accepted, a duplicate, or refused. Each is accepted or refused on its own, as ``POST /events``
    answers a batch: a line that is not JSON (or names a member twice) is refused by its line number,
    as the server refuses such a line of JSON lines, and the other lines are still sent. Exit status
    1 when any was refused."""
    text = read_text(batch, "--batch")
    slots: list[dict[str, Any] | None] = []  # per Event in order: its refusal here, or None (sent)
    items: list[Any] = []
    # lines end at "\n" alone, as the server reads JSON lines: `str.splitlines` would also end one at a
    # U+2028, U+0085 or form feed inside a JSON string, cutting a valid Event in two
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            items.append(loads(line))
            slots.append(None)
        except RepeatedMember as exc:
            slots.append(_refused(f"line {number}: {exc}"))
        except Unreadable as exc:
            slots.append(_refused(f"line {number} {exc}"))
        except ValueError as exc:
            slots.append(_refused(f"line {number} is not valid JSON: {exc}"))
    if not slots:
        raise UserError("--batch holds no Events")
    what = f"--batch ({len(items)} Event{'s' if len(items) != 1 else ''})"
    answer = api.post("/events", items, max_bytes=MAX_BATCH_BYTES, what=what) if items else {"results": []}
    if not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
        dump(answer)
        return
    sent = iter(answer["results"])
    results = [slot if slot is not None else next(sent, _refused("the server answered nothing for it"))
               for slot in slots]  # fmt: skip
    refused = sum(1 for result in results if "event" not in result)
    if as_json:
        duplicates = sum(1 for result in results if "event" in result and result.get("status") == 200)
        counts = {"accepted": len(results) - refused - duplicates, "duplicates": duplicates}
        dump({"results": results, **counts, "refused": refused})
    else:
        for number, result in enumerate(results, 1):
            typer.echo(f"{number}: " + _outcome(result))
    if refused:
        raise typer.Exit(1)


def _outcome(result: dict[str, Any]) -> str:
    """One batch item's outcome: accepted (or a duplicate), or refused with the field and why."""
    from ._render import printable as p

    if "event" in result:
        event = result["event"]
        return _said(event, event.get("source"), event.get("delivery_id"))
    error = result.get("error") or {}
    field = f" ({p(error.get('field'))})" if error.get("field") else ""
    return f"refused{field}: {p(error.get('message'))}"


def _refused(message: str) -> dict[str, Any]:
    """A batch item refused before it was sent, answered as the server answers a refused item."""
    return {"status": 400, "error": {"error": "invalid_request", "field": None, "message": message}}


def _events_table(items: list[Any]) -> str:
    from ._render import humanize_rows, table

    columns = [("seq", "seq"), ("id", "id"), ("type", "type"), ("scope", "scope"), ("key", "key")]
    columns += [("work", "work_id"), ("accepted", "accepted_at")]
    return table(humanize_rows(items), columns)


@events_app.command("list")
@user_errors
def events_list(
    type: str | None = typer.Option(None, "--type", help="Only Events of this type."),
    after: int | None = typer.Option(None, "--after", help="Only Events after this sequence."),
    limit: int = LIMIT,
    every: bool = ALL,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List accepted Events in sequence order."""
    list_command(
        client(url, token_file),
        "/events",
        {"type": type, "after": after},
        "events",
        limit=limit,
        every=every,
        as_json=as_json,
        render=_events_table,
        empty="no events",
    )


@events_app.command("get")
@user_errors
def events_get(
    event_id: str = typer.Argument(..., help="The Event's id."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Show one Event, its payload, and where it was routed."""
    show(client(url, token_file).get(f"/events/{quote(event_id, safe='')}"), as_json)


def register(app: typer.Typer) -> None:
    app.command()(send)
    app.add_typer(events_app, name="events")
    events_app.command("send")(send)
