"""The shared runtime scenarios (../shared/SCENARIOS.md), each an async function taking a driver.

Assertions read durable state back through the driver's public API. A scenario raises
`ScenarioFailure` naming the broken rule.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from .._config import Config, effective_routes
from .._errors import CausalRefused, ConfigError, Conflict, InvalidRequest, NotFound
from .._records import Event, EventIn, RejectionReason
from .._timers import FiringResult, TimerSpec, TimerState
from .._work import (
    CheckpointStatus,
    Completed,
    IntentKind,
    IntentStatus,
    Lease,
    Policy,
    Work,
    WorkState,
)
from ..kernel.routing import OutOfOrder, RouteRef, RouteRequest, route_in_tx
from ..plugins.handlers import correlate, work_id_for_key
from ._driver import Driver, wait_routed
from ._fake import InjectAnswer
from ._scenario import expect

MINUTE_MS = 60_000
SCOPE = "acme"


def _event(
    delivery_id: str,
    *,
    type: str = "test.event",
    source: str = "scenario",
    key: str | None = None,
    payload: dict[str, object] | None = None,
) -> EventIn:
    return EventIn(
        source=source, delivery_id=delivery_id, type=type, scope=SCOPE, key=key, payload=dict(payload or {})
    )


async def _refused(driver: Driver, event: EventIn, parent_id: str) -> CausalRefused | None:
    try:
        await driver.derive(event, parent_id=parent_id)
    except CausalRefused as refusal:
        return refusal
    return None


def _next_minute(now_ms: int) -> int:
    return (now_ms // MINUTE_MS + 1) * MINUTE_MS


async def causal_depth_rate_replay_and_clock(driver: Driver) -> None:
    """Depth 32 accepted, 33 refused; 128 per root per minute; replay free; next minute resets rate only."""
    secret = "s3cr3t-payload-value"
    # 1. a chain under R: depths 1..32 accepted, 33 refused with a redacted diagnostic
    root_r = await driver.publish(_event("R"))
    expect(
        root_r.depth == 0 and root_r.root_id == root_r.id,
        f"a root event has depth 0 and is its own root: {root_r}",
    )
    parent = root_r
    for depth in range(1, 33):
        child = await driver.derive(_event(f"R/{depth}"), parent_id=parent.id)
        expect(child.depth == depth, f"chain event {depth} has depth {child.depth}")
        expect(
            child.root_id == root_r.id, f"chain event {depth} has root {child.root_id}, expected {root_r.id}"
        )
        expect(child.parent_id == parent.id, f"chain event {depth} lost its parent")
        parent = child
    deepest = parent
    chain_31 = await driver.event(deepest.parent_id or "")
    refusal = await _refused(driver, _event("R/33", payload={"secret": secret}), deepest.id)
    expect(refusal is not None, "a derived event at depth 33 was accepted; the depth limit is 32")
    chain = await driver.events_of_root(root_r.id)
    expect(len(chain) == 33, f"root R should hold itself and 32 derived events, found {len(chain)}")
    expect(all(e.delivery_id != "R/33" for e in chain), "the refused depth-33 event was stored")
    rejections = [r for r in await driver.causal_rejections() if r.delivery_id == "R/33"]
    expect(len(rejections) == 1, f"expected one diagnostic for the depth-33 refusal, found {len(rejections)}")
    rej = rejections[0]
    expect(rej.reason is RejectionReason.DEPTH_LIMIT, f"depth-33 refusal reason is {rej.reason}")
    expect(
        rej.root_id == root_r.id and rej.depth == 33 and rej.limit == 32,
        f"depth-33 diagnostic names root/depth/limit wrongly: {rej}",
    )
    expect(
        rej.parent_id == deepest.id and rej.source == "scenario", f"diagnostic lacks delivery/parent: {rej}"
    )
    expect(secret not in repr(rej), "the causal diagnostic carries the payload")

    # 2. S's budget: 100 siblings, reopen, 28 more, the 129th refused; a replay is free
    root_s = await driver.publish(_event("S"))
    for i in range(100):
        await driver.derive(_event(f"S/{i}"), parent_id=root_s.id)
    await driver.reopen()
    for i in range(100, 128):
        sibling = await driver.derive(_event(f"S/{i}"), parent_id=root_s.id)
        expect(not sibling.duplicate and sibling.depth == 1, f"sibling {i} should be a new depth-1 event")
    refusal = await _refused(driver, _event("S/128"), root_s.id)
    expect(refusal is not None, "the 129th derived event of root S in one minute was accepted (limit 128)")
    rate = [r for r in await driver.causal_rejections() if r.delivery_id == "S/128"]
    expect(
        len(rate) == 1 and rate[0].reason is RejectionReason.RATE_LIMIT and rate[0].budget == 128,
        f"expected one rate_limit diagnostic with budget 128 for S/128, found {rate}",
    )
    replay = await driver.derive(_event("S/7"), parent_id=root_s.id)
    expect(replay.duplicate, "replaying an accepted sibling did not return the original marked duplicate")
    original = await driver.event(replay.id)
    expect(original.seq == replay.seq, "a replay returned a different event than the original")
    siblings = await driver.events_of_root(root_s.id)
    expect(len(siblings) == 129, f"root S should hold itself and 128 siblings, found {len(siblings)}")

    # 3. the next UTC minute restores rate, never depth
    driver.clock.set(_next_minute(driver.clock.now_ms()))
    fresh = await driver.derive(_event("S/next-minute"), parent_id=root_s.id)
    expect(not fresh.duplicate, "a sibling in the next minute was not accepted as new")
    refusal = await _refused(driver, _event("R/33-again"), deepest.id)
    expect(refusal is not None, "depth 33 under R was accepted in a new minute: depth must never reset")

    # 4. child Work and timer-typed derived Events share depth with their root
    await driver.configure(Config.from_dict(
        {"scopes": {SCOPE: {"routes": [{"name": "deep", "types": ["deep.*"], "create_work": True}]}}}
    ))  # fmt: skip
    deep = await driver.derive(_event("R/32-keyed", type="deep.work", key="deep/1"), parent_id=chain_31.id)
    expect(deep.depth == 32, f"the keyed depth-32 event has depth {deep.depth}")
    await wait_routed(driver, deep)
    work = await driver.runtime.work_for_key("deep/1")
    lease = await driver.runtime.claim(work.id, owner="scenario")
    expect(lease.request.trigger is not None and lease.request.trigger.id == deep.id,
           "the attempt is not triggered by the depth-32 event")  # fmt: skip
    toolbelt = driver.runtime.toolbelt(lease)
    try:
        await toolbelt.create_child("too-deep")
        child_refused = False
    except CausalRefused:
        child_refused = True
    expect(child_refused, "a child Work was created from a depth-32 trigger (its core.work.created is depth 33)")
    expect(len(await driver.runtime.works(limit=1000)) == 1, "a refused child left a Work behind")
    timer = await toolbelt.arm_timer(TimerSpec(id="too-deep", fire_at_ms=driver.clock.now_ms() + 1_000,
                                               source="scenario", type="deep.tick", scope=SCOPE))  # fmt: skip
    driver.clock.advance(1_000)

    async def fired() -> bool:
        return bool(await driver.runtime.firings(timer.id))

    await driver.until(fired, "the depth-33 timer firing to be refused")
    firings = await driver.runtime.firings(timer.id)
    expect([f.result for f in firings] == [FiringResult.REFUSED], f"the depth-33 timer firing was {firings}")
    expect((await driver.runtime.timer(timer.id)).state is TimerState.DISABLED, "a refused timer was not disabled")
    expect(not [e for e in await driver.events_of_root(root_r.id) if e.type == "deep.tick"],
           "a refused timer firing published an event")  # fmt: skip
    expect(any(r.delivery_id == "too-deep" and r.reason is RejectionReason.DEPTH_LIMIT
               for r in await driver.causal_rejections()), "the refused timer firing left no diagnostic")  # fmt: skip
    driver.clock.advance(60 * MINUTE_MS)
    await driver.settle()
    expect(len(await driver.runtime.firings(timer.id)) == 1, "a refused timer firing is retried (a loop)")


async def concurrent_chain_budget(driver: Driver) -> None:
    """Eight barrier-started tasks race 256 siblings: exactly 128 accepted; the fixed window holds."""
    # 1. 8 x 32 concurrent attempts in one minute
    driver.clock.set(_next_minute(driver.clock.now_ms()))
    root = await driver.publish(_event("C"))
    accepted: list[Event] = []
    refused: list[CausalRefused] = []
    ready = 0
    go = trio.Event()
    all_ready = trio.Event()

    async def worker(w: int) -> None:
        nonlocal ready
        ready += 1
        if ready == 8:
            all_ready.set()
        await go.wait()
        for i in range(32):
            try:
                accepted.append(await driver.derive(_event(f"C/{w}/{i}"), parent_id=root.id))
            except CausalRefused as refusal:
                refused.append(refusal)

    async with trio.open_nursery() as nursery:
        for w in range(8):
            nursery.start_soon(worker, w)
        await all_ready.wait()
        go.set()
    expect(
        len(accepted) == 128, f"{len(accepted)} of 256 concurrent siblings were accepted; exactly 128 must be"
    )
    expect(
        len(refused) == 128, f"{len(refused)} of 256 concurrent siblings were refused; exactly 128 must be"
    )
    expect(
        len({e.id for e in accepted}) == 128 and not any(e.duplicate for e in accepted),
        "a concurrent sibling was accepted twice",
    )
    diagnostics = {r.delivery_id for r in await driver.causal_rejections() if r.root_id == root.id}
    refused_ids = {f"C/{w}/{i}" for w in range(8) for i in range(32)} - {e.delivery_id for e in accepted}
    expect(
        refused_ids <= diagnostics, f"{len(refused_ids - diagnostics)} refusals have no durable diagnostic"
    )

    # 2. counts survive a reopen; one more in the minute is refused
    await driver.reopen()
    stored = await driver.events_of_root(root.id)
    expect(len(stored) == 129, f"after reopening root C holds {len(stored)} events, expected 129")
    refusal = await _refused(driver, _event("C/after-reopen"), root.id)
    expect(refusal is not None, "after reopening, a 129th sibling in the same minute was accepted")

    # 3. the fixed window admits up to twice the allowance across a boundary, no more
    boundary = _next_minute(driver.clock.now_ms())
    driver.clock.set(boundary - 1)
    edge = await driver.publish(_event("E"))
    for i in range(128):
        await driver.derive(_event(f"E/a/{i}"), parent_id=edge.id)
    expect(
        await _refused(driver, _event("E/a/extra"), edge.id) is not None,
        "a 129th sibling at 59.999 s was accepted",
    )
    driver.clock.set(boundary)
    for i in range(128):
        await driver.derive(_event(f"E/b/{i}"), parent_id=edge.id)
    expect(
        await _refused(driver, _event("E/b/extra"), edge.id) is not None,
        "a 129th sibling in the next minute was accepted: the window admits at most twice 128",
    )
    stored = await driver.events_of_root(edge.id)
    expect(len(stored) == 257, f"root E should hold itself and 256 siblings, found {len(stored)}")


CAUSAL_SCENARIOS = (causal_depth_rate_replay_and_clock, concurrent_chain_budget)


# -- routing and ownership ---------------------------------------------------------------

WEB = "acme/web"


def _config(
    routes: Sequence[dict[str, Any]],
    *,
    web_routes: Sequence[dict[str, Any]] = (),
    capabilities: Sequence[str] = (),
    work_kinds: dict[str, Any] | None = None,
    web_bindings: dict[str, Any] | None = None,
    binding_config: dict[str, Any] | None = None,
) -> Config:
    """The common configuration: scope ``acme`` with child ``acme/web`` and binding ``fake``."""
    acme: dict[str, Any] = {
        "bindings": {"fake": {"executor": "fake", "capabilities": list(capabilities),
                              "config": dict(binding_config or {})}},
        "routes": list(routes),
    }  # fmt: skip
    web: dict[str, Any] = {"routes": list(web_routes)}
    if web_bindings:
        web["bindings"] = web_bindings
    return Config.from_dict({"scopes": {"acme": acme, WEB: web}, "work_kinds": work_kinds or {}})


def _ev(delivery_id: str, type: str, *, key: str | None = None, scope: str = SCOPE, work_id: str | None = None,
        payload: dict[str, Any] | None = None) -> EventIn:  # fmt: skip
    return EventIn(source="scenario", delivery_id=delivery_id, type=type, scope=scope, key=key, work_id=work_id,
                   payload=dict(payload or {}))  # fmt: skip


async def _barrier(n: int, task: Callable[[int], Awaitable[None]]) -> None:
    """Run ``n`` tasks that all start their work at the same moment."""
    ready = 0
    go = trio.Event()
    all_ready = trio.Event()

    async def run(i: int) -> None:
        nonlocal ready
        ready += 1
        if ready == n:
            all_ready.set()
        await go.wait()
        await task(i)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(run, i)
        await all_ready.wait()
        go.set()


async def _checkpoint(driver: Driver, event: Event) -> Any:
    return await driver.runtime.checkpoint(event.id)


async def _work_of(driver: Driver, key: str) -> Work | None:
    try:
        return await driver.runtime.work_for_key(key)
    except NotFound:
        return None


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
    expect([c.event_id for c in history.checkpoints] == order,
           "the twenty events are not all associated with the Work in acceptance order")  # fmt: skip
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
    await driver.configure(_config([{"name": "by-key", "types": ["job.*"], "handler": "scenario",
                                     "config": {"fn": "gated"}, "create_work": True, "binding": "fake"}]))  # fmt: skip
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
    config = await driver.configure(_config([
        {"name": "r0", "types": ["x.err"], "handler": "scenario", "config": {"fn": "r0"}},
        {"name": "r1", "types": ["x.drop"], "policy": "drop", "reason": "audit: drops are kept"},
        {"name": "r2", "types": ["x.*"], "handler": "scenario", "config": {"fn": "r2"}, "create_work": True},
        {"name": "r3", "types": ["x.*"], "handler": "scenario", "config": {"fn": "r3"}, "create_work": True},
    ]))  # fmt: skip
    dropped = await driver.runtime.publish(_ev("drop-1", "x.drop", key="d1"))
    await wait_routed(driver, dropped)
    cp = await _checkpoint(driver, dropped)
    expect(cp.status is CheckpointStatus.DROP, f"x.drop was checkpointed {cp.status}, not drop")
    expect(cp.route == "r1" and cp.generation == config.generation and cp.reason == "audit: drops are kept",
           f"the drop checkpoint lacks its route, generation or reason: {cp}")  # fmt: skip
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
    expect(cp.status is CheckpointStatus.ROUTED and cp.route == "r2" and cp.effective_policy is Policy.QUEUE,
           f"x.one was not routed by r2 and queued: {cp}")  # fmt: skip
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

    async def holding(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.key in held_keys or event.payload.get("hold"):
            await hold.wait()
        return correlate(event, scope, work, route)

    driver.handlers.table["holding"] = holding
    await driver.configure(_config([{"name": "keys", "types": ["m.*"], "handler": "scenario", "create_work": True,
                                     "config": {"fn": "holding", "keys_field": "keys"}}]))  # fmt: skip
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
    expect(cp0.status is CheckpointStatus.UNMATCHED and stale.id not in w1.pending_inputs,
           "an event already checkpointed unmatched was resurrected by the attachment")  # fmt: skip
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
    expect(cp5.status is CheckpointStatus.UNROUTED and "owned_by_other" in (cp5.reason or ""),
           f"attaching a key owned by W2 did not abort with owned_by_other: {cp5}")  # fmt: skip
    w1 = await driver.runtime.work(w1.id)
    expect(set(w1.keys) == {"k1", "k2"} and await _work_of(driver, "k4") is None,
           "an aborted attachment attached a key")  # fmt: skip
    expect(e5.id not in w1.pending_inputs, "an aborted event joined W1's input")
    expect((await driver.runtime.work(w2.id)).keys == ("k3",), "W2's keys changed")
    diagnostics = await driver.runtime.diagnostics(subject=e5.id)
    expect(any(d.kind == "owned_by_other" for d in diagnostics), "no owned_by_other diagnostic for e5")

    # a later event's handler finishing first cannot route it ahead of an earlier one
    hold = trio.Event()
    e6 = await driver.runtime.publish(_ev("e6", "m.note", key="k1", payload={"hold": True}))
    e7 = await driver.runtime.publish(_ev("e7", "m.note", key="k2"))
    held_keys.clear()
    request = RouteRequest(event_id=e7.id, decision=correlate(e7, SCOPE, w1, _route(driver, "keys")),
                           route=RouteRef(name="keys", scope=SCOPE, declared=Policy.QUEUE, policy=Policy.QUEUE),
                           expected_revision=(await driver.runtime.work(w1.id)).revision,
                           generation=driver.runtime.config.generation)  # fmt: skip
    try:
        await driver.runtime.storage.submit(route_in_tx, request, driver.runtime.config.causal)
        refused = False
    except OutOfOrder:
        refused = True
    expect(refused, "the store accepted e7's checkpoint while the earlier e6 for the same Work was unrouted")
    hold.set()
    await wait_routed(driver, e6, e7)
    w1 = await driver.runtime.work(w1.id)
    order = [i for i in w1.pending_inputs if i in (e6.id, e7.id)]
    expect(order == [e6.id, e7.id], "W1's routing effects did not follow acceptance order")


def _route(driver: Driver, name: str) -> Any:
    return next(r for r in effective_routes(driver.runtime.config, SCOPE) if r.name == name)


async def uncorrelated_and_terminal_successor(driver: Driver) -> None:
    """No key means unmatched; fresh Work has a stable id; terminal Work stays terminal unless reopened."""
    await driver.configure(_config(
        [
            {"name": "by-key", "types": ["u.*", "t.*"], "create_work": True},
            {"name": "fresh", "types": ["f.*"], "handler": "fresh", "create_work": True},
            {"name": "reopening", "types": ["r.*"], "create_work": True, "work_kind": "reopenable"},
        ],
        work_kinds={"reopenable": {"reopen": True}},
    ))  # fmt: skip
    loose = await driver.runtime.publish(_ev("u1", "u.note"))
    await wait_routed(driver, loose)
    cp = await _checkpoint(driver, loose)
    expect(cp.status is CheckpointStatus.UNMATCHED and cp.work_id is None,
           f"an uncorrelated event was routed somewhere: {cp}")  # fmt: skip

    fresh = await driver.runtime.publish(_ev("f1", "f.start"))
    await wait_routed(driver, fresh)
    before = len(await driver.runtime.works(limit=1000))
    first = (await _checkpoint(driver, fresh)).work_id
    replay = await driver.runtime.publish(_ev("f1", "f.start"))
    await driver.settle()
    expect(replay.duplicate and len(await driver.runtime.works(limit=1000)) == before,
           "replaying the uncorrelated event created a second Work")  # fmt: skip
    expect(first is not None and (await _checkpoint(driver, fresh)).work_id == first, "fresh Work id changed")

    async def finish(key: str, delivery: str, type: str) -> Work:
        event = await driver.runtime.publish(_ev(delivery, type, key=key))
        await wait_routed(driver, event)
        work = await driver.runtime.work_for_key(key)
        lease = await driver.runtime.claim(work.id, owner="scenario")
        await driver.runtime.complete(lease, Completed())
        done = await driver.runtime.work(work.id)
        expect(done.state is WorkState.COMPLETED, f"Work for {key} did not complete: {done.state}")
        return done

    w = await finish("k", "t1", "t.start")
    count = len(await driver.runtime.works(limit=1000))
    late = await driver.runtime.publish(_ev("t2", "t.late", key="k"))
    await wait_routed(driver, late)
    cp = await _checkpoint(driver, late)
    expect(cp.status is CheckpointStatus.TERMINAL and cp.work_id == w.id,
           f"a late event for terminal Work was not checkpointed terminal: {cp}")  # fmt: skip
    expect(await driver.runtime.work(w.id) == w, "terminal Work changed after a late event")
    expect(
        len(await driver.runtime.works(limit=1000)) == count,
        "a successor was created without a reopen policy",
    )

    w2 = await finish("k2", "r1", "r.start")
    late2 = await driver.runtime.publish(_ev("r2", "r.late", key="k2"))
    await wait_routed(driver, late2)
    successor = await _work_of(driver, "k2/generation/reopen-1")
    expect(successor is not None, "the reopen policy created no successor with key k2/generation/reopen-1")
    assert successor is not None
    expect(successor.predecessor_id == w2.id and successor.parent_id is None,
           f"the successor should name W as predecessor and have no parent: {successor}")  # fmt: skip
    expect((await driver.runtime.work_for_key("k2")).id == w2.id, "key k2 moved off the terminal Work")
    expect(late2.id in successor.pending_inputs, "the late event is not the successor's input")
    created = [e for e in await driver.runtime.events(limit=10_000) if e.type == "core.work.created"]
    expect(any(e.payload.get("predecessor") == w2.id and e.payload.get("successor") == successor.id
               for e in created), "no core.work.created event records predecessor and successor")  # fmt: skip


async def scope_route_inheritance(driver: Driver) -> None:
    """Same-name routes replace in their slot; new names append; bindings by nearest definition."""
    driver.fake.auto_complete = False
    config = await driver.configure(_config(
        [
            {"name": "a", "types": ["a.*"], "create_work": True, "binding": "fake"},
            {"name": "b", "types": ["b.*"], "create_work": True},
            {"name": "c", "types": ["cd.*"], "create_work": True},
        ],
        web_routes=[
            {"name": "b", "types": ["b.*", "bb.*"], "create_work": True},
            {"name": "d", "types": ["cd.*", "d.*"], "create_work": True},
        ],
        binding_config={"who": "acme"},
        web_bindings={"fake": {"executor": "fake", "config": {"who": "web"}}},
    ))  # fmt: skip
    routes = effective_routes(config, WEB)
    expect([(r.name, r.scope) for r in routes] == [("a", SCOPE), ("b", WEB), ("c", SCOPE), ("d", WEB)],
           f"effective routes of acme/web are {[(r.name, r.scope) for r in routes]}")  # fmt: skip
    bb = await driver.runtime.publish(_ev("bb", "bb.x", key="w-bb", scope=WEB))
    cd = await driver.runtime.publish(_ev("cd", "cd.x", key="w-cd", scope=WEB))
    await wait_routed(driver, bb, cd)
    cp = await _checkpoint(driver, bb)
    expect(cp.route == "b" and cp.route_scope == WEB, f"bb.x did not use acme/web's route b: {cp}")
    cp = await _checkpoint(driver, cd)
    expect(cp.route == "c", f"an event matching c and d went to {cp.route}, not c (first in slot order)")

    in_web = await driver.runtime.publish(_ev("a-web", "a.x", key="w-a", scope=WEB))
    in_acme = await driver.runtime.publish(_ev("a-acme", "a.x", key="a-a"))
    web_work, acme_work = work_id_for_key(WEB, "w-a"), work_id_for_key(SCOPE, "a-a")

    async def both_launched() -> bool:
        return bool(driver.fake.launches_of(web_work) and driver.fake.launches_of(acme_work))

    await driver.until(both_launched, "route a's Works to launch in both scopes")
    web_launch = driver.fake.launches_of(web_work)[0]
    expect(web_launch.request.config == {"who": "web"},
           f"an inherited route in acme/web did not use acme/web's binding: {web_launch.request.config}")  # fmt: skip
    acme_config = driver.fake.launches_of(acme_work)[0].request.config
    expect(acme_config == {"who": "acme"}, f"route a in acme used {acme_config}")
    child = await web_launch.toolbelt.create_child("sub")
    expect(child.scope == WEB and child.parent_id == web_work, f"child Work is not in acme/web: {child}")
    driver.fake.finish(web_work, Completed())
    driver.fake.finish(acme_work, Completed())
    await driver.settle()
    del in_web, in_acme


async def unsupported_policy_explicit_fallback(driver: Driver) -> None:
    """Unsupported controls are refused at validation or take an explicit, recorded fallback;
    an ambiguous supported inject is retried with the same intent."""
    base = driver.runtime.config.generation
    inject_route = {
        "name": "inj",
        "types": ["p.*"],
        "create_work": True,
        "binding": "fake",
        "policy": "inject",
    }
    try:
        await driver.configure(_config([inject_route]))
        refused = None
    except ConfigError as exc:
        refused = exc
    expect(refused is not None and "inj" in str(refused) and "inject" in str(refused),
           f"an inject route on an executor without inject was not refused by name: {refused}")  # fmt: skip
    expect(driver.runtime.config.generation == base, "a refused config changed the generation in force")
    for bad, word in (({"policy": "teleport"}, "teleport"), ({"policy": "coalesce"}, "coalesce"),
                      ({"policy": "inject", "fallback": ["interrupt", "inject"]}, "cycle")):  # fmt: skip
        try:
            _config([{**inject_route, **bad}])
            problem = None
        except ConfigError as exc:
            problem = exc
        expect(
            problem is not None and word in str(problem), f"config {bad} was not refused ({word}): {problem}"
        )

    await driver.configure(_config([{**inject_route, "fallback": ["queue"]}]))
    await driver.runtime.publish(_ev("p1", "p.start", key="pk"))
    work_id = work_id_for_key(SCOPE, "pk")

    async def launched() -> bool:
        return bool(driver.fake.launches_of(work_id))

    await driver.until(launched, "the fallback route's Work to launch")
    second = await driver.runtime.publish(_ev("p2", "p.more", key="pk"))
    await wait_routed(driver, second)
    cp = await _checkpoint(driver, second)
    expect(cp.policy is Policy.INJECT and cp.effective_policy is Policy.QUEUE and cp.fallback_reason,
           f"the queue fallback and its reason were not recorded: {cp}")  # fmt: skip
    expect(
        second.id in (await driver.runtime.work(work_id)).pending_inputs, "the fallback did not queue input"
    )
    driver.fake.finish(work_id, Completed())
    await driver.settle()

    driver.fake.capabilities.add("inject")
    await driver.configure(_config([inject_route], capabilities=["inject"]))
    await driver.runtime.publish(_ev("q1", "p.start", key="qk"))
    work_id = work_id_for_key(SCOPE, "qk")

    async def q_launched() -> bool:
        return bool(driver.fake.launches_of(work_id))

    await driver.until(q_launched, "the inject route's Work to launch")
    driver.fake.inject_answers = [InjectAnswer.AMBIGUOUS, InjectAnswer.ACCEPT]
    injected = await driver.runtime.publish(_ev("q2", "p.more", key="qk"))
    execution_id = driver.fake.running(work_id).request.execution_id

    async def retry_scheduled() -> int | None:
        intents = await driver.runtime.intents(execution_id)
        return next((i.next_attempt_ms for i in intents if i.next_attempt_ms is not None), None)

    async def first_try() -> bool:
        return await retry_scheduled() is not None

    await driver.until(first_try, "the first, ambiguous inject to schedule its retry")
    retry_at = await retry_scheduled()
    assert retry_at is not None
    driver.clock.set(max(retry_at, driver.clock.now_ms()))

    async def accepted() -> bool:
        return any(i.status is IntentStatus.ACCEPTED for i in await driver.runtime.intents(execution_id))

    await driver.until(accepted, "the retried inject to be accepted")
    intents = [i for i in await driver.runtime.intents(execution_id) if i.event_id == injected.id]
    expect(len(intents) == 1 and intents[0].attempts == 2,
           f"an ambiguous inject was not retried once with the same intent identity: {intents}")  # fmt: skip
    cp = await _checkpoint(driver, injected)
    expect(cp.effective_policy is Policy.INJECT and not cp.fallback_reason,
           f"an ambiguous supported inject took the unsupported path: {cp}")  # fmt: skip
    driver.fake.finish(work_id, Completed())
    await driver.settle()


async def unmatched_and_contradictory_target(driver: Driver) -> None:
    """No match is unmatched and kept; a contradictory explicit target is refused, nothing routed."""
    await driver.configure(_config([{"name": "by-key", "types": ["c.*"], "create_work": True}]))
    stray = await driver.runtime.publish(_ev("s1", "nobody.cares", key="s"))
    await wait_routed(driver, stray)
    cp = await _checkpoint(driver, stray)
    expect(cp.status is CheckpointStatus.UNMATCHED, f"an unmatched event was checkpointed {cp.status}")
    expect((await driver.runtime.event(stray.id)).id == stray.id, "the unmatched event was not kept")
    owner = await driver.runtime.publish(_ev("c1", "c.open", key="ck"))
    other = await driver.runtime.publish(_ev("c2", "c.open", key="ok"))
    await wait_routed(driver, owner, other)
    w = await driver.runtime.work_for_key("ck")
    cases = (
        (_ev("x1", "c.more", work_id=w.id, scope=WEB), "scope"),
        (_ev("x2", "c.more", work_id=w.id, key="ok"), "owned"),
        (_ev("x3", "c.more", work_id="wk_missing"), "no existing work"),
    )
    for event, word in cases:
        try:
            await driver.runtime.publish(event)
            refusal = None
        except InvalidRequest as exc:
            refusal = exc
        expect(refusal is not None and word in str(refusal),
               f"a contradictory target ({word}) was not refused by name: {refusal}")  # fmt: skip
        try:
            await driver.runtime.event_by_delivery(event.source, event.delivery_id)
            stored = True
        except NotFound:
            stored = False
        expect(not stored, f"the refused event {event.delivery_id} was stored")
    expect(len((await driver.runtime.history(w.id)).checkpoints) == 1, "a refused event was routed to W")


async def completion_inject_orders(driver: Driver) -> None:
    """Committed inject intents retain unconfirmed input; unrouted input blocks terminal
    completion; consumed_inputs is the only consumption proof, whatever the order."""
    driver.fake.capabilities.add("inject")
    hold = trio.Event()

    async def holding(event: Event, scope: str, work: Work | None, route: Any) -> Any:
        if event.payload.get("hold"):
            await hold.wait()
        return correlate(event, scope, work, route)

    driver.handlers.table["inj"] = holding
    await driver.configure(_config([{"name": "inj", "types": ["i.*"], "handler": "scenario", "create_work": True,
                                     "binding": "fake", "policy": "inject", "config": {"fn": "inj"}}],
                                   capabilities=["inject"]))  # fmt: skip

    async def launch_count(work_id: str, n: int) -> None:
        async def check() -> bool:
            return len(driver.fake.launches_of(work_id)) >= n

        await driver.until(check, f"attempt {n} of {work_id} to launch")

    # 1. intent before inject; no proof keeps input pending; attempt N+1 gets it
    await driver.runtime.publish(_ev("i0", "i.start", key="ik"))
    w = work_id_for_key(SCOPE, "ik")
    await launch_count(w, 1)
    seen: list[IntentStatus] = []

    async def on_inject(execution_id: str, event: Event) -> None:
        seen.extend(i.status for i in await driver.runtime.intents(execution_id) if i.event_id == event.id)

    driver.fake.on_inject = on_inject
    e = await driver.runtime.publish(_ev("i1", "i.more", key="ik"))

    async def injected() -> bool:
        return any(ev == e.id for _, ev in driver.fake.injected)

    await driver.until(injected, "e to be injected")
    expect(seen == [IntentStatus.DISPATCHING], f"the inject intent was not committed before inject: {seen}")
    driver.fake.on_inject = None
    driver.fake.finish(w, Completed())
    await launch_count(w, 2)
    second = driver.fake.launches_of(w)[1]
    expect(
        e.id in [x.id for x in second.request.inputs], "attempt 2 did not get the unconsumed injected input"
    )
    expect((await driver.runtime.work(w)).state is WorkState.RUNNING, "W did not stay live for attempt 2")

    # 2. an accepted but unrouted event blocks terminal completion
    held = await driver.runtime.publish(_ev("i2", "i.more", key="ik", payload={"hold": True}))
    try:
        await driver.runtime.complete(second.toolbelt.lease, Completed())
        blocked = False
    except Conflict:
        blocked = True
    expect(blocked, "terminal completion succeeded while an accepted event for W was unrouted")
    hold.set()
    await wait_routed(driver, held)
    await driver.runtime.complete(second.toolbelt.lease, Completed())
    expect((await driver.runtime.work(w)).state is not WorkState.COMPLETED, "W completed with pending input")
    driver.fake.finish(w, Completed())
    await launch_count(w, 3)

    # 3. completion first, then a new event: terminal
    third = driver.fake.launches_of(w)[2]
    driver.fake.finish(w, Completed())

    async def done() -> bool:
        return (await driver.runtime.work(w)).state is WorkState.COMPLETED

    await driver.until(done, "W to complete")
    late = await driver.runtime.publish(_ev("i3", "i.more", key="ik"))
    await wait_routed(driver, late)
    expect(
        (await _checkpoint(driver, late)).status is CheckpointStatus.TERMINAL,
        "a post-terminal event was not terminal",
    )
    del third

    # 4. a proof while the acknowledgement is in flight consumes; the late ack keeps it consumed
    await driver.runtime.publish(_ev("j0", "i.start", key="jk"))
    w2 = work_id_for_key(SCOPE, "jk")
    await launch_count(w2, 1)
    launch = driver.fake.running(w2)
    driver.fake.inject_gate = trio.Event()
    e5 = await driver.runtime.publish(_ev("j1", "i.more", key="jk"))

    async def in_flight() -> bool:
        return any(
            i.status is IntentStatus.DISPATCHING
            for i in await driver.runtime.intents(launch.request.execution_id)
        )

    await driver.until(in_flight, "the inject of e5 to be in flight")
    await driver.runtime.complete(launch.toolbelt.lease, Completed(consumed_inputs=(e5.id,)))
    driver.fake.inject_gate.set()
    driver.fake.inject_gate = None
    driver.fake.finish(w2, Completed())
    await driver.settle()
    intents = [i for i in await driver.runtime.intents(launch.request.execution_id) if i.event_id == e5.id]
    expect([i.status for i in intents] == [IntentStatus.CONSUMED],
           f"a proof with the acknowledgement in flight did not stay consumed: {intents}")  # fmt: skip
    expect(e5.id not in (await driver.runtime.work(w2)).pending_inputs, "the proved input is still pending")

    # ... and an inject answered "not accepting" settles its intent and retains the input
    await driver.runtime.publish(_ev("k0", "i.start", key="kk"))
    w3 = work_id_for_key(SCOPE, "kk")
    await launch_count(w3, 1)
    execution_id = driver.fake.running(w3).request.execution_id
    driver.fake.inject_answers = [InjectAnswer.NOT_ACCEPTING]
    e6 = await driver.runtime.publish(_ev("k1", "i.more", key="kk"))

    async def settled() -> bool:
        return any(i.status is IntentStatus.NOT_ACCEPTING for i in await driver.runtime.intents(execution_id))

    await driver.until(settled, "the not-accepting answer to settle the intent")
    expect(e6.id in (await driver.runtime.work(w3)).pending_inputs, "a not-accepted input was not retained")
    kinds = {i.kind for i in await driver.runtime.intents(execution_id)}
    expect(kinds == {IntentKind.INJECT}, f"unexpected intents {kinds}")
    driver.fake.finish(w3, Completed())
    await driver.settle()


ROUTING_SCENARIOS = (
    concurrent_correlations_and_attempts,
    independent_work_progress,
    first_match_replay_and_drop_audit,
    multi_key_attachment_conflict_and_order,
    uncorrelated_and_terminal_successor,
    scope_route_inheritance,
    unsupported_policy_explicit_fallback,
    unmatched_and_contradictory_target,
    completion_inject_orders,
)
ALL_SCENARIOS = CAUSAL_SCENARIOS + ROUTING_SCENARIOS
