"""``loom timers ...``, ``loom diagnostics``, ``loom watch``, ``loom health``, ``loom metrics`` and
``loom clock``: the rest of the operations of docs/http-api.md on a running server."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
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
    UserError,
    client,
    dump,
    json_object,
    list_command,
    show,
    user_errors,
)

timers_app = typer.Typer(
    help="List, inspect, arm and cancel durable timers (`loom timers` alone lists them).",
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    invoke_without_command=True,
)


def _timers_table(items: list[Any]) -> str:
    from ._render import humanize_rows, table

    columns = [("id", "id"), ("state", "state"), ("fires", "fire_at"), ("type", "type"), ("scope", "scope")]
    columns += [("key", "key"), ("rev", "revision")]
    return table(humanize_rows(items), columns)


@timers_app.callback()
def timers(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        timers_list(
            state=None, work=None, after=None, limit=100, every=False, url=_env_url(), token_file=_env_token(),
            as_json=False,
        )  # fmt: skip


def _env_url() -> str:
    import os

    from ._cli_base import DEFAULT_URL

    return os.environ.get("LOOM_URL") or DEFAULT_URL


def _env_token() -> Path | None:
    import os

    given = os.environ.get("LOOM_API_TOKEN_FILE")
    return Path(given) if given else None


@timers_app.command("list")
@user_errors
def timers_list(
    state: str | None = typer.Option(None, "--state", help="armed, fired, cancelled, disabled, invalid."),
    work: str | None = typer.Option(None, "--work", help="Only the timers of this Work."),
    after: str | None = typer.Option(None, "--after", help="Only timers whose id sorts after this."),
    limit: int = LIMIT,
    every: bool = ALL,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List durable timers, by id, and when they fire."""
    list_command(
        client(url, token_file),
        "/timers",
        {"state": state, "work": work, "after": after},
        "timers",
        limit=limit,
        every=every,
        as_json=as_json,
        render=_timers_table,
        empty="no timers",
    )


def _timer_path(timer_id: str, action: str = "") -> str:
    return f"/timers/{quote(timer_id, safe='')}" + (f"/{action}" if action else "")


@timers_app.command("get")
@user_errors
def timers_get(
    timer_id: str = typer.Argument(..., help="The timer's id."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Show one timer and its firing ledger."""
    show(client(url, token_file).get(_timer_path(timer_id)), as_json)


@timers_app.command("cancel")
@user_errors
def timers_cancel(
    timer_id: str = typer.Argument(..., help="The timer's id."),
    revision: int | None = typer.Option(
        None, "--revision", help="Cancel only at this revision (default: the one it has now)."
    ),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Cancel a timer (at its revision: a timer re-armed since is refused, not cancelled)."""
    api = client(url, token_file)
    if revision is None:
        revision = int(api.get(_timer_path(timer_id))["timer"]["revision"])
    answer = api.post(_timer_path(timer_id, "cancel"), {"revision": revision})
    if as_json or not isinstance(answer, dict):
        dump(answer)
    else:
        from ._render import printable as p

        typer.echo(
            f"cancel: timer {p(timer_id)} is {p(answer.get('state'))} (revision {p(answer.get('revision'))})"
        )


_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)\Z")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(text: str, option: str) -> int:
    """``90s``, ``5m``, ``2h``, ``1d``, ``250ms`` as milliseconds."""
    found = _DURATION.match(text.strip())
    if found is None:
        raise UserError(f"{option} must be a duration such as 250ms, 90s, 5m, 2h or 1d, got {text!r}")
    return int(found.group(1)) * _UNIT_MS[found.group(2)]


def instant_ms(text: str, option: str, now_ms: Any) -> int:
    """``+5m`` (from the server's now), an ISO 8601 time (local time when it names no offset), or
    Unix milliseconds."""
    text = text.strip()
    if text.startswith("+"):
        return int(now_ms()) + duration_ms(text[1:], option)
    if text.isascii() and text.isdigit():
        return int(text)
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone().timestamp() * 1000)
    except (ValueError, OverflowError):  # not a time, or one out of the range of a timestamp
        raise UserError(
            f"{option} must be +DURATION (+5m), an ISO 8601 time or Unix milliseconds, got {text!r}"
        ) from None


@timers_app.command("arm")
@user_errors
def timers_arm(
    timer_id: str = typer.Argument(..., help="The timer's id (arming it again replaces it)."),
    at: str = typer.Option(..., "--at", help="When it fires: +5m, an ISO 8601 time, or Unix ms."),
    type: str = typer.Option(..., "--type", help="The type of the Event it fires."),
    scope: str = typer.Option(..., "--scope", help="The scope of the Event it fires."),
    key: str | None = typer.Option(None, "--key", help="The Event's correlation key."),
    work: str | None = typer.Option(None, "--work", help="The Work the Event goes to."),
    payload: str | None = typer.Option(None, "--payload", help="A JSON object, @file.json or @-."),
    source: str = typer.Option("cli", "--source", help="The Event's source."),
    every: str | None = typer.Option(None, "--every", help="Recur at this interval: 90s, 5m, 1h, ..."),
    recurrence: str | None = typer.Option(None, "--recurrence", help="Recur by this policy: cron, calendar."),
    spec: str | None = typer.Option(None, "--spec", help="The recurrence policy's spec: JSON, @file or @-."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Arm a root timer: it fires an Event at its time (and again at each recurrence)."""
    api = client(url, token_file)
    body: dict[str, Any] = {
        "id": timer_id,
        "fire_at_ms": instant_ms(at, "--at", lambda: api.get("/healthz")["now_ms"]),
        "source": source,
        "type": type,
        "scope": scope,
        "payload": json_object(payload, "--payload"),
    }
    optional = {"key": key, "work_id": work, "recurrence": recurrence}
    body |= {name: value for name, value in optional.items() if value is not None}
    if every is not None:
        body["interval_ms"] = duration_ms(every, "--every")
    if spec is not None:
        body["spec"] = json_object(spec, "--spec")
    answer = api.post("/timers", body)
    if as_json or not isinstance(answer, dict):
        dump(answer)
        return
    from ._render import printable as p
    from ._render import when

    typer.echo(
        f"armed: timer {p(answer.get('id'))} fires {when(answer.get('fire_at_ms'))} (revision {p(answer.get('revision'))})"
    )


@user_errors
def diagnostics(
    kind: str | None = typer.Option(None, "--kind", help="Only this kind, e.g. executor_failed."),
    subject: str | None = typer.Option(None, "--subject", help="Only about this subject (an id)."),
    after: int | None = typer.Option(None, "--after", help="Only those recorded after this id."),
    limit: int = LIMIT,
    every: bool = ALL,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List what went wrong, and with which subject (never a payload), oldest first."""

    def render(items: list[Any]) -> str:
        from ._render import printable as p
        from ._render import when

        return "\n".join(
            f"{when(d.get('at_ms'))}  #{p(d.get('id'))}  {p(d.get('kind'))}  {p(d.get('subject'))}: {p(d.get('message'))}"
            for d in items
        )

    list_command(
        client(url, token_file),
        "/diagnostics",
        {"kind": kind, "subject": subject, "after": after},
        "diagnostics",
        limit=limit,
        every=every,
        as_json=as_json,
        render=render,
        empty="no diagnostics",
    )


@user_errors
def watch(
    scope: str | None = typer.Option(None, "--scope", help="Only Work in this scope (and below it)."),
    work: str | None = typer.Option(None, "--work", help="Only this Work."),
    count: int | None = typer.Option(None, "--count", min=1, help="Stop after this many changes."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = typer.Option(False, "--json", help="One JSON object a line (the Work as it is now)."),
) -> None:
    """Follow Work changes as they commit (GET /watch, server-sent events) until interrupted, or until
    --count changes. A stream the server ends first (it stopped, or was killed) says so on stderr and
    exits with status 1."""
    api = client(url, token_file)
    seen = 0
    for kind, item in _server_events(api.stream("/watch", {"scope": scope, "work": work})):
        typer.echo(
            json.dumps(item, sort_keys=True, ensure_ascii=False) if as_json else _watch_line(kind, item)
        )
        seen += isinstance(item, dict) and "work" in item
        if count is not None and seen >= count:
            return
    # nobody asked for this end: a watch that ended quietly (exit status 0) would look, to a person or
    # a script, like one that saw every change there was, when the server went away
    left = f" after {seen} of the {count} changes asked for" if count is not None else ""
    raise UserError(f"the loom server at {api.url} closed the stream{left}")


def _server_events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """The ``(event kind, decoded data)`` of each server-sent event of a stream's lines; comments (the
    keep-alives) skipped."""
    kind, data = "message", []
    for line in lines:
        if line.startswith(":"):
            continue  # a keep-alive comment
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield kind, json.loads("\n".join(data))
            kind, data = "message", []


def _watch_line(kind: str, item: Any) -> str:
    """One server-sent event of ``loom watch`` for a person: a Work change, or what the server says."""
    from ._render import printable as p
    from ._render import when

    if not isinstance(item, dict):
        return f"{p(kind)}: {p(item)}"
    if "work" not in item:
        return f"{p(kind)}: {p(item.get('message', ''))}"
    w = item["work"] if isinstance(item["work"], dict) else {}
    held = f" held: {p(w.get('hold_reason'))}" if w.get("held") else ""
    keys = ", ".join(p(key) for key in w.get("keys") or [])
    return (
        f"{when(item.get('at_ms'))}  {p(w.get('id'))}  {p(w.get('state'))}{held}  {p(w.get('scope'))}  {keys}"
    )


@user_errors
def health(url: str = URL, as_json: bool = AS_JSON) -> None:
    """Ask whether the server's store answers reads and commits writes (exit status 1 if not)."""
    show(client(url, None).get("/healthz"), as_json)


@user_errors
def metrics(url: str = URL, token_file: Path | None = TOKEN_FILE) -> None:
    """Print the server's Prometheus metrics."""
    from ._render import printable

    # the exposition format's lines stay lines; any other control character a label value holds is
    # shown escaped, as every string from the server is
    typer.echo(printable(client(url, token_file).text("/metrics"), keep="\n"), nl=False)


@user_errors
def clock(
    advance: str | None = typer.Option(None, "--advance", help="Move the test clock on by 90s, 5m, ..."),
    to: str | None = typer.Option(None, "--to", help="Move the test clock to this time (ISO 8601 or ms)."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Show or move the business clock of a server started with --test-clock."""
    api = client(url, token_file)
    if advance is not None and to is not None:
        raise UserError("give --advance or --to, not both")
    if advance is not None:
        answer = api.post("/debug/clock", {"advance_ms": duration_ms(advance, "--advance")})
    elif to is not None:
        answer = api.post("/debug/clock", {"now_ms": instant_ms(to, "--to", lambda: 0)})
    else:
        answer = api.get("/debug/clock")
    show(answer, as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(timers_app, name="timers")
    for command in (diagnostics, watch, health, metrics, clock):
        app.command()(command)
