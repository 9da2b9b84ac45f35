"""``loom work wait``, ``loom work logs`` and what ``loom work get`` shows of a failure (against the fake
server of `test_cli`, which records each request and answers as the API does)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_cli import T9, WORK, WORK_VIEW, FakeServer, loom_cli, paris_time

RESULT = {
    "work_id": "wk_1",
    "state": "completed",
    "done": True,
    "settled": True,
    "value": {"total": 42},
    "error": None,
    "attempts": 1,
    "failures": 0,
    "retry": None,
    "next_retry_at_ms": None,
    "held": False,
    "hold_reason": None,
    "execution_id": "ex_1",
    "ended_at_ms": T9,
}


__all__ = ["paris_time"]  # local time is Paris, and now a little after 09:04 UTC, for every test here


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def test_work_wait_long_polls_and_prints_the_value(server: FakeServer) -> None:
    """Catches a wait that polls without the server's long-poll, or hides the value."""
    server.answers["GET", "/work/wk_1/result"] = (200, RESULT)
    result = loom_cli("work", "wait", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == 'work wk_1 completed: {"total": 42}'
    assert server.requests == [("GET", "/work/wk_1/result?wait=30", None)]


def test_work_wait_finds_the_work_by_its_key(server: FakeServer) -> None:
    """Catches a --key that is ignored or not looked up (a wait on a Work named by a key, as right after
    ``loom send``), and a command that takes both an id and a key, or neither."""
    server.answers["GET", "/work/by-key/order%2F1"] = (200, WORK_VIEW)
    server.answers["GET", "/work/wk_1/result"] = (200, RESULT)
    result = loom_cli("work", "wait", "--key", "order/1", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert server.requests == [
        ("GET", "/work/by-key/order%2F1", None),
        ("GET", "/work/wk_1/result?wait=30", None),
    ]
    for args in (("wk_1", "--key", "order/1"), ()):
        refused = loom_cli("work", "wait", *args, "--url", server.url)
        assert refused.exit_code != 0
        assert "give a Work id or --key KEY" in refused.output


@pytest.mark.parametrize(
    ("changes", "status", "said"),
    [
        ({"state": "failed", "done": True, "error": "no stock", "value": None}, 1, "failed after 1 attempt(s)"),
        (
            {"state": "ready", "done": False, "retry": "exhausted", "held": True, "error": "no stock",
             "hold_reason": "retries exhausted", "value": None},
            1,
            "is held, its retries spent; the last error: no stock",
        ),
        (
            {"state": "ready", "done": False, "settled": False, "retry": "backoff", "error": "no stock",
             "next_retry_at_ms": T9, "value": None},
            2,
            "next attempt at 2026-01-01 10:00:00+01:00 (4 min ago)",
        ),
    ],
)  # fmt: skip
def test_work_wait_exit_status_says_how_it_ended(
    server: FakeServer, changes: dict[str, Any], status: int, said: str
) -> None:
    """Catches a wait that exits 0 for a Work that failed, or that hangs past its --timeout."""
    server.answers["GET", "/work/wk_1/result"] = (200, {**RESULT, **changes})
    result = loom_cli("work", "wait", "wk_1", "--timeout", "1", "--url", server.url)
    assert result.exit_code == status, result.output
    assert said in result.stdout


def test_work_logs_reads_the_latest_attempt_by_default(server: FakeServer) -> None:
    """Catches a logs command that cannot find the attempt, or prints only one stream."""
    server.answers["GET", "/work/wk_1/result"] = (200, {**RESULT, "attempts": 3})
    logs = {"work_id": "wk_1", "attempt": 3, "execution_id": "ex_3", "executor": "shell",
            "logs": {"stdout": "built\n", "stderr": ""}}  # fmt: skip
    server.answers["GET", "/work/wk_1/attempts/3/logs"] = (200, logs)
    result = loom_cli("work", "logs", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "== stdout of attempt 3 (ex_3) ==",
        "built",
        "== stderr of attempt 3 (ex_3) ==",
        "(empty)",
    ]
    assert server.requests[-1][1] == "/work/wk_1/attempts/3/logs?tail=65536"


def test_work_get_shows_the_backoff_the_last_error_and_why_it_cannot_start(server: FakeServer) -> None:
    """Catches a view where a failing Work looks merely ready."""
    failing = {**RESULT, "state": "ready", "done": False, "settled": False, "value": None, "retry": "backoff",
               "error": "exit status 1; stderr: boom", "next_retry_at_ms": T9 + 300_000}  # fmt: skip
    diagnostic = {"id": 3, "kind": "attempt_failed", "subject": "wk_1", "at_ms": T9,
                  "message": "attempt 1 (ex_1) failed: exit status 1", "detail": {}}  # fmt: skip
    view = {**WORK_VIEW, "work": {**WORK, "retry": "backoff", "blocked": None}, "result": failing,
            "diagnostics": [diagnostic]}  # fmt: skip
    server.answers["GET", "/work/wk_1"] = (200, view)
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    assert "backoff: the next attempt at 2026-01-01 10:05:00+01:00 (in " in result.stdout
    assert "last error  exit status 1; stderr: boom" in result.stdout
    assert "attempt_failed: attempt 1 (ex_1) failed: exit status 1" in result.stdout
