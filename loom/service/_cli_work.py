"""``loom work ...``: list, inspect and control Work on a running server (docs/http-api.md "Work")."""

from __future__ import annotations

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
    group,
    list_command,
    user_errors,
)

work_app = group("List, inspect and control Work on a running server.")


def _work_table(items: list[Any]) -> str:
    from ._render import humanize_rows, table

    columns = [("id", "id"), ("state", "state"), ("scope", "scope"), ("kind", "kind")]
    columns += [("attempts", "attempts"), ("held", "held"), ("keys", "keys"), ("created", "created_at")]
    return table(humanize_rows(items), columns)


@work_app.command("list")
@user_errors
def work_list(
    scope: str | None = typer.Option(None, "--scope", help="Only Work in this scope (and those below it)."),
    state: str | None = typer.Option(None, "--state", help="ready, running, waiting, completed, ..."),
    after: str | None = typer.Option(None, "--after", help="Only Work whose id sorts after this."),
    limit: int = LIMIT,
    every: bool = ALL,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """List Work, by id."""
    list_command(
        client(url, token_file),
        "/work",
        {"scope": scope, "state": state, "after": after},
        "work",
        limit=limit,
        every=every,
        as_json=as_json,
        render=_work_table,
        empty="no work",
    )


def work_path(work_id: str, action: str = "") -> str:
    return f"/work/{quote(work_id, safe='')}" + (f"/{action}" if action else "")


@work_app.command("get")
@user_errors
def work_get(
    work_id: str | None = typer.Argument(None, help="The Work's id."),
    key: str | None = typer.Option(None, "--key", help="The Work that owns this key, instead of an id."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Show one Work: state, hold and its reason, keys, attempts, wait, pending input, history."""
    from ._render import work_view

    if (work_id is None) == (key is None):
        raise UserError("give a Work id or --key KEY (one of them)")
    path = work_path(work_id) if work_id is not None else f"/work/by-key/{quote(key or '', safe='')}"
    answer = client(url, token_file).get(path)
    if as_json or not isinstance(answer, dict):
        dump(answer)
    else:
        typer.echo(work_view(answer))


def _control(
    action: str, work_id: str, body: dict[str, Any], url: str, token_file: Path | None, as_json: bool
) -> None:
    from ._render import printable as p

    answer = client(url, token_file).post(work_path(work_id, action), body)
    if as_json or not isinstance(answer, dict):
        dump(answer)
        return
    if answer.get("state"):  # hold, release, cancel answer the Work
        held = f", held: {p(answer.get('hold_reason') or '-')}" if answer.get("held") else ", not held"
        said = f"is {p(answer['state'])}{held}"
    elif answer.get("status"):
        said = f"interrupt {p(answer['status'])}"  # interrupt answers its intent
    else:
        said = f"requested as event {p(answer.get('id'))}"  # retry and replay answer their control Event
    typer.echo(f"{action}: work {p(work_id)} {said}")


WORK_ID = typer.Argument(..., help="The Work's id.")
REASON = typer.Option(None, "--reason", help="Why (recorded with the action).")
REQUEST_ID = typer.Option(
    None, "--request-id", help="Repeating the same request id answers the first time's answer."
)


def _reasoned(reason: str | None, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"reason": reason} if reason is not None else {}
    return body | ({"request_id": request_id} if request_id is not None else {})


@work_app.command("hold")
@user_errors
def work_hold(
    work_id: str = WORK_ID,
    reason: str = typer.Option(..., "--reason", help="Why it is held (shown with the Work)."),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Hold Work: no attempt starts until it is released; its input keeps queueing."""
    _control("hold", work_id, {"reason": reason}, url, token_file, as_json)


@work_app.command("release")
@user_errors
def work_release(
    work_id: str = WORK_ID, url: str = URL, token_file: Path | None = TOKEN_FILE, as_json: bool = AS_JSON
) -> None:
    """Release a hold."""
    _control("release", work_id, {}, url, token_file, as_json)


@work_app.command("cancel")
@user_errors
def work_cancel(
    work_id: str = WORK_ID, url: str = URL, token_file: Path | None = TOKEN_FILE, as_json: bool = AS_JSON
) -> None:
    """Cancel Work (terminal): its attempts lose their authority."""
    _control("cancel", work_id, {}, url, token_file, as_json)


@work_app.command("interrupt")
@user_errors
def work_interrupt(
    work_id: str = WORK_ID,
    reason: str | None = REASON,
    request_id: str | None = REQUEST_ID,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Interrupt the running attempt; the Work stays ready with its input."""
    _control("interrupt", work_id, _reasoned(reason, request_id), url, token_file, as_json)


@work_app.command("retry")
@user_errors
def work_retry(
    work_id: str = WORK_ID,
    reason: str | None = REASON,
    request_id: str | None = REQUEST_ID,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Start the next attempt now, with a fresh retry budget."""
    _control("retry", work_id, _reasoned(reason, request_id), url, token_file, as_json)


@work_app.command("replay")
@user_errors
def work_replay(
    work_id: str = WORK_ID,
    event: str = typer.Option(..., "--event", help="The unrouted Event to route again."),
    reason: str | None = REASON,
    request_id: str | None = REQUEST_ID,
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Route again an Event of this Work that stayed unrouted."""
    _control(
        "replay", work_id, {**_reasoned(reason, request_id), "event_id": event}, url, token_file, as_json
    )


def register(app: typer.Typer) -> None:
    app.add_typer(work_app, name="work")
