"""Compaction in the service (docs/http-api.md, docs/operations.md): ``POST /compact``, ``loom compact``
and ``loom vacuum``, and the size gauges and compaction counters on ``/metrics``."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from service_kit import CONFIG_TOML, api, order, refusal
from test_cli import FakeServer, loom_cli, one_line_error, server  # noqa: F401 (the fixture)

import loom

HOUR = 3_600_000
CONFIG = loom.Config.from_toml(
    CONFIG_TOML + '\n[retention]\nworks = "1h"\nevents = "1h"\n[compaction]\nevery = "30d"\n'
)
"""Retention of an hour; the compaction actor sweeps at start, then not for a month: the operator's
route does the sweep under test."""


def metrics(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def test_post_compact_dry_runs_then_compacts_and_the_metrics_show_it(tmp_path: Path) -> None:
    """Catches: a dry run that removes, a route that does not sweep, gauges that are never read."""
    async with api(tmp_path, config=CONFIG) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201
        await a.rt.wait_idle()
        work = await a.rt.work_for_key("order/1")
        await a.rt.complete(await a.rt.claim(work.id, owner="host"), loom.Completed())
        await a.client.post("/debug/clock", json={"advance_ms": 2 * HOUR})
        await a.rt.wait_idle()
        before = metrics((await a.client.get("/metrics")).text)
        assert before['loom_store_rows{table="works"}'] == 1
        assert before['loom_store_bytes{part="total"}'] > 0
        dry = (await a.client.post("/compact", json={"dry_run": True})).json()
        assert (dry["dry_run"], dry["works"]) == (True, 1)
        assert (await a.rt.store_size()).rows["works"] == 1
        done = (await a.client.post("/compact")).json()
        assert (done["dry_run"], done["works"], done["events"]) == (False, 1, 1)
        assert dry["removed"] == done["removed"], "the dry run said what the sweep removed"
        await a.rt.wait_idle()
        after = metrics((await a.client.get("/metrics")).text)
        assert after['loom_compacted_total{kind="works"}'] == 1
        assert after['loom_compacted_total{kind="events"}'] == 1
        again = await a.client.post("/events", json=order(1))
        assert (again.status_code, again.json()["compacted"]) == (200, True)
        assert again.json()["routing"]["status"] == "compacted"


async def test_post_compact_refuses_a_bad_limit_or_dry_run_and_changes_nothing(tmp_path: Path) -> None:
    async with api(tmp_path, config=CONFIG) as a:
        for body, field in [
            ({"limit": 0}, "limit"),
            ({"limit": "many"}, "limit"),
            ({"dry_run": "yes"}, "dry_run"),
        ]:
            refusal(await a.unchanged(a.client.post("/compact", json=body)), 400, "invalid_request", field)


def test_loom_compact_says_what_it_removed_or_would(server: FakeServer) -> None:  # noqa: F811
    server.answers["POST", "/compact"] = (200, {"works": 2, "events": 5, "kept": 1, "removed": 7})
    result = loom_cli("compact", "--dry-run", "--limit", "50", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert "would remove: 5 events, 2 works" in result.stdout
    assert "kept 1 past their retention" in result.stdout
    assert server.requests[-1] == ("POST", "/compact", {"dry_run": True, "limit": 50})
    result = loom_cli("compact", "--url", server.url)
    assert "removed: 5 events, 2 works" in result.stdout


def test_loom_vacuum_gives_an_old_file_incremental_vacuum(tmp_path: Path) -> None:
    """Catches: an old file that can never shrink (and a missing file taken for a new one)."""
    one_line_error(loom_cli("vacuum", "--db", str(tmp_path / "missing.db")), "no such file")
    path = tmp_path / "old.db"
    store = loom.SQLiteStore(path=str(path))
    store.close_writer(store.open_writer())
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")
    result = loom_cli("vacuum", "--db", str(path))
    assert result.exit_code == 0, result.output
    assert "bytes before" in result.stdout
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)


def test_the_command_line_counts_the_kinds_a_report_has() -> None:
    """The command line keeps its own list of a report's counts (it imports no records, to start fast):
    catches a kind added to `CompactionReport` that ``loom compact`` would never show."""
    import attrs

    from loom.records.compaction import COUNTS, CompactionReport
    from loom.service import _cli_compact

    assert _cli_compact.COUNTS == COUNTS
    assert set(COUNTS) <= {field.name for field in attrs.fields(CompactionReport)}
