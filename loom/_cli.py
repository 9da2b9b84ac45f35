"""The ``loom`` command line (typer)."""

from __future__ import annotations

import json
from pathlib import Path

import trio
import typer

from ._records import EventIn
from ._runtime import open_runtime

app = typer.Typer(no_args_is_help=True, add_completion=False, help="loom: a durable coordination runtime.")


@app.command()
def demo(
    db: Path = typer.Option(Path("loom-demo.db"), help="SQLite file to use (created if missing)."),
) -> None:
    """Accept a few events durably, show dedup and the causal bounds, on an embedded SQLite file."""
    trio.run(_demo, str(db))


async def _demo(db: str) -> None:
    from ._errors import CausalRefused

    async with open_runtime(db) as rt:
        first = await rt.publish(
            EventIn(
                source="demo",
                delivery_id="order-1",
                type="order.placed",
                scope="shop",
                key="order/1",
                payload={"total": 42},
            )
        )
        again = await rt.publish(
            EventIn(
                source="demo",
                delivery_id="order-1",
                type="order.placed",
                scope="shop",
                key="order/1",
                payload={"total": 42},
            )
        )
        typer.echo(f"accepted {first.id} seq={first.seq} duplicate={first.duplicate}")
        typer.echo(f"redelivered order-1: same event {again.id} seq={again.seq} duplicate={again.duplicate}")
        parent = first
        depth = 0
        try:
            while True:
                parent = await rt.publish_derived(
                    EventIn(
                        source="demo",
                        delivery_id=f"{first.delivery_id}/echo/{depth + 1}",
                        type="order.echo",
                        scope="shop",
                    ),
                    parent_id=parent.id,
                )
                depth = parent.depth
        except CausalRefused as refusal:
            typer.echo(f"a runaway chain stopped at depth {depth}: {refusal}")
        rejections = await rt.causal_rejections()
        typer.echo(f"durable causal diagnostics: {len(rejections)}")
        events = await rt.events(limit=5)
        typer.echo(json.dumps([{"seq": e.seq, "type": e.type, "depth": e.depth} for e in events]))
        typer.echo(f"database: {db}")


def main() -> None:
    app()
