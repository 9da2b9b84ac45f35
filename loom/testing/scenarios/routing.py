"""Routing and ownership: concurrent correlation, independent progress, first match and drop audit,
multi-key attachment and per-Work order (seed 003, "Routing and ownership")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from ... import (
    CheckpointStatus,
    Completed,
    Conflict,
    Event,
    Lease,
    Policy,
    Work,
)
from ...plugins.handlers import correlate, work_id_for_key
from .._driver import Driver, wait_routed
from .._scenario import expect
from ._common import (
    SCOPE,
    _barrier,
    _checkpoint,
    _config,
    _ev,
    _work_of,
)


async def concurrent_correlations_and_attempts(driver: Driver) -> None:
    """Barrier-started same-key Events converge on one Work; competing claims give one attempt."""
    await driver.configure(_config([{"name": "by-key", "types": ["issue.*"], "create_work": True}]))
    events: list[Event] = []

    async def publish(i: int) -> None:
        events.append(await driver.runtime.publish(_ev(f"issue-7/{i}", "issue.comment", key="issue/7")))

    await _barrier(20, publish)
    await wait_routed(driver, *events)
    await driver.settle()
    work = await _work_of(driver, "issue/7")
    expect(work is not None, "no Work owns issue/7 after twenty concurrent events")
    assert work is not None
    works = await driver.runtime.works(limit=1000)
    expect(len([w for w in works if "issue/7" in w.keys]) == 1, "more than one Work was created for issue/7")
    history = await driver.runtime.history(work.id)
    order = [e.id for e in sorted(events, key=lambda e: e.seq)]
    expect(
        [c.event_id for c in history.checkpoints] == order,
        "the twenty events are not all associated with the Work in acceptance order",
    )
    expect(list(work.pending_inputs) == order, "the Work's pending input is not in acceptance order")

    leases: list[Lease] = []
    conflicts = 0

    async def claim(i: int) -> None:
        nonlocal conflicts
        try:
            leases.append(await driver.runtime.claim(work.id, owner=f"node-{i}"))
        except Conflict:
            conflicts += 1

    await _barrier(10, claim)
    expect(len(leases) == 1 and conflicts == 9, f"ten competing claims granted {len(leases)} leases, not one")
    history = await driver.runtime.history(work.id)
    live = [x for x in history.executions if not x.state.terminal]
    expect(len(live) == 1, f"the Work has {len(live)} nonterminal attempts, not one")


async def independent_work_progress(driver: Driver) -> None:
    """A blocked handler, or a blocked launch, for A never delays routing and starting B."""
    gate = trio.Event()

    async def gated(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.key == "A":
            await gate.wait()
        return correlate(event, scope, work, route)

    driver.handlers.table["gated"] = gated
    await driver.configure(
        _config(
            [
                {
                    "name": "by-key",
                    "types": ["job.*"],
                    "handler": "scenario",
                    "config": {"fn": "gated"},
                    "create_work": True,
                    "binding": "fake",
                }
            ]
        )
    )
    a = await driver.runtime.publish(_ev("A/1", "job.run", key="A"))
    b = await driver.runtime.publish(_ev("B/1", "job.run", key="B"))
    b_work = work_id_for_key(SCOPE, "B")

    async def b_launched() -> bool:
        return bool(driver.fake.launches_of(b_work))

    await driver.until(b_launched, "B's attempt to launch while A's handler is blocked")
    expect(await _checkpoint(driver, a) is None, "A was routed although its handler is still blocked")
    expect(await _checkpoint(driver, b) is not None, "B was launched but not routed")
    gate.set()
    a_work = work_id_for_key(SCOPE, "A")

    async def a_launched() -> bool:
        return bool(driver.fake.launches_of(a_work))

    await driver.until(a_launched, "A to be routed and launched once released")

    # the same with A's executor launch blocked instead of its handler
    a2_work, b2_work = work_id_for_key(SCOPE, "A2"), work_id_for_key(SCOPE, "B2")
    launch_gate = driver.fake.launch_gates[a2_work] = trio.Event()
    await driver.runtime.publish(_ev("A2/1", "job.run", key="A2"))

    async def a2_launching() -> bool:
        return bool(driver.fake.launches_of(a2_work))

    await driver.until(a2_launching, "A2's launch to begin")
    await driver.runtime.publish(_ev("B2/1", "job.run", key="B2"))

    async def b2_launched() -> bool:
        return bool(driver.fake.launches_of(b2_work))

    await driver.until(b2_launched, "B2's attempt to launch while A2's launch is blocked")
    launch_gate.set()
    for work_id in (a_work, b_work, a2_work, b2_work):
        driver.fake.finish(work_id, Completed())
    await driver.settle()


async def first_match_replay_and_drop_audit(driver: Driver) -> None:
    """First match stops (a drop too); a drop is durable and audited; replay is a no-op; a
    handler error stops routing with a diagnostic."""
    calls: dict[str, int] = {"r2": 0, "r3": 0}

    def counting(name: str) -> Callable[..., Any]:
        def handler(event: Event, scope: str, work: Work | None, route: Any) -> Any:
            calls[name] += 1
            return correlate(event, scope, work, route)

        return handler

    def raising(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        raise RuntimeError("handler r0 cannot handle x.err")

    driver.handlers.table.update(r2=counting("r2"), r3=counting("r3"), r0=raising)
    config = await driver.configure(
        _config(
            [
                {"name": "r0", "types": ["x.err"], "handler": "scenario", "config": {"fn": "r0"}},
                {"name": "r1", "types": ["x.drop"], "policy": "drop", "reason": "audit: drops are kept"},
                {
                    "name": "r2",
                    "types": ["x.*"],
                    "handler": "scenario",
                    "config": {"fn": "r2"},
                    "create_work": True,
                },
                {
                    "name": "r3",
                    "types": ["x.*"],
                    "handler": "scenario",
                    "config": {"fn": "r3"},
                    "create_work": True,
                },
            ]
        )
    )
    dropped = await driver.runtime.publish(_ev("drop-1", "x.drop", key="d1"))
    await wait_routed(driver, dropped)
    cp = await _checkpoint(driver, dropped)
    expect(cp.status is CheckpointStatus.DROP, f"x.drop was checkpointed {cp.status}, not drop")
    expect(
        cp.route == "r1" and cp.generation == config.generation and cp.reason == "audit: drops are kept",
        f"the drop checkpoint lacks its route, generation or reason: {cp}",
    )
    expect(await _work_of(driver, "d1") is None and cp.work_id is None, "a dropped event created Work")
    expect(
        (await driver.runtime.event(dropped.id)).type == "x.drop", "the dropped event's envelope was not kept"
    )
    replay = await driver.runtime.publish(_ev("drop-1", "x.drop", key="d1"))
    await driver.settle()
    expect(
        replay.duplicate and await _checkpoint(driver, dropped) == cp,
        "replaying a drop changed its checkpoint",
    )
    expect(calls == {"r2": 0, "r3": 0}, f"routes after the first match were called: {calls}")

    one = await driver.runtime.publish(_ev("one-1", "x.one", key="k1"))
    await wait_routed(driver, one)
    cp = await _checkpoint(driver, one)
    expect(
        cp.status is CheckpointStatus.ROUTED and cp.route == "r2" and cp.effective_policy is Policy.QUEUE,
        f"x.one was not routed by r2 and queued: {cp}",
    )
    expect(calls == {"r2": 1, "r3": 0}, f"r3 was called although r2 matched first (no broadcast): {calls}")

    err = await driver.runtime.publish(_ev("err-1", "x.err", key="k9"))
    await wait_routed(driver, err)
    cp = await _checkpoint(driver, err)
    expect(cp.status is CheckpointStatus.UNROUTED and cp.work_id is None, f"x.err should stay unrouted: {cp}")
    diagnostics = await driver.runtime.diagnostics(subject=err.id)
    expect(
        any("r0" in d.message for d in diagnostics), "the handler error left no diagnostic naming its route"
    )
    expect(calls == {"r2": 1, "r3": 0}, f"a later route was tried after a handler error: {calls}")


async def multi_key_attachment_conflict_and_order(driver: Driver) -> None:
    """Atomic key attachment joins earlier input in acceptance order; an owned key aborts
    everything; routing effects follow acceptance order."""
    hold = trio.Event()
    held_keys = {"k2"}

    evaluated: list[str] = []

    async def holding(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.key in held_keys or event.payload.get("hold"):
            await hold.wait()
        evaluated.append(event.id)
        return correlate(event, scope, work, route)

    driver.handlers.table["holding"] = holding
    await driver.configure(
        _config(
            [
                {
                    "name": "keys",
                    "types": ["m.*"],
                    "handler": "scenario",
                    "create_work": True,
                    "config": {"fn": "holding", "keys_field": "keys"},
                }
            ]
        )
    )
    e1 = await driver.runtime.publish(_ev("e1", "m.open", key="k1"))
    await wait_routed(driver, e1)
    w1 = await driver.runtime.work_for_key("k1")
    stale = await driver.runtime.publish(_ev("e0", "other.type", key="k2"))  # matches no route
    await wait_routed(driver, stale)
    e2 = await driver.runtime.publish(_ev("e2", "m.note", key="k2"))  # its handler is held
    e3 = await driver.runtime.publish(_ev("e3", "m.link", key="k1", payload={"keys": ["k2"]}))
    await wait_routed(driver, e3)
    w1 = await driver.runtime.work(w1.id)
    expect(set(w1.keys) == {"k1", "k2"}, f"W1 should own k1 and k2 after the attachment, owns {w1.keys}")
    expect(list(w1.pending_inputs) == [e1.id, e2.id, e3.id], "e2 did not join W1's input before e3")
    cp0 = await _checkpoint(driver, stale)
    expect(
        cp0.status is CheckpointStatus.UNMATCHED and stale.id not in w1.pending_inputs,
        "an event already checkpointed unmatched was resurrected by the attachment",
    )
    hold.set()
    await driver.settle()
    cp2 = await _checkpoint(driver, e2)
    expect(
        cp2.work_id == w1.id and cp2.seq == e2.seq, "e2's checkpoint changed after its held handler returned"
    )

    e4 = await driver.runtime.publish(_ev("e4", "m.open", key="k3"))
    await wait_routed(driver, e4)
    w2 = await driver.runtime.work_for_key("k3")
    e5 = await driver.runtime.publish(_ev("e5", "m.link", key="k1", payload={"keys": ["k3", "k4"]}))
    await wait_routed(driver, e5)
    cp5 = await _checkpoint(driver, e5)
    expect(
        cp5.status is CheckpointStatus.UNROUTED and "owned_by_other" in (cp5.reason or ""),
        f"attaching a key owned by W2 did not abort with owned_by_other: {cp5}",
    )
    w1 = await driver.runtime.work(w1.id)
    expect(
        set(w1.keys) == {"k1", "k2"} and await _work_of(driver, "k4") is None,
        "an aborted attachment attached a key",
    )
    expect(e5.id not in w1.pending_inputs, "an aborted event joined W1's input")
    expect((await driver.runtime.work(w2.id)).keys == ("k3",), "W2's keys changed")
    diagnostics = await driver.runtime.diagnostics(subject=e5.id)
    expect(any(d.kind == "owned_by_other" for d in diagnostics), "no owned_by_other diagnostic for e5")

    # a later event's handler finishing first cannot route it ahead of an earlier one
    hold = trio.Event()
    e6 = await driver.runtime.publish(_ev("e6", "m.note", key="k1", payload={"hold": True}))
    e7 = await driver.runtime.publish(_ev("e7", "m.note", key="k2"))
    held_keys.clear()

    async def e7_evaluated() -> bool:
        return e7.id in evaluated

    await driver.until(e7_evaluated, "e7's handler to return while e6's is held")
    expect(
        await _checkpoint(driver, e7) is None, "e7 was routed while the earlier e6 for the same Work was not"
    )
    hold.set()
    await wait_routed(driver, e6, e7)
    history = await driver.runtime.history(w1.id)
    committed = [c.event_id for c in history.checkpoints if c.event_id in (e6.id, e7.id)]
    expect(
        committed == [e6.id, e7.id], f"W1's checkpoints were committed out of acceptance order: {committed}"
    )
