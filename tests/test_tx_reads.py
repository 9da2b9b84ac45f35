"""A transaction answers a repeated read of a Work, an attempt or an Event with its routing from what it read,
only while it has changed no row since (`TxBase.recall`); on PostgreSQL only a Work or an attempt it
inserted itself (nobody else sees it before the commit), everything else is read again.

Events, whose rows never change, are kept from their insert or first read for the whole transaction;
KV entries and key owners until the transaction writes them, rolls them back or removes them; timers'
rows read by the due head until the transaction writes that timer or rolls a savepoint back.

Wrong implementations caught: a cache that survives a write (a Work read before its update answered
after it), and one that survives a savepoint rolled back (a Work read inside the savepoint, after its
update there, answered once the update is undone; an Event inserted there); an Event answered after
its removal.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from functools import partial

import attrs
import pytest

from loom import (
    CausalLimits,
    Completed,
    Config,
    Deliver,
    EventIn,
    ExecutionState,
    IntentKind,
    Lease,
    ManualClock,
    Runtime,
    Waiting,
    WaitSpec,
    WaitState,
    Work,
    WorkState,
    open_runtime,
)
from loom.kernel.accept import accept_in_tx
from loom.kernel.admission import AdmitRequest, settle_in_tx, start_at_once_in_tx
from loom.kernel.authority import Authority
from loom.kernel.causal import check_and_charge_in_tx, utc_minute
from loom.kernel.chains import adopt_then_complete_in_tx, complete_then_start_in_tx
from loom.kernel.executions import NO_BINDING, claim_in_tx, claim_request, record_outcome_in_tx
from loom.kernel.firing import fire_due_in_tx
from loom.kernel.intents import stale_open_intents_in_tx
from loom.kernel.kinds import KindPolicy
from loom.kernel.recovery import RecoverPass, adopt_fence_in_tx, adopt_in_tx, recover_expired_in_tx
from loom.kernel.resolve import RouteRef, RouteRequest
from loom.kernel.routing import route_in_tx
from loom.kernel.timers import arm_in_tx, cancel_timer_in_tx
from loom.kernel.unrouted import earlier_unrouted
from loom.plugins.handlers import work_id_for_key
from loom.records.core_events import CORE_SOURCE, WAIT_WOKEN
from loom.records.events import CausalRejection, Event
from loom.records.ids import core_delivery_id
from loom.records.subscriptions import Subscription, SubscriptionState
from loom.records.timers import Firing, FiringResult, TimerSpec, TimerState
from loom.records.work import InputState, Policy, Unmatched
from loom.store import AdmissionFacts, SQLiteStore, Tx, _tx_admission
from loom.store import _sql as _sql_module
from loom.store._sql import (
    DELIVERY,
    EVENT_BY_ID,
    EVENTS_TO_ROUTE,
    EXECUTION_AND_CLOCK_BY_ID,
    TIMER_BY_ID,
    TIMER_OR_REMOVED,
    WORK_PENDING,
    WORK_PENDING_SEQ,
)
from loom.testing import T0_MS, Driver
from loom.testing.internals import storage_of
from loom.testing.pytest_plugin import DriverFactory

SCOPE = "shop"
CONFIG = Config.from_dict({"scopes": {SCOPE: {"routes": [{"name": "orders", "create_work": True}]}}})


@pytest.fixture
async def rt(loom_store: str) -> AsyncIterator[Runtime]:
    async with open_runtime(
        loom_store, clock=ManualClock(start_ms=T0_MS), config=CONFIG, load_entry_points=False, actors=()
    ) as runtime:
        yield runtime


async def a_work(rt: Runtime) -> str:
    await rt.publish(EventIn(source="shop", delivery_id="d-1", type="order.placed", scope=SCOPE, key="k"))
    await rt.poll()
    work = await rt.work_for_key("k")
    assert work is not None
    return work.id


async def test_a_read_after_a_write_sees_the_write(rt: Runtime) -> None:
    work_id = await a_work(rt)

    def read_write_read(tx: Tx, now_ms: int) -> tuple[int, int, int]:
        before = tx.work(work_id)
        again = tx.work(work_id)
        assert before is not None
        assert again is not None
        tx.update_work(work_id, now_ms)
        after = tx.work(work_id)
        assert after is not None
        return before.revision, again.revision, after.revision

    before, again, after = await storage_of(rt).submit(read_write_read)
    assert again == before
    assert after == before + 1, "a read after an update answered what was read before it"


async def test_a_works_admission_facts_are_read_anew_after_a_write(rt: Runtime, loom_store: str) -> None:
    """The facts a start and then the settle hook read of one Work are read once while nothing is
    written between. Catches: facts kept across a write (the hold is not seen, and a held Work would be
    queued for a start)."""
    work_id = await a_work(rt)

    def read_hold_read(tx: Tx, now_ms: int) -> tuple[bool, bool, bool, bool]:
        before = tx.admission_facts(work_id)
        again = tx.admission_facts(work_id)
        tx.update_work(work_id, now_ms, held=1, hold_reason="a person looks at it")
        after = tx.admission_facts(work_id)
        assert before is not None
        assert after is not None
        return before.held, after.held, again is before, again == before

    held_before, held_after, same, equal = await storage_of(rt).submit(read_hold_read)
    assert not held_before
    assert held_after, "the facts read after the hold answered what was read before it"
    assert equal
    assert same is (not loom_store.startswith("postgresql://")), "a repeated read was read again"


async def test_a_claim_tells_the_works_admission_facts(rt: Runtime, loom_store: str) -> None:
    """A claim tells its transaction the Work's admission facts as it left them, so the settle hook
    after it reads none (`executions.claim_in_tx`). Catches: the claim no longer telling them (a query
    on SQLite); conftest's check catches facts told wrong (a claim that said the Work has no pending
    input, or is out of the ready queue while it is in it, failed the admission tests that way)."""
    work_id = await a_work(rt)
    facts_query = "SELECT w.state, w.held"

    def claim_then_read(tx: Tx, now_ms: int) -> tuple[object, list[str]]:
        work = tx.work(work_id)
        assert work is not None
        request = claim_request(CONFIG, work, owner="host", token="t-1", lease_ms=60_000, binding=NO_BINDING)
        claim_in_tx(tx, now_ms, request)
        queries = counting_queries(tx)
        facts = tx.admission_facts(work_id)
        assert facts is not None
        return facts, [q for q in queries if q.startswith(facts_query)]

    facts, reads = await storage_of(rt).submit(claim_then_read)
    assert isinstance(facts, AdmissionFacts)
    assert (facts.state, facts.execution_state, facts.has_pending) == (
        WorkState.RUNNING,
        ExecutionState.RUNNING,
        True,
    )
    caches = not loom_store.startswith("postgresql://")
    assert len(reads) == (0 if caches else 1), "the settle hook would read the facts the claim just made"


async def test_a_claim_reads_the_events_of_its_inputs_in_one_query(rt: Runtime) -> None:
    """The Events of a Work's pending inputs, accepted and routed in earlier transactions, are read
    for its claim in one query (`InputsTx.input_events`), each once, and handed over in acceptance
    order. Catches: a read per input (three here), inputs handed over out of order."""
    work_id = await a_work(rt)
    for n in (2, 3):
        await rt.publish(
            EventIn(source="shop", delivery_id=f"d-{n}", type="order.placed", scope=SCOPE, key="k")
        )
    await rt.poll()

    def claim(tx: Tx, now_ms: int) -> tuple[list[str], list[str]]:
        work = tx.work(work_id)
        assert work is not None
        queries = counting_queries(tx)
        request = claim_request(CONFIG, work, owner="host", token="t-1", lease_ms=60_000, binding=NO_BINDING)
        lease = claim_in_tx(tx, now_ms, request)
        events = [q for q in queries if q.startswith("SELECT id, seq, source")]
        return [e.delivery_id for e in lease.request.inputs], events

    inputs, reads = await storage_of(rt).submit(claim)
    assert inputs == ["d-1", "d-2", "d-3"], "the inputs in acceptance order"
    assert len(reads) == 1, reads


async def test_a_savepoint_rolled_back_forgets_what_was_read_inside_it(rt: Runtime) -> None:
    work_id = await a_work(rt)

    def undone(tx: Tx, now_ms: int) -> tuple[int, int, int]:
        before = tx.work(work_id)
        assert before is not None
        inside = -1
        try:
            with tx.savepoint():
                tx.update_work(work_id, now_ms)
                seen = tx.work(work_id)
                assert seen is not None
                inside = seen.revision
                raise LookupError("undo it")
        except LookupError:
            pass
        after = tx.work(work_id)
        assert after is not None
        return before.revision, inside, after.revision

    before, inside, after = await storage_of(rt).submit(undone)
    assert inside == before + 1
    assert after == before, "a read after the rollback answered the undone update"


async def test_a_revision_bump_that_waits_is_kept_by_a_savepoint_rolled_back_after_it(rt: Runtime) -> None:
    """A bump that waits (`TxBase.bump_work`, inside `holding`) is written before a savepoint begins,
    so a rollback undoes only the bumps made inside it. Catches: a rollback that forgets a bump made
    before the savepoint (the Work no revision on), and one that leaves a bump made inside it waiting
    (two revisions on)."""
    work_id = await a_work(rt)

    def bumps(tx: Tx, now_ms: int) -> int:
        work = tx.work(work_id)
        assert work is not None
        with tx.holding():
            tx.bump_work(work_id, work.revision, now_ms)
            try:
                with tx.savepoint():
                    tx.bump_work(work_id, work.revision + 1, now_ms)
                    raise LookupError("undo it")
            except LookupError:
                pass
        return work.revision

    before = await storage_of(rt).submit(bumps)
    after = await rt.work(work_id)
    assert after.revision == before + 1


async def test_an_events_routing_is_read_anew_once_it_is_routed(rt: Runtime) -> None:
    accepted = await rt.publish(EventIn(source="shop", delivery_id="d-2", type="other", scope="elsewhere"))
    request = unmatched(accepted.id)

    def route_between_reads(tx: Tx, now_ms: int) -> tuple[bool, bool]:
        before = tx.event_to_route(accepted.id)
        assert before is not None
        route_in_tx(tx, now_ms, request, CausalLimits())
        after = tx.event_to_route(accepted.id)
        assert after is not None
        return before[1] is None, after[1] is not None

    unrouted_before, routed_after = await storage_of(rt).submit(route_between_reads)
    assert unrouted_before
    assert routed_after, "the Event's routing read after its checkpoint answered it unrouted"


async def test_an_event_accepted_inside_a_savepoint_rolled_back_is_not_answered(rt: Runtime) -> None:
    """Events are kept for the whole transaction from their insert (an Event row never changes).
    Catches: the kept Event surviving the rollback that undid its insert (a later request of the
    batch would route an Event that does not exist)."""
    offered = EventIn(source="shop", delivery_id="d-3", type="order.placed", scope=SCOPE, key="k3")

    def undone(tx: Tx, now_ms: int) -> tuple[bool, bool]:
        inside = False
        try:
            with tx.savepoint():
                event = accept_in_tx(tx, now_ms, offered, CausalLimits())
                inside = tx.event(event.id) == event
                raise LookupError("undo it")
        except LookupError:
            pass
        return inside, tx.event(event.id) is None

    inside, gone = await storage_of(rt).submit(undone)
    assert inside
    assert gone, "an Event whose insert was rolled back was still answered"


async def test_an_event_removed_is_not_answered(rt: Runtime) -> None:
    """Catches: an Event read earlier in the transaction answered after its removal (compaction)."""
    accepted = await rt.publish(EventIn(source="shop", delivery_id="d-4", type="other", scope="elsewhere"))
    await rt.poll()

    def read_remove_read(tx: Tx, now_ms: int) -> tuple[bool, bool]:
        before = tx.event(accepted.id)
        (row,) = [r for r in tx.routed_events(0, accepted.seq, 10) if r.id == accepted.id]
        tx.remove_event(row, tombstone=True)
        return before == accepted, tx.event(accepted.id) is None

    read, gone = await storage_of(rt).submit(read_remove_read)
    assert read
    assert gone, "a removed Event was still answered"


async def test_a_new_work_is_answered_as_a_read_of_it_would_be(rt: Runtime) -> None:
    """`Tx.insert_work` builds the new Work from what it inserted and the schema's defaults instead of
    reading it back. Catches: a column whose default it gets wrong (a schema change it missed)."""

    def insert_then_read(tx: Tx, now_ms: int) -> tuple[object, object]:
        made = tx.insert_work(
            id="wk_new",
            scope=SCOPE,
            kind="k",
            parent_id=None,
            predecessor_id=None,
            generation=3,
            now_ms=now_ms,
        )
        return made, tx.work("wk_new")

    made, read = await storage_of(rt).submit(insert_then_read)
    assert made == read


async def test_a_work_known_from_the_writes_is_answered_until_a_row_changes(rt: Runtime) -> None:
    """A Work told to the transaction (`TxBase.known`) answers its reads until a row changes. Catches: a
    known Work answered after a later write (the read after the hold still says not held), and one
    never answered (the read right after it is a query on SQLite)."""
    work_id = await a_work(rt)

    def know_then_write(tx: Tx, now_ms: int) -> tuple[bool, bool]:
        work = tx.work(work_id)
        assert work is not None
        revision = tx.update_work(work_id, now_ms)
        known = attrs.evolve(work, revision=revision, updated_at_ms=now_ms)
        tx.known("work", work_id, known)
        answered = tx.work(work_id) is known
        tx.update_work(work_id, now_ms, held=1, hold_reason="a person looks at it")
        after = tx.work(work_id)
        assert after is not None
        assert after.revision == revision + 1
        return answered, after.held

    answered, held = await storage_of(rt).submit(know_then_write)
    assert held, "a Work known before a write was answered after it"
    assert answered is storage_of(rt).store.dialect.caches_reads


async def test_a_work_made_wrong_from_the_writes_fails_the_suites_check(rt: Runtime) -> None:
    """Every test here checks each Work a procedure makes from its writes against a read (conftest's
    `checked_known`): this one makes a wrong one on purpose, and the check fails its request."""
    work_id = await a_work(rt)

    def know_wrong(tx: Tx, now_ms: int) -> None:
        work = tx.work(work_id)
        assert work is not None
        tx.known("work", work_id, attrs.evolve(work, revision=work.revision + 1))

    if not storage_of(rt).store.dialect.caches_reads:
        await storage_of(rt).submit(know_wrong)  # kept nowhere (every read goes to the database)
        return
    with pytest.raises(AssertionError, match="not what a read answers"):
        await storage_of(rt).submit(know_wrong)


async def test_an_event_accepted_then_routed_in_one_transaction_answers_its_checkpoint(rt: Runtime) -> None:
    """An Event this transaction accepted is answered unrouted without a query until its checkpoint is
    written. Catches: the routing answered from the acceptance after the checkpoint (a second route of
    it in the same batch would route it twice), and an Event accepted in a savepoint rolled back still
    answered."""
    offered = EventIn(source="shop", delivery_id="d-5", type="other", scope="elsewhere")
    undone = EventIn(source="shop", delivery_id="d-6", type="other", scope="elsewhere")

    def accept_route_read(tx: Tx, now_ms: int) -> tuple[bool, bool, bool]:
        event = accept_in_tx(tx, now_ms, offered, CausalLimits())
        first = tx.event_to_route(event.id)
        route_in_tx(tx, now_ms, unmatched(event.id), CausalLimits())
        routed = tx.event_to_route(event.id)
        assert first is not None
        assert routed is not None
        gone_id = ""
        try:
            with tx.savepoint():
                gone_id = accept_in_tx(tx, now_ms, undone, CausalLimits()).id
                raise LookupError("undo it")
        except LookupError:
            pass
        return first[1] is None, routed[1] is not None, tx.event_to_route(gone_id) is None

    unrouted, routed, gone = await storage_of(rt).submit(accept_route_read)
    assert unrouted
    assert routed, "the Event's checkpoint written in this transaction was not answered"
    assert gone, "an Event whose acceptance was rolled back was answered"


async def test_a_kv_entry_is_read_anew_after_it_is_written_or_rolled_back(rt: Runtime) -> None:
    """A KV entry read once is answered again from that read (the routing watermark is read several
    times per routed Event). Catches: a read after a write answered with the value before it, a read
    after a rolled-back write answered with the undone value, a deleted entry still answered."""

    def read_write_read(tx: Tx, now_ms: int) -> list[object]:
        seen: list[object] = []
        tx.kv_put("test", "k", {"n": 1}, now_ms)

        def value() -> object:
            entry = tx.kv_get("test", "k")
            return None if entry is None else entry.value["n"]

        seen += [value(), value()]
        tx.kv_put("test", "k", {"n": 2}, now_ms)
        seen.append(value())
        try:
            with tx.savepoint():
                tx.kv_put("test", "k", {"n": 3}, now_ms)
                seen.append(value())
                raise LookupError("undo it")
        except LookupError:
            pass
        seen.append(value())
        tx.kv_delete("test", ["k"])
        seen.append(value())
        return seen

    assert await storage_of(rt).submit(read_write_read) == [1, 1, 2, 3, 2, None]


async def test_a_keys_owner_is_read_anew_after_an_attach_a_rollback_or_a_removal(rt: Runtime) -> None:
    """A key's owner read once is answered again from that read (routing asks it several times per
    Event). Catches: an unowned key still answered unowned after it is attached, a key attached in a
    rolled-back savepoint still answered as attached, a removed Work's key still answered as its."""
    work_id = await a_work(rt)

    def reads(tx: Tx, now_ms: int) -> list[str | None]:
        seen = [tx.key_owner("k2"), tx.key_owner("k2")]
        try:
            with tx.savepoint():
                tx.attach_key("k2", work_id, 1, now_ms)
                seen.append(tx.key_owner("k2"))
                raise LookupError("undo it")
        except LookupError:
            pass
        seen.append(tx.key_owner("k2"))
        tx.attach_key("k2", work_id, 1, now_ms)
        seen += [tx.key_owner("k2"), tx.key_owner("k")]
        tx.remove_work(work_id, now_ms)
        seen += [tx.key_owner("k"), tx.key_owner("k2")]
        return seen

    seen = await storage_of(rt).submit(reads)
    assert seen == [None, None, work_id, None, work_id, work_id, None, None]


async def test_a_keys_owner_found_and_an_event_read_are_kept_on_every_backend(
    rt: Runtime, loom_store: str
) -> None:
    """A key is attached once, and an Event row never changes: what a read found answers the reads after
    it, on PostgreSQL too (a round trip each there); on a database alone what an earlier transaction
    committed does too. That a key has no owner is kept on a database alone: on a shared one another
    node may attach it meanwhile. Catches: a key's owner or an Event
    read again on PostgreSQL; a key found unowned answered unowned there after another node attached it."""
    work_id = await a_work(rt)
    accepted = await rt.publish(EventIn(source="shop", delivery_id="d-9", type="other", scope="elsewhere"))
    shared = storage_of(rt).shared

    def reads(tx: Tx, now_ms: int) -> tuple[list[str], list[str | None], bool]:
        queries = counting_queries(tx)
        owners = [tx.key_owner("k"), tx.key_owner("k")]
        same_event = tx.event(accepted.id) == tx.event(accepted.id) == accepted
        owners.append(tx.key_owner("k3"))
        if shared:
            import psycopg

            with psycopg.connect(loom_store, autocommit=True) as other:  # another node attaches k3
                other.execute(
                    "INSERT INTO work_keys (key, work_id, attached_seq, attached_at_ms) VALUES (%s, %s, 1, %s)",
                    ("k3", work_id, now_ms),
                )
        owners.append(tx.key_owner("k3"))
        return queries, owners, same_event

    queries, owners, same_event = await storage_of(rt).submit(reads)
    assert same_event
    assert owners == [work_id, work_id, None, work_id if shared else None]
    owner_reads = [sql for sql in queries if sql.startswith("SELECT work_id FROM work_keys")]
    # alone on the database, k's owner is the one its attaching transaction committed (`TxBase.committed`)
    assert len(owner_reads) == (3 if shared else 1), f"key owner reads: {len(owner_reads)}"
    assert queries.count(EVENT_BY_ID) == 1, "an Event was read again"


def new_work(tx: Tx, work_id: str, now_ms: int) -> None:
    tx.insert_work(
        id=work_id, scope=SCOPE, kind=None, parent_id=None, predecessor_id=None, generation=1, now_ms=now_ms
    )


async def test_a_work_this_transaction_inserted_is_kept_on_every_backend(rt: Runtime) -> None:
    """A Work (or attempt) a transaction inserted is seen by nobody else before it commits, so what the
    transaction read of it answers its later reads on PostgreSQL too (a round trip each there), until it
    changes a row; any other Work is read again there (another node may change it between two
    statements). A Work inserted in a savepoint rolled back is not answered. Catches: an inserted Work
    read again on PostgreSQL; a Work this transaction did not insert kept there; a kept Work surviving
    the rollback of its insert. conftest checks every record answered against a read."""
    existing = await a_work(rt)
    shared = storage_of(rt).shared

    def reads(tx: Tx, now_ms: int) -> tuple[list[str], bool]:
        queries = counting_queries(tx)
        new_work(tx, "wk_new", now_ms)
        assert tx.work("wk_new") == tx.work("wk_new") is not None
        assert tx.work(existing) == tx.work(existing) is not None
        try:
            with tx.savepoint():
                new_work(tx, "wk_undone", now_ms)
                assert tx.work("wk_undone") is not None
                raise LookupError("undo it")
        except LookupError:
            pass
        return queries, tx.work("wk_undone") is None

    queries, undone = await storage_of(rt).submit(reads)
    assert undone, "a Work whose insert was rolled back was answered"
    work_reads = [sql for sql in queries if sql.startswith("SELECT w.id, w.scope")]
    # the new Work once; the existing one once alone on the database, twice on a shared one; the
    # undone one once inside its savepoint and once after
    assert len(work_reads) == (5 if shared else 4), f"{len(work_reads)} Work reads"


RUN = Config.from_dict({
    "scopes": {"acme": {
        "bindings": {"fake": {"executor": "fake"}},
        "routes": [{"name": "w", "create_work": True, "binding": "fake"}],
    }},
})  # fmt: skip


async def a_none_forced_where_one_exists_fails(
    driver: Driver, ask: Callable[[Tx], bool], attr: str, match: str
) -> None:
    """conftest's check at work: a transaction made to keep "none exists" (``attr`` set false after
    ``ask`` read it) where the store has one fails its procedure (a database alone only: a shared one
    keeps no such answer)."""

    def keep_none(tx: Tx, now_ms: int) -> bool:
        ask(tx)
        setattr(tx, attr, False)
        return ask(tx)

    if storage_of(driver.runtime).store.dialect.caches_reads:
        with pytest.raises(AssertionError, match=match):
            await storage_of(driver.runtime).submit(keep_none)


async def launched_attempt(driver: Driver) -> tuple[str, Lease]:
    """A Work's first attempt, launched (and held) by the fake executor: the Work's id and the lease."""
    await driver.runtime.publish(EventIn(source="t", delivery_id="d-1", type="w.go", scope="acme", key="k"))
    work_id = work_id_for_key("acme", "k")

    async def launched() -> bool:
        return bool(driver.fake.launches_of(work_id))

    await driver.until(launched, "the attempt's launch")
    return work_id, driver.fake.launches_of(work_id)[0].lease


async def waiting_work(driver: Driver) -> str:
    """A Work whose first attempt ended on a wait for ``w.go`` Events on its key ``k``, active: its id."""
    work_id, _ = await launched_attempt(driver)
    driver.fake.finish(work_id, Waiting(wait=WaitSpec(types=("w.go",))))

    async def parked() -> bool:
        waits = await driver.runtime.waits(work_id)
        return bool(waits) and waits[-1].state is WaitState.ACTIVE

    await driver.until(parked, "the wait to be active")
    return work_id


async def test_an_attempts_token_and_clock_are_read_anew_after_a_write(loom_drivers: DriverFactory) -> None:
    """An attempt's read also keeps its lease token and its segment's clock for the fenced call that
    asks for them next. Catches: a token answered from that read after the attempt was written (a
    stale token would pass a fenced call the store refuses)."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)
        seen: list[object] = []

        def reads(tx: Tx, now_ms: int) -> None:
            execution = tx.execution(lease.execution_id)
            assert execution is not None
            seen.extend([tx.execution_token(execution.id), tx.execution_segment_clock(execution.id)[0]])
            tx.set_execution_state(execution, ExecutionState.STOPPING, token=None)
            seen.append(tx.execution_token(execution.id))
            raise LookupError("change nothing")

        with pytest.raises(LookupError, match="change nothing"):
            await storage_of(driver.runtime).submit(reads)
        assert seen[0] == lease.token
        assert seen[2] is None, "a token was answered after the attempt's token was cleared"


async def test_a_completion_leaves_its_work_answered_without_a_read(loom_drivers: DriverFactory) -> None:
    """A completion with no proofs and no usage tells its transaction the Work as it wrote it, its
    admission facts and its queue place, so the next start it chains, or the settle hook, reads none of
    them (`record_outcome_in_tx`). Catches: the completion no longer telling one (a query each on
    SQLite); conftest's check catches one told wrong (say, an input the attempt took still pending)."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)

        def complete_then_read(tx: Tx, now_ms: int) -> tuple[object, object, list[str]]:
            record_outcome_in_tx(tx, now_ms, Authority.of(lease), Completed(), KindPolicy())
            queries = counting_queries(tx)
            work = tx.work(work_id)
            assert work is not None
            facts = tx.admission_facts(work_id)
            tx.queue_place(work_id)
            return work.state, facts, queries[:]

        state, facts, queries = await storage_of(driver.runtime).submit(complete_then_read)
        assert state == "completed"
        assert isinstance(facts, AdmissionFacts)
        assert (facts.state, facts.execution_state, facts.has_pending) == (WorkState.COMPLETED, None, False)
        caches = storage_of(driver.runtime).store.dialect.caches_reads
        # on a shared database: the Work and its pending inputs, its facts, its place
        assert len(queries) == (0 if caches else 4), f"read again after the completion: {queries}"


def deliver(tx: Tx, now_ms: int, event_id: str, work: Work, route: RouteRef) -> None:
    """Route ``event_id`` into ``work`` through ``route``, as the router would (`route_in_tx`)."""
    request = RouteRequest(
        event_id=event_id,
        decision=Deliver(work_id=work.id),
        route=route,
        expected_revision=work.revision,
        generation=1,
    )
    route_in_tx(tx, now_ms, request, CausalLimits())


def counting_queries(tx: Tx) -> list[str]:
    """The statements ``tx`` reads one row or a page with from now on (conftest's checks read with
    keeping off, and are not counted; nor is what the settle hook reads after the procedure, if the
    procedure returns a copy)."""
    queries: list[str] = []
    one, all_ = tx._one, tx._all

    def counted_one(sql: str, params: tuple[object, ...] = ()) -> object:
        if not getattr(tx, "reading_afresh", False):  # (conftest's checks read afresh)
            queries.append(sql)
        return one(sql, params)

    def counted_all(sql: str, params: tuple[object, ...] = ()) -> object:
        # (conftest's check of kept pending inputs reads them with WORK_PENDING: loom reads WORK_PENDING_SEQ)
        if not getattr(tx, "reading_afresh", False) and sql != WORK_PENDING:
            queries.append(sql)
        return all_(sql, params)

    def counted_one_work(sql: str, params: tuple[object, ...]) -> object:
        if not getattr(tx, "reading_afresh", False):
            queries.append(sql)
        return one_work(sql, params)

    one_work = tx._one_work
    tx._one, tx._all = counted_one, counted_all  # type: ignore[method-assign,assignment]
    tx._one_work = counted_one_work  # type: ignore[method-assign,assignment]
    return queries


async def test_an_attempts_end_tells_its_state(loom_drivers: DriverFactory) -> None:
    """An attempt's end tells its transaction the state it left the attempt in: the binding of the start
    that follows it asks for that state, and gets it with no query. Catches: an end that no longer
    tells it (a query on SQLite); conftest's check catches a state told wrong."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)

        def complete_then_state(tx: Tx, now_ms: int) -> tuple[object, list[str]]:
            record_outcome_in_tx(tx, now_ms, Authority.of(lease), Completed(), KindPolicy())
            queries = counting_queries(tx)
            return tx.execution_state(lease.execution_id), queries[:]  # (the settle hook reads after)

        state, queries = await storage_of(driver.runtime).submit(complete_then_state)
        assert state is ExecutionState.COMPLETED
        caches = storage_of(driver.runtime).store.dialect.caches_reads
        assert len(queries) == (0 if caches else 1), f"the ended attempt's state was read: {queries}"


async def test_a_state_read_keeps_the_attempt_for_the_read_of_it_that_follows(
    loom_drivers: DriverFactory,
) -> None:
    """An attempt's state is read with its whole row, kept: a continuation's binding reads the waited
    attempt's state, then the attempt, in one query. Catches: a state read that keeps nothing (two
    queries on SQLite); conftest's check catches an attempt kept wrong."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)

        def state_then_attempt(tx: Tx, now_ms: int) -> tuple[object, object, list[str]]:
            queries = counting_queries(tx)
            state = tx.execution_state(lease.execution_id)
            execution = tx.execution(lease.execution_id)
            assert execution is not None
            return state, execution.state, queries[:]

        kept = storage_of(driver.runtime)._kept
        if kept is not None:  # (the row its claim's commit kept would answer both: this reads it)
            kept.attempts.clear()
        state, again, queries = await storage_of(driver.runtime).submit(state_then_attempt)
        assert state is again is ExecutionState.RUNNING
        caches = storage_of(driver.runtime).store.dialect.caches_reads
        assert len(queries) == (1 if caches else 2), f"the attempt was read again: {queries}"


async def test_a_state_told_wrong_fails_the_suites_check(loom_drivers: DriverFactory) -> None:
    """conftest's `checked_known` compares every attempt state told with a read."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)

        def tell_wrong(tx: Tx, now_ms: int) -> object:
            tx.ended(lease.execution_id, ExecutionState.FAILED)  # it is running
            return tx.execution_state(lease.execution_id)

        if not storage_of(driver.runtime).store.dialect.caches_reads:
            assert await storage_of(driver.runtime).submit(tell_wrong) is ExecutionState.RUNNING
            return
        with pytest.raises(AssertionError, match="execution_state made from its writes is not what"):
            await storage_of(driver.runtime).submit(tell_wrong)


async def test_a_wake_tells_the_work_as_it_wrote_it(loom_drivers: DriverFactory) -> None:
    """Routing an Event that wakes a Work's wait leaves the Work, ready with no open wait, kept for the
    start that follows in the same transaction (`start_at_once_in_tx` reads no admission facts, no
    Work and no queue place then). Catches: a wake that no longer tells them (nothing kept on SQLite);
    conftest's check catches a Work told wrong (say, with its woken wait still open)."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        offer = EventIn(source="t", delivery_id="d-go", type="w.go", scope="acme", key="k")
        route = RouteRef(name="w", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)

        def accept_route(tx: Tx, now_ms: int) -> tuple[object, list[str]]:
            event = accept_in_tx(tx, now_ms, offer, CausalLimits())
            work = tx.work(work_id)
            assert work is not None
            deliver(tx, now_ms, event.id, work, route)
            queries = counting_queries(tx)
            kept = tx.kept_work(work_id)
            woken = tx.work(work_id)
            assert woken is not None
            assert kept == woken if tx._caching else kept is None, "the woken Work is not kept as read"
            tx.queue_place(work_id)  # (told too: a wake moves no Work in the ready queue)
            return (woken.state, woken.wait_id), queries[:]

        (state, wait_id), queries = await storage_of(driver.runtime).submit(accept_route)
        assert (state, wait_id) == (WorkState.READY, None)
        caches = storage_of(driver.runtime).store.dialect.caches_reads
        assert len(queries) == (0 if caches else 3), f"the woken Work or its queue place was read: {queries}"


async def test_a_wake_inserts_its_bridge_without_looking_its_delivery_up(loom_drivers: DriverFactory) -> None:
    """A wait wakes once (one per attempt and epoch, and only an active one wakes), so the Event that
    records its wake is inserted without a read of its delivery identity first (`accept_derived_in_tx`'s
    ``unseen``); the insert still checks it, and an Event found there fails the wake, which commits
    nothing. Catches: the lookup made per wake; an insert that no longer checks (a second Event with
    the identity, or the wake going on with the one found)."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        [wait] = await driver.runtime.waits(work_id)
        route = RouteRef(name="w", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)

        def accept_route(n: int, *, squat: bool) -> Callable[[Tx, int], list[str]]:
            def proc(tx: Tx, now_ms: int) -> list[str]:
                if squat:  # an Event with the bridge's identity, which no wake would have made
                    bridge = EventIn(
                        source=CORE_SOURCE,
                        delivery_id=core_delivery_id("wait.woken", wait.id),
                        type="w.other",
                        scope="acme",
                    )
                    accept_in_tx(tx, now_ms, bridge, CausalLimits(), trusted=True)
                offer = EventIn(source="t", delivery_id=f"d-go-{n}", type="w.go", scope="acme", key="k")
                event = accept_in_tx(tx, now_ms, offer, CausalLimits())
                work = tx.work(work_id)
                assert work is not None
                queries = counting_queries(tx)
                deliver(tx, now_ms, event.id, work, route)
                return queries[:]

            return proc

        with pytest.raises(AssertionError, match="was accepted before"):
            await storage_of(driver.runtime).submit(accept_route(1, squat=True))
        [still] = await driver.runtime.waits(work_id)
        assert still.state is WaitState.ACTIVE, "the failed wake committed"
        queries = await storage_of(driver.runtime).submit(accept_route(2, squat=False))
        assert [q for q in queries if q == DELIVERY] == [], "the bridge's delivery was looked up"
        [woken] = await driver.runtime.waits(work_id)
        assert woken.state is WaitState.WOKEN
        assert woken.bridge_event_id is not None
        bridge = await driver.runtime.event(woken.bridge_event_id)
        assert bridge.type == WAIT_WOKEN


@pytest.mark.parametrize("start", [False, True], ids=["read-after", "start-after"])
async def test_a_wakes_move_to_ready_goes_with_the_claim_that_follows(
    loom_drivers: DriverFactory, start: bool
) -> None:
    """A wake moves its Work from waiting to ready, and the start that mostly follows in the same
    transaction moves it on to running: on a database alone the first move waits (`Tx.move_later`) and
    the claim's write carries it, one write of the Work's row; a read of the Work's facts meanwhile
    answers ready, and a read that is not patched has the move written first. Catches: the move written
    at once (two writes), a claim that compares against the state told rather than the one in the
    database (its write finds no row), a patched read that answers the database's state (waiting), and a
    flush that writes the revision without the state."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        before = await driver.runtime.work(work_id)
        route = RouteRef(name="w", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)
        admit = AdmitRequest(
            config=RUN, owner="t", lease_ms=60_000, limit=1, token_seed="s", advertised={"fake": ()}
        )

        def wake_then(tx: Tx, now_ms: int) -> tuple[list[object], list[str]]:
            offer = EventIn(source="t", delivery_id="d-go", type="w.go", scope="acme", key="k")
            event = accept_in_tx(tx, now_ms, offer, CausalLimits())
            work = tx.work(work_id)
            assert work is not None
            queries = counting_queries(tx)
            deliver(tx, now_ms, event.id, work, route)
            facts = tx.admission_facts(work_id)
            assert facts is not None
            seen: list[object] = [facts.state]
            if start:
                seen.append(start_at_once_in_tx(tx, now_ms, work_id, admit) is not None)
            else:
                seen.append(tx._one("SELECT state, revision FROM works WHERE id = ?", (work_id,)))
            return seen, [q for q in queries if q.startswith("UPDATE works")]

        shared = not storage_of(driver.runtime).store.dialect.caches_reads
        seen, writes = await storage_of(driver.runtime).submit(wake_then)
        if start:  # the routing's bump, the wake's move and the claim: one write alone on the database
            assert seen == [WorkState.READY, True]
            assert len(writes) == (3 if shared else 1), writes
            after = await driver.runtime.work(work_id)
            assert (after.state, after.revision) == (WorkState.RUNNING, before.revision + 3)
        else:  # the bump and the move, written before the read that is not patched
            assert seen == [WorkState.READY, ("ready", before.revision + 2)]
            assert len(writes) == (2 if shared else 1), writes


@pytest.mark.parametrize("claim", [True, False], ids=["claim-follows", "nothing-follows"])
async def test_an_attempts_end_moves_its_work_with_the_claim_that_follows(
    loom_drivers: DriverFactory, claim: bool
) -> None:
    """An attempt's end moves its Work from running to ready, and with input pending the claim that
    follows in the same transaction (`chains.complete_then_start_in_tx`) moves it back to running: on a
    database alone the end's move waits (`Tx.move_later`) and the claim's write carries it, one write of
    the Work's row. With no claim after it, the move waiting is written before the COMMIT. Catches: the
    end's move written at once (two writes; one where nothing follows), and a move that waits and is
    never written (the Work left running with no attempt)."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)
        await driver.runtime.publish(
            EventIn(source="t", delivery_id="d-2", type="w.go", scope="acme", key="k")
        )

        async def pending() -> bool:  # (the running attempt's own input is pending until it ends)
            return len((await driver.runtime.work(work_id)).pending_inputs) == 2

        await driver.until(pending, "the second Event pending for the running Work")
        admit = AdmitRequest(
            config=RUN, owner="t", lease_ms=60_000, limit=1, token_seed="s", advertised={"fake": ()}
        )

        def end(tx: Tx, now_ms: int) -> tuple[object, list[str]]:
            queries = counting_queries(tx)
            if claim:
                started = complete_then_start_in_tx(
                    tx, now_ms, Authority.of(lease), Completed(), KindPolicy(), CausalLimits(), (), admit
                )
                follows: object = started is not None
            else:
                follows = record_outcome_in_tx(tx, now_ms, Authority.of(lease), Completed(), KindPolicy())
            return follows, [q for q in queries if q.startswith("UPDATE works")]

        follows, writes = await storage_of(driver.runtime).submit(end)
        alone = storage_of(driver.runtime).store.dialect.caches_reads
        after = await driver.runtime.work(work_id)
        if claim:  # the end's move and the claim: one write alone on the database
            assert follows is True
            assert len(writes) == (1 if alone else 2), writes
            assert (after.state, after.attempts) == (WorkState.RUNNING, 2)
            assert after.current_execution_id not in (None, lease.execution_id)
        else:  # the move waits past the procedure, and is written with its COMMIT
            assert follows == work_id
            assert len(writes) == (0 if alone else 1), writes
            # ready, unless the runtime's own admission started its next attempt since: either way no
            # longer running the ended attempt, nor running with none (a move never written)
            assert (after.state, after.current_execution_id) == (WorkState.READY, None) or (
                after.state is WorkState.RUNNING
                and after.current_execution_id not in (None, lease.execution_id)
            ), after


EVENTS_TO_ROUTE_1 = EVENTS_TO_ROUTE.format(ids="?")
"""The read of one input's Event with its checkpoint (`InputsTx.input_checkpoints`)."""


async def test_an_input_an_earlier_commit_routed_is_claimed_without_reading_it(
    loom_drivers: DriverFactory,
) -> None:
    """An Event accepted and routed to a running Work as input in one commit is claimed in a later one:
    on a database alone that commit kept the Event and its checkpoint (`Carried.routed`), and the claim's
    binding and inputs (`InputsTx.input_checkpoints`, `InputsTx.input_events`) read neither; taken once,
    the next read reads them. A replay's replacement of a checkpoint forgets everything kept, even one
    undone. Catches: nothing kept (a read on SQLite), an input kept after a claim took it, and a
    replacement that leaves what was kept answering; conftest's checks catch an Event or checkpoint kept
    wrong."""
    async with loom_drivers(config=RUN) as driver:
        work_id, _ = await launched_attempt(driver)
        await driver.runtime.publish(
            EventIn(source="t", delivery_id="d-2", type="w.go", scope="acme", key="k")
        )

        async def pending(n: int) -> bool:
            return len((await driver.runtime.work(work_id)).pending_inputs) == n

        # (the running attempt's own input stays pending until the attempt ends)
        await driver.until(partial(pending, 2), "the second Event pending for the running Work")
        event_id = (await driver.runtime.work(work_id)).pending_inputs[-1]

        def claim_reads(tx: Tx, now_ms: int) -> tuple[list[object], list[str], list[str]]:
            queries = counting_queries(tx)
            routes = [cp.route if cp else None for _, cp in tx.input_checkpoints([event_id])]
            events = [event.id for event in tx.input_events([event_id])]
            return routes, events, queries[:]

        def replay_undone(tx: Tx, now_ms: int) -> None:
            checkpoint = tx.checkpoint(event_id)
            assert checkpoint is not None
            tx.replace_checkpoint(checkpoint, event_id, now_ms)
            raise LookupError("undo it")

        alone = storage_of(driver.runtime).store.dialect.caches_reads
        storage = storage_of(driver.runtime)
        assert await storage.submit(claim_reads) == (["w"], [event_id], [] if alone else [EVENTS_TO_ROUTE_1])
        routes, events, queries = await storage.submit(claim_reads)  # taken: read now
        assert (routes, events, queries) == (["w"], [event_id], [EVENTS_TO_ROUTE_1])

        await driver.runtime.publish(
            EventIn(source="t", delivery_id="d-3", type="w.go", scope="acme", key="k")
        )

        await driver.until(partial(pending, 3), "the third Event pending too")
        event_id = (await driver.runtime.work(work_id)).pending_inputs[-1]
        with pytest.raises(LookupError):
            await storage.submit(replay_undone)
        assert (await storage.submit(claim_reads))[2] == [EVENTS_TO_ROUTE_1]


async def test_an_attempt_an_earlier_commit_inserted_is_answered_from_what_it_kept(
    loom_drivers: DriverFactory,
) -> None:
    """An attempt's row, as the claim that inserted it committed it, answers the transactions after it on
    a database alone (`Carried.attempts`): the end's fenced read of the attempt and its token read
    nothing; a transaction that writes the row (a lease's renewal here) keeps it as it wrote it, and
    the next one reads nothing either. Catches: nothing kept (a read on SQLite) and a kept row that
    outlives a write of it unchanged (the old expiry); conftest's check catches a row kept wrong (one
    built at the insert, or patched at a write, unlike the read)."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)

        def read(tx: Tx, now_ms: int) -> tuple[object, object, object, list[str]]:
            queries = counting_queries(tx)
            execution = tx.execution(lease.execution_id)
            assert execution is not None
            token = tx.execution_token(lease.execution_id)
            return execution.state, execution.expires_at_ms, token, queries[:]

        def renew(tx: Tx, now_ms: int) -> int:
            tx.update_execution(lease.execution_id, expires_at_ms=now_ms + 120_000)
            return now_ms + 120_000

        storage = storage_of(driver.runtime)
        alone = storage.store.dialect.caches_reads
        state, expires, token, queries = await storage.submit(read)
        assert (state, expires, token) == (ExecutionState.RUNNING, lease.expires_at_ms, lease.token)
        assert len(queries) == (0 if alone else 2), queries  # (shared: the row, then its token)
        renewed = await storage.submit(renew)
        state, expires, token, queries = await storage.submit(read)
        assert (state, expires, token) == (ExecutionState.RUNNING, renewed, lease.token)
        assert len(queries) == (0 if alone else 2), queries


async def test_a_kv_entry_an_earlier_commit_read_is_answered_from_what_it_kept(
    loom_drivers: DriverFactory,
) -> None:
    """A KV entry (or its absence) as a committed transaction read it answers the transactions after it
    on a database alone (`Carried.kv`): the routing watermark an acceptance reads, read once, is not
    read again. A put keeps what it wrote, as a read gives it back (`Tx.kv_put`); a delete forgets the
    entry (`kv_delete`), and so does a put a savepoint's rollback undid (the entry is read again).
    Catches: nothing kept (a read per transaction on SQLite), a kept entry that outlives a put or a
    delete (the old value answered: conftest's check and this test's own), and a put that keeps its
    value unlike a read's (conftest's check)."""
    async with loom_drivers(config=RUN) as driver:
        storage = storage_of(driver.runtime)
        alone = storage.store.dialect.caches_reads

        def read(tx: Tx, now_ms: int) -> tuple[object, object, list[str]]:
            queries = counting_queries(tx)
            absent = tx.kv_get("test.kv", "absent")
            entry = tx.kv_get("test.kv", "x")
            return absent, entry.value if entry is not None else None, queries[:]

        def put(value: int, tx: Tx, now_ms: int) -> None:
            tx.kv_put("test.kv", "x", {"v": value}, now_ms)

        def put_undone(tx: Tx, now_ms: int) -> tuple[object, list[str]]:
            with contextlib.suppress(LookupError), tx.savepoint():
                tx.kv_put("test.kv", "x", {"v": 99}, now_ms)
                raise LookupError("undone")
            queries = counting_queries(tx)
            entry = tx.kv_get("test.kv", "x")
            return entry.value if entry is not None else None, queries[:]

        def delete(tx: Tx, now_ms: int) -> None:
            tx.kv_delete("test.kv", ["x"])

        await storage.submit(partial(put, 1))
        assert (await storage.submit(read))[:2] == (None, {"v": 1})  # read, and kept at its commit
        absent, value, queries = await storage.submit(read)
        assert (absent, value) == (None, {"v": 1})
        assert len(queries) == (0 if alone else 2), queries
        await storage.submit(partial(put, 2))
        absent, value, queries = await storage.submit(read)
        assert (absent, value) == (None, {"v": 2})
        assert len(queries) == (0 if alone else 2), queries  # (the put kept what it wrote)
        value, queries = await storage.submit(put_undone)
        assert value == {"v": 2}
        assert len(queries) == 1, queries  # (written, though undone: read again)
        await storage.submit(delete)
        absent, value, queries = await storage.submit(read)
        assert (absent, value) == (None, None)
        assert len(queries) == (1 if alone else 2), queries


async def test_an_input_claimed_by_the_commit_that_routed_it_is_not_kept(loom_drivers: DriverFactory) -> None:
    """An Event that creates a Work, which starts in the same commit, is that attempt's input: no later
    claim needs it, so that commit keeps nothing of it (`Carried.routed`). Catches: every routed Event
    kept until the bound forgets them all (memory, and the collector's time, growing with every Event a
    fresh Work starts on)."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)
        kept = storage_of(driver.runtime)._kept
        inputs = [event.id for event in lease.request.inputs]
        assert inputs, "the attempt took its Event"
        if kept is not None:  # (a database alone; a shared one keeps nothing at all)
            assert [event_id for event_id in inputs if event_id in kept.routed] == []


class Recording:
    """A transaction's connection that lists every statement sent through it."""

    def __init__(self, conn: object) -> None:
        self.conn, self.sent = conn, list[str]()

    def execute(self, sql: str, params: object = ()) -> object:
        self.sent.append(sql)
        return self.conn.execute(sql, params)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.conn, name)


async def test_a_wake_adds_its_winner_as_input_without_a_second_insert(loom_drivers: DriverFactory) -> None:
    """The Event that wakes a Work's wait was added to the Work's inputs by its routing just before, in
    the same transaction: the wake's own add finds it among the inputs this transaction inserted
    (`InputsTx.add_input`) and sends no insert. One undone by a savepoint's rollback is inserted again.
    Catches: a second insert per wake, and an input remembered through the rollback that undid it
    (never inserted: the Work would lose the Event)."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        route = RouteRef(name="w", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)

        def wake(tx: Tx, now_ms: int) -> tuple[list[str], object]:
            offer = EventIn(source="t", delivery_id="d-go", type="w.go", scope="acme", key="k")
            event = accept_in_tx(tx, now_ms, offer, CausalLimits())
            other = accept_in_tx(tx, now_ms, attrs.evolve(offer, delivery_id="d-other"), CausalLimits())
            work = tx.work(work_id)
            assert work is not None
            tx._conn = recording = Recording(tx._conn)  # type: ignore[assignment]
            try:
                deliver(tx, now_ms, event.id, work, route)
                with contextlib.suppress(LookupError), tx.savepoint():
                    tx.add_input(work_id, other.id, other.seq)
                    raise LookupError("undo it")
                tx.add_input(work_id, other.id, other.seq)
            finally:
                tx._conn = recording.conn  # type: ignore[assignment]
            inserts = [sql for sql in recording.sent if sql.startswith("INSERT INTO work_inputs")]
            return inserts, tx.input_state(work_id, other.id)

        inserts, state = await storage_of(driver.runtime).submit(wake)
        assert state is InputState.PENDING, "the input undone by the rollback was not inserted again"
        # the routing's, the one undone, the one after it: none for the wake
        assert len(inserts) == 3, inserts
        [woken] = await driver.runtime.waits(work_id)
        assert woken.state is WaitState.WOKEN


def insert_event(tx: Tx, now_ms: int, delivery_id: str, *, if_new: bool = False) -> int | None:
    return tx.insert_event(
        id=f"e-{delivery_id}", source="t", delivery_id=delivery_id, type="t.e", scope="s", key=None,
        work_id=None, execution_id=None, payload_json="{}", parent_id=None, cause_id=None,
        root_id=f"e-{delivery_id}", depth=0, accepted_at_ms=now_ms, if_new=if_new,
    )  # fmt: skip


async def test_an_events_insert_answers_its_rows_sequence_and_a_refused_one_none(rt: Runtime) -> None:
    """`Tx.insert_event` answers the sequence the row holds; with ``if_new``, ``None`` where the delivery
    identity is taken, drawing no sequence. On SQLite the sequence is the cursor's ``lastrowid`` and the
    insert sends no ``RETURNING`` (it costs SQLite a fifth of the insert). Catches: the row id read after
    an insert that wrote nothing (the last insert's sequence answered for a refused one), a sequence
    reused after the newest Event is removed, and ``RETURNING`` sent again on SQLite."""
    storage = storage_of(rt)

    def inserts(tx: Tx, now_ms: int) -> tuple[list[int | None], list[str]]:
        tx._conn = recording = Recording(tx._conn)  # type: ignore[assignment]
        try:
            seqs = [
                insert_event(tx, now_ms, "a"),
                insert_event(tx, now_ms, "b", if_new=True),
                insert_event(tx, now_ms, "a", if_new=True),  # taken: no row, no sequence drawn
                insert_event(tx, now_ms, "c"),
            ]
        finally:
            tx._conn = recording.conn  # type: ignore[assignment]
        return seqs, [sql for sql in recording.sent if sql.startswith("INSERT INTO events")]

    def rows(tx: Tx, now_ms: int) -> dict[str, int]:
        return dict(tx._conn.execute("SELECT id, seq FROM events WHERE source = 't'").fetchall())

    def remove_newest(tx: Tx, now_ms: int) -> None:
        tx._conn.execute("DELETE FROM events WHERE id = 'e-c'")

    seqs, sent = await storage.submit(inserts)
    stored = await storage.submit(rows)
    assert seqs == [stored["e-a"], stored["e-b"], None, stored["e-c"]]
    assert seqs[0] < seqs[1] < seqs[3] == seqs[1] + 1, f"a refused insert drew a sequence: {seqs}"
    assert len(sent) == 4
    returning = [sql for sql in sent if "RETURNING" in sql]
    assert returning == ([] if isinstance(storage.store, SQLiteStore) else sent), returning
    await storage.submit(remove_newest)
    [after] = await storage.submit(lambda tx, now_ms: [insert_event(tx, now_ms, "d")])
    assert after == seqs[3] + 1, "the sequence of the Event removed was drawn again"
    assert (await storage.submit(rows))["e-d"] == after


async def test_where_no_wait_exists_routing_and_a_claim_read_no_wait(rt: Runtime, loom_store: str) -> None:
    """A transaction alone on its database reads once whether any wait is open or any wake untaken,
    and then neither routing (the open waits on an Event's key) nor a claim (the Work's untaken wake)
    reads a wait while none exists. Catches: the waits read at each use (two reads per Event where
    nothing waits); on PostgreSQL, where another node may add a wait, they are read at each use."""
    work_id = await a_work(rt)

    def look(tx: Tx, now_ms: int) -> tuple[list[object], object, list[str]]:
        queries = counting_queries(tx)
        on_key = tx.open_waits_on_key("k") + tx.open_waits_on_key("other")
        wake = tx.untaken_wake(work_id)
        return on_key, wake, [q for q in queries if "FROM waits" in q]

    kept = storage_of(rt)._kept
    if kept is not None:  # (what an earlier commit knew would answer it: this transaction reads it)
        kept.clear()
    on_key, wake, reads = await storage_of(rt).submit(look)
    assert (on_key, wake) == ([], None)
    shared = loom_store.startswith("postgresql://")
    # alone: the one read of whether any exists; shared: the key's open waits (read anew after
    # nothing is written: the second key's too) and the Work's untaken wake
    assert len(reads) == (3 if shared else 1), f"waits were read where none exists: {reads}"


async def test_what_a_commit_knew_of_the_whole_store_answers_the_next_transaction(
    loom_drivers: DriverFactory,
) -> None:
    """What a transaction alone on its database knew at its commit of the whole store answers the next
    one (`Carried.max_seq`, `Carried.routed_through`, `Carried.none`): the newest Event's sequence, how
    far every Event is routed, and that no wait, open intent, pinned root or wait subscription exists
    are read by neither; a commit that parks an attempt on a wait makes the next read the waits again
    (and find it), and one that replaces a checkpoint makes it search again how far Events are routed.
    Catches: nothing carried (a read of each per transaction on SQLite), a "none" carried past the
    commit that wrote one (the wait not found), and a routed sequence carried past a replay (the
    unrouted Event passed by): this test, and conftest's checks of every answer against a read."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)
        storage = storage_of(driver.runtime)
        alone = storage.store.dialect.caches_reads

        def look(tx: Tx, now_ms: int) -> tuple[object, ...]:
            queries = counting_queries(tx)
            seen = (
                tx.max_seq(),
                tx.waits_exist(),
                tx.open_intents_exist(),
                tx.roots_pinned(),
                tx.wait_subscriptions_exist(),
            )
            through = tx.routed_through(0, seen[0], 100)
            return (*seen, through, queries[:])

        def park(tx: Tx, now_ms: int) -> None:
            record_outcome_in_tx(
                tx, now_ms, Authority.of(lease), Waiting(wait=WaitSpec(types=("w.go",))), KindPolicy()
            )

        await storage.submit(look)  # (read, and known at its commit)
        newest, waits, intents, roots, subscriptions, through, queries = await storage.submit(look)
        assert (waits, intents, roots, subscriptions) == (
            ((False, False), False, False, False) if alone else ((True, True), True, True, True)
        )
        assert through == (newest if alone else 0)
        assert len(queries) == (0 if alone else 1), queries  # (shared: the newest Event's sequence)
        await storage.submit(park)
        newest, waits, *_, queries = await storage.submit(look)
        assert waits[0], "the wait the last commit opened was not seen"
        assert [w.work_id for w in await storage.submit(lambda tx, now_ms: tx.open_waits_on_key("k"))] == [
            work_id
        ]
        if alone:
            assert [q for q in queries if "FROM waits" in q], "the waits were not read again"
        event = lease.request.inputs[0]

        def replace(tx: Tx, now_ms: int) -> None:  # (a replay's write: the Event is unrouted again)
            checkpoint = tx.checkpoint(event.id)
            assert checkpoint is not None
            tx.replace_checkpoint(checkpoint, event.id, now_ms)

        await storage.submit(replace)
        through = (await storage.submit(look))[5]
        assert through == (event.seq - 1 if alone else 0), "routed past the Event a replay made unrouted"


async def test_a_wait_this_transaction_opens_is_found_after_none_was(loom_drivers: DriverFactory) -> None:
    """A wait that a transaction opens after it read that none is open is found by the next routing in
    that transaction. Catches: the "none" kept through the transaction's own insert (the wait would
    never be woken by an Event routed in the same commit); conftest's check catches "none" kept where
    the store has one."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)

        def park_then_look(tx: Tx, now_ms: int) -> tuple[tuple[bool, bool], list[str]]:
            before = tx.waits_exist()
            record_outcome_in_tx(
                tx, now_ms, Authority.of(lease), Waiting(wait=WaitSpec(types=("w.go",))), KindPolicy()
            )
            return before, [w.work_id for w in tx.open_waits_on_key("k")]

        before, found = await storage_of(driver.runtime).submit(park_then_look)
        caches = storage_of(driver.runtime).store.dialect.caches_reads
        assert before == ((False, False) if caches else (True, True))
        assert found == [work_id], "the wait opened in this transaction was not found"

        def keep_none(tx: Tx, now_ms: int) -> list[object]:
            tx.waits_exist()
            tx._waits_exist = [False, False]
            return list(tx.open_waits_on_key("k"))

        if caches:
            with pytest.raises(AssertionError, match="waits kept as none"):
                await storage_of(driver.runtime).submit(keep_none)


async def test_a_wake_this_transaction_makes_is_found_by_its_claim(loom_drivers: DriverFactory) -> None:
    """A transaction that read that no wake is untaken, then woke a wait, finds that wake when it
    claims the Work's continuation (`WaitsTx.untaken_wake`). Catches: the "none" kept through its own
    wake (the continuation would start as a fresh attempt, without its winner)."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        offer = EventIn(source="t", delivery_id="d-go", type="w.go", scope="acme", key="k")
        route = RouteRef(name="w", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)

        def wake_then_look(tx: Tx, now_ms: int) -> tuple[bool, str | None]:
            untaken_before = tx.waits_exist()[1]
            event = accept_in_tx(tx, now_ms, offer, CausalLimits())
            work = tx.work(work_id)
            assert work is not None
            deliver(tx, now_ms, event.id, work, route)
            wake = tx.untaken_wake(work_id)
            return untaken_before, wake.winner_event_id if wake is not None else None

        untaken_before, winner = await storage_of(driver.runtime).submit(wake_then_look)
        caches = storage_of(driver.runtime).store.dialect.caches_reads
        assert untaken_before is not caches
        assert winner is not None, "the wake made in this transaction was not found"


async def test_a_wake_this_transaction_makes_is_answered_to_its_claim_without_a_read(
    loom_drivers: DriverFactory,
) -> None:
    """Where no wake was untaken when a transaction first looked, the wakes it makes are the only
    untaken ones: the claim of the continuation is answered from them as they were written, with no
    read, and a wake whose continuation started is no longer answered (`WaitsTx.untaken_wake`).
    Catches: the wake read again at each claim (one read per wake); a wake still answered after its
    continuation started (a second claim would take it again). conftest's check compares every answer
    with a read: a kept wake that is not what was written fails it (the first procedure here)."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        offer = EventIn(source="t", delivery_id="d-go", type="w.go", scope="acme", key="k")
        route = RouteRef(name="w", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)
        caches = storage_of(driver.runtime).store.dialect.caches_reads

        def wake(tx: Tx, now_ms: int) -> None:
            tx.waits_exist()
            event = accept_in_tx(tx, now_ms, offer, CausalLimits())
            work = tx.work(work_id)
            assert work is not None
            deliver(tx, now_ms, event.id, work, route)

        def wake_then_keep_it_wrong(tx: Tx, now_ms: int) -> object:
            wake(tx, now_ms)
            assert tx._untaken is not None
            (made,) = tx._untaken[work_id].values()
            tx._untaken[work_id][made.id] = attrs.evolve(made, reason="not what was written")
            return tx.untaken_wake(work_id)

        if caches:
            with pytest.raises(AssertionError, match="untaken wake as kept is not what a read answers"):
                await storage_of(driver.runtime).submit(wake_then_keep_it_wrong)

        def wake_claim_look(tx: Tx, now_ms: int) -> tuple[str | None, int, object]:
            queries = counting_queries(tx)
            wake(tx, now_ms)
            found = tx.untaken_wake(work_id)
            assert found is not None, "the wake made in this transaction was not found"
            reads = len([q for q in queries if "taken_at_ms IS NULL" in q and "work_id = ?" in q])
            tx.take_wake(found, now_ms)
            return found.winner_event_id, reads, tx.untaken_wake(work_id)

        winner, reads, after = await storage_of(driver.runtime).submit(wake_claim_look)
        assert winner is not None
        assert reads == (0 if caches else 1), "the untaken wake was read where the transaction made it"
        assert after is None, "a wake whose continuation started was answered again"


async def test_where_no_intent_is_open_an_attempts_end_reads_none(loom_drivers: DriverFactory) -> None:
    """An attempt's end stales its open intents; a transaction alone on its database reads once
    whether any intent is open, and reads no attempt's intents while none is, until it inserts one
    (`ExecutionsTx.open_intents_exist`). Catches: the intents read at each attempt's end (one read
    per attempt where no inject or interrupt is in flight); an intent this transaction inserted missed
    by its attempt's end (the "none" kept through its own insert: the intent would retarget nothing
    and never go stale); conftest's check catches a "none" kept where the store has one."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)
        event = await driver.runtime.publish(
            EventIn(source="t", delivery_id="d-2", type="w.go", scope="acme", key="k")
        )

        def look_insert_look(tx: Tx, now_ms: int) -> tuple[int, list[str], list[str]]:
            queries = counting_queries(tx)
            stale_open_intents_in_tx(tx, now_ms, "ex-other")  # (an attempt's end: a kernel step)
            none = tx.open_intents_of_execution(lease.execution_id)
            reads = len([q for q in queries if "FROM intents" in q])
            tx.insert_intent(
                id="in-1",
                kind=IntentKind.INJECT,
                work_id=work_id,
                event_id=event.id,
                execution_id=lease.execution_id,
                epoch=lease.epoch,
                now_ms=now_ms,
            )
            found = [i.id for i in tx.open_intents_of_execution(lease.execution_id)]
            return reads, [str(i) for i in none], found

        caches = storage_of(driver.runtime).store.dialect.caches_reads
        reads, none, found = await storage_of(driver.runtime).submit(look_insert_look)
        assert none == []
        assert reads == (1 if caches else 2), "an attempt's intents were read where none is open"
        assert found == ["in-1"], "the intent this transaction inserted was not found"

        await a_none_forced_where_one_exists_fails(
            driver, Tx.open_intents_exist, "_open_intents", "intents kept as none open"
        )


async def test_where_no_wait_declared_a_subscription_a_wake_reads_none(loom_drivers: DriverFactory) -> None:
    """A wake ends the subscriptions its wait declared; a transaction alone on its database reads once
    whether any wait declared one, and reads no wait's subscriptions while none did, until it writes
    one (`SubscriptionsTx.wait_subscriptions_exist`). Catches: the subscriptions read at each wake (one
    read per wake where no wait declares any); a subscription this transaction declared missed by a
    wake in it (the "none" kept through its own insert: it would stay live after its wait woke);
    conftest's check catches a "none" kept where the store has one."""
    async with loom_drivers(config=RUN) as driver:
        work_id = await waiting_work(driver)
        wait = (await driver.runtime.waits(work_id))[-1]

        def look_insert_look(tx: Tx, now_ms: int) -> tuple[int, list[str], list[str]]:
            queries = counting_queries(tx)
            none = [
                *tx.end_subscriptions_of_wait("wt-a", SubscriptionState.WOKEN, "woke", now_ms),
                *tx.end_subscriptions_of_wait("wt-b", SubscriptionState.WOKEN, "woke", now_ms),
            ]
            reads = len([q for q in queries if "FROM subscriptions" in q])
            tx.insert_subscription(
                Subscription(
                    namespace="wait",
                    id="s-1",
                    work_id=work_id,
                    dependent_key="k",
                    wait_id=wait.id,
                    source_key="other",
                    source_scope="acme",
                    target_scope="acme",
                    types=("w.*",),
                    after=0,
                    filter_name=None,
                    filter=None,
                    label="",
                    state=SubscriptionState.PENDING,
                    checkpoint_seq=0,
                    revision=1,
                    authorized=None,
                    reason=None,
                    created_at_ms=now_ms,
                    updated_at_ms=now_ms,
                )
            )
            ended = tx.end_subscriptions_of_wait(wait.id, SubscriptionState.WOKEN, "woke", now_ms)
            return reads, [s.name for s in none], [s.name for s in ended]

        caches = storage_of(driver.runtime).store.dialect.caches_reads
        reads, none, ended = await storage_of(driver.runtime).submit(look_insert_look)
        assert none == []
        assert reads == (1 if caches else 2), "a wait's subscriptions were read where no wait declared one"
        assert ended == ["wait/s-1"], "the subscription this transaction declared was not ended"

        await a_none_forced_where_one_exists_fails(
            driver, Tx.wait_subscriptions_exist, "_wait_subscriptions", "wait subscriptions kept as none"
        )


async def test_a_derived_events_causal_check_takes_two_statements_and_charges_nothing_when_full(
    rt: Runtime,
) -> None:
    """A derived Event charged to one root: where no root is pinned, no root's limits are read (a
    transaction alone on its database reads once whether any is, and its own pins say yes again),
    and the root's bucket is checked and charged in one statement that leaves a full bucket as it is
    (`causal.check_and_charge_in_tx`). Catches: a root's limits read for every derived Event, a
    bucket read before its charge, a full bucket charged anyway (the second derived Event in the
    minute of a root allowed one), a pin this transaction made missed by the next check; conftest's
    check catches "none pinned" kept where the store has one."""
    parent = await rt.publish(EventIn(source="shop", delivery_id="d-root", type="order.placed", scope=SCOPE))
    one = CausalLimits(per_minute=1)

    def child(n: int) -> EventIn:
        return EventIn(source="shop", delivery_id=f"d-child-{n}", type="order.noted", scope=SCOPE)

    def charge_twice(tx: Tx, now_ms: int) -> tuple[list[str], object, int, tuple[int, int] | None]:
        queries = counting_queries(tx)
        tx._conn = recording = Recording(tx._conn)  # type: ignore[assignment]
        try:  # (the charge is a write, sent with the connection's `execute`: reads go through `_one`)
            first = check_and_charge_in_tx(tx, now_ms, child(1), parent, None, one)
        finally:
            tx._conn = recording.conn  # type: ignore[assignment]
        assert not isinstance(first, CausalRejection), first
        statements = queries + [sql for sql in recording.sent if "causal_buckets" in sql]
        second = check_and_charge_in_tx(tx, now_ms, child(2), parent, None, one)
        tx.pin_causal_root("root-x", 7, 3)
        return (
            statements,
            second,
            tx.bucket_count(parent.root_id, utc_minute(now_ms)),
            tx.causal_root_limits("root-x"),
        )

    statements, second, count, pinned = await storage_of(rt).submit(charge_twice)
    caches = storage_of(rt).store.dialect.caches_reads
    assert len(statements) == 2, f"a derived Event's causal check took {statements}"
    assert not any(q.startswith("SELECT count FROM causal_buckets") for q in statements), statements
    if caches:
        assert not any("WHERE root_id" in q for q in statements if "causal_roots" in q), statements
    assert isinstance(second, CausalRejection), "the second derived Event passed a root allowed one"
    assert second.observed == 1
    assert count == 1, "the rejected Event was charged"
    assert pinned == (7, 3), "the root this transaction pinned was not read"

    def keep_none(tx: Tx, now_ms: int) -> bool:
        tx.roots_pinned()
        tx._pinned_roots = False
        return tx.roots_pinned()

    if caches:
        with pytest.raises(AssertionError, match="roots kept as none pinned"):
            await storage_of(rt).submit(keep_none)


# -- what a transaction knows routed -------------------------------------------------------------
# `Tx.routed_through`: the search for unrouted Events that an order check, a claim and a completion each
# make starts past what this transaction knows routed (the routing watermark, then on through each
# checkpoint it writes in order), so a batch of routed Events does not search the same ones again.


def unmatched(event_id: str) -> RouteRequest:
    return RouteRequest(
        event_id=event_id,
        decision=Unmatched(reason="nothing"),
        route=None,
        expected_revision=None,
        generation=1,
        from_handler=False,
    )


async def test_an_unrouted_event_below_a_later_routed_one_is_still_found(rt: Runtime) -> None:
    # catches knowledge moved on by any checkpoint written: the one of a later Event would carry it past
    # an Event still unrouted, and a completion would not see the Event it must wait for
    work_id = await a_work(rt)
    held = EventIn(source="shop", delivery_id="d-7", type="order.paid", scope=SCOPE, key="k")
    later = EventIn(source="shop", delivery_id="d-8", type="other", scope="elsewhere")

    def accept_two_route_the_later(tx: Tx, now_ms: int) -> tuple[list[str], list[str], list[str]]:
        before = [e.id for e in earlier_unrouted(tx, work_id, SCOPE, ["k"], tx.max_seq() + 1)]
        first = accept_in_tx(tx, now_ms, held, CausalLimits())
        second = accept_in_tx(tx, now_ms, later, CausalLimits())
        assert second.seq == first.seq + 1
        route_in_tx(tx, now_ms, unmatched(second.id), CausalLimits())
        after = [e.id for e in earlier_unrouted(tx, work_id, SCOPE, ["k"], tx.max_seq() + 1)]
        route_in_tx(tx, now_ms, unmatched(first.id), CausalLimits())
        routed = [e.id for e in earlier_unrouted(tx, work_id, SCOPE, ["k"], tx.max_seq() + 1)]
        return before, [first.id, *after], routed

    before, [held_id, *after], routed = await storage_of(rt).submit(accept_two_route_the_later)
    assert before == []
    assert after == [held_id], "an Event accepted unrouted was taken as routed"
    assert routed == []


async def test_a_search_reads_on_past_what_it_found_unrouted_once_that_is_routed(rt: Runtime) -> None:
    # catches knowledge that stays stuck at the first unrouted Event found once that is routed (correct,
    # but every later search would read the same Events again), and a search past an unrouted Event
    await a_work(rt)
    events = [
        EventIn(source="shop", delivery_id=f"d-{i}", type="order.paid", scope=SCOPE, key="k") for i in (9, 10)
    ]

    def accept_then_route_out_of_order(tx: Tx, now_ms: int) -> tuple[int, int, int]:
        first, second = (accept_in_tx(tx, now_ms, e, CausalLimits()) for e in events)
        newest = tx.max_seq()
        route_in_tx(tx, now_ms, unmatched(second.id), CausalLimits())
        stuck = tx.routed_through(0, newest, 10)
        route_in_tx(tx, now_ms, unmatched(first.id), CausalLimits())
        return first.seq, stuck, tx.routed_through(0, newest, 10)

    first_seq, stuck, moved = await storage_of(rt).submit(accept_then_route_out_of_order)
    if storage_of(rt).shared:
        # other nodes route meanwhile: a search starts at the watermark alone
        assert (stuck, moved) == (0, 0)
        return
    assert stuck == first_seq - 1, "the search went past an unrouted Event"
    assert moved == first_seq + 1, "routing the Event that stopped the search did not let it read on"


async def test_a_rolled_back_checkpoint_is_forgotten(rt: Runtime) -> None:
    # catches knowledge kept through a savepoint rolled back: the checkpoint it counted was undone
    work_id = await a_work(rt)
    offered = EventIn(source="shop", delivery_id="d-11", type="order.paid", scope=SCOPE, key="k")

    def route_undo_search(tx: Tx, now_ms: int) -> tuple[str, list[str]]:
        event = accept_in_tx(tx, now_ms, offered, CausalLimits())
        assert earlier_unrouted(tx, work_id, SCOPE, ["k"], event.seq + 1) == [event]
        try:
            with tx.savepoint():
                route_in_tx(tx, now_ms, unmatched(event.id), CausalLimits())
                assert earlier_unrouted(tx, work_id, SCOPE, ["k"], event.seq + 1) == []
                raise LookupError("undo it")
        except LookupError:
            pass
        return event.id, [e.id for e in earlier_unrouted(tx, work_id, SCOPE, ["k"], event.seq + 1)]

    event_id, found = await storage_of(rt).submit(route_undo_search)
    assert found == [event_id], "an Event whose checkpoint was rolled back was taken as routed"


# -- a Work's pending inputs, kept -----------------------------------------------------------------
# `InputsTx.pending_of`: read once per transaction, appended to by the inputs it adds in order, forgotten
# by anything else that changes them. conftest checks every answer against a read, in every test.


async def test_a_works_pending_inputs_are_read_once_and_kept_through_its_own_adds(rt: Runtime) -> None:
    """Catches: an added input missing from the kept list, one added out of acceptance order appended
    at the end, a consumption or a rolled-back add still answered (conftest's check fails each), and a
    list read again after each add in order or a consumption, or at the start though an earlier commit
    left it (the reads counted here)."""
    work_id = await a_work(rt)
    earlier = await rt.publish(EventIn(source="shop", delivery_id="d-e", type="other", scope="elsewhere"))
    offers = [EventIn(source="shop", delivery_id=f"d-p{i}", type="order.paid", scope=SCOPE) for i in range(4)]
    reads: list[int] = []

    def adds(tx: Tx, now_ms: int) -> list[tuple[str, ...]]:
        seen: list[tuple[str, ...]] = []
        all_rows = tx._all

        def counted(sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
            if sql == WORK_PENDING_SEQ:
                reads.append(len(seen))
            return all_rows(sql, params)

        tx._all = counted  # type: ignore[method-assign]
        reads.clear()  # a batch run again with savepoints (the one below rolls back) counts anew
        events = [accept_in_tx(tx, now_ms, offer, CausalLimits()) for offer in offers]
        seen.append(tx.pending_of(work_id))
        for event in events[:2]:
            tx.add_input(work_id, event.id, event.seq)
            seen.append(tx.pending_of(work_id))
        try:
            with tx.savepoint():
                tx.add_input(work_id, events[2].id, events[2].seq)
                raise LookupError("undo it")
        except LookupError:
            pass
        seen.append(tx.pending_of(work_id))
        tx.consume_if_pending(work_id, events[0].id, "ex_none")
        seen.append(tx.pending_of(work_id))
        tx.add_input(work_id, events[3].id, events[3].seq)
        seen.append(tx.pending_of(work_id))
        tx.add_input(work_id, earlier.id, earlier.seq)  # older than the newest pending: out of order
        seen.append(tx.pending_of(work_id))
        return [tuple(e.id for e in events), *seen]

    ids, *seen = await storage_of(rt).submit(adds)
    (first,) = seen[0]
    assert seen[1:4] == [(first, ids[0]), (first, ids[0], ids[1]), (first, ids[0], ids[1])]
    assert seen[4:] == [(first, ids[1]), (first, ids[1], ids[3]), (first, earlier.id, ids[1], ids[3])]
    caches = storage_of(rt).store.dialect.caches_reads
    # on SQLite read after the rollback and the add out of order only: the first answer is what the
    # Work's creating commit left (`Carried`), and a consumption tells what it leaves
    assert reads == ([3, 6] if caches else list(range(len(seen)))), reads


async def test_a_works_pending_inputs_a_commit_knew_answer_the_transactions_after_it(rt: Runtime) -> None:
    """On a database alone the pending inputs a committed transaction knew of a Work (read, or told by
    its own writes) answer the transactions after it without a read (`TxBase.committed`), and an input
    added goes on from them; a Work whose inputs a transaction wrote knowing none (nothing carried), or
    removed, is read again after its commit, and conftest's check compares every answer with a read.
    Catches: nothing carried past a commit (a read in each transaction), an add that does not go on
    from what was carried (a read after it), a list kept by an add that knew none (an input missing:
    conftest's check), and a removed Work's list carried (inputs it no longer has)."""
    work_id = await a_work(rt)
    caches = storage_of(rt).store.dialect.caches_reads
    offers = [EventIn(source="shop", delivery_id=f"d-c{i}", type="order.paid", scope=SCOPE) for i in range(3)]
    events = [await rt.publish(offer) for offer in offers]

    def pending(tx: Tx, now_ms: int) -> tuple[tuple[str, ...], int]:
        queries = counting_queries(tx)
        return tx.pending_of(work_id), len([q for q in queries if q == WORK_PENDING_SEQ])

    def add(event: Event, *, known: bool) -> Callable[[Tx, int], None]:
        def proc(tx: Tx, now_ms: int) -> None:
            if known:
                tx.pending_of(work_id)
            tx.add_input(work_id, event.id, event.seq)

        return proc

    first, _ = await storage_of(rt).submit(pending)
    await storage_of(rt).submit(add(events[0], known=True))
    after_known, reads_known = await storage_of(rt).submit(pending)
    assert after_known == (*first, events[0].id)
    assert reads_known == (0 if caches else 1), "a list the commit before knew was read again"
    await storage_of(rt).submit(add(events[1], known=False))  # (it goes on from what was carried)
    after_carried, reads_carried = await storage_of(rt).submit(pending)
    assert after_carried == (*first, events[0].id, events[1].id)
    assert reads_carried == (0 if caches else 1), "an add did not go on from the list carried"
    if caches:
        storage_of(rt)._kept.forget_pending()  # (as past its bound: `Carried.keep_pending`)
    await storage_of(rt).submit(add(events[2], known=False))
    after_unknown, reads_unknown = await storage_of(rt).submit(pending)
    assert after_unknown == (*first, *(event.id for event in events))
    assert reads_unknown == 1, "a Work's list was answered after a commit that wrote it unknown"
    await storage_of(rt).submit(lambda tx, now_ms: tx.remove_work(work_id, now_ms))
    assert await storage_of(rt).submit(pending) == ((), 1)


async def test_a_consumption_rebuilds_a_short_pending_list_and_drops_a_long_one(rt: Runtime) -> None:
    """A consumption tells the pending inputs it leaves when the list is short; a list longer than
    `_REBUILT` is read again when asked for instead (an attempt takes its inputs one by one: rebuilding
    a list of thousands at each would cost their square). Catches: a long list rebuilt at each
    consumption (no read after it), and a short one forgotten (a read)."""
    work_id = await a_work(rt)
    offers = [
        EventIn(source="shop", delivery_id=f"d-l{i}", type="order.paid", scope=SCOPE) for i in range(40)
    ]
    events = [await rt.publish(offer) for offer in offers]

    def consume_then_read(count: int) -> Callable[[Tx, int], int]:
        def proc(tx: Tx, now_ms: int) -> int:
            pending = tx.pending_of(work_id)
            for event in events[:count]:
                if event.id not in pending:
                    tx.add_input(work_id, event.id, event.seq)
            assert len(tx.pending_of(work_id)) >= count
            queries = counting_queries(tx)
            tx.consume_if_pending(work_id, tx.pending_of(work_id)[0], "ex_none")
            tx.pending_of(work_id)
            return len([q for q in queries if q == WORK_PENDING_SEQ])

        return proc

    caches = storage_of(rt).store.dialect.caches_reads
    assert await storage_of(rt).submit(consume_then_read(3)) == (0 if caches else 2)
    assert await storage_of(rt).submit(consume_then_read(40)) == (1 if caches else 2)


async def test_pending_inputs_kept_wrong_fail_the_suites_check(rt: Runtime) -> None:
    """conftest's `checked_pending` compares every kept answer with a read: a wrong one fails."""
    work_id = await a_work(rt)

    def keep_wrong(tx: Tx, now_ms: int) -> None:
        tx._pending[work_id] = (("ev_nothing",), 1)
        tx.pending_inputs(work_id)

    with pytest.raises(AssertionError, match="not what a read answers"):
        await storage_of(rt).submit(keep_wrong)


# -- what stays kept across writes that change no kept record ---------------------------------------


def counting_work_reads(tx: Tx) -> list[str]:
    """The Works ``tx`` reads from the store from now on (not those conftest's checks read)."""
    reads: list[str] = []
    keep = tx.keep

    def counted(kind: str, key: str, record: object) -> object:
        if kind == "work" and not getattr(tx, "reading_afresh", False):  # (conftest's checks read afresh)
            reads.append(key)
        return keep(kind, key, record)

    tx.keep = counted  # type: ignore[method-assign]
    return reads


async def test_an_event_accepted_leaves_what_was_read_answered(rt: Runtime) -> None:
    """A new Event changes no kept record, so a Work read before it is not read again after it.
    Catches: an acceptance that forgets what was read (each routed Event's Work read again). That a
    record kept across it is still what a read answers, conftest checks in every test."""
    work_id = await a_work(rt)
    offer = EventIn(source="shop", delivery_id="d-9", type="other", scope="elsewhere")

    def read_accept_read(tx: Tx, now_ms: int) -> list[str]:
        reads = counting_work_reads(tx)
        tx.work(work_id)
        accept_in_tx(tx, now_ms, offer, CausalLimits())
        tx.work(work_id)
        return reads

    reads = await storage_of(rt).submit(read_accept_read)
    assert len(reads) == (1 if storage_of(rt).store.dialect.caches_reads else 2)


async def test_a_work_routed_to_is_answered_as_routing_wrote_it(rt: Runtime) -> None:
    """Routing an Event into a Work tells the transaction the Work as it wrote it (its new revision, the
    input pending), its admission facts and its queue place (routing moves no Work in the queue): the
    start that follows, the next Event routed to it and the settle hook read none of them. Catches:
    routing that no longer tells one (a read after it is a query on SQLite); conftest's check catches
    one told wrong (say, a Work without its new input)."""
    work_id = await a_work(rt)
    offer = EventIn(source="shop", delivery_id="d-10", type="order.paid", scope=SCOPE, key="k")
    route = RouteRef(name="orders", scope=SCOPE, declared=Policy.QUEUE, policy=Policy.QUEUE)

    def accept_route_read(tx: Tx, now_ms: int) -> tuple[list[str], bool, object]:
        event = accept_in_tx(tx, now_ms, offer, CausalLimits())
        work = tx.work(work_id)
        assert work is not None
        deliver(tx, now_ms, event.id, work, route)
        queries = counting_queries(tx)
        after = tx.work(work_id)
        assert after is not None
        assert after.revision == work.revision + 1
        facts = tx.admission_facts(work_id)
        tx.queue_place(work_id)
        return queries[:], after.pending_inputs == (*work.pending_inputs, event.id), facts

    queries, pending, facts = await storage_of(rt).submit(accept_route_read)
    assert pending, "the routed Event is not the Work's newest pending input"
    assert isinstance(facts, AdmissionFacts)
    assert facts.has_pending
    if storage_of(rt).store.dialect.caches_reads:
        assert queries == [], f"the Work, its facts or its place was read again after routing: {queries}"


async def test_a_work_kept_wrong_fails_the_suites_check(rt: Runtime) -> None:
    """conftest's `checked_recall` compares every Work and admission facts answered from what was kept
    with a read."""
    work_id = await a_work(rt)

    def keep_wrong(tx: Tx, now_ms: int) -> bool:
        work = tx.work(work_id)
        assert work is not None
        tx._to_carry.tell("work", work_id, attrs.evolve(work, revision=work.revision + 1))
        again = tx.work(work_id)
        return again is not None and again.revision == work.revision

    def keep_wrong_facts(tx: Tx, now_ms: int) -> bool:
        facts = tx.admission_facts(work_id)
        assert facts is not None
        tx._to_carry.tell("facts", work_id, attrs.evolve(facts, held=not facts.held))
        return tx.admission_facts(work_id) == facts

    if not storage_of(rt).store.dialect.caches_reads:
        # a shared database keeps nothing: every read goes to it, and the wrong record is never answered
        assert await storage_of(rt).submit(keep_wrong)
        assert await storage_of(rt).submit(keep_wrong_facts)
        return
    with pytest.raises(AssertionError, match="a work kept by the transaction is not what a read answers"):
        await storage_of(rt).submit(keep_wrong)
    with pytest.raises(AssertionError, match="a facts kept by the transaction is not what a read answers"):
        await storage_of(rt).submit(keep_wrong_facts)


# -- timers' rows kept from the due head ------------------------------------------------------------


def arm_due(tx: Tx, now_ms: int, *names: str) -> None:
    """Arm a timer due now for each name (its id)."""
    for name in names:
        arm_in_tx(tx, now_ms, TimerSpec(id=name, fire_at_ms=now_ms, source="clock", type="tick", scope=SCOPE))


async def test_a_firing_pass_reads_its_due_timers_in_one_query(rt: Runtime) -> None:
    """The due head reads its timers' rows whole, and each firing of the pass answers its timer from
    them: no query per timer, on every backend (on PostgreSQL the head locked the rows, so nobody else
    can change them, and the lock is each firing's too). Catches: a firing that reads its timer again,
    or locks it again (three reads or three locks); conftest's check catches a row kept wrong."""
    await storage_of(rt).submit(arm_due, "t-1", "t-2", "t-3")

    def fire(tx: Tx, now_ms: int) -> tuple[list[str], list[str]]:
        queries = counting_queries(tx)
        done = fire_due_in_tx(tx, now_ms, 10, CausalLimits(), {})
        fired = [
            r.timer_id for r in done.results if isinstance(r, Firing) and r.result is FiringResult.ACCEPTED
        ]
        return fired, [
            sql for sql in queries if sql == TIMER_BY_ID or sql.startswith("SELECT id FROM timers")
        ]

    fired, reads = await storage_of(rt).submit(fire)
    assert fired == ["t-1", "t-2", "t-3"]
    assert reads == [], f"the pass read or locked its timers one by one: {reads}"


async def test_a_timer_written_after_the_due_head_is_read_anew(rt: Runtime) -> None:
    """A timer the transaction writes after the due head read it is answered as it is now. Catches: a
    kept row that survives its timer's write (the cancelled timer answered armed)."""
    await storage_of(rt).submit(arm_due, "t-1")

    def cancel_after_head(tx: Tx, now_ms: int) -> object:
        assert [row[0] for row in tx.due_head(now_ms, 10)] == ["t-1"]
        cancel_timer_in_tx(tx, now_ms, "t-1", 1)
        timer = tx.timer("t-1")
        assert timer is not None
        return timer.state

    assert await storage_of(rt).submit(cancel_after_head) is TimerState.CANCELLED


async def test_a_timer_kept_inside_a_savepoint_rolled_back_is_forgotten(rt: Runtime) -> None:
    """A timer armed and read by the due head inside a savepoint is gone once the savepoint is rolled
    back. Catches: kept rows that survive the rollback (the undone timer answered)."""

    def arm_read_undo(tx: Tx, now_ms: int) -> object:
        try:
            with tx.savepoint():
                arm_due(tx, now_ms, "t-undone")
                assert [row[0] for row in tx.due_head(now_ms, 10)] == ["t-undone"]
                raise LookupError("undo it")
        except LookupError:
            pass
        return tx.timer("t-undone")

    assert await storage_of(rt).submit(arm_read_undo) is None


async def test_a_timer_kept_wrong_fails_the_suites_check(rt: Runtime) -> None:
    """conftest's `checked_timer` compares every timer answered from the due head's rows with a read."""
    await storage_of(rt).submit(arm_due, "t-1")

    def keep_wrong(tx: Tx, now_ms: int) -> object:
        assert len(tx.due_head(now_ms, 10)) == 1
        row = tx._timer_rows["t-1"]
        tx._timer_rows["t-1"] = (*row[:3], row[3] + 1, *row[4:])
        timer = tx.timer("t-1")
        assert timer is not None
        return timer.fire_at_ms

    with pytest.raises(AssertionError, match="kept from the due head is not what a read answers"):
        await storage_of(rt).submit(keep_wrong)


async def test_arming_a_new_timer_reads_the_timer_and_its_tombstone_in_one_query(rt: Runtime) -> None:
    """Arming asks for the timer and, without one, for the revision compaction removed under its id: one
    query for both (a round trip each on PostgreSQL). Catches: the tombstone looked up in a query of its
    own. test_compaction's re-arming test shows the revision it answers is used."""

    def arm(tx: Tx, now_ms: int) -> list[str]:
        queries = counting_queries(tx)
        arm_due(tx, now_ms, "t-new")
        return queries

    queries = await storage_of(rt).submit(arm)
    assert queries == [TIMER_OR_REMOVED], f"arming read: {queries}"


async def test_a_recovery_reads_each_expired_attempt_once_and_its_adoption_none(
    loom_drivers: DriverFactory,
) -> None:
    """A recovery pass reads each expired attempt whole, with its Work's scope and kind, in its page of
    expired leases: the claim at the next epoch reads neither again; and the row the claim wrote answers
    the adoption's fenced read in the next transaction (a database alone; on a shared one both are
    read). Settling the pass reads nothing of the Work either (its attempt stays live: whether it can
    start did not change) and records the pass's time as its last change. Catches: a claim that reads
    the attempt or its Work again (a query each), a settle that reads the Work's admission facts, one
    that records no change, and an attempt's row forgotten at a write rather than kept as written (a
    read at the adoption); conftest's check catches a row kept wrong."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)
        storage = storage_of(driver.runtime)
        alone = storage.store.dialect.caches_reads
        at = lease.expires_at_ms  # the lease has just expired

        def recover(tx: Tx, now_ms: int) -> tuple[RecoverPass, list[str]]:
            if tx._kept is not None:
                tx._kept.clear()  # as after a restart: nothing an earlier commit knew answers
            queries = counting_queries(tx)
            found = recover_expired_in_tx(tx, at, 10, owner="recoverer", token_seed="seed", lease_ms=60_000)
            settle_in_tx(tx, at)  # (the storage actor's settle, which is not counted, finds nothing left)
            return found, queries[:]

        found, queries = await storage.submit(recover)
        (recovery,) = found.recoveries
        assert (recovery.lease.execution_id, recovery.lease.epoch) == (lease.execution_id, 2)
        assert recovery.lease.request.scope == "acme"
        by_id = [q for q in queries if q == EXECUTION_AND_CLOCK_BY_ID or "FROM works WHERE id" in q]
        assert (len(by_id) == 0) == alone, queries  # (shared: the attempt is read again, locked)
        assert _tx_admission._FACTS not in queries, queries
        work = await driver.runtime.work(work_id)
        assert work is not None
        assert work.updated_at_ms == at

        def adopt(tx: Tx, now_ms: int) -> tuple[ExecutionState, list[str]]:
            queries = counting_queries(tx)
            auth = Authority(execution_id=lease.execution_id, attempt=1, epoch=2, token=recovery.lease.token)
            return adopt_in_tx(tx, at, auth).state, queries[:]

        state, queries = await storage.submit(adopt)
        assert state is ExecutionState.RUNNING
        assert (queries.count(EXECUTION_AND_CLOCK_BY_ID) == 0) == alone, queries


async def test_a_recovered_attempts_adoption_and_end_write_it_once(loom_drivers: DriverFactory) -> None:
    """An executor that answers a recovered attempt's finished outcome has it adopted under the new fence
    and ended in one transaction (`adopt_then_complete_in_tx`): the move to running and the end are one
    write of the attempt's row, which ends completed at the recovery's epoch. Catches: an adoption
    written in a statement of its own (two writes), one whose move is lost (the end's write, sent for a
    running attempt, finds it recovering: `IllegalTransition`), and a move that waits kept past the
    savepoint rolled back that made it."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)
        storage = storage_of(driver.runtime)
        at = lease.expires_at_ms

        def recover(tx: Tx, now_ms: int) -> RecoverPass:
            return recover_expired_in_tx(tx, at, 10, owner="recoverer", token_seed="seed", lease_ms=60_000)

        (recovery,) = (await storage.submit(recover)).recoveries

        def adopt_and_end(tx: Tx, now_ms: int) -> list[str]:
            writes = Recording(tx._conn)
            tx._conn, conn = writes, tx._conn  # type: ignore[assignment]
            try:
                auth = Authority(
                    execution_id=lease.execution_id, attempt=1, epoch=2, token=recovery.lease.token
                )
                adopt_then_complete_in_tx(tx, at, auth, Completed(), KindPolicy(), CausalLimits(), ())
            finally:
                tx._conn = conn
            return [sql for sql in writes.sent if sql.startswith("UPDATE executions")]

        def adopt_undone(tx: Tx, now_ms: int) -> dict[str, object]:
            auth = Authority(execution_id=lease.execution_id, attempt=1, epoch=2, token=recovery.lease.token)
            with contextlib.suppress(RuntimeError), tx.savepoint():
                adopt_fence_in_tx(tx, at, auth, later=True)
                raise RuntimeError("undone")
            return dict(tx._states_later)

        # a move that waits goes with the savepoint that made it (nothing would write it after)
        assert await storage.submit(adopt_undone) == {}
        updates = await storage.submit(adopt_and_end)
        assert len(updates) == 1, updates
        ended = await driver.runtime.execution(lease.execution_id)
        assert ended is not None
        assert (ended.state, ended.epoch) == (ExecutionState.COMPLETED, 2)


async def test_an_attempts_row_patched_wrong_at_a_write_fails_the_suites_check(
    loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conftest's `checked_kept_attempt` compares the row a write kept (`_sql.execution_row_written`) with
    a read: one kept as it was before the write fails it."""
    async with loom_drivers(config=RUN) as driver:
        _, lease = await launched_attempt(driver)
        storage = storage_of(driver.runtime)
        if not storage.store.dialect.caches_reads:
            return  # (nothing kept on a shared database)
        monkeypatch.setattr(_sql_module, "execution_row_written", lambda row, values: row)

        def renew_then_read(tx: Tx, now_ms: int) -> object:
            tx.update_execution(lease.execution_id, expires_at_ms=now_ms + 120_000)
            return tx.execution(lease.execution_id)

        with pytest.raises(AssertionError, match="row as kept"):
            await storage.submit(renew_then_read)


async def test_a_new_works_routing_reads_no_tombstone_on_a_store_never_compacted(rt: Runtime) -> None:
    """Whether an id was taken by a Work compaction removed is asked at each new Work's routing; on a
    database alone, where nothing was ever removed, one read that none is answers every one (and the
    next transaction, told so, reads none). Catches: a tombstone read per new Work (three here);
    conftest's check catches a removal answered wrong (see the test after this one)."""
    storage = storage_of(rt)
    alone = storage.store.dialect.caches_reads

    def ask(tx: Tx, now_ms: int) -> tuple[list[bool], list[str]]:
        queries = counting_queries(tx)
        answers = [tx.work_removed(f"wk-{i}") for i in range(3)]
        return answers, [q for q in queries if "removed_works" in q]

    answers, reads = await storage.submit(ask)
    assert answers == [False] * 3
    assert len(reads) == (1 if alone else 3), reads
    answers, reads = await storage.submit(ask)
    assert answers == [False] * 3
    assert len(reads) == (0 if alone else 3), reads


async def test_a_work_removal_answered_wrong_fails_the_suites_check(rt: Runtime) -> None:
    """conftest's `checked_work_removed` compares every answer of `Tx.work_removed` with a read: a
    tombstone written behind the transaction's back (it tells nothing) is caught."""
    storage = storage_of(rt)
    if not storage.store.dialect.caches_reads:
        return  # (a shared database reads every time)

    def sneak(tx: Tx, now_ms: int) -> bool:
        tx.work_removed("wk-x")  # none was removed: known from here on
        tx._conn.execute("INSERT INTO removed_works (id, removed_at_ms) VALUES ('wk-x', 0)")  # (not told)
        return tx.work_removed("wk-x")

    with pytest.raises(AssertionError, match="a read finds otherwise"):
        await storage.submit(sneak)
