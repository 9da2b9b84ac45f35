"""Stopping ``loom serve`` while a plain ``def`` function runs (docs/operations.md, "Restarts and the
processes loom starts"): the first SIGTERM waits for it (a worker thread cannot be interrupted), the
second ends the process at once, and what it committed stands."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path

import trio
from service_kit import start_server

from loom import open_runtime
from loom.records.work import ExecutionState

APP = """
import os
import time

import loom

app = loom.App()


@app.function("block")
def block(request, toolbelt):
    here = os.path.dirname(os.path.abspath(__file__))
    open(os.path.join(here, "started"), "w").close()
    while not os.path.exists(os.path.join(here, "go")):  # the test's code: it never returns itself
        time.sleep(0.01)
    return "done"
"""

CONFIG = """
app = "blocker:app"

[scopes.app.bindings.block]
executor = "python"
config = { function = "block" }

[[scopes.app.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
binding = "block"
"""

DEADLINE_S = 30
POLL_S = 0.01


def post(url: str, body: dict[str, object]) -> int:
    request = urllib.request.Request(
        f"{url}/events", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=DEADLINE_S) as answer:
        return int(answer.status)


async def appears(path: Path, text: str = "") -> None:
    """Until the server wrote ``path`` (holding ``text``): a deadline, never a fixed sleep."""
    for _ in range(int(DEADLINE_S / POLL_S)):
        if os.path.exists(path) and text in Path(path).read_text():  # noqa: ASYNC240 - a local file, polled
            return
        await trio.sleep(POLL_S)
    raise AssertionError(f"{path} never held {text!r}")


async def test_a_second_sigterm_stops_a_server_waiting_for_a_plain_function(tmp_path: Path) -> None:
    """Catches a second signal that only raises in the signal's task (trio then waits for the worker
    thread all the same: seen, the server was still running at the deadline), and a first one that
    does not say how to stop at once."""
    (tmp_path / "blocker.py").write_text(APP)
    (tmp_path / "loom.toml").write_text(CONFIG)
    server = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path / "loom.db", cwd=tmp_path, env={"PYTHONDONTWRITEBYTECODE": "1"})
    )
    try:
        event = {"source": "t", "delivery_id": "d1", "type": "job.x", "scope": "app", "key": "k/1"}
        assert await trio.to_thread.run_sync(post, server.url, event) == 201
        await appears(tmp_path / "started")
        server.proc.send_signal(signal.SIGTERM)
        await appears(server.log, "SIGTERM: stopping (send it again to stop at once)")
        assert server.proc.poll() is None, "the first SIGTERM waits for the function"
        status = await trio.to_thread.run_sync(lambda: server.stop(signal.SIGTERM, timeout=DEADLINE_S))
        assert status == 128 + signal.SIGTERM
        assert "SIGTERM again: stopping at once" in server.log.read_text()
    finally:
        (tmp_path / "go").touch()
        if server.proc.poll() is None:
            server.kill()


async def test_a_first_sigterm_lets_a_running_function_return_and_commit(tmp_path: Path) -> None:
    """Catches a stop that throws a running function's answer away (before the drain, the attempt
    was left running, and the next start failed it: its Work spent a retry and waited out its
    backoff) and one that waits for nothing."""
    (tmp_path / "blocker.py").write_text(APP)
    (tmp_path / "loom.toml").write_text(CONFIG)
    server = await trio.to_thread.run_sync(
        lambda: start_server(
            tmp_path / "loom.db",
            cwd=tmp_path,
            env={"PYTHONDONTWRITEBYTECODE": "1"},
            extra=["--stop-grace", "60"],
        )
    )
    try:
        event = {"source": "t", "delivery_id": "d1", "type": "job.x", "scope": "app", "key": "k/1"}
        assert await trio.to_thread.run_sync(post, server.url, event) == 201
        await appears(tmp_path / "started")
        server.proc.send_signal(signal.SIGTERM)
        await appears(server.log, "waiting up to 60 s for running functions to return")
        assert server.proc.poll() is None, "the drain waits for the function"
        (tmp_path / "go").touch()
        status = await trio.to_thread.run_sync(lambda: server.wait(timeout=DEADLINE_S))
        assert status == 0
    finally:
        (tmp_path / "go").touch()
        if server.proc.poll() is None:
            server.kill()
    async with open_runtime(tmp_path / "loom.db", actors=(), load_entry_points=False) as rt:
        history = await rt.history((await rt.work_for_key("k/1")).id)
    assert [(e.state, (e.outcome or {}).get("value")) for e in history.executions] == [
        (ExecutionState.COMPLETED, "done")
    ]
