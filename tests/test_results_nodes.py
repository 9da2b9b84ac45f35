"""A wait for a Work's outcome on one node wakes on another node's commit (docs/backends.md, "How nodes
hear each other"): the commit that settles a Work names it in its notification, bounded like the other
lists there. The periodic check is off (``resync_ms`` of an hour on a clock that never gets there), so
only the notification can wake the waiter."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from loom import Completed, Config, EventIn, ManualClock, open_runtime
from loom.records.notices import StoreChanged, WorkSettled
from loom.records.work import WorkState
from loom.store._notify import MAX_LISTED, parse, summarize
from loom.testing import T0_MS
from loom.testing.postgres import PostgresCluster

HOUR = 3_600_000
CONFIG = Config.from_toml("""
[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
""")


def test_a_notification_names_the_works_it_settled_within_its_bound() -> None:
    """Catches a payload that loses the settled Works, or grows without bound."""
    payload = summarize([WorkSettled(work_id="wk_1"), WorkSettled(work_id="wk_2")], "me")
    assert payload is not None
    assert parse(payload, "other") == StoreChanged(origin="me", settled=("wk_1", "wk_2"))
    many = [WorkSettled(work_id=f"wk_{n}") for n in range(MAX_LISTED + 1)]
    big = summarize(many, "me")
    assert big is not None
    assert parse(big, "other") == StoreChanged(origin="me", everything=True)


@pytest.fixture
def shared_db(loom_postgres: PostgresCluster) -> str:
    return loom_postgres.create_database(template=loom_postgres.migrated_template())


async def test_a_wait_on_one_node_wakes_on_another_nodes_commit(shared_db: str) -> None:
    """Catches a waiter that hears only its own node's commits (it would wait for ever here)."""
    clock = ManualClock(start_ms=T0_MS)
    options = {"clock": clock, "config": CONFIG, "load_entry_points": False, "resync_ms": HOUR, "actors": ()}
    async with (
        open_runtime(shared_db, owner="a", **options) as a,
        open_runtime(  # type: ignore[arg-type]
            shared_db,
            owner="b",
            **options,  # type: ignore[arg-type]
        ) as b,
    ):
        await b.publish(
            EventIn(source="s", delivery_id="1", type="order.placed", scope="shop", key="order/1")
        )
        await b.poll()
        work = await b.work_for_key("order/1")
        lease = await b.claim(work.id, owner="b")
        got = []
        reader = a._p.reader  # the waiter's first read must be over before b commits
        read_once, work_of = trio.Event(), reader.work

        async def work_read(work_id: str) -> object:
            found = await work_of(work_id)
            read_once.set()
            return found

        reader.work = work_read  # type: ignore[method-assign]

        async def waiter() -> None:
            got.append(await a.wait_for(work.id, timeout=60))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await read_once.wait()
            await trio.testing.wait_all_tasks_blocked()  # it waits on its wake-up now
            assert not got
            await b.complete(lease, Completed(value="from b"))
        assert (got[0].state, got[0].value) == (WorkState.COMPLETED, "from b")
