"""Rescans asked for faster than the store answers them: one runs at a time, and every ask made while it
runs is answered by one more run after it (`loom.actors.activity.Coalesced`).

Catches: a task started per ask (a shared database's periodic check, another node's commit, a reload), which
piles the storage actor's mailbox up without bound whenever the store answers slower than the checks
come, ahead of the routing they are meant to unblock (seen: three nodes whose checks came faster than
their rescans stopped routing altogether); and an ask made during a run that is dropped instead of
answered.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing

from loom import Config, ManualClock, open_runtime
from loom.actors import lanes
from loom.actors import router as router_module
from loom.actors.activity import Activity, Coalesced
from loom.kernel.unrouted import unrouted_in_tx
from loom.store import Tx
from loom.testing import T0_MS
from loom.testing.internals import router_of
from loom.testing.postgres import PostgresCluster

CHECK_MS = 1000


async def test_asks_during_a_run_make_one_more_run_with_their_arguments_merged() -> None:
    activity = Activity()
    runs: list[int] = []
    release = trio.Event()

    async def run(arg: int) -> None:
        runs.append(arg)
        if len(runs) == 1:
            await release.wait()

    async with trio.open_nursery() as nursery:
        activity.bind(nursery)
        coalesced = Coalesced(activity, run, max)
        coalesced.ask(1)
        await trio.testing.wait_all_tasks_blocked()
        for arg in (5, 3, 4):  # while the first run waits
            coalesced.ask(arg)
        await trio.testing.wait_all_tasks_blocked()
        assert runs == [1], "nothing more runs while a run is in progress"
        assert not activity.idle
        release.set()
        await activity.wait_quiet()
        assert runs == [1, 5], "one more run, with the asks merged (max of 5, 3, 4)"
        coalesced.ask(2)  # asked once nothing runs: runs again
        await activity.wait_quiet()
    assert runs == [1, 5, 2]


async def test_the_latest_ask_wins_by_default() -> None:
    activity = Activity()
    runs: list[str] = []
    release = trio.Event()

    async def run(arg: str) -> None:
        runs.append(arg)
        await release.wait()

    async with trio.open_nursery() as nursery:
        activity.bind(nursery)
        coalesced = Coalesced(activity, run)
        coalesced.ask("a")
        await trio.testing.wait_all_tasks_blocked()
        coalesced.ask("b")
        coalesced.ask("c")
        release.set()
        await activity.wait_quiet()
    assert runs == ["a", "c"]


@pytest.fixture
def shared_db(loom_postgres: PostgresCluster) -> str:
    return loom_postgres.create_database(template=loom_postgres.migrated_template())


async def test_periodic_checks_faster_than_the_store_answers_ask_for_one_rescan_at_a_time(
    shared_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node whose storage thread is held (a slow store) hears twenty periodic checks: its routing
    and intent rescans each run once more after the held one, not once per check."""
    clock = ManualClock(start_ms=T0_MS)
    held = threading.Event()
    searches: list[int | None] = []
    entered = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def slow_search(tx: Tx, now_ms: int, limit: int, after_seq: int | None = None) -> Any:
        searches.append(after_seq)
        trio.from_thread.run_sync(entered.set, trio_token=token)
        assert held.wait(60), "the test never let the store go"
        return unrouted_in_tx(tx, now_ms, limit, after_seq)

    async with open_runtime(
        shared_db, clock=clock, owner="n0", load_entry_points=False, resync_ms=CHECK_MS
    ) as rt:
        dispatcher = router_of(rt).dispatcher
        intent_rescans = 0
        resync = dispatcher.resync

        async def counted_resync() -> None:
            nonlocal intent_rescans
            intent_rescans += 1
            await resync()

        monkeypatch.setattr(dispatcher, "resync", counted_resync)
        monkeypatch.setattr(lanes, "unrouted_in_tx", slow_search)  # after the start's own rescan
        clock.advance(CHECK_MS)
        await entered.wait()  # the first check's search holds the storage thread
        for _ in range(19):
            clock.advance(CHECK_MS)
            await trio.testing.wait_all_tasks_blocked()  # the router has heard this check
        assert searches == [None]
        held.set()
        await rt.wait_idle()
    assert len(searches) == 2, f"one search more for the 19 checks heard meanwhile, not {len(searches) - 1}"
    assert intent_rescans == 2, (
        f"one intent rescan more for the 19 checks heard meanwhile, not {intent_rescans - 1}"
    )


async def test_reloads_faster_than_the_store_answers_ask_for_one_pass_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime whose storage thread is held during a reload's pass hears nineteen more reloads: one
    more pass runs after the held one, under the last generation, not a pass per reload."""
    held = threading.Event()
    entered = trio.Event()
    passes: list[int] = []
    token = trio.lowlevel.current_trio_token()

    async with open_runtime(":memory:", clock=ManualClock(start_ms=T0_MS), load_entry_points=False) as rt:
        readmit = router_module.readmit_in_tx

        def slow_readmit(tx: Tx, now_ms: int) -> int:
            passes.append(rt.config.generation)
            trio.from_thread.run_sync(entered.set, trio_token=token)
            assert held.wait(60), "the test never let the store go"
            return readmit(tx, now_ms)

        monkeypatch.setattr(router_module, "readmit_in_tx", slow_readmit)
        rt.reload(Config.from_dict({}))
        await entered.wait()  # the first reload's pass holds the storage thread
        for _ in range(19):
            rt.reload(Config.from_dict({}))
            await trio.testing.wait_all_tasks_blocked()
        assert len(passes) == 1
        held.set()
        await rt.wait_idle()
        last = rt.config.generation
    assert len(passes) == 2, f"one pass more for the 19 reloads heard meanwhile, not {len(passes) - 1}"
    assert passes[-1] == last, "the pass after reads the generation in force then"
