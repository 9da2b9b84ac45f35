"""Shared fixtures: the public ones from loom.testing (``loom_backend``, ``loom_store``, ``loom_drivers``,
``loom_driver``, registered by loom's ``pytest11`` entry point), a clock at the one business-time
origin, ``T0_MS``, and durable stores for crash and drill tests (``durable_store``, ``fresh_store``),
parametrised over the two backends a store outlives a runtime on: a SQLite file and PostgreSQL."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from guards import pytest_runtest_call, pytest_runtest_protocol, reap_children

from loom.records.timers import Timer
from loom.store import SQLiteStore, Tx, _sql
from loom.store._tx_base import MISSING, TxBase
from loom.store._tx_executions import _OPEN_INTENTS_EXIST, ExecutionsTx
from loom.store._tx_inputs import InputsTx
from loom.store._tx_subscriptions import WAIT_SUBSCRIPTIONS_EXIST, SubscriptionsTx
from loom.store._tx_timers import TimersTx
from loom.store._tx_waits import _UNTAKEN_WAKE, _WAITS_EXIST, _WOKEN_AT, WaitsTx, wait_from_row
from loom.testing import T0_MS, ManualClock
from loom.testing.postgres import PostgresCluster

__all__ = ["pytest_runtest_call", "pytest_runtest_protocol", "reap_children"]
"""What `guards` adds to every test here: a deadline, and no child process left behind."""

FreshStore = Callable[[str], str]
"""``fresh_store(name)``: the location of a new, empty, migrated store (a path or a URL)."""


READERS: dict[str, Callable[[Tx, str], object]] = {
    "work": Tx.work,
    "facts": Tx.admission_facts,
    "execution_state": Tx.execution_state,
    "execution": Tx.execution,
    "place": Tx.queue_place,
    "checkpoint": Tx.checkpoint,
    "segment_clock": Tx.execution_segment_clock,
}
"""How each kind of record a transaction keeps is read afresh (with its keeping turned off)."""


def read_afresh(tx: Tx, kind: str, key: str) -> object:
    """What a read of ``kind`` by ``key`` answers with the transaction's keeping turned off (nothing
    kept on the database alone, nothing of what it inserted: `TxBase._keeps`). While it reads,
    ``tx.reading_afresh`` says so (tests that count a procedure's reads leave these out). Revision
    bumps and state moves that wait (`TxBase.bump_work`, `Tx.move_later`) are written for the read
    inside a savepoint rolled back after it, so that they still wait as they would without the check."""
    caching, own, bumps, moves = tx._caching, tx._own, dict(tx._bumps), dict(tx._moves)
    tx.reading_afresh = True  # type: ignore[attr-defined]
    if bumps:
        kept = tx._reads_at == tx.dialect.changes(tx._conn)
        tx._conn.execute("SAVEPOINT afresh")
        tx._flush_bumps()
    tx._caching, tx._own = False, set()
    try:
        return READERS[kind](tx, key)
    finally:
        tx._caching, tx._own = caching, own
        if bumps:
            tx._conn.execute("ROLLBACK TO afresh")
            tx._conn.execute("RELEASE afresh")
            tx._bumps, tx._moves = bumps, moves
            if kept:
                tx._reads_at = tx.dialect.changes(tx._conn)
        del tx.reading_afresh  # type: ignore[attr-defined]


def checked_known(tx: TxBase, kind: str, key: str, record: object) -> None:
    """`TxBase.known`, checked: the record a procedure made from its own writes is what a read answers."""
    if kind in READERS and isinstance(tx, Tx) and tx._keeps(kind, key):
        # (a transaction alone on its database keeps it, and one on a shared database keeps what
        # only it can see: a Work or attempt it inserted; another node may change any other row)
        read = read_afresh(tx, kind, key)
        assert record == read, f"{kind} made from its writes is not what a read answers: {record} != {read}"
    KNOWN(tx, kind, key, record)


KNOWN = TxBase.known


def checked_hold(tx: TxBase, work_id: str, kind: str, key: str, record: object) -> None:
    """`TxBase.hold`, checked as `checked_known` (and each answer it gives later by `checked_recall`)."""
    if kind in READERS and isinstance(tx, Tx) and tx._keeps(kind, key):
        read = read_afresh(tx, kind, key)
        assert record == read, f"{kind} held from its writes is not what a read answers: {record} != {read}"
    HOLD(tx, work_id, kind, key, record)


HOLD = TxBase.hold


def checked_known_lazily(
    tx: TxBase, kind: str, key: str, make: Callable[[], object], *, pure: bool = False
) -> None:
    """`TxBase.known_lazily`, checked as `checked_known` (the record made at once: a read made before
    a row changes answers what it would make then; one made later is checked by `checked_recall`)."""
    checked_known(tx, kind, key, make())
    KNOWN_LAZILY(tx, kind, key, make, pure=pure)


KNOWN_LAZILY = TxBase.known_lazily


def checked_pending(tx: InputsTx, work_id: str) -> tuple[str, ...]:
    """`InputsTx.pending_of`, checked: the pending inputs a transaction kept are what a read answers.
    An answer that was itself a read has nothing to check (and on PostgreSQL a second read may see an
    input another node committed between the two: read committed)."""
    from_kept = tx._known_pending(work_id) is not None
    kept = PENDING_OF(tx, work_id)
    if not from_kept:
        return kept
    read = tuple(row[0] for row in tx._all(_sql.WORK_PENDING, (work_id,)))
    assert kept == read, (
        f"work {work_id}'s pending inputs as kept are not what a read answers: {kept} != {read}"
    )
    return kept


PENDING_OF = InputsTx.pending_of


def checked_recall(tx: TxBase, kind: str, key: str) -> object:
    """`TxBase.recall`, checked: a Work, its admission facts, an attempt or an attempt's state answered
    from what the transaction kept are what a read answers now."""
    record = RECALL(tx, kind, key)
    if record is not MISSING and kind in READERS and isinstance(tx, Tx):
        read = read_afresh(tx, kind, key)
        assert record == read, (
            f"a {kind} kept by the transaction is not what a read answers: {record} != {read}"
        )
    return record


RECALL = TxBase.recall


def checked_timer(tx: TimersTx, timer_id: str) -> Timer | None:
    """`TimersTx.timer`, checked: a timer's row kept from the due head is what a read answers now."""
    kept = tx._timer_rows.get(timer_id)
    if kept is not None:
        read = tx._conn.execute(_sql.TIMER_BY_ID, (timer_id,)).fetchone()  # (not counted as the procedure's)
        assert kept == read, (
            f"timer {timer_id}'s row kept from the due head is not what a read answers: {kept} != {read}"
        )
    return TIMER(tx, timer_id)


TIMER = TimersTx.timer


def checked_waits_exist(tx: WaitsTx) -> tuple[bool, bool]:
    """`WaitsTx.waits_exist`, checked: what it answers none of, a read finds none of."""
    kept = WAITS_EXIST(tx)
    read = tx._conn.execute(_WAITS_EXIST).fetchone()  # (not counted as the procedure's)
    found = tuple(map(bool, read))
    assert all(k or not r for k, r in zip(kept, found, strict=True)), (
        f"waits kept as none (open, untaken wakes) {kept}, a read finds some: {found}"
    )
    return kept


WAITS_EXIST = WaitsTx.waits_exist


def checked_untaken_wake(tx: WaitsTx, work_id: str) -> object:
    """`WaitsTx.untaken_wake`, checked: the wake a transaction answers from the ones it made is what a
    read answers now."""
    kept = UNTAKEN_WAKE(tx, work_id)
    rows = tx._conn.execute(_UNTAKEN_WAKE, (work_id,)).fetchall()  # (not counted as the procedure's)
    read = wait_from_row(max(rows, key=lambda r: (r[_WOKEN_AT] or 0, r[0]))) if rows else None
    assert kept == read, f"work {work_id}'s untaken wake as kept is not what a read answers: {kept} != {read}"
    return kept


UNTAKEN_WAKE = WaitsTx.untaken_wake


def checked_open_intents_exist(tx: ExecutionsTx) -> bool:
    """`ExecutionsTx.open_intents_exist`, checked: when it answers none is open, a read finds none."""
    kept = OPEN_INTENTS_EXIST(tx)
    (read,) = tx._conn.execute(_OPEN_INTENTS_EXIST).fetchone()  # (not counted as the procedure's)
    assert kept or not read, "intents kept as none open, a read finds one"
    return kept


OPEN_INTENTS_EXIST = ExecutionsTx.open_intents_exist


def checked_work_removed(tx: Tx, work_id: str) -> bool:
    """`Tx.work_removed`, checked: what it answers is what a read of the tombstones finds."""
    kept = WORK_REMOVED(tx, work_id)
    read = tx._conn.execute("SELECT 1 FROM removed_works WHERE id = ?", (work_id,)).fetchone() is not None
    assert kept == read, (
        f"work {work_id} answered {'removed' if kept else 'not removed'}, a read finds otherwise"
    )
    return kept


WORK_REMOVED = Tx.work_removed


def checked_roots_pinned(tx: Tx) -> bool:
    """`Tx.roots_pinned`, checked: when it answers no root is pinned, a read finds none."""
    kept = ROOTS_PINNED(tx)
    (read,) = tx._conn.execute("SELECT EXISTS (SELECT 1 FROM causal_roots)").fetchone()
    assert kept or not read, "roots kept as none pinned, a read finds one"
    return kept


ROOTS_PINNED = Tx.roots_pinned


def checked_routed_input(tx: InputsTx, event_id: str) -> object:
    """`InputsTx.routed_input`, checked: a checkpoint answered from what this transaction wrote or an
    earlier one committed is what a read answers."""
    checkpoint = ROUTED_INPUT(tx, event_id)
    if checkpoint is not MISSING and isinstance(tx, Tx):
        read = read_afresh(tx, "checkpoint", event_id)
        assert checkpoint == read, f"event {event_id}'s checkpoint as kept: {checkpoint} != {read}"
    return checkpoint


ROUTED_INPUT = InputsTx.routed_input


def checked_take_routed(tx: InputsTx, event_id: str) -> object:
    """`InputsTx._take_routed`, checked: an Event and its checkpoint an earlier commit kept are what
    reads answer."""
    kept = TAKE_ROUTED(tx, event_id)
    if kept is not None and isinstance(tx, Tx):
        row = tx._conn.execute(_sql.EVENT_BY_ID, (event_id,)).fetchone()
        event = _sql.event_from_row(row) if row else None
        assert kept[0] == event, f"event {event_id} as kept: {kept[0]} != {event}"
        read = read_afresh(tx, "checkpoint", event_id)
        assert kept[1] == read, f"event {event_id}'s checkpoint as kept: {kept[1]} != {read}"
    return kept


TAKE_ROUTED = InputsTx._take_routed


def checked_kept_attempt(tx: ExecutionsTx, execution_id: str) -> object:
    """`ExecutionsTx._kept_attempt`, checked: an attempt's row an earlier commit kept is what a read
    gives."""
    kept = KEPT_ATTEMPT(tx, execution_id)
    if kept is not None:
        read = tx._conn.execute(_sql.EXECUTION_AND_CLOCK_BY_ID, (execution_id,)).fetchone()
        assert kept == read, f"attempt {execution_id}'s row as kept: {kept} != {read}"
    return kept


KEPT_ATTEMPT = ExecutionsTx._kept_attempt


def checked_kv_get(tx: Tx, namespace: str, key: str, *, for_update: bool = False) -> object:
    """`Tx.kv_get`, checked: the entry it answers (read, or kept by this transaction or an earlier
    commit) is what a read finds."""
    entry = KV_GET(tx, namespace, key, for_update=for_update)
    row = tx._conn.execute(_sql.KV_GET, (namespace, key)).fetchone()  # (not counted as the procedure's)
    read = _sql.kv_from_row(row) if row else None
    assert entry == read, f"kv {namespace}/{key} as kept: {entry} != {read}"
    return entry


KV_GET = Tx.kv_get


def checked_max_seq(tx: Tx) -> int:
    """`Tx.max_seq`, checked: the newest Event's sequence it answers (read, kept through its inserts,
    or known by the last commit) is what a read finds."""
    kept = MAX_SEQ(tx)
    (read,) = tx._conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
    assert kept == read, f"newest Event's sequence as kept: {kept} != {read}"
    return kept


MAX_SEQ = Tx.max_seq


def checked_routed_through(tx: Tx, watermark: int, wanted: int, window: int) -> int:
    """`Tx.routed_through`, checked: no Event above the watermark, up to what it answers (found, kept
    through the checkpoints written, or known by the last commit), lacks its checkpoint."""
    through = ROUTED_THROUGH(tx, watermark, wanted, window)
    row = tx._conn.execute(_sql.FIRST_UNROUTED, (watermark, through)).fetchone()
    assert row is None, f"every Event routed through {through} answered: Event {row[0]} has no checkpoint"
    return through


ROUTED_THROUGH = Tx.routed_through


def checked_key_owner(tx: Tx, key: str) -> str | None:
    """`Tx.key_owner`, checked: the owner it answers (read, kept, or committed earlier) is what a
    read finds."""
    owner = KEY_OWNER(tx, key)
    row = tx._conn.execute("SELECT work_id FROM work_keys WHERE key = ?", (key,)).fetchone()
    assert owner == (row[0] if row else None), f"key {key!r}: {owner} answered, a read finds {row}"
    return owner


KEY_OWNER = Tx.key_owner


def checked_wait_subscriptions_exist(tx: SubscriptionsTx) -> bool:
    """`SubscriptionsTx.wait_subscriptions_exist`, checked: when it answers no wait declared one, a read
    finds none."""
    kept = WAIT_SUBSCRIPTIONS_EXIST_OF(tx)
    (read,) = tx._conn.execute(WAIT_SUBSCRIPTIONS_EXIST).fetchone()  # (not counted as the procedure's)
    assert kept or not read, "wait subscriptions kept as none, a read finds one"
    return kept


WAIT_SUBSCRIPTIONS_EXIST_OF = SubscriptionsTx.wait_subscriptions_exist


@pytest.fixture(autouse=True)
def known_records_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record a procedure derives from what it wrote (`TxBase.known`, `TxBase.hold`), every Work,
    admission facts, queue place, attempt, attempt state and checkpoint a transaction answers from
    what it kept or held (`TxBase.recall`), every Work's pending inputs it kept (`InputsTx.pending_of`), every untaken wake it kept
    (`WaitsTx.untaken_wake`), every timer row kept
    from the due head (`TimersTx.timer`), and every wait, open intent or pinned root a transaction
    answers none of (`WaitsTx.waits_exist`, `ExecutionsTx.open_intents_exist`, `Tx.roots_pinned`,
    `SubscriptionsTx.wait_subscriptions_exist`), every key's owner (`Tx.key_owner`), and every routed
    input's checkpoint and Event kept (`InputsTx.routed_input`, `InputsTx._take_routed`), every
    attempt's row kept (`ExecutionsTx._kept_attempt`), every KV entry (`Tx.kv_get`), the newest
    Event's sequence (`Tx.max_seq`) and how far every Event is routed (`Tx.routed_through`), in
    every test here, are checked against a read of the store (tests/test_tx_reads.py shows the checks
    fail a wrong one)."""
    monkeypatch.setattr(TxBase, "known", checked_known)
    monkeypatch.setattr(TxBase, "known_lazily", checked_known_lazily)
    monkeypatch.setattr(TxBase, "hold", checked_hold)
    monkeypatch.setattr(InputsTx, "pending_of", checked_pending)
    monkeypatch.setattr(InputsTx, "routed_input", checked_routed_input)
    monkeypatch.setattr(InputsTx, "_take_routed", checked_take_routed)
    monkeypatch.setattr(ExecutionsTx, "_kept_attempt", checked_kept_attempt)
    monkeypatch.setattr(TxBase, "recall", checked_recall)
    monkeypatch.setattr(TimersTx, "timer", checked_timer)
    monkeypatch.setattr(WaitsTx, "waits_exist", checked_waits_exist)
    monkeypatch.setattr(WaitsTx, "untaken_wake", checked_untaken_wake)
    monkeypatch.setattr(ExecutionsTx, "open_intents_exist", checked_open_intents_exist)
    monkeypatch.setattr(Tx, "roots_pinned", checked_roots_pinned)
    monkeypatch.setattr(Tx, "work_removed", checked_work_removed)
    monkeypatch.setattr(Tx, "key_owner", checked_key_owner)
    monkeypatch.setattr(Tx, "kv_get", checked_kv_get)
    monkeypatch.setattr(Tx, "max_seq", checked_max_seq)
    monkeypatch.setattr(Tx, "routed_through", checked_routed_through)
    monkeypatch.setattr(SubscriptionsTx, "wait_subscriptions_exist", checked_wait_subscriptions_exist)


@pytest.fixture
def clock() -> ManualClock:
    """Business time starts at 2026-01-01T00:00:00Z, the first millisecond of a UTC minute."""
    return ManualClock(start_ms=T0_MS)


@pytest.fixture(params=["file", "postgres"])
def durable_backend(request: pytest.FixtureRequest) -> str:
    """A backend whose store outlives a crashed or killed runtime: ``file`` or ``postgres``."""
    return str(request.param)


@pytest.fixture
def durable_store(durable_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A store that outlives a crashed runtime: a SQLite file (not yet created: the first runtime
    makes it), or a PostgreSQL database (a copy of the migrated template)."""
    if durable_backend == "file":
        return str(tmp_path / "loom.db")
    cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
    return cluster.create_database(template=cluster.migrated_template())


@pytest.fixture
def fresh_store(durable_backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> FreshStore:
    """A factory of new, empty, migrated stores of the backend, without migrating each one: a copy
    of one migrated SQLite file (``tmp_path/<name>.db``), or a PostgreSQL database copied from the
    migrated template (a database per crash point, where SQLite copies a file)."""
    if durable_backend == "file":
        template = tmp_path / "template.db"
        store = SQLiteStore(path=str(template))
        store.close_writer(store.open_writer())  # the schema, folded into the file: copies are whole

        def copy(name: str) -> str:
            path = tmp_path / f"{name}.db"
            shutil.copy(template, path)
            return str(path)

        return copy
    cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
    return lambda name: cluster.create_database(template=cluster.migrated_template())


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A local zone ahead of UTC: year 9999's last instant is in year 10000 there."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
