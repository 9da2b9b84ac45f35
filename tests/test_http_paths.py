"""What a request's path may hold, and what the service makes of it (docs/http-api.md "Errors",
docs/operations.md "Logs"): a control character in a path or a query never adds a line to the access
log (each request is one access line), and an id in a path that holds a newline is refused like any
other control character (400 naming the parameter, nothing changed), never cut short into another id.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from service_kit import Api, api, order, refusal, start_server

from loom.service._logs import TEXT_FORMAT, AccessLog
from loom.testing import T0_MS

ACCESS = "loom.service.access"


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The access log as ``loom serve`` writes it as text (`TEXT_FORMAT`), split into lines."""
    formatter = logging.Formatter(TEXT_FORMAT)
    text = "\n".join(formatter.format(r) for r in caplog.records if r.name == ACCESS)
    return text.splitlines()


# -- the access log ---------------------------------------------------------------------------------

HOSTILE_PATHS = [
    ("/work/x%0a2026-01-01%2000:00:00,000%20ERROR%20loom.service:%20FORGED", "/work/x\\n2026-01-01 00:00:00,000 ERROR loom.service: FORGED"),
    ("/work/a%0db", "/work/a\\rb"),
    ("/work/a%00b", "/work/a\\x00b"),
    ("/nowhere%0a%0d%00%1b", "/nowhere\\n\\r\\x00\\x1b"),
    ("/work/a%E2%80%A8b%C2%85c", "/work/a\\u2028b\\x85c"),  # what str.splitlines() also ends a line at
]  # fmt: skip


@pytest.mark.parametrize(("path", "logged"), HOSTILE_PATHS)
async def test_a_control_character_in_the_path_is_escaped_in_one_access_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, path: str, logged: str
) -> None:
    """Catches an access log that writes the decoded path raw (a ``%0a`` forges a second line, a
    ``%00`` writes a NUL), and one that escapes only the newline (``\\r``, NUL, ESC, the Unicode line
    separators pass)."""
    caplog.set_level(logging.INFO, logger=ACCESS)
    async with api(tmp_path, actors=False) as a:
        await a.client.get(path)
    lines = _access_lines(caplog)
    assert len(lines) == 1, lines
    assert f'"GET {logged} HTTP/1.1" ' in lines[0], lines[0]


async def _answer_404(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def _nothing_more(message: MutableMapping[str, Any]) -> None:
    pass


@pytest.mark.parametrize(
    ("query", "logged"),
    [(b"q=a\nb", "q=a\\nb"), (b"q=\r\x00", "q=\\r\\x00"), (b'q="x\\', 'q=\\"x\\\\')],
)
async def test_a_control_character_in_the_query_string_is_escaped_in_one_access_line(
    caplog: pytest.LogCaptureFixture, query: bytes, logged: str
) -> None:
    """A query string reaches the app as the bytes sent; HTTP/1.1 servers refuse raw control bytes in
    a request target, but the access log does not count on its server for that. Catches a log that
    escapes the path but writes the query raw, and one that leaves a ``"`` (which would end the quoted
    request line early) or a ``\\`` (which would make an escape ambiguous) as it is."""
    caplog.set_level(logging.INFO, logger=ACCESS)
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/work",
        "query_string": query,
        "http_version": "1.1",
        "client": ("127.0.0.1", 5000),
    }
    await AccessLog(_answer_404)(scope, None, _nothing_more)
    lines = _access_lines(caplog)
    assert len(lines) == 1, lines
    assert f'127.0.0.1:5000 "GET /work?{logged} HTTP/1.1" 404 2 ' in lines[0], lines[0]


async def test_a_served_request_cannot_forge_a_line_of_the_server_log(tmp_path: Path) -> None:
    """The request of the report, against a real ``loom serve``: catches an access line that Hypercorn
    decodes and the text log writes with its newline, so that the server's log shows an ``ERROR``
    line no one logged, and a NUL written raw to the log."""
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path / "forge.db"))
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.get(f"{HOSTILE_PATHS[0][0]}?q=%0a%00")
            await client.get("/events/ev%00%0d")
    finally:
        await trio.to_thread.run_sync(server.stop)
    text = await trio.Path(server.log).read_text()
    assert "\x00" not in text
    assert [line for line in text.splitlines() if line.startswith("2026-01-01")] == []
    access = [line for line in text.splitlines() if " INFO loom.service.access: " in line]
    assert len([line for line in access if "FORGED" in line]) == 1, access
    assert any('"GET /events/ev\\x00\\r HTTP/1.1" 400 ' in line for line in access), access
    assert len(access) == 2, access


# -- ids holding a newline --------------------------------------------------------------------------


async def _objects(a: Api) -> dict[str, str]:
    """A Work (with the key ``order/1``), its Event and a timer, for requests to name with a newline
    after their ids: a route that drops the newline finds them, and answers (or acts on them)."""
    event = (await a.client.post("/events", json=order(1))).json()
    await a.rt.wait_idle()
    work = (await a.client.get("/work/by-key/order/1")).json()["work"]
    timer = {
        "id": "t1",
        "fire_at_ms": T0_MS + 3_600_000,
        "source": "ops",
        "type": "x.remind",
        "scope": "shop",
    }
    assert (await a.client.post("/timers", json=timer)).status_code == 201
    return {"work": work["id"], "event": event["id"], "key": "order/1", "timer": "t1", "execution": "ex_1"}


ID_ROUTES = [
    ("GET", "/work/{work}", None, "work_id"),
    ("GET", "/work/{work}/result", None, "work_id"),
    ("GET", "/work/{work}/attempts/1/logs", None, "work_id"),
    ("POST", "/work/{work}/hold", {"reason": "why"}, "work_id"),
    ("POST", "/work/{work}/release", None, "work_id"),
    ("POST", "/work/{work}/cancel", None, "work_id"),
    ("POST", "/work/{work}/interrupt", None, "work_id"),
    ("POST", "/work/{work}/retry", None, "work_id"),
    ("POST", "/work/{work}/replay", {"event_id": "{event}"}, "work_id"),
    ("GET", "/work/by-key/{key}", None, "key"),
    ("GET", "/events/{event}", None, "event_id"),
    ("GET", "/timers/{timer}", None, "timer_id"),
    ("POST", "/timers/{timer}/cancel", {"revision": 1}, "timer_id"),
    ("POST", "/executions/{execution}/heartbeat", None, "execution_id"),
    ("POST", "/executions/{execution}/complete", {"outcome": "completed"}, "execution_id"),
]


@pytest.mark.parametrize("where", ["end", "middle"])
@pytest.mark.parametrize(("method", "template", "body", "field"), ID_ROUTES)
async def test_an_id_holding_a_newline_is_refused_naming_it(
    tmp_path: Path, method: str, template: str, body: dict[str, Any] | None, field: str, where: str
) -> None:
    """Catches routes matched by a regex ending in ``$`` (which matches before a final newline) with
    ``{id:path}`` read as ``.*`` (which stops at a newline): ``/timers/t1%0a`` answered timer ``t1``,
    ``POST /work/wk_..%0a/hold`` held that Work, and ``/work/wk%0ax`` was no route at all, where a tab
    or a carriage return in the same place is refused as a control character."""
    async with api(tmp_path) as a:
        ids = await _objects(a)
        named = {
            name: f"{value}%0A" if where == "end" else f"{value[:2]}%0A{value[2:]}"
            for name, value in ids.items()
        }
        path = template.format(**named)
        json = {k: v.format(**ids) if isinstance(v, str) else v for k, v in body.items()} if body else None
        headers = {"Authorization": "Bearer token-of-no-lease"} if "/executions/" in path else {}
        response = await a.unchanged(a.client.request(method, path, json=json, headers=headers))
        message = refusal(response, 400, "invalid_request", field)["message"]
        assert "control characters" in message, message


async def test_an_unknown_route_is_named_as_requested_with_its_newline_escaped(tmp_path: Path) -> None:
    """Catches a 404 (or 405) naming ``request.url.path``, from which the URL parser drops tabs and
    newlines: ``/nowhere%0ahere`` was answered as ``no route for /nowherehere``, a path no one asked
    for."""
    async with api(tmp_path, actors=False) as a:
        missing = refusal(await a.client.get("/nowhere%0Ahere%09x"), 404, "not_found")
        assert missing["message"] == "no route for '/nowhere\\nhere\\tx'", missing
        wrong = refusal(await a.client.put("/events/ev%0Ax"), 405, "method_not_allowed")
        assert wrong["message"] == "PUT is not allowed on '/events/ev\\nx'; it takes GET, HEAD", wrong
