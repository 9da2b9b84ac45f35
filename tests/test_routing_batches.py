"""Routing in batches (docs/architecture.md, "Routing in batches"): the Events of a notice batch whose
first match needs no handler, or whose handler is pure, are routed in one storage request, each as
`route_in_tx` would, in acceptance order, and the Works they reach start at once in that same commit
with every input routed so far. The routing watermark follows them, so the per-Work order check reads
only Events not yet known routed.

Procedures are submitted to a runtime with no actors (`actors=()`), so nothing else routes meanwhile.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from test_tx_reads import counting_queries

import loom.actors.timers
import loom.kernel.chains
import loom.kernel.routing
import loom.kernel.unrouted
import loom.store._tx_inputs
from loom import App, CausalLimits, Config, EventIn, ManualClock, Runtime, TimerSpec, open_runtime
from loom.config import effective_routes
from loom.kernel.admission import AdmitRequest, start_at_once_in_tx
from loom.kernel.chains import RoutedBatch, route_batch_then_start_in_tx, route_then_start_in_tx
from loom.kernel.resolve import DeferredRoute, RoutePlan, RouteRequest, is_pure_handler, route_ref
from loom.kernel.routing import decide_in_tx
from loom.kernel.unrouted import raise_watermark_in_tx, routing_watermark
from loom.plugins.handlers import correlate, explicit_work, fresh
from loom.plugins.python_executor import PythonExecutor
from loom.plugins.schedule.policy import schedule_handler
from loom.records.events import Event
from loom.records.executor import Toolbelt
from loom.records.work import Completed, Lease, Outcome, RunRequest, Work
from loom.store import Tx
from loom.store._sql import CHECKPOINT_BY_EVENT, EVENTS_TO_ROUTE
from loom.testing import T0_MS
from loom.testing.internals import storage_of

SCOPE = "shop"
CONFIG = Config.from_dict(
    {
        "scopes": {
            SCOPE: {
                "bindings": {"py": {"executor": "python", "config": {"function": "run"}}},
                "routes": [{"name": "orders", "create_work": True, "binding": "py", "work_kind": "standing"}],
            }
        },
        "work_kinds": {"standing": {"standing": True}},
    }
)


@pytest.fixture
async def rt(loom_store: str) -> AsyncIterator[Runtime]:
    async with open_runtime(
        loom_store,
        clock=ManualClock(start_ms=T0_MS),
        config=CONFIG,
        plugins=[PythonExecutor()],
        load_entry_points=False,
        actors=(),
    ) as runtime:
        yield runtime


def order(n: int, key: str) -> EventIn:
    return EventIn(source="shop", delivery_id=f"d-{n}", type="order.placed", scope=SCOPE, key=key)


def deferred(event: Event, decide: Any = None) -> DeferredRoute:
    route = effective_routes(CONFIG, SCOPE)[0]
    handler = decide or correlate
    return DeferredRoute(
        event_id=event.id,
        decide=lambda e, w: handler(e, e.scope, w, route),
        route=route_ref(CONFIG, route),
        generation=CONFIG.generation,
    )


def admit() -> AdmitRequest:
    return AdmitRequest(
        config=CONFIG,
        owner="test",
        lease_ms=60_000,
        limit=1,
        token_seed=secrets.token_urlsafe(16),
        advertised={"python": frozenset()},
        executors=frozenset({"python"}),
    )


def _watermark(tx: Tx, now_ms: int) -> int:
    return routing_watermark(tx)


async def watermark_moves(rt: Runtime) -> bool:
    """On a shared database routing commits leave the watermark to the routing passes (its row would be
    a lock every node's routing waits on): there it must not move."""
    if storage_of(rt).shared:
        await route_batch(rt, [])
        assert await storage_of(rt).submit(_watermark) == 0, "a routing commit raised a shared watermark"
        return False
    return True


async def route_batch(rt: Runtime, requests: list[DeferredRoute]) -> RoutedBatch:
    batch: RoutedBatch = await storage_of(rt).submit(
        route_batch_then_start_in_tx, requests, CausalLimits(), admit()
    )
    return batch


async def test_a_batch_routes_a_keys_events_in_order_and_starts_one_attempt_with_all_of_them(
    rt: Runtime,
) -> None:
    """Wrong implementations caught: a start per routed Event (the first attempt takes one input and
    the rest wait), a second Work created for the key by a later Event of the batch, inputs out of
    acceptance order, a commit per Event."""
    events = [await rt.publish(order(n, "k" if n != 3 else "j")) for n in range(6)]
    batches = storage_of(rt).stats.batches
    batch = await route_batch(rt, [deferred(e) for e in events])
    assert storage_of(rt).stats.batches == batches + 1, "the batch and its starts are one commit"
    assert batch.retry == ()
    by_work = {lease.work_id: lease for lease in batch.started}
    assert len(by_work) == 2, f"one attempt per Work, got {batch.started}"
    k = await rt.work_for_key("k")
    j = await rt.work_for_key("j")
    assert k is not None
    assert j is not None
    assert k.id != j.id
    k_inputs = [e.id for e in by_work[k.id].request.inputs]
    assert k_inputs == [e.id for e in events if e.key == "k"], "every routed input, in acceptance order"
    assert [e.id for e in by_work[j.id].request.inputs] == [events[3].id]
    assert len({lease.token for lease in batch.started}) == 2, "each start has a lease token of its own"
    for event in events:
        checkpoint = await rt.checkpoint(event.id)
        assert checkpoint is not None
        assert checkpoint.work_id == (k.id if event.key == "k" else j.id)


async def test_an_event_whose_handler_fails_goes_back_to_its_lane_with_every_later_one_of_its_work(
    rt: Runtime,
) -> None:
    """Wrong implementations caught: a failed decision that aborts the whole batch (the other key's
    Event unrouted), and a batch that routes a Work's later Events past an earlier unrouted one."""
    events = [await rt.publish(order(n, "k" if n != 2 else "j")) for n in range(5)]

    def explodes(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.id == events[1].id:
            raise RuntimeError("boom")
        return correlate(event, scope, work, route)

    batch = await route_batch(rt, [deferred(e, explodes) for e in events])
    assert batch.retry == (events[1].id, events[3].id, events[4].id)
    assert await rt.checkpoint(events[0].id) is not None
    assert await rt.checkpoint(events[2].id) is not None, "another Work's Event is routed regardless"
    for event in (events[1], events[3], events[4]):
        assert await rt.checkpoint(event.id) is None
    k = await rt.work_for_key("k")
    assert k is not None
    assert k.current_execution_id is not None
    assert k.pending_inputs == (events[0].id,), "its attempt took the one Event routed before the failure"
    if await watermark_moves(rt):
        assert await storage_of(rt).submit(_watermark) == events[1].seq - 1, (
            "the watermark stops below the first unrouted Event"
        )


async def test_a_pure_handler_raising_a_database_error_fails_only_its_event(rt: Runtime) -> None:
    """Wrong implementation caught: a handler's own exception that looks like a storage failure (a
    sqlite3 error) taken for one, failing the whole storage batch (and stopping the runtime) instead of
    sending that one Event to its lane."""
    events = [await rt.publish(order(n, f"k{n}")) for n in range(2)]

    def broken(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.id == events[0].id:
            raise sqlite3.OperationalError("disk I/O error (the handler's own database)")
        return correlate(event, scope, work, route)

    batch = await route_batch(rt, [deferred(e, broken) for e in events])
    assert batch.retry == (events[0].id,)
    assert await rt.checkpoint(events[1].id) is not None


async def test_the_watermark_is_raised_to_just_below_the_first_unrouted_event_and_no_further(
    rt: Runtime,
) -> None:
    """Wrong implementations caught: a watermark raised past an unrouted Event (the order check would
    then miss it and route a later Event of its Work first), and one never raised (each order check
    reads the Work's whole history)."""
    events = [await rt.publish(order(n, f"k{n}")) for n in range(4)]
    await route_batch(rt, [deferred(events[0]), deferred(events[1]), deferred(events[3])])
    if not await watermark_moves(rt):
        return
    assert await storage_of(rt).submit(_watermark) == events[2].seq - 1
    await storage_of(rt).submit(raise_watermark_in_tx)
    assert await storage_of(rt).submit(_watermark) == events[2].seq - 1, "raised past an unrouted Event"
    await route_batch(rt, [deferred(events[2])])
    assert await storage_of(rt).submit(_watermark) == events[3].seq


async def test_one_raise_reads_a_bounded_window(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrong implementation caught: a raise that reads every Event above the watermark at once (its
    cost would follow the backlog, not the window). What the routing's commit knew is forgotten first:
    it would answer every raise with no read at all (`Carried.routed_through`)."""
    monkeypatch.setattr(loom.kernel.unrouted, "RAISE_WINDOW", 3)
    events = [await rt.publish(order(n, "k")) for n in range(7)]
    with monkeypatch.context() as routing_alone:  # routed, the watermark left behind
        routing_alone.setattr(loom.kernel.chains, "raise_watermark_in_tx", lambda tx, now_ms: None)
        await route_batch(rt, [deferred(e) for e in events])
    if not await watermark_moves(rt):
        return
    kept = storage_of(rt)._kept
    if kept is not None:  # (the routing's commit knew them all routed: a raise would read nothing)
        kept.clear()
    assert await storage_of(rt).submit(_watermark) == 0
    await storage_of(rt).submit(raise_watermark_in_tx)  # one window
    assert await storage_of(rt).submit(_watermark) == events[2].seq
    await storage_of(rt).submit(raise_watermark_in_tx)
    assert await storage_of(rt).submit(_watermark) == events[5].seq
    await storage_of(rt).submit(raise_watermark_in_tx)
    assert await storage_of(rt).submit(_watermark) == events[6].seq


async def test_a_routing_commit_raises_the_watermark_through_what_it_routed_in_order(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoints a routing transaction writes in acceptance order prove those Events routed: its
    raise takes the watermark past them all without reading them again, a window notwithstanding.
    Wrong implementation caught: knowledge moved past an Event the batch did not route."""
    monkeypatch.setattr(loom.kernel.unrouted, "RAISE_WINDOW", 3)
    events = [await rt.publish(order(n, "k")) for n in range(6)] + [await rt.publish(order(6, "other"))]
    await route_batch(rt, [deferred(e) for e in events[:5]])
    if not await watermark_moves(rt):
        return
    assert await storage_of(rt).submit(_watermark) == events[4].seq
    batch = await route_batch(rt, [deferred(events[6])])  # another key's: routed past events[5]
    assert batch.retry == ()
    assert await storage_of(rt).submit(_watermark) == events[4].seq, "raised past an unrouted Event"


def test_loom_s_own_handlers_are_pure_and_a_coroutine_never_is() -> None:
    """Wrong implementation caught: a handler deferred into the transaction without saying it is pure
    (an async handler would return a coroutine there)."""
    for handler in (correlate, explicit_work, fresh, schedule_handler):
        assert is_pure_handler(handler), handler

    def plain(*args: Any) -> Any:
        return None

    async def coro(*args: Any) -> Any:
        return None

    coro.pure = True  # type: ignore[attr-defined]
    assert not is_pure_handler(plain)
    assert not is_pure_handler(coro)
    assert not is_pure_handler(partial(plain))


async def test_a_burst_for_one_work_is_one_attempt_taking_every_event(loom_store: str) -> None:
    """Through the running router: Events accepted in one commit reach their Work in one routing commit,
    and its first attempt takes them all, in acceptance order. Wrong implementations caught: a router
    that routes a pure handler's Events one lane commit each (the first attempt starts with one input).
    """
    seen: list[tuple[str, ...]] = []
    executor = PythonExecutor()

    @executor.function("run")
    async def run(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        seen.append(tuple(e.id for e in request.inputs))
        return Completed()

    async with open_runtime(
        loom_store,
        clock=ManualClock(start_ms=T0_MS),
        config=CONFIG,
        plugins=[executor],
        load_entry_points=False,
    ) as rt:
        accepted = await rt.publish_many([order(n, "k") for n in range(10)])
        await rt.wait_idle()
        ids = tuple(e.id for e in accepted if isinstance(e, Event))
        assert len(ids) == 10
        assert seen == [ids], f"one attempt with every input in order, got {seen}"


def test_an_app_says_which_of_its_handlers_are_pure() -> None:
    app = App()

    @app.route_handler("checked", pure=True)
    def checked(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        return correlate(event, scope, work, route)

    @app.route_handler("looks_outside")
    def looks_outside(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        return correlate(event, scope, work, route)

    assert is_pure_handler(checked)
    assert not is_pure_handler(looks_outside)


class Held:
    """A python executor whose ``run`` attempts stay running until ``release`` is set."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = trio.Event()
        self.executor = PythonExecutor()
        self.executor.register("run", self.run)

    async def run(self, request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        self.started.append(request.execution_id)
        await self.release.wait()  # the attempt stays running while the test looks
        return Completed()


async def test_an_event_is_routed_in_its_own_acceptance_commit(loom_store: str) -> None:
    """With the router running on a store of its own, an Event whose handler is pure (or that needs
    none) is routed, and its Work started, by the commit that accepts it: when ``publish`` returns, the
    checkpoint and the attempt are there, with no wait for the router. Wrong implementation caught:
    routing left to the router's reading of the acceptance notice (a commit later). On a shared database
    routing stays out of the acceptance commit (its order lock), so there it is only eventually routed."""
    held = Held()
    release, started = held.release, held.started
    async with open_runtime(
        loom_store,
        clock=ManualClock(start_ms=T0_MS),
        config=CONFIG,
        plugins=[held.executor],
        load_entry_points=False,
    ) as rt:
        await rt.wait_idle()
        accepted = await rt.publish(order(1, "k"))
        checkpoint = await rt.checkpoint(accepted.id)
        work = await rt.work_for_key("k") if checkpoint is not None else None
        if storage_of(rt).shared:
            await rt.wait_idle()
            assert await rt.checkpoint(accepted.id) is not None
            release.set()
            return
        assert checkpoint is not None, "the acceptance commit did not route its Event"
        assert work is not None
        assert work.current_execution_id is not None, "the acceptance commit did not start the Work"
        elsewhere = await rt.publish(EventIn(source="s", delivery_id="x", type="other", scope="nowhere"))
        unmatched = await rt.checkpoint(elsewhere.id)
        assert unmatched is not None, "an Event no route matches is checkpointed in its acceptance commit too"
        await rt.wait_idle()
        assert started == [work.current_execution_id]
        release.set()


async def test_a_due_timer_is_fired_routed_and_its_work_started_in_one_commit(
    loom_store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the router running on a store of its own, the timer actor's firing pass routes the Events
    it accepts and starts their Works in its own commit (`chains.fire_then_route_in_tx`). Wrong
    implementation caught: fired Events left to the router's reading of the firing notice (the pass
    would start nothing)."""
    passes: list[int] = []
    real = loom.actors.timers.fire_then_route_in_tx

    def counted(*args: Any, **kwargs: Any) -> Any:
        done, started = real(*args, **kwargs)
        passes.append(len(started))
        return done, started

    monkeypatch.setattr(loom.actors.timers, "fire_then_route_in_tx", counted)
    held = Held()
    release = held.release
    clock = ManualClock(start_ms=T0_MS)
    async with open_runtime(
        loom_store, clock=clock, config=CONFIG, plugins=[held.executor], load_entry_points=False
    ) as rt:
        await rt.arm(
            TimerSpec(
                id="t-1", fire_at_ms=T0_MS + 1_000, source="shop", type="order.due", scope=SCOPE, key="k"
            )
        )
        await rt.wait_idle()
        clock.advance(1_000)
        await rt.wait_idle()
        work = await rt.work_for_key("k")
        release.set()
        if storage_of(rt).shared:
            # a keyed Event that makes Work: routing it would hold the order lock for its reads
            assert passes, "the firing passes ran"
            assert sum(passes) == 0, "a shared database's firing commit routed a keyed Event into Work"
            assert work.current_execution_id is not None, "its lane routed it and started the Work"
            return
        assert sum(passes) == 1, f"the firing pass started the attempt, got {passes}"
        assert work.current_execution_id is not None


async def test_the_works_a_batch_creates_start_from_what_their_routing_wrote(rt: Runtime) -> None:
    """A Work the batch created is started without reading it again: its row, its admission facts and
    its input's checkpoint are held from the routing's own writes through the other Events' routing
    (`TxBase.hold`; on PostgreSQL the Work and its facts, which only this transaction can see, the
    checkpoint is read). A later Event routed to the first Work changes it: its start reads it again
    and takes both inputs. Settling the ready queue after the starts reads no Work's facts: each
    start's are held through the others. Catches: nothing held (a read of each per start), a held
    Work answered after a later Event changed it (its attempt would take one input; conftest's check
    fails it too), and the starts' facts not held, or the settling done once they are let go (a read
    of each started Work's facts)."""
    events = [await rt.publish(order(n, key)) for n, key in enumerate(["a", "b", "c", "a"])]

    def batch(tx: Tx, now_ms: int) -> tuple[RoutedBatch, list[str]]:
        queries = counting_queries(tx)
        routed = route_batch_then_start_in_tx(
            tx, now_ms, [deferred(e) for e in events], CausalLimits(), admit()
        )
        return routed, queries  # (the list itself: what the settle hook reads after it counts too)

    routed, queries = await storage_of(rt).submit(batch)
    inputs = {lease.work_id: [e.id for e in lease.request.inputs] for lease in routed.started}
    works = [await rt.work_for_key(key) for key in "abc"]
    assert [inputs[w.id] for w in works if w is not None] == [
        [events[0].id, events[3].id],
        [events[1].id],
        [events[2].id],
    ]
    work_reads = [q for q in queries if q.startswith("SELECT w.id, w.scope")]
    fact_reads = [q for q in queries if q.startswith("SELECT w.state, w.held")]
    checkpoint_reads = [q for q in queries if q.startswith(INPUT_CHECKPOINTS)]
    # Each created Work's target is read (none found); the fourth Event's finds Work a held. Routing it
    # there changes a, and what that routing wrote answers a's start (on SQLite the watermark's move
    # after the batch is a write too, but of no Work: `ToCarry.work_written`). The checkpoints of b's
    # and c's inputs are held on SQLite; a's input's is read.
    shared = storage_of(rt).shared
    assert (len(work_reads), len(fact_reads), len(checkpoint_reads)) == ((3, 0, 3) if shared else (3, 0, 1))


async def decided_route(rt: Runtime, event: Event) -> RouteRequest:
    """The route ``event`` takes, decided over its Work as it is now (as its lane would)."""
    decided = await storage_of(rt).submit(lambda tx, now_ms: decide_in_tx(tx, deferred(event)))
    assert decided is not None
    return decided


async def test_a_lanes_routing_starts_the_work_it_created_from_what_it_wrote(rt: Runtime) -> None:
    """The same for one Event routed by its lane (`chains.route_then_start_in_tx`): the watermark's move
    between the routing and the start is a write (on SQLite), and the start still reads neither the
    Work it created nor its facts nor its input's checkpoint (on PostgreSQL the checkpoint is read).
    Catches: the lane's routing and start not holding (the start reads them)."""
    event = await rt.publish(order(0, "a"))
    decided = await decided_route(rt, event)

    def route(tx: Tx, now_ms: int) -> tuple[Lease | None, list[str]]:
        queries = counting_queries(tx)
        _, lease = route_then_start_in_tx(tx, now_ms, decided, CausalLimits(), admit())
        return lease, [q for q in queries if q.startswith(START_READS)]

    lease, reads = await storage_of(rt).submit(route)
    assert lease is not None, "the created Work started"
    work_reads = [q for q in reads if q.startswith("SELECT w.id, w.scope")]
    assert len(work_reads) == 1, "the target read alone (none found)"
    assert len(reads) - 1 == (1 if storage_of(rt).shared else 0), reads


INPUT_CHECKPOINTS = EVENTS_TO_ROUTE.partition("{")[0]
"""How the binding of a start reads its inputs' checkpoints (with their Events: `Tx.input_checkpoints`)."""
START_READS = ("SELECT w.id, w.scope", "SELECT w.state, w.held", INPUT_CHECKPOINTS)
"""What a start reads of a Work and its input: the Work, its admission facts, the input's checkpoint."""


async def test_an_acceptance_that_routes_starts_the_work_it_created_from_what_it_wrote(rt: Runtime) -> None:
    """The same for an Event routed in its own acceptance commit (`chains.accept_then_route_in_tx`).
    Catches: the acceptance's routing and start not holding (the start reads them, once the watermark's
    move is a write between them)."""
    route = effective_routes(CONFIG, SCOPE)[0]
    plan = RoutePlan(
        decide=lambda e, w: correlate(e, e.scope, w, route),
        route=route_ref(CONFIG, route),
        generation=CONFIG.generation,
    )
    for n in range(loom.kernel.chains.WATERMARK_EVERY):  # the next acceptance moves the watermark (SQLite)
        await rt.publish(order(n, f"k-{n}"))

    def accept(tx: Tx, now_ms: int) -> tuple[tuple[Lease, ...], list[str]]:
        queries = counting_queries(tx)
        _, leases, _ = loom.kernel.chains.accept_then_route_in_tx(
            tx, now_ms, order(99, "a"), CausalLimits(), plan, admit()
        )
        return leases, [q for q in queries if q.startswith(START_READS)]

    leases, reads = await storage_of(rt).submit(accept)
    assert len(leases) == 1, "the created Work started"
    work_reads = [q for q in reads if q.startswith("SELECT w.id, w.scope")]
    assert len(work_reads) == 1, "the target read alone (none found)"
    assert len(reads) - 1 == (1 if storage_of(rt).shared else 0), reads


async def test_a_routings_revision_bump_goes_with_the_start_that_follows(rt: Runtime) -> None:
    """An Event routed into a Work that exists and can start (`chains.route_then_start_in_tx`): the
    routing bumps the Work's revision and the start moves it to running; on a database alone the two
    are one statement (`TxBase.bump_work`), and the Work ends two revisions on, changed at the routing's
    time. Catches: the bump written alone (two statements), and a bump that waits and is lost (one
    revision on)."""
    first = await rt.publish(order(0, "a"))
    await storage_of(rt).submit(route_batch_then_start_in_tx, [deferred(first)], CausalLimits(), None)
    before = await rt.work_for_key("a")
    assert before is not None
    assert before.state == "ready"
    second = await rt.publish(order(1, "a"))
    decided = await decided_route(rt, second)

    def route(tx: Tx, now_ms: int) -> tuple[Lease | None, list[str]]:
        queries = counting_queries(tx)
        _, lease = route_then_start_in_tx(tx, now_ms, decided, CausalLimits(), admit())
        return lease, [q for q in queries if q.startswith("UPDATE works")]

    lease, writes = await storage_of(rt).submit(route)
    assert lease is not None
    assert [e.id for e in lease.request.inputs] == [first.id, second.id]
    after = await rt.work_for_key("a")
    assert after is not None
    assert (after.state, after.revision) == ("running", before.revision + 2)
    assert after.updated_at_ms == T0_MS
    assert len(writes) == (2 if storage_of(rt).shared else 1), writes


async def test_a_routings_revision_bump_with_no_start_after_it_is_written_at_the_end(rt: Runtime) -> None:
    """Events routed into a Work that is running: nothing follows the bump, which is written alone at
    the COMMIT of the storage actor's batch, or when the routing's block ends in a transaction that is
    no such batch (`TxBase.batched`); a read of the Work inside the block sees it. Catches: a bump that
    waits and is never written (the Work a revision short), a read that misses it."""
    first = await rt.publish(order(0, "a"))
    await route_batch(rt, [deferred(first)])
    before = await rt.work_for_key("a")
    assert before is not None
    assert before.state == "running"

    async def route(n: int, *, read: bool, batched: bool) -> tuple[int | None, int]:
        event = await rt.publish(order(n, "a"))
        decided = await decided_route(rt, event)

        def routing(tx: Tx, now_ms: int) -> tuple[int | None, int]:
            tx.batched = batched
            with tx.holding():
                loom.kernel.routing.route_in_tx(tx, now_ms, decided, CausalLimits())
                if read:
                    tx._reads.clear()  # (so that this is a read, not what the routing told)
                    inside = tx.work(before.id)
                    assert inside is not None
            waiting = len(tx._bumps)
            return (inside.revision if read else None), waiting

        revision: tuple[int | None, int] = await storage_of(rt).submit(routing)
        return revision

    shared = storage_of(rt).shared
    assert await route(1, read=False, batched=True) == (None, 0 if shared else 1), "it waits for the COMMIT"
    assert await route(2, read=False, batched=False) == (None, 0), "it waits past the block's end"
    once = await rt.work_for_key("a")
    assert once is not None
    assert once.revision == before.revision + 2, "a bump was never written"
    # (the read answers what the bump will write, `TxBase.patched`, and the bump waits on)
    inside = await route(3, read=True, batched=True)
    assert inside == (before.revision + 3, 0 if shared else 1), "a read inside missed the bump"
    after = await rt.work_for_key("a")
    assert after is not None
    assert after.revision == before.revision + 3


async def test_a_batchs_routings_into_one_work_bump_it_in_one_write_before_the_commit(rt: Runtime) -> None:
    """Three Events routed into a running Work, each in a routing block of its own, in one storage
    batch: on a database alone their bumps wait past each block (`TxBase.batched`) and are one write,
    before the batch's COMMIT; the Work ends three revisions on. Catches: a bump written at each block's
    end (three writes), bumps left unwritten at the COMMIT (the Work revisions short)."""
    first = await rt.publish(order(0, "a"))
    await route_batch(rt, [deferred(first)])
    before = await rt.work_for_key("a")
    assert before is not None
    assert before.state == "running"
    events = [await rt.publish(order(n, "a")) for n in (1, 2, 3)]

    def routings(tx: Tx, now_ms: int) -> list[str]:
        queries = counting_queries(tx)
        for event in events:
            decided = decide_in_tx(tx, deferred(event))
            assert decided is not None
            route_then_start_in_tx(tx, now_ms, decided, CausalLimits(), admit())
        return queries  # (the list itself: the write before the COMMIT counts too)

    queries = await storage_of(rt).submit(routings)
    after = await rt.work_for_key("a")
    assert after is not None
    assert after.revision == before.revision + 3
    bumps = [q for q in queries if q.startswith("UPDATE works SET revision")]
    assert len(bumps) == (3 if storage_of(rt).shared else 1), queries


async def test_bumps_of_several_works_wait_through_another_works_write_and_go_in_one_statement(
    rt: Runtime,
) -> None:
    """Events routed into three running Works in one storage batch, another Work's row written between
    them (`Tx.update_work`, as an attempt's end writes its Work): on a database alone that write takes only
    its own Work's bumps (`TxBase._one_work`), and the three bumps that wait go in one statement before
    the COMMIT; every Work ends a revision on. Catches: a write of one Work's row that writes every
    bump first (three statements), a statement per Work at the COMMIT, and a statement for several
    that drops or mixes up a Work's count (a revision off)."""
    for n, key in enumerate("abcd"):
        await route_batch(rt, [deferred(await rt.publish(order(n, key)))])
    before = {key: await rt.work_for_key(key) for key in "abcd"}
    assert all(w is not None and w.state == "running" for w in before.values())
    events = [await rt.publish(order(n, key)) for n, key in enumerate("abbc", start=4)]
    other = before["d"]
    assert other is not None

    def routings(tx: Tx, now_ms: int) -> list[str]:
        queries = counting_queries(tx)
        for n, event in enumerate(events):
            if n == 2:
                tx.update_work(other.id, now_ms, hold_reason=None)
            decided = decide_in_tx(tx, deferred(event))
            assert decided is not None
            route_then_start_in_tx(tx, now_ms, decided, CausalLimits(), admit())
        return queries  # (the list itself: the write before the COMMIT counts too)

    queries = await storage_of(rt).submit(routings)
    after = {key: await rt.work_for_key(key) for key in "abcd"}
    moved = {key: after[key].revision - before[key].revision for key in "abcd"}  # type: ignore[union-attr]
    assert moved == {"a": 1, "b": 2, "c": 1, "d": 1}
    bumps = [q for q in queries if q.startswith("UPDATE works SET revision")]
    assert len(bumps) == (4 if storage_of(rt).shared else 1), queries  # (one a routing on PostgreSQL)


async def test_a_keys_owner_committed_answers_later_transactions_until_its_work_is_removed(
    rt: Runtime,
) -> None:
    """A key's owner that a transaction read or attached answers the transactions after its commit on
    a database alone (`TxBase.committed`), with no read of the key; one attached in a block a
    savepoint undid does not, nor one whose Work a later transaction removed (compaction forgets them
    all); conftest's check compares each owner answered with a read. Catches: no owner kept past its
    transaction (a read per routing), an attach undone yet kept (the key answered with a Work it is
    not attached to), and owners kept through a Work's removal."""
    await route_batch(rt, [deferred(await rt.publish(order(0, "a")))])
    work = await rt.work_for_key("a")
    assert work is not None
    alone = not storage_of(rt).shared

    def owners(tx: Tx, now_ms: int) -> tuple[list[str | None], list[str]]:
        queries = counting_queries(tx)
        return [tx.key_owner("a"), tx.key_owner("b")], [q for q in queries if "FROM work_keys" in q]

    def attach_undone(tx: Tx, now_ms: int) -> None:
        with contextlib.suppress(LookupError), tx.savepoint():
            tx.attach_key("b", work.id, 1, now_ms)
            assert tx.key_owner("b") == work.id
            raise LookupError("undo it")

    answered, reads = await storage_of(rt).submit(owners)
    assert answered == [work.id, None]
    assert len(reads) == (1 if alone else 2), reads  # ("b" has none: kept by no later transaction)
    await storage_of(rt).submit(attach_undone)
    answered, reads = await storage_of(rt).submit(owners)
    assert answered == [work.id, None]
    assert len(reads) == (1 if alone else 2), reads
    await storage_of(rt).submit(lambda tx, now_ms: tx.remove_work(work.id, now_ms))
    answered, reads = await storage_of(rt).submit(owners)
    assert answered == [None, None]
    assert len(reads) == 2, reads


async def test_keys_owners_are_not_kept_past_another_writer_on_the_file(tmp_path: Path) -> None:
    """Two runtimes of one process may open one SQLite file (the file's lock is the process's): while
    another writer is open on it, and after it was, what the first runtime kept of the keys' owners no
    longer answers (`WriterConnection.alone`). Catches: owners kept through another writer that
    removed a Work (the key answered with it: conftest's check), and owners dropped for good once that
    writer closed (a read per routing again)."""
    path = str(tmp_path / "loom.db")
    opened = partial(
        open_runtime,
        path,
        clock=ManualClock(start_ms=T0_MS),
        config=CONFIG,
        load_entry_points=False,
        actors=(),
    )

    def owner_of_a(tx: Tx, now_ms: int) -> tuple[str | None, int]:
        queries = counting_queries(tx)
        return tx.key_owner("a"), len([q for q in queries if "FROM work_keys" in q])

    async with opened(plugins=[PythonExecutor()]) as first:
        await route_batch(first, [deferred(await first.publish(order(0, "a")))])
        work = await first.work_for_key("a")
        assert work is not None
        assert await storage_of(first).submit(owner_of_a) == (work.id, 0)
        async with opened(plugins=[PythonExecutor()]) as second:
            await storage_of(second).submit(lambda tx, now_ms: tx.remove_work(work.id, now_ms))
            assert await storage_of(first).submit(owner_of_a) == (None, 1)
        await route_batch(first, [deferred(await first.publish(order(1, "a")))])
        again = await first.work_for_key("a")
        assert again is not None
        assert again.id != work.id
        await storage_of(first).submit(owner_of_a)  # (kept from here on: the other writer is gone)
        assert await storage_of(first).submit(owner_of_a) == (again.id, 0)


async def start_with_three_inputs(rt: Runtime) -> tuple[Lease, list[str]]:
    """Three Events of key ``a`` routed into a new Work in one transaction, that Work started in the
    next: the lease (checked to take the three, in order) and the statements the start read with."""
    events = [await rt.publish(order(n, "a")) for n in range(3)]
    await storage_of(rt).submit(
        route_batch_then_start_in_tx, [deferred(e) for e in events], CausalLimits(), None
    )
    work = await rt.work_for_key("a")
    assert work is not None

    def start(tx: Tx, now_ms: int) -> tuple[Lease | None, list[str]]:
        queries = counting_queries(tx)
        lease = start_at_once_in_tx(tx, now_ms, work.id, admit())
        return lease, queries[:]

    lease, queries = await storage_of(rt).submit(start)
    assert lease is not None
    assert [e.id for e in lease.request.inputs] == [e.id for e in events]
    return lease, queries


async def test_a_start_reads_its_inputs_checkpoints_and_events_in_one_query(rt: Runtime) -> None:
    """The binding of a start reads the checkpoints of the Work's pending inputs (routed in an earlier
    transaction) with their Events, in one query (`InputsTx.input_checkpoints`), and the claim after it
    reads no Event (`InputsTx.input_events`). Catches: a read per checkpoint, the claim reading the
    Events again, and a binding taken from other than its earliest input's route."""
    lease, queries = await start_with_three_inputs(rt)
    assert lease.request.binding == "py"
    reads = [
        q for q in queries if q.startswith((INPUT_CHECKPOINTS, CHECKPOINT_BY_EVENT, "SELECT id, seq, source"))
    ]
    assert len(reads) == 1, reads


async def test_a_starts_binding_reads_no_more_inputs_than_it_looks_at(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With reads of two Events at a time, three pending inputs: the binding reads the first two with
    their checkpoints (the first names the binding), and the claim reads the third Event alone.
    Catches: a binding that reads every pending input's checkpoint (a Work with a long backlog would
    read it all for one start the gates may still hold back)."""
    monkeypatch.setattr(loom.store._tx_inputs, "_EVENTS_PER_READ", 2)
    _, queries = await start_with_three_inputs(rt)
    assert [q.count("?") for q in queries if q.startswith(INPUT_CHECKPOINTS)] == [2]
    assert [q.count("?") for q in queries if q.startswith("SELECT id, seq, source")] == [1]
