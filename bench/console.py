"""The web console's pages over a large store: how long each page takes to render, p50 and p99.

Run from the repository root::

    python bench/console.py [--works N] [--db PATH] [--requests R]

It fills a SQLite file with N Works (100,000 by default: one Event each, routed to a Work of its own,
in two scopes; a few held, cancelled and completed; armed timers, schedules and diagnostics), unless
``--db`` names a file it filled before (building 100,000 takes a few minutes), then asks each page of
the console R times through the app in-process (the server's own time: rendering and the store's
reads, no network) and prints p50, p99 and the worst of each page. The console's target is under 50 ms
p99 for every page (docs/http-api.md "Web console").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# bench/http.py shares its name with the standard library's http, which the service imports
sys.path.remove(str(Path(__file__).resolve().parent))

import trio

import loom
from loom.plugins.schedule import ScheduleSpec, schedule_timer
from loom.service.serve import open_service

App = Any

CONFIG = loom.Config.from_toml(
    """
[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
"""
)
BATCH = 1000


def offer(i: int) -> loom.EventIn:
    return loom.EventIn(
        source="bench",
        delivery_id=f"o-{i}",
        type="order.placed" if i % 7 else "order.paid",
        scope="shop" if i % 3 else "shop/eu",
        key=f"order/{i}",
        payload={"n": i, "note": "<b>escaped</b>"},
    )


async def fill(db: str, works: int) -> None:
    started = time.perf_counter()
    async with loom.open_runtime(db, config=CONFIG, actors=()) as rt:
        for first in range(0, works, BATCH):
            await rt.publish_many([offer(i) for i in range(first, min(works, first + BATCH))])
        while (await rt.poll(BATCH)).routed:
            pass
        await decorate(rt)
    print(f"filled {works} Works in {time.perf_counter() - started:.0f} s")


async def decorate(rt: loom.Runtime) -> None:
    """Some Works held and cancelled; reminders (some overdue) and schedules."""
    page = await rt.works(state=loom.WorkState.READY, limit=300)
    for work in page[:100]:
        await rt.hold(work.id, reason="bench hold")
    for work in page[100:200]:
        await rt.cancel(work.id)
    now = rt.clock.now_ms()
    for n in range(200):
        await rt.arm(
            loom.TimerSpec(
                id=f"remind-{n}",
                fire_at_ms=now + (n - 20) * 60_000,
                source="bench",
                type="order.remind",
                scope="shop",
                key=f"order/{n}",
            )
        )
    for n in range(20):
        spec = ScheduleSpec(schedule_id=f"nightly-{n}", cron=f"{n} 2 * * *", timezone="Europe/Berlin")
        await rt.arm(schedule_timer(spec, now_ms=now, source="bench", type="report.due", scope="shop"))


async def get(app: App, path: str) -> tuple[int, bytes]:
    """One GET through the ASGI app, as a server would make it (no HTTP client in between: bench/http.py
    is named like the standard library's http, which HTTP clients import)."""
    target, _, query = path.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": target, "raw_path": target.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8440),
    }  # fmt: skip
    status = 0
    body: list[bytes] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(body)


def pages(sample: dict[str, str]) -> dict[str, str]:
    return {
        "works": "/ui/work",
        "works, one state": "/ui/work?state=ready",
        "works, a rare state": "/ui/work?state=cancelled",
        "works, a scope": "/ui/work?scope=shop/eu",
        "works, a key prefix": "/ui/work?key=order/12",
        "one work": f"/ui/work/{sample['work']}",
        "events": "/ui/events",
        "events, a type": "/ui/events?type=order.paid",
        "one event": f"/ui/events/{sample['event']}",
        "timers (armed, by due)": "/ui/timers",
        "one timer": "/ui/timers/remind-3",
        "schedules": "/ui/schedules",
        "diagnostics": "/ui/diagnostics",
    }


async def measure(db: str, requests: int) -> float:
    async with open_service(db, config=CONFIG, start_actors=False, load_entry_points=False) as service:
        rt = service.runtime
        works = await rt.works(limit=1)
        events = await rt.events(limit=1)
        sample = {"work": works[0].id, "event": events[0].id}
        total = sum((await rt.work_counts()).values())
        print(f"{total} Works in the store")
        worst = 0.0
        for name, path in pages(sample).items():
            times = []
            for _ in range(requests):
                began = time.perf_counter()
                status, body = await get(service.app, path)
                times.append((time.perf_counter() - began) * 1000)
                assert status == 200, (path, status, body[:300])
            times.sort()
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            worst = max(worst, p99)
            print(
                f"{name:26} p50 {statistics.median(times):6.1f} ms   p99 {p99:6.1f} ms"
                f"   max {times[-1]:6.1f} ms   ({len(body) // 1024} KiB)"
            )
        print(f"worst p99 of any page: {worst:.1f} ms")
        return worst


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--works", type=int, default=100_000)
    parser.add_argument("--db", help="a file filled by an earlier run (filled now when it does not exist)")
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        db = args.db or str(Path(scratch) / "console.db")
        if not await trio.Path(db).exists():
            await fill(db, args.works)
        await measure(db, args.requests)


if __name__ == "__main__":
    trio.run(main)
