"""A reopened Work's wait (docs/concepts.md, "Work" and "Wait"): later Events on the first Work's key are
routed along the chain to its successor, so the successor's wait watches that key too, and the
matching reply wakes it exactly once."""

from __future__ import annotations

import pytest

from loom import Completed, Config, EventIn, Runtime, Waiting, WaitSpec, WaitState, WorkState, open_runtime
from loom.plugins.handlers import work_id_for_key
from loom.testing import ManualClock

SCOPE = "acme"
CONFIG = Config.from_dict({
    "work_kinds": {"job": {"reopen": True}},
    "scopes": {SCOPE: {"routes": [{"name": "w", "types": ["w.*"], "create_work": True, "work_kind": "job"}]}},
})  # fmt: skip
FIRST = work_id_for_key(SCOPE, "k")


def event(delivery_id: str, type: str) -> EventIn:
    return EventIn(source="t", delivery_id=delivery_id, type=type, scope=SCOPE, key="k")


async def successor(rt: Runtime) -> str:
    """Complete the first Work, and reopen it with a later Event on its key: the successor's id."""
    await rt.publish(event("s0", "w.start"))
    await rt.poll()
    await rt.complete(await rt.claim(FIRST, owner="host"), Completed())
    assert (await rt.work(FIRST)).state is WorkState.COMPLETED
    await rt.publish(event("s1", "w.again"))
    await rt.poll()
    (work,) = [w for w in await rt.works() if w.id != FIRST]
    return work.id


@pytest.mark.parametrize("keys", [(), ("k",)], ids=["its-keys", "the-first-key"])
async def test_a_successors_wait_is_woken_by_a_reply_on_the_first_works_key(
    loom_store: str, clock: ManualClock, keys: tuple[str, ...]
) -> None:
    """Catches a successor's wait that watches only its own generation key: the reply, routed to the
    successor along the chain, sat in its pending input while the wait stayed active for ever (and a
    wait naming the first key was refused as not owned)."""
    async with open_runtime(loom_store, clock=clock, config=CONFIG, actors=(), load_entry_points=False) as rt:
        work_id = await successor(rt)
        lease = await rt.claim(work_id, owner="host")
        await rt.complete(lease, Waiting(wait=WaitSpec(types=("w.reply",), keys=keys)))
        reply = await rt.publish(event("r", "w.reply"))
        await rt.poll()
        (wait,) = await rt.waits(work_id)
        assert (wait.state, wait.winner_event_id) == (WaitState.WOKEN, reply.id)
        nxt = await rt.claim(work_id, owner="host")
        assert nxt.request.trigger.id == reply.id
