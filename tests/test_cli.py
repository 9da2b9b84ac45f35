"""The ``loom`` command line: the commands that talk to a running server (against a small fake HTTP
server that records each request and answers as the API does), ``serve``'s argument checks, the
version, and one-line user errors (never a traceback)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import loom
from loom.service import _render
from loom.service._render import humanize, iso, relative
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
                status, body = fake.answers.get(
                    (self.command, self.path), fake.answers.get((self.command, path), (404, NOT_FOUND))
                )
                kind = "text/event-stream" if isinstance(body, bytes) else "application/json"
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
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


def loom_cli(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False, input=input, prog_name="loom")


NOW = T9 + 4 * 60_000 + 200  # "now" for the relative forms: a little after 09:04 UTC


@pytest.fixture(autouse=True)
def paris_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is Paris (UTC+1 in January), and now is `NOW`, for every test here."""
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    monkeypatch.setattr(_render, "now_ms", lambda: NOW)
    yield
    monkeypatch.undo()
    time.tzset()


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


def test_times_show_local_time_with_its_offset_and_how_far_from_now() -> None:
    """Catches times shown in UTC only, without their offset, or without the relative form."""
    assert iso(T9) == "2026-01-01T09:00:00Z"
    assert iso(T9 + 1) == "2026-01-01T09:00:00.001Z"
    assert humanize({"fire_at_ms": T9, "budget_ms": 5000}) == {
        "fire_at": "2026-01-01 10:00:00+01:00 (4 min ago)",
        "budget_ms": 5000,
    }
    assert humanize({"due_at_ms": T9 + 1}, now=T9 - 3 * 3_600_000) == {
        "due_at": "2026-01-01 10:00:00.001+01:00 (in 3 h)"
    }
    assert [relative(T9 + d, T9) for d in (240_000, -3_000, 400, 90_061_000)] == [
        "in 4 min", "3 s ago", "now", "in 1 d",
    ]  # fmt: skip


def test_dash_h_is_help_and_flags_show_no_type() -> None:
    """Catches a CLI without -h, or a help page that shows <bool> for a flag."""
    for args in (["-h"], ["work", "-h"], ["work", "list", "-h"], ["timers", "-h"]):
        result = loom_cli(*args)
        assert result.exit_code == 0, result.output
        assert "Usage: loom" in result.stdout
        assert "<bool>" not in result.stdout
    assert "--install-completion" in loom_cli("--help").stdout


# -- talking to a server -------------------------------------------------------------------------------


def test_work_get_shows_the_work_with_iso_times_not_epoch_ms(server: FakeServer) -> None:
    """Catches a renderer that prints raw Unix milliseconds."""
    server.answers["GET", "/work/wk_1"] = (200, WORK_VIEW)
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert "held      yes: waiting for stock" in result.stdout
    assert "2026-01-01 10:00:00+01:00 (4 min ago)" in result.stdout
    assert "2026-01-01 10:00:01.500+01:00 (3 min ago)  ev_1  routed by route orders" in result.stdout
    assert str(T9) not in result.stdout
    assert server.requests == [("GET", "/work/wk_1", None)]


def test_work_get_json_prints_the_servers_answer_as_it_is(server: FakeServer) -> None:
    server.answers["GET", "/work/wk_1"] = (200, WORK_VIEW)
    result = loom_cli("work", "get", "wk_1", "--url", server.url, "--json")
    assert json.loads(result.stdout) == WORK_VIEW


def test_work_list_asks_with_its_filters_and_prints_a_table(server: FakeServer) -> None:
    work = [WORK, {**WORK, "id": "wk_2", "held": False}]
    server.answers["GET", "/work"] = (200, {"work": work, "next_after": None})
    result = loom_cli("work", "list", "--scope", "shop", "--state", "ready", "--url", server.url)
    assert result.exit_code == 0, result.output
    header, first, second = result.stdout.strip().splitlines()
    assert header.split() == ["ID", "STATE", "SCOPE", "KIND", "ATTEMPTS", "HELD", "KEYS", "CREATED"]
    assert first.split()[:7] == ["wk_1", "ready", "shop", "-", "2", "yes", "order/1"]
    assert first.endswith("2026-01-01 10:00:00+01:00 (4 min ago)")
    assert second.split()[0] == "wk_2"
    assert server.requests == [("GET", "/work?scope=shop&state=ready&limit=100", None)]
    assert result.stderr == "", "the last page says nothing more"


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
    one_line_error(loom_cli("timers", "list", "--url", "127.0.0.1:8440"), "--url must be an http:// address")


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
    assert result.stdout.startswith("accepted: event ev_1 seq 7 at 2026-01-01 10:00:00+01:00 (4 min ago)")
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


def test_timers_and_diagnostics_print_local_times(server: FakeServer) -> None:
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
    timers = loom_cli("timers", "list", "--state", "armed", "--url", server.url)
    assert "t-1" in timers.stdout
    assert "2026-01-01 10:00:00+01:00 (4 min ago)" in timers.stdout
    diagnostics = loom_cli("diagnostics", "--kind", "executor_failed", "--url", server.url)
    assert (
        diagnostics.stdout.strip() == "2026-01-01 10:00:00+01:00 (4 min ago)  #1  executor_failed  ex_1: boom"
    )
    assert [r[1] for r in server.requests] == [
        "/timers?state=armed&limit=100", "/diagnostics?kind=executor_failed&limit=100",
    ]  # fmt: skip


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
                      "--test-clock", "--log-level", "DEBUG", "--log-format", "json", "--allow-host", "loom.internal", "--allow-host",
                      "10.0.0.5", "--token-file", str(token), "--read-timeout", "12.5", "--app", "tasks:app",
                      "--node", "node-1", "--stop-grace", "3.5")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert calls == [{"db": str(db), "config_path": str(config), "listen": "127.0.0.1:9000",
                      "test_clock": True, "log_level": "debug", "log_format": "json", "allow_hosts": ("loom.internal", "10.0.0.5"),
                      "token_file": str(token), "read_timeout": 12.5, "app": "tasks:app", "node": "node-1",
                      "stop_grace": 3.5}]  # fmt: skip
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


# -- lists, events, timers, watch --------------------------------------------------------------------


def test_a_list_says_when_more_remain_and_all_reads_every_page(server: FakeServer) -> None:
    """Catches a list that stops at one page silently, or --all that stops early or loops."""
    server.answers["GET", "/work?limit=1"] = (200, {"work": [WORK], "next_after": "wk_1"})
    server.answers["GET", "/work?after=wk_1&limit=1"] = (
        200,
        {"work": [{**WORK, "id": "wk_2"}], "next_after": None},
    )
    first = loom_cli("work", "list", "--limit", "1", "--url", server.url)
    assert [line.split()[0] for line in first.stdout.splitlines()] == ["ID", "wk_1"]
    assert first.stderr == "(more remain: --after wk_1 reads on, --all reads every page)\n"
    every = loom_cli("work", "list", "--limit", "1", "--all", "--url", server.url)
    assert [line.split()[0] for line in every.stdout.splitlines()] == ["ID", "wk_1", "ID", "wk_2"]
    assert every.stderr == ""
    as_json = json.loads(
        loom_cli("work", "list", "--limit", "1", "--all", "--json", "--url", server.url).stdout
    )
    assert [w["id"] for w in as_json["work"]] == ["wk_1", "wk_2"]
    assert as_json["next_after"] is None


def test_events_list_and_get(server: FakeServer) -> None:
    event = {"id": "ev_1", "seq": 3, "type": "order.placed", "scope": "shop", "key": "order/1",
             "work_id": None, "accepted_at_ms": T9, "payload": {"total": 42}}  # fmt: skip
    server.answers["GET", "/events"] = (200, {"events": [event], "next_after": None})
    server.answers["GET", "/events/ev_1"] = (200, {"event": event, "checkpoint": {"status": "routed"}})
    listed = loom_cli("events", "list", "--type", "order.placed", "--after", "2", "--url", server.url)
    assert listed.stdout.splitlines()[1].split()[:5] == ["3", "ev_1", "order.placed", "shop", "order/1"]
    shown = loom_cli("events", "get", "ev_1", "--url", server.url)
    assert "total" in shown.stdout
    assert "routed" in shown.stdout
    assert [r[1] for r in server.requests] == ["/events?type=order.placed&after=2&limit=100", "/events/ev_1"]


def test_timers_get_cancel_and_arm(server: FakeServer) -> None:
    """Catches a cancel that does not send the timer's revision, and --at +5m read from the wrong clock."""
    timer = {"id": "t-1", "revision": 4, "state": "armed", "fire_at_ms": T9}
    server.answers["GET", "/timers/t-1"] = (200, {"timer": timer, "firings": []})
    server.answers["POST", "/timers/t-1/cancel"] = (200, {**timer, "state": "cancelled", "revision": 5})
    server.answers["GET", "/healthz"] = (200, {"status": "ok", "now_ms": T9})
    server.answers["POST", "/timers"] = (201, timer)
    assert "armed" in loom_cli("timers", "get", "t-1", "--url", server.url).stdout
    said = loom_cli("timers", "cancel", "t-1", "--url", server.url).stdout
    assert said == "cancel: timer t-1 is cancelled (revision 5)\n"
    armed = loom_cli("timers", "arm", "t-1", "--at", "+5m", "--type", "t.due", "--scope", "ops",
                     "--every", "1h", "--url", server.url)  # fmt: skip
    assert armed.exit_code == 0, armed.output
    assert server.requests[1] == ("GET", "/timers/t-1", None)
    assert server.requests[2] == ("POST", "/timers/t-1/cancel", {"revision": 4})
    assert server.requests[-1][2] == {"id": "t-1", "fire_at_ms": T9 + 300_000, "source": "cli", "type": "t.due",
                                      "scope": "ops", "payload": {}, "interval_ms": 3_600_000}  # fmt: skip


def test_payloads_and_batches_read_stdin_with_at_dash(server: FakeServer) -> None:
    server.answers["POST", "/events"] = (201, {"id": "ev_1", "seq": 1, "duplicate": False})
    result = loom_cli("send", "x.y", "--scope", "s", "--payload", "@-", "--url", server.url, input='{"a": 1}')
    assert result.exit_code == 0, result.output
    assert server.requests[-1][2]["payload"] == {"a": 1}
    server.answers["POST", "/events"] = (200, {"results": [
        {"status": 201, "event": {"id": "ev_2", "seq": 2, "source": "s", "delivery_id": "a"}},
        {"status": 400, "error": {"error": "invalid_request", "field": "type", "message": "bad type"}},
    ], "accepted": 1, "duplicates": 0, "refused": 1})  # fmt: skip
    lines = '{"type": "x.y"}\n\n{"type": "Bad"}\n'
    batch = loom_cli("send", "--batch", "-", "--url", server.url, input=lines)
    assert server.requests[-1][2] == [{"type": "x.y"}, {"type": "Bad"}]
    assert batch.exit_code == 1, "a refused item fails the command"
    assert batch.stdout.splitlines()[1] == "2: refused (type): bad type"


def test_watch_prints_each_work_change(server: FakeServer) -> None:
    stream = (
        b": watching\n\n"
        b'event: work\ndata: {"work": {"id": "wk_1", "state": "ready", "held": true, "hold_reason": "x",'
        b' "scope": "shop", "keys": ["order/1"]}, "at_ms": 1767258000000}\n\n'
        b": keep-alive\n\n"
        b'event: lagged\ndata: {"message": "fell behind"}\n\n'
        b'event: work\ndata: {"work": {"id": "wk_2", "state": "running", "scope": "shop", "keys": []},'
        b' "at_ms": 1767258000000}\n\n'
    )
    server.answers["GET", "/watch"] = (200, stream)
    result = loom_cli("watch", "--scope", "shop", "--count", "2", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "2026-01-01 10:00:00+01:00 (4 min ago)  wk_1  ready held: x  shop  order/1",
        "lagged: fell behind",
        "2026-01-01 10:00:00+01:00 (4 min ago)  wk_2  running  shop  ",
    ]
    assert server.requests[-1][1] == "/watch?scope=shop"


def test_the_command_line_imports_no_runtime_to_parse_a_command() -> None:
    """Catches an eager import that makes every ``loom`` call (and ``--help``, and completion) pay for
    the runtime, trio, the HTTP server or the HTTP client: the command line's start-up time (it was
    1.5 s; bench/check.py prints it)."""
    code = "import json, sys; import loom.service.cli; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    heavy = ("trio", "starlette", "hypercorn", "prometheus_client", "sqlite3", "psycopg", "urllib.request",
             "http.client", "rich", "loom.runtime", "loom.store", "loom.kernel", "loom.actors", "loom.records",
             "loom.config")  # fmt: skip
    assert not [m for m in loaded if m.startswith(heavy)], [m for m in loaded if m.startswith(heavy)]
