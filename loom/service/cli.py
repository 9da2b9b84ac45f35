"""The ``loom`` command line (typer): ``serve``, ``demo``, and commands that talk to a running server
over its HTTP API (``send``, ``events``, ``work``, ``timers``, ``diagnostics``, ``watch``, ``compact``,
...: one for every operation of docs/http-api.md; the command modules ``_cli_*`` add them to `app`),
and ``vacuum`` on a SQLite file.

A user error (an unreachable server, an unknown Work, a bad config or path) prints one line to stderr
and exits with status 1; never a traceback. (``loom work wait`` tells an unknown Work, 3, and an
unreachable server, 4, from a Work that ended without completing, 1: docs/http-api.md "Results".)
Only typer is imported to parse a command line: what a command needs is imported when it runs, so
``loom --help`` answers at once.
"""

from __future__ import annotations

import enum
import functools
import importlib
from pathlib import Path

import typer

from .. import __version__
from . import _cli_compact, _cli_config, _cli_events, _cli_more, _cli_results, _cli_work
from ._cli_base import CONTEXT, UserError, checked_config, user_errors

app = typer.Typer(
    no_args_is_help=True,
    help="loom: a durable coordination runtime. Start with `loom demo`.",
    context_settings=CONTEXT,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


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


# -- serve and demo -----------------------------------------------------------------------------------


class LogLevel(enum.StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:8440`` for IPv6), or `UserError` saying what is expected. A host in
    brackets must be whole: ``[::1`` or ``::1]:8440`` is malformed, not a host to be checked."""
    host, sep, port = listen.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if (
        not sep
        or not host
        or "[" in host
        or "]" in host
        or not port.isascii()
        or not port.isdigit()
        or not 0 <= int(port) <= 65535
    ):
        raise UserError(
            f"--listen must be HOST:PORT such as 127.0.0.1:8440 (an IPv6 host in brackets: [::1]:8440),"
            f" got {listen!r}"
        )
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
    log_format: LogFormat = typer.Option(
        LogFormat.TEXT, "--log-format", case_sensitive=False, help="Log lines as text or as JSON objects."
    ),
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
    stop_grace: float = typer.Option(
        8.0,
        "--stop-grace",
        help="Seconds a stopping server waits for its running python functions to return, starting"
        " nothing new meanwhile (0 to 3600). Keep it under your supervisor's kill timeout.",
    ),
) -> None:
    """Run loom as a service: the HTTP API, operator controls and web view, on one SQLite file or on a
    PostgreSQL database shared with other nodes."""
    import trio

    from ..records.errors import LoomError
    from ..store import check_location

    parse_listen(listen)
    checked_config(config)
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
            log_format=log_format.value,
            allow_hosts=tuple(allow_host),
            token_file=str(token_file) if token_file is not None else None,
            read_timeout=read_timeout,
            app=app_spec,
            node=node,
            stop_grace=stop_grace,
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
    from ._demo import run_demo

    run_demo(db)


_cli_results.add_work_commands(_cli_work.work_app)  # loom work wait, loom work logs
for _module in (_cli_events, _cli_work, _cli_more, _cli_config, _cli_compact):
    _module.register(app)


def main() -> None:
    app()
