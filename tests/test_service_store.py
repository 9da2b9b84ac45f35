"""``loom serve`` as a failing disk meets it (docs/operations.md): one process per SQLite file, a file
deleted, corrupt or full under a running server. Whatever the store cannot do is answered 503 (reads
too, and ``/healthz``), nothing is acknowledged that a restart would not find, and a server the store
stopped says why in one line."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from service_kit import api, open_writer_on, order, refusal, start_server, until

import loom
from loom.plugins.shell import default_executor
from loom.service.serve import serve
from loom.store import SQLiteStore
from loom.testing import T0_MS

PAGE = 4096


def _serve_args(db: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "loom", "serve", "--db", str(db), "--listen", "127.0.0.1:0", *extra]


# -- one process per file ------------------------------------------------------------------------------


async def test_a_second_serve_on_the_same_file_is_refused_in_one_line(tmp_path: Path) -> None:
    """Two servers on one file both held leases as owner ``loom`` (each recovering the other's attempts
    as its own). Catches a lock taken only after the file was migrated or written, a lock that
    outlives its process (a restart after the first one stops must work), and a traceback."""
    db = tmp_path / "loom.db"
    first = await trio.to_thread.run_sync(lambda: start_server(db))
    try:
        with trio.fail_after(60):  # a second server that starts would serve for ever: a deadline, not a wait
            second = await trio.run_process(
                _serve_args(db), capture_stdout=True, capture_stderr=True, check=False
            )
        stderr = second.stderr.decode()
        assert second.returncode == 1, stderr
        assert stderr.count("\n") == 1, stderr
        assert f"in use by another loom process (pid {first.proc.pid})" in stderr
        assert b"listening" not in second.stdout
        async with httpx.AsyncClient(base_url=first.url) as client:
            assert (await client.post("/events", json=order(1))).status_code == 201
    finally:
        assert await trio.to_thread.run_sync(first.stop) == 0
    again = await trio.to_thread.run_sync(lambda: start_server(db))
    await trio.to_thread.run_sync(again.kill)  # a killed holder's lock goes with it
    last = await trio.to_thread.run_sync(lambda: start_server(db))
    await trio.to_thread.run_sync(last.stop)


EMBEDDED = """
import sys, trio, loom
async def main():
    try:
        async with loom.open_runtime(sys.argv[1], load_entry_points=False, actors=()):
            print("opened")
    except loom.StorageError as exc:
        print("refused:", exc)
trio.run(main)
"""


async def test_open_runtime_from_a_second_process_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    db = str(tmp_path / "loom.db")

    async def other_process() -> str:
        done = await trio.run_process([sys.executable, "-c", EMBEDDED, db], capture_stdout=True, check=True)
        return done.stdout.decode().strip()

    async with loom.open_runtime(db, load_entry_points=False, actors=()) as rt:
        answer = await other_process()
        assert answer.startswith("refused:"), answer
        assert f"{db} is in use by another loom process (pid {os.getpid()})" in answer
        async with loom.open_runtime(db, load_entry_points=False, actors=()) as same_process:
            assert await same_process.events() == await rt.events()  # this process may open it again
        assert await other_process() == "refused: " + answer.removeprefix("refused: ")
    assert await other_process() == "opened"


# -- a file deleted, corrupt or full under a running server ------------------------------------------


async def test_a_deleted_file_is_never_written_again_and_answers_503(tmp_path: Path) -> None:
    """After the file was deleted, ``POST /events`` kept answering 201 and the Events were gone at
    restart. Catches a check of the path only at open, and reads served from the deleted file. (No
    actor runs: the first of them to write would stop the runtime, as any storage failure does.)"""
    async with api(tmp_path, actors=False) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201
        os.unlink(a.db)
        for n in (2, 3):
            refusal(await a.client.post("/events", json=order(n)), 503, "unavailable")
        body = refusal(await a.client.get("/events"), 503, "unavailable")
        assert "deleted" in body["message"]
        refusal(await a.client.get("/healthz"), 503, "unavailable")
        assert not a.db.exists()


def _corrupt(db: Path, table: str, *, index: bool) -> None:
    """Overwrite the root page of ``table`` (or of its unique index on source and delivery id)."""
    store = SQLiteStore(path=str(db))
    store.open_writer().close()
    conn = sqlite3.connect(db)
    kind, name = ("index", "sqlite_autoindex_events_2") if index else ("table", table)
    (page,) = conn.execute(
        "SELECT rootpage FROM sqlite_master WHERE type = ? AND name = ?", (kind, name)
    ).fetchone()
    conn.close()
    with db.open("r+b") as file:
        file.seek((page - 1) * PAGE)
        file.write(b"\xff" * PAGE)


async def test_on_a_corrupt_store_writes_and_health_answer_503(tmp_path: Path) -> None:
    """Every write got 503 while ``/healthz`` kept answering 200. Catches a health check that only
    reads (this corruption is in the index acceptance writes, not in what a read of Events touches),
    and one whose write probe touches only healthy pages (once found corrupt, the store takes no more
    writes). No actor runs: the first of them to write would stop the runtime."""
    _corrupt(tmp_path / "service.db", "events", index=True)
    async with api(tmp_path, actors=False) as a:
        body = refusal(await a.client.post("/events", json=order(1)), 503, "unavailable")
        assert "malformed" in body["message"] or "corrupt" in body["message"]
        body = refusal(await a.client.get("/healthz"), 503, "unavailable")
        assert "corrupt" in body["message"]
        refusal(await a.client.post("/events", json=order(2)), 503, "unavailable")


async def test_a_read_the_store_fails_answers_503_not_500(tmp_path: Path) -> None:
    _corrupt(tmp_path / "service.db", "events", index=False)
    async with api(tmp_path, actors=False) as a:
        refusal(await a.client.get("/events"), 503, "unavailable")
        page = await a.client.get("/ui/work/wk_nope")
        assert page.status_code in (404, 503)


FULL_DISK = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv.pop(1))
from service_kit import open_writer_on
from loom.store import SQLiteStore
SQLiteStore.open_writer = open_writer_on(Path(sys.argv.pop(1)))
from loom.service.cli import main
main()
"""
"""``loom serve`` on a disk that is full once a flag file exists (`service_kit.FullDisk`)."""

ATTEMPTS = 4


def _config(tmp_path: Path, flag: Path) -> Path:
    """Orders start shell attempts that run until the disk is full, then complete: each completion is
    a write of the router, from one lane per Work, all at once (a process still running when the
    runtime stops is stopped with it)."""
    config = tmp_path / "loom.toml"
    config.write_text(
        "[scopes.shop.bindings.wait]\n"
        'executor = "shell"\n'
        f'config = {{ command = ["sh", "-c", "while [ ! -e {flag} ]; do sleep 0.02; done"], on_close = "stop" }}\n'
        "[[scopes.shop.routes]]\n"
        'name = "orders"\ntypes = ["order.*"]\ncreate_work = true\nbinding = "wait"\n'
    )
    return config


async def fill_the_disk(url: str, flag: Path) -> None:
    """Start `ATTEMPTS` attempts, then fill the disk: their completions fail, which stops the server."""
    async with httpx.AsyncClient(base_url=url) as client:
        for n in range(ATTEMPTS):
            assert (await client.post("/events", json=order(n))).status_code == 201

        async def all_running() -> bool:
            return len((await client.get("/work", params={"state": "running"})).json()["work"]) == ATTEMPTS

        await until(all_running, f"{ATTEMPTS} attempts to run")
        flag.touch()  # noqa: ASYNC240 - a local file, made once


async def test_a_full_disk_stops_serve_with_one_line_not_a_traceback(tmp_path: Path) -> None:
    """When the disk filled up, every actor's storage failure came out of ``loom serve`` as exception
    groups: hundreds of lines of traceback. Catches a one-line reason only for a single failure."""
    flag = tmp_path / "full"
    args = [sys.executable, "-c", FULL_DISK, str(Path(__file__).parent), str(flag), "serve", "--db",
            str(tmp_path / "loom.db"), "--listen", "127.0.0.1:0", "--config", str(_config(tmp_path, flag))]  # fmt: skip
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(  # noqa: ASYNC220
            args,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
    assert proc.stdout is not None
    try:
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert "listening on " in line, log.read_text()[-3000:]
        await fill_the_disk(line.split("listening on ", 1)[1].split()[0], flag)
        status = await trio.to_thread.run_sync(lambda: proc.wait(60))  # a deadline, not a wait for time
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    text = log.read_text()
    assert status == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "╭" not in text, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("loom: "), text[-3000:]
    assert "disk is full" in last, text[-3000:]


class _Started:
    """Where `serve` reports its addresses when it is awaited directly (not through a nursery)."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.event = trio.Event()

    def started(self, urls: list[str]) -> None:
        self.urls = urls
        self.event.set()


async def test_serve_raises_the_storage_failure_that_stopped_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `StorageError`, not the exception groups of every lane's failure."""
    flag = tmp_path / "full"
    monkeypatch.setattr(SQLiteStore, "open_writer", open_writer_on(flag))
    monkeypatch.setattr(default_executor(), "state_dir", tmp_path / "shell")
    monkeypatch.setenv("LOOM_URL", "")  # serve sets it for the processes it runs: restored after
    started = _Started()

    async def fill_when_started() -> None:
        await started.event.wait()
        await fill_the_disk(started.urls[0], flag)

    with trio.fail_after(60):  # a deadline, not a wait for time to pass
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fill_when_started)
            with pytest.raises(loom.StorageError, match="disk is full"):
                await serve(tmp_path / "loom.db", _config(tmp_path, flag), "127.0.0.1:0", log_level="error",
                            task_status=started)  # type: ignore[arg-type]  # fmt: skip


async def test_a_read_that_finds_the_file_corrupt_stops_its_writes(tmp_path: Path) -> None:
    """A damaged page only reads touch: `POST /events` was answered 201 while `/healthz` said the file
    was corrupt, so acknowledged Events went into a file that fails its integrity check. Catches a
    writer that learns of the damage only from its own statements."""
    _corrupt(tmp_path / "service.db", "diagnostics", index=False)
    async with api(tmp_path, actors=False) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201  # untouched pages
        body = refusal(await a.client.get("/diagnostics"), 503, "unavailable")
        assert "malformed" in body["message"]
        body = refusal(await a.client.post("/events", json=order(2)), 503, "unavailable")
        assert "is corrupt" in body["message"]
        assert "restore it from a backup" in body["message"]


async def test_a_timer_that_meets_a_deleted_file_stops_the_runtime(tmp_path: Path) -> None:
    """Catches a background actor that treats a file gone for good as a passing failure: the timer
    actor looked again every second, and compaction at each sweep, and `loom serve` never exited
    (docs/operations.md "When the disk fails")."""
    db = tmp_path / "loom.db"
    clock = loom.ManualClock(start_ms=T0_MS)

    async def run() -> None:
        async with loom.open_runtime(db, clock=clock, load_entry_points=False, actors=("timers",)) as rt:
            spec = loom.TimerSpec(id="t", fire_at_ms=T0_MS + 1000, source="c", type="c.tick", scope="s")
            await rt.arm(spec)
            os.unlink(db)
            clock.advance(1000)
            await trio.sleep_forever()  # until the timer actor stops the runtime

    # (the deadline is a watchdog: a runtime that goes on ends the test with TooSlowError, not a hang)
    with trio.fail_after(20), pytest.raises(BaseException) as stopped:  # noqa: PT011  # a group, or not
        await run()
    found = stopped.value
    if isinstance(found, BaseExceptionGroup):
        match, _ = found.split(loom.StorageLost)
        assert match is not None, repr(found)
        found = match.exceptions[0]
    assert isinstance(found, loom.StorageLost), repr(found)
    assert "was deleted while loom had it open" in str(found)
