"""Headless Chromium for the web console's tests, driven over the DevTools protocol through a pipe
(``--remote-debugging-pipe``: no WebDriver, no extra package).

`open_browser` starts Chromium and yields a `Tab`: ``goto`` a page, ``evaluate`` script in it, ``click``
what a selector finds, ``until`` a condition in the page holds (each check is a round trip to the
browser, bounded by a deadline: no fixed sleeps), and ``screenshot`` it to a PNG. Dialogs the page opens
(``confirm``) are answered as ``Tab.answer_dialogs`` says and recorded; HTTP Basic challenges are
answered with ``credentials`` and counted, as a person typing the password once would be.
"""

from __future__ import annotations

import base64
import fcntl
import itertools
import json
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
    "--remote-debugging-pipe",
)


def chromium() -> str:
    """The Chromium to drive; skipped where none is installed, unless ``CI`` is set (then it fails)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium is missing in CI: install it (apt-get install -y chromium)")
    pytest.skip("chromium is not installed (apt-get install -y chromium)")


def output_dir(name: str) -> Path:
    """Where a test's screenshots go: ``test-output/<name>/`` in the repository (``LOOM_TEST_OUTPUT``
    moves it), kept after the run."""
    root = Path(os.environ.get("LOOM_TEST_OUTPUT", Path(__file__).resolve().parent.parent / "test-output"))
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class BrowserError(AssertionError):
    pass


@attrs.define
class Tab:
    """One page target of the browser, attached through a session."""

    _browser: _Browser
    session: str
    answer_dialogs: bool = True
    """What a ``confirm`` the page opens is answered: accept (``True``) or dismiss."""
    dialogs: list[str] = attrs.field(factory=list)
    """The message of every dialog the page opened, in order."""
    console: list[str] = attrs.field(factory=list)
    """What the page logged as errors (uncaught exceptions, console.error)."""

    async def command(self, method: str, **params: Any) -> dict[str, Any]:
        return await self._browser.command(method, params, session=self.session)

    async def goto(self, url: str) -> None:
        await self.command("Page.navigate", url=url)
        await self.until("document.readyState === 'complete' && !!document.body", f"{url} to load")

    async def evaluate(self, expression: str) -> Any:
        answer = await self.command(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression!r} threw: {json.dumps(answer['exceptionDetails'])[:800]}")
        return answer["result"].get("value")

    async def click(self, selector: str) -> None:
        found = await self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " if (!el) return false; el.click(); return true; })()"
        )
        if not found:
            raise BrowserError(f"nothing on the page matches {selector!r}")

    async def type(self, selector: str, value: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).value = {json.dumps(value)}")

    async def text(self, selector: str) -> str | None:
        found = await self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " return el ? el.textContent.replace(/\\s+/g, ' ').trim() : null; })()"
        )
        return None if found is None else str(found)

    async def until(self, condition: str, what: str, *, seconds: float = 20.0) -> Any:
        """Evaluate ``condition`` until it is truthy; fail after ``seconds`` of real time."""
        # the page checks every 25 ms and answers once it holds: one round trip
        script = (
            "new Promise((resolve) => { const check = () => { let value; try { value = ("
            + condition
            + "); } catch (e) { value = undefined; } if (value) resolve(value);"
            " else setTimeout(check, 25); }; check(); })"
        )
        with trio.move_on_after(seconds):
            return await self.evaluate(script)
        raise BrowserError(f"timed out after {seconds}s waiting for {what} ({condition})")

    async def screenshot(self, path: Path) -> Path:
        answer = await self.command("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await trio.Path(path).write_bytes(base64.b64decode(answer["data"]))
        return path


@attrs.define
class _Browser:
    send: trio.lowlevel.FdStream
    receive: trio.lowlevel.FdStream
    nursery: trio.Nursery
    credentials: tuple[str, str] | None = None
    auth_challenges: int = 0
    _ids: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1))
    _waiting: dict[int, tuple[trio.Event, list[dict[str, Any]]]] = attrs.field(factory=dict)
    tabs: dict[str, Tab] = attrs.field(factory=dict)
    _sending: trio.Lock = attrs.field(factory=trio.Lock)

    async def command(
        self, method: str, params: dict[str, Any], session: str | None = None
    ) -> dict[str, Any]:
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        done = trio.Event()
        box: list[dict[str, Any]] = []
        self._waiting[number] = (done, box)
        async with self._sending:
            await self.send.send_all(json.dumps(message).encode() + b"\0")
        with trio.fail_after(60):
            await done.wait()
        answer = box[0]
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})  # type: ignore[no-any-return]

    async def read(self) -> None:
        buffer = b""
        while True:
            chunk = await self.receive.receive_some(1 << 16)
            if not chunk:
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                self.dispatch(json.loads(raw))

    def dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            waiting = self._waiting.pop(message["id"], None)
            if waiting is not None:
                waiting[1].append(message)
                waiting[0].set()
            return
        method = message.get("method")
        params = message.get("params", {})
        tab = self.tabs.get(message.get("sessionId", ""))
        if tab is None:
            return
        if method == "Page.javascriptDialogOpening":
            tab.dialogs.append(params.get("message", ""))
            self.nursery.start_soon(
                partial_command(tab, "Page.handleJavaScriptDialog", accept=tab.answer_dialogs)
            )
        elif method == "Fetch.requestPaused":
            self.nursery.start_soon(
                partial_command(tab, "Fetch.continueRequest", requestId=params["requestId"])
            )
        elif method == "Fetch.authRequired":
            self.auth_challenges += 1
            response: dict[str, Any] = {"response": "CancelAuth"}
            if self.credentials is not None:
                user, password = self.credentials
                response = {"response": "ProvideCredentials", "username": user, "password": password}
            self.nursery.start_soon(
                partial_command(tab, "Fetch.continueWithAuth", requestId=params["requestId"],
                                authChallengeResponse=response)
            )  # fmt: skip
        elif method == "Runtime.exceptionThrown":
            tab.console.append(json.dumps(params.get("exceptionDetails", {}))[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            tab.console.append(
                " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", []))
            )


GONE = "Invalid InterceptionId"
"""Chromium's answer to continuing a paused request the page has given up meanwhile (it navigated away,
or the fetch was aborted): there is nothing left to continue."""


def partial_command(tab: Tab, method: str, **params: Any) -> Any:
    async def run() -> None:
        try:
            await tab.command(method, **params)
        except BrowserError as exc:
            if GONE not in str(exc):
                raise

    return run


@asynccontextmanager
async def open_browser(
    profile: Path, *, credentials: tuple[str, str] | None = None, timezone: str | None = None
) -> AsyncIterator[Tab]:
    """Chromium with a fresh profile in ``profile`` and one tab. ``credentials``: the user and password
    HTTP Basic challenges are answered with; ``timezone``: the browser's time zone (``TZ``)."""
    binary = chromium()
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    for low in (to_browser_r, from_browser_w):  # moved above 10: the child's 3 and 4 are its own
        high = fcntl.fcntl(low, fcntl.F_DUPFD, 10)
        os.close(low)
        if low == to_browser_r:
            to_browser_r = high
        else:
            from_browser_w = high
    env = {**os.environ, **({"TZ": timezone} if timezone else {})}
    pid = os.posix_spawn(  # noqa: ASYNC221  # returns at once: the browser runs beside the test
        binary,
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        env,
        file_actions=[
            (os.POSIX_SPAWN_DUP2, to_browser_r, 3),
            (os.POSIX_SPAWN_DUP2, from_browser_w, 4),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
        ],
    )
    os.close(to_browser_r)
    os.close(from_browser_w)
    try:
        async with trio.open_nursery() as nursery:
            browser = _Browser(
                send=trio.lowlevel.FdStream(to_browser_w),
                receive=trio.lowlevel.FdStream(from_browser_r),
                nursery=nursery,
                credentials=credentials,
            )
            nursery.start_soon(browser.read)
            target = await browser.command("Target.createTarget", {"url": "about:blank"})
            attached = await browser.command(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            tab = Tab(browser, attached["sessionId"])
            browser.tabs[tab.session] = tab
            await tab.command("Page.enable")
            await tab.command("Runtime.enable")
            if credentials is not None:
                await tab.command("Fetch.enable", handleAuthRequests=True, patterns=[{"urlPattern": "*"}])
            yield tab
            nursery.cancel_scope.cancel()
    finally:
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            pass
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(os.waitpid, pid, 0)
