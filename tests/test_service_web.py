"""The web console of ``loom serve``: pages for Works (by last change, counts by state, search by key,
filters), one Work, Events, timers, schedules and diagnostics, every value escaped and every time in
local time with its offset and a relative form; the actions behind the access checks and the page's
CSRF token.

These tests read the HTML in-process; test_service_console.py drives the pages in headless Chromium.
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from service_kit import CONFIG, api, order, refusal

import loom
from loom.plugins.schedule import ScheduleSpec, schedule_timer
from loom.testing import T0_MS

HOUR = 3_600_000
T0_LOCAL = "2026-01-01 05:30:00+05:30"
"""T0_MS in the time zone these tests run the server in (Asia/Kolkata: no daylight saving time)."""


pytestmark = pytest.mark.usefixtures("kolkata")  # (conftest: the server's local zone)


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


def _actions(page: Page) -> list[str]:
    return [
        label
        for label in ("Hold", "Release", "Retry now", "Interrupt", "Cancel")
        if label in page.by_id["actions"]
    ]


async def _work_of(a: object, n: object) -> str:
    response = await a.client.get(f"/work/by-key/order/{n}")  # type: ignore[attr-defined]
    return str(response.json()["work"]["id"])


async def test_the_work_list_is_by_last_change_with_counts_key_search_and_filters(tmp_path: Path) -> None:
    """Catches a list in id (hash) order instead of last change, counts that ignore the scope, a key
    search or a filter that is ignored, paging that repeats or loses a Work, times in UTC or in
    milliseconds, and values written unescaped (a key or reason holding markup becoming markup)."""
    async with api(tmp_path) as a:
        for n, scope in ((1, "shop"), (2, "shop"), (12, "shop"), ("<b>3</b>", "shop/eu")):
            await a.client.post("/events", json=order(n, scope=scope))
            await a.rt.wait_idle()
            a.clock.advance(1000)
        one, two, twelve, three = [await _work_of(a, n) for n in (1, 2, 12, "<b>3</b>")]
        held = await a.client.post(
            f"/work/{one}/hold", json={"reason": "stock <script>alert(1)</script> check"}
        )
        assert held.status_code == 200

        response = await a.client.get("/ui/work")
        assert response.status_code == 200
        assert "<script>alert(1)</script>" not in response.text
        assert "<b>3</b>" not in response.text
        page = Page(response.text)
        assert page.duplicate_ids == []
        rows = page.tables["work"]
        assert [row[0] for row in rows] == [one, three, twelve, two], "the last changed first"
        first = rows[0]
        assert first[3:6] == ["ready", "held: stock <script>alert(1)</script> check", "order/1"]
        assert first[8] == "2026-01-01 05:30:04+05:30 (now)"
        assert rows[3][8] == "2026-01-01 05:30:01+05:30 (3 s ago)"
        assert rows[3][9] == "2026-01-01 05:30:01+05:30 (3 s ago)"
        assert "all 4" in page.by_id["counts"]
        assert "ready 4" in page.by_id["counts"]

        eu = Page((await a.client.get("/ui/work", params={"scope": "shop/eu"})).text)
        assert [row[0] for row in eu.tables["work"]] == [three]
        assert "all 1" in eu.by_id["counts"]
        assert "ready 1" in eu.by_id["counts"]

        keyed = Page((await a.client.get("/ui/work", params={"key": "order/1"})).text)
        assert [row[0] for row in keyed.tables["work"]] == [one, twelve], "keys starting with order/1"
        by_id = Page((await a.client.get("/ui/work", params={"key": two})).text)
        assert two in by_id.by_id["exact"]

        none = Page((await a.client.get("/ui/work", params={"state": "completed", "scope": ""})).text)
        assert none.by_id["work"] == "No Work matches."

        seen: list[str] = []
        url = "/ui/work?limit=3"
        while url:
            paged = Page((await a.client.get(url)).text)
            seen += [row[0] for row in paged.tables["work"]]
            older = [link for link in paged.links if "before=" in link]
            url = older[0] if older else ""
        assert seen == [one, three, twelve, two], "each Work once, in order, across pages"

        bad = await a.client.get("/ui/work", params={"state": "asleep"})
        assert bad.status_code == 400
        assert "state must be one of" in Page(bad.text).by_id["error"]


async def test_one_work_shows_attempts_with_their_last_error_waits_timers_and_history(tmp_path: Path) -> None:
    """Catches a Work page without its attempts (newest first, with the last error), waits, timers,
    history or diagnostics, without the actions that apply to it, or with unescaped errors."""
    async with api(tmp_path) as a:
        await a.client.post("/events", json=order(1))
        await a.rt.wait_idle()
        work_id = await _work_of(a, 1)
        lease = await a.rt.claim(work_id, owner="host")
        await a.rt.complete(lease, loom.Failed(error="payment <gateway> down"))
        await a.rt.retry(work_id, reason="operator retry")
        await a.rt.wait_idle()
        lease = await a.rt.claim(work_id, owner="host")
        running = Page((await a.client.get(f"/ui/work/{work_id}")).text)
        assert _actions(running) == ["Hold", "Cancel"], (
            "no retry while an attempt runs, no interrupt where its binding did not pin the capability"
        )
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

        response = await a.client.get(f"/ui/work/{work_id}")
        assert "payment <gateway> down" not in response.text
        page = Page(response.text)
        assert page.duplicate_ids == []
        assert page.by_id["state"] == "waiting"
        assert page.by_id["hold"] == "not held"
        assert page.by_id["keys"] == "order/1"
        assert page.by_id["attempt-count"] == "2"
        assert page.by_id["wait"].startswith("wt_")
        assert "(active), for approval.*" in page.by_id["wait"]
        second, first = page.tables["attempts"]
        assert (second[0], second[2]) == ("2", "waited")
        assert (first[0], first[2], first[5], first[6]) == ("1", "failed", "failed", "payment <gateway> down")
        assert first[7] == f"{T0_LOCAL} (now)"
        nudge = next(row for row in page.tables["timers"] if row[0] == "nudge")
        assert (nudge[1], nudge[3]) == ("armed", "2026-01-01 06:30:00+05:30 (in 1 h)")
        assert [row[2] for row in page.tables["history"]][-1] == "routed"
        assert "pending" not in page.tables  # its input went to the attempts
        assert _actions(page) == ["Hold", "Retry now", "Cancel"], "no interrupt while no attempt runs"

        missing = await a.client.get("/ui/work/wk_nope")
        assert missing.status_code == 404
        assert "no work with id" in Page(missing.text).by_id["error"]


async def test_events_show_their_payload_and_where_they_were_routed(tmp_path: Path) -> None:
    """Catches an Event list in the wrong order or without its routing, and a payload that is not
    shown, or shown as markup."""
    async with api(tmp_path) as a:
        await a.client.post("/events", json=order(1, payload={"note": "</pre><script>alert(1)</script>"}))
        await a.client.post(
            "/events",
            json={"source": "ops", "delivery_id": "n-1", "type": "misc.note", "scope": "shop", "payload": {}},
        )
        await a.rt.wait_idle()
        work_id = await _work_of(a, 1)
        listing = Page((await a.client.get("/ui/events")).text)
        newest, oldest = listing.tables["events"]
        assert (newest[0], newest[2]) == ("2", "misc.note")
        assert (oldest[0], oldest[2], oldest[4]) == ("1", "order.placed", "order/1")
        assert oldest[7] == f"routed {work_id} by orders"
        assert newest[7] != oldest[7]
        assert "routed" not in newest[7].split()[:1]
        typed = Page((await a.client.get("/ui/events", params={"type": "misc.note"})).text)
        assert [row[2] for row in typed.tables["events"]] == ["misc.note"]

        event_id = oldest[1]
        response = await a.client.get(f"/ui/events/{event_id}")
        assert "<script>alert(1)</script>" not in response.text
        page = Page(response.text)
        assert "</pre><script>alert(1)</script>" in response.text.replace("&lt;", "<").replace("&gt;", ">")
        assert work_id in page.by_id["routing"]
        assert "orders" in page.by_id["routing"]
        assert f"/ui/work/{work_id}" in page.links


async def test_timers_show_due_and_lateness_and_schedules_their_rule(tmp_path: Path) -> None:
    """Catches timers listed by id instead of due time, an overdue timer not marked late, a timer page
    without its cancel action or ledger, and schedules missing from their page."""
    async with api(tmp_path, actors=False) as a:  # nothing fires: the due times stay as armed
        for timer_id, offset in (("b-later", HOUR), ("a-late", -5 * 60_000), ("<i>c</i>", 2 * HOUR)):
            spec = loom.TimerSpec(
                id=timer_id, fire_at_ms=T0_MS + offset, source="ops", type="ops.remind", scope="shop"
            )
            await a.rt.arm(spec)
        nightly = ScheduleSpec(schedule_id="nightly", cron="30 2 * * *", timezone="Europe/Berlin")
        await a.rt.arm(schedule_timer(nightly, now_ms=T0_MS, source="ops", type="report.due", scope="shop"))

        response = await a.client.get("/ui/timers")
        assert "<i>c</i>" not in response.text
        rows = Page(response.text).tables["timers"]
        assert [row[0] for row in rows] == ["a-late", "b-later", "schedule:nightly", "<i>c</i>"], (
            "by due time"
        )
        assert rows[0][4] == "2026-01-01 05:25:00+05:30 (5 min ago) 5 min late"
        assert rows[1][4] == "2026-01-01 06:30:00+05:30 (in 1 h)"

        seen: list[str] = []
        url = "/ui/timers?limit=1"
        while url:
            paged = Page((await a.client.get(url)).text)
            seen += [row[0] for row in paged.tables["timers"]]
            later = [link for link in paged.links if "due_after=" in link]
            url = later[0] if later else ""
        assert seen == ["a-late", "b-later", "schedule:nightly", "<i>c</i>"], "each timer once, across pages"
        bad = await a.client.get("/ui/timers", params={"due_after": "soon"})
        assert bad.status_code == 400
        assert "due_after must be a page cursor" in Page(bad.text).by_id["error"]

        schedules = Page((await a.client.get("/ui/schedules")).text).tables["schedules"]
        [row] = schedules
        assert row[:5] == ["schedule:nightly", "armed", "cron", "30 2 * * *", "Europe/Berlin"]
        assert row[5] == "2026-01-01 07:00:00+05:30 (in 1 h)"

        page = Page((await a.client.get("/ui/timers/a-late")).text)
        assert page.by_id["state"] == "armed"
        assert "Cancel timer" in page.by_id["actions"]
        assert page.by_id["firings"] == "Not fired yet."
        cancelled = Page((await a.client.get("/ui/timers", params={"state": "cancelled"})).text)
        assert cancelled.by_id["timers"] == "No cancelled timers."


async def test_diagnostics_are_listed_newest_first_with_their_subject(tmp_path: Path) -> None:
    """Catches diagnostics oldest first, a filter that is ignored, or a subject that does not link."""
    async with api(tmp_path) as a:
        for n in (1, 2):
            await a.client.post("/events", json=order(n))
            await a.rt.wait_idle()
        one, two = await _work_of(a, 1), await _work_of(a, 2)
        page = Page((await a.client.get("/ui/diagnostics", params={"kind": "start_failed"})).text)
        rows = page.tables["diagnostics"]
        assert [row[2] for row in rows] == [two, one], "newest first"
        assert all(row[1] == "start_failed" for row in rows)
        assert f"/ui/work/{two}" in page.links
        other = Page((await a.client.get("/ui/diagnostics", params={"kind": "handler_error"})).text)
        assert other.by_id["diagnostics"] == "No diagnostics."


def _csrf(html: str) -> str:
    marker = 'name="loom-csrf" content="'
    return html.split(marker, 1)[1].split('"', 1)[0]


async def test_console_actions_need_the_pages_token_json_and_the_same_origin(tmp_path: Path) -> None:
    """Catches an action without CSRF protection (no token, a wrong one, a form body, another origin)
    or one that changes something when refused, and each action not doing what it says."""
    async with api(tmp_path) as a:
        await a.client.post("/events", json=order(1))
        await a.rt.wait_idle()
        work_id = await _work_of(a, 1)
        token = _csrf((await a.client.get(f"/ui/work/{work_id}")).text)
        hold = {"work_id": work_id, "reason": "checking stock"}
        ok = {"X-Loom-CSRF": token}

        async def refused(status: int, error: str, field: str | None, **request: object) -> None:
            response = await a.unchanged(a.client.post("/ui/act/hold", **request))  # type: ignore[arg-type]
            refusal(response, status, error, field)

        await refused(403, "forbidden", "X-Loom-CSRF", json=hold)
        await refused(403, "forbidden", "X-Loom-CSRF", json=hold, headers={"X-Loom-CSRF": token + "x"})
        await refused(
            415, "unsupported_media_type", "Content-Type",
            content=b'{"work_id": "x", "reason": "y"}', headers={**ok, "Content-Type": "text/plain"},
        )  # fmt: skip
        await refused(403, "forbidden", "Origin", json=hold, headers={**ok, "Origin": "http://evil.example"})
        await refused(403, "forbidden", "Origin", json=hold, headers={**ok, "Sec-Fetch-Site": "cross-site"})
        await refused(400, "invalid_request", "reason", json={"work_id": work_id}, headers=ok)
        refusal(await a.client.post("/ui/act/explode", json=hold, headers=ok), 404, "not_found")

        done = await a.client.post("/ui/act/hold", json=hold, headers=ok)
        assert done.status_code == 200
        assert done.json()["ok"] is True
        assert (await a.rt.work(work_id)).hold_reason == "checking stock"
        assert (
            await a.client.post("/ui/act/release", json={"work_id": work_id}, headers=ok)
        ).status_code == 200
        assert not (await a.rt.work(work_id)).held
        cancel = await a.client.post("/ui/act/cancel", json={"work_id": work_id}, headers=ok)
        assert cancel.json()["message"] == f"Work {work_id} is cancelled."
        again = await a.unchanged(a.client.post("/ui/act/cancel", json={"work_id": work_id}, headers=ok))
        refusal(again, 409, "conflict")

        timer = await a.rt.arm(
            loom.TimerSpec(id="t", fire_at_ms=T0_MS + HOUR, source="ops", type="ops.remind", scope="shop")
        )
        stale = {"timer_id": "t", "revision": timer.revision + 1}
        refusal(
            await a.unchanged(a.client.post("/ui/act/cancel_timer", json=stale, headers=ok)), 409, "conflict"
        )
        fresh = {"timer_id": "t", "revision": timer.revision}
        assert (await a.client.post("/ui/act/cancel_timer", json=fresh, headers=ok)).status_code == 200
        assert (await a.rt.timer("t")).state == "cancelled"


async def test_with_an_operator_token_the_console_asks_for_it(tmp_path: Path) -> None:
    """Catches console pages, its watch or its actions reachable without the operator token."""
    from loom.service._access import Access
    from loom.service._app import make_app

    async with api(tmp_path) as a:
        app = make_app(a.rt, access=Access(token="operator-token-0123456789"))
        import httpx

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            for path in ("/ui/work", "/ui/events", "/ui/watch", "/ui/static/console.js"):
                denied = await client.get(path)
                assert denied.status_code == 401, path
                assert denied.headers["WWW-Authenticate"].startswith("Basic")
            act = await client.post("/ui/act/release", json={"work_id": "wk_x"})
            assert act.status_code == 401
            page = await client.get("/ui/work", auth=("anyone", "operator-token-0123456789"))
            assert page.status_code == 200


async def test_every_page_escapes_values_and_runs_no_inline_script(tmp_path: Path) -> None:
    """Catches a value written into any page unescaped, and a page whose policy would run an inline
    script (an escaping slip must not become script)."""
    hostile = "<script>alert(1)</script>"
    async with api(tmp_path) as a:
        body = order(1, key=f"order/{hostile}", delivery_id=hostile, payload={"x": hostile})
        assert (await a.client.post("/events", json=body)).status_code == 201
        await a.rt.wait_idle()
        work_id = (await a.client.get(f"/work/by-key/order/{hostile}")).json()["work"]["id"]
        await a.client.post(f"/work/{work_id}/hold", json={"reason": hostile})
        await a.rt.arm(
            loom.TimerSpec(id=hostile, fire_at_ms=T0_MS + HOUR, source="ops", type="ops.x", scope="shop",
                           payload={"y": hostile})
        )  # fmt: skip
        event_id = (await a.client.get("/events")).json()["events"][0]["id"]
        paths = [
            "/ui/work", f"/ui/work?key={hostile}", f"/ui/work/{work_id}", "/ui/events", f"/ui/events/{event_id}",
            "/ui/timers", "/ui/timers/%3Cscript%3Ealert(1)%3C%2Fscript%3E", "/ui/schedules", "/ui/diagnostics",
            f"/ui/diagnostics?subject={hostile}",
        ]  # fmt: skip
        for path in paths:
            response = await a.client.get(path)
            assert response.status_code == 200, (path, response.text[:300])
            assert hostile not in response.text, path
            assert "<script>" not in response.text.replace(
                '<script src="/ui/static/console.js" defer></script>', ""
            )
            policy = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in policy
            assert "unsafe-inline" not in policy
            assert response.headers["X-Content-Type-Options"] == "nosniff"
        script = await a.client.get("/ui/static/console.js")
        assert script.headers["content-type"].startswith("text/javascript")


async def test_the_console_does_not_change_the_json_api(tmp_path: Path) -> None:
    """The list of ``GET /work`` stays in id order with its cursor (the console's order is its own)."""
    async with api(tmp_path, config=CONFIG) as a:
        for n in (1, 2, 3):
            await a.client.post("/events", json=order(n))
        await a.rt.wait_idle()
        ids = [w["id"] for w in (await a.client.get("/work")).json()["work"]]
        assert ids == sorted(ids)


async def test_a_work_page_reads_only_the_newest_of_a_long_history(tmp_path: Path) -> None:
    """docs/http-api.md: each console page is one bounded read, whatever the store holds. Catches a
    Work page that reads a standing Work's whole history to show its newest 200 (seen: 0.7 s and the
    server's memory for 50,000 routed Events); the API's ``history`` still answers it all."""
    async with api(tmp_path) as a:
        for n in range(203):
            await a.rt.publish(loom.EventIn(**order("x", delivery_id=f"o-{n}")))
        await a.rt.wait_idle()
        work = await a.rt.work_for_key("order/x")
        everything = await a.rt.history(work.id)
        assert len(everything.checkpoints) == 203
        newest = await a.rt.history(work.id, newest=2)
        assert newest.checkpoints == everything.checkpoints[-2:], "the newest, in commit order"
        asked: list[int | None] = []
        history = a.rt.history

        async def bounded(work_id: str, *, newest: int | None = None) -> loom.WorkHistory:
            asked.append(newest)
            return await history(work_id, newest=newest)

        a.rt.history = bounded  # type: ignore[method-assign]
        html = (await a.client.get(f"/ui/work/{work.id}")).text
        assert asked == [201], "one bounded read (one more than it shows: are there more?)"
        shown = Page(html).tables["history"]
        assert len(shown) == 200
        assert shown[0][0] == str(everything.checkpoints[-1].seq), "newest first"
        assert "the newest 200 (GET /work/{id} has them all)" in html
