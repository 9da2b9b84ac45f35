"""What ``loom serve`` logs (docs/operations.md "Logs"), read from a real server process's stderr:
``--log-format json`` writes one JSON object a line with the documented fields; start-up says the
store, the configuration file, the plugins and the address; each request is one access line at info;
SIGHUP reloads the configuration file, and a refused file keeps the configuration in force and says
why."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import trio
from service_kit import CONFIG_TOML, Server, order, start_server, until

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
REFUND_ROUTE = """
[[scopes.shop.routes]]
name = "refunds"
types = ["refund.*"]
create_work = true
"""


def refund(n: int) -> dict[str, object]:
    return {
        "source": "shop",
        "delivery_id": f"r-{n}",
        "type": "refund.asked",
        "scope": "shop",
        "key": f"refund/{n}",
    }


async def _stopped(server: Server) -> str:
    await trio.to_thread.run_sync(server.stop)
    return await trio.Path(server.log).read_text()


QUIET_TOML = """
[[scopes.shop.routes]]
name = "notes"
types = ["note.*"]
"""
"""A configuration `loom config check` finds nothing wrong with (a route that creates Work and names
no binding is warned of at start)."""


async def test_json_logs_are_one_object_a_line_with_the_documented_fields(tmp_path: Path) -> None:
    """Catches a JSON log with a line that is not one JSON object (a banner, a traceback, the
    access log in another format), a field missing or renamed, a time that is not ISO 8601 UTC,
    start-up lines that leave out the store, the config, the plugins or the address, and an access
    line written twice or below info."""
    config = tmp_path / "loom.toml"
    config.write_text(CONFIG_TOML)
    server = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path / "logs.db", config=config, extra=["--log-format", "json"])
    )
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.post("/events", json=order(1))).status_code == 201
            assert (await client.get("/work/wk_missing")).status_code == 404
    finally:
        text = await _stopped(server)
    records = []
    for line in text.splitlines():
        record = json.loads(line)  # every line is one JSON object
        assert isinstance(record, dict), line
        assert (
            {"time", "level", "logger", "message"}
            <= set(record)
            <= {"time", "level", "logger", "message", "exception"}
        ), line
        assert ISO_UTC.match(record["time"]), record["time"]
        assert record["level"] in ("debug", "info", "warning", "error", "critical"), record
        records.append(record)
    messages = [r["message"] for r in records if r["logger"] == "loom.service"]
    assert any(m.startswith("store: ") and "logs.db" in m for m in messages), messages
    assert any(m.startswith("config: ") and str(config) in m for m in messages), messages
    assert any(m.startswith("plugins: ") and "loom.plugins.handlers" in m for m in messages), messages
    assert any(m.startswith("listening on http://127.0.0.1:") for m in messages), messages
    access = [r for r in records if r["logger"] == "loom.service.access"]
    posted = [r for r in access if '"POST /events' in r["message"]]
    missing = [r for r in access if '"GET /work/wk_missing' in r["message"]]
    assert len(posted) == 1, access
    assert len(missing) == 1, access
    assert posted[0]["level"] == "info"
    assert '"POST /events HTTP/1.1" 201 ' in posted[0]["message"]
    assert " 404 " in missing[0]["message"]
    assert messages[-1] == "stopped cleanly"


async def _reloadable(tmp_path: Path) -> tuple[Path, Server, Callable[[str], Awaitable[bool]]]:
    """A server started with a configuration file (what SIGHUP reloads): the file, the server, and
    whether its log holds a fragment yet."""
    config = tmp_path / "loom.toml"
    config.write_text(CONFIG_TOML)
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path / "hup.db", config=config))
    log = trio.Path(server.log)

    async def logged(fragment: str) -> bool:
        return fragment in await log.read_text()

    return config, server, logged


async def test_a_sighup_as_soon_as_the_server_says_it_listens_reloads(tmp_path: Path) -> None:
    """The line saying the server listens comes once SIGHUP reloads: a SIGHUP sent the moment it is read
    is a reload, not the signal's default action (the end of the process). Catches the handler put in
    place after that line (the server then dies of the SIGHUP, exit status -1)."""
    config, server, logged = await _reloadable(tmp_path)
    try:
        server.proc.send_signal(signal.SIGHUP)
        await until(lambda: logged(f"SIGHUP: reloaded {config}"), "the reload")
        assert server.proc.poll() is None, "the SIGHUP ended the server"
    finally:
        await _stopped(server)


async def test_sighup_reloads_the_config_and_a_refused_file_keeps_the_one_in_force(tmp_path: Path) -> None:
    """Catches a SIGHUP that is ignored (the new route would not route), one that stops the server,
    a refused file that replaces the configuration in force (the route would vanish) or is refused
    without saying why, and a text access log written twice."""
    config, server, logged = await _reloadable(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.post("/events", json=refund(1))).status_code == 201
            config.write_text(CONFIG_TOML + REFUND_ROUTE)
            server.proc.send_signal(signal.SIGHUP)
            await until(lambda: logged(f"SIGHUP: reloaded {config}"), "the reload")

            assert (await client.post("/events", json=refund(2))).status_code == 201

            async def routed(key: str) -> bool:
                return (await client.get(f"/work/by-key/{key}")).status_code == 200

            await until(lambda: routed("refund/2"), "the new route to make a Work")
            assert (await client.get("/work/by-key/refund/1")).status_code == 404, (
                "accepted before the reload"
            )

            config.write_text(CONFIG_TOML + REFUND_ROUTE + '\n[scopes.shop]\ncapacity = "many"\n')
            server.proc.send_signal(signal.SIGHUP)
            await until(lambda: logged("was not reloaded, the configuration in force stays"), "the refusal")
            assert (await client.post("/events", json=refund(3))).status_code == 201
            await until(lambda: routed("refund/3"), "the route still in force")
            assert server.proc.poll() is None, "a refused file does not stop the server"
    finally:
        text = await _stopped(server)
    refusal = next(line for line in text.splitlines() if "was not reloaded" in line)
    assert " ERROR loom.service: " in refusal
    assert str(config) in refusal
    assert "capacity" in refusal, "the refusal names the key"
    posts = [line for line in text.splitlines() if '"POST /events' in line]
    assert len(posts) == 3, posts
    assert all(" INFO loom.service.access: " in line for line in posts), posts


async def test_a_sighup_that_names_another_app_says_it_needs_a_restart(tmp_path: Path) -> None:
    """An app is imported once, at the start. Catches a reload that takes a changed ``app`` in silence
    (the server went on running the app it started with, and said only "reloaded")."""
    config, server, logged = await _reloadable(tmp_path)
    try:
        config.write_text('app = "tasks_v2:app"\n' + CONFIG_TOML)
        server.proc.send_signal(signal.SIGHUP)
        await until(lambda: logged("restart the server to run another, or new code"), "the warning")
    finally:
        text = await _stopped(server)
    warning = next(line for line in text.splitlines() if "restart the server" in line)
    assert " WARNING loom.service: " in warning
    assert "app = 'tasks_v2:app'" in warning


async def test_a_stop_ends_open_watches_cleanly_and_logs_no_error(tmp_path: Path) -> None:
    """Catches a stop that leaves a ``/watch`` stream (the console keeps one open) running until the
    grace period cuts its connection (the client sees a broken stream, not its end), and a normal run
    and stop that logs a warning, an error or a traceback."""
    config = tmp_path / "loom.toml"  # without one, serve warns that every Event will be unmatched
    config.write_text(QUIET_TOML)
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path / "watch.db", config=config))
    ended: list[str] = []
    try:
        async with httpx.AsyncClient(base_url=server.url) as client, trio.open_nursery() as nursery:
            assert (await client.post("/events", json=order(1))).status_code == 201
            watching = trio.Event()

            async def watch() -> None:
                async with client.stream("GET", "/watch", timeout=60) as response:
                    async for line in response.aiter_lines():
                        watching.set()
                        ended.append(line)
                ended.append("end")

            nursery.start_soon(watch)
            await watching.wait()
            await trio.to_thread.run_sync(server.stop)
    finally:
        if server.proc.poll() is None:
            await trio.to_thread.run_sync(server.stop)
    assert ended[-1] == "end", ended
    text = await trio.Path(server.log).read_text()
    assert server.proc.returncode == 0, text
    assert "stopped cleanly" in text
    alarming = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
    assert alarming == []
    assert "Traceback" not in text
    [watch_line] = [line for line in text.splitlines() if '"GET /watch' in line]
    assert " INFO loom.service.access: " in watch_line
