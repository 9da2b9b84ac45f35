"""``loom config check``: what the configuration gets wrong before (or while) it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ._cli_base import EMPTY_DB, UserError, checked_config, existing_loom_database, group, user_errors

config_app = group("Check a configuration before it runs.")


@config_app.command("check")
@user_errors
def config_check(
    config: Path | None = typer.Option(
        None, "--config", help="The loom.toml to check (default: $LOOM_CONFIG, else ./loom.toml)."
    ),
    app_spec: str | None = typer.Option(
        None, "--app", envvar="LOOM_APP", help="module:object, the loom.App the server would run."
    ),
    db: str | None = typer.Option(
        None,
        "--db",
        help="Also check the schedules armed in this store (a loom SQLite file no server holds, or a"
        " postgresql:// URL).",
    ),
) -> None:
    """Check the configuration `loom serve` would run, found as it finds it: it is refused if it cannot
    run (one line naming the key), and each thing it gets wrong is reported: routes whose Work nothing
    can start, bindings, Work kinds and scopes nothing uses, and (with --db) schedules that never start
    anything. Exit status 1 when there is anything to report."""
    import trio

    from ..config import Config
    from ._apps import app_and_config, find_config
    from ._render import printable

    if db is not None:
        _check_store(db)
    checked_config(config)
    served, loaded, said = app_and_config(app_spec, find_config(config))
    typer.echo(f"checking {said}")
    findings = trio.run(_check, loaded if loaded is not None else Config(), served, db)
    for finding in findings:
        typer.echo(f"warning: {printable(finding)}")  # (it may quote what the store holds)
    if findings:
        typer.echo(f"{len(findings)} thing{'s' if len(findings) != 1 else ''} to look at")
        raise typer.Exit(1)
    typer.echo("nothing to report")


def _check_store(db: str) -> None:
    """Refuse a ``--db`` no check can read, before anything opens it: a malformed PostgreSQL URL, and
    a SQLite path that is not already a loom database (opening it would create one: a typo would be
    "nothing to report" and leave a new database behind)."""
    from ..records.errors import LoomError
    from ..store import SQLiteStore, as_store, check_location

    if not db:
        raise UserError(EMPTY_DB)
    try:
        check_location(db)
        store = as_store(db)
    except LoomError as exc:
        raise UserError(f"--db: {exc}") from None
    if isinstance(store, SQLiteStore):
        existing_loom_database(db)


async def _check(config: Any, served: Any, db: str | None) -> list[Any]:
    from ..runtime import open_runtime

    plugins = [served] if served is not None else []
    async with open_runtime(db or ":memory:", config=config, plugins=plugins, actors=()) as rt:
        return await rt.check(schedules=db is not None)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
