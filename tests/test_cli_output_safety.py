"""The ``loom`` command line prints what the server holds without letting it speak for the CLI, and
refuses what the HTTP API refuses before sending it:

* every string from the server in human output is shown through one escaping function
  (`loom.service._render.printable`): a newline, CR, tab, ESC or any other C0 or C1 control shows as
  ``\\n``, ``\\x1b``, ... so one field stays on one line and no text forges a line of the CLI's own
  (``--json`` prints the answer as it is);
* a JSON argument naming one member twice is refused in one line naming it (the HTTP API answers 400);
* ``loom watch`` whose stream the server ends says so on stderr and exits 1;
* ``loom config check --db`` and ``loom vacuum`` refuse a path that is not already a loom database,
  creating nothing;
* ``loom send`` says why an Event that no route took was routed (it won a wait).

Against the recording fake server of `test_cli`, and a real ``loom serve`` where its own answers or
its stopping matter."""

from __future__ import annotations

import json
import os
import selectors
import sqlite3
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_kit import CONFIG_TOML, Server, order, start_server
from test_cli import FakeServer, loom_cli, one_line_error

import loom
from loom.service._cli_events import routing_line
from loom.service._render import printable
from loom.service._wire import HTTPError, parse_json

FORGED = "x\n  state       completed\r\a"
"""A hold reason that, printed raw, adds a line saying the Work completed, then a CR and a BEL."""
ESCAPED = "x\\n  state       completed\\r\\x07"
"""`FORGED` as the CLI shows it."""
RAW = ("\n", "\r", "\a", "\x1b", "\x9b", "\u2028")
"""What none of the output a person reads may hold, but where the CLI itself puts it (newlines)."""


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def clean_lines(text: str) -> list[str]:
    """``text``'s lines, checked to hold no control character but the newlines between them."""
    lines = text.splitlines()
    assert text.count("\n") == len(lines), f"a line break other than \\n: {text!r}"
    for line in lines:
        assert not any(char in line for char in RAW), f"a raw control character: {line!r}"
    return lines


# -- one escaping function ----------------------------------------------------------------------------


def test_printable_escapes_every_control_and_nothing_else() -> None:
    """Catches an escape that misses a kind of control (only ``\\n`` replaced, or C0 but not C1 such as
    the CSI ``\\x9b`` a terminal reads as ESC [, or the line separator U+2028), one that mangles
    ordinary text (accents, symbols, a backslash), or a ``keep`` that is ignored."""
    assert printable("a\nb\rc\td\x00e\x07f\x1b[31mg\x7fh\x85i\x9bj") == (
        "a\\nb\\rc\\td\\x00e\\x07f\\x1b[31mg\\x7fh\\x85i\\x9bj"
    )
    assert printable("l\u2028m\u2029n\u202eo\u2066p") == "l\\u2028m\\u2029n\\u202eo\\u2066p"
    assert printable("café ✓ naïve C:\\temp «x» 日本") == "café ✓ naïve C:\\temp «x» 日本"
    assert printable(None) == "None"
    assert printable(42) == "42"
    assert printable("one\ntwo\tcols\r\x1b", keep="\n\t") == "one\ntwo\tcols\\r\\x1b"


def test_work_get_shows_the_servers_text_escaped_on_its_own_line(server: FakeServer) -> None:
    """Catches ``loom work get`` printing a hold reason, a last error, a diagnostic, a checkpoint's
    reason, an attempt's error or a key raw: a reason with a newline forged a ``state  completed``
    line, a CR rewrote the line, a BEL rang."""
    work = {"id": "wk_1", "scope": "shop", "kind": None, "state": "ready", "keys": ["order/1\nx"],
            "held": True, "hold_reason": FORGED, "attempts": 2, "created_at_ms": 0}  # fmt: skip
    view = {
        "work": work,
        "result": {"error": "boom\n  state       completed\x1b[2K"},
        "wait": {"id": "wt_1", "state": "active\r", "types": ["a\nb"]},
        "pending_inputs": [{"id": "ev_2", "type": "order.paid\x1b]0;title\x07", "seq": 3}],
        "timers": [{"id": "t\n1", "state": "armed"}],
        "diagnostics": [{"kind": "attempt_failed", "message": "line 1\nline 2\x9b"}],
        "history": {
            "checkpoints": [{"event_id": "ev_1", "status": "routed", "route": "or\nders", "reason": "r\rr"}],
            "executions": [{"attempt": 1, "id": "ex_1", "state": "failed", "outcome": {"error": "e\n\x1b"}}],
        },
    }
    server.answers["GET", "/work/wk_1"] = (200, view)
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    lines = clean_lines(result.stdout)
    assert [line.split()[1] for line in lines if line.split()[0] == "state"] == ["ready"], lines
    assert f"  held        yes: {ESCAPED}" in lines
    assert "  last error  boom\\n  state       completed\\x1b[2K" in lines
    assert "  keys        order/1\\nx" in lines
    assert "  wait      wt_1: active\\r, for a\\nb" in lines
    assert "attempt_failed: line 1\\nline 2\\x9b" in result.stdout
    assert "routed by route or\\nders: r\\rr" in result.stdout
    assert "  1  ex_1  failed  -: e\\n\\x1b" in lines


def test_json_output_is_the_answer_as_it_is(server: FakeServer) -> None:
    """Catches the escaping done to the answer itself (its strings escaped in the client, or before
    ``--json`` prints it): a script reading ``--json`` must get the server's text as it is."""
    work = {"id": "wk_1", "state": "ready", "held": True, "hold_reason": FORGED}
    server.answers["GET", "/work/wk_1"] = (200, {"work": work})
    result = loom_cli("work", "get", "wk_1", "--json", "--url", server.url)
    assert json.loads(result.stdout)["work"]["hold_reason"] == FORGED


def test_work_wait_diagnostics_and_controls_escape_the_servers_text(server: FakeServer) -> None:
    """Catches ``loom work wait``'s last error, ``loom diagnostics``' message and subject, and what
    ``loom work hold`` says of the hold reason, printed raw."""
    failed = {"work_id": "wk_1", "state": "failed", "settled": True, "attempts": 1,
              "error": "ValueError: bad\n  state completed\x1b[0m"}  # fmt: skip
    server.answers["GET", "/work/wk_1/result"] = (200, failed)
    waited = loom_cli("work", "wait", "wk_1", "--url", server.url)
    assert waited.exit_code == 1, waited.output
    assert clean_lines(waited.stdout) == [
        "work wk_1 failed after 1 attempt(s); the last error: ValueError: bad\\n  state completed\\x1b[0m"
    ]
    diagnostic = {
        "id": 7,
        "kind": "executor_failed",
        "subject": "ex\r1",
        "message": "no\nluck\a",
        "at_ms": None,
    }
    server.answers["GET", "/diagnostics"] = (200, {"diagnostics": [diagnostic], "next_after": None})
    listed = loom_cli("diagnostics", "--url", server.url)
    assert clean_lines(listed.stdout) == ["-  #7  executor_failed  ex\\r1: no\\nluck\\x07"]
    server.answers["POST", "/work/wk_1/hold"] = (200, {"id": "wk_1", "state": "ready", "held": True,
                                                        "hold_reason": FORGED})  # fmt: skip
    held = loom_cli("work", "hold", "wk_1", "--reason", FORGED, "--url", server.url)
    assert clean_lines(held.stdout) == [f"hold: work wk_1 is ready, held: {ESCAPED}"]


def test_send_events_get_watch_and_logs_escape_the_servers_text(server: FakeServer) -> None:
    """Catches ``loom send`` (its routing reason, a batch item's refusal), ``loom events get`` (a
    payload's member names and values), ``loom watch`` and ``loom work logs`` (a CR or an escape
    sequence in an attempt's output; its lines stay lines) printing the server's text raw."""
    routing = {"status": "unmatched", "reason": "no route\nrouted by route 'x' to work wk_9"}
    server.answers["POST", "/events"] = (
        201,
        {"id": "ev_1", "seq": 1, "duplicate": False, "routing": routing},
    )
    sent = loom_cli("send", "x.y", "--scope", "s", "--url", server.url)
    assert clean_lines(sent.stdout)[1] == (
        "matched no route in its scope: nothing will act on it: no route\\nrouted by route 'x' to work wk_9"
    )
    results = [{"status": 400, "error": {"field": "type\n", "message": "bad\n2: accepted"}}]
    server.answers["POST", "/events"] = (200, {"results": results})
    batch = loom_cli("send", "--batch", "-", "--url", server.url, input='{"type": "x"}\n')
    assert clean_lines(batch.stdout) == ["1: refused (type\\n): bad\\n2: accepted"]
    server.answers["GET", "/events/ev_1"] = (200, {"event": {"id": "ev_1", "payload": {"a\nb": "c\rd"}}})
    shown = loom_cli("events", "get", "ev_1", "--url", server.url)
    assert "    a\\nb  c\\rd" in clean_lines(shown.stdout)
    change = {"work": {"id": "wk_1", "state": "ready", "held": True, "hold_reason": "a\nb", "scope": "s",
                       "keys": ["k\x1b"]}, "at_ms": None}  # fmt: skip
    server.answers["GET", "/watch"] = (200, f"event: work\ndata: {json.dumps(change)}\n\n".encode())
    watched = loom_cli("watch", "--count", "1", "--url", server.url)
    assert clean_lines(watched.stdout) == ["-  wk_1  ready held: a\\nb  s  k\\x1b"]
    logs = {"execution_id": "ex_1", "logs": {"stdout": "one\ntwo\r\x1b[2Kthree\n"}}
    server.answers["GET", "/work/wk_1/attempts/1/logs"] = (200, logs)
    printed = loom_cli("work", "logs", "wk_1", "--attempt", "1", "--url", server.url)
    assert clean_lines(printed.stdout) == ["== stdout of attempt 1 (ex_1) ==", "one", "two\\r\\x1b[2Kthree"]


def test_a_refusal_quoting_a_newline_is_still_one_line(server: FakeServer) -> None:
    """Catches a server's refusal message printed raw on stderr: a newline in it breaks the rule that
    a user error is one line, and can forge a second one."""
    server.answers["GET", "/work/wk_1"] = (404, {"error": "not_found", "field": None,
                                                 "message": "no work\nloom: all is well\x1b[8m"})  # fmt: skip
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    one_line_error(result, "no work\\nloom: all is well\\x1b[8m")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Server]:
    """A real ``loom serve`` on a file, with the routes of `service_kit.CONFIG_TOML`."""
    config = tmp_path / "loom.toml"
    config.write_text(CONFIG_TOML)
    server = start_server(tmp_path / "served.db", config=config)
    try:
        yield server
    finally:
        if server.proc.poll() is None:
            server.stop()


def post(url: str, body: Any) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as response:
        return json.loads(response.read())


def test_a_hold_reason_cannot_forge_a_line_against_a_real_server(served: Server) -> None:
    """The tester's reproduction: ``loom work hold ID --reason $'x\\n  state  completed\\r\\a'`` then
    ``loom work get ID``. Catches the real answer's hold reason printed raw."""
    accepted = post(f"{served.url}/events?wait=5", order(1))
    work_id = accepted["routing"]["work_id"]
    assert loom_cli("work", "hold", work_id, "--reason", FORGED, "--url", served.url).exit_code == 0
    result = loom_cli("work", "get", work_id, "--url", served.url)
    assert result.exit_code == 0, result.output
    lines = clean_lines(result.stdout)
    assert [line.split()[1] for line in lines if line.split()[0] == "state"] == ["ready"], lines
    assert [line.split(None, 1)[1] for line in lines if line.startswith("  held ")] == [f"yes: {ESCAPED}"]


# -- repeated JSON members ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "name"),
    [('{"a": 1, "a": 2}', "a"), ('{"x": [{"b": 1, "c": 0, "b": 2}]}', "b")],
)
def test_a_payload_naming_a_member_twice_is_refused(server: FakeServer, payload: str, name: str) -> None:
    """Catches ``json.loads`` alone taking the last value of a repeated member (the HTTP API refuses
    it with 400), at the top or nested: one line naming it, exit status 1, nothing sent."""
    with pytest.raises(HTTPError, match="appears more than once"):
        parse_json(payload.encode())  # what the HTTP API does with it
    result = loom_cli("send", "x.y", "--scope", "s", "--payload", payload, "--url", server.url)
    one_line_error(result, f"--payload: the member {name!r} appears more than once in one object")
    spec = loom_cli("timers", "arm", "t-1", "--at", "0", "--type", "a.b", "--scope", "s", "--recurrence",
                    "cron", "--spec", payload, "--url", server.url)  # fmt: skip
    one_line_error(spec, f"--spec: the member {name!r} appears more than once in one object")
    assert server.requests == []


def test_a_batch_line_naming_a_member_twice_is_refused(server: FakeServer) -> None:
    """Catches ``send --batch`` sending an Event whose ``delivery_id`` is given twice with the last one
    (deduplicated under an id the sender never meant), where POST /events refuses it: that line is
    refused, and the others are sent."""
    lines = (
        '{"type": "a.b", "delivery_id": "d-1"}\n{"type": "a.b", "delivery_id": "d-1", "delivery_id": "d-2"}\n'
    )
    event = {"id": "ev_1", "seq": 1, "source": "s", "delivery_id": "d-1"}
    server.answers["POST", "/events"] = (200, {"results": [{"status": 201, "event": event}]})
    result = loom_cli("send", "--batch", "-", "--url", server.url, input=lines)
    assert server.requests == [("POST", "/events", [{"type": "a.b", "delivery_id": "d-1"}])]
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1] == (
        "2: refused: line 2: the member 'delivery_id' appears more than once in one object: give it once"
    )


# -- loom watch when the server goes away -------------------------------------------------------------


def test_watch_says_the_server_closed_its_stream(server: FakeServer) -> None:
    """Catches ``loom watch`` ending with exit status 0 and nothing said when the stream ends before
    it was interrupted or saw its ``--count``: the server stopped, and a script would take it for the
    end of the changes."""
    change = {"work": {"id": "wk_1", "state": "ready", "scope": "s", "keys": []}, "at_ms": None}
    server.answers["GET", "/watch"] = (
        200,
        f": watching\n\nevent: work\ndata: {json.dumps(change)}\n\n".encode(),
    )
    ended = loom_cli("watch", "--url", server.url)
    one_line_error(ended, f"the loom server at {server.url} closed the stream")
    assert ended.stdout == "-  wk_1  ready  s  \n", "what came before the end is printed"
    short = loom_cli("watch", "--count", "3", "--url", server.url)
    one_line_error(short, f"the loom server at {server.url} closed the stream after 1 of the 3 changes")
    assert loom_cli("watch", "--count", "1", "--url", server.url).exit_code == 0, "the end it asked for"


def _first_line(proc: subprocess.Popen[str], seconds: float) -> str:
    """The first line ``proc`` prints, waiting for it (not for a time) at most ``seconds``."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(seconds):
            return ""
    return proc.stdout.readline()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_watch_exits_1_when_a_real_server_stops_or_is_killed(served: Server, how: str) -> None:
    """The tester's reproduction: ``loom watch`` following a real server that stops (SIGTERM: it ends
    the stream cleanly) or is killed (SIGKILL). Catches exit status 0 with nothing said."""
    watch = subprocess.Popen(
        [sys.executable, "-m", "loom", "watch", "--url", served.url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    try:
        line, n = "", 0
        while not line and n < 40:  # a change each round until the watch (once in place) prints one
            n += 1
            post(f"{served.url}/events", order(n))
            line = _first_line(watch, 0.5)
        assert line, "the watch printed no change"
        served.kill() if how == "kill" else served.stop()
        _, stderr = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 1, stderr
    assert stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"loom: the stream from the loom server at {served.url} stopped") or (
        stderr == f"loom: the loom server at {served.url} closed the stream\n"
    ), stderr


# -- config check and vacuum on a path that is no loom database ---------------------------------------


def _loom_database(path: Path) -> Path:
    store = loom.SQLiteStore(path=str(path))
    store.close_writer(store.open_writer())
    return path


def _files(directory: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted(directory.iterdir())}


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding only ``loom.toml``."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "loom.toml").write_text(CONFIG_TOML)
    monkeypatch.chdir(work)
    monkeypatch.delenv("LOOM_CONFIG", raising=False)
    return work


def test_config_check_refuses_a_db_that_does_not_exist_and_creates_nothing(config: Path) -> None:
    """Catches ``loom config check --db typo.db`` saying "nothing to report" (exit status 0) and
    leaving a new ``typo.db`` (with ``-wal``, ``-shm`` and ``.lock``): it opened a runtime on it."""
    before = _files(config)
    result = loom_cli("config", "check", "--config", "loom.toml", "--db", "typo.db")
    one_line_error(result, "no database at typo.db")
    assert "nothing to report" not in result.stdout
    assert _files(config) == before


@pytest.mark.parametrize("content", ["empty", "text", "sqlite"])
def test_vacuum_and_config_check_refuse_a_file_that_is_no_loom_database(config: Path, content: str) -> None:
    """Catches ``loom vacuum --db empty.db`` turning an empty file (or another program's SQLite
    database) into a loom database of 400 KB, and ``config check --db`` doing the same: each is
    refused in one line naming the file, and the directory is left byte for byte as it was. (A text
    file the store's own open refused already, but without naming it.)"""
    path = config / "other.db"
    if content == "sqlite":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
        conn.close()
    else:
        path.write_text("" if content == "empty" else "some notes\n")
    before = _files(config)
    one_line_error(loom_cli("vacuum", "--db", "other.db"), "other.db is not a loom database")
    assert _files(config) == before
    one_line_error(loom_cli("config", "check", "--db", "other.db"), "other.db is not a loom database")
    assert _files(config) == before


def test_vacuum_and_config_check_still_take_a_loom_database(config: Path) -> None:
    """Catches a check that refuses the database it is for (a stopped loom's file, its log folded
    in and removed)."""
    _loom_database(config / "loom.db")
    assert not (config / "loom.db-wal").exists()
    vacuumed = loom_cli("vacuum", "--db", "loom.db")
    assert vacuumed.exit_code == 0, vacuumed.output
    checked = loom_cli("config", "check", "--db", "loom.db")
    assert "checking configuration" in checked.stdout, checked.output
    assert "no database" not in checked.output


# -- loom send of an Event that won a wait ------------------------------------------------------------


def test_send_says_why_an_event_no_route_took_was_routed(server: FakeServer) -> None:
    """Catches ``routed by route None to work wk_1``: an Event that won a wait is routed by no route,
    and the checkpoint's reason says so."""
    routing = {"status": "routed", "route": None, "route_scope": None, "work_id": "wk_1",
               "reason": "no route matched it; it wins wait wt_1"}  # fmt: skip
    said = "routed to work wk_1: no route matched it; it wins wait wt_1"
    assert routing_line(routing) == said
    server.answers["POST", "/events"] = (
        201,
        {"id": "ev_1", "seq": 1, "duplicate": False, "routing": routing},
    )
    result = loom_cli("send", "x.y", "--scope", "s", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == said
    assert routing_line({**routing, "status": "drop", "reason": "bots"}) == "dropped: bots"
