"""The ``loom`` command line: the commands that talk to a running server (against a small fake HTTP
server that records each request and answers as the API does), ``serve``'s argument checks, the
version, and one-line user errors (never a traceback)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import loom
from loom.service._render import humanize, iso
from loom.service.cli import app

T9 = 1_767_258_000_000  # 2026-01-01T09:00:00Z

WORK = {
    "id": "wk_1",
    "scope": "shop",
    "kind": None,
    "state": "ready",
    "keys": ["order/1"],
    "held": True,
    "hold_reason": "waiting for stock",
    "attempts": 2,
    "created_at_ms": T9,
    "pending_inputs": [],
}
WORK_VIEW = {
    "work": WORK, "wait": None, "pending_inputs": [], "waits": [], "timers": [],
    "history": {"checkpoints": [{"event_id": "ev_1", "status": "routed", "route": "orders", "at_ms": T9 + 1500}],
                "executions": []},
}  # fmt: skip
NOT_FOUND = {"error": "not_found", "field": "work_id", "message": "no work with id 'nope'"}


class FakeServer:
    """Answers ``(method, path)`` with a canned ``(status, body)``; records every request."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], tuple[int, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                fake.requests.append((self.command, self.path, json.loads(raw) if raw else None))
                path = self.path.split("?", 1)[0]
                status, body = fake.answers.get((self.command, path), (404, NOT_FOUND))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def loom_cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def one_line_error(result: Any, text: str) -> None:
    """A user error: exit status 1, one line on stderr saying ``text``, no traceback."""
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("loom: ")
    assert text in result.stderr
    assert "Traceback" not in result.output


def test_version() -> None:
    result = loom_cli("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"loom {loom.__version__}"


def test_iso_times_are_utc_iso_8601() -> None:
    assert iso(T9) == "2026-01-01T09:00:00Z"
    assert iso(T9 + 1) == "2026-01-01T09:00:00.001Z"
    assert humanize({"fire_at_ms": T9, "budget_ms": 5000}) == {
        "fire_at": "2026-01-01T09:00:00Z",
        "budget_ms": 5000,
    }


# -- talking to a server -------------------------------------------------------------------------------


def test_work_get_shows_the_work_with_iso_times_not_epoch_ms(server: FakeServer) -> None:
    """Catches a renderer that prints raw Unix milliseconds."""
    server.answers["GET", "/work/wk_1"] = (200, WORK_VIEW)
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert "held      yes: waiting for stock" in result.stdout
    assert "2026-01-01T09:00:00Z" in result.stdout
    assert "2026-01-01T09:00:01.500Z  ev_1  routed by route orders" in result.stdout
    assert str(T9) not in result.stdout
    assert server.requests == [("GET", "/work/wk_1", None)]


def test_work_get_json_prints_the_servers_answer_as_it_is(server: FakeServer) -> None:
    server.answers["GET", "/work/wk_1"] = (200, WORK_VIEW)
    result = loom_cli("work", "get", "wk_1", "--url", server.url, "--json")
    assert json.loads(result.stdout) == WORK_VIEW


def test_work_list_asks_with_its_filters_and_prints_a_table(server: FakeServer) -> None:
    server.answers["GET", "/work"] = (200, {"work": [WORK, {**WORK, "id": "wk_2", "held": False}]})
    result = loom_cli("work", "list", "--scope", "shop", "--state", "ready", "--url", server.url)
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.strip().splitlines()
    assert header.split() == ["ID", "STATE", "SCOPE", "KIND", "ATTEMPTS", "HELD", "KEYS"]
    assert first.split() == ["wk_1", "ready", "shop", "-", "2", "yes", "order/1"]
    assert second.split()[0] == "wk_2"
    assert server.requests == [("GET", "/work?scope=shop&state=ready", None)]


@pytest.mark.parametrize(
    ("args", "path", "body"),
    [
        (["hold", "wk_1", "--reason", "stock"], "/work/wk_1/hold", {"reason": "stock"}),
        (["release", "wk_1"], "/work/wk_1/release", {}),
        (["cancel", "wk_1"], "/work/wk_1/cancel", {}),
        (["interrupt", "wk_1", "--reason", "stuck"], "/work/wk_1/interrupt", {"reason": "stuck"}),
        (["retry", "wk_1"], "/work/wk_1/retry", {}),
        (
            ["replay", "wk_1", "--event", "ev_9", "--reason", "fixed"],
            "/work/wk_1/replay",
            {"event_id": "ev_9", "reason": "fixed"},
        ),
        (["get", "a/b c"], "/work/a%2Fb%20c", None),
    ],
)
def test_each_work_command_calls_its_route(server: FakeServer, args: list[str], path: str, body: Any) -> None:
    """Catches a command posting to the wrong route, or an id not quoted into the path."""
    server.answers["GET" if body is None else "POST", path] = (200, {"id": "wk_1", "state": "ready"})
    result = loom_cli("work", *args, "--url", server.url)
    assert result.exit_code == 0, result.output
    assert server.requests == [("GET" if body is None else "POST", path, body)]


def test_each_control_says_what_it_did(server: FakeServer) -> None:
    server.answers["POST", "/work/wk_1/hold"] = (200, {**WORK, "state": "ready"})
    server.answers["POST", "/work/wk_1/interrupt"] = (
        200,
        {"id": "in_1", "kind": "interrupt", "status": "pending"},
    )
    server.answers["POST", "/work/wk_1/retry"] = (
        200,
        {"id": "ev_5", "seq": 5, "type": "core.retry.requested"},
    )
    said = [loom_cli("work", *args, "wk_1", "--url", server.url).stdout.strip()
            for args in (["hold", "--reason", "stock"], ["interrupt"], ["retry"])]  # fmt: skip
    assert said == [
        "hold: work wk_1 is ready, held: waiting for stock",
        "interrupt: work wk_1 interrupt pending",
        "retry: work wk_1 requested as event ev_5",
    ]


def test_an_unknown_work_is_one_line_on_stderr(server: FakeServer) -> None:
    """Catches a CLI that shows a traceback or the raw HTTP error for a server's refusal."""
    result = loom_cli("work", "get", "nope", "--url", server.url)
    one_line_error(result, "no work with id 'nope'")


def test_a_refusal_names_the_field(server: FakeServer) -> None:
    server.answers["POST", "/work/wk_1/hold"] = (
        400,
        {"error": "invalid", "field": "reason", "message": "must not be empty"},
    )
    one_line_error(
        loom_cli("work", "hold", "wk_1", "--reason", " ", "--url", server.url), "reason: must not be empty"
    )


def test_an_unreachable_server_is_one_line_on_stderr() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once it is closed
    result = loom_cli("work", "list", "--url", f"http://127.0.0.1:{port}")
    one_line_error(result, f"cannot reach the loom server at http://127.0.0.1:{port}")


def test_a_bad_url_is_one_line_on_stderr() -> None:
    one_line_error(loom_cli("timers", "--url", "127.0.0.1:8440"), "--url must be an http:// address")


def test_send_posts_the_event_and_says_it_is_accepted(server: FakeServer) -> None:
    routing = {
        "status": "routed",
        "route": "orders",
        "route_scope": "shop",
        "work_id": "wk_1",
        "reason": None,
    }
    accepted = {"id": "ev_1", "seq": 7, "accepted_at_ms": T9, "duplicate": False, "routing": routing}
    server.answers["POST", "/events"] = (201, accepted)
    result = loom_cli(
        "send", "order.placed", "--scope", "shop", "--key", "order/1", "--payload", '{"total": 42}',
        "--delivery-id", "d-1", "--url", server.url,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert server.requests == [("POST", "/events?wait=2", {
        "source": "cli", "delivery_id": "d-1", "type": "order.placed", "scope": "shop", "key": "order/1",
        "payload": {"total": 42},
    })]  # fmt: skip
    assert result.stdout.startswith("accepted: event ev_1 seq 7 at 2026-01-01T09:00:00Z")
    assert result.stdout.splitlines()[1] == "routed by route 'orders' (scope shop) to work wk_1"


@pytest.mark.parametrize(
    ("routing", "said"),
    [
        ({"status": "unmatched", "reason": "no route matched"}, "matched no route in its scope"),
        ({"status": "drop", "route": "bots", "reason": "bots"}, "dropped by route 'bots': bots"),
        ({"status": "pending"}, "accepted, not routed yet"),
    ],
)
def test_send_says_when_its_event_matched_no_route(server: FakeServer, routing: Any, said: str) -> None:
    """Catches a send that says only "accepted" for an Event nothing will act on."""
    server.answers["POST", "/events"] = (
        201,
        {"id": "ev_1", "seq": 1, "duplicate": False, "routing": routing},
    )
    result = loom_cli("send", "x.y", "--scope", "s", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert said in result.stdout.splitlines()[1]


def test_send_reads_a_payload_file_and_refuses_what_is_not_a_json_object(
    server: FakeServer, tmp_path: Path
) -> None:
    server.answers["POST", "/events"] = (200, {"id": "ev_1", "seq": 1, "duplicate": True})
    payload = tmp_path / "p.json"
    payload.write_text('{"n": 1}')
    result = loom_cli("send", "x.y", "--scope", "s", "--payload", f"@{payload}", "--url", server.url)
    assert result.stdout.startswith("already accepted (a duplicate delivery): event ev_1")
    assert server.requests[0][2]["payload"] == {"n": 1}
    one_line_error(
        loom_cli("send", "x.y", "--scope", "s", "--payload", "[1]", "--url", server.url), "JSON object"
    )
    one_line_error(
        loom_cli("send", "x.y", "--scope", "s", "--payload", "{", "--url", server.url), "JSON object"
    )
    assert len(server.requests) == 1, "a refused payload sends nothing"


def test_timers_and_diagnostics_print_iso_times(server: FakeServer) -> None:
    timer = {
        "id": "t-1",
        "state": "armed",
        "fire_at_ms": T9,
        "type": "report.due",
        "scope": "ops",
        "key": None,
    }
    server.answers["GET", "/timers"] = (200, {"timers": [timer]})
    diagnostic = {"id": 1, "kind": "executor_failed", "subject": "ex_1", "message": "boom", "at_ms": T9}
    server.answers["GET", "/diagnostics"] = (200, {"diagnostics": [diagnostic]})
    timers = loom_cli("timers", "--state", "armed", "--url", server.url)
    assert "t-1" in timers.stdout
    assert "2026-01-01T09:00:00Z" in timers.stdout
    diagnostics = loom_cli("diagnostics", "--kind", "executor_failed", "--url", server.url)
    assert diagnostics.stdout.strip() == "2026-01-01T09:00:00Z  executor_failed  ex_1: boom"
    assert [r[1] for r in server.requests] == ["/timers?state=armed", "/diagnostics?kind=executor_failed"]


# -- serve --------------------------------------------------------------------------------------------


def test_serve_hands_its_options_to_the_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Catches an option dropped or renamed on its way to ``serve``."""
    calls: list[dict[str, Any]] = []
    fake = types.ModuleType("loom.service.serve")

    async def serve(**kwargs: Any) -> None:
        calls.append(kwargs)

    fake.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "loom.service.serve", fake)
    config = tmp_path / "loom.toml"
    config.write_text("")
    db = tmp_path / "x.db"
    token = tmp_path / "token"
    result = loom_cli("serve", "--db", str(db), "--config", str(config), "--listen", "127.0.0.1:9000",
                      "--test-clock", "--log-level", "DEBUG", "--allow-host", "loom.internal", "--allow-host",
                      "10.0.0.5", "--token-file", str(token), "--read-timeout", "12.5", "--app", "tasks:app",
                      "--node", "node-1")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert calls == [{"db": str(db), "config_path": str(config), "listen": "127.0.0.1:9000",
                      "test_clock": True, "log_level": "debug", "allow_hosts": ("loom.internal", "10.0.0.5"),
                      "token_file": str(token), "read_timeout": 12.5, "app": "tasks:app", "node": "node-1"}]  # fmt: skip
    url = "postgresql://loom@db.example:5433/loom"
    assert loom_cli("serve", "--db", url).exit_code == 0
    assert calls[-1]["db"] == url, "a URL reaches serve as it was given"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "8440"], "--listen must be HOST:PORT"),
        (["--listen", "localhost:99999"], "--listen must be HOST:PORT"),
        (["--config", "/nonexistent/loom.toml"], "/nonexistent/loom.toml: no such configuration file"),
        (["--db", "/nonexistent/dir/loom.db"], "the directory /nonexistent/dir does not exist"),
        (["--db", "postgresql://loom@db.example/loom?colour=blue"], 'invalid URI query parameter: "colour"'),
        (["--db", "postgresql://loom:secret@db.example:http/loom"], "port must be a number"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(args: list[str], message: str) -> None:
    one_line_error(loom_cli("serve", *args), message)
