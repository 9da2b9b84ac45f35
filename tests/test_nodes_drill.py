"""The multi-node drill: three node processes on one PostgreSQL database under load, one of them
SIGKILLed at a random moment and started again, ten times.

Afterwards nothing acknowledged is lost or stored twice: every acknowledged Event is stored once
(also those every node offered), every acknowledged timer fires exactly once with one Event, every
key has one Work and each Work's inputs are routed in acceptance order.

Catches: an acknowledgement before the commit, a timer fired by two nodes (or by a node and its
successor), a timer of a killed node that nobody fires, an Event offered on two nodes stored twice,
a key given a Work on two nodes.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from pathlib import Path

import trio

from loom import Config, ManualClock, open_runtime
from loom.testing import T0_MS, raw
from loom.testing.postgres import PostgresCluster

CHILD = Path(__file__).parent / "drills" / "node.py"
NODES, CYCLES = 3, 10
DAY = 86_400_000
WAIT_S = 180


class Node:
    """One node process and everything it acknowledged, over all its generations."""

    def __init__(self, db: str, name: str) -> None:
        self.db, self.name, self.generation = db, name, 0
        self.acked: set[str] = set()
        self.armed: set[str] = set()
        self.count = 0
        self.changed = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self.reader: threading.Thread | None = None

    def start(self) -> None:
        self.generation += 1
        start_ms = T0_MS + self.generation * 1_000_000
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), self.db, self.name, str(self.generation), str(start_ms)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        self.reader = threading.Thread(target=self._read, args=(self.proc,), daemon=True)
        self.reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            kind, _, name = line.strip().partition(" ")
            with self.changed:
                if kind == "ack":
                    self.acked.add(name)
                    self.count += 1
                elif kind == "armed":
                    self.armed.add(name)
                self.changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self.changed:
            ok = self.changed.wait_for(lambda: self.count >= count or self._ended(), timeout=WAIT_S)
        assert ok, f"{self.name} acknowledged nothing more for {WAIT_S}s"
        assert not self._ended(), f"{self.name} exited ({self.proc and self.proc.poll()})"

    def _ended(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def kill(self) -> None:
        assert self.proc is not None
        assert self.reader is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.reader.join()  # acknowledgements written before the kill still count
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert self.proc.returncode == -signal.SIGKILL, f"{self.name} ended before it was killed"


def drill(db: str, seed: int) -> list[Node]:
    rng = random.Random(seed)
    nodes = [Node(db, f"node{i}") for i in range(NODES)]
    try:
        for node in nodes:
            node.start()
        for _ in range(CYCLES):
            victim = rng.choice(nodes)
            victim.wait_for(victim.count + rng.randint(10, 60))
            victim.kill()
            victim.start()
        for node in nodes:
            node.wait_for(node.count + 10)  # the last one restarted is under load again
    finally:
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.kill()
    return nodes


async def test_three_nodes_with_one_killed_ten_times_lose_nothing_and_duplicate_nothing(
    loom_postgres: PostgresCluster,
) -> None:
    db = loom_postgres.create_database()  # empty: the nodes opening it together migrate it once
    nodes = await trio.to_thread.run_sync(drill, db, 20261130)
    acked = set().union(*(n.acked for n in nodes))
    armed = set().union(*(n.armed for n in nodes))
    assert len(acked) > 500
    assert len(armed) > 30

    # a last node, later than every other clock, fires what is still due and routes what is left
    clock = ManualClock(start_ms=T0_MS + 100 * DAY)
    config = Config.from_toml(
        '[[scopes.drill.routes]]\nname = "orders"\ntypes = ["drill.*"]\ncreate_work = true\n'
    )
    async with open_runtime(db, clock=clock, config=config, owner="checker", load_entry_points=False) as rt:
        left: dict[str, int] = {}
        with trio.move_on_after(WAIT_S):
            async with rt.watch() as notices:
                while True:
                    before, left = (
                        left,
                        raw.query(
                            db,
                            "SELECT (SELECT count(*) FROM timers WHERE state = 'armed') AS armed,"
                            " (SELECT count(*) FROM events) - (SELECT count(*) FROM checkpoints) AS unrouted",
                        )[0],
                    )
                    if left["armed"] == 0 and left["unrouted"] == 0:
                        break
                    if left == before:
                        clock.advance(1000)  # no progress since the last commit: a rescan
                    await notices.__anext__()
        stuck = raw.query(
            db,
            "SELECT e.seq, e.type, e.key, e.delivery_id FROM events e LEFT JOIN checkpoints c ON c.event_id = e.id"
            " WHERE c.event_id IS NULL ORDER BY e.seq LIMIT 5",
        )
        notes = raw.query(db, "SELECT kind, subject, message FROM diagnostics ORDER BY id DESC LIMIT 5")
        assert left == {"armed": 0, "unrouted": 0}, f"left behind: {left}; first unrouted {stuck}; {notes}"

    stored = raw.query(db, "SELECT delivery_id, count(*) AS n FROM events GROUP BY delivery_id")
    assert all(r["n"] == 1 for r in stored), "an Event stored twice"
    lost = acked - {r["delivery_id"] for r in stored}
    assert lost == set(), f"{len(lost)} acknowledged Events lost"

    firings = raw.query(db, "SELECT timer_id, count(*) AS n FROM timer_firings GROUP BY timer_id")
    fired = {r["timer_id"]: r["n"] for r in firings}
    assert armed <= set(fired), f"{len(armed - set(fired))} acknowledged timers never fired"
    assert set(fired.values()) == {1}, "a timer occurrence fired twice"
    ticks = raw.query(db, "SELECT delivery_id FROM events WHERE type = 'drill.tick'")
    assert sorted(r["delivery_id"] for r in ticks) == sorted(fired), "one Event per firing"

    keys = raw.query(db, "SELECT key, count(DISTINCT work_id) AS n FROM work_keys GROUP BY key")
    assert len(keys) == 7
    assert {r["n"] for r in keys} == {1}, "a key with two Works"
    routed = raw.query(
        db, "SELECT work_id, commit_seq FROM checkpoints WHERE work_id IS NOT NULL ORDER BY seq"
    )
    order: dict[str, list[int]] = {}
    for row in routed:
        order.setdefault(row["work_id"], []).append(row["commit_seq"])
    assert all(seqs == sorted(seqs) for seqs in order.values()), "a Work's inputs routed out of order"
