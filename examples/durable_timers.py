"""Durable timers: a one-shot timer and a cron schedule that survive a restart.

Run it as it is:  python examples/durable_timers.py
It arms the timers, closes the runtime, reopens the same file on a test clock that is
moved forward, and shows each timer firing exactly once per occurrence.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

import loom
from loom.plugins.schedule import ScheduleSpec, schedule_timer
from loom.testing import T0_MS, ManualClock

HOUR = 3_600_000


async def main() -> None:
    clock = ManualClock(start_ms=T0_MS)  # 2026-01-01T00:00Z
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "timers.db")
        async with loom.open_runtime(db, clock=clock) as rt:
            await rt.arm(
                loom.TimerSpec(
                    id="reminder", fire_at_ms=T0_MS + 2 * HOUR, source="ops", type="reminder.due", scope="ops"
                )
            )
            nightly = ScheduleSpec(schedule_id="nightly", cron="30 2 * * *", timezone="Europe/Berlin")
            await rt.arm(
                schedule_timer(nightly, now_ms=clock.now_ms(), source="ops", type="report.due", scope="ops")
            )
        # the process is gone; its timers are in the file
        clock.advance(26 * HOUR)
        async with loom.open_runtime(db, clock=clock) as rt:
            for _ in range(3):  # bounded host passes; the timer actor may already have fired them
                await rt.poll(limit=100)
            for timer_id in ("reminder", "schedule:nightly"):
                for firing in await rt.firings(timer_id):
                    event = await rt.event(firing.event_id) if firing.event_id else None
                    print(f"{timer_id}: {firing.result} {event.delivery_id if event else ''}")
            print("nightly next fires at", (await rt.timer("schedule:nightly")).fire_at_ms)


if __name__ == "__main__":
    trio.run(main)
