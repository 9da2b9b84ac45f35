"""What the ``loom`` commands read from the user, refused in loom's own words: a file or standard input
that is not UTF-8 text, a batch (or an Event) larger than the server takes, a malformed ``--listen``,
a ``--config`` that is a directory, an empty ``--db`` or ``--delivery-id``, JSON nested too deeply or
holding a number of too many digits. Each is one line on stderr and exit status 1 (docs/http-api.md:
"any other error ... is status 1 with its line on stderr"), with nothing sent."""

from __future__ import annotations

import json
import socket
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cli import FakeServer, loom_cli, one_line_error
from typer.testing import CliRunner

from loom.service import _batch, _wire
from loom.service._cli_base import MAX_BATCH_BYTES, MAX_BODY_BYTES, MAX_JSON_DEPTH, UserError
from loom.service._client import Client
from loom.service.cli import app, parse_listen

ACCEPTED = {
    "id": "ev_1",
    "seq": 1,
    "source": "cli",
    "delivery_id": "d",
    "accepted_at_ms": 0,
    "duplicate": False,
}


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        fake.answers["POST", "/events?wait=2"] = (201, ACCEPTED)
        fake.answers["POST", "/events"] = (200, {"results": [{"status": 201, "event": ACCEPTED}]})
        yield fake


def _send(*args: str, url: str, input: bytes | str | None = None) -> Any:
    return CliRunner().invoke(
        app, ["send", *args, "--url", url], input=input, catch_exceptions=False, prog_name="loom"
    )


# -- 1: input that is not UTF-8 text -------------------------------------------------------------------


def test_a_batch_file_that_is_not_utf8_is_one_line(server: FakeServer, tmp_path: Path) -> None:
    """Catches ``loom send --batch b.ndjson`` of bytes that are not UTF-8 ending in a traceback
    (``UnicodeDecodeError``): one line naming the file and saying it is not UTF-8 text."""
    batch = tmp_path / "b.ndjson"
    batch.write_bytes(b"\xff\xfe\n")
    one_line_error(_send("--batch", str(batch), url=server.url), f"--batch {batch}: not UTF-8 text")
    one_line_error(
        _send("--batch", "-", url=server.url, input=b"{}\n\xff\n"),
        "--batch - (standard input): not UTF-8 text",
    )
    payload = tmp_path / "payload.json"
    payload.write_bytes(b'{"a": "\xff"}')
    one_line_error(_send("x.y", "--scope", "s", "--payload", f"@{payload}", url=server.url), "not UTF-8 text")
    assert server.requests == []


def test_binary_stdin_or_arguments_are_said_not_to_be_utf8(server: FakeServer) -> None:
    """Catches ``--payload @-`` of bytes that are not UTF-8 read as lone surrogates (sent, and refused
    by the server as "a lone surrogate") or ending in a traceback: said to be no UTF-8 text, unsent.
    (Bytes of the command line that are not UTF-8 reach Python as lone surrogates too.)"""
    result = _send("x.y", "--scope", "s", "--payload", "@-", url=server.url, input=b'{"a": "\xff"}')
    one_line_error(result, "--payload @- (standard input): not UTF-8 text")
    assert "surrogate" not in result.stderr
    one_line_error(_send("x.y", "--scope", "s", "--payload", '{"a": "\udcff"}', url=server.url),
                   "--payload is not UTF-8 text")  # fmt: skip
    assert server.requests == []
    sent = _send("x.y", "--scope", "s", "--payload", "@-", url=server.url, input='{"a": "é"}'.encode())
    assert sent.exit_code == 0, sent.output
    assert server.requests[0][2]["payload"] == {"a": "é"}


# -- 2: a body larger than the server takes --------------------------------------------------------------


def test_the_limits_are_the_servers() -> None:
    """Catches the CLI's copy of the server's body limits going stale."""
    assert MAX_BODY_BYTES == _wire.MAX_BODY_BYTES
    assert MAX_BATCH_BYTES == _batch.MAX_BATCH_BYTES


def test_a_batch_too_large_is_refused_before_it_is_sent(server: FakeServer, tmp_path: Path) -> None:
    """Catches a batch over the server's 16 MiB sent anyway (against ``loom serve``: "cannot reach the
    loom server ...: Broken pipe", the server up and answering 413): refused unsent, naming the limit."""
    line = json.dumps(
        {"source": "s", "delivery_id": "d", "type": "x.y", "scope": "s", "payload": {"x": "y" * 100_000}}
    )
    batch = tmp_path / "big.ndjson"
    batch.write_text((line + "\n") * (MAX_BATCH_BYTES // len(line) + 1))
    result = _send("--batch", str(batch), url=server.url)
    one_line_error(result, f"--batch ({MAX_BATCH_BYTES // len(line) + 1} Events) is too large to send: ")
    assert "over the server's limit of 16 MiB (16,777,216 bytes)" in result.stderr
    assert server.requests == []


def test_an_event_too_large_is_refused_before_it_is_sent(server: FakeServer, tmp_path: Path) -> None:
    payload = tmp_path / "payload.json"
    payload.write_text(json.dumps({"x": "y" * MAX_BODY_BYTES}))
    result = _send("x.y", "--scope", "s", "--payload", f"@{payload}", url=server.url)
    one_line_error(result, "the Event is too large to send: ")
    assert "over the server's limit of 2 MiB (2,097,152 bytes)" in result.stderr
    assert server.requests == []


@pytest.fixture
def refuses_at_once() -> Iterator[str]:
    """A server that answers 413 as soon as it has a request's headers, and closes the connection
    without reading the body (as ``loom serve`` does with a body over its limit)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        connection, _ = listener.accept()
        with connection:
            got = b""
            while b"\r\n\r\n" not in got:
                got += connection.recv(65536)
            body = b'{"error": "too_large", "field": null, "message": "the body is 8000002 bytes; the limit is 16"}'
            head = f"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            connection.sendall(head.encode() + b"Connection: close\r\n\r\n" + body)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    thread.join(timeout=20)
    listener.close()


def test_a_server_that_stops_reading_is_heard(refuses_at_once: str) -> None:
    """Catches a request whose body the server refused before reading it ending in "cannot reach the
    loom server ...: Broken pipe" (or "Connection reset by peer"), the server's answer unread: it says
    why."""
    with pytest.raises(UserError) as refused:
        Client(refuses_at_once).post("/events", [" " * 8_000_000])
    assert str(refused.value) == "the body is 8000002 bytes; the limit is 16"


# -- 3: --listen ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["[::1", "[::1:8440", "::1]:8440", "[]:8440", "[[::1]]:8440", "x:²"])
def test_a_malformed_listen_is_refused_as_malformed(listen: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches ``--listen "[::1"`` read as the host ``:`` and port 1 (then refused as "not a loopback
    address"), and an unclosed bracket taken: refused as not HOST:PORT, before the server starts."""
    with pytest.raises(UserError, match="--listen must be HOST:PORT"):
        parse_listen(listen)
    calls: list[dict[str, Any]] = []
    fake = types.ModuleType("loom.service.serve")

    async def serve(**kwargs: Any) -> None:
        calls.append(kwargs)

    fake.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "loom.service.serve", fake)
    one_line_error(
        loom_cli("serve", "--listen", listen),
        f"--listen must be HOST:PORT such as 127.0.0.1:8440 (an IPv6 host in brackets: [::1]:8440), got {listen!r}",
    )
    assert calls == []


def test_a_well_formed_listen_is_taken() -> None:
    assert parse_listen("[::1]:8440") == ("::1", 8440)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("localhost:8440") == ("localhost", 8440)
    assert parse_listen("::1:8440") == ("::1", 8440)


# -- 4: --config that is no regular file -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "said"),
    [("dir", "a directory, not a configuration file"), ("/dev/null", "not a regular file")],
)
def test_a_config_that_is_no_regular_file_says_what_it_is(tmp_path: Path, given: str, said: str) -> None:
    """Catches ``loom config check --config DIR`` (or ``/dev/null``) saying "no such configuration
    file" of a path that is there."""
    path = tmp_path if given == "dir" else Path(given)
    one_line_error(loom_cli("config", "check", "--config", str(path)), f"--config {path}: {said}")
    one_line_error(loom_cli("serve", "--config", str(path)), f"--config {path}: {said}")
    missing = tmp_path / "missing.toml"
    one_line_error(loom_cli("config", "check", "--config", str(missing)), "no such configuration file")


# -- 5: an empty --db ---------------------------------------------------------------------------------------


def test_an_empty_db_is_refused_as_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches ``loom vacuum --db ''`` saying "'.' is not a loom database" (an empty path read as the
    working directory), and ``config check --db ''`` refusing it in other words."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOM_CONFIG", raising=False)
    one_line_error(loom_cli("vacuum", "--db", ""), "--db is empty: give the path of a loom database")
    one_line_error(loom_cli("config", "check", "--db", ""), "--db is empty: give the path of a loom database")
    assert list(tmp_path.iterdir()) == []


# -- 6: an empty --delivery-id ------------------------------------------------------------------------------


def test_an_empty_delivery_id_is_refused(server: FakeServer) -> None:
    """Catches ``loom send --delivery-id ''`` sent with a new id, as if none were given (a resend with
    the same empty id would then be accepted twice), while ``--source ''`` is refused."""
    result = _send("x.y", "--scope", "s", "--delivery-id", "", url=server.url)
    one_line_error(result, "--delivery-id is empty: give the delivery's id, or leave it out for a new one")
    assert server.requests == []
    assert _send("x.y", "--scope", "s", url=server.url).exit_code == 0
    assert len(server.requests[0][2]["delivery_id"]) == 32, "a new one when none is given"


# -- 7: JSON the decoder would explain in its own words ------------------------------------------------------


def test_json_nested_too_deeply_is_said_in_loom_words(server: FakeServer, tmp_path: Path) -> None:
    """Catches "maximum recursion depth exceeded while decoding a JSON array from a unicode string"."""
    deep = "[" * 10_000 + "]" * 10_000
    for payload in (deep, '{"a": ' + deep + "}"):
        result = _send("x.y", "--scope", "s", "--payload", payload, url=server.url)
        one_line_error(result, f"--payload is nested too deeply (more than {MAX_JSON_DEPTH} levels)")
        assert "recursion" not in result.stderr
    batch = tmp_path / "batch.jsonl"
    batch.write_text(deep + "\n")
    sent = _send("--batch", str(batch), url=server.url)
    assert sent.exit_code == 1
    assert sent.stdout == f"1: refused: line 1 is nested too deeply (more than {MAX_JSON_DEPTH} levels)\n"
    assert server.requests == []


def test_json_nested_up_to_the_limit_is_sent(server: FakeServer) -> None:
    """Catches brackets inside strings counted as nesting, or the limit itself refused."""
    inside = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)
    text = '{"a": ' + inside + ', "b": "' + '[{\\"' * 2000 + '"}'
    assert _send("x.y", "--scope", "s", "--payload", text, url=server.url).exit_code == 0
    assert server.requests[0][2]["payload"]["b"] == '[{"' * 2000


def test_a_number_of_too_many_digits_is_said_in_loom_words(server: FakeServer, tmp_path: Path) -> None:
    """Catches "Exceeds the limit (4300 digits) for integer string conversion ...; use
    sys.set_int_max_str_digits() to increase the limit"."""
    payload = '{"a": ' + "9" * 5000 + "}"
    result = _send("x.y", "--scope", "s", "--payload", payload, url=server.url)
    one_line_error(result, "--payload holds a number of more than 4300 digits")
    assert "sys." not in result.stderr
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"type": "x.y"}\n[-' + "1" * 5000 + "]\n")
    sent = _send("--batch", str(batch), "--json", url=server.url)
    assert (
        json.loads(sent.stdout)["results"][1]["error"]["message"]
        == "line 2 holds a number of more than 4300 digits"
    )


def test_a_batch_line_ends_at_a_newline_only(server: FakeServer, tmp_path: Path) -> None:
    """Catches a batch line cut in two at a U+2028 (or U+0085, or a form feed) inside a JSON string,
    both halves refused as not JSON, where the server reads the line whole."""
    event = {
        "source": "s",
        "delivery_id": "d",
        "type": "x.y",
        "scope": "s",
        "payload": {"a": "x\u2028\x85\x0cy"},
    }
    batch = tmp_path / "batch.jsonl"
    batch.write_text(json.dumps(event, ensure_ascii=False) + "\r\n")
    sent = _send("--batch", str(batch), url=server.url)
    assert sent.exit_code == 0, sent.output
    assert server.requests == [("POST", "/events", [event])]
