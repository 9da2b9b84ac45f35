"""Helpers for the service tests: the app in-process over a real runtime (httpx's ASGI transport, under
trio), a byte-level snapshot of the store, and ``loom serve`` as a real subprocess."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

import loom
from loom.service.serve import Service, open_service
from loom.store import SQLiteStore
from loom.testing import T0_MS

CONFIG_TOML = """
[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true

[[scopes.shop.routes]]
name = "approvals"
types = ["approval.*"]
"""
CONFIG = loom.Config.from_toml(CONFIG_TOML)
JSON = {"Content-Type": "application/json"}
"""The header of a body sent as raw bytes (``content=``): the service refuses a body of any other type."""


def snapshot(path: Path) -> dict[str, list[str]]:
    """Every row of every table, through a read-only connection of its own."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: sorted(map(repr, conn.execute(f'SELECT * FROM "{table}"'))) for table in tables}
    finally:
        conn.close()


@attrs.define
class Api:
    """An in-process service on a file store, with a client talking to its app."""

    client: httpx.AsyncClient
    service: Service
    db: Path

    @property
    def rt(self) -> loom.Runtime:
        return self.service.runtime

    @property
    def clock(self) -> loom.ManualClock:
        assert self.service.clock is not None
        return self.service.clock

    async def snapshot(self) -> dict[str, list[str]]:
        await self.rt.wait_idle()
        return snapshot(self.db)

    async def unchanged(self, request: Awaitable[httpx.Response]) -> httpx.Response:
        """Make ``request`` and check that the store is byte for byte what it was."""
        before = await self.snapshot()
        response = await request
        after = await self.snapshot()
        changed = {t for t in set(before) | set(after) if before.get(t) != after.get(t)}
        assert not changed, f"a refused request changed tables {sorted(changed)}: {response.text[:300]}"
        return response


@asynccontextmanager
async def api(
    tmp_path: Path,
    *,
    config: loom.Config = CONFIG,
    test_clock: bool = True,
    plugins: tuple[object, ...] = (),
    actors: bool = True,
    stopping: trio.Event | None = None,
) -> AsyncIterator[Api]:
    """``actors=False``: no background actor runs (only what requests do themselves); ``stopping``: the
    event the server sets when it stops (long-polls answer at once)."""
    db = tmp_path / "service.db"
    clock = loom.ManualClock(start_ms=T0_MS) if test_clock else None
    async with open_service(
        str(db),
        config=config,
        test_clock=clock,
        plugins=plugins,
        load_entry_points=False,
        start_actors=actors,
        stopping=stopping,
    ) as service:
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            yield Api(client=client, service=service, db=db)


def refusal(response: httpx.Response, status: int, error: str, field: str | None = None) -> dict[str, Any]:
    """Check an error answer: its status, and the body ``{error, field, message}``."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert set(body) == {"error", "field", "message"}, body
    assert body["error"] == error, body
    assert body["field"] == field, body
    assert isinstance(body["message"], str), body
    assert body["message"], body
    return body  # type: ignore[no-any-return]


def order(n: int | str, **changes: Any) -> dict[str, Any]:
    body = {
        "source": "shop",
        "delivery_id": f"o-{n}",
        "type": "order.placed",
        "scope": "shop",
        "key": f"order/{n}",
        "payload": {"n": str(n)},
    }
    body.update(changes)
    return body


async def until(check: Callable[[], Awaitable[bool]], what: str, *, seconds: float = 20.0) -> None:
    """Poll ``check`` (a read of the server) until it holds; fail after ``seconds`` of real time.

    Each round waits for the server to answer a read, never for a fixed time: this is a deadline,
    not synchronisation by sleeping."""
    with trio.move_on_after(seconds) as scope:
        while not await check():
            await trio.lowlevel.checkpoint()
    if scope.cancelled_caught:
        raise AssertionError(f"timed out after {seconds}s waiting for {what}")


# -- loom serve as a subprocess ---------------------------------------------------------------------


@attrs.define
class Server:
    """One ``loom serve`` process: its URL once it is listening."""

    proc: subprocess.Popen[str]
    url: str
    log: Path

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self._reap(20)

    def stop(self, signum: int = signal.SIGTERM, *, timeout: float = 20) -> int:
        """Ask it to stop (SIGTERM or SIGINT) and return its exit status."""
        self.proc.send_signal(signum)
        return self._reap(timeout)

    def wait(self, *, timeout: float = 20) -> int:
        """Wait for it to exit (asked to stop already) and return its exit status."""
        return self._reap(timeout)

    def _reap(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"loom serve did not stop within {timeout}s") from None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def start_server(
    db: Path | str,
    *,
    logs: Path | None = None,
    config: Path | None = None,
    test_clock: bool = True,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    timeout: float = 30,
    cwd: Path | None = None,
) -> Server:
    """Start ``loom serve`` on port 0 and wait for the line that says where it listens (``db``: a
    SQLite file, or a PostgreSQL URL with ``logs`` the directory for the server's log)."""
    if isinstance(db, str):
        assert logs is not None, "a PostgreSQL URL needs a directory for the server's log"
        log = logs / f"serve.{os.getpid()}.{len(list(logs.glob('serve.*.log')))}.log"
    else:
        log = db.with_name(db.name + f".{os.getpid()}.{len(list(db.parent.glob(db.name + '.*.log')))}.log")
    args = [sys.executable, "-m", "loom", "serve", "--db", str(db), "--listen", "127.0.0.1:0", *extra]
    if config is not None:
        args += ["--config", str(config)]
    if test_clock:
        args.append("--test-clock")
    stderr = log.open("w")
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, **(env or {})}, cwd=cwd
    )
    stderr.close()
    assert proc.stdout is not None
    line = _first_line(proc, timeout)
    if "listening on " not in line:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise AssertionError(f"loom serve did not start: {line!r}\n{log.read_text()[-3000:]}")
    url = line.split("listening on ", 1)[1].split()[0].rstrip(",")
    return Server(proc=proc, url=url, log=log)


def _first_line(proc: subprocess.Popen[str], timeout: float) -> str:
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            proc.kill()
            proc.wait()
            proc.stdout.close()
            raise AssertionError(f"loom serve printed nothing in {timeout}s")
    return proc.stdout.readline()


# -- a disk that fills up ------------------------------------------------------------------------------


class FullDisk:
    """A store's write connection on a disk that is full once ``flag`` exists: from then on every
    write transaction fails at its COMMIT with SQLite's "database or disk is full" (reads go on).
    `open_writer_on` puts it under ``SQLiteStore.open_writer``."""

    def __init__(self, conn: Any, flag: Path) -> None:
        self._conn = conn
        self._flag = flag
        self._changes = 0

    def execute(self, sql: str, parameters: Any = (), /) -> Any:
        if sql.startswith("BEGIN"):
            self._changes = self._conn.total_changes
        elif sql == "COMMIT" and self._conn.total_changes != self._changes and self._flag.exists():
            raise sqlite3.OperationalError("database or disk is full")
        return self._conn.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any, /) -> Any:
        return self._conn.executemany(sql, parameters)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def open_writer_on(flag: Path) -> Callable[..., Any]:
    """An ``SQLiteStore.open_writer`` whose connection is a `FullDisk` once ``flag`` exists."""
    opener = SQLiteStore.open_writer

    def open_writer(self: SQLiteStore) -> Any:
        return FullDisk(opener(self), flag)

    return open_writer
