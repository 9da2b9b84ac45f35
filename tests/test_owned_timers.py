"""The runtime's own timers and the edge of time (docs/concepts.md "Timer", docs/http-api.md "Timers").

A failed attempt's retry backoff (``retry:``), a wait's timeout (``wait-timeout:``) and an attempt's
execution deadline (``deadline:``) are the runtime's control timers: nobody arms, replaces or cancels
one through the API (the embedded `Runtime`, an attempt's toolbelt, HTTP or the console), nor takes an
id under their prefixes, and a refusal changes nothing. A fixed-interval timer whose next tick would
come after the latest instant loom stores (year 9999) retires after its last firing instead, and
every instant is written exactly, or as its milliseconds when no date can show it.

The runtime is host-driven (no actors): each step is one call, and business time is a `ManualClock`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest
from service_kit import api, order, refusal

from loom import (
    Config,
    Conflict,
    EventIn,
    Failed,
    FiringResult,
    InvalidRequest,
    Lease,
    NotFound,
    Runtime,
    Timer,
    TimerSpec,
    TimerState,
    Waiting,
    WaitSpec,
    WorkState,
    open_runtime,
)
from loom.kernel.retry import retry_timer_id
from loom.kernel.segments import deadline_timer_id
from loom.kernel.timers import CONTROL_TIMER_PREFIXES, control_timer
from loom.kernel.waits import timeout_timer_id
from loom.plugins.handlers import work_id_for_key
from loom.records.clock import iso_ms
from loom.records.reprs import instant, iso_utc
from loom.records.validation import MAX_TIME_MS
from loom.service import _render, _wire
from loom.store import Tx
from loom.testing import T0_MS, ManualClock
from loom.testing.internals import storage_of

SCOPE = "acme"
MINUTE = 60_000
HOUR = 60 * MINUTE
EPOCH = datetime.fromisoformat("1970-01-01T00:00:00+00:00")


def config() -> Config:
    return Config.from_dict(
        {
            "scopes": {
                SCOPE: {"routes": [{"name": "r", "types": ["r.*"], "create_work": True, "work_kind": "job"}]}
            },
            "work_kinds": {"job": {"timeout_ms": HOUR}},
        }
    )


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    async with open_runtime(
        loom_store, clock=clock, config=config(), actors=(), load_entry_points=False
    ) as rt:
        yield rt


async def started(rt: Runtime, key: str) -> Lease:
    await rt.publish(EventIn(source="t", delivery_id=f"{key}-0", type="r.start", scope=SCOPE, key=key))
    await rt.poll()
    return await rt.claim(work_id_for_key(SCOPE, key), owner="host")


@attrs.frozen
class Controls:
    retry: Timer
    wait_timeout: Timer
    deadline: Timer
    ended_deadline: Timer
    """The deadline of an attempt that failed: cancelled by the runtime when its segment ended."""
    live: Lease
    waiting: Lease


async def controls(rt: Runtime) -> Controls:
    """One control timer of each kind, armed by the runtime itself."""
    failing = await started(rt, "a")
    await rt.complete(failing, Failed(error="boom"))
    waiting = await started(rt, "b")
    await rt.complete(waiting, Waiting(wait=WaitSpec(types=("r.go",), timeout_ms=2 * HOUR)))
    live = await started(rt, "c")
    wait = (await rt.work(waiting.work_id)).wait_id
    assert wait is not None
    found = Controls(
        retry=await rt.timer(retry_timer_id(failing.work_id, failing.attempt)),
        wait_timeout=await rt.timer(timeout_timer_id(wait)),
        deadline=await rt.timer(deadline_timer_id(live.execution_id, 1)),
        ended_deadline=await rt.timer(deadline_timer_id(failing.execution_id, 1)),
        live=live,
        waiting=waiting,
    )
    assert {t.state for t in (found.retry, found.wait_timeout, found.deadline)} == {TimerState.ARMED}
    assert found.ended_deadline.state is TimerState.CANCELLED
    return found


KINDS = ("retry", "wait_timeout", "deadline", "ended_deadline")


def evil(timer_id: str, **changes: Any) -> TimerSpec:
    spec = TimerSpec(id=timer_id, fire_at_ms=MAX_TIME_MS, source="evil", type="x.y", scope=SCOPE)
    return attrs.evolve(spec, **changes)


# -- A: the runtime's own timers are its own ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_the_runtimes_own_timer_cannot_be_armed_over_or_cancelled(rt: Runtime, kind: str) -> None:
    """Catches: `Runtime.arm` replacing a control timer (a new revision firing in year 9999, so no
    retry ever runs), `Runtime.cancel_timer` cancelling one (a Work in backoff for ever), and a check
    that only looks at armed timers (an ended deadline's id taken over)."""
    timer: Timer = getattr(await controls(rt), kind)
    for spec in (evil(timer.id), evil(timer.id, interval_ms=1000), timer_spec(timer)):
        with pytest.raises(Conflict, match=rf"timer '{timer.id}' is the runtime's own timer for"):
            await rt.arm(spec)
    with pytest.raises(
        Conflict, match=rf"timer '{timer.id}' is the runtime's own timer for .*cannot be cancelled"
    ):
        await rt.cancel_timer(timer.id, revision=timer.revision)
    assert await rt.timer(timer.id) == timer, "a refusal changed the timer"
    assert await rt.firings(timer.id) == []


def timer_spec(timer: Timer) -> TimerSpec:
    """The timer's own definition, as a root timer (what an identical re-arm would send)."""
    return TimerSpec(
        id=timer.id,
        fire_at_ms=timer.fire_at_ms,
        source=timer.source,
        type=timer.type,
        scope=timer.scope,
        work_id=timer.work_id,
        payload=dict(timer.payload),
        delivery_id=timer.delivery_id,
    )


async def test_refused_tampering_leaves_the_retry_and_the_wait_timeout_to_fire_as_armed(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: a refusal that still changed something, and a check that also refuses the runtime's own
    arming (the next failure's retry, or the claim's deadline, would fail)."""
    found = await controls(rt)
    for timer in (found.retry, found.wait_timeout):
        with pytest.raises(Conflict):
            await rt.arm(evil(timer.id))
        with pytest.raises(Conflict):
            await rt.cancel_timer(timer.id, revision=timer.revision)
    clock.set(found.retry.fire_at_ms)
    (firing,) = (await rt.poll()).firings
    assert (firing.timer_id, firing.result) == (found.retry.id, FiringResult.ACCEPTED)
    assert (await rt.event(firing.event_id or "")).type == "core.retry.due"
    again = await rt.claim(found.retry.work_id or "", owner="host")
    assert again.attempt == 2
    await rt.complete(again, Failed(error="boom again"))  # the runtime arms its next retry itself
    assert (await rt.timer(retry_timer_id(again.work_id, 2))).state is TimerState.ARMED
    clock.set(found.wait_timeout.fire_at_ms)
    fired = {f.timer_id: f for f in (await rt.poll()).firings}
    assert fired[found.wait_timeout.id].result is FiringResult.ACCEPTED
    assert (await rt.work(found.waiting.work_id)).state is WorkState.READY, "the timeout woke the wait"


@pytest.mark.parametrize("prefix", sorted(CONTROL_TIMER_PREFIXES))
async def test_a_new_timer_may_not_take_an_id_reserved_for_the_runtimes_own(rt: Runtime, prefix: str) -> None:
    """Catches: a root or an attempt's timer pre-empting the id the runtime will give its next control
    timer (only replacing an existing one refused)."""
    found = await controls(rt)
    timer_id = f"{prefix}wk_next:1"
    with pytest.raises(
        InvalidRequest, match=rf"timer.id '{timer_id}': ids beginning '{prefix}' are reserved"
    ) as refused:
        await rt.arm(evil(timer_id, fire_at_ms=T0_MS + HOUR))
    assert refused.value.field == "timer.id"
    with pytest.raises(InvalidRequest, match="reserved for the runtime's own timers"):
        await rt.toolbelt(found.live).arm_timer(evil(timer_id, fire_at_ms=T0_MS + HOUR))
    with pytest.raises(NotFound):
        await rt.timer(timer_id)
    # a name merely like one is anyone's
    assert (await rt.arm(evil(f"my-{prefix}1", fire_at_ms=T0_MS + HOUR))).revision == 1


def test_every_control_timer_id_the_runtime_makes_is_under_a_reserved_prefix() -> None:
    """Catches: a control timer named outside the reserved prefixes (then the API could take it over)."""
    for made in (retry_timer_id("wk_1", 1), timeout_timer_id("wt_1"), deadline_timer_id("ex_1", 2)):
        assert control_timer(made) is not None, made
    assert control_timer("nightly") is None


async def test_a_root_timer_with_a_control_type_stays_its_armers(rt: Runtime) -> None:
    """Catches: an ownership rule by type alone, which would keep a trusted host from cancelling a root
    timer it armed with a ``core.*`` template."""
    timer = await rt.arm(
        evil("host-deadline", type="core.execution.timeout", source="core", fire_at_ms=T0_MS + HOUR)
    )
    assert control_timer(timer.id) is None
    assert (await rt.cancel_timer(timer.id, revision=1)).state is TimerState.CANCELLED


async def test_over_http_and_the_console_the_retry_timer_is_refused_and_unchanged(tmp_path: Path) -> None:
    """Catches: the tester's attack (POST /timers over ``retry:wk_X:1`` answering 201, or its cancel 200),
    a refusal as a 500 or without the timer's id, and a console that offers a cancel it cannot do."""
    async with api(tmp_path, actors=False) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201
        await a.rt.poll()
        work_id = (await a.rt.works())[0].id
        lease = await a.rt.claim(work_id, owner="host")
        await a.rt.complete(lease, Failed(error="exit status 1"))
        timer_id = retry_timer_id(work_id, 1)
        assert (await a.rt.timer(timer_id)).state is TimerState.ARMED
        body = {"id": timer_id, "fire_at_ms": MAX_TIME_MS, "source": "evil", "type": "x.y", "scope": "shop"}
        replaced = refusal(await a.unchanged(a.client.post("/timers", json=body)), 409, "conflict")
        assert f"timer '{timer_id}' is the runtime's own timer" in replaced["message"]
        cancel = a.client.post(f"/timers/{timer_id}/cancel", json={"revision": 1})
        cancelled = refusal(await a.unchanged(cancel), 409, "conflict")
        assert timer_id in cancelled["message"]
        new = {**body, "id": "wait-timeout:wt_soon"}
        taken = refusal(await a.unchanged(a.client.post("/timers", json=new)), 400, "invalid_request", "id")
        assert "reserved" in taken["message"]

        listing = await a.client.get("/ui/timers")
        assert listing.status_code == 200
        assert timer_id in listing.text
        assert "cancel_timer" not in listing.text, "no cancel button offered"
        detail = await a.client.get(f"/ui/timers/{timer_id}")
        assert detail.status_code == 200
        assert (
            "The runtime arms and ends this timer itself (a failed attempt&#x27;s retry backoff)."
            in detail.text
        )
        assert "cancel_timer" not in detail.text
        token = detail.text.split('name="loom-csrf" content="', 1)[1].split('"', 1)[0]
        act = a.client.post(
            "/ui/act/cancel_timer", json={"timer_id": timer_id, "revision": 1}, headers={"X-Loom-CSRF": token}
        )
        refusal(await a.unchanged(act), 409, "conflict")


# -- B: the last instant -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "now", "next_ms"),
    [
        (MAX_TIME_MS, MAX_TIME_MS, None),
        (MAX_TIME_MS - 500, MAX_TIME_MS, None),
        (MAX_TIME_MS - 1000, MAX_TIME_MS - 1000, MAX_TIME_MS),
    ],
    ids=["at-the-last-instant", "its-next-tick-past-it", "its-next-tick-the-last-instant"],
)
async def test_an_interval_timer_retires_rather_than_rearm_past_the_last_instant(
    rt: Runtime, clock: ManualClock, first: int, now: int, next_ms: int | None
) -> None:
    """Catches: a re-arm stored past `MAX_TIME_MS` (what ``POST /timers`` refuses), a retirement with no
    reason a person can read, and an off-by-one that retires a timer whose next tick is the last
    instant itself."""
    await rt.arm(evil("e2", fire_at_ms=first, interval_ms=1000, type="order.tick"))
    clock.set(now)
    (firing,) = (await rt.poll()).firings
    assert (firing.result, firing.next_fire_at_ms) == (FiringResult.ACCEPTED, next_ms)
    timer = await rt.timer("e2")
    assert timer.occurrences == 1
    if next_ms is not None:
        assert (timer.state, timer.fire_at_ms, timer.reason) == (TimerState.ARMED, next_ms, None)
        return
    assert (timer.state, timer.fire_at_ms) == (TimerState.FIRED, first)
    for why in (timer.reason, firing.detail):
        assert why is not None
        assert "retired after this firing" in why
        assert f"next tick ({first + 1000} ms)" in why
        assert "9999-12-31T23:59:59.999Z" in why
    assert await rt.timers(state=TimerState.ARMED) == []
    clock.set(MAX_TIME_MS)
    assert (await rt.poll()).firings == (), "it never fires again"


async def test_a_last_tick_whose_identity_was_taken_is_skipped_and_the_timer_still_retires(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: a last occurrence already accepted under its identity marking the timer invalid (with an
    ``invalid_timer`` diagnostic) instead of skipping it and retiring the timer as its last tick does."""
    await rt.arm(evil("e4", fire_at_ms=MAX_TIME_MS, interval_ms=1000))
    taken = await rt.publish(EventIn(source="evil", delivery_id=f"e4@{MAX_TIME_MS}", type="x.y", scope=SCOPE))
    clock.set(MAX_TIME_MS)
    (firing,) = (await rt.poll()).firings
    assert (firing.result, firing.event_id, firing.next_fire_at_ms) == (FiringResult.SKIPPED, None, None)
    assert f"already accepted as event {taken.id}" in (firing.detail or "")
    timer = await rt.timer("e4")
    assert timer.state is TimerState.FIRED
    assert "retired after this firing" in (timer.reason or "")
    assert await rt.diagnostics(kind="invalid_timer") == []


async def test_near_the_last_instant_the_runtime_arms_its_own_timers_at_it_not_past_it(
    rt: Runtime, clock: ManualClock
) -> None:
    """Catches: a claim refused (`InvalidRequest` naming ``timer.fire_at_ms``) because its deadline, an
    hour on, would be past year 9999, and a failure whose retry backoff could not be armed."""
    clock.set(MAX_TIME_MS - 1000)
    lease = await started(rt, "late")
    assert (await rt.timer(deadline_timer_id(lease.execution_id, 1))).fire_at_ms == MAX_TIME_MS
    await rt.complete(lease, Failed(error="boom"))
    retry = await rt.timer(retry_timer_id(lease.work_id, 1))
    assert (retry.state, retry.fire_at_ms) == (TimerState.ARMED, MAX_TIME_MS)
    clock.set(MAX_TIME_MS)
    fired = {f.timer_id: f.result for f in (await rt.poll()).firings}
    assert fired == {retry.id: FiringResult.ACCEPTED}
    assert (await rt.claim(lease.work_id, owner="host")).attempt == 2


def _put_past_the_last_instant(tx: Tx, now_ms: int) -> None:
    """A timer row as an older loom could leave it: re-armed past the last instant."""
    armed = tx.timer("e3")
    assert armed is not None
    tx.put_timer(attrs.evolve(armed, fire_at_ms=MAX_TIME_MS + 1000), armed)


async def test_the_console_shows_every_stored_instant_and_never_answers_500(
    tmp_path: Path, kolkata: None
) -> None:
    """Catches: the tester's path to a 500 (`ValueError: year 10000 is out of range` in the console's
    local time), for the retired timer, for a legacy row stored past the last instant, and for year
    9999's last instant in a zone ahead of UTC."""
    async with api(tmp_path, actors=False) as a:
        clock = await a.client.post("/debug/clock", json={"now_ms": MAX_TIME_MS})
        assert clock.json()["now"] == "9999-12-31T23:59:59.999Z"
        body = {
            "id": "e2",
            "fire_at_ms": MAX_TIME_MS,
            "interval_ms": 1000,
            "source": "s2",
            "type": "order.tick",
            "scope": "shop",
        }
        assert (await a.client.post("/timers", json=body)).status_code == 201
        await a.rt.poll()
        e2 = (await a.client.get("/timers/e2")).json()["timer"]
        assert (e2["state"], e2["fire_at_ms"]) == ("fired", MAX_TIME_MS)
        assert "retired after this firing" in e2["reason"]
        await a.rt.arm(evil("e3", fire_at_ms=T0_MS, interval_ms=1000, scope="shop"))
        await storage_of(a.rt).submit(_put_past_the_last_instant)
        for path in (
            "/ui/timers",
            "/ui/timers?state=fired",
            "/ui/timers/e2",
            "/ui/timers/e3",
            "/ui/schedules",
        ):
            response = await a.client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
        e3 = (await a.client.get("/ui/timers/e3")).text
        assert f"{MAX_TIME_MS + 1000} ms" in e3
        assert f'datetime="{MAX_TIME_MS + 1000} ms"' not in e3, "no <time> element for what is not a date"
        assert f"{MAX_TIME_MS} ms" in (await a.client.get("/ui/timers/e2")).text


def test_instants_are_written_exactly_or_as_their_milliseconds() -> None:
    """Catches: float arithmetic in formatting (``ms / 1000`` shows year 9999's last millisecond as
    ``.998``) and a formatter that raises for an instant no date can show."""
    assert iso_utc(MAX_TIME_MS) == "9999-12-31T23:59:59.999Z"
    assert _render.iso(MAX_TIME_MS) == "9999-12-31T23:59:59.999Z"
    assert _wire.iso(MAX_TIME_MS) == "9999-12-31T23:59:59.999Z"
    assert iso_ms(MAX_TIME_MS) == "9999-12-31T23:59:59.999Z"
    assert instant(MAX_TIME_MS) == f"{MAX_TIME_MS} (9999-12-31T23:59:59.999Z)"
    assert _render.iso(T0_MS) == "2026-01-01T00:00:00Z"
    for ms in (0, 1, 999, T0_MS + 1, 2**41 + 7, 2**45 - 1, MAX_TIME_MS - 1, MAX_TIME_MS):
        text = iso_utc(ms)
        assert text is not None
        back = datetime.fromisoformat(text.replace("Z", "+00:00")) - EPOCH
        assert back // timedelta(milliseconds=1) == ms, text
    past = MAX_TIME_MS + 1000
    assert (iso_utc(past), _render.iso(past), _render.local(past)) == (None, f"{past} ms", f"{past} ms")
    assert (_wire.iso(past), iso_ms(past), instant(past)) == (f"{past} ms", f"{past} ms", str(past))
    assert _render.local(-(10**20)) == f"{-(10**20)} ms"


def test_local_time_is_exact_and_falls_back_where_the_zone_passes_year_9999(kolkata: None) -> None:
    """Catches: ``local`` raising for year 9999's last instant in a zone ahead of UTC, or rounding it."""
    assert _render.local(MAX_TIME_MS) == f"{MAX_TIME_MS} ms"
    assert _render.local(MAX_TIME_MS - 6 * HOUR) == "9999-12-31 23:29:59.999+05:30"
