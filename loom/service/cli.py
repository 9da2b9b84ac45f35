"""The ``loom`` command line (typer)."""

from __future__ import annotations

from pathlib import Path

import trio
import typer

from ..config import Config
from ..plugins.python_executor import PythonExecutor
from ..records.clock import SystemClock
from ..records.errors import CausalRefused
from ..records.events import EventIn
from ..records.executor import Toolbelt
from ..records.timers import TimerSpec
from ..records.work import Completed, RunRequest
from ..runtime import open_runtime

app = typer.Typer(no_args_is_help=True, add_completion=False, help="loom: a durable coordination runtime.")


@app.callback()
def cli() -> None:
    """loom: a durable coordination runtime."""


@app.command()
def demo(
    db: Path = typer.Option(Path("loom-demo.db"), help="SQLite file to use (created if missing)."),
) -> None:
    """Accept a few events durably, show dedup and the causal bounds, on an embedded SQLite file."""
    trio.run(_demo, str(db))


DEMO_CONFIG = """
[scopes.shop.bindings.worker]
executor = "python"
config = { function = "fulfil" }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
binding = "worker"
"""


async def _demo(db: str) -> None:
    executor = PythonExecutor()

    @executor.function("fulfil")
    async def fulfil(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        typer.echo(f"  attempt {request.attempt} of {request.work_id}: {[e.type for e in request.inputs]}")
        return Completed()

    clock = SystemClock()
    async with open_runtime(db, clock=clock, config=Config.from_toml(DEMO_CONFIG), plugins=[executor]) as rt:
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
        await rt.wait_idle()
        work = await rt.work_for_key("order/1")
        typer.echo(f"work {work.id} for key order/1 is {work.state} after {work.attempts} attempt(s)")

        timer = await rt.arm(
            TimerSpec(
                id=f"demo-reminder-{clock.now_ms()}",
                fire_at_ms=clock.now_ms() + 300,
                source="demo",
                type="order.reminder",
                scope="shop",
                key="order/1",
            )
        )
        async with rt.watch() as notices:
            with trio.fail_after(10):
                async for _ in notices:  # wake on each commit, not on a timer
                    if await rt.firings(timer.id):
                        break
        await rt.wait_idle()
        typer.echo(
            f"durable timer {timer.id} fired once: {[f.result.value for f in await rt.firings(timer.id)]}"
        )

        parent = first
        try:
            while True:
                parent = await rt.publish_derived(
                    EventIn(
                        source="demo",
                        delivery_id=f"{parent.delivery_id}/echo",
                        type="audit.echo",
                        scope="shop",
                    ),
                    parent_id=parent.id,
                )
        except CausalRefused as refusal:
            typer.echo(f"a runaway chain stopped at depth {parent.depth}: {refusal}")
        typer.echo(f"durable causal diagnostics: {len(await rt.causal_rejections())}")
        typer.echo(f"database: {db}")


def main() -> None:
    app()
