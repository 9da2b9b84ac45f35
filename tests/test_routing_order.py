"""A lane waiting on an earlier, unrouted Event of its Work wakes when that Event is
checkpointed, whatever its checkpoint (unmatched included)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import trio
import trio.testing

from loom import CheckpointStatus, Completed, Config, EventIn, Unmatched, WorkState
from loom.kernel.unrouted import unrouted_in_tx
from loom.plugins.handlers import work_id_for_key
from loom.testing import RuntimeDriver
from loom.testing.internals import activity_of


def config_with_a_held_route(binding: str | None = None) -> Config:
    """``y.*`` Events go through the ``held`` route handler; ``x.*`` Events create Work by key (run
    under ``binding``, the fake executor's, when given)."""
    by_key: dict[str, Any] = {"name": "by-key", "types": ["x.*"], "create_work": True}
    scope: dict[str, Any] = {
        "routes": [
            {"name": "held", "types": ["y.*"], "handler": "scenario", "config": {"fn": "held"}},
            by_key,
        ]
    }
    if binding is not None:
        by_key["binding"] = binding
        scope["bindings"] = {binding: {"executor": "fake"}}
    return Config.from_dict({"scopes": {"acme": scope}})


class Held:
    """A route handler held until `release` is set, then matching nothing."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

    async def __call__(self, event: Any, scope: str, work: Any, route: Any) -> Unmatched:
        self.entered.set()
        await self.release.wait()
        return Unmatched(reason="nothing to do")


async def test_a_later_event_waits_for_an_earlier_one_that_ends_unmatched(loom_store: str) -> None:
    held = Held()
    async with trio.open_nursery() as nursery:
        driver = RuntimeDriver(nursery, loom_store, config=config_with_a_held_route())
        driver.handlers.table["held"] = held
        await driver.start()
        rt = driver.runtime
        opened = await rt.publish(
            EventIn(source="t", delivery_id="open", type="x.open", scope="acme", key="k")
        )
        await driver.settle()
        work = await rt.work_for_key("k")
        # an earlier event names the Work explicitly; its handler is held, then matches nothing
        earlier = await rt.publish(
            EventIn(source="t", delivery_id="e1", type="y.note", scope="acme", work_id=work.id)
        )
        await held.entered.wait()
        later = await rt.publish(EventIn(source="t", delivery_id="e2", type="x.more", scope="acme", key="k"))

        async def later_blocked() -> bool:
            return await rt.checkpoint(later.id) is None

        assert await later_blocked(), "a later event was routed before an earlier one of its Work"
        held.release.set()

        async def both_routed() -> bool:
            return await rt.checkpoint(earlier.id) is not None and await rt.checkpoint(later.id) is not None

        await driver.until(both_routed, "the later event to be routed once the earlier one is settled")
        assert (await rt.checkpoint(earlier.id)).status is CheckpointStatus.UNMATCHED  # type: ignore[union-attr]
        assert (await rt.work(work.id)).pending_inputs == (opened.id, later.id)
        await driver.stop()


async def test_a_completion_waiting_for_an_earlier_event_wakes_when_a_lane_routes_it(loom_store: str) -> None:
    """An attempt's terminal completion waits while an Event of its Work is unrouted; the commit that
    routes that Event (from its lane, after a held handler) holds nothing else the router acts on,
    and still wakes the waiting completion. Catches: a router that skips commits of Events routed and
    nothing more without asking whether a step waits for one (the completion would wait forever)."""
    held = Held()
    async with trio.open_nursery() as nursery:
        driver = RuntimeDriver(nursery, loom_store, config=config_with_a_held_route(binding="fake"))
        driver.handlers.table["held"] = held
        await driver.start()
        rt = driver.runtime
        await rt.publish(EventIn(source="t", delivery_id="open", type="x.open", scope="acme", key="k"))
        work_id = work_id_for_key("acme", "k")

        async def launched() -> bool:
            return bool(driver.fake.launches_of(work_id))

        await driver.until(launched, "the Work's attempt to launch")
        earlier = await rt.publish(
            EventIn(source="t", delivery_id="e1", type="y.note", scope="acme", work_id=work_id)
        )
        await held.entered.wait()
        driver.fake.finish(work_id, Completed())
        activity = activity_of(rt)
        with trio.move_on_after(driver.stall_s) as stalled:
            while not activity.routed_waiters:  # the completion waits for the earlier Event's checkpoint
                await trio.testing.wait_all_tasks_blocked()
        assert not stalled.cancelled_caught, "the completion never waited for the unrouted Event"
        assert (await rt.work(work_id)).state is WorkState.RUNNING
        held.release.set()

        async def completed() -> bool:
            return (await rt.work(work_id)).state is WorkState.COMPLETED

        await driver.until(completed, "the completion to go on once the earlier Event is routed")
        assert (await rt.checkpoint(earlier.id)).status is CheckpointStatus.UNMATCHED  # type: ignore[union-attr]
        await driver.stop()


class RacingStore:
    """A shared database as one transaction of `unrouted_in_tx` sees it, statement by statement: each
    statement sees what was committed before it ran, and other nodes commit Events between statements
    (in sequence order, as the acceptance-order lock makes them). After its second statement, Events
    2 and 3 commit, not routed yet."""

    def __init__(self) -> None:
        self.committed = [1]
        self.routed = {1}
        self.watermark = 0
        self.statements = 0

    def _ran(self) -> None:
        self.statements += 1
        if self.statements == 2:
            self.committed += [2, 3]  # another node's acceptances, committed meanwhile

    def kv_get(self, namespace: str, key: str, *, for_update: bool = False) -> Any:
        self._ran()
        return SimpleNamespace(value={"seq": self.watermark}) if self.watermark else None

    def kv_put(self, namespace: str, key: str, value: dict[str, Any], now_ms: int) -> None:
        self.watermark = value["seq"]

    def max_seq(self) -> int:
        newest = max(self.committed)
        self._ran()
        return newest

    def unrouted_events(self, after_seq: int, limit: int) -> list[Any]:
        seen = [SimpleNamespace(seq=s) for s in self.committed if s > after_seq and s not in self.routed]
        self._ran()
        return seen[:limit]


def test_a_routing_search_never_raises_the_watermark_past_events_committed_meanwhile() -> None:
    """Every Event at or below the routing watermark has its checkpoint, also on a shared database where
    other nodes commit between a search's statements. Catches a search that reads the newest Event
    after looking for unrouted ones (it raised the watermark over Events 2 and 3, committed between
    the two reads and never seen unrouted, and a later Event of their Work then routed before them:
    the multi-node drill once found a Work's inputs routed out of order so)."""
    store = RacingStore()
    found = unrouted_in_tx(store, 0, 100)  # type: ignore[arg-type]
    assert all(seq in store.routed for seq in range(1, store.watermark + 1)), (
        f"the watermark {store.watermark} passed over unrouted Events"
    )
    assert [e.seq for e in found] in ([], [2, 3])
