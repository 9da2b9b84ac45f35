"""Routing and ownership: concurrent correlation, independent progress, first match and drop audit,
multi-key attachment and per-Work order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from ... import (
    CheckpointStatus,
    Completed,
    Conflict,
    Drop,
    Event,
    Failed,
    Lease,
    Policy,
    Work,
    WorkState,
)
from ...plugins.handlers import correlate, work_id_for_key
from .._driver import Driver, wait_routed
from .._scenario import expect
from ._common import (
    SCOPE,
    _acceptance_order,
    _barrier,
    _checkpoint,
    _commit_order,
    _config,
    _ev,
    _work_of,
)


async def concurrent_correlations_and_attempts(driver: Driver) -> None:
    """Barrier-started same-key Events converge on one Work in acceptance order; competing claims
    give one attempt, each loser refused for that reason."""
    await driver.configure(_config([{"name": "by-key", "types": ["issue.*"], "create_work": True}]))
    events: list[Event] = []

    async def publish(i: int) -> None:
        events.append(await driver.runtime.publish(_ev(f"issue-7/{i}", "issue.comment", key="issue/7")))

    await _barrier(20, publish)
    await wait_routed(driver, *events)
    await driver.settle()
    await driver.reopen()
    work = await _work_of(driver, "issue/7")
    expect(work is not None, "no Work owns issue/7 after twenty concurrent events")
    assert work is not None
    works = await driver.runtime.works(limit=1000)
    expect(len([w for w in works if "issue/7" in w.keys]) == 1, "more than one Work was created for issue/7")
    committed = await _commit_order(driver, work.id, *events)
    expect(
        committed == _acceptance_order(*events),
        f"the twenty events were not all associated with the one Work in acceptance order: {committed}",
    )
    expect(
        set(work.pending_inputs) == {e.id for e in events},
        "not every routed event is the Work's pending input",
    )

    leases: list[Lease] = []
    refusals: list[Conflict] = []

    async def claim(i: int) -> None:
        try:
            leases.append(await driver.runtime.claim(work.id, owner=f"node-{i}"))
        except Conflict as exc:
            refusals.append(exc)

    await _barrier(10, claim)
    expect(
        len(leases) == 1 and len(refusals) == 9, f"ten competing claims granted {len(leases)} leases, not one"
    )
    expect(
        all("nonterminal attempt" in str(c) for c in refusals),
        f"a losing claim was refused for another reason than the Work's one nonterminal attempt: {refusals}",
    )
    await driver.settle()
    await driver.reopen()
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
    driver.fake.finish(a_work, Completed())
    driver.fake.finish(b_work, Completed())
    await driver.settle()
    await driver.reopen()

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
    expect(
        (await driver.runtime.work(b2_work)).state is WorkState.RUNNING,
        "B2's attempt launched but its Work is not running",
    )
    launch_gate.set()
    for work_id in (a2_work, b2_work):
        driver.fake.finish(work_id, Completed())
    await driver.settle()
    for work_id in (a_work, b_work, a2_work, b2_work):
        state = (await driver.runtime.work(work_id)).state
        expect(state is WorkState.COMPLETED, f"work {work_id} did not complete once released: {state}")


async def first_match_replay_and_drop_audit(driver: Driver) -> None:
    """First match stops (a drop too); a drop is durable and audited; replay is a no-op; a
    handler error stops routing with a diagnostic; a drop a handler decided from a Work snapshot
    that changed before it applied is re-evaluated."""
    calls: dict[str, int] = {"r2": 0, "r3": 0}
    gate = trio.Event()
    busy_seen: list[int | None] = []
    """The Work revision each evaluation of an ``x.busy`` Event saw."""

    async def busy(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        busy_seen.append(work.revision if work else None)
        await gate.wait()
        if work is not None and work.state is WorkState.RUNNING:
            return Drop(reason=f"busy: work {work.id} is running")
        return correlate(event, scope, work, route)

    def counting(name: str) -> Callable[..., Any]:
        def handler(event: Event, scope: str, work: Work | None, route: Any) -> Any:
            calls[name] += 1
            return correlate(event, scope, work, route)

        return handler

    def raising(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        raise RuntimeError("handler r0 cannot handle x.err")

    driver.handlers.table.update(r2=counting("r2"), r3=counting("r3"), r0=raising, busy=busy)
    config = await driver.configure(
        _config(
            [
                {"name": "r0", "types": ["x.err"], "handler": "scenario", "config": {"fn": "r0"}},
                {"name": "r1", "types": ["x.drop"], "policy": "drop", "reason": "audit: drops are kept"},
                {"name": "rb", "types": ["x.busy"], "handler": "scenario", "config": {"fn": "busy"}},
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
    await driver.settle()
    await driver.reopen()
    replay = await driver.runtime.publish(_ev("drop-1", "x.drop", key="d1"))
    await driver.settle()
    expect(
        replay.duplicate and replay.id == dropped.id and await _checkpoint(driver, dropped) == cp,
        "replaying a drop was not a no-op: its checkpoint changed",
    )
    expect(await _work_of(driver, "d1") is None, "replaying a drop created Work")
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
    await driver.settle()
    await driver.reopen()

    # 5. rb drops x.busy while its Work runs; the attempt ends while the handler holds a running snapshot
    work = await driver.runtime.work_for_key("k1")
    lease = await driver.runtime.claim(work.id, owner="scenario")
    busy_event = await driver.runtime.publish(_ev("busy-1", "x.busy", key="k1"))

    async def busy_evaluating() -> bool:
        return bool(busy_seen)

    await driver.until(busy_evaluating, "rb's handler to read the running Work's snapshot")
    await driver.runtime.complete(lease, Failed(error="the attempt ends while rb's handler is held"))
    ready = await driver.runtime.work(work.id)
    expect(ready.state is WorkState.READY, f"the Work should be ready once its attempt failed: {ready.state}")
    gate.set()
    await wait_routed(driver, busy_event)
    cp = await _checkpoint(driver, busy_event)
    expect(
        cp.status is CheckpointStatus.ROUTED and cp.route == "rb" and cp.work_id == work.id,
        "a drop decided from a stale Work snapshot (running) was applied after the Work stopped running: "
        f"a handler's decision must be re-evaluated against the Work's new revision; checkpoint {cp}, "
        f"snapshot revisions seen {busy_seen}, current {ready.revision}",
    )


async def multi_key_attachment_conflict_and_order(driver: Driver) -> None:
    """Atomic key attachment joins earlier input in acceptance order and never resurrects an
    unmatched or dropped Event; an owned key aborts everything, even a free key named before it;
    routing effects commit in acceptance order; a decision from a stale Work snapshot is re-evaluated."""
    hold = trio.Event()
    held_keys = {"k2"}
    evaluated: list[str] = []
    seen: list[tuple[str, int | None]] = []
    """(event id, revision of the Work snapshot) for each evaluation of a ``busy`` Event."""

    async def holding(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.payload.get("busy"):
            seen.append((event.id, work.revision if work else None))
        if event.key in held_keys or event.payload.get("hold"):
            await hold.wait()
        evaluated.append(event.id)
        if event.payload.get("busy") and work is not None and work.state is WorkState.RUNNING:
            return Drop(reason=f"busy: work {work.id} is running")
        return correlate(event, scope, work, route)

    driver.handlers.table["holding"] = holding
    await driver.configure(
        _config(
            [
                {"name": "drops", "types": ["m.drop"], "policy": "drop", "reason": "m.drop is audit only"},
                {
                    "name": "keys",
                    "types": ["m.*"],
                    "handler": "scenario",
                    "create_work": True,
                    "config": {"fn": "holding", "keys_field": "keys"},
                },
            ]
        )
    )
    # 1. attaching k2 joins the earlier, still unrouted e2 before e3; unmatched and drop stay so
    e1 = await driver.runtime.publish(_ev("e1", "m.open", key="k1"))
    await wait_routed(driver, e1)
    w1 = await driver.runtime.work_for_key("k1")
    unmatched = await driver.runtime.publish(_ev("e0-unmatched", "other.type", key="k2"))
    dropped = await driver.runtime.publish(_ev("e0-drop", "m.drop", key="k2"))
    await wait_routed(driver, unmatched, dropped)
    cp_unmatched, cp_dropped = await _checkpoint(driver, unmatched), await _checkpoint(driver, dropped)
    expect(
        cp_unmatched.status is CheckpointStatus.UNMATCHED and cp_dropped.status is CheckpointStatus.DROP,
        f"the k2 events before the attachment should be unmatched and drop: {cp_unmatched}, {cp_dropped}",
    )
    e2 = await driver.runtime.publish(_ev("e2", "m.note", key="k2"))  # its handler is held
    e3 = await driver.runtime.publish(_ev("e3", "m.link", key="k1", payload={"keys": ["k2"]}))
    await wait_routed(driver, e3)
    w1 = await driver.runtime.work(w1.id)
    expect(set(w1.keys) == {"k1", "k2"}, f"W1 should own k1 and k2 after the attachment, owns {w1.keys}")
    committed = await _commit_order(driver, w1.id, e1, e2, e3)
    expect(
        committed == ["e1", "e2", "e3"],
        f"e2 did not join W1's input before e3 (acceptance order); W1's commit order is {committed}",
    )
    for stale, before, status in (
        (unmatched, cp_unmatched, "unmatched"),
        (dropped, cp_dropped, "drop"),
    ):
        expect(
            await _checkpoint(driver, stale) == before
            and stale.id not in w1.pending_inputs
            and not await _commit_order(driver, w1.id, stale),
            f"an event already checkpointed {status} for k2 was resurrected by the attachment",
        )
    hold.set()
    await driver.settle()
    cp2 = await _checkpoint(driver, e2)
    expect(
        cp2.work_id == w1.id and cp2.seq == e2.seq, "e2's checkpoint changed after its held handler returned"
    )
    await driver.reopen()

    # 2. W2 owns k3: attaching k4 (free) then k3 (owned) aborts everything, k4 included
    e4 = await driver.runtime.publish(_ev("e4", "m.open", key="k3"))
    await wait_routed(driver, e4)
    w2 = await driver.runtime.work_for_key("k3")
    e5 = await driver.runtime.publish(_ev("e5", "m.link", key="k1", payload={"keys": ["k4", "k3"]}))
    await wait_routed(driver, e5)
    cp5 = await _checkpoint(driver, e5)
    expect(
        cp5.status is CheckpointStatus.UNROUTED and "owned_by_other" in (cp5.reason or ""),
        f"attaching a key owned by W2 did not abort with owned_by_other: {cp5}",
    )
    w1 = await driver.runtime.work(w1.id)
    expect(
        await _work_of(driver, "k4") is None,
        "an aborted attachment attached the free key k4 named before the owned k3 (attachment is atomic)",
    )
    expect(set(w1.keys) == {"k1", "k2"}, f"an aborted attachment changed W1's keys: {w1.keys}")
    expect(
        e5.id not in w1.pending_inputs and not await _commit_order(driver, w1.id, e5),
        "an aborted event joined W1's input",
    )
    expect((await driver.runtime.work(w2.id)).keys == ("k3",), "W2's keys changed")
    diagnostics = await driver.runtime.diagnostics(subject=e5.id)
    expect(any(d.kind == "owned_by_other" for d in diagnostics), "no owned_by_other diagnostic for e5")
    await driver.settle()
    await driver.reopen()

    # 3. a later event's handler finishing first cannot route it ahead of an earlier one
    hold = trio.Event()
    e6 = await driver.runtime.publish(_ev("e6", "m.note", key="k1", payload={"hold": True}))
    e7 = await driver.runtime.publish(_ev("e7", "m.note", key="k2"))
    held_keys.clear()

    async def e7_evaluated() -> bool:
        return e7.id in evaluated

    await driver.until(e7_evaluated, "e7's handler to return while e6's is held")
    expect(
        await _checkpoint(driver, e7) is None,
        "e7 was routed while the earlier e6 for the same Work was not (acceptance order)",
    )
    hold.set()
    await wait_routed(driver, e6, e7)
    committed = await _commit_order(driver, w1.id, e6, e7)
    expect(committed == ["e6", "e7"], f"W1's checkpoints were committed out of acceptance order: {committed}")
    await driver.settle()
    await driver.reopen()

    # 4. a decision made from a Work snapshot that changed before it was applied is re-evaluated
    hold = trio.Event()
    e8 = await driver.runtime.publish(_ev("e8", "m.note", key="k1", payload={"hold": True, "busy": True}))

    async def e8_evaluating() -> bool:
        return any(event_id == e8.id for event_id, _ in seen)

    await driver.until(e8_evaluating, "e8's handler to read W1's snapshot")
    lease = await driver.runtime.claim(w1.id, owner="scenario")  # W1 changes: it is running now
    running = await driver.runtime.work(w1.id)
    hold.set()
    await wait_routed(driver, e8)
    cp8 = await _checkpoint(driver, e8)
    expect(
        cp8.status is CheckpointStatus.DROP and cp8.work_id == w1.id,
        "e8 was applied from a stale Work snapshot (W1 was ready, it is running): the handler's decision "
        f"must be re-evaluated against the Work's new revision, checkpoint {cp8}",
    )
    expect(
        seen[-1] == (e8.id, running.revision),
        f"e8's last evaluation did not see W1's current revision {running.revision}: {seen}",
    )
    expect(e8.id not in (await driver.runtime.work(w1.id)).pending_inputs, "a dropped event was queued")
    await driver.runtime.complete(lease, Completed())
    await driver.settle()
