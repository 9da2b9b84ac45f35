"""What an acceptance commit holds, on every backend (PostgreSQL is a shared database).

An Event whose routing is its checkpoint alone (no key, no explicit Work, a first match that needs no
handler) is routed in its acceptance commit on a shared database too: its own routing commit would
take the same acceptance-order lock for the same insert. A keyed Event or one a handler decides is
routed by its lane there (routing it would hold that lock for its reads), and on a database alone it
is routed in its acceptance commit as before. A new root Event's insert is its own duplicate check on
every backend: no lookup is made before it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from loom import CausalLimits, Config, EventIn, ManualClock, Runtime, TimerSpec, open_runtime
from loom.kernel.accept import accept_in_tx
from loom.records.events import Event
from loom.records.notices import Committed, EventAccepted, EventRouted, Notice
from loom.store import Tx
from loom.store._feed import NoticeFeed
from loom.testing import T0_MS
from loom.testing.internals import router_of, storage_of

SCOPE = "shop"
CONFIG = Config.from_dict(
    {
        "scopes": {
            SCOPE: {
                "routes": [
                    {"name": "noise", "types": ["noise.*"], "policy": "drop", "reason": "not ours"},
                    {"name": "orders", "types": ["order.*"], "create_work": True},
                ]
            }
        }
    }
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start_ms=T0_MS)


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    async with open_runtime(loom_store, clock=clock, config=CONFIG, load_entry_points=False) as runtime:
        yield runtime


async def acceptance_batch(rt: Runtime, offered: EventIn) -> tuple[Event, list[Notice]]:
    """Publish ``offered``; the Event, and the notices of the commit that accepted it."""
    storage = storage_of(rt)
    feed = storage.feed(commits=True)
    try:
        event = await rt.publish(offered)
        return event, await batch_accepting(feed, lambda e: e.id == event.id)
    finally:
        storage.unsubscribe(feed)
        await rt.wait_idle()


async def batch_accepting(feed: NoticeFeed, wanted: Callable[[Event], bool]) -> list[Notice]:
    """The notices of the first committed batch that accepted a ``wanted`` Event."""
    while True:
        notices = await feed.next_batch()
        if any(isinstance(n, EventAccepted) and wanted(n.event) for n in notices):
            return notices


def routed_in(notices: list[Notice], event: Event) -> bool:
    return any(isinstance(n, EventRouted) and n.event_id == event.id for n in notices)


@pytest.mark.parametrize("type_", ["other.thing", "noise.ping"], ids=["unmatched", "drop"])
async def test_an_event_whose_routing_is_its_checkpoint_is_routed_in_its_acceptance_commit(
    rt: Runtime, type_: str
) -> None:
    """Catches: on a shared database, every Event left to the router's own commit (a second
    transaction, a read of the Event and the order lock taken again), and a checkpoint-only route
    that no longer routes at acceptance on a database alone."""
    offered = EventIn(source="shop", delivery_id="d-1", type=type_, scope=SCOPE)
    event, notices = await acceptance_batch(rt, offered)
    assert routed_in(notices, event), f"{type_} was not routed in its acceptance commit"
    checkpoint = await rt.checkpoint(event.id)
    assert checkpoint is not None
    assert checkpoint.status.value == ("unmatched" if type_ == "other.thing" else "drop")


async def test_an_acceptance_commit_that_routed_its_event_does_not_wake_the_router(rt: Runtime) -> None:
    """Such a commit gives the router nothing to do: it is not offered to its feed (two task switches
    less per commit); the same commit without its routing (an Event left to its lane) is. Catches: a
    router woken by every acceptance commit again, and one that skips an Event it has to route."""
    offered = EventIn(source="shop", delivery_id="d-1", type="other.thing", scope=SCOPE)
    event, notices = await acceptance_batch(rt, offered)
    committed = [n for n in notices if not isinstance(n, Committed)]  # the router's feed has none
    assert routed_in(committed, event)
    router = router_of(rt)
    assert not router.concerned_by(committed), committed
    unrouted = [n for n in committed if not isinstance(n, EventRouted)]
    assert router.concerned_by(unrouted), unrouted


async def test_a_keyed_event_is_routed_by_its_lane_on_a_shared_database(rt: Runtime) -> None:
    """A keyed Event may wake a wait or feed a subscription: on a shared database its routing stays out
    of the acceptance commit, which holds the order lock every node's acceptance waits on; alone on
    its database it is routed there. Catches: the shared database's exception dropped (or applied to
    a database alone)."""
    offered = EventIn(source="shop", delivery_id="d-1", type="other.thing", scope=SCOPE, key="k-1")
    event, notices = await acceptance_batch(rt, offered)
    shared = storage_of(rt).shared
    assert routed_in(notices, event) is not shared
    checkpoint = await rt.checkpoint(event.id)
    assert checkpoint is not None
    assert checkpoint.status.value == "unmatched", "the lane routed it afterwards"


async def test_a_timers_event_whose_routing_is_its_checkpoint_is_routed_in_its_firing_commit(
    rt: Runtime, clock: ManualClock
) -> None:
    """As at acceptance: a firing pass routes such an Event in its own commit on a shared database too,
    and a keyed one there is left to its lane. Catches: a shared database's firing pass that routes
    nothing (the router's own commit, a read and a transaction more per firing), and one that routes a
    keyed Event under the order lock."""
    storage = storage_of(rt)
    feed = storage.feed(commits=True)
    try:
        for name, key in (("plain", None), ("keyed", "k-1")):
            spec = TimerSpec(
                id=name, fire_at_ms=clock.now_ms() + 1_000, source="clock", type="tick", scope=SCOPE, key=key
            )
            await rt.arm(spec)
            clock.advance(1_000)
            notices = await batch_accepting(feed, lambda e, name=name: e.payload.get("timer") == name)
            (event,) = [n.event for n in notices if isinstance(n, EventAccepted) and n.event.key == key]
            assert routed_in(notices, event) is (key is None or not storage.shared), name
            await rt.wait_idle()
            checkpoint = await rt.checkpoint(event.id)
            assert checkpoint is not None
            assert checkpoint.status.value == "unmatched"
    finally:
        storage.unsubscribe(feed)


async def test_a_new_root_event_is_inserted_without_a_lookup_first(rt: Runtime) -> None:
    """Catches: a backend that looks its delivery identity up before every insert (one more round trip
    per Event on PostgreSQL), and a duplicate that the insert no longer answers as the original."""
    offered = EventIn(source="shop", delivery_id="d-9", type="other.thing", scope="elsewhere")

    def accept_twice(tx: Tx, now_ms: int) -> tuple[list[str], Event, Event]:
        lookups: list[str] = []
        delivery = tx.delivery

        def counted(source: str, delivery_id: str) -> object:
            lookups.append(delivery_id)
            return delivery(source, delivery_id)

        tx.delivery = counted  # type: ignore[method-assign,assignment]
        first = accept_in_tx(tx, now_ms, offered, CausalLimits())
        lookups.append("--")
        again = accept_in_tx(tx, now_ms, offered, CausalLimits())
        return lookups, first, again

    lookups, first, again = await storage_of(rt).submit(accept_twice)
    assert lookups == ["--", "d-9"], "a lookup before the insert of a new Event, or none for the duplicate"
    assert (first.duplicate, again.duplicate, again.id, again.seq) == (False, True, first.id, first.seq)
