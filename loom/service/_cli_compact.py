"""``loom compact`` (on a running server) and ``loom vacuum`` (on a SQLite file, loom stopped):
removing what ended once its retention passed, and letting an old file shrink (docs/operations.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ._cli_base import AS_JSON, TOKEN_FILE, URL, client, dump, existing_loom_database, user_errors

COUNTS = (
    "events",
    "works",
    "attempts",
    "timers",
    "firings",
    "diagnostics",
    "ledgers",
    "buckets",
    "tombstones",
    "logs",
)
"""The kinds of row a compaction report counts (`loom.records.compaction.COUNTS`)."""


@user_errors
def compact(
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be removed; remove nothing."),
    limit: int | None = typer.Option(
        None, "--limit", min=1, max=10_000, help="Rows per pass per kind of row."
    ),
    url: str = URL,
    token_file: Path | None = TOKEN_FILE,
    as_json: bool = AS_JSON,
) -> None:
    """Compact a running server now: remove what ended once its retention passed (POST /compact)."""
    body: dict[str, Any] = {"dry_run": dry_run}
    if limit is not None:
        body["limit"] = limit
    answer = client(url, token_file).post("/compact", body)
    if as_json or not isinstance(answer, dict):
        dump(answer)
        return
    from ._render import printable as p

    counts = [f"{p(answer[kind])} {kind}" for kind in COUNTS if answer.get(kind)]
    typer.echo(f"{'would remove' if dry_run else 'removed'}: {', '.join(counts) or 'nothing'}")
    if answer.get("kept"):
        typer.echo(f"kept {p(answer['kept'])} past their retention: something still refers to them")
    if answer.get("released_bytes"):
        typer.echo(f"gave {p(answer['released_bytes'])} bytes back to the file system")


@user_errors
def vacuum(
    db: str = typer.Option(..., "--db", help="The SQLite file (loom must not be running on it)."),
) -> None:
    """Rewrite a SQLite file made by an earlier loom with incremental vacuum, so the space compaction
    frees goes back to the file system. Stop loom first; it needs free disk space about the size of
    the file. A file that is not a loom database is refused and left as it is."""
    from ..store import SQLiteStore

    # (text, not a Path: Path('') would be the working directory, not a --db that is empty)
    existing_loom_database(db)  # the store's open would make any other file a loom database
    before, after = SQLiteStore(path=db).vacuum()
    typer.echo(f"{db}: {before} bytes before, {after} after; compaction now gives freed space back")


def register(app: typer.Typer) -> None:
    for command in (compact, vacuum):
        app.command()(command)
