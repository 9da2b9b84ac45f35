"""A child process for the multi-node drill (tests/test_nodes_drill.py): one node on a shared PostgreSQL
database, under load, with every actor running.

``node.py DB NODE GENERATION SEED``: the node's owner name is ``NODE.GENERATION``. It

* publishes ``drill.start`` Events, each starting a Work of its own (key ``job/NODE-GENERATION-I``) run by
  executor ``steps``, and a ``drill.reply`` on the key of the job three before, which wakes that job's
  wait;
* arms timers due a moment later (each fires one ``drill.tick``);
* publishes Events on keys every node shares (routed to one Work per key) and offers Events every
  node offers too (accepted once in all).

Executor ``steps`` runs every attempt, whichever node claimed it: it sleeps a seeded moment, then
completes if its job has its answer (its wait was woken, or its reply was accepted before it waited),
else parks the attempt on a ``drill.reply`` wait (every other job with a timeout). It takes no input
while it runs, so a reply that arrives meanwhile is there for the wait. It cannot adopt an attempt
another process ran: a recovered attempt fails into retry.

Every acknowledgement and every step is printed, flushed, as it happens::

    ack DELIVERY_ID               an Event was acknowledged (committed)
    armed TIMER_ID                a timer was acknowledged
    started WORK ATTEMPT EPOCH    an attempt began under the lease of that epoch
    done WORK ATTEMPT EPOCH       it returns Completed (not committed yet)

All nodes share the system clock (business time is real time), as nodes on several machines share
NTP time: a lease one node holds expires for every other node at the same moment.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Mapping
from typing import Any

import trio

import loom

LEASE_MS = 3_000
WAIT_TIMEOUT_MS = 1_500
RETRY_ATTEMPTS = 10
RETRY_BACKOFF_MS = 200
WAKES = frozenset({"drill.reply", "core.wait.timeout"})
"""The types of the Events that end a wait."""

CONFIG = loom.Config.from_dict(
    {
        "work_kinds": {
            "job": {
                "retry_attempts": RETRY_ATTEMPTS,
                "retry_backoff_ms": [RETRY_BACKOFF_MS] * (RETRY_ATTEMPTS - 1),
            }
        },
        "scopes": {
            "drill": {
                "bindings": {"steps": {"executor": "steps"}},
                "routes": [
                    {
                        "name": "jobs",
                        "types": ["drill.start"],
                        "create_work": True,
                        "binding": "steps",
                        "work_kind": "job",
                    },
                    {"name": "replies", "types": ["drill.reply"]},
                    {"name": "orders", "types": ["drill.*"], "create_work": True},
                ],
            }
        },
    }
)


def say(line: str) -> None:
    print(line, flush=True)


def has_timeout(work_id: str) -> bool:
    """Every other job's wait has a timeout (which of a reply and the timeout comes first varies)."""
    return int(work_id.encode().hex(), 16) % 2 == 0


class Steps:
    """Executor ``steps`` (see the module docstring): it reads the store through the runtime given to
    `open` once that is open; ``report`` takes each step line."""

    capabilities = frozenset[str]()

    def __init__(self, seed: str, report: Callable[[str], None] = say) -> None:
        self.seed, self.report = seed, report
        self.runtime: loom.Runtime | None = None
        self.opened = trio.Event()

    def open(self, runtime: loom.Runtime) -> None:
        """The runtime is open: attempts it recovered or started meanwhile go on."""
        self.runtime = runtime
        self.opened.set()

    @loom.hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        return {"steps": self}

    async def launch(self, request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Outcome:
        step = f"{request.work_id} {request.attempt} {toolbelt.lease.epoch}"
        self.report(f"started {step}")
        await self.opened.wait()  # an attempt started while the runtime was opening reads it after
        await trio.sleep(random.Random(f"{self.seed} {step}").uniform(0.02, 0.3))
        if await self.answered(request.work_id):
            self.report(f"done {step}")
            return loom.Completed()
        timeout = WAIT_TIMEOUT_MS if has_timeout(request.work_id) else None
        return loom.Waiting(wait=loom.WaitSpec(types=("drill.reply",), timeout_ms=timeout))

    async def answered(self, work_id: str) -> bool:
        """Whether the job has its answer: its wait was woken, or its reply was accepted before it
        waited (a reply an attempt lost to a kill took in is not offered again)."""
        rt = self.runtime
        assert rt is not None
        if any(w.state is loom.WaitState.WOKEN for w in await rt.waits(work_id)):
            return True
        (key,) = (await rt.work(work_id)).keys
        try:
            await rt.event_by_delivery("drill", f"reply-{key}")
        except loom.NotFound:
            return False
        return True

    async def inject(self, execution_id: str, event: loom.Event) -> None:
        raise loom.NotAccepting(f"execution {execution_id} takes no input while it runs")

    async def interrupt(self, execution_id: str) -> None:
        pass


def job(name: str, i: int) -> tuple[loom.EventIn, loom.EventIn | None]:
    """Job ``i``'s start, and the reply to job ``i - 3`` (None for the first three)."""
    start = loom.EventIn(
        source="drill",
        delivery_id=f"start-{name}-{i}",
        type="drill.start",
        scope="drill",
        key=f"job/{name}-{i}",
    )
    return start, (reply(f"job/{name}-{i - 3}") if i >= 3 else None)


def reply(key: str) -> loom.EventIn:
    return loom.EventIn(
        source="drill", delivery_id=f"reply-{key}", type="drill.reply", scope="drill", key=key
    )


async def main(db: str, node: str, generation: str, seed: str) -> None:
    name = f"{node}-{generation}"
    steps = Steps(seed)
    async with loom.open_runtime(
        db,
        config=CONFIG,
        plugins=[steps],
        owner=f"{node}.{generation}",
        lease_ms=LEASE_MS,
        load_entry_points=False,
    ) as rt:
        steps.open(rt)

        async def jobs() -> None:
            for i in range(100_000):
                for event in job(name, i):
                    if event is not None:
                        say(f"ack {(await rt.publish(event)).delivery_id}")
                await trio.sleep(0.05)

        async def timers() -> None:
            for i in range(100_000):
                spec = loom.TimerSpec(
                    id=f"t-{name}-{i}",
                    fire_at_ms=rt.clock.now_ms() + 100,
                    source="drill",
                    type="drill.tick",
                    scope="drill",
                    key=f"order/{i % 7}",
                )
                await rt.arm(spec)
                say(f"armed {spec.id}")
                await trio.sleep(0.05)

        async def orders() -> None:
            for i in range(100_000):
                own = loom.EventIn(
                    source="drill", delivery_id=f"{name}-{i}", type="drill.order", scope="drill",
                    key=f"order/{i % 7}",
                )  # fmt: skip
                say(f"ack {(await rt.publish(own)).delivery_id}")
                if i % 5 == 0:  # every node offers these: one Event each, whoever is first
                    common = loom.EventIn(
                        source="drill", delivery_id=f"common-{i}", type="drill.common", scope="drill"
                    )
                    say(f"ack {(await rt.publish(common)).delivery_id}")
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(jobs)
            nursery.start_soon(timers)
            nursery.start_soon(orders)


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:5])
