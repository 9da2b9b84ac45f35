"""A node that restarts recovers what its killed incarnation left at once (docs/recovery.md, "After a
kill"): on PostgreSQL when it runs under the same ``node`` name, which only one live process may hold;
another node's leases still wait for their expiry."""

from __future__ import annotations

import pytest

import loom
from loom import Completed, EventIn, ManualClock, NodeInUse, open_runtime
from loom.testing import T0_MS
from loom.testing.faults import CrashPoint
from loom.testing.postgres import PostgresCluster

CONFIG = loom.Config.from_toml("""
[[scopes.ops.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
""")


class Kill:
    """A fault hook that stops the storage actor at the next batch once armed (as a SIGKILL would: the
    close never releases the leases)."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, point: str, batch_no: int) -> None:
        if self.armed and point == "before_commit":
            raise CrashPoint("killed")


async def killed_with_a_lease(db: str, clock: ManualClock, node: str) -> loom.Lease:
    kill = Kill()
    leases: list[loom.Lease] = []

    async def run_then_die() -> None:
        async with open_runtime(db, clock=clock, config=CONFIG, load_entry_points=False, actors=(),
                                fault=kill, node=node) as rt:  # fmt: skip
            await rt.publish(EventIn(source="t", delivery_id="j-1", type="job.run", scope="ops", key="job/1"))
            await rt.poll()
            work = await rt.work_for_key("job/1")
            leases.append(await rt.claim(work.id, owner=rt.owner))
            kill.armed = True  # the close's release of the leases is the batch that never commits

    with pytest.raises(CrashPoint):
        await run_then_die()
    (lease,) = leases
    assert lease.owner.startswith(f"{node}#")
    return lease


@pytest.fixture
def pg(loom_postgres: PostgresCluster) -> str:
    return loom_postgres.create_database(template=loom_postgres.migrated_template())


async def test_a_restarted_node_recovers_its_killed_incarnation_at_once(pg: str) -> None:
    """Catches a restart that waits a lease length for attempts whose holder it knows is dead."""
    clock = ManualClock(start_ms=T0_MS)
    lease = await killed_with_a_lease(pg, clock, "node-a")
    async with open_runtime(pg, clock=clock, config=CONFIG, load_entry_points=False, actors=(),
                            node="node-a") as rt:  # fmt: skip
        (recovery,) = (await rt.poll()).recoveries  # the clock never moved
        assert recovery.lease.execution_id == lease.execution_id
        assert recovery.lease.owner.startswith("node-a#")
        assert recovery.lease.owner != lease.owner
        adopted = await rt.adopt(recovery.lease)  # the host ran it: it verifies and adopts it
        await rt.complete(adopted, Completed(value="done once"))
        assert (await rt.result(lease.work_id)).value == "done once"


async def test_another_nodes_leases_wait_for_their_expiry(pg: str) -> None:
    """Catches a node that takes over a lease another node may still hold (alive, only slow)."""
    clock = ManualClock(start_ms=T0_MS)
    await killed_with_a_lease(pg, clock, "node-a")
    async with open_runtime(pg, clock=clock, config=CONFIG, load_entry_points=False, actors=(),
                            node="node-b", lease_ms=60_000) as rt:  # fmt: skip
        assert (await rt.poll()).recoveries == ()
        clock.advance(60_000)
        assert len((await rt.poll()).recoveries) == 1


async def test_a_node_name_is_held_by_one_live_process(pg: str) -> None:
    """Catches two live runtimes under one node name: each would take the other for a dead incarnation."""
    async with open_runtime(pg, config=CONFIG, load_entry_points=False, actors=(), node="node-a"):
        with pytest.raises(NodeInUse, match="node 'node-a' is running already"):
            async with open_runtime(pg, config=CONFIG, load_entry_points=False, actors=(), node="node-a"):
                pass
    async with open_runtime(pg, config=CONFIG, load_entry_points=False, actors=(), node="node-a") as rt:
        assert rt.owner.startswith("node-a#")  # the name went with the runtime that held it
