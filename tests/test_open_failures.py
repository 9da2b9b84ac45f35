"""An open that fails ends cleanly, as a `LoomError`, and a refused location changes nothing on disk.

* Whatever fails between the storage actor's start and the runtime being up (the reader's open above
  all) ends the open with that failure: the storage actor runs shielded from cancellation (it
  releases the leases on the way out), and an open that failed before reaching the code that ends it
  waited for it for ever, in ``loom serve`` too (deaf to SIGTERM and SIGINT).
* A path that is a directory, or a file that is not a SQLite database, is refused before the lock
  file beside it is made.
* A location no file can have (a NUL character, a lone surrogate) is `InvalidRequest`, and a
  configuration path that is not one `ConfigError`: never the ``ValueError`` or ``TypeError`` of the
  layer below.

A hang is a failure here, not a stuck test: the opens run in a trio run of their own, in a thread the
test abandons after a deadline (`_bounded`).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from service_kit import start_server

import loom
from loom.config import Config
from loom.records.errors import ConfigError, InvalidRequest, StorageError
from loom.runtime import _open as runtime_open
from loom.store import SQLiteStore, check_location
from loom.store._reader import Reader

T = TypeVar("T")
DEADLINE_S = 20


async def _bounded(scenario: Callable[[], Awaitable[T]]) -> T:
    """``scenario`` in a trio run of its own, in a thread abandoned after `DEADLINE_S` seconds: an open
    that waits for ever on a task no cancel reaches fails the test (`trio.TooSlowError`) instead of
    hanging it."""
    with trio.fail_after(DEADLINE_S):
        return await trio.to_thread.run_sync(trio.run, scenario, abandon_on_cancel=True)


async def _open_and_write(db: str | Path) -> list[str]:
    """Open the runtime on ``db``, accept an Event, and answer the Events' ids it reads back."""
    async with loom.open_runtime(db, load_entry_points=False, actors=()) as rt:
        await rt.publish(loom.EventIn(source="test", delivery_id="d1", type="probe", scope="test"))
        return [event.id for event in await rt.events()]


def _lock_is_free(db: Path) -> bool:
    """Whether nobody (this process included: a lock of this descriptor's own) holds ``db``'s lock."""
    fd = os.open(os.path.realpath(db) + ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def _reader_stat_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.stat`` raises `FileNotFoundError` in the reader's thread (as it did for a file name that is
    not UTF-8, which the reader's URI spelled as another name), and works everywhere else."""
    real_stat = os.stat

    def stat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if threading.current_thread().name == "loom reader":
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)


# -- a failed open ends cleanly ----------------------------------------------------------------------


async def test_an_os_error_in_the_readers_open_is_a_storage_error_and_ends_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches an open that waits for ever for its shielded storage actor (`trio.TooSlowError`), and
    the OS's `FileNotFoundError` let out as it is instead of a `StorageError` naming the file."""
    db = tmp_path / "loom.db"
    _reader_stat_fails(monkeypatch)
    with pytest.raises(StorageError, match=f"cannot open a reader on {db}: No such file or directory"):
        await _bounded(lambda: _open_and_write(str(db)))
    assert _lock_is_free(db)  # the writer closed: nothing of the failed open is left
    monkeypatch.undo()
    assert len(await _bounded(lambda: _open_and_write(str(db)))) == 1


class Boom(Exception):
    """A failure of no kind loom knows (a fault in a step of the open)."""


@pytest.mark.parametrize("where", ["open_reader", "reader.open", "reader.open refused"])
async def test_any_failure_after_the_storage_actor_started_ends_the_open_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Not only the reader's `StorageError`: any exception between the storage actor's start and the
    runtime being up leaves the open as itself, with the store closed. Catches the shielded storage
    actor left running (the open hangs: `trio.TooSlowError`)."""
    db = tmp_path / "loom.db"
    failure: Exception = StorageError("refused by the test") if where.endswith("refused") else Boom("boom")

    def failing_open_reader(*args: object) -> Reader:
        raise failure

    async def failing_open(self: Reader) -> None:
        raise failure

    if where == "open_reader":
        monkeypatch.setattr(runtime_open, "open_reader", failing_open_reader)
    else:
        monkeypatch.setattr(Reader, "open", failing_open)
    with pytest.raises(type(failure), match=str(failure)):
        await _bounded(lambda: _open_and_write(str(db)))
    assert _lock_is_free(db)


async def test_an_open_cancelled_while_its_reader_opens_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that comes while the reader opens (a reader that never answers) ends the open. Catches
    the cancel stopping at the shielded storage actor (`trio.TooSlowError`)."""
    db = tmp_path / "loom.db"
    reached: list[trio.Event] = []

    async def endless_open(self: Reader) -> None:
        reached[0].set()
        await trio.sleep_forever()

    monkeypatch.setattr(Reader, "open", endless_open)

    async def scenario() -> bool:
        reached.append(trio.Event())
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_open_and_write, str(db))
                await reached[0].wait()
                scope.cancel()
        return scope.cancelled_caught

    assert await _bounded(scenario)
    assert _lock_is_free(db)


@pytest.mark.parametrize("checkpoints", [0, 1, 2, 5, 20, 100])
@pytest.mark.parametrize("store", ["memory", "file"])
async def test_an_open_cancelled_while_the_store_opens_ends(
    tmp_path: Path, store: str, checkpoints: int
) -> None:
    """A cancel that comes while the storage actor starts (after that many checkpoints of the canceller:
    before the open, in the store's open, in its start-up work) ends the open. Catches a storage actor
    shielded from its start: trio leaves a task that reports started under a cancelled starter where it
    is, and the open waited for ever on an actor serving nobody (seen from 0 checkpoints on)."""
    db = ":memory:" if store == "memory" else str(tmp_path / "loom.db")

    async def scenario() -> bool:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_open_and_write, db)
                for _ in range(checkpoints):
                    await trio.lowlevel.checkpoint()
                scope.cancel()
        return True

    assert await _bounded(scenario)
    if store == "file" and os.path.exists(db + ".lock"):  # noqa: ASYNC240 - a stat, after the run
        assert _lock_is_free(Path(db))


async def test_a_file_name_that_is_not_utf8_opens(tmp_path: Path) -> None:
    """The reader read its file's name back from its URI as UTF-8 (``\\xff`` became U+FFFD), found no
    such file, and the open hung. Catches that name read back wrong (a `StorageError` then, or the
    hang)."""
    db = tmp_path / os.fsdecode(b"\xff.db")
    ids = await _bounded(lambda: _open_and_write(str(db)))
    assert await _bounded(lambda: _open_and_write(str(db))) == ids  # read back from the same file
    assert os.fsencode(db.name) in os.listdir(os.fsencode(tmp_path))


@pytest.mark.timeout(120)
async def test_serve_on_a_file_name_that_is_not_utf8_listens_and_stops(tmp_path: Path) -> None:
    """``loom serve --db $'/dir/\\xff.db'`` printed nothing, never listened and ignored SIGTERM.
    Catches any of that (the server's start has a deadline of its own)."""
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path / os.fsdecode(b"\xff.db")))
    assert await trio.to_thread.run_sync(server.stop) == 0


READER_FAILS = """
import os, sys, threading
real_stat = os.stat
def stat(path, *args, **kwargs):
    if threading.current_thread().name == "loom reader":
        raise FileNotFoundError(2, "No such file or directory", path)
    return real_stat(path, *args, **kwargs)
os.stat = stat
from loom.service.cli import main
sys.argv = ["loom", "serve", "--db", sys.argv[1], "--listen", "127.0.0.1:0"]
main()
"""


async def _kill(process: trio.Process) -> None:
    process.kill()  # (trio's default asks with SIGTERM first, which a hung server ignores, then warns)


async def _serve_refused(*args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(60):  # a server that hangs, or starts, would run for ever: a deadline
        return await trio.run_process(
            [sys.executable, *args],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            deliver_cancel=_kill,
        )


@pytest.mark.timeout(120)
async def test_serve_whose_reader_fails_to_open_says_why_in_one_line(tmp_path: Path) -> None:
    """A reader whose open fails (``os.stat`` raising `FileNotFoundError` in its thread, simulated in
    the server's process): one line naming the file, exit status 1. Catches the hang (the deadline)
    and a traceback."""
    db = tmp_path / "loom.db"
    done = await _serve_refused("-c", READER_FAILS, str(db))
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert stderr.count("\n") == 1, stderr
    assert f"cannot open a reader on {db}: No such file or directory" in stderr
    assert b"listening" not in done.stdout


# -- a refused database leaves nothing beside it -----------------------------------------------------


def _not_a_database(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "notdb.txt"
    db.write_text("hello\n")
    return db, "not a loom database, or unreadable: file is not a database"


def _a_directory(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "somedir"
    db.mkdir()
    return db, f"cannot open {db}: unable to open database file"


REFUSED = {"text file": _not_a_database, "directory": _a_directory}


def _listing(tmp_path: Path) -> dict[str, bytes | None]:
    return {p.name: p.read_bytes() if p.is_file() else None for p in tmp_path.iterdir()}


@pytest.mark.parametrize("kind", REFUSED)
async def test_a_refused_database_path_makes_no_lock_file(tmp_path: Path, kind: str) -> None:
    """Catches the lock file taken before the path was looked at (``<path>.lock`` left beside a text
    file, or beside a directory), and a refusal that changed its message."""
    db, message = REFUSED[kind](tmp_path)
    before = _listing(tmp_path)
    with pytest.raises(StorageError) as caught:
        await _bounded(lambda: _open_and_write(str(db)))
    assert str(caught.value) == message
    assert _listing(tmp_path) == before


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", REFUSED)
async def test_serve_on_a_refused_database_path_makes_no_lock_file(tmp_path: Path, kind: str) -> None:
    db, message = REFUSED[kind](tmp_path)
    before = _listing(tmp_path)
    done = await _serve_refused("-m", "loom", "serve", "--db", str(db), "--listen", "127.0.0.1:0")
    assert (done.returncode, done.stderr.decode()) == (1, f"loom: {message}\n")
    assert _listing(tmp_path) == before


@pytest.mark.parametrize("content", [b"", b"SQLite format 3\x00"], ids=["empty", "header only"])
async def test_a_file_that_may_be_a_database_is_left_to_sqlite(tmp_path: Path, content: bytes) -> None:
    """The check before the lock refuses no more than SQLite would: an empty file becomes a new
    database, and a file with SQLite's header is SQLite's to judge. Catches a check that refuses
    every existing file, or every file that is not a complete database."""
    db = tmp_path / "loom.db"
    db.write_bytes(content)
    if content:
        with pytest.raises(StorageError, match="not a loom database, or unreadable"):
            await _bounded(lambda: _open_and_write(str(db)))
        assert (tmp_path / "loom.db.lock").exists()  # refused by SQLite, past the check before the lock
    else:
        assert len(await _bounded(lambda: _open_and_write(str(db)))) == 1


async def test_a_path_object_opens_the_file_it_names(tmp_path: Path) -> None:
    """`open_runtime` takes a `pathlib.Path` as a file API does. Catches the refusal it got ("store must
    be a path ... got PosixPath(...)") and a store opened elsewhere than the file named."""
    db = tmp_path / "loom.db"
    assert len(await _bounded(lambda: _open_and_write(db))) == 1
    assert db.is_file()
    with pytest.raises(InvalidRequest, match="got b'"):
        await _bounded(lambda: _open_and_write(bytes(tmp_path / "other.db")))


# -- a location no file can have ---------------------------------------------------------------------

BAD_PATHS = {
    "NUL": ("o\x00.db", "holds a NUL character"),
    "surrogate": ("o\ud800.db", "is not a file name this system can write"),
}


@pytest.mark.parametrize("kind", BAD_PATHS)
async def test_a_store_path_no_file_can_have_is_invalid_request(tmp_path: Path, kind: str) -> None:
    """Catches ``ValueError: embedded null byte`` and `UnicodeEncodeError` from below (sqlite3, the
    lock file's path), and anything made on disk before the refusal."""
    name, reason = BAD_PATHS[kind]
    db = f"{tmp_path}/{name}"
    with pytest.raises(InvalidRequest, match=reason) as caught:
        await _bounded(lambda: _open_and_write(db))
    assert repr(db) in str(caught.value)
    for refuse in (check_location, lambda path: SQLiteStore(path=path)):
        with pytest.raises(InvalidRequest, match=reason):
            refuse(db)
    assert _listing(tmp_path) == {}


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (None, r"a str or a Path\), got None"),
        (5, r"a str or a Path\), got 5"),
        (b"/tmp/loom.toml", r"a str or a Path\), got b'/tmp/loom.toml'"),
        ("/tmp/lo\x00om.toml", "its path holds a NUL character"),
        ("/tmp/lo\ud800om.toml", "its path is not a file name this system can write"),
    ],
    ids=["None", "int", "bytes", "NUL", "surrogate"],
)
def test_config_load_refuses_what_is_not_a_path_as_config_error(path: object, reason: str) -> None:
    """Catches the `TypeError` of ``Path(None)`` and the `ValueError` of a NUL or a lone surrogate."""
    with pytest.raises(ConfigError, match=reason):
        Config.load(path)  # type: ignore[arg-type]
