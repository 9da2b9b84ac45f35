"""Work identity and scopes: uncorrelated Events, terminal Work and successors, scope inheritance,
unmatched and contradictory targets."""

from __future__ import annotations

from ... import (
    CheckpointStatus,
    Completed,
    InvalidRequest,
    NotFound,
    Work,
    WorkState,
)
from ...plugins.handlers import work_id_for_key
from .._driver import Driver, wait_routed
from .._scenario import expect
from ._common import (
    SCOPE,
    WEB,
    _checkpoint,
    _config,
    _ev,
    _work_of,
)


async def uncorrelated_and_terminal_successor(driver: Driver) -> None:
    """No key means unmatched; fresh Work has a stable id; terminal Work stays terminal unless reopened."""
    await driver.configure(
        _config(
            [
                {"name": "by-key", "types": ["u.*", "t.*"], "create_work": True},
                {"name": "fresh", "types": ["f.*"], "handler": "fresh", "create_work": True},
                {"name": "reopening", "types": ["r.*"], "create_work": True, "work_kind": "reopenable"},
            ],
            work_kinds={"reopenable": {"reopen": True}},
        )
    )
    loose = await driver.runtime.publish(_ev("u1", "u.note"))
    await wait_routed(driver, loose)
    cp = await _checkpoint(driver, loose)
    expect(
        cp.status is CheckpointStatus.UNMATCHED and cp.work_id is None,
        f"an uncorrelated event was routed somewhere: {cp}",
    )

    fresh = await driver.runtime.publish(_ev("f1", "f.start"))
    await wait_routed(driver, fresh)
    before = len(await driver.runtime.works(limit=1000))
    first = (await _checkpoint(driver, fresh)).work_id
    await driver.settle()
    await driver.reopen()
    replay = await driver.runtime.publish(_ev("f1", "f.start"))
    await driver.settle()
    expect(
        replay.duplicate and len(await driver.runtime.works(limit=1000)) == before,
        "replaying the uncorrelated event created a second Work",
    )
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
    expect(
        cp.status is CheckpointStatus.TERMINAL and cp.work_id == w.id,
        f"a late event for terminal Work was not checkpointed terminal: {cp}",
    )
    expect(await driver.runtime.work(w.id) == w, "terminal Work changed after a late event")
    expect(
        len(await driver.runtime.works(limit=1000)) == count,
        "a successor was created without a reopen policy",
    )
    await driver.settle()
    await driver.reopen()

    w2 = await finish("k2", "r1", "r.start")
    late2 = await driver.runtime.publish(_ev("r2", "r.late", key="k2"))
    await wait_routed(driver, late2)
    successor = await _work_of(driver, "k2/generation/reopen-1")
    expect(successor is not None, "the reopen policy created no successor with key k2/generation/reopen-1")
    assert successor is not None
    expect(
        successor.predecessor_id == w2.id and successor.parent_id is None,
        f"the successor should name W as predecessor and have no parent: {successor}",
    )
    expect((await driver.runtime.work_for_key("k2")).id == w2.id, "key k2 moved off the terminal Work")
    expect(late2.id in successor.pending_inputs, "the late event is not the successor's input")
    created = [e for e in await driver.runtime.events(limit=10_000) if e.type == "core.work.created"]
    expect(
        any(
            e.payload.get("predecessor") == w2.id and e.payload.get("successor") == successor.id
            for e in created
        ),
        "no core.work.created event records predecessor and successor",
    )


async def scope_route_inheritance(driver: Driver) -> None:
    """Same-name routes replace in their slot; new names append; the nearest definition of a binding
    replaces the inherited one whole (distinct config keys show any merge); child Work keeps its scope."""
    driver.fake.auto_complete = False
    config = await driver.configure(
        _config(
            [
                {"name": "a", "types": ["a.*"], "create_work": True, "binding": "fake"},
                {"name": "b", "types": ["b.*"], "create_work": True},
                {"name": "c", "types": ["cd.*"], "create_work": True},
            ],
            web_routes=[
                {"name": "b", "types": ["b.*", "bb.*"], "create_work": True},
                {"name": "d", "types": ["cd.*", "d.*"], "create_work": True},
            ],
            binding_config={"acme_setting": "a", "shared": {"from": "acme", "acme_only": True}},
            web_bindings={
                "fake": {"executor": "fake", "config": {"web_setting": "w", "shared": {"from": "web"}}}
            },
        )
    )
    routes = config.routes_for(WEB)
    expect(
        [(r.name, r.scope) for r in routes] == [("a", SCOPE), ("b", WEB), ("c", SCOPE), ("d", WEB)],
        f"effective routes of acme/web are {[(r.name, r.scope) for r in routes]}",
    )
    bb = await driver.runtime.publish(_ev("bb", "bb.x", key="w-bb", scope=WEB))
    cd = await driver.runtime.publish(_ev("cd", "cd.x", key="w-cd", scope=WEB))
    await wait_routed(driver, bb, cd)
    cp = await _checkpoint(driver, bb)
    expect(cp.route == "b" and cp.route_scope == WEB, f"bb.x did not use acme/web's route b: {cp}")
    cp = await _checkpoint(driver, cd)
    expect(cp.route == "c", f"an event matching c and d went to {cp.route}, not c (first in slot order)")
    await driver.settle()
    await driver.reopen()

    await driver.runtime.publish(_ev("a-web", "a.x", key="w-a", scope=WEB))
    await driver.runtime.publish(_ev("a-acme", "a.x", key="a-a"))
    web_work, acme_work = work_id_for_key(WEB, "w-a"), work_id_for_key(SCOPE, "a-a")

    async def both_launched() -> bool:
        return bool(driver.fake.launches_of(web_work) and driver.fake.launches_of(acme_work))

    await driver.until(both_launched, "route a's Works to launch in both scopes")
    web_launch = driver.fake.launches_of(web_work)[0]
    expect(
        web_launch.request.config == {"web_setting": "w", "shared": {"from": "web"}},
        "an inherited route in acme/web did not use acme/web's binding, which replaces the inherited one "
        f"whole (bindings are never merged): {web_launch.request.config}",
    )
    acme_config = driver.fake.launches_of(acme_work)[0].request.config
    expect(
        acme_config == {"acme_setting": "a", "shared": {"from": "acme", "acme_only": True}},
        f"route a in acme did not use acme's own binding: {acme_config}",
    )
    child = await web_launch.toolbelt.create_child("sub")
    expect(child.scope == WEB and child.parent_id == web_work, f"child Work is not in acme/web: {child}")
    driver.fake.finish(web_work, Completed())
    driver.fake.finish(acme_work, Completed())
    await driver.settle()


async def unmatched_and_contradictory_target(driver: Driver) -> None:
    """No match is unmatched and kept; a contradictory explicit target is refused, nothing routed."""
    await driver.configure(_config([{"name": "by-key", "types": ["c.*"], "create_work": True}]))
    stray = await driver.runtime.publish(_ev("s1", "nobody.cares", key="s"))
    await wait_routed(driver, stray)
    cp = await _checkpoint(driver, stray)
    expect(cp.status is CheckpointStatus.UNMATCHED, f"an unmatched event was checkpointed {cp.status}")
    await driver.settle()
    await driver.reopen()
    expect(
        (await driver.runtime.event(stray.id)).type == "nobody.cares"
        and await _checkpoint(driver, stray) == cp,
        "the unmatched event and its checkpoint were not kept",
    )
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
        expect(
            refusal is not None and word in str(refusal),
            f"a contradictory target ({word}) was not refused by name: {refusal}",
        )
        try:
            await driver.runtime.event_by_delivery(event.source, event.delivery_id)
            stored = True
        except NotFound:
            stored = False
        expect(not stored, f"the refused event {event.delivery_id} was stored")
    expect(len((await driver.runtime.history(w.id)).checkpoints) == 1, "a refused event was routed to W")
