"""The storage actor (docs/architecture.md): group commit, per-request rollback, whole-batch storage
failure, replies and notices only after COMMIT, backpressure, shielded commits, and the store's
opening rules (pragmas, migrations, refusing a newer schema without writing)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from trio.testing import wait_all_tasks_blocked

from loom import (
    Config,
    EventIn,
    ManualClock,
    SchemaTooNew,
    StorageClosed,
    StorageError,
    TimerSpec,
    open_runtime,
)
from loom.notices import Lagged, LeaseExpiry, StoreChanged, TimerArmed
from loom.store import SCHEMA_VERSION, SQLiteStore, StorageActor, Store, Tx, as_store
from loom.store._actor import GUARDED_BATCHES
from loom.store._schema import MIGRATIONS, render
from loom.store._sqlite import WriterConnection
from loom.testing import T0_MS, raw
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint, storage_failure
from loom.testing.postgres import PostgresCluster

T0 = T0_MS
NS = "test"
GATE_TIMEOUT_S = 10


# -- procedures -------------------------------------------------------------


def put(tx: Tx, now_ms: int, key: str, notice: object = None) -> str:
    tx.kv_put(NS, key, {"key": key}, now_ms)
    if notice is not None:
        tx.notify(notice)
    return key


def put_all(tx: Tx, now_ms: int, key: str, notices: list[object]) -> str:
    for notice in notices:
        put(tx, now_ms, key, notice)
    return key


def put_then_raise(tx: Tx, now_ms: int, key: str, error: BaseException, notice: object = None) -> None:
    put(tx, now_ms, key, notice)
    raise error


def keys(tx: Tx, now_ms: int) -> list[str]:
    return [entry.key for entry in tx.kv_list(NS)]


class Gate:
    """A procedure that blocks its batch's worker thread until the test opens the gate."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._open = threading.Event()

    def proc(self, tx: Tx, now_ms: int, key: str | None = None) -> None:
        if key is not None:
            put(tx, now_ms, key)
        self.entered.set()
        assert self._open.wait(GATE_TIMEOUT_S), "the test never opened the gate"

    def open(self) -> None:
        self._open.set()

    async def wait_entered(self) -> None:
        await wait_for_thread_event(self.entered)


class Calls:
    """Runs submissions as tasks and records how each ended."""

    def __init__(self, actor: StorageActor, nursery: trio.Nursery) -> None:
        self.actor = actor
        self.nursery = nursery
        self.results: dict[str, Any] = {}
        self.errors: dict[str, BaseException] = {}
        self.scopes: dict[str, trio.CancelScope] = {}

    def start(self, name: str, proc: Any, *args: Any, how: str = "submit") -> None:
        scope = trio.CancelScope()
        self.scopes[name] = scope
        submit = getattr(self.actor, how)

        async def call() -> None:
            with scope:
                try:
                    self.results[name] = await submit(proc, *args)
                except Exception as exc:
                    self.errors[name] = exc

        self.nursery.start_soon(call)

    @property
    def finished(self) -> set[str]:
        return set(self.results) | set(self.errors)


async def wait_for_thread_event(event: threading.Event) -> None:
    """Wait (in a worker thread) until the storage actor's worker thread sets ``event``."""
    assert await trio.to_thread.run_sync(event.wait, GATE_TIMEOUT_S), "the worker thread never got there"


# -- fixtures ---------------------------------------------------------------


@pytest.fixture
def store(loom_store: str) -> Store:
    """The storage actor's store on each backend: SQLite ``:memory:``, a file, PostgreSQL."""
    return as_store(loom_store)


@pytest.fixture(params=["file", "postgres"])
def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A store a second connection can read: a file, or a PostgreSQL database."""
    if request.param == "file":
        return SQLiteStore(path=str(tmp_path / "loom.db"))
    cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
    return as_store(cluster.create_database(template=cluster.migrated_template()))


@pytest.fixture
def file_store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(path=str(tmp_path / "loom.db"))


async def start_actor(nursery: trio.Nursery, store: Store, **options: Any) -> StorageActor:
    actor: StorageActor = await nursery.start(StorageActor(store, ManualClock(start_ms=T0), **options).run)
    return actor


def raw_keys(store: Store) -> list[str]:
    """Read what is committed through a connection of its own (durable stores only)."""
    return [
        row["key"] for row in raw.query(store, "SELECT key FROM kv WHERE namespace = ? ORDER BY key", (NS,))
    ]


# -- group commit -----------------------------------------------------------


async def test_requests_submitted_together_share_one_batch(store: Store, nursery: trio.Nursery) -> None:
    actor = await start_actor(nursery, store)
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()  # the gate's batch is in its worker thread
    batches_before = actor.stats.batches

    names = [f"k{i:03}" for i in range(50)]
    for name in names:
        calls.start(name, put, name)
    await wait_all_tasks_blocked()
    assert calls.finished == set()
    gate.open()
    while calls.finished != {"gate", *names}:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()

    assert actor.stats.batches == batches_before + 2, "the gate's batch, then one batch for all fifty"
    assert actor.stats.largest_batch == 50
    assert calls.results == {"gate": None, **{name: name for name in names}}
    assert await actor.submit(keys) == names


async def test_concurrent_producers_started_together_are_batched(store: Store, nursery: trio.Nursery) -> None:
    actor = await start_actor(nursery, store)
    async with trio.open_nursery() as producers:
        for i in range(40):
            producers.start_soon(actor.submit, put, f"k{i:02}")
    assert actor.stats.requests == 40
    assert actor.stats.largest_batch > 1
    assert actor.stats.batches < 40
    assert len(await actor.submit(keys)) == 40


async def test_batch_size_is_bounded_by_max_batch(store: Store, nursery: trio.Nursery) -> None:
    actor = await start_actor(nursery, store, max_batch=4)
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()
    for i in range(10):
        calls.start(f"k{i}", put, f"k{i}")
    await wait_all_tasks_blocked()
    gate.open()
    while len(calls.finished) < 11:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()
    assert actor.stats.largest_batch == 4
    assert actor.stats.batches == 1 + 3  # gate, then 4 + 4 + 2


# -- relaxed commits --------------------------------------------------------


def put_seeing_level(tx: Tx, now_ms: int, key: str, touch: str | None = None) -> str:
    """Write ``key`` (and, with ``touch``, say a Work changed) and answer how this transaction's commit
    will wait: "relaxed" (SQLite synchronous NORMAL, PostgreSQL synchronous_commit off) or "full"."""
    put(tx, now_ms, key)
    if touch is not None:
        tx.touch(touch)
    if tx.dialect.name == "sqlite":
        (level,) = tx._conn.execute("PRAGMA synchronous").fetchone()
        return "relaxed" if level == 1 else "full"
    (setting,) = tx._conn.execute("SHOW synchronous_commit").fetchone()
    return "relaxed" if setting == "off" else "full"


async def test_a_relaxed_batch_alone_commits_without_waiting_for_the_disk_and_the_next_waits_again(
    durable_store: Store, nursery: trio.Nursery
) -> None:
    actor = await start_actor(nursery, durable_store)
    assert await actor.submit_relaxed(put_seeing_level, "a") == "relaxed"
    assert await actor.submit(put_seeing_level, "b") == "full", "the configured level came back"
    assert await actor.submit_relaxed(put_seeing_level, "c") == "relaxed"
    assert actor.stats.relaxed_batches == 2
    assert raw_keys(durable_store) == ["a", "b", "c"], "a relaxed commit is a commit"


async def test_a_relaxed_request_batched_with_any_other_write_waits_for_the_disk(
    durable_store: Store, nursery: trio.Nursery
) -> None:
    actor = await start_actor(nursery, durable_store)
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()
    calls.start("relaxed", put_seeing_level, "r", how="submit_relaxed")
    calls.start("read", keys, how="read")
    calls.start("write", put_seeing_level, "w")
    await wait_all_tasks_blocked()
    gate.open()
    while len(calls.finished) < 4:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()
    assert calls.results["relaxed"] == calls.results["write"] == "full"
    assert actor.stats.relaxed_batches == 0

    # with reads only beside it, it is relaxed
    calls.start("gate2", gate.proc)  # the gate is open: this batch passes at once
    await wait_all_tasks_blocked()
    calls.start("relaxed2", put_seeing_level, "r2", how="submit_relaxed")
    calls.start("read2", keys, how="read")
    while len(calls.finished) < 7:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()
    assert calls.results["relaxed2"] == "relaxed"
    assert calls.results["read2"] in (["r", "w"], ["r", "r2", "w"])


async def test_a_relaxed_request_that_leaves_anything_to_settle_runs_again_waiting_for_the_disk(
    durable_store: Store, nursery: trio.Nursery
) -> None:
    settled: list[list[str]] = []
    seen: list[str] = []

    def settle(tx: Tx, now_ms: int) -> None:
        settled.append(list(tx.touched))
        tx.touched.clear()

    def proc(tx: Tx, now_ms: int) -> str:
        seen.append(put_seeing_level(tx, now_ms, "k", touch="w-1"))
        return seen[-1]

    actor = await start_actor(nursery, durable_store, settle=settle)
    assert await actor.submit_relaxed(proc) == "full"
    assert seen == ["relaxed", "full"], "the relaxed run was undone and run again in full"
    assert settled == [["w-1"]], "the settle hook ran once, in the full run"
    assert actor.stats.relaxed_batches == 0
    assert raw_keys(durable_store) == ["k"]


# -- a request's own error --------------------------------------------------


async def test_a_failing_request_rolls_back_only_its_own_effects(store: Store, nursery: trio.Nursery) -> None:
    actor = await start_actor(nursery, store)
    feed = actor.feed()
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()
    boom = ValueError("this request's own logic refused it")
    calls.start("first", put, "first", "notice-first")
    calls.start("failing", put_then_raise, "failing", boom, "notice-failing")
    calls.start("last", put, "last", "notice-last")
    await wait_all_tasks_blocked()
    gate.open()
    while len(calls.finished) < 4:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()

    assert actor.stats.largest_batch == 3, "all three ran in one batch"
    assert calls.errors == {"failing": boom}
    assert calls.errors["failing"] is boom, "the caller gets its procedure's own exception"
    assert calls.results == {"gate": None, "first": "first", "last": "last"}
    assert await actor.submit(keys) == ["first", "last"]
    assert sorted(await feed.next_batch()) == ["notice-first", "notice-last"]
    assert actor.stats.failed_batches == 0
    assert actor.stats.guarded_reruns == 1, "the batch ran unguarded first, then again guarded"


class Counted:
    """A procedure that puts its key and counts how many times it ran (a batch may run it twice)."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}

    def proc(self, tx: Tx, now_ms: int, key: str) -> str:
        self.runs[key] = self.runs.get(key, 0) + 1
        return put(tx, now_ms, key)


async def run_together(actor: StorageActor, nursery: trio.Nursery, *submissions: tuple[Any, ...]) -> Calls:
    """Submit ``(name, proc, *args)`` each in this order, all in one batch (held behind a gate until all
    are in)."""
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()
    for name, proc, *args in submissions:
        calls.start(name, proc, *args)
        await wait_all_tasks_blocked()  # in the mailbox, in this order
    gate.open()
    while len(calls.finished) < len(submissions) + 1:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()
    return calls


async def test_a_batch_runs_unguarded_until_a_request_fails_then_guarded_for_a_while(
    store: Store, nursery: trio.Nursery
) -> None:
    """A batch runs without savepoints first; one in which a request fails runs again with them, and so
    do the next `GUARDED_BATCHES` from the start. Catches: every batch guarded (the failing batch's
    other request runs once, and nothing is ever rerun), an unguarded failure not run again (its
    batch's other request is lost), and no guarded spell (the next failing batch runs twice)."""
    actor = await start_actor(nursery, store)
    counted = Counted()
    boom = ValueError("refused")

    calls = await run_together(actor, nursery, ("a", counted.proc, "a"), ("b", counted.proc, "b"))
    assert calls.results == {"gate": None, "a": "a", "b": "b"}
    assert counted.runs == {"a": 1, "b": 1}
    assert actor.stats.guarded_reruns == 0

    calls = await run_together(actor, nursery, ("c", counted.proc, "c"), ("x", put_then_raise, "x", boom))
    assert calls.results == {"gate": None, "c": "c"}
    assert calls.errors == {"x": boom}
    assert counted.runs["c"] == 2, "the batch ran unguarded, met the failure, and ran again guarded"
    assert actor.stats.guarded_reruns == 1

    calls = await run_together(actor, nursery, ("d", counted.proc, "d"), ("y", put_then_raise, "y", boom))
    assert calls.errors == {"y": boom}
    assert counted.runs["d"] == 1, "the batch after a rerun runs guarded from the start"
    assert actor.stats.guarded_reruns == 1

    for i in range(GUARDED_BATCHES):
        await actor.submit(counted.proc, f"spell-{i}")
    calls = await run_together(actor, nursery, ("e", counted.proc, "e"), ("z", put_then_raise, "z", boom))
    assert calls.errors == {"z": boom}
    assert counted.runs["e"] == 2, "the guarded spell ended: the batch ran unguarded first again"
    assert actor.stats.guarded_reruns == 2
    assert await actor.submit(keys) == sorted(
        ["a", "b", "c", "d", "e", *(f"spell-{i}" for i in range(GUARDED_BATCHES))]
    )


# -- storage failure --------------------------------------------------------


def fail_storage(tx: Tx, now_ms: int, key: str, failure: Exception) -> None:
    put(tx, now_ms, key, "notice-storage")
    raise failure


def corrupt(store: str) -> Exception:
    if store.startswith("postgresql://"):
        return psycopg.errors.DataCorrupted("could not read block 0 of relation base/1/2")
    return sqlite3.DatabaseError("database disk image is malformed")


@pytest.mark.parametrize("make_failure", [storage_failure, corrupt], ids=["io-error", "corrupt"])
async def test_a_storage_error_fails_the_whole_batch_and_commits_nothing(
    store: Store, loom_store: str, nursery: trio.Nursery, make_failure: Callable[[str], Exception]
) -> None:
    failure = make_failure(loom_store)
    actor = await start_actor(nursery, store)
    feed = actor.feed()
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()
    calls.start("before", put, "before", "notice-before")
    calls.start("broken", fail_storage, "broken", failure)
    calls.start("after", put, "after", "notice-after")
    await wait_all_tasks_blocked()
    gate.open()
    while len(calls.finished) < 4:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()

    assert set(calls.errors) == {"before", "broken", "after"}
    for error in calls.errors.values():
        assert isinstance(error, StorageError)
        assert str(failure) in str(error)
        assert error.__cause__ is failure
    assert actor.stats.failed_batches == 1

    # The actor keeps serving: the next batch commits, and only its notices are published.
    assert await actor.submit(put, "next", "notice-next") == "next"
    assert await actor.submit(keys) == ["next"]
    assert await feed.next_batch() == ["notice-next"]


async def test_a_failed_commit_fails_every_caller_and_the_actor_serves_on(
    store: Store, loom_store: str, nursery: trio.Nursery
) -> None:
    failing_batches: set[int] = set()

    def fault(point: str, batch_no: int) -> None:
        if point == "before_commit" and batch_no in failing_batches:
            raise storage_failure(loom_store, "database or disk is full")

    actor = await start_actor(nursery, store, fault=fault)
    failing_batches.add(actor.stats.batches + 2)  # the batch after the gate's
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("gate", gate.proc)
    await wait_all_tasks_blocked()
    for name in ("a", "b", "c"):
        calls.start(name, put, name)
    await wait_all_tasks_blocked()
    gate.open()
    while len(calls.finished) < 4:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()

    assert set(calls.errors) == {"a", "b", "c"}
    assert all(isinstance(e, StorageError) and "disk is full" in str(e) for e in calls.errors.values())
    assert await actor.submit(put, "d") == "d"
    assert await actor.submit(keys) == ["d"]


async def test_a_commit_that_failed_forgets_everything_carried(
    file_store: SQLiteStore, nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A COMMIT that reports a failure may have landed all the same: the storage actor then forgets
    everything earlier commits left it (`Carried`), and the next transaction reads. Catches: what was
    carried outliving such a COMMIT (a Work's pending inputs answered as they were before an input
    that landed; tests/conftest.py's check of pending inputs fails that read too)."""
    actor = await start_actor(nursery, file_store)
    failing = threading.Event()
    execute = WriterConnection.execute

    def landed_then_failed(conn: WriterConnection, sql: str, parameters: object = (), /) -> object:
        cursor = execute(conn, sql, parameters)
        if sql == "COMMIT" and failing.is_set():
            failing.clear()
            raise sqlite3.OperationalError("database or disk is full")
        return cursor

    def new_work(tx: Tx, now_ms: int) -> None:  # (its empty pending inputs are carried)
        tx.insert_work(
            id="w", scope="s", kind=None, parent_id=None, predecessor_id=None, generation=1, now_ms=now_ms
        )

    def add_input(tx: Tx, now_ms: int) -> None:
        seq = tx.insert_event(
            id="e", source="t", delivery_id="d", type="t.e", scope="s", key=None, work_id=None,
            execution_id=None, payload_json="{}", parent_id=None, cause_id=None, root_id="e", depth=0,
            accepted_at_ms=now_ms,
        )  # fmt: skip
        assert seq is not None
        tx.add_input("w", "e", seq)
        failing.set()

    def pending(tx: Tx, now_ms: int) -> tuple[str, ...]:
        return tuple(tx.pending_inputs("w"))

    monkeypatch.setattr(WriterConnection, "execute", landed_then_failed)
    await actor.submit(new_work)
    with pytest.raises(StorageError, match="disk is full"):
        await actor.submit(add_input)
    assert await actor.submit(pending) == ("e",)


# -- replies and notices after commit --------------------------------------


async def test_the_reply_waits_for_the_commit(durable_store: Store, nursery: trio.Nursery) -> None:
    committing = threading.Event()
    resume = threading.Event()
    watched: set[int] = set()

    def fault(point: str, batch_no: int) -> None:
        if point == "before_commit" and batch_no in watched:
            committing.set()
            assert resume.wait(GATE_TIMEOUT_S)

    actor = await start_actor(nursery, durable_store, fault=fault)
    watched.add(actor.stats.batches + 1)
    calls = Calls(actor, nursery)
    calls.start("a", put, "a")
    await wait_for_thread_event(committing)
    await wait_all_tasks_blocked()
    assert calls.finished == set(), "no reply before COMMIT"
    assert raw_keys(durable_store) == [], "nothing is visible before COMMIT"
    resume.set()
    while not calls.finished:
        await wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()
    assert calls.results == {"a": "a"}
    assert raw_keys(durable_store) == ["a"]


async def test_feed_subscribers_see_notices_of_committed_requests_only(
    store: Store, loom_store: str, nursery: trio.Nursery
) -> None:
    actor = await start_actor(nursery, store)
    feed = actor.feed()
    other = actor.feed()
    await actor.submit(put, "a", "notice-a")
    with pytest.raises(KeyError):
        await actor.submit(put_then_raise, "b", KeyError("b"), "notice-b")
    with pytest.raises(StorageError):
        await actor.submit(fail_storage, "c", storage_failure(loom_store))
    await actor.submit(put, "d")  # no notice
    await actor.submit(put, "e", "notice-e")
    assert await feed.next_batch() == ["notice-a"]
    assert await feed.next_batch() == ["notice-e"]
    assert await other.next_batch() == ["notice-a"]
    assert await other.next_batch() == ["notice-e"]


async def test_a_feed_that_falls_behind_is_told_to_resynchronise(store: Store, nursery: trio.Nursery) -> None:
    actor = await start_actor(nursery, store)
    feed = actor.feed(capacity=1)
    await actor.submit(put, "a", "notice-a")
    await actor.submit(put, "b", "notice-b")  # no room: the feed lags
    assert feed.lagged
    assert await feed.next_batch() == [Lagged()], "Lagged means: rescan the store"
    assert await feed.next_batch() == ["notice-a"]


async def test_a_feed_that_wants_some_kinds_is_offered_only_batches_holding_one(
    store: Store, nursery: trio.Nursery
) -> None:
    """The timer and lease actors read a few kinds of notice; every other commit (an acceptance)
    used to wake them for nothing. Catches ``wants`` ignored (the first batch is offered), a batch
    held back when only one of its notices is wanted, or a wanted batch offered without its other
    notices, and another node's `StoreChanged` held back."""
    actor = await start_actor(nursery, store)
    timers = actor.feed(wants=(TimerArmed,))
    everything = actor.feed()
    armed = TimerArmed(timer_id="tm_1", revision=1, fire_at_ms=T0_MS)
    await actor.submit(put, "a", "notice-a")
    lease = LeaseExpiry(execution_id=None, expires_at_ms=T0_MS)
    await actor.submit(put, "b", lease)
    await actor.submit(put_all, "c", ["notice-c", armed])
    assert not timers.lagged
    assert await timers.next_batch() == ["notice-c", armed]
    actor.announce(StoreChanged(origin="node-2", timer_due_ms=T0_MS))
    assert await timers.next_batch() == [StoreChanged(origin="node-2", timer_due_ms=T0_MS)]
    assert not timers.pending
    assert [await everything.next_batch() for _ in range(4)] == [
        ["notice-a"],
        [lease],
        ["notice-c", armed],
        [StoreChanged(origin="node-2", timer_due_ms=T0_MS)],
    ]


async def test_a_feed_with_concerns_is_offered_a_batch_it_is_concerned_by_or_one_behind_unread_ones(
    store: Store, nursery: trio.Nursery
) -> None:
    """The router and the subscription reconciler ask, at each commit, whether its notices give them
    anything to do (an acceptance that routed its Events in its own commit gives the router nothing).
    What a subscriber learns from a batch it has not read yet may make a later batch concern it, so
    once one is offered every batch is, until it has read them all. Catches ``concerns`` ignored (the
    first batch offered), its answer inverted, and a batch held back while an earlier one is unread
    (the last ``["notice-b"]``)."""
    actor = await start_actor(nursery, store)
    asked: list[list[object]] = []

    def concerns(notices: list[object]) -> bool:
        asked.append(list(notices))
        return "notice-c" in notices

    feed = actor.feed(concerns=concerns)
    await actor.submit(put, "a", "notice-a")
    await actor.submit(put, "b", "notice-b")
    assert not feed.pending
    await actor.submit(put, "c", "notice-c")
    await actor.submit(put, "d", "notice-b")  # not its concern, yet an offered batch waits unread
    assert asked == [["notice-a"], ["notice-b"], ["notice-c"]], "asked only while nothing waits unread"
    assert await feed.next_batch() == ["notice-c"]
    assert await feed.next_batch() == ["notice-b"]
    assert not feed.pending
    await actor.submit(put, "e", "notice-b")
    assert not feed.pending, "read up: a batch that does not concern it is held back again"


# -- backpressure -----------------------------------------------------------


async def test_a_full_mailbox_blocks_senders_until_the_actor_drains(
    store: Store, nursery: trio.Nursery
) -> None:
    actor = await start_actor(nursery, store, max_batch=1, mailbox_size=1)
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("running", gate.proc, "running")
    await wait_all_tasks_blocked()
    calls.start("queued", put, "queued")  # takes the mailbox's one slot
    await wait_all_tasks_blocked()
    calls.start("blocked", put, "blocked")  # no room: blocks in send
    await wait_all_tasks_blocked()
    assert calls.finished == set()

    # Cancel both waiting callers. The queued request was handed over, so it still runs;
    # the blocked one was never accepted into the mailbox, so it never runs.
    calls.scopes["queued"].cancel()
    calls.scopes["blocked"].cancel()
    await wait_all_tasks_blocked()
    gate.open()
    assert await actor.submit(keys) == ["queued", "running"]

    # Once drained, senders get through again.
    assert await actor.submit(put, "later") == "later"


# -- cancellation -----------------------------------------------------------


async def test_a_caller_cancelled_while_its_batch_runs_still_has_its_effects_committed(
    store: Store, nursery: trio.Nursery
) -> None:
    actor = await start_actor(nursery, store)
    gate = Gate()
    calls = Calls(actor, nursery)
    calls.start("cancelled", gate.proc, "cancelled")
    await gate.wait_entered()
    calls.scopes["cancelled"].cancel()
    await wait_all_tasks_blocked()
    assert calls.scopes["cancelled"].cancelled_caught, "the caller stopped waiting"
    gate.open()
    assert await actor.submit(keys) == ["cancelled"]
    assert actor.stats.failed_batches == 0


async def test_submitting_to_a_stopped_actor_is_refused(store: SQLiteStore) -> None:
    async with trio.open_nursery() as nursery:
        actor = await start_actor(nursery, store)
        await actor.submit(put, "a")
        nursery.cancel_scope.cancel()
    with pytest.raises(StorageClosed):
        await actor.submit(put, "b")


# -- opening the store ------------------------------------------------------


def test_the_writer_uses_wal_and_full_sync_by_default(file_store: SQLiteStore) -> None:
    conn = file_store.open_writer()
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        # a page cache that holds a working set past SQLite's default 2 MiB (negative: KiB)
        assert conn.execute("PRAGMA cache_size").fetchone()[0] == -65_536
    finally:
        conn.close()


@pytest.mark.parametrize(("setting", "expected"), [("NORMAL", 1), ("normal", 1), ("FULL", 2), ("EXTRA", 3)])
def test_synchronous_is_configurable(tmp_path: Path, setting: str, expected: int) -> None:
    conn = SQLiteStore(path=str(tmp_path / "loom.db"), synchronous=setting).open_writer()
    try:
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == expected
    finally:
        conn.close()


def test_an_unknown_synchronous_setting_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SQLiteStore(path=str(tmp_path / "loom.db"), synchronous="OFF")


def schema_rows(path: str) -> list[tuple[int, ...]]:
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute("SELECT version FROM loom_schema"))
    finally:
        conn.close()


def test_opening_applies_and_records_every_migration_once(file_store: SQLiteStore) -> None:
    file_store.open_writer().close()
    assert schema_rows(file_store.path) == [(SCHEMA_VERSION,)]
    file_store.open_writer().close()
    assert schema_rows(file_store.path) == [(SCHEMA_VERSION,)]


async def test_the_actor_opens_a_migrated_store(store: Store, nursery: trio.Nursery) -> None:
    actor = await start_actor(nursery, store)

    def version(tx: Tx, now_ms: int) -> int:
        return int(tx._conn.execute("SELECT version FROM loom_schema").fetchone()[0])

    assert await actor.submit(version) == SCHEMA_VERSION


def schema_at(version: int) -> sqlite3.Connection:
    """An empty database made by the first ``version`` migrations."""
    conn = sqlite3.connect(":memory:")
    for migration in MIGRATIONS[:version]:
        conn.executescript(render(migration, "sqlite"))
    return conn


def undo_migration_19(conn: sqlite3.Connection) -> None:
    """Take a database made at the current schema back to version 18's timers (no arming order), for
    a test that fakes an older version: the migrations after it then run again on it."""
    conn.execute("DROP INDEX timers_armed_seq")
    conn.execute("DROP INDEX timers_due")
    conn.execute("ALTER TABLE timers DROP COLUMN armed_seq")
    conn.execute("CREATE INDEX timers_due ON timers (fire_at_ms, id, revision) WHERE state = 'armed'")


async def test_routing_checkpoints_keep_every_field_when_they_are_keyed_by_sequence(tmp_path: Path) -> None:
    """Migration 17 copies the checkpoints table to key it by the Event's sequence. Catches: a copy that
    loses a row or a column (the commit order above all: a Work's history is read in it), and reads
    that still look a checkpoint up by the Event's id (they would find nothing it did not index)."""
    path = str(tmp_path / "loom.db")
    cfg = Config.from_dict(
        {"scopes": {"s": {"routes": [{"name": "r", "types": ["t"], "create_work": True}]}}}
    )
    offer = [
        EventIn(source="src", delivery_id=f"d-{i}", type="t", scope="s", key="k", payload={})
        for i in range(3)
    ]
    async with open_runtime(path, clock=ManualClock(start_ms=T0), config=cfg, actors=()) as rt:
        first = [await rt.publish(offer[0]), await rt.publish(offer[1])]
        await rt.poll()
        before = [await rt.checkpoint(e.id) for e in first]
        work = (await rt.work_for_key("k")).id
    rows = raw.query(path, "SELECT * FROM checkpoints ORDER BY seq")
    old = schema_at(16)  # the table as it was: keyed by the Event's id
    ddl = [
        sql for (sql,) in old.execute("SELECT sql FROM sqlite_master WHERE tbl_name = 'checkpoints'") if sql
    ]
    conn = sqlite3.connect(path)
    with conn:
        undo_migration_19(conn)
        conn.execute("CREATE TABLE saved AS SELECT * FROM checkpoints")
        conn.execute("DROP TABLE checkpoints")
        for statement in ddl:
            conn.execute(statement)
        columns = ", ".join(r[1] for r in conn.execute("PRAGMA table_info(saved)"))
        conn.execute(f"INSERT INTO checkpoints ({columns}) SELECT {columns} FROM saved")
        conn.execute("DROP TABLE saved")
        assert [r[1] for r in conn.execute("PRAGMA table_info(checkpoints)") if r[5]] == ["event_id"]
        conn.execute("UPDATE loom_schema SET version = 16")
    conn.close()
    async with open_runtime(path, clock=ManualClock(start_ms=T0), config=cfg, actors=()) as rt:
        assert raw.query(path, "SELECT * FROM checkpoints ORDER BY seq") == rows
        assert [await rt.checkpoint(e.id) for e in first] == before
        third = await rt.publish(offer[2])
        assert await rt.checkpoint(third.id) is None
        await rt.poll()
        routed = await rt.checkpoint(third.id)
        assert routed is not None
        assert routed.work_id == work
        history = await rt.history(work)
        assert [c.event_id for c in history.checkpoints] == [first[0].id, first[1].id, third.id]
    assert schema_rows(path) == [(SCHEMA_VERSION,)]
    keyed = {
        r["name"]: r["pk"] for r in raw.query(path, "SELECT name, pk FROM pragma_table_info('checkpoints')")
    }
    assert (keyed["seq"], keyed["event_id"]) == (1, 0)


async def test_armed_timers_stay_due_when_the_due_index_takes_their_revision(tmp_path: Path) -> None:
    """Migration 18 makes the due index again with each timer's revision in it. Catches: an index
    dropped and not made again (every due query names it), one that misses a timer armed before the
    upgrade, and one without the revision (a due query then reads each due timer's row too)."""
    path = str(tmp_path / "loom.db")
    async with open_runtime(path, clock=ManualClock(start_ms=T0), actors=()) as rt:
        for i in range(3):
            await rt.arm(TimerSpec(id=f"t-{i}", fire_at_ms=T0 + i, source="clock", type="tick", scope="s"))
    (old_index,) = [
        sql for (sql,) in schema_at(17).execute("SELECT sql FROM sqlite_master WHERE name = 'timers_due'")
    ]
    conn = sqlite3.connect(path)
    with conn:
        undo_migration_19(conn)
        conn.execute("DROP INDEX timers_due")
        conn.execute(old_index)
        conn.execute("UPDATE loom_schema SET version = 17")
    conn.close()
    async with open_runtime(path, clock=ManualClock(start_ms=T0 + 1), actors=()) as rt:
        due = await rt.due(10)
        assert [(r.timer_id, r.revision, r.fire_at_ms) for r in due] == [("t-0", 1, T0), ("t-1", 1, T0 + 1)]
    assert schema_rows(path) == [(SCHEMA_VERSION,)]
    indexed = [
        r["name"] for r in raw.query(path, "SELECT name FROM pragma_index_info('timers_due') ORDER BY seqno")
    ]
    assert indexed == ["fire_at_ms", "armed_seq", "id", "revision"]


async def test_timers_armed_before_the_arming_order_keep_their_id_order_and_go_first(tmp_path: Path) -> None:
    """Migration 19 numbers each arming (``armed_seq``). Catches a migration that fails on armed timers,
    one that leaves them out of the due index, and a number given to a new arming that is not above
    theirs (it would fire before timers armed long before it, due at the same instant)."""
    path = str(tmp_path / "loom.db")
    async with open_runtime(path, clock=ManualClock(start_ms=T0), actors=()) as rt:
        for name in ("b", "a"):
            await rt.arm(TimerSpec(id=name, fire_at_ms=T0 + 5, source="clock", type="tick", scope="s"))
    conn = sqlite3.connect(path)
    with conn:
        undo_migration_19(conn)
        conn.execute("UPDATE loom_schema SET version = 18")
    conn.close()
    async with open_runtime(path, clock=ManualClock(start_ms=T0 + 5), actors=()) as rt:
        await rt.arm(TimerSpec(id="0-new", fire_at_ms=T0 + 5, source="clock", type="tick", scope="s"))
        assert [r.timer_id for r in await rt.due(10)] == ["a", "b", "0-new"]
    assert raw.query(path, "SELECT id, armed_seq FROM timers ORDER BY id") == [
        {"id": "0-new", "armed_seq": 1},
        {"id": "a", "armed_seq": 0},
        {"id": "b", "armed_seq": 0},
    ]


@pytest.fixture
def newer_db(file_store: SQLiteStore) -> Path:
    file_store.open_writer().close()
    conn = sqlite3.connect(file_store.path)
    conn.execute("UPDATE loom_schema SET version = ?", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    path = Path(file_store.path)
    assert side_files(path) == []
    return path


def file_state(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), path.stat().st_mtime_ns


def side_files(path: Path) -> list[str]:
    """The journal files SQLite would leave next to the database after writing."""
    return [suffix for suffix in ("-wal", "-shm", "-journal") if Path(f"{path}{suffix}").exists()]


async def test_a_newer_schema_is_refused_and_the_file_left_untouched(newer_db: Path) -> None:
    before = file_state(newer_db)
    actor = StorageActor(SQLiteStore(path=str(newer_db)), ManualClock(start_ms=T0))
    with pytest.RaisesGroup(SchemaTooNew, allow_unwrapped=True, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
    assert file_state(newer_db) == before
    assert side_files(newer_db) == []
    assert schema_rows(str(newer_db)) == [(SCHEMA_VERSION + 1,)]


def test_the_writer_refuses_a_newer_schema_naming_both_versions(newer_db: Path) -> None:
    before = file_state(newer_db)
    with pytest.raises(SchemaTooNew, match=rf"version {SCHEMA_VERSION + 1}.*\({SCHEMA_VERSION}\)"):
        SQLiteStore(path=str(newer_db)).open_writer()
    assert file_state(newer_db) == before
    assert side_files(newer_db) == []


# -- crash points -----------------------------------------------------------


@pytest.mark.parametrize("boundary", [BEFORE_COMMIT, AFTER_COMMIT])
async def test_a_crash_at_a_commit_boundary_acknowledges_nobody(durable_store: Store, boundary: str) -> None:
    async with trio.open_nursery() as callers:
        with pytest.RaisesGroup(CrashPoint, allow_unwrapped=True, flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                actor = await start_actor(nursery, durable_store, fault=CrashAt(Boundary(boundary), 1))
                calls = Calls(actor, callers)
                calls.start("a", put, "a")
                calls.start("b", put, "b")
    assert calls.results == {}
    assert set(calls.errors) == {"a", "b"}
    assert all(isinstance(e, StorageClosed) for e in calls.errors.values())
    assert raw_keys(durable_store) == ([] if boundary == BEFORE_COMMIT else ["a", "b"])
