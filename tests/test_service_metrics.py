"""``/metrics`` drives alerts: the gauges read from the store move with what it holds, the firing
lateness is observed, and every metric the example alert rules (docs/alerts.yml) use is served."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from service_kit import api, order

from loom.testing import T0_MS

ALERTS = Path(__file__).parent.parent / "docs" / "alerts.yml"


async def scrape(a: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
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
