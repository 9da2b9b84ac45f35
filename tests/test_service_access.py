"""Who may use ``loom serve`` (docs/http-api.md "Access"): bodies only as JSON, no state change from a
browser page of another origin, only the host names the server serves, the operator token off
loopback, and the HTTP details an attacker leans on (a repeated JSON member, a stalled body).

Each refusal is checked to leave the store byte for byte as it was.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from service_kit import JSON, Api, api, order, refusal
from typer.testing import CliRunner

import loom
from loom.service._access import Access
from loom.service._app import make_app
from loom.service.cli import app as cli
from loom.service.serve import run_http, serve

TOKEN = "s3cret-operator-token-0123456789"


async def _work_id(a: Api, n: int = 1) -> str:
    assert (await a.client.post("/events", json=order(n))).status_code == 201
    await a.rt.wait_idle()
    return str((await a.client.get(f"/work/by-key/order/{n}")).json()["work"]["id"])


# -- cross-site requests ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
     "multipart/form-data; boundary=x", "application/json; charset=latin-1"],
)  # fmt: skip
async def test_a_body_not_sent_as_json_is_415_and_publishes_nothing(
    tmp_path: Path, content_type: str | None
) -> None:
    """A page on any site can make a browser POST ``text/plain`` (or a form, or an untyped blob) here
    without asking first; such a body used to be read as JSON and published. Catches a check that
    only refuses a declared type, or only ``text/plain``."""
    async with api(tmp_path) as a:
        headers = {"Content-Type": content_type} if content_type is not None else {}
        response = await a.unchanged(a.client.post("/events", content=json.dumps(order(1)), headers=headers))
        refusal(response, 415, "unsupported_media_type", "Content-Type")
        ok = await a.client.post("/events", content=json.dumps(order(1)), headers=JSON)
        assert ok.status_code == 201, ok.text
        typed = {"Content-Type": "application/merge-patch+json; charset=utf-8"}
        assert (
            await a.client.post("/events", content=json.dumps(order(2)), headers=typed)
        ).status_code == 201


CROSS_SITE = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://localhost:9999"},  # another port of this host is another origin
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "same-origin", "Origin": "http://evil.example"},
]


@pytest.mark.parametrize("headers", CROSS_SITE, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()))
async def test_a_page_of_another_origin_can_neither_publish_nor_control(
    tmp_path: Path, headers: dict[str, str]
) -> None:
    """A cross-site page used to publish Events (starting shell attempts) and cancel Work. Catches a
    check of ``Origin`` alone (older browsers send only ``Sec-Fetch-Site`` on some requests, and the
    reverse), and one made only on routes that take a body (``cancel`` takes none)."""
    async with api(tmp_path) as a:
        work_id = await _work_id(a)
        for method, path, body in [
            ("POST", "/events", order(2)),
            ("POST", f"/work/{work_id}/cancel", None),
            ("POST", f"/work/{work_id}/hold", {"reason": "x"}),
            ("POST", "/timers", {"id": "t", "fire_at_ms": 0, "source": "s", "type": "a.b", "scope": "shop"}),
        ]:
            request = a.client.request(method, path, json=body, headers=headers)
            refusal(await a.unchanged(request), 403, "forbidden", "Origin")
        assert (
            await a.client.get(f"/work/{work_id}", headers=headers)
        ).status_code == 200  # reads are not state


async def test_the_servers_own_pages_and_clients_without_browser_headers_may_change_state(
    tmp_path: Path,
) -> None:
    async with api(tmp_path) as a:
        for n, headers in enumerate(
            [{}, {"Origin": "http://localhost"}, {"Sec-Fetch-Site": "same-origin", "Origin": "http://localhost"},
             {"Sec-Fetch-Site": "none"}]
        ):  # fmt: skip
            response = await a.client.post("/events", json=order(n), headers=headers)
            assert response.status_code == 201, (headers, response.text)


# -- host names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8440", "localhost.evil.example", "10.0.0.7"])
async def test_a_host_the_server_does_not_serve_is_421_for_every_route(tmp_path: Path, host: str) -> None:
    """A page whose DNS name is re-pointed at 127.0.0.1 (DNS rebinding) is same-origin to itself: its
    reads used to be answered. Catches a check only on the API (not the web view or metrics)."""
    async with api(tmp_path) as a:
        await _work_id(a)
        for path in ("/work", "/events", "/ui/work", "/metrics", "/healthz", "/nowhere"):
            refusal(await a.client.get(path, headers={"Host": host}), 421, "misdirected_request", "Host")
        response = await a.unchanged(a.client.post("/events", json=order(2), headers={"Host": host}))
        refusal(response, 421, "misdirected_request", "Host")


@pytest.mark.parametrize("host", ["localhost", "localhost:8440", "127.0.0.1:1", "[::1]:8440", "LOCALHOST."])
async def test_the_loopback_names_are_served(tmp_path: Path, host: str) -> None:
    async with api(tmp_path) as a:
        assert (await a.client.get("/work", headers={"Host": host})).status_code == 200


def test_the_hosts_served_follow_the_listen_address_and_allow_host() -> None:
    """Catches a server off loopback that serves any name, and an ``--allow-host`` that is ignored."""
    loopback = Access.for_listen("127.0.0.1")
    assert loopback.hosts == {"localhost", "127.0.0.1", "::1"}
    assert "10.1.2.3" in (Access.for_listen("10.1.2.3").hosts or ())
    assert "loom.internal" in (Access.for_listen("0.0.0.0", allow_hosts=["Loom.Internal:8440"]).hosts or ())
    assert "evil.example" not in (Access.for_listen("0.0.0.0").hosts or ())
    assert Access.for_listen("127.0.0.1", allow_hosts=["*"]).hosts is None


# -- the operator token -------------------------------------------------------------------------------


async def test_with_a_token_every_operator_route_needs_it(tmp_path: Path) -> None:
    """Catches a token checked on the API but not the web view or metrics, a token compared by prefix,
    and health checks or the toolbelt (which has its own lease tokens) locked out."""
    async with api(tmp_path) as a:
        work_id = await _work_id(a)
        lease = await a.rt.claim(work_id, owner="host")
        guarded = make_app(a.rt, access=Access(token=TOKEN))
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            for path in (
                "/work",
                f"/work/{work_id}",
                "/events",
                "/timers",
                "/diagnostics",
                "/metrics",
                "/ui/work",
            ):
                for auth in (None, "Bearer wrong", f"Bearer {TOKEN[:-1]}", f"Bearer {TOKEN}x", TOKEN):
                    response = await client.get(path, headers={"Authorization": auth} if auth else {})
                    refusal(response, 401, "unauthorized", "Authorization")
                    assert "WWW-Authenticate" in response.headers
                ok = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
                assert ok.status_code == 200, (path, ok.text)
            basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
            assert (
                await client.get("/ui/work", headers={"Authorization": f"Basic {basic}"})
            ).status_code == 200
            response = await a.unchanged(client.post("/events", json=order(2)))
            refusal(response, 401, "unauthorized", "Authorization")
            assert (await client.get("/healthz")).status_code == 200
            document = (await client.get("/openapi.json")).json()
            assert document["paths"]["/work"]["get"]["security"] == [{"operatorToken": []}]
            assert "401" in document["paths"]["/events"]["post"]["responses"]
            beat = await client.post(
                f"/executions/{lease.execution_id}/heartbeat",
                headers={"Authorization": f"Bearer {lease.token}"},
            )
            assert beat.status_code == 200, beat.text


async def test_serve_off_loopback_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    """``--listen 0.0.0.0`` used to serve every control and read to anyone who could reach it."""
    with pytest.raises(loom.InvalidRequest, match="token") as refused:
        await serve(tmp_path / "loom.db", None, "0.0.0.0:0", log_level="warning")
    assert refused.value.field == "token_file"
    assert not (tmp_path / "loom.db").exists()


def test_loom_serve_off_loopback_without_a_token_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loom", "serve", "--db", str(tmp_path / "x.db"), "--listen", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--token-file" in done.stderr
    assert "listening" not in done.stdout


@pytest.mark.parametrize("text", ["", "short", "has a space in it 0123456789"])
async def test_a_token_file_that_holds_no_usable_token_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "token"
    path.write_text(text)
    with pytest.raises(loom.InvalidRequest, match="token file") as refused:
        await serve(tmp_path / "loom.db", None, "0.0.0.0:0", log_level="warning", token_file=path)
    assert refused.value.field == "token_file"
    with pytest.raises(loom.InvalidRequest, match="cannot read"):
        await serve(
            tmp_path / "loom.db", None, "0.0.0.0:0", log_level="warning", token_file=tmp_path / "none"
        )


async def test_serve_with_a_token_serves_it_and_the_command_line_sends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real server off loopback: reads need the token; ``loom work list --token-file`` sends it."""
    monkeypatch.setenv("LOOM_URL", "")  # serve sets it for the processes it runs: restored after
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(
            partial(
                serve, tmp_path / "loom.db", None, "0.0.0.0:0", log_level="warning", token_file=token_file
            )
        )
        url = urls[0].replace("0.0.0.0", "127.0.0.1")
        async with httpx.AsyncClient(base_url=url) as client:
            refusal(await client.get("/work"), 401, "unauthorized", "Authorization")
            assert (
                await client.get("/work", headers={"Authorization": f"Bearer {TOKEN}"})
            ).status_code == 200
            assert (await client.get("/healthz")).status_code == 200

        def run(*args: str) -> Any:
            return CliRunner().invoke(cli, ["work", "list", "--url", url, *args])

        refused = await trio.to_thread.run_sync(run)
        assert refused.exit_code == 1
        assert "operator token" in refused.output
        listed = await trio.to_thread.run_sync(run, "--token-file", str(token_file))
        assert listed.exit_code == 0, listed.output
        assert "no work" in listed.output
        nursery.cancel_scope.cancel()


# -- HTTP details -------------------------------------------------------------------------------------


EVENT = '"source": "shop", "delivery_id": "d-1", "type": "order.placed", "scope": "shop"'


@pytest.mark.parametrize(
    ("raw", "field", "name"),
    [
        ('{"key": "order/1", ' + EVENT + ', "key": "order/2"}', "key", "key"),
        ("{" + EVENT + ', "payload": {"n": 1, "n": 2}}', "payload.n", "n"),
        (
            "{" + EVENT + ', "payload": {"items": [{"a": 1}, {"b": 1, "c": 1, "b": 2}]}}',
            "payload.items[1].b",
            "b",
        ),
    ],
)
async def test_a_member_named_twice_is_400_naming_it(tmp_path: Path, raw: str, field: str, name: str) -> None:
    """JSON does not say which of two values of one member counts; the last used to win silently (a
    proxy or a signature check that reads the first sees another request than loom)."""
    async with api(tmp_path) as a:
        response = await a.unchanged(a.client.post("/events", content=raw, headers=JSON))
        answer = refusal(response, 400, "invalid_request", field)
        assert f"member {name!r} appears more than once" in answer["message"]
        assert (
            await a.client.post("/events", content=raw.replace('"n": 2', '"m": 2'), headers=JSON)
        ).status_code in ((201,) if name == "n" else (400,))


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/events", "GET, HEAD, POST"),
        ("PUT", "/healthz", "GET, HEAD"),
        ("GET", "/events/x/y", None),  # a GET route: 404 for an unknown id, not 405
        ("PATCH", "/timers", "GET, HEAD, POST"),
    ],
)
async def test_405_names_every_method_the_path_takes(
    tmp_path: Path, method: str, path: str, allow: str | None
) -> None:
    """Catches a 405 without ``Allow``, and one naming only the first route that matched the path."""
    async with api(tmp_path) as a:
        response = await a.client.request(method, path)
        if allow is None:
            assert response.status_code == 404
            return
        refusal(response, 405, "method_not_allowed")
        assert response.headers["Allow"] == allow


async def test_an_action_path_read_with_the_wrong_method_is_405_not_a_missing_id(tmp_path: Path) -> None:
    """``GET /work/<id>/hold`` used to be read as the Work whose id is ``<id>/hold`` (404); the path is
    the hold action's, which takes POST. An id that holds such a suffix is still found."""
    async with api(tmp_path) as a:
        work_id = await _work_id(a)
        for method in ("GET", "PUT"):
            response = await a.client.request(method, f"/work/{work_id}/hold")
            refusal(response, 405, "method_not_allowed")
            assert response.headers["Allow"] == "POST"
        timer = {"id": "t/cancel", "fire_at_ms": 0, "source": "s", "type": "a.b", "scope": "shop"}
        assert (await a.client.post("/timers", json=timer)).status_code == 201
        assert (await a.client.get("/timers/t/cancel")).json()["timer"]["id"] == "t/cancel"
        refusal(await a.client.get("/timers/u/cancel"), 405, "method_not_allowed")


async def test_a_whole_number_written_with_a_fraction_is_an_integer(tmp_path: Path) -> None:
    """JSON has one number type, and the document's JSON Schema reads ``1.0`` as the integer 1: it was
    refused as "not an integer"."""
    async with api(tmp_path) as a:
        timer = {"id": "t", "fire_at_ms": 1.767e12, "source": "s", "type": "a.b", "scope": "shop"}
        armed = await a.client.post("/timers", json=timer)
        assert armed.status_code == 201, armed.text
        assert armed.json()["fire_at_ms"] == 1_767_000_000_000
        refusal(
            await a.client.post("/timers/t/cancel", json={"revision": 1.5}),
            400,
            "invalid_request",
            "revision",
        )
        cancelled = await a.client.post("/timers/t/cancel", json={"revision": 1.0})
        assert cancelled.json()["state"] == "cancelled", cancelled.text


async def test_an_empty_filter_is_refused_by_the_api_and_means_any_in_the_web_form(tmp_path: Path) -> None:
    """``?scope=`` was read as no filter though the document says a scope is a non-empty path; the web
    view's own form sends its empty fields, and there they mean "any"."""
    async with api(tmp_path) as a:
        for path, field in [
            ("/events", "type"),
            ("/work", "scope"),
            ("/timers", "state"),
            ("/diagnostics", "kind"),
        ]:
            refusal(await a.client.get(path, params={field: ""}), 400, "invalid_request", field)
        assert (
            await a.client.get("/ui/work", params={"scope": "", "state": "", "after": ""})
        ).status_code == 200


@pytest.mark.parametrize("seconds", [0, -1, 3601, True])
async def test_a_read_timeout_that_is_no_timeout_is_refused(tmp_path: Path, seconds: Any) -> None:
    with pytest.raises(loom.InvalidRequest, match="read_timeout") as refused:
        await serve(tmp_path / "loom.db", None, "127.0.0.1:0", log_level="warning", read_timeout=seconds)
    assert refused.value.field == "read_timeout"
    assert not (tmp_path / "loom.db").exists()


async def test_a_stalled_request_body_is_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A client that sends part of a body and then nothing used to hold its connection (and a file
    descriptor) for ever. The server closes it after its read timeout, logs no error for it, and goes
    on serving."""
    caplog.set_level(logging.WARNING)
    async with api(tmp_path) as a, trio.open_nursery() as nursery:
        urls = await nursery.start(partial(run_http, a.service.app, "127.0.0.1:0", read_timeout=0.2))
        port = int(urls[0].rsplit(":", 1)[1])
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        body = json.dumps(order(1)).encode()
        head = f"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        await stream.send_all(head.encode() + body[:10])
        with trio.fail_after(30):  # a deadline for a hang, never a wait for time to pass
            while await stream.receive_some(65536):
                pass
        await stream.aclose()
        assert await a.rt.events() == []
        async with httpx.AsyncClient(base_url=urls[0]) as client:
            assert (await client.post("/events", json=order(1))).status_code == 201
        nursery.cancel_scope.cancel()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
