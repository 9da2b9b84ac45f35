"""A child process for the multi-node drill: one node on a shared PostgreSQL database, under load.

It arms timers due a little later on its own clock, publishes Events on keys every node shares
(each routed to its key's Work) and offers Events every node offers too (accepted once in all),
printing each acknowledgement as soon as it returns: ``armed ID`` and ``ack DELIVERY_ID``. Its clock
moves on by itself, so timers fall due while it runs. The test kills it with SIGKILL at random moments
and starts it again.
"""

from __future__ import annotations

import sys

import trio

import loom

CONFIG = loom.Config.from_toml(
    """
[[scopes.drill.routes]]
name = "orders"
types = ["drill.*"]
create_work = true
"""
)


async def main(db: str, node: str, generation: str, start_ms: int) -> None:
    clock = loom.ManualClock(start_ms=start_ms)
    async with loom.open_runtime(
        db, clock=clock, config=CONFIG, owner=f"{node}.{generation}", load_entry_points=False, resync_ms=200
    ) as rt:
        name = f"{node}-{generation}"

        async def ticker() -> None:
            while True:
                clock.advance(20)
                await trio.sleep(0.005)

        async def timers() -> None:
            for i in range(10_000):
                spec = loom.TimerSpec(
                    id=f"t-{name}-{i}",
                    fire_at_ms=clock.now_ms() + 100,
                    source="drill",
                    type="drill.tick",
                    scope="drill",
                    key=f"order/{i % 7}",
                )
                await rt.arm(spec)
                print(f"armed {spec.id}", flush=True)
                await trio.sleep(0.01)

        async def producer(p: int) -> None:
            for i in range(100_000):
                own = loom.EventIn(
                    source="drill", delivery_id=f"{name}-{p}-{i}", type="drill.order", scope="drill",
                    key=f"order/{(p + i) % 7}",
                )  # fmt: skip
                print(f"ack {(await rt.publish(own)).delivery_id}", flush=True)
                await trio.sleep(0.005)  # a steady load the node's router keeps up with
                if i % 5 == 0:  # every node offers these: one Event each, whoever is first
                    common = loom.EventIn(
                        source="drill", delivery_id=f"common-{p}-{i}", type="drill.common", scope="drill"
                    )
                    print(f"ack {(await rt.publish(common)).delivery_id}", flush=True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)
            nursery.start_soon(timers)
            for p in range(2):
                nursery.start_soon(producer, p)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
