"""The web view of ``loom serve``: server-rendered HTML listing Work (state, hold reason, filters by scope
and state) and one Work with its history, waits and timers, times in ISO 8601 UTC.

The first tests read the HTML in-process; the last loads the pages from a running ``loom serve`` in
headless Chromium (``chromium --headless --dump-dom``) and reads what the browser built. It is skipped
only where Chromium is missing and ``CI`` is not set; in CI a missing Chromium fails it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import trio
from service_kit import CONFIG_TOML, api, order, start_server, until

from loom.testing import T0_MS

HOUR = 3_600_000


class Page(HTMLParser):
    """The text of each element with an id, and the rows of each table (cells as text)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.links: list[str] = []
        self.duplicate_ids: list[str] = []
        self._open: list[tuple[str, str | None]] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._texts: dict[str, list[str]] = {}
        self.feed(html)
        self.by_id = {k: " ".join("".join(v).split()) for k, v in self._texts.items()}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        element_id = found.get("id")
        self._open.append((tag, element_id))
        if element_id:
            if element_id in self._texts:
                self.duplicate_ids.append(element_id)
            self._texts.setdefault(element_id, [])
        if tag == "a" and found.get("href"):
            self.links.append(str(found["href"]))
        if tag == "table" and element_id:
            self._table = element_id
            self.tables[element_id] = []
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            open_tag, _ = self._open.pop()
            if open_tag == tag:
                break
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._table is not None and self._row is not None:
            if self._row:
                self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        for _, element_id in self._open:
            if element_id:
                self._texts[element_id].append(data)
        if self._cell is not None:
            self._cell.append(data)


async def test_the_work_list_shows_state_and_hold_reason_and_filters(tmp_path: Path) -> None:
    """Catches a list without the hold reason, filters that are ignored, and unescaped values (a
    key or reason holding markup would become markup)."""
    async with api(tmp_path) as a:
        for n in (1, 2):
            await a.client.post("/events", json=order(n))
        await a.client.post("/events", json=order("<b>3</b>", delivery_id="o-3"))
        await a.rt.wait_idle()
        held = (await a.client.get("/work/by-key/order/1")).json()["work"]["id"]
        await a.client.post(f"/work/{held}/hold", json={"reason": "stock <script>alert(1)</script> check"})

        response = await a.client.get("/ui/work")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert "<script>alert(1)</script>" not in response.text
        assert "<b>3</b>" not in response.text
        page = Page(response.text)
        assert page.duplicate_ids == []
        rows = {row[0]: row for row in page.tables["work"]}
        assert rows[held][3] == "ready"
        assert rows[held][4] == "held: stock <script>alert(1)</script> check"
        assert {row[5] for row in rows.values()} == {"order/1", "order/2", "order/<b>3</b>"}
        assert all(row[8] == "2026-01-01T00:00:00.000Z" for row in rows.values())

        only_shop = Page((await a.client.get("/ui/work", params={"scope": "shop", "state": "ready"})).text)
        assert len(only_shop.tables["work"]) == 3
        none = Page((await a.client.get("/ui/work", params={"state": "completed"})).text)
        assert "work" not in none.tables
        assert none.by_id["work"] == "No Work matches."
        paged = Page((await a.client.get("/ui/work", params={"limit": "2"})).text)
        assert len(paged.tables["work"]) == 2
        assert any("after=" in link for link in paged.links)

        bad = await a.client.get("/ui/work", params={"state": "asleep"})
        assert bad.status_code == 400
        assert "state must be one of" in Page(bad.text).by_id["error"]


async def test_one_work_shows_its_history_waits_and_timers(tmp_path: Path) -> None:
    """Catches a Work page without its waits, timers, attempts or history, or with epoch numbers
    instead of readable UTC times."""
    async with api(tmp_path) as a:
        await a.client.post("/events", json=order(1))
        await a.rt.wait_idle()
        work_id = (await a.client.get("/work/by-key/order/1")).json()["work"]["id"]
        lease = await a.rt.claim(work_id, owner="host")
        auth = {"Authorization": f"Bearer {lease.token}"}
        timer = {
            "id": "nudge",
            "fire_at_ms": T0_MS + HOUR,
            "source": "shop",
            "type": "order.nudge",
            "scope": "shop",
        }
        assert (
            await a.client.post(f"/executions/{lease.execution_id}/timer", json=timer, headers=auth)
        ).is_success
        waited = await a.client.post(
            f"/executions/{lease.execution_id}/wait", json={"types": ["approval.*"]}, headers=auth
        )
        assert waited.status_code == 200

        page = Page((await a.client.get(f"/ui/work/{work_id}")).text)
        assert page.duplicate_ids == []
        assert page.by_id["work-id"] == work_id
        assert page.by_id["state"] == "waiting"
        assert page.by_id["hold"] == "not held"
        assert page.by_id["keys"] == "order/1"
        assert page.by_id["attempt-count"] == "1"
        assert page.by_id["wait"].endswith("(active)")
        [wait] = page.tables["waits"]
        assert (wait[1], wait[3]) == ("active", "approval.*")
        [armed] = page.tables["timers"]
        assert (armed[0], armed[1], armed[3]) == ("nudge", "armed", "2026-01-01T01:00:00.000Z")
        [attempt] = page.tables["attempts"]
        assert (attempt[0], attempt[2]) == ("1", "waited")
        [routed] = page.tables["history"]
        assert (routed[2], routed[3], routed[6]) == ("routed", "orders", "2026-01-01T00:00:00.000Z")
        assert "pending" not in page.tables  # its input went to the attempt

        missing = await a.client.get("/ui/work/wk_nope")
        assert missing.status_code == 404
        assert "no work with id" in Page(missing.text).by_id["error"]


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _dump_dom(browser: str, url: str, profile: Path) -> str:
    done = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


async def test_headless_chromium_shows_the_work_from_a_running_loom_serve(tmp_path: Path) -> None:
    """The pages as a browser builds them from a real ``loom serve``: the list with the hold reason,
    the filter by state, one Work's wait and history."""
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: install it (apt-get install -y chromium chromium-driver)")
        pytest.skip("chromium is not installed (apt-get install -y chromium chromium-driver)")
    config = tmp_path / "loom.toml"
    config.write_text(CONFIG_TOML)
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path / "web.db", config=config))
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            for n in (1, 2):
                assert (await client.post("/events", json=order(n))).status_code == 201

            async def routed() -> bool:
                return len((await client.get("/work")).json()["work"]) == 2

            await until(routed, "both orders to have their Work")
            one = (await client.get("/work/by-key/order/1")).json()["work"]["id"]
            two = (await client.get("/work/by-key/order/2")).json()["work"]["id"]
            await client.post(f"/work/{one}/hold", json={"reason": "waiting for stock"})
            await client.post(f"/work/{two}/cancel")
        profile = tmp_path / "chromium"

        listing = Page(await trio.to_thread.run_sync(_dump_dom, browser, f"{server.url}/ui/work", profile))
        rows = {row[0]: row for row in listing.tables["work"]}
        assert rows[one][3:5] == ["ready", "held: waiting for stock"]
        assert rows[two][3] == "cancelled"

        cancelled = Page(
            await trio.to_thread.run_sync(
                _dump_dom, browser, f"{server.url}/ui/work?state=cancelled", profile
            )
        )
        assert [row[0] for row in cancelled.tables["work"]] == [two]

        detail = Page(
            await trio.to_thread.run_sync(_dump_dom, browser, f"{server.url}/ui/work/{one}", profile)
        )
        assert detail.by_id["state"] == "ready"
        assert detail.by_id["hold"] == "held: waiting for stock"
        assert [row[2] for row in detail.tables["history"]] == ["routed"]
        assert detail.tables["history"][0][6].endswith("Z")
        [pending] = detail.tables["pending"]
        assert pending[0].endswith("order.placed (seq 1)")
    finally:
        await trio.to_thread.run_sync(server.stop)
