"""``loom serve`` as a real server: schemathesis fuzzes every documented operation over HTTP and finds
the server doing what its OpenAPI document says, and the process stops cleanly on SIGTERM and SIGINT
and continues where it was after a restart."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from service_kit import CONFIG, CONFIG_TOML, order, start_server, until

import loom
from loom.service._access import Access
from loom.service.serve import DEFAULT_LISTEN, open_service, parse_listen, run_http
from loom.testing import T0_MS
from loom.testing.postgres import PostgresCluster

SCHEMATHESIS_EXAMPLES = 25
SCHEMATHESIS_SEED = 20260101


def test_the_default_listen_address_is_loopback() -> None:
    """Catches a default that exposes the unauthenticated operator API beyond this machine."""
    assert parse_listen(DEFAULT_LISTEN) == ("127.0.0.1", 8440)


CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "positive_data_acceptance",
    "negative_data_rejection",
    "missing_required_header",
    "ignored_auth",
    "unsupported_method",
    "allow_header_conformance",
    "response_schema_conformance",
)
"""What the server and its OpenAPI document must agree on: every request the document calls valid is
accepted (or refused for a state it documents: 404, 409), every one it calls invalid is refused, each
answer's status and type are documented, the operator token and the execution tokens are required
where the document says, a method the path does not take is 405 with ``Allow``, and every answer
matches the schema the document gives for its status. (``GET /watch`` streams until it has seen its
``limit`` of changes, which a fuzzer's requests never make: tests/test_service_openapi.py calls it.)"""

TOKEN = "fuzz-operator-token-0123456789"


async def test_the_server_does_what_its_openapi_document_says(tmp_path: Path) -> None:
    """Every operation in the OpenAPI document, fuzzed against the real server (Hypercorn, the runtime,
    a file store, an operator token): the checks in `CHECKS`. The toolbelt is fuzzed with a real
    execution's token, the controls against a real Work, the reads with real ids. (The document once
    refused 12 kinds of valid request and accepted 3 invalid ones: control characters in query
    filters, ``3.0`` for an integer, empty filters, keys the runtime refuses, a state-dependent
    refusal answered 400.) Requests that name state or a plugin's spec are left out of the valid ones
    by ``schemathesis_hooks.py``, which says why."""
    st = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    assert st is not None, "schemathesis is part of the dev extra: pip install -e '.[dev]'"
    async with (
        open_service(
            str(tmp_path / "fuzz.db"),
            config=CONFIG,
            test_clock=loom.ManualClock(start_ms=T0_MS),
            load_entry_points=False,
            access=Access(token=TOKEN),
        ) as service,
        trio.open_nursery() as nursery,
    ):
        urls = await nursery.start(run_http, service.app, "127.0.0.1:0")
        url = urls[0]
        operator = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=url, headers=operator) as client:
            for n in (1, 2):
                assert (await client.post("/events", json=order(n))).status_code == 201
            await service.runtime.wait_idle()
            token_work = (await client.get("/work/by-key/order/1")).json()["work"]["id"]
            other = (await client.get("/work/by-key/order/2")).json()
            lease = await service.runtime.claim(token_work, owner="fuzz")
            timer = await client.post(
                "/timers",
                json={
                    "id": "t1",
                    "fire_at_ms": T0_MS + 60_000,
                    "source": "fuzz",
                    "type": "f.t",
                    "scope": "shop",
                },
            )
            assert timer.status_code == 201
        config = tmp_path / "schemathesis.toml"
        config.write_text(
            "[parameters]\n"
            f'"path.execution_id" = "{lease.execution_id}"\n'
            f'"path.work_id" = "{other["work"]["id"]}"\n'
            f'"path.event_id" = "{other["pending_inputs"][0]["id"]}"\n'
            '"path.timer_id" = "t1"\n'
            '"path.key" = "order/2"\n'
            '"query.wait" = 0\n'  # a long-poll's wait (60 s at most) is tested where it is meant to wait
            "[auth.openapi.operatorToken]\n"
            f'bearer = "{TOKEN}"\n'
            "[auth.openapi.operatorPassword]\n"
            f'username = "fuzz"\npassword = "{TOKEN}"\n'
            "[auth.openapi.executionToken]\n"
            f'bearer = "{lease.token}"\n'
        )
        result = await trio.run_process(
            [
                st,
                "--config-file",
                str(config),
                "run",
                f"{url}/openapi.json",
                "--checks",
                ",".join(CHECKS),
                "--max-examples",
                str(SCHEMATHESIS_EXAMPLES),
                "--seed",
                str(SCHEMATHESIS_SEED),
                "--phases",
                "examples,coverage,fuzzing",
                "--workers",
                "1",
                "--exclude-path",
                "/watch",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=str(tmp_path),
            env={
                **os.environ,
                "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
                "PYTHONPATH": str(Path(__file__).parent),
            },
        )
        output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
        assert result.returncode == 0, output[-6000:]
        assert "29 selected / 30 total" in output or "Operations:" in output, output[-2000:]
        nursery.cancel_scope.cancel()


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "loom.toml"
    path.write_text(CONFIG_TOML)
    return path


@pytest.mark.parametrize(
    ("signum", "backend"),
    [(signal.SIGTERM, "file"), (signal.SIGINT, "file"), (signal.SIGTERM, "postgres")],
)
async def test_a_signal_stops_the_server_cleanly_and_a_restart_continues(
    tmp_path: Path, signum: int, backend: str, request: pytest.FixtureRequest
) -> None:
    """Catches a server that dies on SIGTERM/SIGINT without closing the store (exit status), and a
    restart that loses state or moves the test clock (back, or on with the wall clock); on a SQLite
    file and on PostgreSQL (``loom serve --db postgresql://...``)."""
    db: Path | str = tmp_path / "loom.db"
    if backend == "postgres":
        cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
        db = cluster.create_database()
    server = await trio.to_thread.run_sync(lambda: start_server(db, logs=tmp_path, config=_config(tmp_path)))
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.post("/events", json=order(1))).status_code == 201
            assert (await client.post("/debug/clock", json={"advance_ms": 3_600_000})).status_code == 200
            moved = (await client.get("/debug/clock")).json()["now_ms"]

            async def routed() -> bool:
                return (await client.get("/work/by-key/order/1")).status_code == 200

            await until(routed, "order/1 to be routed to its Work")
            work_id = (await client.get("/work/by-key/order/1")).json()["work"]["id"]
            held = await client.post(f"/work/{work_id}/hold", json={"reason": "kept across a restart"})
            assert held.status_code == 200
    finally:
        status = await trio.to_thread.run_sync(lambda: server.stop(signum))
    assert status == 0, server.log.read_text()[-3000:]
    assert "stopped cleanly" in server.log.read_text()

    server = await trio.to_thread.run_sync(lambda: start_server(db, logs=tmp_path, config=_config(tmp_path)))
    try:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert (await client.post("/events", json=order(1))).json()["duplicate"] is True
            view = (await client.get(f"/work/{work_id}")).json()
            assert view["work"]["hold_reason"] == "kept across a restart"
            assert (await client.get("/debug/clock")).json()["now_ms"] == moved  # neither back nor on
    finally:
        await trio.to_thread.run_sync(server.stop)


def test_a_bad_config_stops_serve_before_it_listens(tmp_path: Path) -> None:
    """Catches a server that starts on a configuration it refused."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[scopes.shop]\nunknown = 1\n")
    done = subprocess.run(
        [sys.executable, "-m", "loom", "serve", "--db", str(tmp_path / "x.db"), "--config", str(bad),
         "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "unknown" in done.stderr
    assert "listening" not in done.stdout


def test_a_taken_address_is_a_one_line_error_not_a_traceback(tmp_path: Path) -> None:
    """Catches a bind failure escaping `serve` as a raw OSError inside exception groups."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "loom",
                "serve",
                "--db",
                str(tmp_path / "x.db"),
                "--listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
    assert "listening" not in done.stdout


async def test_serve_raises_invalid_request_for_a_taken_address(tmp_path: Path) -> None:
    """Catches `serve` letting an OSError (in exception groups) escape instead of a `LoomError`."""
    import socket

    from loom.service.serve import serve

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(loom.InvalidRequest) as refused:
            await serve(tmp_path / "y.db", None, f"127.0.0.1:{taken.getsockname()[1]}", log_level="warning")
    assert refused.value.field == "listen"


@pytest.mark.parametrize("grace", [-1, math.nan, 3601, True, "8"])
async def test_serve_refuses_a_stop_grace_that_is_no_seconds_before_it_opens_anything(
    tmp_path: Path, grace: object
) -> None:
    """Catches a grace taken as it is (a negative or NaN one made the drain's deadline meaningless)."""
    from loom.service.serve import serve

    with pytest.raises(loom.InvalidRequest, match="stop_grace must be seconds from 0 to 3600") as refused:
        await serve(tmp_path / "y.db", None, "127.0.0.1:0", log_level="warning", stop_grace=grace)  # type: ignore[arg-type]
    assert refused.value.field == "stop_grace"
    assert not (tmp_path / "y.db").exists()
