"""Several nodes on one PostgreSQL database: runtimes sharing one store accept, route, fire and
recover together, and exactly-once holds across them.

Catches: a key that gets a Work on two nodes, a reader that sees a gap in the Event sequence that is
filled later (sequence allocated before commit but committed out of order), a Work whose inputs are
routed out of acceptance order, a timer fired by two nodes, timers of a closed node never fired by
the others, a lease recovered twice or a stale holder on another node let through.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
import trio

from loom import Completed, Config, EventIn, ManualClock, Runtime, StaleAuthority, open_runtime
from loom.records.timers import TimerSpec
from loom.service.serve import open_service
from loom.testing import T0_MS, raw, until_committed
from loom.testing.postgres import PostgresCluster

CONFIG = Config.from_toml(
    """
[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
"""
)
STALL_SECONDS = 60
NODES = 3


@pytest.fixture
def shared_db(loom_postgres: PostgresCluster) -> str:
    return loom_postgres.create_database(template=loom_postgres.migrated_template())


@asynccontextmanager
async def nodes(
    url: str, clock: ManualClock, n: int = NODES, **options: object
) -> AsyncIterator[list[Runtime]]:
    async with AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                open_runtime(
                    url, clock=clock, config=CONFIG, owner=f"node{i}", load_entry_points=False, **options
                )  # type: ignore[arg-type]
            )
            for i in range(n)
        ]


def order(node: int, n: int, key: int) -> EventIn:
    return EventIn(
        source="shop", delivery_id=f"n{node}-{n}", type="order.placed", scope="shop", key=f"order/{key}"
    )


async def test_nodes_accept_together_one_work_per_key_in_acceptance_order_and_readers_see_no_gap(
    shared_db: str,
) -> None:
    clock = ManualClock(start_ms=T0_MS)
    rng = random.Random(7)
    per_node, keys = 40, 6
    async with nodes(shared_db, clock) as rts:
        read: list[int] = []  # every seq a follower saw, read page by page while acceptance runs
        publishing = True

        async def follow() -> None:
            after = 0
            while True:
                # an empty page ends it only if every publish had returned before the page was read
                finished = not publishing
                page = await rts[0].events(after_seq=after, limit=50)
                read.extend(e.seq for e in page)
                if page:
                    after = page[-1].seq
                elif finished:
                    return
                await trio.lowlevel.checkpoint()

        async def publish(node: int) -> None:
            for n in range(per_node):
                await rts[node].publish(order(node, n, rng.randrange(keys)))
                if n % 7 == 0:  # and one offered again on another node: accepted once
                    await rts[(node + 1) % NODES].publish(order(node, n, 0))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            async with trio.open_nursery() as publishers:
                for node in range(NODES):
                    publishers.start_soon(publish, node)
            publishing = False
        for rt in rts:
            await rt.wait_idle()

        async def all_routed() -> bool:
            rows = raw.query(shared_db, "SELECT count(*) AS n FROM checkpoints")
            if rows[0]["n"] == NODES * per_node:
                return True
            # a lane waiting on an earlier Event another node routes hears of it at the next rescan
            clock.advance(1000)
            return False

        await until_committed(rts[0], all_routed, "every order to be routed", stall_s=STALL_SECONDS)

    events = raw.query(shared_db, "SELECT seq, delivery_id FROM events WHERE source = 'shop' ORDER BY seq")
    assert len(events) == NODES * per_node == len({e["delivery_id"] for e in events}), "each Event once"
    seqs = [e["seq"] for e in events]
    assert read == seqs, "the follower read every Event once, in order, and none appeared behind it later"
    works = raw.query(
        shared_db, "SELECT key, count(DISTINCT work_id) AS n FROM work_keys GROUP BY key ORDER BY key"
    )
    assert len(works) == keys
    assert [w["n"] for w in works] == [1] * keys, "one Work per key"
    routed = raw.query(shared_db, "SELECT work_id, seq, commit_seq FROM checkpoints ORDER BY work_id, seq")
    by_work: dict[str, list[int]] = {}
    for row in routed:
        by_work.setdefault(row["work_id"], []).append(row["commit_seq"])
    assert all(order == sorted(order) for order in by_work.values()), "each Work's inputs in acceptance order"


async def test_due_timers_fire_once_across_nodes_and_a_closed_nodes_timers_are_fired_by_the_others(
    shared_db: str,
) -> None:
    clock = ManualClock(start_ms=T0_MS)
    async with nodes(shared_db, clock) as rts:
        for node, rt in enumerate(rts):
            for n in range(15):
                await rt.arm(
                    TimerSpec(
                        id=f"t{node}-{n}", fire_at_ms=T0_MS + 1000, source="clock", type="tick", scope="s"
                    )
                )
        async with nodes(shared_db, clock, n=1) as (leaving,):
            for n in range(10):  # armed by a node that closes before they are due
                await leaving.arm(
                    TimerSpec(id=f"gone-{n}", fire_at_ms=T0_MS + 1000, source="clock", type="tick", scope="s")
                )
        clock.advance(1000)  # due on every node, and the nodes rescan the store (resync)

        async def all_fired() -> bool:
            rows = raw.query(shared_db, "SELECT count(*) AS n FROM timers WHERE state = 'armed'")
            return bool(rows[0]["n"] == 0)

        await until_committed(rts[0], all_fired, "every timer to fire", stall_s=STALL_SECONDS)
        for rt in rts:
            await rt.wait_idle()

    firings = raw.query(shared_db, "SELECT timer_id, result FROM timer_firings ORDER BY timer_id")
    assert len(firings) == NODES * 15 + 10 == len({f["timer_id"] for f in firings}), "one firing per timer"
    assert {f["result"] for f in firings} == {"accepted"}
    ticks = raw.query(shared_db, "SELECT count(*) AS n FROM events WHERE type = 'tick'")
    assert ticks[0]["n"] == NODES * 15 + 10, "one Event per firing"


async def test_a_lease_is_recovered_once_by_another_node_and_its_stale_holder_is_refused(
    shared_db: str,
) -> None:
    clock = ManualClock(start_ms=T0_MS)
    async with nodes(shared_db, clock, actors=()) as rts:
        await rts[0].publish(order(0, 0, 1))
        await rts[0].poll()
        work = await rts[0].work_for_key("order/1")
        lease = await rts[0].claim(work.id, owner="node0", lease_ms=1000)
        clock.advance(1000)  # node0's lease expires: node0 is gone as far as the others can tell
        recovered = [await rt.recover_expired(owner=f"node{i}") for i, rt in enumerate(rts[1:], start=1)]
        assert sorted(len(r) for r in recovered) == [0, 1], "exactly one node recovers the attempt"
        (recovery,) = [r for rs in recovered for r in rs]
        assert recovery.lease.epoch > lease.epoch
        with pytest.raises(StaleAuthority):
            await rts[0].complete(lease, Completed())
        holder = rts[1] if recovered[0] else rts[2]
        adopted = recovery.lease if recovery.relaunch else await holder.adopt(recovery.lease)
        done = await holder.complete(adopted, Completed())
        assert done.state.value == "completed"
        with pytest.raises(StaleAuthority):
            await rts[0].renew(lease)


async def test_a_serve_node_closing_releases_its_own_leases_not_those_of_the_nodes_going_on(
    shared_db: str,
) -> None:
    clock = ManualClock(start_ms=T0_MS)
    async with open_service(shared_db, config=CONFIG, test_clock=clock, start_actors=False) as a:
        rt = a.runtime
        await rt.publish(order(0, 0, 1))
        await rt.poll()
        work = await rt.work_for_key("order/1")
        await rt.claim(work.id, owner="a host", lease_ms=1000)
        clock.advance(1000)
        (recovery,) = await rt.recover_expired()  # held by node a under its own name now
        async with open_service(shared_db, config=CONFIG, test_clock=clock, start_actors=False):
            pass  # node b opens and closes cleanly, releasing its leases
        row = raw.query(shared_db, "SELECT owner, expires_at_ms FROM executions WHERE id = ?",
                        (recovery.lease.execution_id,))[0]  # fmt: skip
        assert row["expires_at_ms"] == recovery.lease.expires_at_ms > clock.now_ms(), row
        assert row["owner"].startswith("loom@")
