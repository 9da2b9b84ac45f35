"""Use the example plugin package: loom loads it from the ``loom`` entry-point group by itself.

Run it once the package is installed:

    pip install -e examples/plugin_package
    python examples/plugin_package/example.py

Tickets are routed by the plugin's ``triage`` handler (a low-priority ticket opens no Work), and a
timer recurs by its ``business_days`` policy: on a test clock that starts on a Friday, it fires on
Friday and then on Monday.
"""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime
from importlib.metadata import entry_points
from pathlib import Path

import trio

import loom
from loom.plugins.python_executor import PythonExecutor

FRIDAY_9 = 1_767_949_200_000  # 2026-01-09T09:00:00Z, a Friday
HOUR = 3_600_000

CONFIG = """
[work_kinds.customer]
standing = true              # a customer's Work stays open for their next ticket

[scopes.crm.bindings.worker]
executor = "python"
config = { function = "follow_up" }

[[scopes.crm.routes]]
name = "tickets"
types = ["ticket.*", "digest.due"]
handler = "triage"
binding = "worker"
work_kind = "customer"
config = { min_priority = 2 }
"""


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%a %Y-%m-%dT%H:%MZ")


async def main(db: str) -> None:
    found = [ep.value for ep in entry_points(group="loom")]
    if "loom_example_plugin" not in found:
        raise SystemExit("the plugin is not installed: pip install -e examples/plugin_package")
    print("loom entry points:", ", ".join(found))

    executor = PythonExecutor()

    @executor.function("follow_up")
    async def follow_up(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Completed:
        print(f"  {request.work_id} attempt {request.attempt}: {[e.type for e in request.inputs]}")
        return loom.Completed()

    clock = loom.ManualClock(start_ms=FRIDAY_9 - HOUR)
    config = loom.Config.from_toml(CONFIG)  # `triage` is known: the plugin was loaded
    async with loom.open_runtime(db, clock=clock, config=config, plugins=[executor]) as rt:
        for n, (customer, priority) in enumerate([("ada", 3), ("grace", 1), ("ada", 1)]):
            event = await rt.publish(
                loom.EventIn(
                    source="crm",
                    delivery_id=f"t-{n}",
                    type="ticket.opened",
                    scope="crm",
                    key=f"customer/{customer}",
                    payload={"priority": priority},
                )
            )
            await rt.wait_idle()
            checkpoint = await rt.checkpoint(event.id)
            assert checkpoint is not None
            print(
                f"ticket for {customer} (priority {priority}): {checkpoint.status} {checkpoint.reason or ''}"
            )
        timer = await rt.arm(
            loom.TimerSpec(
                id="digest",
                fire_at_ms=FRIDAY_9,
                source="crm",
                type="digest.due",
                scope="crm",
                key="customer/ada",
                recurrence="business_days",
                spec={"name": "digest"},
            )
        )
        for _ in range(2):
            clock.set(timer.fire_at_ms)
            await rt.wait_idle()
            print(f"digest fired for {iso(timer.fire_at_ms)}")
            timer = await rt.timer("digest")
        print(f"next digest: {iso(timer.fire_at_ms)} (the weekend is skipped)")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, str(Path(tmp) / "plugin.db"))
