"""Bad connections to PostgreSQL: a connection cut by the server (``pg_terminate_backend``) or a
server restart fails the batch in flight to every caller in it as a storage error, the storage
actor reconnects with backoff, and the runtime goes on (its background actors start again from the
store); nothing acknowledged is lost and nothing committed twice.

Catches: a lost connection that stops the runtime, a batch reported committed that was not, a
caller left hanging, an actor that never reconnects, a timer fired twice across the reconnect.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import pytest
import trio

from loom import EventIn, ManualClock, Runtime, StorageError, StorageUnavailable, open_runtime
from loom.records.timers import TimerSpec
from loom.store import StorageActor, Tx, as_store
from loom.testing import T0_MS, raw, until_committed
from loom.testing.postgres import PostgresCluster

NS = "test"
STALL_SECONDS = 60


def put(tx: Tx, now_ms: int, key: str) -> str:
    tx.kv_put(NS, key, {"key": key}, now_ms)
    return key


@pytest.fixture
def database(loom_postgres: PostgresCluster) -> tuple[str, str]:
    """A fresh migrated database: its name and a URL that reconnects without delay."""
    name = f"loom_cut_{uuid.uuid4().hex[:12]}"  # unique: the address of a fresh object is not
    url = loom_postgres.create_database(name, template=loom_postgres.migrated_template())
    return name, url


def kv_keys(url: str) -> list[str]:
    return [r["key"] for r in raw.query(url, "SELECT key FROM kv WHERE namespace = ? ORDER BY key", (NS,))]


async def test_a_connection_cut_mid_batch_fails_every_caller_in_it_and_the_actor_reconnects(
    loom_postgres: PostgresCluster, database: tuple[str, str], nursery: trio.Nursery
) -> None:
    name, url = database
    store = as_store(url)
    actor: StorageActor = await nursery.start(StorageActor(store, ManualClock(start_ms=T0_MS)).run)
    assert await actor.submit(put, "a") == "a"

    def put_then_cut(tx: Tx, now_ms: int, key: str) -> str:
        put(tx, now_ms, key)
        assert loom_postgres.terminate(name, "loom writer") == 1
        put(tx, now_ms, key + "-after-the-cut")  # the connection is gone: this fails the batch
        return key

    outcomes: dict[str, BaseException | str] = {}

    async def call(key: str, proc: Callable[..., str]) -> None:
        try:
            outcomes[key] = await actor.submit(proc, key)
        except StorageError as exc:
            outcomes[key] = exc

    async with trio.open_nursery() as callers:  # submitted together: one batch
        callers.start_soon(call, "b", put)
        callers.start_soon(call, "c", put_then_cut)
    assert set(outcomes) == {"b", "c"}
    assert all(isinstance(outcome, StorageUnavailable) for outcome in outcomes.values()), outcomes
    assert "not committed" in str(outcomes["b"])
    assert kv_keys(url) == ["a"], "nothing of the failed batch committed"
    assert actor.stats.failed_batches == 1

    assert await actor.submit(put, "d") == "d"  # reconnected
    assert kv_keys(url) == ["a", "d"]


async def test_a_connection_lost_before_a_batch_runs_again_guarded_fails_it_and_the_actor_reconnects(
    loom_postgres: PostgresCluster, database: tuple[str, str], nursery: trio.Nursery
) -> None:
    """A request fails (its own error) in a batch run unguarded, and the connection is cut before the
    rollback that lets the batch run again guarded. Catches: running the batch again on the dropped
    connection (the actor crashed), instead of failing it as `StorageUnavailable` and reconnecting."""
    name, url = database
    store = as_store(url)
    actor: StorageActor = await nursery.start(StorageActor(store, ManualClock(start_ms=T0_MS)).run)

    def put_cut_then_refuse(tx: Tx, now_ms: int, key: str) -> str:
        put(tx, now_ms, key)
        assert loom_postgres.terminate(name, "loom writer") == 1
        raise ValueError("this request's own error, once the connection is gone")

    with pytest.raises(StorageUnavailable, match="not committed"):
        await actor.submit(put_cut_then_refuse, "a")
    assert await actor.submit(put, "b") == "b"  # reconnected
    assert kv_keys(url) == ["b"]


def event(n: int) -> EventIn:
    return EventIn(source="test", delivery_id=f"d{n}", type="test.happened", scope="s", key=f"k{n}")


@pytest.mark.parametrize("cut", ["terminate", "restart"])
async def test_the_runtime_goes_on_through_a_lost_connection_and_loses_nothing_acknowledged(
    loom_postgres: PostgresCluster,
    database: tuple[str, str],
    cut: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if cut == "restart" and loom_postgres.data_dir is None:
        pytest.skip("an external server cannot be restarted by the tests")
    name, url = database
    clock = ManualClock(start_ms=T0_MS)
    armed: list[str] = []  # how the next batch loses its connection, just before its COMMIT
    cuts: list[int] = []

    def fault(point: str, batch_no: int) -> None:
        if point == "before_commit" and armed:
            how = armed.pop()
            cuts.append(batch_no)
            if how == "terminate":
                assert loom_postgres.terminate(name, "loom writer") == 1
            else:
                loom_postgres.restart()

    caplog.set_level(logging.WARNING, logger="loom")
    async with open_runtime(url, clock=clock, fault=fault, load_entry_points=False) as rt:
        timer = await rt.arm(
            TimerSpec(id="t1", fire_at_ms=T0_MS + 1000, source="clock", type="clock.tick", scope="s")
        )
        first = await rt.publish(event(1))
        armed.append(cut)  # the router's next batch (reading or routing event 1) is cut
        await until_committed(
            rt,
            lambda: has_checkpoint(rt, first.id),
            "event 1 to be routed after the reconnect",
            stall_s=STALL_SECONDS,
        )
        assert len(cuts) == 1, "the fault never cut the connection"
        assert any("actor lost the store's connection" in r.getMessage() for r in caplog.records), (
            "an actor saw the lost connection and started again"
        )

        await rt.wait_idle()
        armed.append("terminate")  # now the next batch is a caller's: it fails to that caller
        with pytest.raises(StorageUnavailable):
            await rt.publish(event(2))
        assert len(cuts) == 2
        again = await rt.publish(event(2))  # offered again: accepted once
        clock.advance(1000)

        async def fired() -> bool:
            return (await rt.timer(timer.id)).state.value != "armed"

        await until_committed(rt, fired, "the timer to fire", stall_s=STALL_SECONDS)
        await until_committed(
            rt, lambda: has_checkpoint(rt, again.id), "event 2 to be routed", stall_s=STALL_SECONDS
        )
        firings = await rt.firings(timer.id)

    assert len(firings) == 1
    rows = raw.query(url, "SELECT delivery_id FROM events WHERE source = 'test' ORDER BY seq")
    assert [r["delivery_id"] for r in rows] == ["d1", "d2"], "each acknowledged Event once"
    ticks = raw.query(url, "SELECT count(*) AS n FROM events WHERE type = 'clock.tick'")
    assert ticks[0]["n"] == 1


async def has_checkpoint(rt: Runtime, event_id: str) -> bool:
    """Whether ``event_id`` is routed; a read that meets the server while it restarts answers
    `StorageUnavailable`, as documented, and is asked again."""
    try:
        return await rt.checkpoint(event_id) is not None
    except StorageUnavailable:
        return False
