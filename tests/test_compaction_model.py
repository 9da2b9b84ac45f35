"""Compaction against a reference that never forgets (docs/operations.md, "Retention").

Two in-memory stores receive the same random interleaving of kernel procedures, at the same clock:
publishing new deliveries and redeliveries, routing (in acceptance order, as a correlating handler
would), claims, completions and waits, arming and firing one-shot and recurring timers, firing old
firing identities again, and time passing. Compaction runs between them on one store only, at random
points; the other keeps everything. Every answer the compacted store gives must be the reference's:

* a publish answers with the same sequence, and ``duplicate`` alike (a redelivery of a removed Event is
  answered by its tombstone: ``compacted``, with the original sequence);
* routing gives each Event the same checkpoint status and the same Work;
* a claim starts the same attempt or is refused alike; a wait is in the same state with the same
  winner;
* arming a timer gives the same revision and delivery identity; a firing pass fires the same timers
  with the same results and Events; firing an old identity again accepts nothing, in either store.

One difference is the documented one, and the interleavings keep clear of it: once a finished Work is
removed, an Event for its key starts a new Work (the reference would route it to the finished one),
so no new delivery goes to the key of a Work that finished.

Wrong implementations this catches (each put in and seen to fail): a dedup lookup without tombstones
(a redelivery is accepted again), a removed timer that forgets its revision (arming it again starts
over), removing a pending input, and removing an Event the Work that owns its key may still wait on:
one dropped beside it after all its pending input, which the next attempt's wait (from the watermark
of that input) finds in the reference.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from loom import CausalLimits, Config, Deliver, Drop, EventIn, Policy, Unmatched, WaitSpec
from loom.kernel.accept import accept_in_tx
from loom.kernel.authority import Authority
from loom.kernel.compaction import CompactRequest, compact_in_tx, raise_watermark_in_tx
from loom.kernel.executions import BindingRef, ClaimRequest, KindPolicy, claim_in_tx, complete_in_tx
from loom.kernel.firing import fire_due_in_tx, fire_timer_in_tx
from loom.kernel.resolve import RouteRef, RouteRequest
from loom.kernel.routing import route_in_tx
from loom.kernel.timers import arm_in_tx
from loom.plugins.handlers import work_id_for_key
from loom.records.errors import LoomError
from loom.records.timers import FireRequest, TimerSpec
from loom.records.waits import Waiting
from loom.records.work import Completed, Lease
from loom.store import SQLiteStore, Tx
from loom.testing import T0_MS

R = TypeVar("R")
SCOPE = "acme"
LIMITS = CausalLimits(per_minute=100_000)
MINUTE = 60_000
RETENTION = Config.from_dict(
    {"retention": {"works": "10m", "events": "10m", "timers": "10m", "attempt_logs": "10m"}}
)
KEYS = ("a", "b", "c")
ROUTE = RouteRef(name="r", scope=SCOPE, declared=Policy.QUEUE, policy=Policy.QUEUE)


class Store:
    """Kernel procedures, one transaction each, on an in-memory store."""

    def __init__(self) -> None:
        self.conn = SQLiteStore(path=":memory:").open_writer()

    def run(self, now: int, proc: Callable[..., R], *args: Any) -> R | LoomError:
        """The procedure's answer, or the `LoomError` it was refused with (nothing written)."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            result = proc(Tx(self.conn), now, *args)
        except LoomError as exc:
            self.conn.execute("ROLLBACK")
            return exc
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result


def unrouted_in(tx: Tx, now: int) -> list[Any]:
    return tx.unrouted_events(0, 1000)


def decide(tx: Tx, now: int, event_id: str) -> RouteRequest:
    """A correlating handler's decision: ``w.*`` to the Work of its key (created if none), ``d.*``
    dropped beside it, anything else unmatched."""
    event = tx.event(event_id)
    assert event is not None
    assert event.key is not None
    owner = tx.key_owner(event.key)
    work = tx.work(owner) if owner else None
    if event.type.startswith("d."):
        return RouteRequest(event_id=event_id, decision=Drop(reason="aside"), route=ROUTE,
                            expected_revision=work.revision if work else None, generation=1)  # fmt: skip
    if not event.type.startswith("w."):
        return RouteRequest(event_id=event_id, decision=Unmatched(reason="no route"), route=None,
                            expected_revision=work.revision if work else None, generation=1)  # fmt: skip
    decision = Deliver(
        work_id=work.id if work else work_id_for_key(SCOPE, event.key),
        create=work is None,
        attach_keys=(event.key,),
    )
    return RouteRequest(event_id=event_id, decision=decision, route=ROUTE,
                        expected_revision=work.revision if work else None, generation=1)  # fmt: skip


def route_all(store: Store, now: int) -> list[tuple[str, str | None, str | None]]:
    """Route every unrouted Event in acceptance order; (event, status, work) of each."""
    done = []
    for event in store.run(now, unrouted_in):  # type: ignore[union-attr]
        request = store.run(now, decide, event.id)
        result = store.run(now, route_in_tx, request, LIMITS)
        assert not isinstance(result, LoomError), result
        done.append((event.id, result.checkpoint.status.value, result.checkpoint.work_id))
    return done


def claim_of(work_id: str) -> ClaimRequest:
    return ClaimRequest(
        work_id=work_id, owner="t", token=secrets.token_hex(8), lease_ms=10 * 60 * MINUTE,
        binding=BindingRef(name=None, executor=None), kind=KindPolicy(), capacity=None, generation=1,
    )  # fmt: skip


def compact(store: Store, now: int) -> None:
    """A sweep, as the compaction actor runs it: passes until each step went once through its rows.
    A sweep that does not end (steps taken again after their round, finding the rows they keep at
    their head again and again) fails here instead of hanging."""
    store.run(now, raise_watermark_in_tx)
    finished: frozenset[str] = frozenset()
    for _ in range(100):
        request = CompactRequest(config=RETENTION, limit=3, finished=finished)
        done = store.run(now, compact_in_tx, request)
        assert not isinstance(done, LoomError), done
        if not done.report.more:
            return
        finished |= done.finished
    raise AssertionError(f"a compaction sweep did not end in 100 passes: {done.report}")


PUBLISH = st.sampled_from(["w.note", "w.go", "d.go", "d.x", "x"])
ROUND = st.tuples(
    st.lists(st.tuples(st.just("publish"), st.sampled_from(KEYS), PUBLISH), max_size=3),
    st.lists(st.tuples(st.just("redeliver"), st.integers(0, 50)), max_size=2),
    st.booleans(),  # route
    st.lists(st.tuples(st.sampled_from(["claim", "complete", "wait"]), st.sampled_from(KEYS)), max_size=3),
    st.lists(
        st.one_of(
            st.tuples(st.just("arm"), st.sampled_from(["t1", "t2", "every"])),
            st.tuples(st.just("fire")),
            st.tuples(st.just("refire"), st.integers(0, 20)),
        ),
        max_size=2,
    ),
    st.sampled_from([0, MINUTE, 7 * MINUTE, 15 * MINUTE]),  # time passing
    st.booleans(),  # compact
)
"""One round: new deliveries on the keys (``w.*`` goes to its Work, ``d.*`` is dropped beside it, and
``d.go`` is still something the Work's wait for ``w.go`` or ``d.go`` can find), redeliveries, routing,
claims, completions and waits, timers armed, fired and fired again, time passing, compaction."""
ROUNDS = st.lists(ROUND, min_size=1, max_size=12)


def ops_of(rounds: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    ops: list[tuple[Any, ...]] = []
    for publishes, redeliveries, route, actions, timers, later, compaction in rounds:
        ops += [*publishes, *redeliveries, *([("route",)] if route else []), *actions, *timers]
        ops += [("later", later)] if later else []
        ops += [("compact",)] if compaction else []
    return ops


@attrs.define
class World:
    """The test's memory: what it may do next, and what it was told."""

    now: int = T0_MS
    deliveries: list[str] = attrs.Factory(list)
    finished: set[str] = attrs.Factory(set)
    """Keys whose Work finished: no new delivery goes to them (see the module docstring)."""
    leases: dict[str, Lease] = attrs.Factory(dict)
    fired: list[FireRequest] = attrs.Factory(list)


NOTE = ("publish", "a", "w.note")
KEPT_AT_TWO_HEADS = [
    ([("publish", "c", "w.note"), NOTE, NOTE, NOTE], [], True, [], [], 0, False),
    ([NOTE, NOTE, ("publish", "b", "w.note")], [], False, [("claim", "c")], [], 0, False),
    (
        [NOTE] * 5,
        [],
        True,
        [("claim", k) for k in "ab"] + [("wait", k) for k in "cab"],
        [],
        15 * MINUTE,
        True,
    ),
]
"""Found by the search below: more attempts and Events kept than a page holds, at the heads of two steps
whose rounds never ended in the same pass (a sweep that took every step at every pass never ended)."""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rounds=ROUNDS)
@example(rounds=KEPT_AT_TWO_HEADS)
def test_every_answer_after_compaction_is_the_reference_answer(rounds: list[tuple[Any, ...]]) -> None:
    reference, compacted = Store(), Store()
    world = World()
    counter = itertools.count()
    try:
        for op in ops_of(rounds):
            step(op, world, reference, compacted, counter)
    finally:
        reference.conn.close()
        compacted.conn.close()


def both(world: World, reference: Store, compacted: Store, proc: Callable[..., Any], *args: Any) -> Any:
    expected = reference.run(world.now, proc, *args)
    actual = compacted.run(world.now, proc, *args)
    return expected, actual


def step(op: tuple[Any, ...], world: World, reference: Store, compacted: Store, counter: Any) -> None:
    kind = op[0]
    if kind == "publish":
        key, type_ = op[1], op[2]
        if key in world.finished:
            return
        delivery = f"e{next(counter)}"
        world.deliveries.append(delivery)
        event = EventIn(source="t", delivery_id=delivery, type=type_, scope=SCOPE, key=key)
        expected, actual = both(world, reference, compacted, accept_in_tx, event, LIMITS)
        assert (actual.id, actual.seq, actual.duplicate) == (expected.id, expected.seq, expected.duplicate)
    elif kind == "redeliver" and world.deliveries:
        delivery = world.deliveries[op[1] % len(world.deliveries)]
        event = EventIn(source="t", delivery_id=delivery, type="w.note", scope=SCOPE, key="a")
        expected, actual = both(world, reference, compacted, accept_in_tx, event, LIMITS)
        assert (actual.id, actual.seq, actual.duplicate) == (expected.id, expected.seq, True), delivery
    elif kind == "route":
        assert route_all(compacted, world.now) == route_all(reference, world.now)
    elif kind == "claim":
        work_id = _work_of(reference, world, op[1])
        if work_id is None or op[1] in world.leases or op[1] in world.finished:
            return  # (a finished Work may be gone: claiming it is refused otherwise than in the reference)
        request = claim_of(work_id)
        expected, actual = both(world, reference, compacted, claim_in_tx, request)
        assert type(actual) is type(expected), (actual, expected)
        if isinstance(expected, Lease):
            assert (actual.attempt, actual.epoch) == (expected.attempt, expected.epoch)
            assert [e.seq for e in actual.request.inputs] == [e.seq for e in expected.request.inputs]
            world.leases[op[1]] = expected
    elif kind in ("complete", "wait") and op[1] in world.leases:
        lease = world.leases.pop(op[1])
        outcome = Completed() if kind == "complete" else Waiting(wait=WaitSpec(types=("w.go", "d.go")))
        expected, actual = both(world, reference, compacted, complete_in_tx, Authority.of(lease), outcome,
                                KindPolicy(), LIMITS)  # fmt: skip
        assert type(actual) is type(expected), (actual, expected)
        if not isinstance(expected, LoomError):
            assert actual.state is expected.state
        work = reference.run(world.now, lambda tx, now: tx.work(lease.work_id))
        if work is not None and work.state.terminal:
            world.finished.update(work.keys)
    elif kind == "arm":
        timer_id = op[1]
        spec = TimerSpec(id=timer_id, fire_at_ms=world.now + 2 * MINUTE, source="t", type="x.tick", scope=SCOPE,
                         key="tick", interval_ms=5 * MINUTE if timer_id == "every" else None)  # fmt: skip
        expected, actual = both(world, reference, compacted, arm_in_tx, spec)
        assert type(actual) is type(expected), (actual, expected)
        if not isinstance(expected, LoomError):
            assert (actual.revision, actual.delivery_id) == (expected.revision, expected.delivery_id)
    elif kind == "fire":
        expected, actual = both(world, reference, compacted, fire_due_in_tx, 100, LIMITS, {})
        assert actual.results == expected.results
        world.fired += list(expected.requests)
    elif kind == "refire" and world.fired:
        request = world.fired[op[1] % len(world.fired)]
        before = [_last_seq(s, world) for s in (reference, compacted)]
        both(world, reference, compacted, fire_timer_in_tx, request, LIMITS, {})
        assert [_last_seq(s, world) for s in (reference, compacted)] == before, "an old firing fired again"
    elif kind == "later":
        world.now += op[1]
    elif kind == "compact":
        compact(compacted, world.now)
    _waits_agree(world, reference, compacted)


def _work_of(store: Store, world: World, key: str) -> str | None:
    owner = store.run(world.now, lambda tx, now: tx.key_owner(key))
    return owner if isinstance(owner, str) else None


def _last_seq(store: Store, world: World) -> int:
    return int(store.run(world.now, lambda tx, now: tx.max_seq()))  # type: ignore[arg-type]


def _waits(tx: Tx, now: int, work_id: str) -> list[Any]:
    return tx.waits_of_work(work_id)


def _waits_agree(world: World, reference: Store, compacted: Store) -> None:
    for key in KEYS:
        work_id = _work_of(reference, world, key)
        if work_id is None:
            continue
        expected = reference.run(world.now, _waits, work_id)
        actual = compacted.run(world.now, _waits, work_id)
        if not actual:
            continue  # the Work (with its waits) was removed: its key gets no new delivery
        assert (
            [(w.id, w.state, w.winner_event_id) for w in actual]
            == [
                (w.id, w.state, w.winner_event_id)
                for w in expected  # type: ignore[union-attr]
            ][-len(actual) :]
        ), f"the waits of {key} differ"
