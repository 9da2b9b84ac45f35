"""Embedding actors one by one: a runtime with no background actors is driven by the host's bounded
calls alone, and a host can start only the actors it wants in its own nursery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

import loom
from loom.testing import T0_MS

CONFIG = loom.Config.from_dict(
    {"scopes": {"shop": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]}}}
)
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def order(n: int) -> loom.EventIn:
    return loom.EventIn(
        source="shop", delivery_id=f"o-{n}", type="order.placed", scope="shop", key=f"order/{n}"
    )


def reminder(timer_id: str, at_ms: int) -> loom.TimerSpec:
    return loom.TimerSpec(id=timer_id, fire_at_ms=at_ms, source="shop", type="shop.reminder", scope="shop")


async def test_with_no_actors_nothing_moves_until_the_host_polls(loom_store: str) -> None:
    clock = loom.ManualClock(start_ms=T0_MS)
    async with loom.open_runtime(
        loom_store, clock=clock, config=CONFIG, actors=(), load_entry_points=False
    ) as rt:
        first, second = await rt.publish(order(1)), await rt.publish(order(2))
        await rt.arm(reminder("r", T0_MS + 1_000))
        clock.advance(1_000)
        await rt.wait_idle()
        # a router or a timer actor running behind the host's back would have acted by now
        assert await rt.checkpoint(first.id) is None
        assert await rt.checkpoint(second.id) is None
        assert await rt.firings("r") == []

        report = await rt.poll(limit=1)
        assert report.routed == 1, "the pass is bounded by its limit"
        assert await rt.checkpoint(first.id) is not None
        assert await rt.checkpoint(second.id) is None
        assert [f.timer_id for f in report.firings] == ["r"]

        report = await rt.poll(limit=10)
        assert report.routed == 2, "the second order and the reminder's own Event"
        assert report.firings == ()
        work = await rt.work_for_key("order/2")
        lease = await rt.claim(work.id, owner="host")
        assert [e.id for e in lease.request.inputs] == [second.id]
        await rt.complete(lease, loom.Completed())
        assert (await rt.work(work.id)).state is loom.WorkState.COMPLETED


async def test_a_timer_actor_started_in_the_hosts_own_nursery_fires_by_itself(loom_store: str) -> None:
    clock = loom.ManualClock(start_ms=T0_MS)
    async with (
        loom.open_runtime(loom_store, clock=clock, config=CONFIG, actors=(), load_entry_points=False) as rt,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(rt.run_actor, "timers")
        placed = await rt.publish(order(1))
        await rt.arm(reminder("r", T0_MS + 1_000))
        clock.advance(1_000)
        await rt.wait_idle()
        assert [f.result for f in await rt.firings("r")] == [loom.FiringResult.ACCEPTED]
        assert await rt.checkpoint(placed.id) is None, "routing stays with the host: no router was started"
        nursery.cancel_scope.cancel()


async def test_a_router_started_later_routes_what_was_accepted_before(loom_store: str) -> None:
    async with (
        loom.open_runtime(loom_store, config=CONFIG, actors=(), load_entry_points=False) as rt,
        trio.open_nursery() as nursery,
    ):
        placed = await rt.publish(order(1))
        await nursery.start(rt.run_actor, "router")
        await rt.wait_idle()
        checkpoint = await rt.checkpoint(placed.id)
        assert checkpoint is not None
        assert checkpoint.status is loom.CheckpointStatus.ROUTED
        nursery.cancel_scope.cancel()


async def test_actors_are_named_and_run_once_each() -> None:
    with pytest.raises(loom.InvalidRequest, match="unknown actor 'ingest'"):
        async with loom.open_runtime(":memory:", actors=("ingest",), load_entry_points=False):
            pass
    async with loom.open_runtime(":memory:", load_entry_points=False) as rt, trio.open_nursery() as nursery:
        with pytest.raises(loom.InvalidRequest, match="already running"):
            await nursery.start(rt.run_actor, "timers")
        with pytest.raises(loom.InvalidRequest, match="unknown actor"):
            await nursery.start(rt.run_actor, "wait")


async def test_an_exception_leaves_open_runtime_as_itself(tmp_path: Path) -> None:
    """The block's own exception, and the one failure that stops the runtime (a store that cannot be
    opened), leave `open_runtime` as themselves, so ``except KeyError`` or ``except loom.StorageError``
    catches them; only several exceptions together come as an `ExceptionGroup`. Catches: the groups of
    the runtime's nurseries let out as they are (a caller's own exception, nested twice)."""
    with pytest.raises(KeyError, match="mine"):
        async with loom.open_runtime(":memory:", load_entry_points=False):
            raise KeyError("mine")
    with pytest.raises(loom.StorageError, match="does not exist"):
        async with loom.open_runtime(str(tmp_path / "missing" / "x.db"), load_entry_points=False):
            raise AssertionError("a store that cannot be opened never yields a runtime")


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_each_example_runs_as_it_is(example: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "an example says what it did"


def test_the_readme_embedding_example_runs_its_handler_before_it_closes(tmp_path: Path) -> None:
    readme = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "readme_example.py"
    script.write_text(code, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 ['order.placed']" in done.stdout, "the handler ran (attempt 1, with its input) before the close"
