"""Embed loom: route Events by key to long-lived Work run by a python function.

Run it as it is:  python examples/embed_routing.py
It uses a fresh SQLite file in a temporary directory and prints each Work's history.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

import loom
from loom.plugins.python_executor import PythonExecutor

CONFIG = """
[scopes.shop.bindings.worker]
executor = "python"
config = { function = "handle_order" }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true        # the first event for a key creates its Work
binding = "worker"
policy = "queue"          # events for a running Work wait for its next attempt, in acceptance order
"""


async def main() -> None:
    executor = PythonExecutor()

    @executor.function("handle_order")
    async def handle_order(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        kinds = [event.type for event in request.inputs]
        print(f"  attempt {request.attempt} of {request.work_id} got {kinds}")
        if "order.paid" not in kinds:
            return loom.Handoff()  # the Work waits, idle, for its order's next event
        await toolbelt.emit(
            loom.EventIn(
                source="shop",
                delivery_id=f"{request.work_id}/ship",
                type="shipment.requested",
                scope="shop",
            )
        )
        return loom.Completed()  # paid and shipped: the order's Work is done

    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "shop.db")
        async with loom.open_runtime(db, config=loom.Config.from_toml(CONFIG), plugins=[executor]) as rt:
            for n, kind in enumerate(["order.placed", "order.paid"]):
                for order in ("o-1", "o-2"):
                    await rt.publish(
                        loom.EventIn(
                            source="shop",
                            delivery_id=f"{order}/{n}",
                            type=kind,
                            scope="shop",
                            key=f"order/{order}",
                        )
                    )
            for order in ("o-1", "o-2"):
                work = await rt.work_for_key(f"order/{order}")
                result = await rt.wait_for(work.id, timeout=30)  # woken by the commit that settles it
                history = await rt.history(work.id)
                routed = [c for c in history.checkpoints if c.status is loom.CheckpointStatus.ROUTED]
                print(
                    f"{order}: {result.state}, {len(history.executions)} attempt(s), {len(routed)} routed event(s)"
                )
            shipments = await rt.events(type="shipment.requested")
            print(f"emitted: {len(shipments)} shipment.requested event(s)")


if __name__ == "__main__":
    trio.run(main)
