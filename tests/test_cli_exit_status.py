"""``loom work wait``'s exit status tells its outcomes apart (docs/http-api.md "Results"): 0 the Work
completed, 1 it ended without completing, 2 not settled within --timeout, 3 no such Work, 4 the server
could not be reached or stopped answering during the wait."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_kit import CONFIG_TOML, start_server
from test_cli import FakeServer, loom_cli, paris_time

__all__ = ["paris_time"]  # local time is Paris, and now a little after 09:04 UTC, for every test here


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_work_wait_tells_no_such_work_from_work_that_failed(server: FakeServer) -> None:
    """Catches ``loom work wait`` exiting 1 (a Work that ended without completing) when no Work has
    the id, or none owns the key yet: both are status 3, with the server's one line."""
    by_id = loom_cli("work", "wait", "wk_nope", "--url", server.url)
    assert by_id.exit_code == 3, by_id.output
    assert by_id.stderr == "loom: work_id: no work with id 'nope'\n"
    by_key = loom_cli("work", "wait", "--key", "order/9", "--url", server.url)
    assert by_key.exit_code == 3, by_key.output
    assert server.requests[-1] == ("GET", "/work/by-key/order%2F9", None)


def test_work_wait_tells_an_unreachable_server_from_work_that_failed() -> None:
    """Catches ``loom work wait`` exiting 1 (a Work that ended without completing) when the server
    cannot be reached: status 4, with one line naming the server."""
    url = _closed_port_url()
    for args in (("wk_1",), ("--key", "order/1")):
        result = loom_cli("work", "wait", *args, "--url", url)
        assert result.exit_code == 4, result.output
        assert result.stderr.startswith(f"loom: cannot reach the loom server at {url}")


def test_work_wait_exits_4_when_the_server_stops_during_the_wait(tmp_path: Path) -> None:
    """Catches ``loom work wait`` exiting 1 when the server it waits on stops before the Work's
    outcome is settled (a Work with no executor to start it stays ready: never settled)."""
    config = tmp_path / "loom.toml"
    config.write_text(CONFIG_TOML)
    server = start_server(tmp_path / "loom.db", config=config)
    waiting: subprocess.Popen[str] | None = None
    try:
        sent = loom_cli("send", "order.placed", "--scope", "shop", "--key", "order/1", "--url", server.url)
        assert sent.exit_code == 0, sent.output
        waiting = subprocess.Popen(
            [sys.executable, "-m", "loom", "work", "wait", "--key", "order/1", "--url", server.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30  # until the wait has looked the Work up (the access log says so)
        while "GET /work/by-key/" not in server.log.read_text():
            assert waiting.poll() is None, waiting.communicate()
            assert time.monotonic() < deadline, "the wait never looked its Work up"
        assert server.stop() == 0
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 4, (out, err)
        assert err.startswith(f"loom: cannot reach the loom server at {server.url}"), err
        assert err.count("\n") == 1, err
    finally:
        if waiting is not None and waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
        if server.proc.poll() is None:
            server.stop()


def test_other_commands_still_exit_1_for_no_such_work_and_an_unreachable_server(server: FakeServer) -> None:
    """Catches the statuses of ``loom work wait`` leaking into the other commands, which answer every
    user error (an unknown Work, an unreachable server) with status 1."""
    assert loom_cli("work", "get", "wk_nope", "--url", server.url).exit_code == 1
    assert loom_cli("work", "get", "wk_1", "--url", _closed_port_url()).exit_code == 1
