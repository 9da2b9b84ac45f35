"""The web console in headless Chromium (tests/browser.py), against a real HTTP server with an operator
token: the browser is asked for the token once, a change made elsewhere appears without a reload, the
action buttons are clicked (a destructive one asks first, and a dismissed confirmation does nothing),
and times are shown in the browser's time zone. Screenshots of every page are saved in
``test-output/console/`` (``LOOM_TEST_OUTPUT`` moves it).

Skipped only where Chromium is missing and ``CI`` is not set; in CI a missing Chromium fails it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from browser import Tab, chromium, open_browser, output_dir
from service_kit import order

import loom
from loom.plugins.python_executor import PythonExecutor
from loom.service._access import Access
from loom.service.serve import open_service, run_http
from loom.testing import T0_MS

TOKEN = "console-operator-token-0123"
CONFIG = loom.Config.from_toml(
    """
[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true

[scopes.jobs.bindings.worker]
executor = "python"
config = { function = "job" }
capabilities = ["interrupt"]

[[scopes.jobs.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
binding = "worker"
"""
)


@pytest.fixture(autouse=True)
def server_in_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The server renders in UTC and the browser lives in Asia/Kolkata: a time shown with +05:30 was
    rewritten by the page's script in the browser's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def job_executor() -> PythonExecutor:
    executor = PythonExecutor()

    @executor.function("job")
    async def job(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> loom.Completed | loom.Failed:
        key = request.trigger.key if request.trigger else None
        if key == "job/flaky" and request.attempt == 1:
            return loom.Failed(error="disk <full> on attempt 1")
        if key == "job/long":
            await trio.sleep_forever()  # until the operator interrupts it
        return loom.Completed()

    return executor


def job(key: str) -> dict[str, object]:
    return {"source": "ci", "delivery_id": key, "type": "job.run", "scope": "jobs", "key": key}


async def _close_at_exit(client: httpx.AsyncClient) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()


async def rows(tab: Tab, table: str) -> int:
    return int(await tab.evaluate(f"document.querySelectorAll('#{table} tbody tr').length"))


@pytest.mark.timeout(180)
async def test_the_console_in_chromium_is_live_and_its_actions_work(tmp_path: Path) -> None:
    chromium()
    shots = output_dir("console")
    clock = loom.ManualClock(start_ms=T0_MS)
    access = Access.for_listen("127.0.0.1", token=TOKEN)
    async with (
        open_service(
            str(tmp_path / "console.db"),
            config=CONFIG,
            test_clock=clock,
            plugins=(job_executor(),),
            load_entry_points=False,
            access=access,
        ) as service,
        trio.open_nursery() as nursery,
    ):
        [url] = await nursery.start(partial(run_http, service.app, "127.0.0.1:0"))
        rt = service.runtime
        api = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"})
        nursery.start_soon(_close_at_exit, api)
        for n in (1, 2):
            assert (await api.post("/events", json=order(n))).status_code == 201
        for key in ("job/flaky", "job/long"):
            assert (await api.post("/events", json=job(key))).status_code == 201
        await rt.wait_idle()
        flaky = (await rt.work_for_key("job/flaky")).id
        long = (await rt.work_for_key("job/long")).id
        one = (await rt.work_for_key("order/1")).id

        async with open_browser(
            tmp_path / "profile", credentials=("operator", TOKEN), timezone="Asia/Kolkata"
        ) as tab:
            # the list, live: a new Work appears without a reload
            await tab.goto(f"{url}/ui/work")
            await tab.until("document.body.dataset.live === 'on' && document.body.dataset.refreshes", "live")
            assert tab._browser.auth_challenges >= 1, "the browser was asked for the operator token"
            assert await rows(tab, "work") == 4
            shown = await tab.text("#work tbody time")
            assert "+05:30" in (shown or ""), f"local time in the browser's zone: {shown}"
            await tab.evaluate("window.stillThisPage = true")
            assert (await api.post("/events", json=order(3))).status_code == 201
            await tab.until("document.querySelectorAll('#work tbody tr').length === 5", "the new Work")
            assert await tab.evaluate("window.stillThisPage === true"), "updated in place, not reloaded"
            assert "ready 4running 1" in (await tab.text("#counts") or "")
            await tab.screenshot(shots / "works.png")

            # one Work: hold with a reason, release, then a cancel dismissed and a cancel confirmed
            await tab.goto(f"{url}/ui/work/{one}")
            await tab.until("document.body.dataset.live === 'on'", "live")
            await tab.click("button[data-action=hold]")
            assert "needs a reason" in (await tab.text("#flash") or ""), "a hold without a reason is refused"
            await tab.type("#reason", "stock <b>check</b>")
            await tab.click("button[data-action=hold]")
            await tab.until("document.querySelector('#hold .held') !== null", "the hold")
            assert await tab.text("#hold") == "held: stock <b>check</b>"
            assert (await rt.work(one)).hold_reason == "stock <b>check</b>"
            await tab.screenshot(shots / "work-held.png")
            await tab.click("button[data-action=release]")
            await tab.until("document.querySelector('#hold').textContent.trim() === 'not held'", "release")

            tab.answer_dialogs = False
            await tab.click("button[data-action=cancel]")
            assert len(tab.dialogs) == 1
            assert "terminal" in tab.dialogs[0]
            assert (await rt.work(one)).state == loom.WorkState.READY, "a dismissed confirmation does nothing"
            tab.answer_dialogs = True
            await tab.click("button[data-action=cancel]")
            await tab.until("document.querySelector('#state').textContent.trim() === 'cancelled'", "cancel")
            assert (await rt.work(one)).state == loom.WorkState.CANCELLED
            assert await tab.text("#actions") == "No action applies: this Work is over."

            # a running attempt: interrupt (confirmed); the Work starts its next attempt
            await tab.goto(f"{url}/ui/work/{long}")
            await tab.until("document.querySelector('button[data-action=interrupt]')", "a running attempt")
            await tab.click("button[data-action=interrupt]")
            await tab.until(
                "[...document.querySelectorAll('#attempts tbody tr')].some("
                "r => r.textContent.includes('interrupted'))",
                "the interrupted attempt",
            )
            assert "Interrupt the running attempt" in tab.dialogs[-1]

            # a failed attempt in its retry backoff: its last error, and retry now
            await tab.goto(f"{url}/ui/work/{flaky}")
            error = await tab.text("#attempts tbody tr td:nth-child(7)")
            assert error == "disk <full> on attempt 1"
            await tab.click("button[data-action=retry]")
            await tab.until(
                "document.querySelector('#state').textContent.trim() === 'completed'", "the retry"
            )
            await tab.screenshot(shots / "work-retried.png")

            # the other pages, each with what it is for
            await api.post("/timers", json={"id": "remind", "fire_at_ms": T0_MS + 600_000, "source": "ops",
                                             "type": "ops.remind", "scope": "shop"})  # fmt: skip
            for name, selector in (
                ("events", "#events"),
                ("timers", "#timers"),
                ("schedules", "#schedules"),
                ("diagnostics", "#diagnostics"),
            ):
                await tab.goto(f"{url}/ui/{name}")
                await tab.until(f"document.querySelector('{selector}')", name)
                await tab.screenshot(shots / f"{name}.png")
            await tab.goto(f"{url}/ui/timers")
            assert "in 10 min" in (await tab.text("#timers") or "")
            await tab.click("button[data-action=cancel_timer]")
            await tab.until(
                "document.querySelector('#timers').textContent.includes('No armed timers')", "cancel"
            )
            event = (await api.get("/events", params={"limit": 1})).json()["events"][0]["id"]
            await tab.goto(f"{url}/ui/events/{event}")
            await tab.until("document.querySelector('pre.json')", "the payload")
            await tab.screenshot(shots / "event.png")
            assert tab.console == [], f"the pages logged errors: {tab.console}"
        nursery.cancel_scope.cancel()
    assert {"works.png", "work-held.png", "event.png"} <= {p.name for p in shots.glob("*.png")}
