"""The ``loom`` command line (typer): ``serve``, ``demo``, and commands that talk to a running server
over its HTTP API (``send``, ``work ...``, ``timers``, ``diagnostics``).

A user error (an unreachable server, an unknown Work, a bad config or path) prints one line to stderr
and exits with status 1; never a traceback.
"""

from __future__ import annotations

import enum
import functools
import importlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar
from urllib.parse import quote

import trio
import typer

from .. import __version__
from ..records.errors import LoomError
from ..store import check_location
from ._client import DEFAULT_URL, Client, UserError
from ._demo import run_demo
from ._render import block, humanize, items_of, table, work_view
from ._token import read_token_file

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="loom: a durable coordination runtime. Start with `loom demo`.",
)
work_app = typer.Typer(no_args_is_help=True, help="List, inspect and control Work on a running server.")
app.add_typer(work_app, name="work")

P = ParamSpec("P")
R = TypeVar("R")

URL = typer.Option(DEFAULT_URL, "--url", envvar="LOOM_URL", help="The running server's address.")
AS_JSON = typer.Option(False, "--json", help="Print the server's JSON answer as it is.")
TOKEN_FILE = typer.Option(
    None,
    "--token-file",
    envvar="LOOM_API_TOKEN_FILE",
    help="A file holding the server's operator token (when it requires one).",
)


def _client(url: str, token_file: Path | None) -> Client:
    return Client(url, token=read_token_file(token_file) if token_file is not None else None)


def fail(message: str) -> typer.Exit:
    typer.echo(f"loom: {message}", err=True)
    return typer.Exit(1)


def user_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn every error a user can cause into one line on stderr and exit status 1."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (UserError, LoomError) as exc:
            raise fail(str(exc)) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

    return run


def _version(value: bool) -> None:
    if value:
        typer.echo(f"loom {__version__}")
        raise typer.Exit()


@app.callback()
def cli(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print loom's version and exit."
    ),
) -> None:
    """loom: a durable coordination runtime."""


def _show(answer: Any, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(answer, indent=2, sort_keys=True))
    elif isinstance(answer, dict):
        typer.echo(block(humanize(answer)))
    else:
        typer.echo(json.dumps(humanize(answer), indent=2, sort_keys=True))


# -- serve and demo -----------------------------------------------------------------------------------


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8440`` for IPv6), or `UserError` saying what is expected."""
    host, sep, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"--listen must be HOST:PORT such as 127.0.0.1:8440, got {listen!r}")
    return host, int(port)


@app.command()
@user_errors
def serve(
    db: str = typer.Option(
        "loom.db",
        "--db",
        help="The SQLite file (created if missing), or the postgresql:// URL of a PostgreSQL database"
        " that several loom serve nodes may share.",
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        help="A loom.toml configuration file (default: $LOOM_CONFIG, else ./loom.toml if there is one).",
    ),
    app_spec: str | None = typer.Option(
        None,
        "--app",
        envvar="LOOM_APP",
        help="module:object, a loom.App whose functions and executors this server runs (imported from"
        ' the working directory), e.g. tasks:app. Default: the configuration\'s app = "module:object".',
    ),
    listen: str = typer.Option("127.0.0.1:8440", "--listen", help="HOST:PORT to serve HTTP on."),
    test_clock: bool = typer.Option(
        False,
        "--test-clock",
        help="Business time that tests move with POST /debug/clock (never in production).",
    ),
    log_level: LogLevel = typer.Option(LogLevel.INFO, "--log-level", case_sensitive=False),
    allow_host: list[str] = typer.Option(
        [],
        "--allow-host",
        help="Also serve requests whose Host header names this host (repeat it for more; '*': any host)."
        " The loopback names are always served; off loopback also the listen address and host name.",
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        envvar="LOOM_API_TOKEN_FILE",
        help="A file holding the operator token every route but /healthz, /openapi.json and the"
        " toolbelt then requires (Authorization: Bearer). Required when --listen is not loopback.",
    ),
    read_timeout: float = typer.Option(
        30.0,
        "--read-timeout",
        help="Seconds a client may send nothing while its request is due before it is cut off.",
    ),
    node: str | None = typer.Option(
        None,
        "--node",
        envvar="LOOM_NODE",
        help="This server's node name on a shared PostgreSQL database (one live process per name):"
        " restarted under it, the server recovers its killed predecessor's attempts at once.",
    ),
) -> None:
    """Run loom as a service: the HTTP API, operator controls and web view, on one SQLite file or on a
    PostgreSQL database shared with other nodes."""
    parse_listen(listen)
    if config is not None and not config.is_file():
        raise UserError(f"{config}: no such configuration file")
    try:
        check_location(db)  # a malformed URL or a missing directory is refused here, naming what is wrong
    except LoomError as exc:
        raise UserError(f"--db: {exc}") from None
    try:
        server = importlib.import_module(f"{__package__}.serve")
    except ImportError as exc:
        raise UserError(f"the HTTP server is not available: {exc}") from None
    trio.run(
        functools.partial(
            server.serve,
            db=db,
            config_path=str(config) if config is not None else None,
            listen=listen,
            test_clock=test_clock,
            log_level=log_level.value,
            allow_hosts=tuple(allow_host),
            token_file=str(token_file) if token_file is not None else None,
            read_timeout=read_timeout,
            app=app_spec,
            node=node,
        )
    )


@app.command()
@user_errors
def demo(
    db: Path | None = typer.Option(
        None, "--db", help="Where to create the demo's SQLite file (default: a fresh temporary one)."
    ),
) -> None:
    """A short tour on a fresh SQLite file: routing, executions, waits, recovery and a cron schedule."""
    run_demo(db)


# -- talking to a running server ----------------------------------------------------------------------


def _payload(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--payload {text}: {exc.strerror or exc}") from None
    try:
        payload = json.loads(text)
    except ValueError as exc:
        raise UserError(f"--payload must be a JSON object (or @file holding one): {exc}") from None
    if not isinstance(payload, dict):
        raise UserError(f"--payload must be a JSON object, got {type(payload).__name__}")
    return payload


@app.command()
@user_errors
def send(
    type: str = typer.Argument(..., help="The Event type, e.g. order.placed."),
    scope: str = typer.Option(..., "--scope", help="The scope path it belongs to, e.g. shop."),
    key: str | None = typer.Option(None, "--key", help="The correlation key, e.g. order/42."),
    work: str | None = typer.Option(None, "--work", help="Deliver to this Work id explicitly."),
    payload: str | None = typer.Option(None, "--payload", help="A JSON object, or @file.json."),
    source: str = typer.Option("cli", "--source", help="Who sends it (dedup is per source)."),
    delivery_id: str | None = typer.Option(
        None, "--delivery-id", help="The delivery's id (default: a new one); resend with it to dedup."
    ),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Send an Event to a running server; it is durable once this returns, and the answer says which
    route matched it (waiting a moment for its routing)."""
    body: dict[str, Any] = {
        "source": source,
        "delivery_id": delivery_id or uuid.uuid4().hex,
        "type": type,
        "scope": scope,
        "payload": _payload(payload),
    }
    if key is not None:
        body["key"] = key
    if work is not None:
        body["work_id"] = work
    answer = _client(url, token_file).post(f"/events?wait={ROUTE_WAIT_S}", body)
    if as_json or not isinstance(answer, dict):
        _show(answer, True)
        return
    shown = humanize(answer)
    what = "already accepted (a duplicate delivery)" if answer.get("duplicate") else "accepted"
    typer.echo(
        f"{what}: event {shown.get('id')} seq {shown.get('seq')} at {shown.get('accepted_at', '-')} "
        f"(source {body['source']}, delivery {body['delivery_id']})"
    )
    typer.echo(_cli_results.routing_line(answer.get("routing")))


@work_app.command("list")
@user_errors
def work_list(
    scope: str | None = typer.Option(None, "--scope", help="Only Work in this scope."),
    state: str | None = typer.Option(None, "--state", help="ready, running, waiting, completed, ..."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List Work."""
    answer = _client(url, token_file).get("/work", {"scope": scope, "state": state})
    if as_json:
        _show(answer, True)
        return
    rows = [humanize(item) for item in items_of(answer, "work", "items")]
    if not rows:
        typer.echo("no work")
        return
    columns = [("id", "id"), ("state", "state"), ("scope", "scope"), ("kind", "kind")]
    columns += [("attempts", "attempts"), ("held", "held"), ("keys", "keys")]
    typer.echo(table(rows, columns))


def _work_path(work_id: str, action: str = "") -> str:
    return f"/work/{quote(work_id, safe='')}" + (f"/{action}" if action else "")


@work_app.command("get")
@user_errors
def work_get(
    work_id: str = typer.Argument(...),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Show one Work: state, hold and its reason, keys, attempts, wait, pending input, history."""
    answer = _client(url, token_file).get(_work_path(work_id))
    if as_json or not isinstance(answer, dict):
        _show(answer, True)
    else:
        typer.echo(work_view(answer))


def _control(action: str, work_id: str, body: dict[str, Any], client: Client, as_json: bool) -> None:
    answer = client.post(_work_path(work_id, action), body)
    if as_json or not isinstance(answer, dict):
        _show(answer, True)
        return
    if answer.get("state"):  # hold, release, cancel answer the Work
        held = f", held: {answer.get('hold_reason') or '-'}" if answer.get("held") else ", not held"
        said = f"is {answer['state']}{held}"
    elif answer.get("status"):
        said = f"interrupt {answer['status']}"  # interrupt answers its intent
    else:
        said = f"requested as event {answer.get('id')}"  # retry and replay answer their control Event
    typer.echo(f"{action}: work {work_id} {said}")


REASON = typer.Option(None, "--reason", help="Why (recorded with the action).")


@work_app.command("hold")
@user_errors
def work_hold(
    work_id: str = typer.Argument(...),
    reason: str = typer.Option(..., "--reason", help="Why it is held (shown with the Work)."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Hold Work: no attempt starts until it is released; its input keeps queueing."""
    _control("hold", work_id, {"reason": reason}, _client(url, token_file), as_json)


@work_app.command("release")
@user_errors
def work_release(
    work_id: str = typer.Argument(...),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Release a hold."""
    _control("release", work_id, {}, _client(url, token_file), as_json)


@work_app.command("cancel")
@user_errors
def work_cancel(
    work_id: str = typer.Argument(...),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Cancel Work (terminal): its attempts lose their authority."""
    _control("cancel", work_id, {}, _client(url, token_file), as_json)


def _reasoned(reason: str | None) -> dict[str, Any]:
    return {"reason": reason} if reason is not None else {}


@work_app.command("interrupt")
@user_errors
def work_interrupt(
    work_id: str = typer.Argument(...),
    reason: str | None = REASON,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Interrupt the running attempt; the Work stays ready with its input."""
    _control("interrupt", work_id, _reasoned(reason), _client(url, token_file), as_json)


@work_app.command("retry")
@user_errors
def work_retry(
    work_id: str = typer.Argument(...),
    reason: str | None = REASON,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Start the next attempt now, with a fresh retry budget."""
    _control("retry", work_id, _reasoned(reason), _client(url, token_file), as_json)


@work_app.command("replay")
@user_errors
def work_replay(
    work_id: str = typer.Argument(...),
    event: str = typer.Option(..., "--event", help="The unrouted Event to route again."),
    reason: str | None = REASON,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Route again an Event of this Work that stayed unrouted."""
    _control("replay", work_id, {**_reasoned(reason), "event_id": event}, _client(url, token_file), as_json)


@app.command()
@user_errors
def timers(
    state: str | None = typer.Option(None, "--state", help="armed, fired, cancelled, ..."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List durable timers and when they fire."""
    answer = _client(url, token_file).get("/timers", {"state": state})
    if as_json:
        _show(answer, True)
        return
    rows = [humanize(item) for item in items_of(answer, "timers", "items")]
    if not rows:
        typer.echo("no timers")
        return
    columns = [("id", "id"), ("state", "state"), ("fires at", "fire_at"), ("type", "type")]
    columns += [("scope", "scope"), ("key", "key")]
    typer.echo(table(rows, columns))


@app.command()
@user_errors
def diagnostics(
    kind: str | None = typer.Option(None, "--kind", help="Only this kind, e.g. executor_failed."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List what went wrong, and with which subject (never a payload)."""
    answer = _client(url, token_file).get("/diagnostics", {"kind": kind})
    if as_json:
        _show(answer, True)
        return
    rows = [humanize(item) for item in items_of(answer, "diagnostics", "items")]
    if not rows:
        typer.echo("no diagnostics")
        return
    for row in rows:
        typer.echo(f"{row.get('at', '-')}  {row.get('kind')}  {row.get('subject')}: {row.get('message')}")


from . import _cli_config as _cli_config  # noqa: E402  # its commands join the apps defined above
from . import _cli_results  # noqa: E402

ROUTE_WAIT_S = 2
"""How long ``loom send`` lets the server wait for its Event's routing checkpoint."""


def main() -> None:
    app()
