"""Host calls that race the runtime's close or crash (docs/architecture.md, "Supervision"): each one
either completes or fails with `StorageClosed`, never with the storage driver's own error or an
`AttributeError` from a connection already dropped. Reads go through the read side (`Reader`, its
PostgreSQL twin, or the storage actor for ``:memory:``), writes through the storage actor.

The first tests race many calls against the close and a crash at several moments; the last ones
make the narrowest race happen on purpose: a read queued behind another when the close begins.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing

from loom import EventIn, ManualClock, Runtime, StorageClosed, open_runtime
from loom.store import Reader, SQLiteStore, StorageActor, as_store, open_reader
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint
from loom.testing.postgres import PostgresCluster

CALLERS = 3
"""Tasks per kind of call (event reads, Work snapshots, publishes)."""
MAX_CALLS = 10_000
"""A caller gives up after this many calls (the store should have closed long before)."""


def calls(rt: Runtime, tag: str) -> dict[str, Callable[[int], Awaitable[object]]]:
    return {
        "events": lambda n: rt.events(limit=10),
        "works": lambda n: rt.works(),
        "publish": lambda n: rt.publish(
            EventIn(source="t", delivery_id=f"{tag}-{n}", type="t.note", scope="acme")
        ),
    }


async def call_until_closed(call: Callable[[int], Awaitable[object]], outcomes: list[str]) -> None:
    """Call again and again until the store is closed; record how it ended (the error's type)."""
    for n in range(1, MAX_CALLS + 1):
        try:
            await call(n)
        except StorageClosed:
            outcomes.append("StorageClosed")
            return
        except Exception as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
            return
        await trio.lowlevel.checkpoint()
    outcomes.append(f"the store was still open after {MAX_CALLS} calls")


@pytest.mark.parametrize("yields", [0, 1, 3, 7])
async def test_host_calls_racing_a_close_complete_or_find_the_store_closed(
    loom_store: str, clock: ManualClock, yields: int
) -> None:
    """Catches a read that finds its connection closed under it (`sqlite3.ProgrammingError`) or gone
    (`AttributeError`) when the runtime closes while it waits its turn."""
    outcomes: list[str] = []
    async with trio.open_nursery() as callers:
        async with open_runtime(loom_store, clock=clock, actors=(), load_entry_points=False) as rt:
            for name, call in calls(rt, f"close-{yields}").items():
                for _ in range(CALLERS):
                    callers.start_soon(call_until_closed, call, outcomes, name=name)
            for _ in range(yields):
                await trio.lowlevel.checkpoint()
    assert outcomes == ["StorageClosed"] * 3 * CALLERS


@pytest.mark.parametrize(("boundary", "batch"), [(BEFORE_COMMIT, 2), (AFTER_COMMIT, 3)])
async def test_host_calls_racing_a_crash_complete_or_find_the_store_closed(
    loom_store: str, clock: ManualClock, boundary: Boundary, batch: int
) -> None:
    """The storage actor stops at a crash point (as a killed process would): the calls in flight and
    every later one fail with `StorageClosed`, reads as well as writes. Catches a read that meets the
    read connection closed on the way out."""
    crash = CrashAt(boundary, batch)
    outcomes: list[str] = []

    async def run_until_the_crash() -> None:
        async with trio.open_nursery() as callers:
            async with open_runtime(
                loom_store, clock=clock, actors=(), load_entry_points=False, fault=crash
            ) as rt:
                for name, call in calls(rt, f"crash-{crash.boundary}").items():
                    for _ in range(CALLERS):
                        callers.start_soon(call_until_closed, call, outcomes, name=name)
                await trio.sleep_forever()  # until the crash stops the runtime

    with pytest.raises(BaseExceptionGroup) as stopped:
        await run_until_the_crash()
    assert stopped.group_contains(CrashPoint)
    assert outcomes == ["StorageClosed"] * 3 * CALLERS


# -- the narrowest race, on purpose ------------------------------------------------------------------


async def read_behind_a_read_in_progress(reader: Reader, hold: trio.Lock) -> object:
    """Start a read that waits its turn behind one in progress (``hold`` held), begin closing the reader,
    then let the read in progress end: return what the waiting read got (its error, or its rows)."""
    got: list[object] = []

    async def read() -> None:
        try:
            got.append(await reader.events_after(0, 10))
        except Exception as exc:
            got.append(exc)

    async with trio.open_nursery() as nursery:
        async with hold:  # the read in progress
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(reader.aclose)
            await trio.testing.wait_all_tasks_blocked()
    [result] = got
    return result


async def test_a_file_read_queued_when_the_close_begins_finds_the_store_closed(tmp_path: Path) -> None:
    """Catches a close that drops the connection while a read waits for it (the read would use the
    dropped connection: `AttributeError`, or `sqlite3.ProgrammingError` on a closed database)."""
    store = SQLiteStore(path=str(tmp_path / "loom.db"))
    store.close_writer(store.open_writer())
    reader = Reader(store.reader_uri())
    await reader.open()
    result = await read_behind_a_read_in_progress(reader, reader._lock)
    assert isinstance(result, StorageClosed), repr(result)


async def test_a_postgres_read_queued_when_the_close_begins_finds_the_store_closed(
    loom_postgres: PostgresCluster, clock: ManualClock
) -> None:
    """Catches a close that leaves a queued read to connect again on its own (it would read from a
    closed store, and leave a connection open behind the runtime)."""
    store = as_store(loom_postgres.create_database(template=loom_postgres.migrated_template()))
    reader = open_reader(store, StorageActor(store, clock))
    await reader.open()
    result = await read_behind_a_read_in_progress(reader, reader._lock)
    assert isinstance(result, StorageClosed), repr(result)
