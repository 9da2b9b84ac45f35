"""Embed loom's actors one by one: your trio program decides what runs in the background.

Run it as it is:  python examples/embed_actors.py

Part 1 opens a runtime with no background actors and drives it entirely through bounded host
calls: `rt.poll` routes accepted Events and fires due timers, and the program runs each attempt
itself with `rt.claim` and `rt.complete`. Part 2 reopens the same file and starts only the timer
actor, in the program's own nursery, so timers fire by themselves while routing stays in the
program's hands. Each actor needs only the store: ``router`` routes Events and runs attempts
through executors, ``timers`` fires due timers, ``subscriptions`` publishes dependency aliases.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

import loom

CONFIG = """
[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
"""

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


async def main(db: str) -> None:
    clock = loom.ManualClock(start_ms=T0)
    config = loom.Config.from_toml(CONFIG)

    # 1. no background actors: the program drives every step
    async with loom.open_runtime(db, clock=clock, config=config, actors=()) as rt:
        placed = await rt.publish(
            loom.EventIn(source="shop", delivery_id="o-1", type="order.placed", scope="shop", key="order/1")
        )
        print("accepted, not yet routed:", await rt.checkpoint(placed.id))
        report = await rt.poll(limit=100)
        print(f"poll routed {report.routed} event(s)")
        work = await rt.work_for_key("order/1")
        lease = await rt.claim(work.id, owner="my-program")
        print(f"attempt {lease.attempt} runs with {[e.type for e in lease.request.inputs]}")
        await rt.complete(lease, loom.Completed())
        print("work is", (await rt.work(work.id)).state)

        await rt.arm(
            loom.TimerSpec(
                id="reminder", fire_at_ms=T0 + 60_000, source="shop", type="shop.reminder", scope="shop"
            )
        )
        clock.advance(60_000)
        report = await rt.poll(limit=100)
        print("poll fired:", [(f.timer_id, f.result.value) for f in report.firings])

    # 2. only the timer actor, in this program's own nursery
    async with (
        loom.open_runtime(db, clock=clock, config=config, actors=()) as rt,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(rt.run_actor, "timers")
        await rt.arm(
            loom.TimerSpec(
                id="follow-up",
                fire_at_ms=clock.now_ms() + 1_000,
                source="shop",
                type="shop.tick",
                scope="shop",
            )
        )
        clock.advance(1_000)
        await rt.wait_idle()  # the timer actor has fired what is due at this instant
        print("the timer actor fired:", [f.result.value for f in await rt.firings("follow-up")])
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, str(Path(tmp) / "embed-actors.db"))
