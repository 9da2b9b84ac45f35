"""``/metrics`` drives alerts: the gauges read from the store move with what it holds, the firing
lateness is observed, and every metric the example alert rules (docs/alerts.yml) use is served."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from service_kit import api, order

import loom
from loom.testing import T0_MS

ALERTS = Path(__file__).parent.parent / "docs" / "alerts.yml"


Figures = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(a: object) -> Figures:
    response = await a.client.get("/metrics")  # type: ignore[attr-defined]
    assert response.status_code == 200
    figures = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            figures[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return figures


def one(figures: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return figures[name, tuple(sorted(labels.items()))]


async def test_the_gauges_follow_the_store(tmp_path: Path) -> None:
    """Catches gauges that never move (counted from notices of one node, or never read), a ready
    backlog or unrouted count read from the wrong table, and an overdue timer not seen as overdue."""
    async with api(tmp_path, actors=False) as a:
        before = await scrape(a)
        assert one(before, "loom_events_unrouted") == 0
        assert one(before, "loom_timers_overdue") == 0
        for n in (1, 2):
            assert (await a.client.post("/events", json=order(n))).status_code == 201
        timer = {"id": "t-1", "fire_at_ms": T0_MS + 1_000, "source": "m", "type": "m.due", "scope": "shop"}
        assert (await a.client.post("/timers", json=timer)).status_code == 201
        later = await scrape(a)
        assert one(later, "loom_events_unrouted") == 2
        assert (one(later, "loom_timers_armed"), one(later, "loom_timers_overdue")) == (1, 0)
        a.clock.advance(5_000)
        due = await scrape(a)
        assert one(due, "loom_timers_overdue") == 1
        assert one(due, "loom_timer_overdue_seconds") == 4.0
        await a.rt.poll()  # routes both Events (each makes a Work) and fires the timer
        await a.rt.poll()  # routes the fired Event
        after = await scrape(a)
        assert one(after, "loom_events_unrouted") == 0
        assert one(after, "loom_works", state="ready") + one(after, "loom_works", state="running") >= 2
        assert one(after, "loom_timers_overdue") == 0
        assert one(after, "loom_timer_overdue_seconds") == 0


async def test_a_firing_observes_its_lateness(tmp_path: Path) -> None:
    async with api(tmp_path) as a:
        timer = {"id": "t-1", "fire_at_ms": T0_MS + 1_000, "source": "m", "type": "m.due", "scope": "shop"}
        assert (await a.client.post("/timers", json=timer)).status_code == 201
        a.clock.advance(3_500)
        await a.rt.wait_idle()
        figures = await scrape(a)
        assert one(figures, "loom_timer_fire_lateness_seconds_count") == 1
        assert one(figures, "loom_timer_fire_lateness_seconds_sum") == 2.5


async def test_every_metric_the_example_alerts_use_is_served(tmp_path: Path) -> None:
    """Catches an alert rule naming a metric loom does not serve (renamed, or never written)."""
    rules = [line for line in ALERTS.read_text().splitlines() if not line.lstrip().startswith("#")]
    used = set(re.findall(r"\b(loom_[a-z_]+)", "\n".join(rules)))
    assert used, "docs/alerts.yml names loom's metrics"
    async with api(tmp_path) as a:
        served = {name for name, _ in await scrape(a)}
    served |= {re.sub(r"_(bucket|count|sum|total|created)$", "", name) for name in served}
    assert used <= served, sorted(used - served)


def delta(after: Figures, before: Figures, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def test_attempt_outcomes_retries_and_start_latencies_are_counted(tmp_path: Path) -> None:
    """Each attempt's end is counted under its outcome (a wrong or missing label, a recovery that is
    not told apart, a parked attempt counted twice would show), retries by kind, and the two start
    latencies measure from the right instants: the triggering Event's acceptance, and the Work's
    joining the ready queue (here 3 s and 1 s apart, so swapping them shows)."""
    async with api(tmp_path, actors=False) as a:
        for n in range(1, 6):
            assert (await a.client.post("/events", json=order(n))).status_code == 201
        await a.rt.poll()
        work = {n: (await a.rt.work_for_key(f"order/{n}")).id for n in range(1, 6)}
        start = await scrape(a)

        await a.rt.hold(work[1], reason="not yet")
        a.clock.advance(2_000)
        await a.rt.release(work[1])  # joins the ready queue again, 2 s after its Event
        a.clock.advance(1_000)
        lease = await a.rt.claim(work[1], owner="host")
        claimed = await scrape(a)
        assert delta(claimed, start, "loom_attempts_started_total", resumed="false") == 1
        assert delta(claimed, start, "loom_event_to_start_seconds_count") == 1
        assert delta(claimed, start, "loom_event_to_start_seconds_sum") == 3.0
        assert delta(claimed, start, "loom_ready_to_start_seconds_sum") == 1.0
        await a.rt.complete(lease, loom.Completed())

        failing = await a.rt.claim(work[2], owner="host")
        await a.rt.complete(failing, loom.Failed(error="boom"))
        await a.rt.retry(work[2], reason="operator retry")
        handing = await a.rt.claim(work[3], owner="host")
        await a.rt.complete(handing, loom.Handoff())
        waiting = await a.rt.claim(work[4], owner="host")
        await a.rt.complete(waiting, loom.Waiting(wait=loom.WaitSpec(types=("approval.*",))))
        await a.rt.claim(work[5], owner="host", lease_ms=1_000)
        a.clock.advance(5_000)
        [recovery] = await a.rt.recover_expired()
        await a.rt.not_adoptable(recovery.lease, reason="the process is gone")
        a.clock.advance(24 * 3_600_000)  # past any backoff: the failed attempt's retry comes due
        await a.rt.poll()
        ended = await scrape(a)
        for outcome, count in (
            ("completed", 1),
            ("failed", 1),
            ("handoff", 1),
            ("waited", 1),
            ("not_adoptable", 1),
            ("cancelled", 0),
            ("parked", 0),
        ):
            assert delta(ended, start, "loom_attempts_ended_total", outcome=outcome) == count, outcome
        assert delta(ended, start, "loom_retries_total", kind="manual") == 1
        assert delta(ended, start, "loom_retries_total", kind="automatic") == 1
        assert delta(ended, start, "loom_attempts_recovered_total", relaunch="false") == 1
