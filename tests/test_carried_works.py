"""A Work's records (the Work, its queue place, its admission facts) as a commit knew them answer the
transactions after it on a database alone, until a write of that Work's row or parts tells its
transaction so (`Carried.of_works`, `ToCarry.work_written`); within one transaction they answer through
writes of other Works' rows. conftest's `checked_recall` compares every one answered with a read."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
from test_tx_reads import CONFIG, RUN, SCOPE, a_work, counting_queries, deliver, launched_attempt, rt

from loom import CausalLimits, Completed, EventIn, ExecutionState, Waiting, WaitSpec, WorkState
from loom.kernel.accept import accept_in_tx
from loom.kernel.authority import Authority
from loom.kernel.executions import record_outcome_in_tx
from loom.kernel.kinds import KindPolicy
from loom.kernel.resolve import RouteRef
from loom.records.work import Policy, Work
from loom.runtime import Runtime
from loom.store import AdmissionFacts, QueuePlace, Tx
from loom.testing import T0_MS
from loom.testing.internals import storage_of
from loom.testing.pytest_plugin import DriverFactory

__all__ = ["CONFIG", "rt"]  # (the fixture, and the configuration it opens with)

WORK_READ = "SELECT w.id, w.scope"
"""How a Work's row with its parts is read (`_sql.work_with_parts`)."""


@attrs.frozen
class Seen:
    """A Work's records as one transaction answered them, and what it read to answer them."""

    work: Work
    place: QueuePlace
    facts: AdmissionFacts
    queries: list[str] = attrs.field(eq=False)


def look(work_id: str) -> Callable[[Tx, int], Seen]:
    """A procedure that asks for the Work's records, and what it read to answer them."""

    def records(tx: Tx, now_ms: int) -> Seen:
        queries = counting_queries(tx)
        work, place, facts = tx.work(work_id), tx.queue_place(work_id), tx.admission_facts(work_id)
        assert work is not None
        assert facts is not None
        return Seen(work, place, facts, queries[:])

    return records


async def test_a_works_records_a_commit_knew_answer_the_next_transaction(rt: Runtime) -> None:
    """The Work, its queue place and its admission facts read in one commit answer the next on a
    database alone, and so does the Work as a routing into it wrote it. Catches: nothing carried (their
    reads in every transaction on SQLite), and a routing that does not tell what it wrote (the Work read
    after it); conftest's check catches a record answered that a read does not give."""
    work_id = await a_work(rt)
    storage = storage_of(rt)
    alone = storage.store.dialect.caches_reads
    first = await storage.submit(look(work_id))
    again = await storage.submit(look(work_id))
    assert again == first
    assert (again.queries == []) is alone, again.queries  # (a shared database: each read again)

    offer = EventIn(source="shop", delivery_id="d-2", type="order.paid", scope=SCOPE, key="k")
    route = RouteRef(name="orders", scope=SCOPE, declared=Policy.QUEUE, policy=Policy.QUEUE)

    def route_one(tx: Tx, now_ms: int) -> str:
        event = accept_in_tx(tx, now_ms, offer, CausalLimits())
        work = tx.work(work_id)
        assert work is not None
        deliver(tx, now_ms, event.id, work, route)
        return event.id

    event_id = await storage.submit(route_one)
    await storage.submit(look(work_id))  # (the settle hook queued the Work after routing: a write of it)
    seen = await storage.submit(look(work_id))
    assert seen.work.pending_inputs[-1] == event_id
    assert (seen.queries == []) is alone, seen.queries


WRITES: dict[str, tuple[Callable[[Tx, str, int], object], Callable[[Seen], bool]]] = {
    "key": (
        lambda tx, work_id, now_ms: tx.attach_key("k2", work_id, tx.max_seq(), now_ms),
        lambda seen: "k2" in seen.work.keys,
    ),
    "hold": (
        lambda tx, work_id, now_ms: tx.update_work(work_id, now_ms, held=1, hold_reason="by hand"),
        lambda seen: seen.work.held and seen.facts.held,
    ),
    "enqueue": (
        lambda tx, work_id, now_ms: tx.enqueue_work(work_id, now_ms),
        lambda seen: seen.place.ready_seq is not None and seen.facts.ready_seq is not None,
    ),
    "block": (
        lambda tx, work_id, now_ms: tx.block_work(work_id, "start:by hand"),
        lambda seen: seen.work.blocked == "start:by hand" == seen.place.blocked,
    ),
    "changed": (
        lambda tx, work_id, now_ms: tx.mark_changed(work_id, now_ms + 5),
        lambda seen: seen.work.updated_at_ms == seen.facts.updated_at_ms == T0_MS + 5,
    ),
}
"""Writes of one part of a Work each, and how the next transaction's answers show it."""


@pytest.mark.parametrize("part", sorted(WRITES))
async def test_a_write_of_a_works_row_or_parts_makes_the_next_transaction_read_it(
    rt: Runtime, part: str
) -> None:
    """After a commit that wrote a Work's keys, hold, queue place, passed-over reason or time of last
    change, the next transaction reads the Work again and finds the write. Catches: that write not
    telling its transaction (`ToCarry.work_written`): the Work answered as the commit before knew it
    (this test's check of the part; conftest's check fails it first)."""
    work_id = await a_work(rt)
    storage = storage_of(rt)
    alone = storage.store.dialect.caches_reads
    write, written = WRITES[part]
    before = await storage.submit(look(work_id))
    kept = await storage.submit(look(work_id))
    if alone:
        assert kept.queries == [], "the Work's records were not kept"
    await storage.submit(lambda tx, now_ms: write(tx, work_id, now_ms))
    after = await storage.submit(look(work_id))
    assert written(after), f"the {part} written is not in what the next transaction answers: {after}"
    assert after != before
    assert [q for q in after.queries if q.startswith(WORK_READ)], "the Work was not read again"


async def test_blocks_lifted_at_once_make_every_work_read_again(rt: Runtime) -> None:
    """Lifting every passed-over reason at once (`Tx.unblock_all`, one statement naming no Work) makes
    every Work kept read again. Catches: it telling nothing (the Work answered still blocked)."""
    work_id = await a_work(rt)
    storage = storage_of(rt)
    await storage.submit(lambda tx, now_ms: tx.block_work(work_id, "start:by hand"))
    assert (await storage.submit(look(work_id))).work.blocked == "start:by hand"
    assert await storage.submit(lambda tx, now_ms: tx.unblock_all()) == 1
    assert (await storage.submit(look(work_id))).work.blocked is None


async def test_an_attempts_end_and_the_next_routing_read_no_work(loom_drivers: DriverFactory) -> None:
    """The hot path of a standing Work on a database alone: its attempt's claim tells what it wrote of
    the Work, so the attempt's end reads no Work; the end tells what it wrote, so the next Event's
    routing reads none; both across commits. Catches: a claim that tells nothing of the Work (a read at
    the end), an end that tells nothing (a read at the routing), and nothing carried across commits;
    conftest's check catches either told wrong (a Work whose attempt or inputs differ from a read)."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)
        storage = storage_of(driver.runtime)
        alone = storage.store.dialect.caches_reads
        offer = EventIn(source="t", delivery_id="d-2", type="w.go", scope="acme", key="k")

        def end(tx: Tx, now_ms: int) -> list[str]:
            queries = counting_queries(tx)
            record_outcome_in_tx(tx, now_ms, Authority.of(lease), Completed(), KindPolicy())
            return [q for q in queries if q.startswith(WORK_READ)]

        def route_next(tx: Tx, now_ms: int) -> tuple[list[str], Work | None]:
            queries = counting_queries(tx)
            accept_in_tx(tx, now_ms, offer, CausalLimits())
            work = tx.work(work_id)  # (what the routing reads first)
            return [q for q in queries if q.startswith(WORK_READ)], work

        reads = await storage.submit(end)
        assert (reads == []) is alone, f"the end read the Work its claim wrote: {reads}"
        reads, work = await storage.submit(route_next)
        assert (reads == []) is alone, f"the routing read the Work its attempt's end wrote: {reads}"
        assert work is not None
        assert (work.attempts, work.current_execution_id, work.pending_inputs) == (1, None, ())


async def test_a_parked_attempt_and_its_waiting_work_answer_the_wake(loom_drivers: DriverFactory) -> None:
    """An attempt that ends on a wait leaves its Work waiting (with the wait), its queue place and the
    attempt's row as its commit knew them: the Event that wakes it reads none of them (on a database
    alone). Catches: the registration not telling the Work with its wait (a read of the Work), nor its
    place (a read of the place), and an attempt's row read after its last write not carried (a read of
    the attempt); conftest's checks catch any answered that a read does not give."""
    async with loom_drivers(config=RUN) as driver:
        work_id, lease = await launched_attempt(driver)
        storage = storage_of(driver.runtime)
        alone = storage.store.dialect.caches_reads

        def park(tx: Tx, now_ms: int) -> None:
            waiting = Waiting(wait=WaitSpec(types=("w.go",)))
            record_outcome_in_tx(tx, now_ms, Authority.of(lease), waiting, KindPolicy())

        def wake_reads(tx: Tx, now_ms: int) -> tuple[Work | None, object, list[str]]:
            queries = counting_queries(tx)
            work, place = tx.work(work_id), tx.queue_place(work_id)
            state = tx.execution_state(lease.execution_id)  # (what the continuation's binding asks)
            return work, (place, state), queries[:]

        await storage.submit(park)
        work, (place, state), queries = await storage.submit(wake_reads)
        assert work is not None
        assert work.state is WorkState.WAITING
        assert work.wait_id is not None
        assert place.ready_seq is None  # type: ignore[attr-defined]
        assert state is ExecutionState.WAITED  # (the fake executor does not resume: its attempt ended)
        assert (queries == []) is alone, queries
