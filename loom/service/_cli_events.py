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
    TOKEN_FILE,
    URL,
    RepeatedMember,
    UserError,
    client,
    dump,
    group,
    json_object,
    list_command,
    loads,
    read_argument,
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
    body: dict[str, Any] = {
        "source": source,
        "delivery_id": delivery_id or uuid.uuid4().hex,
        "type": type,
        "scope": scope,
        "payload": json_object(payload, "--payload"),
    }
    if key is not None:
        body["key"] = key
    if work is not None:
        body["work_id"] = work
    answer = api.post(f"/events?wait={ROUTE_WAIT_S}", body)
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
    from ._render import printable as p

    text = read_argument("@-" if batch == "-" else f"@{batch}", "--batch")
    items: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            items.append(loads(line))
        except RepeatedMember as exc:
            raise UserError(f"--batch line {number}: {exc}") from None
        except (ValueError, RecursionError) as exc:
            raise UserError(f"--batch line {number} is not JSON: {exc}") from None
    if not items:
        raise UserError("--batch holds no Events")
    answer = api.post("/events", items)
    if as_json or not isinstance(answer, dict):
        dump(answer)
        return
    refused = 0
    for number, result in enumerate(answer.get("results") or [], 1):
        if "event" in result:
            event = result["event"]
            typer.echo(f"{number}: " + _said(event, event.get("source"), event.get("delivery_id")))
        else:
            refused += 1
            error = result.get("error") or {}
            field = f" ({p(error.get('field'))})" if error.get("field") else ""
            typer.echo(f"{number}: refused{field}: {p(error.get('message'))}")
    if refused:
        raise typer.Exit(1)


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
