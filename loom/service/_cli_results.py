"""``loom work wait`` (a Work's outcome, as a long-poll) and ``loom work logs`` (an attempt's stdout and
stderr), added to the ``loom work`` group by `loom.service.cli`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import typer

from ._cli_base import AS_JSON, TOKEN_FILE, URL, UserError, dump, user_errors

if TYPE_CHECKING:
    from ._client import Client

LONG_POLL_S = 30
"""How long one request of ``loom work wait`` waits on the server (the server allows up to 60)."""
EXIT_UNSETTLED = 2
"""``loom work wait``'s exit status when the Work's outcome is not settled within ``--timeout``."""
EXIT_NOT_FOUND = 3
"""``loom work wait``'s exit status when no Work has the id, or none owns the key (yet)."""
EXIT_UNREACHABLE = 4
"""``loom work wait``'s exit status when the server cannot be reached, stops answering during the wait
(it stopped, or was killed), does not answer in time or as HTTP, or answers 503 (its store
unavailable). Every other user error is status 1, as for every loom command."""


def _path(work_id: str, action: str) -> str:
    return f"/work/{quote(work_id, safe='')}/{action}"


def outcome_line(result: dict[str, Any]) -> str:
    """A Work's outcome for a person: its value, or its last error and what follows."""
    from ._render import humanize
    from ._render import printable as p

    work, state = p(result.get("work_id")), result.get("state")
    shown = humanize(result)
    if state == "completed":
        value = result.get("value")
        return f"work {work} completed" + (
            f": {json.dumps(value, sort_keys=True)}" if value is not None else ""
        )  # (json.dumps writes ASCII: every control character escaped)
    error = f"; the last error: {p(result['error'])}" if result.get("error") else ""
    attempts = p(result.get("attempts"))
    if state in ("failed", "cancelled"):
        return f"work {work} {state} after {attempts} attempt(s){error}"
    if result.get("retry") == "exhausted":
        return f"work {work} is held, its retries spent{error}: {p(result.get('hold_reason') or '-')}"
    retry = f"; next attempt at {p(shown.get('next_retry_at'))}" if result.get("next_retry_at_ms") else ""
    return f"work {work} is {p(state)} after {attempts} attempt(s){error}{retry}"


def _waiting_client(url: str, token: str | None) -> Client:
    """A client for ``loom work wait`` whose failures carry their exit status: `EXIT_NOT_FOUND` for a
    404, `EXIT_UNREACHABLE` for a server that cannot be reached or answered (or answers 503), 1 for
    any other refusal. (Defined here, when the command runs: the client is not imported to parse a
    command line.)"""
    import urllib.error

    from ._client import Client

    class WaitingClient(Client):
        def _failure(self, exc: Exception, method: str, path: str) -> UserError:
            error = super()._failure(exc, method, path)
            if not isinstance(exc, urllib.error.HTTPError) or exc.code == 503:
                return UserError(str(error), EXIT_UNREACHABLE)
            return UserError(str(error), EXIT_NOT_FOUND) if exc.code == 404 else error

    return WaitingClient(url, timeout=LONG_POLL_S + 30, token=token)


def add_work_commands(work_app: typer.Typer) -> None:
    @work_app.command("wait")
    @user_errors
    def work_wait(
        work_id: str | None = typer.Argument(None, help="The Work's id."),
        key: str | None = typer.Option(None, "--key", help="The Work that owns this key, instead of an id."),
        timeout: float = typer.Option(
            0, "--timeout", help="Give up after this many seconds (0: wait as long as it takes)."
        ),
        url: str = URL,
        token_file: Path | None = TOKEN_FILE,
        as_json: bool = AS_JSON,
    ) -> None:
        """Wait until a Work's outcome is settled (completed, failed, cancelled, or its retries spent) and
        print it: its value, or its last error. Exit status 0 when it completed, 1 when it did not, 2
        when --timeout ran out first, 3 when no Work has the id or owns the key, 4 when the server
        cannot be reached or stops answering during the wait."""
        from ._token import read_token_file

        if (work_id is None) == (key is None):
            raise UserError("give a Work id or --key KEY (one of them)")
        if not (math.isfinite(timeout) and timeout >= 0):
            raise UserError(
                f"--timeout must be seconds, 0 or more (0: wait as long as it takes), got {timeout!r}"
            )
        token = read_token_file(token_file) if token_file is not None else None
        api = _waiting_client(url, token)
        if work_id is None:
            found = api.get(f"/work/by-key/{quote(key or '', safe='')}")
            work = found.get("work") if isinstance(found, dict) else None
            if not isinstance(work, dict) or not isinstance(work.get("id"), str):
                raise UserError(f"the server's answer for key {key!r} names no Work")
            work_id = work["id"]
        deadline = time.monotonic() + timeout if timeout > 0 else None
        while True:
            left = (
                LONG_POLL_S
                if deadline is None
                else max(0, min(LONG_POLL_S, int(deadline - time.monotonic())))
            )
            result = api.get(_path(work_id, "result"), {"wait": left})
            settled = isinstance(result, dict) and bool(result.get("settled"))
            if settled or left == 0 or (deadline is not None and time.monotonic() >= deadline):
                break
        if as_json or not isinstance(result, dict):
            dump(result)
        else:
            typer.echo(outcome_line(result))
        if not settled:
            if not as_json:
                typer.echo(f"loom: not settled within {timeout:g}s", err=True)
            raise typer.Exit(EXIT_UNSETTLED)
        if result.get("state") != "completed":
            raise typer.Exit(1)

    @work_app.command("logs")
    @user_errors
    def work_logs(
        work_id: str = typer.Argument(..., help="The Work's id."),
        attempt: int | None = typer.Option(
            None, "--attempt", min=1, help="The attempt (default: the latest)."
        ),
        stream: str | None = typer.Option(None, "--stream", help="Only stdout or stderr."),
        tail: int = typer.Option(65536, "--tail", min=1, help="Bytes of the end of each stream."),
        url: str = URL,
        token_file: Path | None = TOKEN_FILE,
        as_json: bool = AS_JSON,
    ) -> None:
        """Print what an attempt wrote to stdout and stderr (the shell executor keeps them until their
        retention passes)."""
        from ._cli_base import client

        api = client(url, token_file)
        if attempt is None:
            result = api.get(_path(work_id, "result"))
            attempt = int(result.get("attempts") or 0) if isinstance(result, dict) else 0
            if attempt < 1:
                typer.echo(f"work {work_id} has not started an attempt yet")
                return
        answer = api.get(_path(work_id, f"attempts/{attempt}/logs"), {"stream": stream, "tail": tail})
        if as_json or not isinstance(answer, dict):
            dump(answer)
            return
        from ._render import printable as p

        for name, text in (answer.get("logs") or {}).items():
            typer.echo(f"== {p(name)} of attempt {attempt} ({p(answer.get('execution_id') or '-')}) ==")
            # an attempt's output keeps its lines and tabs; its other controls (a CR, an escape
            # sequence) are shown escaped like every string from the server
            typer.echo(p(text.rstrip("\n"), keep="\n\t") if text else "(empty)")
