"""The ``loom`` command line misused: a bad ``--url`` (or ``LOOM_URL``), a ``--timeout`` that is not a
number of seconds, a time out of range, a JSON argument nested too deep, a server that does not answer
HTTP. Each is one line on stderr naming what is wrong and exit status 1 (docs/http-api.md); never a
traceback, and no request is sent (against the fake server of `test_cli`, which records each one)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from test_cli import FakeServer, loom_cli, one_line_error
from typer.testing import CliRunner

from loom.service._client import Client
from loom.service.cli import app

SETTLED = {"work_id": "wk_1", "state": "completed", "settled": True, "value": None, "attempts": 1}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each command under ``command`` (a group has ``commands``), by its words."""
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield path, command
        return
    for name, sub in sorted(subcommands.items()):
        yield from _commands(sub, (*path, name))


def url_commands() -> list[list[str]]:
    """Every command that takes ``--url``, with a value for each of its arguments and required options:
    a command added later is checked too."""
    found = []
    for path, command in _commands(typer.main.get_command(app)):
        if not any("--url" in param.opts for param in command.params):
            continue
        args = list(path)
        for param in command.params:
            if param.param_type_name == "argument":
                args.append("x")
            elif param.required:
                args += [param.opts[0], "x"]
        found.append(args)
    return found


COMMANDS = url_commands()


def test_the_commands_that_take_a_url_are_found() -> None:
    names = {" ".join(arg for arg in args if arg != "x" and not arg.startswith("-")) for args in COMMANDS}
    assert {"health", "send", "work list", "work wait", "work logs", "timers arm", "watch"} <= names
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(args) for args in COMMANDS])
@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://[::1", "--url 'http://[::1': not a valid address (Invalid IPv6 URL)"),
        ("http://127.0.0.1:abc", "--url 'http://127.0.0.1:abc': the port must be a number from 1 to 65535"),
    ],
)
def test_every_command_refuses_a_malformed_url_in_one_line(args: list[str], url: str, said: str) -> None:
    """Catches a command that makes its client without the URL check (a traceback ending in
    ``ValueError: Invalid IPv6 URL`` or ``http.client.InvalidURL: nonnumeric port``)."""
    one_line_error(loom_cli(*args, "--url", url), said)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://127.0.0.1:99999", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("http://127.0.0.1:", "the port must be a number from 1 to 65535"),
        ("http://[::1]:x", "the port must be a number from 1 to 65535"),
        ("http://[zz]:8440", "not a valid address"),
        ("http://:8440", "it names no host"),
        ("http://127.0.0.1:8440/?stream=1", "an address takes no query or fragment"),
        ("http://127.0.0.1:8440#top", "an address takes no query or fragment"),
        ("http://127.0.0.1 :8440", "an address holds no space or control character"),
        ("http://127.0.0.1:8440/\x00", "an address holds no space or control character"),
        ("ftp://127.0.0.1:8440", "--url must be an http:// address such as http://127.0.0.1:8440"),
    ],
)
def test_what_is_wrong_with_a_url_is_said(url: str, said: str) -> None:
    """Catches a port out of range, a missing host, a query or fragment (which would drop the route's
    path), a space or NUL that only fails deep in the HTTP client, each taken or a traceback."""
    one_line_error(loom_cli("health", "--url", url), said)


def test_a_url_with_a_password_is_refused_without_echoing_it() -> None:
    """Catches a URL whose user name and password are taken (then echoed in every error line)."""
    result = loom_cli("health", "--url", "http://operator:s3cret@127.0.0.1:8440")
    one_line_error(result, "--url must not hold a user name or password (give the token with --token-file)")
    assert "s3cret" not in result.output


def test_a_bad_loom_url_is_refused_in_one_line() -> None:
    """``loom timers`` alone reads ``LOOM_URL`` itself: catches that path missing the URL check."""
    result = CliRunner().invoke(app, ["timers"], env={"LOOM_URL": "http://[::1"}, catch_exceptions=False)
    one_line_error(result, "--url 'http://[::1': not a valid address")


def test_good_urls_are_taken(server: FakeServer) -> None:
    """Catches a check that refuses a usable address (an IPv6 literal, https, a path, a trailing /)."""
    assert Client("http://[::1]:8440/").url == "http://[::1]:8440"
    assert Client("https://loom.internal/prefix").url == "https://loom.internal/prefix"
    assert Client("http://localhost").url == "http://localhost"
    server.answers["GET", "/healthz"] = (200, {"ok": True})
    result = loom_cli("health", "--json", "--url", server.url + "/")
    assert result.exit_code == 0, result.output
    assert server.requests == [("GET", "/healthz", None)]


@pytest.fixture
def not_http() -> Iterator[str]:
    """A server that answers one line that is not HTTP and hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"nonsense\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    thread.join(timeout=20)
    listener.close()


def test_a_server_that_does_not_answer_http_is_one_line(not_http: str) -> None:
    """Catches the HTTP client's own errors (``http.client.BadStatusLine``) escaping as a traceback."""
    one_line_error(loom_cli("health", "--url", not_http), f"cannot talk to the loom server at {not_http}")


@pytest.mark.parametrize("timeout", ["inf", "1e309", "-inf", "-1", "-0.5", "nan"])
def test_work_wait_refuses_a_timeout_that_is_not_seconds(server: FakeServer, timeout: str) -> None:
    """Catches ``--timeout inf`` ending in ``OverflowError``, and ``-1`` or ``nan`` taken silently (as
    "wait as long as it takes"): refused before any request."""
    server.answers["GET", "/work/wk_1/result"] = (200, SETTLED)
    result = loom_cli("work", "wait", "wk_1", "--timeout", timeout, "--url", server.url)
    one_line_error(result, "--timeout must be seconds, 0 or more (0: wait as long as it takes), got ")
    assert server.requests == []


def test_work_wait_takes_a_timeout_of_seconds(server: FakeServer) -> None:
    server.answers["GET", "/work/wk_1/result"] = (200, SETTLED)
    for timeout in ("0", "2.5", "1e9"):
        assert loom_cli("work", "wait", "wk_1", "--timeout", timeout, "--url", server.url).exit_code == 0


@pytest.mark.parametrize("when", ["²", "0001-01-01T00:00:00+14:00"])
def test_a_time_out_of_range_is_one_line(server: FakeServer, when: str) -> None:
    """Catches ``--at ²`` (a digit to ``str.isdigit``, not to ``int``) and a time before year 1 in UTC
    ending in a ``ValueError`` traceback."""
    arm = loom_cli("timers", "arm", "t1", "--at", when, "--type", "a.b", "--scope", "s", "--url", server.url)
    one_line_error(arm, f"--at must be +DURATION (+5m), an ISO 8601 time or Unix milliseconds, got {when!r}")
    one_line_error(loom_cli("clock", "--to", when, "--url", server.url), "--to must be +DURATION")
    assert server.requests == []


def test_json_nested_too_deep_is_one_line(server: FakeServer, tmp_path: Path) -> None:
    """Catches a JSON argument that exhausts the decoder's recursion (``RecursionError``) as a
    traceback."""
    deep = "[" * 100_000
    one_line_error(
        loom_cli("send", "x.y", "--scope", "s", "--payload", deep, "--url", server.url),
        "--payload is nested too deeply",
    )
    batch = tmp_path / "batch.jsonl"
    batch.write_text(deep + "\n")
    sent = loom_cli("send", "--batch", str(batch), "--url", server.url)
    assert sent.exit_code == 1
    assert sent.stdout.startswith("1: refused: line 1 is nested too deeply")
    assert "Traceback" not in sent.output
    assert server.requests == []
