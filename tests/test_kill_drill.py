"""A process killed with SIGKILL mid-load loses nothing it acknowledged, and its durable
timers fire once each after the restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import loom
from loom.testing import T0_MS, RuntimeDriver
from loom.testing.postgres import PostgresCluster

HOUR = 3_600_000
CHILD = Path(__file__).parent / "drills" / "publisher.py"


def run_until_killed(db: str, acks_before_kill: int) -> tuple[set[str], set[str]]:
    """Start the publisher, kill it with SIGKILL after some acknowledgements; return what it acknowledged."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), db, str(T0_MS)], stdout=subprocess.PIPE, text=True, env={**os.environ}
    )
    assert proc.stdout is not None
    acked: set[str] = set()
    armed: set[str] = set()
    try:
        for line in proc.stdout:
            kind, _, name = line.strip().partition(" ")
            (acked if kind == "ack" else armed).add(name)
            if len(acked) >= acks_before_kill:
                proc.send_signal(signal.SIGKILL)
                break
        # acknowledgements already written before the kill still count
        for line in proc.stdout:
            kind, _, name = line.strip().partition(" ")
            (acked if kind == "ack" else armed).add(name)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "the publisher ended before it was killed"
    return acked, armed


@pytest.fixture(params=["file", "postgres"])
def drill_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return str(tmp_path / "drill.db")
    cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
    return cluster.create_database()  # empty: the publisher's open migrates it


async def test_sigkill_mid_load_loses_no_acknowledged_event_and_timers_fire_once(
    drill_db: str, nursery: trio.Nursery
) -> None:
    db = drill_db
    acked, armed = await trio.to_thread.run_sync(run_until_killed, db, 400)
    assert len(acked) >= 400
    assert armed == {f"t{i}" for i in range(5)}

    driver = RuntimeDriver(nursery, db)
    await driver.start()
    rt = driver.runtime
    events = await rt.events(limit=100_000)
    delivered = [e.delivery_id for e in events if e.type == "drill.event"]
    assert len(delivered) == len(set(delivered)), "an event was stored twice"
    assert acked <= set(delivered), f"{len(acked - set(delivered))} acknowledged events were lost"
    assert [e.seq for e in events] == sorted(e.seq for e in events)

    # every pending timer survived the kill and fires exactly once, in deadline order
    driver.clock.advance(6 * HOUR)

    async def all_fired() -> bool:
        return all([len(await rt.firings(f"t{i}")) == 1 for i in range(5)])

    await driver.until(all_fired, "the five timers to fire after the restart")
    await driver.reopen()
    rt = driver.runtime
    driver.clock.advance(HOUR)
    await driver.settle()
    ticks = [e for e in await rt.events(limit=100_000) if e.type == "drill.tick"]
    assert [e.delivery_id for e in ticks] == [f"t{i}" for i in range(5)]
    assert all([len(await rt.firings(f"t{i}")) == 1 for i in range(5)])
    assert all([(await rt.timer(f"t{i}")).state is loom.TimerState.FIRED for i in range(5)])
    await driver.stop()
