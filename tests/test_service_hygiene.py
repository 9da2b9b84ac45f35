"""``loom serve`` and the processes it starts (docs/operations.md): a server killed while a shell attempt
runs is restarted on the same port at once (the listening socket never leaks into the attempt), and the
restarted server adopts the attempt and stops its whole process group when the Work is cancelled.

The attempt tells the test its pid through a FIFO; the test waits for processes on pidfds and polls the
server's read endpoints under a deadline: nothing sleeps to synchronise.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import httpx
import trio
from service_kit import start_server, until

DEADLINE_S = 30

CONFIG = """
[scopes.ops.bindings.sh]
executor = "shell"
capabilities = ["interrupt", "adopt"]
config = { command = ["sh", "-c", "sleep 600 & echo $! $$ > \\"$FIFO\\"; wait"], grace_s = 5 }

[[scopes.ops.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
binding = "sh"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_server_killed_while_an_attempt_runs_restarts_on_its_port_and_cancel_stops_the_attempt(
    tmp_path: Path,
) -> None:
    """Catches a listening socket inherited by the attempt's process (the restart fails: "address
    already in use"), and a cancel that leaves the adopted attempt's grandchild running."""
    fifo = tmp_path / "pids"
    os.mkfifo(fifo)
    config = tmp_path / "loom.toml"
    config.write_text(CONFIG)
    (tmp_path / "shell").mkdir()
    env = {"FIFO": str(fifo), "TMPDIR": str(tmp_path / "shell")}
    listen = ["--listen", f"127.0.0.1:{free_port()}"]
    db = tmp_path / "loom.db"
    first = await trio.to_thread.run_sync(lambda: start_server(db, config=config, env=env, extra=listen))
    pids: list[int] = []
    try:
        async with httpx.AsyncClient(base_url=first.url, timeout=DEADLINE_S) as client:
            body = {"source": "t", "delivery_id": "j-1", "type": "job.run", "scope": "ops", "key": "job/1"}
            answer = (await client.post("/events?wait=10", json=body)).json()
            work = answer["routing"]["work_id"]
        with trio.fail_after(DEADLINE_S):
            told = await trio.to_thread.run_sync(fifo.read_text, abandon_on_cancel=True)
        pids = [int(pid) for pid in told.split()]  # the background sleep and the command
        await trio.to_thread.run_sync(first.kill)

        second = await trio.to_thread.run_sync(lambda: start_server(db, config=config, env=env, extra=listen))
        assert second.url == first.url
        pidfds = [os.pidfd_open(pid) for pid in pids]
        try:
            async with httpx.AsyncClient(base_url=second.url, timeout=DEADLINE_S) as client:

                async def adopted() -> bool:
                    view = (await client.get(f"/work/{work}")).json()
                    (attempt,) = view["history"]["executions"]
                    return bool(attempt["state"] == "running" and attempt["epoch"] > 1)

                await client.post("/debug/clock", json={"advance_ms": 61_000})  # past the old lease
                await until(adopted, "the restarted server to adopt the attempt", seconds=DEADLINE_S)
                assert (await client.post(f"/work/{work}/cancel")).status_code == 200
                with trio.fail_after(DEADLINE_S):
                    for pidfd in pidfds:
                        await trio.lowlevel.wait_readable(pidfd)  # each process of the attempt ended
            assert second.stop() == 0
        finally:
            for pidfd in pidfds:
                os.close(pidfd)
    finally:
        for pid in pids:  # a failed test leaves nothing running
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if first.proc.poll() is None:
            first.kill()
