"""Causal bounds: depth, per-root per-minute rate, replay and the clock."""

from __future__ import annotations

import trio

from ... import (
    CausalRefused,
    Config,
    Event,
    FiringResult,
    RejectionReason,
    TimerSpec,
    TimerState,
)
from .._driver import Driver, wait_routed
from .._scenario import ScenarioFailure, expect
from ._common import (
    MINUTE_MS,
    SCOPE,
    _event,
    _next_minute,
    _refused,
)


async def causal_depth_rate_replay_and_clock(driver: Driver) -> None:
    """Depth 32 accepted, 33 refused; 128 per root per minute; a replay returns the original and is
    never charged (before or after the budget is full); the next minute resets rate only."""
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

    # 2. S's budget: 100 siblings (and free replays), reopen, 28 more, the 129th refused; a replay is free
    root_s = await driver.publish(_event("S"))
    for i in range(100):
        await driver.derive(_event(f"S/{i}"), parent_id=root_s.id)
    for _ in range(3):
        replayed = await driver.derive(_event("S/0"), parent_id=root_s.id)
        expect(replayed.duplicate, "replaying sibling S/0 did not return the original marked duplicate")
    await driver.reopen()
    for i in range(100, 128):
        try:
            sibling = await driver.derive(_event(f"S/{i}"), parent_id=root_s.id)
        except CausalRefused as refused:
            raise ScenarioFailure(
                f"sibling {i} of root S was refused after 100 siblings and 3 replays: a replay is not "
                f"charged ({refused})"
            ) from refused
        expect(not sibling.duplicate and sibling.depth == 1, f"sibling {i} should be a new depth-1 event")
    refusal = await _refused(driver, _event("S/128"), root_s.id)
    expect(refusal is not None, "the 129th derived event of root S in one minute was accepted (limit 128)")
    rate = [r for r in await driver.causal_rejections() if r.delivery_id == "S/128"]
    expect(
        len(rate) == 1 and rate[0].reason is RejectionReason.RATE_LIMIT and rate[0].budget == 128,
        f"expected one rate_limit diagnostic with budget 128 for S/128, found {rate}",
    )
    accepted_before = len(await driver.events_of_root(root_s.id))
    refusals_before = [r for r in await driver.causal_rejections() if r.root_id == root_s.id]
    try:
        replay = await driver.derive(_event("S/7"), parent_id=root_s.id)
    except CausalRefused as refused:
        raise ScenarioFailure(
            f"a replay of an accepted sibling was refused with the budget full: a replay is not charged "
            f"({refused})"
        ) from refused
    expect(replay.duplicate, "replaying an accepted sibling did not return the original marked duplicate")
    original = await driver.event(replay.id)
    expect(
        original.seq == replay.seq and original.delivery_id == "S/7",
        "a replay returned a different event than the original",
    )
    siblings = await driver.events_of_root(root_s.id)
    refusals_after = [r for r in await driver.causal_rejections() if r.root_id == root_s.id]
    expect(
        len(siblings) == accepted_before == 129 and refusals_after == refusals_before,
        f"a replay was charged to root S: accepted {accepted_before} -> {len(siblings)} (expected 129), "
        f"refusals {len(refusals_before)} -> {len(refusals_after)}",
    )

    # 3. the next UTC minute restores rate, never depth
    driver.clock.set(_next_minute(driver.clock.now_ms()))
    fresh = await driver.derive(_event("S/next-minute"), parent_id=root_s.id)
    expect(not fresh.duplicate, "a sibling in the next minute was not accepted as new")
    refusal = await _refused(driver, _event("R/33-again"), deepest.id)
    expect(refusal is not None, "depth 33 under R was accepted in a new minute: depth must never reset")

    # 4. child Work and timer-typed derived Events share depth with their root
    await driver.configure(
        Config.from_dict(
            {"scopes": {SCOPE: {"routes": [{"name": "deep", "types": ["deep.*"], "create_work": True}]}}}
        )
    )
    deep = await driver.derive(_event("R/32-keyed", type="deep.work", key="deep/1"), parent_id=chain_31.id)
    expect(deep.depth == 32, f"the keyed depth-32 event has depth {deep.depth}")
    await wait_routed(driver, deep)
    work = await driver.runtime.work_for_key("deep/1")
    lease = await driver.runtime.claim(work.id, owner="scenario")
    expect(
        lease.request.trigger is not None and lease.request.trigger.id == deep.id,
        "the attempt is not triggered by the depth-32 event",
    )
    toolbelt = driver.runtime.toolbelt(lease)
    try:
        await toolbelt.create_child("too-deep")
        child_refused = False
    except CausalRefused:
        child_refused = True
    expect(
        child_refused, "a child Work was created from a depth-32 trigger (its core.work.created is depth 33)"
    )
    expect(len(await driver.runtime.works(limit=1000)) == 1, "a refused child left a Work behind")
    timer = await toolbelt.arm_timer(
        TimerSpec(
            id="too-deep",
            fire_at_ms=driver.clock.now_ms() + 1_000,
            source="scenario",
            type="deep.tick",
            scope=SCOPE,
        )
    )
    driver.clock.advance(1_000)

    async def fired() -> bool:
        return bool(await driver.runtime.firings(timer.id))

    await driver.until(fired, "the depth-33 timer firing to be refused")
    firings = await driver.runtime.firings(timer.id)
    expect([f.result for f in firings] == [FiringResult.REFUSED], f"the depth-33 timer firing was {firings}")
    expect(
        (await driver.runtime.timer(timer.id)).state is TimerState.DISABLED,
        "a refused timer was not disabled",
    )
    expect(
        not [e for e in await driver.events_of_root(root_r.id) if e.type == "deep.tick"],
        "a refused timer firing published an event",
    )
    expect(
        any(
            r.delivery_id == "too-deep" and r.reason is RejectionReason.DEPTH_LIMIT
            for r in await driver.causal_rejections()
        ),
        "the refused timer firing left no diagnostic",
    )
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
