"""Crash points through compaction (docs/testing.md "Crash points"; docs/operations.md "Retention").

A store is prepared once, with everything compaction meets: finished Works (one named by an armed
timer), a held Work whose input is pending, a running attempt and a waiting Work with Events on their
keys that a wait may still find, a standing Work with attempts to trim, a fired one-shot timer, a
recurring timer with a ledger, diagnostics and causal buckets; then its clock moves past the
retention. Compaction then runs in small pages (two rows per kind of row per pass, so every kind of
removal spans several commits), and the storage actor is stopped just before or just after the commit
of one of its batches, for every batch (counted in a run without a crash). A fresh runtime on the
store finishes the compaction. Checked after the crash, after the finish, and against the run without
a crash, from the database itself (`loom.testing.raw`):

* nothing accepted twice: each acknowledged delivery is stored once, as its Event or as its tombstone,
  always with the sequence it was acknowledged with; a redelivery answers with that sequence;
* nothing referred to is lost: the foreign keys hold, every Event at or below the routing watermark
  has its checkpoint, and each Event something still refers to (a pending input, a live attempt's
  trigger, one a running or waiting Work may still find) is there;
* a timer once fired never fires again: its old firing identities are stale, and arming it again
  goes on from its revision;
* the store ends as the run without a crash leaves it: the same rows in every table.

Wrong implementation this test catches (put in and seen to fail here): a removal whose tombstone is
written in a later transaction than its Event's deletion (a crash in between forgets the identity: the
delivery is neither stored nor tombstoned). The other invariants hold without a crash too; a crash
point checks they hold at every commit in between.

On PostgreSQL (a database per run, copied from the prepared one) the crashes are fewer and chosen:
the first, a middle and the last batch at each boundary.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from loom import (
    CausalRefused,
    Completed,
    Config,
    EventIn,
    Runtime,
    StorageClosed,
    TimerSpec,
    Waiting,
    WaitSpec,
    open_runtime,
)
from loom.records.timers import FireRequest
from loom.store import TABLES
from loom.testing import T0_MS, ManualClock, raw
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint
from loom.testing.postgres import PostgresCluster

SCOPE = "shop"
HOUR = 3_600_000
MINUTE = 60_000
LATER = T0_MS + 3 * HOUR
"""When compaction runs: everything that ended in the preparation is past its one hour."""
PAGE = 2


def config() -> Config:
    return Config.from_dict(
        {
            "retention": {"works": "1h", "events": "1h", "timers": "1h", "diagnostics": "1h"},
            "causal": {"max_depth": 1},
            "work_kinds": {"always": {"standing": True}},
            "scopes": {
                SCOPE: {
                    "routes": [
                        {"name": "skip", "types": ["d.*"], "policy": "drop", "reason": "aside"},
                        {"name": "tick", "types": ["tick"], "create_work": True, "work_kind": "always"},
                        {"name": "orders", "types": ["order.*", "w.*", "t.*"], "create_work": True},
                    ]
                }
            },
        }
    )


def ev(delivery_id: str, key: str, type: str = "order.placed") -> EventIn:
    return EventIn(source="shop", delivery_id=delivery_id, type=type, scope=SCOPE, key=key)


@attrs.define
class Prepared:
    """What the preparation acknowledged: the test's memory of it."""

    seqs: dict[tuple[str, str], int] = attrs.Factory(dict)
    """(source, delivery id) -> the sequence it was acknowledged with (every Event of the store)."""
    referenced: dict[str, str] = attrs.Factory(dict)
    """Event id -> why it must stay."""
    fired: dict[FireRequest, str | None] = attrs.Factory(dict)
    """Each firing identity that fired -> the Event it accepted."""


async def prepare(store: str) -> Prepared:
    clock = ManualClock(start_ms=T0_MS)
    seen = Prepared()
    async with open_runtime(store, clock=clock, config=config(), actors=()) as rt:

        async def publish(event: EventIn) -> str:
            accepted = await rt.publish(event)
            await rt.poll()
            return accepted.id

        for n in range(3):
            await publish(ev(f"done-{n}", f"o/{n}"))
            work = await rt.work_for_key(f"o/{n}")
            await rt.complete(await rt.claim(work.id, owner="host"), Completed())
        await rt.arm(
            TimerSpec(id="remind", fire_at_ms=T0_MS + 9 * HOUR, source="shop", type="order.remind",
                      scope=SCOPE, work_id=(await rt.work_for_key("o/2")).id)
        )  # fmt: skip
        seen.referenced[await publish(ev("held", "o/held"))] = "a held Work's pending input"
        await rt.hold((await rt.work_for_key("o/held")).id, reason="stock")
        trigger = await publish(ev("run", "o/run"))
        running = await rt.claim((await rt.work_for_key("o/run")).id, owner="host", lease_ms=24 * HOUR)
        seen.referenced[trigger] = "a live attempt's trigger"
        seen.referenced[await publish(ev("run-aside", "o/run", "d.note"))] = "what a live attempt may wait on"
        await publish(ev("wait", "o/wait"))
        waiting = await rt.claim((await rt.work_for_key("o/wait")).id, owner="host")
        await rt.complete(waiting, Waiting(wait=WaitSpec(types=("w.go",))))
        seen.referenced[await publish(ev("wait-aside", "o/wait", "d.note"))] = (
            "what an open wait has not passed"
        )
        for n in range(3):
            await publish(ev(f"tick-{n}", "o/tick", "tick"))
            work = await rt.work_for_key("o/tick")
            await rt.complete(await rt.claim(work.id, owner="host"), Completed())
        await rt.arm(
            TimerSpec(id="once", fire_at_ms=T0_MS + MINUTE, source="shop", type="t.once", scope=SCOPE)
        )
        await rt.arm(
            TimerSpec(id="every", fire_at_ms=T0_MS + MINUTE, source="shop", type="t.every", scope=SCOPE,
                      interval_ms=10 * MINUTE)
        )  # fmt: skip
        for _ in range(6):
            clock.advance(10 * MINUTE)
            for f in (await rt.poll()).firings:
                seen.fired[FireRequest(timer_id=f.timer_id, revision=f.revision, fire_at_ms=f.fire_at_ms)] = (
                    f.event_id
                )
        root = await rt.event_by_delivery("shop", "done-0")
        child = await rt.publish_derived(ev("child", "o/c", "d.child"), parent_id=root.id)
        with pytest.raises(CausalRefused):
            await rt.publish_derived(ev("grandchild", "o/c", "d.child"), parent_id=child.id)
        await rt.poll()
        for event in await rt.events(limit=1000):
            seen.seqs[(event.source, event.delivery_id)] = event.seq
        assert running.attempt == 1
    return seen


async def compact_all(rt: Runtime) -> None:
    """Sweeps until one removes nothing (a parent waits for its last child, a trigger for its attempt)."""
    for _ in range(20):
        if not (await rt.compact(limit=PAGE)).removed:
            return
    raise AssertionError("compaction does not converge")


@asynccontextmanager
async def reopened(store: str, fault: Any = None) -> AsyncIterator[Runtime]:
    async with open_runtime(
        store, clock=ManualClock(start_ms=LATER), config=config(), actors=(), fault=fault
    ) as rt:
        yield rt


def check(store: str, prepared: Prepared) -> dict[str, int]:
    """The invariants, read from the database; the rows per table."""
    with raw.snapshot(store) as db:
        identity = "SELECT source, delivery_id, seq FROM"
        stored = {(r["source"], r["delivery_id"]): r["seq"] for r in db.query(f"{identity} events")}
        buried = {(r["source"], r["delivery_id"]): r["seq"] for r in db.query(f"{identity} event_tombstones")}
        assert not set(stored) & set(buried), "an Event is both stored and tombstoned"
        for key, seq in prepared.seqs.items():
            found = stored.get(key, buried.get(key))
            assert found == seq, f"{key}: acknowledged as {seq}, the store says {found}"
        ids = {r["id"] for r in db.query("SELECT id FROM events")}
        for event_id, why in prepared.referenced.items():
            assert event_id in ids, f"removed {why} ({event_id})"
        watermark = json.loads(db.value("SELECT value FROM kv WHERE namespace = 'core.routing'"))["seq"]
        unrouted = db.value(
            "SELECT count(*) FROM events e WHERE e.seq <= ? AND NOT EXISTS"
            " (SELECT 1 FROM checkpoints c WHERE c.event_id = e.id)",
            (watermark,),
        )
        assert unrouted == 0, "an Event at or below the routing watermark lost its checkpoint"
        for child, column, parent in FOREIGN_KEYS:
            orphans = db.value(
                f"SELECT count(*) FROM {child} c WHERE c.{column} IS NOT NULL AND NOT EXISTS"
                f" (SELECT 1 FROM {parent[0]} p WHERE p.{parent[1]} = c.{column})"
            )
            assert orphans == 0, f"{child}.{column} names a missing {parent[0]}"
        return {table: db.value(f"SELECT count(*) FROM {table}") for table in TABLES}


FOREIGN_KEYS = (
    ("checkpoints", "event_id", ("events", "id")),
    ("checkpoints", "work_id", ("works", "id")),
    ("work_inputs", "event_id", ("events", "id")),
    ("work_inputs", "work_id", ("works", "id")),
    ("executions", "work_id", ("works", "id")),
    ("executions", "trigger_id", ("events", "id")),
    ("intents", "event_id", ("events", "id")),
    ("waits", "execution_id", ("executions", "id")),
    ("timers", "parent_id", ("events", "id")),
    ("work_keys", "work_id", ("works", "id")),
    ("works", "parent_id", ("works", "id")),
)


async def answers_as_before(store: str, prepared: Prepared) -> None:
    """A redelivery of every acknowledged delivery answers with its sequence; no old firing fires."""
    async with reopened(store) as rt:
        last = max(prepared.seqs.values())
        for (source, delivery_id), seq in prepared.seqs.items():
            found = await rt.publish(attrs.evolve(ev(delivery_id, "o/again"), source=source))
            assert (found.duplicate, found.seq) == (True, seq), delivery_id
        for request, event_id in prepared.fired.items():
            assert (await rt.fire(request)).event_id in (None, event_id), f"{request} fired again"
        assert await rt.events(after_seq=last) == [], "something was accepted twice"
        again = await rt.arm(TimerSpec(id="once", fire_at_ms=LATER + MINUTE, source="shop", type="t.once",
                                       scope=SCOPE))  # fmt: skip
        assert again.revision == 2


@attrs.frozen
class Run:
    boundary: Boundary
    batch: int


async def crashed(store: str, prepared: Prepared, run: Run) -> bool:
    """Compaction with a crash at ``run``; whether the crash happened."""
    crash = CrashAt(run.boundary, run.batch)
    try:
        async with reopened(store, crash) as rt:
            await compact_all(rt)
    except BaseException as exc:
        if not _only_crash(exc):
            raise
    return crash.fired


def _only_crash(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        crash, rest = exc.split(CrashPoint)
        if rest is not None:
            _, unexpected = rest.split((StorageClosed, trio.Cancelled))
            if unexpected is not None:
                raise unexpected
        return crash is not None
    return isinstance(exc, CrashPoint)


def batches(store: str) -> int:
    """How many batches a whole compaction of the prepared store commits (counted, no crash)."""
    counted: list[int] = []

    def count(point: str, batch_no: int) -> None:
        if point == "after_commit":
            counted.append(batch_no)

    async def main() -> None:
        async with reopened(store, count) as rt:
            await compact_all(rt)

    trio.run(main)
    return max(counted)


Copy = Callable[[str], str]


def runs(total: int, sampled: bool) -> list[Run]:
    points = sorted({1, total // 2, total}) if sampled else range(1, total + 1)
    return [Run(boundary, n) for boundary in (BEFORE_COMMIT, AFTER_COMMIT) for n in points]


def crash_all(prepared_store: str, copy: Copy, *, sampled: bool) -> None:
    prepared = trio.run(prepare, prepared_store)
    reference = copy("reference")
    trio.run(_finish, reference)
    expected = check(reference, prepared)
    assert expected["events"] < len(prepared.seqs), "compaction removed no Event"
    assert expected["event_tombstones"] > 0
    total = batches(copy("count"))
    assert total >= 6, f"only {total} batches: the pages are too large to cross commits"
    for run in runs(total, sampled):
        store = copy(f"{run.boundary}-{run.batch}")
        assert trio.run(crashed, store, prepared, run), f"{run}: the crash did not happen"
        check(store, prepared)
        trio.run(_finish, store)
        assert check(store, prepared) == expected, f"{run}: the store ends unlike the run without a crash"
    trio.run(answers_as_before, reference, prepared)


async def _finish(store: str) -> None:
    async with reopened(store) as rt:
        await compact_all(rt)


def test_a_crash_at_any_commit_of_compaction_loses_nothing_referred_to_and_accepts_nothing_twice(
    tmp_path: Path,
) -> None:
    prepared = str(tmp_path / "prepared.db")

    def copy(name: str) -> str:
        path = tmp_path / f"{name}.db"
        for suffix in ("", "-wal"):
            if Path(prepared + suffix).exists():
                shutil.copy(prepared + suffix, str(path) + suffix)
        return str(path)

    crash_all(prepared, copy, sampled=False)


@pytest.mark.timeout(600)
def test_a_crash_at_sampled_commits_of_compaction_on_postgresql(loom_postgres: PostgresCluster) -> None:
    prepared_url = loom_postgres.create_database(template=loom_postgres.migrated_template())
    name = prepared_url.rsplit("/", 1)[1].split("?")[0]

    def copy(label: str) -> str:
        return loom_postgres.create_database(template=name)

    crash_all(prepared_url, copy, sampled=True)
