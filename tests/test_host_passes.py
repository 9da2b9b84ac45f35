"""The host verbs make the same bounded passes the actors make, and leave a concern whose actor runs to
that actor (docs/architecture.md, "Who owns which loop").

Catches: `Runtime.poll` routing Events while the router actor routes them too (two routers racing for
one lane: a route handler run twice for one Event, and decisions applied from two snapshots).
"""

from __future__ import annotations

from typing import Any

import trio

import loom
from loom import Config, Event, EventIn, ManualClock, Work, open_runtime
from loom.plugins.handlers import correlate
from loom.testing import T0_MS

STALL_S = 20  # a watchdog only


class Counting:
    """A route handler that counts its calls and blocks the first until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.entered = trio.Event()
        self.release = trio.Event()

    @loom.hookimpl
    def loom_route_handlers(self) -> dict[str, Any]:
        return {"counting": self.counting}

    async def counting(self, event: Event, scope: str, work: Work | None, route: Any) -> Any:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        return correlate(event, scope, work, route)


CONFIG = Config.from_dict(
    {
        "scopes": {
            "acme": {"routes": [{"name": "r", "types": ["x.*"], "handler": "counting", "create_work": True}]}
        }
    }
)


async def test_poll_leaves_routing_to_the_router_actor_when_it_runs(loom_store: str) -> None:
    handler = Counting()
    async with open_runtime(
        loom_store,
        clock=ManualClock(start_ms=T0_MS),
        config=CONFIG,
        plugins=[handler],
        load_entry_points=False,
    ) as rt:
        event = await rt.publish(EventIn(source="s", delivery_id="d", type="x.y", scope="acme", key="k"))
        with trio.fail_after(STALL_S):
            await handler.entered.wait()  # the router's lane holds it in the handler
        with trio.fail_after(STALL_S):  # a poll that routes too would block in the handler
            report = await rt.poll()
        assert report.routed == 0
        assert handler.calls == 1, "poll ran the handler a second time beside the router"
        handler.release.set()
        await rt.wait_idle()
        assert (await rt.checkpoint(event.id)) is not None
        assert handler.calls == 1


async def test_poll_routes_when_no_router_runs(loom_store: str) -> None:
    """The same pass drives a runtime without actors (the negative of the above: poll is no stub)."""
    handler = Counting()
    handler.release.set()
    async with open_runtime(
        loom_store,
        clock=ManualClock(start_ms=T0_MS),
        config=CONFIG,
        plugins=[handler],
        load_entry_points=False,
        actors=(),
    ) as rt:
        event = await rt.publish(EventIn(source="s", delivery_id="d", type="x.y", scope="acme", key="k"))
        report = await rt.poll()
        assert report.routed == 1
        assert (await rt.checkpoint(event.id)) is not None
        assert handler.calls == 1
