"""A child process for the kill drill: publish events (and arm timers) on a SQLite file or a
PostgreSQL database (a path or a URL),
printing each acknowledged delivery id as soon as publish returns. The test kills it
with SIGKILL mid-stream."""

from __future__ import annotations

import sys

import trio

import loom

HOUR = 3_600_000


async def main(db: str, start_ms: int) -> None:
    clock = loom.ManualClock(start_ms=start_ms)
    async with loom.open_runtime(db, clock=clock, load_entry_points=False) as rt:
        for i in range(5):
            timer = loom.TimerSpec(
                id=f"t{i}",
                fire_at_ms=start_ms + (i + 1) * HOUR,
                source="drill",
                type="drill.tick",
                scope="drill",
            )
            await rt.arm(timer)
            print(f"armed t{i}", flush=True)

        async def producer(p: int) -> None:
            for i in range(10_000):
                event = await rt.publish(
                    loom.EventIn(
                        source="drill",
                        delivery_id=f"{p}-{i}",
                        type="drill.event",
                        scope="drill",
                        payload={"p": p, "i": i},
                    )
                )
                print(f"ack {event.delivery_id}", flush=True)

        async with trio.open_nursery() as nursery:
            for p in range(20):
                nursery.start_soon(producer, p)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], int(sys.argv[2]))
