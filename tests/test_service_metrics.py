"""``/metrics`` drives alerts: the gauges read from the store move with what it holds, the firing
lateness is observed, and every metric the example alert rules (docs/alerts.yml) use is served."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from service_kit import CONFIG, api, order

import loom
from loom.service.serve import open_service
from loom.testing import T0_MS
from loom.testing.postgres import PostgresCluster

ALERTS = Path(__file__).parent.parent / "docs" / "alerts.yml"


Figures = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(a: object) -> Figures:
    return await scrape_client(a.client)  # type: ignore[attr-defined]


async def scrape_client(client: httpx.AsyncClient) -> Figures:
    response = await client.get("/metrics")
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


async def test_on_a_shared_database_gauges_read_the_database_and_counters_are_the_nodes_own(
    loom_postgres: PostgresCluster,
) -> None:
    """Two nodes on one PostgreSQL database, each with its own /metrics. Catches gauges counted from a
    node's own notices (node b would show none of a's Events and Works) and counters that count another
    node's commits (b would count a's attempt, and a scrape of every node would count it twice)."""
    url = loom_postgres.create_database(template=loom_postgres.migrated_template())
    clock = loom.ManualClock(start_ms=T0_MS)
    options = {"config": CONFIG, "test_clock": clock, "load_entry_points": False, "start_actors": False}
    async with (
        open_service(url, node="a", **options) as a,  # type: ignore[arg-type]
        open_service(url, node="b", **options) as b,  # type: ignore[arg-type]
        httpx.AsyncClient(transport=httpx.ASGITransport(app=a.app), base_url="http://localhost") as on_a,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=b.app), base_url="http://localhost") as on_b,
    ):
        start_a, start_b = await scrape_client(on_a), await scrape_client(on_b)
        for n in (1, 2):
            assert (await on_a.post("/events", json=order(n))).status_code == 201
        assert one(await scrape_client(on_b), "loom_events_unrouted") == 2
        await a.runtime.poll()
        work = await a.runtime.work_for_key("order/1")
        await a.runtime.claim(work.id, owner="host")
        on_node_a, on_node_b = await scrape_client(on_a), await scrape_client(on_b)
        for figures in (on_node_a, on_node_b):  # the database's figures, whichever node is asked
            assert one(figures, "loom_events_unrouted") == 0
            assert one(figures, "loom_works", state="running") == 1
            assert one(figures, "loom_works", state="ready") == 1
        assert delta(on_node_a, start_a, "loom_attempts_started_total", resumed="false") == 1
        assert delta(on_node_b, start_b, "loom_attempts_started_total", resumed="false") == 0
