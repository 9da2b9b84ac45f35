"""The multi-node drill: three node processes on one PostgreSQL database under load, one of them
SIGKILLed at a random moment and started again, ten times (each node: tests/drills/node.py). The same
drill runs one node on a SQLite file (a file is one process's), killed and restarted ten times: there
the restart recovers what the killed process held, and what each commit knew for the next (a Work's
records, attempts' rows, owners, pending inputs) is lost with the process.

Afterwards nothing acknowledged is lost or done twice:

* every acknowledged Event is stored once (also those every node offered), every key has one Work,
  and each Work's inputs are routed in acceptance order;
* every acknowledged timer fires exactly once, with one Event;
* every job waits at most once (not at all if its reply came before it waited); a wait is woken
  exactly once, by the first of its reply and its timeout to be accepted, and continued by exactly
  one attempt; every job ends completed (by one more attempt only when its reply lost to its timeout);
* no attempt is started twice under one lease epoch, on any node; every completion the store holds is
  one a node made at that epoch; no attempt is left live;
* attempts the killed node held are recovered by the other nodes while the drill runs (the drill's
  executor cannot adopt an attempt another process ran, so they fail into retry; one never handed to
  its executor would be relaunched); on the file, by the node's own restart.

Catches: an acknowledgement before the commit, a timer fired by two nodes (or by a node and its
successor), a timer of a killed node that nobody fires, an Event offered on two nodes stored twice, a
key given a Work on two nodes, a claim two nodes both win, a wait woken twice (two continuations) or
never, a recovery that keeps the old epoch or that two nodes both win, a stale holder's completion
committed after a recovery, attempts of a killed node that only its own restart recovers; on the
file too (put in and seen to fail there): a recovery that keeps the old epoch.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import trio
from drills.node import CONFIG, LEASE_MS, WAKES, Steps, has_timeout, reply

from loom import OffsetClock, open_runtime
from loom.testing import raw
from loom.testing.postgres import PostgresCluster

CHILD = Path(__file__).parent / "drills" / "node.py"
NODES, CYCLES = 3, 10
SEED = int(os.environ.get("LOOM_DRILL_SEED", "20261130"))  # another seed: other kill moments
DAY = 86_400_000
WAIT_S = 180

Step = tuple[str, str, str]
"""An attempt's ``(work_id, attempt, epoch)`` as a node printed it."""


class Node:
    """One node process and everything it acknowledged and ran, over all its generations."""

    def __init__(self, db: str, name: str) -> None:
        self.db, self.name, self.generation = db, name, 0
        self.acked: set[str] = set()
        self.armed: set[str] = set()
        self.started: list[tuple[Step, str]] = []
        """Each attempt this node began, with the owner name of the process that ran it."""
        self.done: set[Step] = set()
        self.count = 0
        self.changed = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self.reader: threading.Thread | None = None

    @property
    def owner(self) -> str:
        return f"{self.name}.{self.generation}"

    def start(self) -> None:
        self.generation += 1
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), self.db, self.name, str(self.generation), str(SEED)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ},
        )
        self.reader = threading.Thread(target=self._read, args=(self.proc, self.owner), daemon=True)
        self.reader.start()

    def _read(self, proc: subprocess.Popen[str], owner: str) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            kind, *rest = line.split()
            with self.changed:
                if kind == "ack":
                    self.acked.add(rest[0])
                    self.count += 1
                elif kind == "armed":
                    self.armed.add(rest[0])
                elif kind == "started":
                    self.started.append(((rest[0], rest[1], rest[2]), owner))
                elif kind == "done":
                    self.done.add((rest[0], rest[1], rest[2]))
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
        self.reader.join()  # what it printed before the kill still counts
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert self.proc.returncode == -signal.SIGKILL, f"{self.name} ended before it was killed"


def drill(db: str, seed: int, count: int = NODES) -> list[Node]:
    rng = random.Random(seed)
    nodes = [Node(db, f"node{i}") for i in range(count)]
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


async def finish(db: str) -> tuple[list[tuple[Step, str]], set[Step]]:
    """A last node, a day later than the others' clocks, recovers what the last nodes held, replies
    to every job (also those whose start a node committed but was killed before it printed the
    acknowledgement) and runs until nothing is left: no timer armed, no Event unrouted, every job done.
    Its clock runs in real time from there: the retry backoffs and wait timeouts still to come are
    short, and a clock moved on by hand would expire the leases it holds itself."""
    checked: list[tuple[Step, str]] = []
    done: set[Step] = set()

    def report(line: str) -> None:
        kind, work, attempt, epoch = line.split()
        if kind == "started":
            checked.append(((work, attempt, epoch), "checker"))
        else:
            done.add((work, attempt, epoch))

    clock = OffsetClock()
    clock.shift(DAY)
    steps = Steps(str(SEED), report)
    async with open_runtime(
        db, clock=clock, config=CONFIG, plugins=[steps], owner="checker", lease_ms=LEASE_MS,
        load_entry_points=False,
    ) as rt:  # fmt: skip
        steps.open(rt)
        for start in raw.query(db, "SELECT key FROM events WHERE type = 'drill.start' ORDER BY seq"):
            await rt.publish(reply(start["key"]))
        left: dict[str, int] = {}
        with trio.move_on_after(WAIT_S):
            async with rt.watch() as notices:
                while True:
                    left = raw.query(db, LEFT)[0]
                    if not any(left.values()):
                        break
                    await notices.__anext__()
        stuck = raw.query(
            db,
            "SELECT e.seq, e.type, e.key FROM events e LEFT JOIN checkpoints c ON c.event_id = e.id"
            " WHERE c.event_id IS NULL ORDER BY e.seq LIMIT 5",
        )
        notes = raw.query(db, "SELECT kind, subject, message FROM diagnostics ORDER BY id DESC LIMIT 5")
        assert not any(left.values()), (
            f"left behind: {left}; first unrouted {stuck}; {notes}; {unfinished(db)}"
        )
    return checked, done


def unfinished(db: str) -> list[object]:
    """The first jobs not completed, with their attempts, waits and inputs (for a failure message)."""
    found: list[object] = []
    for work in raw.query(
        db,
        "SELECT w.id, w.state, w.held, w.hold_reason, w.retry, w.attempts FROM works w"
        " JOIN work_keys k ON k.work_id = w.id WHERE k.key LIKE 'job/%' AND w.state <> 'completed' LIMIT 3",
    ):
        of = (work["id"],)
        found.append({
            **work,
            "attempts": raw.query(db, "SELECT attempt, epoch, state, owner, expires_at_ms, outcome"
                                      " FROM executions WHERE work_id = ? ORDER BY attempt", of),
            "waits": raw.query(db, "SELECT state, after_seq, timeout_at_ms, winner_event_id FROM waits"
                                   " WHERE work_id = ?", of),
            "inputs": raw.query(db, "SELECT i.seq, i.state, e.type FROM work_inputs i"
                                    " JOIN events e ON e.id = i.event_id WHERE i.work_id = ? ORDER BY i.seq", of),
            "timers": raw.query(db, "SELECT id, state, fire_at_ms FROM timers WHERE work_id = ?", of),
        })  # fmt: skip
    return found


LEFT = (
    "SELECT (SELECT count(*) FROM timers WHERE state = 'armed') AS armed,"
    " (SELECT count(*) FROM events) - (SELECT count(*) FROM checkpoints) AS unrouted,"
    " (SELECT count(*) FROM works w JOIN work_keys k ON k.work_id = w.id"
    "  WHERE k.key LIKE 'job/%' AND w.state <> 'completed') AS jobs"
)


async def test_three_nodes_with_one_killed_ten_times_lose_nothing_and_do_nothing_twice(
    loom_postgres: PostgresCluster,
) -> None:
    db = loom_postgres.create_database()  # empty: the nodes opening it together migrate it once
    nodes = await trio.to_thread.run_sync(drill, db, SEED)
    await check_drill(db, nodes)
    check_recovered_by_others(db, [s for n in nodes for s in n.started])


async def test_one_node_on_a_file_killed_ten_times_loses_nothing_and_does_nothing_twice(
    tmp_path: Path,
) -> None:
    """The drill on SQLite: one node at a time (the file is one process's), killed and started again;
    what it held is recovered by its own restart. On a file alone a runtime keeps what each commit
    knew for the next (a Work's records, attempts' rows, owners, pending inputs): a kill loses all of
    it, and the restart starts from the file."""
    db = str(tmp_path / "drill.db")
    nodes = await trio.to_thread.run_sync(drill, db, SEED, 1)
    await check_drill(db, nodes)


async def check_drill(db: str, nodes: list[Node]) -> None:
    """What every drill must leave: nothing acknowledged lost or done twice (see the module)."""
    acked = set().union(*(n.acked for n in nodes))
    armed = set().union(*(n.armed for n in nodes))
    starts = {d for d in acked if d.startswith("start-")}
    # the drill ran under load: each of its ten kills came after at least ten more acknowledgements
    # (a drill that ran under another seed may have waited for few more than that)
    assert len(acked) > 100
    assert len(armed) > 30
    assert len(starts) > 30
    checked, finished = await finish(db)

    stored = raw.query(db, "SELECT delivery_id, count(*) AS n FROM events GROUP BY delivery_id")
    assert all(r["n"] == 1 for r in stored), "an Event stored twice"
    lost = acked - {r["delivery_id"] for r in stored}
    assert lost == set(), f"{len(lost)} acknowledged Events lost"

    firings = raw.query(db, "SELECT timer_id, count(*) AS n FROM timer_firings GROUP BY timer_id")
    fired = {r["timer_id"]: r["n"] for r in firings}
    assert armed <= set(fired), f"{len(armed - set(fired))} acknowledged timers never fired"
    assert set(fired.values()) == {1}, "a timer occurrence fired twice"
    ticks = raw.query(db, "SELECT delivery_id FROM events WHERE type = 'drill.tick'")
    timeouts = raw.query(db, "SELECT count(*) AS n FROM events WHERE type = 'core.wait.timeout'")[0]["n"]
    retries = raw.query(db, "SELECT count(*) AS n FROM events WHERE type = 'core.retry.due'")[0]["n"]
    assert len(ticks) + timeouts + retries == len(fired), "one Event per firing"
    assert {r["delivery_id"] for r in ticks} == {t for t in fired if t.startswith("t-")}, (
        "a tick per drill timer"
    )

    keys = raw.query(db, "SELECT key, count(DISTINCT work_id) AS n FROM work_keys GROUP BY key")
    assert {r["n"] for r in keys} == {1}, "a key with two Works"
    assert len([r for r in keys if r["key"].startswith("order/")]) == 7
    jobs = {r["key"] for r in keys if r["key"].startswith("job/")}
    assert {"job/" + s.removeprefix("start-") for s in starts} <= jobs, "an acknowledged job without its Work"
    routed = raw.query(
        db,
        "SELECT c.work_id, c.seq, c.commit_seq, c.route, e.type FROM checkpoints c"
        " JOIN events e ON e.id = c.event_id WHERE c.work_id IS NOT NULL AND e.source <> 'core'"
        " ORDER BY c.seq",
    )
    order: dict[str, list[dict[str, object]]] = {}
    for row in routed:
        order.setdefault(str(row["work_id"]), []).append(row)
    # (loom's own Events, such as a wake's bridge, are checkpointed in the transaction that made them)
    behind = [
        (a, b)
        for rows in order.values()
        for a, b in itertools.pairwise(rows)
        if int(str(a["commit_seq"])) > int(str(b["commit_seq"]))
    ]
    assert not behind, f"a Work's inputs routed out of order: {behind[:3]}"

    started = [s for n in nodes for s in n.started] + checked
    twice = [step for step, n in Counter(step for step, _ in started).items() if n > 1]
    assert not twice, f"attempts started twice under one epoch: {twice[:5]}"
    done = finished.union(*(n.done for n in nodes))
    check_jobs(db, jobs, {step for step, _ in started}, done)


def check_jobs(db: str, jobs: set[str], started: set[Step], done: set[Step]) -> None:
    """Every job: at most one wait, woken once by its first candidate, continued by one attempt;
    completed once (twice when its reply arrived as input after an attempt that saw it accepted, or
    after its timeout won: the reply triggers one more attempt), each completion made by a node at the
    epoch the store holds; attempt numbers without a gap; nothing live."""
    executions = raw.query(
        db,
        "SELECT k.key, x.work_id, x.attempt, x.epoch, x.state, x.owner, x.trigger_id, x.outcome,"
        " e.type AS trigger"
        " FROM executions x JOIN work_keys k ON k.work_id = x.work_id LEFT JOIN events e ON e.id = x.trigger_id"
        " WHERE k.key LIKE 'job/%' ORDER BY x.work_id, x.attempt",
    )
    waits = raw.query(
        db,
        "SELECT w.work_id, w.state, w.after_seq, w.winner_event_id, e.type, e.seq AS winner_seq,"
        " (SELECT min(c.seq) FROM events c JOIN work_keys k ON k.key = c.key"
        "   WHERE k.work_id = w.work_id AND c.type = 'drill.reply' AND c.seq > w.after_seq) AS reply_seq"
        " FROM waits w LEFT JOIN events e ON e.id = w.winner_event_id",
    )
    replied = {
        str(r["work_id"])
        for r in raw.query(
            db,
            "SELECT k.work_id FROM events e JOIN work_keys k ON k.key = e.key WHERE e.type = 'drill.reply'",
        )
    }
    by_work: dict[str, list[dict[str, object]]] = {}
    for row in executions:
        by_work.setdefault(str(row["work_id"]), []).append(row)
    waits_of: dict[str, list[dict[str, object]]] = {}
    for row in waits:
        waits_of.setdefault(str(row["work_id"]), []).append(row)
    assert len(by_work) == len(jobs), "a job that never ran"
    for work_id, runs in by_work.items():
        assert [r["attempt"] for r in runs] == list(range(1, len(runs) + 1)), f"attempt gap in {work_id}"
        assert not [r for r in runs if r["state"] in ("running", "stopping", "recovering")], work_id
        for run in runs:
            if run["state"] == "completed":
                step = (work_id, str(run["attempt"]), str(run["epoch"]))
                assert step in started, f"a completion of an attempt no node began at that epoch: {step}"
                assert step in done, f"a completion no node made at that epoch: {step}"
        for run in runs:
            assert run["state"] in ("completed", "failed", "waited"), (work_id, run["state"])
            if run["state"] == "failed":
                outcome = json.loads(str(run["outcome"]))
                assert outcome.get("recovery") is True, f"{work_id} failed other than by recovery: {outcome}"
                ran = [int(e) for w, a, e in started if (w, a) == (work_id, str(run["attempt"]))]
                assert int(str(run["epoch"])) > max(ran, default=0), (
                    f"{work_id} attempt {run['attempt']} recovered at epoch {run['epoch']}, not above {ran}"
                )
        completed = [r for r in runs if r["state"] == "completed"]
        waited = waits_of.get(work_id, [])
        assert len(waited) <= 1, f"{work_id} waited {len(waited)} times"
        # the Work completes once, and once more only for its reply arriving as input after an attempt
        # saw it accepted (or after its timeout won): the reply starts one more attempt (retried, if a
        # kill fails it), and one Event starts only one
        assert completed, f"{work_id} never completed"
        (first, *extra) = completed
        story = [(r["attempt"], r["epoch"], r["state"], r["trigger"], r["owner"]) for r in runs]
        later = [r for r in runs if int(str(r["attempt"])) > int(str(first["attempt"]))]
        assert len(extra) == (1 if later else 0), f"{work_id} completed by {len(completed)} attempts: {story}"
        if later:
            assert later[0]["trigger"] == "drill.reply", f"{work_id} ran again after completing: {story}"
            assert all(r["trigger"] == "core.retry.due" for r in later[1:]), story
            assert later[-1]["state"] == "completed", story
        if not waited:  # its reply came before it waited
            assert work_id in replied, f"{work_id} completed with neither its reply nor a wait"
            continue
        (wait,) = waited
        assert wait["state"] == "woken", f"{work_id}'s wait ended {wait['state']}"
        assert wait["type"] in WAKES
        if not has_timeout(work_id):
            assert wait["type"] == "drill.reply", f"{work_id} woken by {wait['type']} without a timeout"
        if wait["type"] == "drill.reply":
            assert wait["winner_seq"] == wait["reply_seq"], f"{work_id}: its reply is not the winner"
        else:  # the timeout won: it was accepted before any reply
            assert wait["reply_seq"] is None or int(str(wait["reply_seq"])) > int(str(wait["winner_seq"])), (
                f"{work_id}: its timeout won over a reply accepted before it"
            )
        continued = [r for r in runs if r["trigger_id"] == wait["winner_event_id"]]
        assert len(continued) == 1, f"{work_id}'s wake continued by {len(continued)} attempts"
        assert int(str(first["attempt"])) >= int(str(continued[0]["attempt"])), (
            f"{work_id} done before its wake"
        )
        assert all(r["trigger_id"] != wait["winner_event_id"] for r in extra), f"{work_id}: its winner twice"
    kinds = Counter(str(w["type"]) for w in waits)
    assert kinds["drill.reply"] > 0, "no wait was woken by its reply: the drill exercised no wake"
    assert kinds["core.wait.timeout"] > 0, "no wait was woken by its timeout"


def check_recovered_by_others(db: str, started: list[tuple[Step, str]]) -> None:
    """Attempts a node began and lost to a kill were recovered, during the drill, by another node: a
    later epoch of the same attempt ran on another node (a relaunch) or the attempt was failed there
    as not adoptable."""
    first: dict[tuple[str, str], tuple[int, str]] = {}
    for (work, attempt, epoch), owner in started:
        seen = first.get((work, attempt))
        if seen is None or int(epoch) < seen[0]:
            first[(work, attempt)] = (int(epoch), owner)
    node = lambda owner: owner.partition(".")[0]  # noqa: E731
    relaunched = {
        (work, attempt)
        for (work, attempt, epoch), owner in started
        if int(epoch) > first[(work, attempt)][0] and node(owner) != node(first[(work, attempt)][1])
    }
    failed = raw.query(db, "SELECT work_id, attempt, owner, outcome FROM executions WHERE state = 'failed'")
    failed_elsewhere = {
        (r["work_id"], str(r["attempt"]))
        for r in failed
        if (r["work_id"], str(r["attempt"])) in first
        and r["owner"] != "checker"
        and node(str(r["owner"])) != node(first[(r["work_id"], str(r["attempt"]))][1])
    }
    assert relaunched | failed_elsewhere, "no attempt of a killed node was recovered by another node"
