"""The command line's result and failure commands: ``loom work wait`` (a Work's outcome, as a long-poll)
and ``loom work logs`` (an attempt's stdout and stderr), and how ``loom send`` says where its Event went.

Registered on the ``loom`` app by `loom.service.cli` (which imports this module last).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from ._client import Client
from ._render import humanize, scalar
from ._token import read_token_file
from .cli import AS_JSON, TOKEN_FILE, URL, _client, _show, _work_path, user_errors, work_app

LONG_POLL_S = 30
"""How long one request of ``loom work wait`` waits on the server (the server allows up to 60)."""
EXIT_UNSETTLED = 2
"""``loom work wait``'s exit status when the Work's outcome is not settled within ``--timeout``."""


def routing_line(routing: Any) -> str:
    """Where an accepted Event went, for ``loom send``."""
    if not isinstance(routing, dict):
        return "routing: unknown"
    status = routing.get("status")
    route = f"route {routing.get('route')!r}" + (
        f" (scope {routing['route_scope']})" if routing.get("route_scope") else ""
    )
    reason = f": {routing['reason']}" if routing.get("reason") else ""
    if status == "routed":
        return f"routed by {route} to work {routing.get('work_id')}"
    if status == "unmatched":
        return f"matched no route in its scope: nothing will act on it{reason}"
    if status == "drop":
        return f"dropped by {route}{reason}"
    if status == "terminal":
        return f"matched {route}, but work {routing.get('work_id')} has ended{reason}"
    if status == "unrouted":
        return f"could not be routed{reason} (loom diagnostics; loom work replay)"
    return "accepted, not routed yet (the router routes it in acceptance order)"


def _outcome_line(result: dict[str, Any]) -> str:
    work, state = result.get("work_id"), result.get("state")
    shown = humanize(result)
    if state == "completed":
        value = result.get("value")
        return f"work {work} completed" + (
            f": {json.dumps(value, sort_keys=True)}" if value is not None else ""
        )
    error = f"; the last error: {result['error']}" if result.get("error") else ""
    if state in ("failed", "cancelled"):
        return f"work {work} {state} after {result.get('attempts')} attempt(s){error}"
    if result.get("retry") == "exhausted":
        return f"work {work} is held, its retries spent{error}: {result.get('hold_reason') or '-'}"
    retry = f"; next attempt at {shown.get('next_retry_at')}" if result.get("next_retry_at_ms") else ""
    return f"work {work} is {state} after {result.get('attempts')} attempt(s){error}{retry}"


@work_app.command("wait")
@user_errors
def work_wait(
    work_id: str = typer.Argument(...),
    timeout: float = typer.Option(
        0, "--timeout", help="Give up after this many seconds (0: wait as long as it takes)."
    ),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Wait until a Work's outcome is settled (completed, failed, cancelled, or its retries spent) and
    print it: its value, or its last error. Exit status 0 when it completed, 1 when it did not, 2 when
    --timeout ran out first."""
    client = Client(
        url, timeout=LONG_POLL_S + 30, token=read_token_file(token_file) if token_file is not None else None
    )
    deadline = time.monotonic() + timeout if timeout > 0 else None
    while True:
        left = LONG_POLL_S if deadline is None else max(0, min(LONG_POLL_S, int(deadline - time.monotonic())))
        result = client.get(_work_path(work_id, "result"), {"wait": left})
        settled = isinstance(result, dict) and bool(result.get("settled"))
        if settled or (deadline is not None and time.monotonic() >= deadline) or left == 0:
            break
    if as_json:
        _show(result, True)
    elif isinstance(result, dict):
        typer.echo(_outcome_line(result))
    if not settled:
        if not as_json:
            typer.echo(f"loom: not settled within {timeout:g}s", err=True)
        raise typer.Exit(EXIT_UNSETTLED)
    if result.get("state") != "completed":
        raise typer.Exit(1)


@work_app.command("logs")
@user_errors
def work_logs(
    work_id: str = typer.Argument(...),
    attempt: int | None = typer.Option(None, "--attempt", help="The attempt (default: the latest)."),
    stream: str | None = typer.Option(None, "--stream", help="Only stdout or stderr."),
    tail: int = typer.Option(65536, "--tail", help="Bytes of the end of each stream."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Print what an attempt wrote to stdout and stderr (the shell executor keeps them until their
    retention passes)."""
    client = _client(url, token_file)
    if attempt is None:
        result = client.get(_work_path(work_id, "result"))
        attempt = int(result.get("attempts") or 0) if isinstance(result, dict) else 0
        if attempt < 1:
            typer.echo(f"work {work_id} has not started an attempt yet")
            return
    answer = client.get(_work_path(work_id, f"attempts/{attempt}/logs"), {"stream": stream, "tail": tail})
    if as_json or not isinstance(answer, dict):
        _show(answer, True)
        return
    logs = answer.get("logs") or {}
    for name, text in logs.items():
        typer.echo(f"== {name} of attempt {attempt} ({scalar(answer.get('execution_id'))}) ==")
        typer.echo(text.rstrip("\n") if text else "(empty)")
