"""A regression fails, never hangs, and a failed, hung or killed test run leaves no PostgreSQL server
and no child process behind (`tests/guards.py`, the guard of `loom.testing.postgres`).

Each test runs an inner test session as a real process, as CI would, with the same plugins: a
session whose tests hang (in trio, and blocking the event loop) must end with those tests failed and
the next one passing; a session killed with SIGKILL in the middle of a test must still have its
PostgreSQL server stopped and its files removed, by the guard.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loom.testing.postgres import ENV_URL, PostgresCluster, find_bin_dir
from loom.testing.pytest_plugin import in_ci

TESTS = Path(__file__).parent
INNER_LIMIT_S = 10
"""The inner session's time limit per test."""
RUN_LIMIT_S = 180
"""How long an inner session may take in all (several times what it needs) before it counts as hung."""
GONE_LIMIT_S = 60
"""How long a process may take to end once it should (the guard stops a server in well under that)."""

REPORT = """
import json, os, subprocess, sys

def report(cluster, **more):
    pid = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    print("REPORT " + json.dumps({"postmaster": pid, "root": str(cluster.host),
                                   "data": str(cluster.data_dir), "guard": cluster.guard_pid, **more}),
          flush=True)

def child():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]).pid
"""

HANGS = f"""
import time
import pytest
import trio
{REPORT}

async def test_hangs_in_trio_with_a_server_and_a_child(loom_postgres):
    report(loom_postgres, child=child())
    await trio.sleep_forever()

@pytest.mark.timeout(2)
def test_hangs_blocking():
    time.sleep(3600)

async def test_runs_after_them():
    await trio.sleep(0)
"""

KILLED = f"""
import trio
{REPORT}

async def test_is_killed_while_it_runs(loom_postgres):
    report(loom_postgres)
    await trio.sleep_forever()
"""


@pytest.fixture
def inner(tmp_path: Path) -> Path:
    """A directory for an inner session: trio mode and a time limit of `INNER_LIMIT_S` per test."""
    if find_bin_dir() is None:
        message = "no PostgreSQL server binaries to start an inner session's server with"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    (tmp_path / "pytest.ini").write_text(
        f"[pytest]\ntrio_mode = true\ntimeout = {INNER_LIMIT_S}\ntimeout_method = signal\n"
    )
    return tmp_path


def session(directory: Path, source: str) -> subprocess.Popen[str]:
    """Start ``python -m pytest`` on ``source`` in ``directory``, with the guards plugin and a
    PostgreSQL server of its own."""
    (directory / "test_inner.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != ENV_URL}
    env.update(CI="true", PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "guards",
            "-p",
            "no:cacheprovider",
            "-s",
            "-q",
            "test_inner.py",
        ],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_report(proc: subprocess.Popen[str], seen: list[str]) -> dict[str, Any]:
    """The inner test's report line (what it started), read as it is printed."""
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("REPORT "):
            return dict(json.loads(line.removeprefix("REPORT ")))
    raise AssertionError("the inner session ended without a report:\n" + "".join(seen))


class Watched:
    """Processes watched through pidfds, opened while they surely run (a pid may be reused later)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def watch(self, name: str, pid: int) -> None:
        self._fds[name] = os.pidfd_open(pid)

    def gone(self, name: str, within_s: float = GONE_LIMIT_S) -> bool:
        """Wait until the process has ended (its pidfd turns readable), at most ``within_s``."""
        ready, _, _ = select.select([self._fds[name]], [], [], within_s)
        return bool(ready)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)


@pytest.fixture
def watched() -> Iterator[Watched]:
    w = Watched()
    yield w
    w.close()


def clean_up(proc: subprocess.Popen[str], report: dict[str, Any] | None) -> None:
    """Whatever the test found, leave nothing running: the inner session, its child, its server."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    if report is None:
        return
    if report.get("child"):
        try:
            os.kill(report["child"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    if Path(report["data"], "postmaster.pid").exists():
        # the guard did not do its work: stop the server as the harness would have
        run_as = "nobody" if os.geteuid() == 0 else None
        leftover = PostgresCluster(
            host=report["root"], port=0, user="loom", data_dir=Path(report["data"]), bin_dir=find_bin_dir(),
            run_as=run_as, root=Path(report["root"]),
        )  # fmt: skip
        leftover.stop()


def test_a_session_whose_tests_hang_fails_them_and_leaves_nothing_running(
    inner: Path, watched: Watched
) -> None:
    """Catches a test run with no time limit (it would hang: the inner session never ends), a trio
    test that only the signal stops (trio is broken for the tests after it), a time limit that skips
    the fixtures' teardown (the server is left running), and a test's child process outliving it."""
    proc = session(inner, HANGS)
    seen: list[str] = []
    report: dict[str, Any] | None = None
    try:
        report = read_report(proc, seen)
        watched.watch("postmaster", report["postmaster"])
        watched.watch("child", report["child"])
        assert proc.stdout is not None
        try:
            out, _ = proc.communicate(timeout=RUN_LIMIT_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the inner session hung:\n{''.join(seen)}") from None
        text = "".join(seen) + out
        assert proc.returncode == 1, text
        assert "2 failed, 1 passed, 1 error" in text, text
        assert "TestTimedOut" in text, "the trio test is cancelled from inside trio"
        assert "Timeout (>2.0s) from pytest-timeout" in text, "the blocking test is stopped by the signal"
        assert "left child processes running" in text, text
        assert watched.gone("child", 0), "the child the hung test started is killed"
        assert watched.gone("postmaster"), "the server is stopped when the session ends"
        assert not Path(report["root"]).exists(), "the server's files are removed"
    finally:
        clean_up(proc, report)


def test_a_session_killed_mid_test_leaves_no_postgres_server(inner: Path, watched: Watched) -> None:
    """Catches a server that only the session's own teardown stops: a session killed with SIGKILL
    (a CI time limit, an out-of-memory kill) never runs it, and the server would run on, holding its
    files, its port and its memory."""
    proc = session(inner, KILLED)
    report: dict[str, Any] | None = None
    try:
        report = read_report(proc, [])
        watched.watch("postmaster", report["postmaster"])
        assert report["guard"] is not None, "a server the harness started has a guard"
        watched.watch("guard", report["guard"])
        proc.kill()
        proc.wait()
        assert watched.gone("postmaster"), "the guard stops the server"
        assert watched.gone("guard"), "and ends once it has removed the server's files"
        assert not Path(report["root"]).exists(), "the server's files are removed"
    finally:
        clean_up(proc, report)


OPT_IN = """
import pytest

async def test_plain(loom_backend):
    print("PLAIN", loom_backend)

@pytest.mark.loom_postgres
async def test_marked(loom_backend, loom_store, request):
    print("MARKED", loom_backend, loom_store.split(":")[0])
    if loom_backend == "postgres":
        print("ROOT", request.getfixturevalue("loom_postgres").host)
"""


def test_the_fixtures_start_postgresql_only_when_asked(inner: Path) -> None:
    """Catches a plugin that starts a PostgreSQL server in a project that never asked for one (a
    project's tests using ``loom_backend`` run on SQLite; ``--loom-postgres`` or the ``loom_postgres``
    marker adds PostgreSQL), and a server left running once the session that asked ends."""
    proc = session(inner, OPT_IN)
    try:
        out, _ = proc.communicate(timeout=RUN_LIMIT_S)
    finally:
        clean_up(proc, None)
    assert proc.returncode == 0, out
    said = [
        line[line.index(word) :].split()
        for line in out.splitlines()
        for word in ("PLAIN ", "MARKED ")
        if word in line
    ]
    assert sorted(words[1] for words in said if words[0] == "PLAIN") == ["file", "memory"], out
    marked = sorted(words[1:] for words in said if words[0] == "MARKED")
    assert [m[0] for m in marked] == ["file", "memory", "postgres"], out
    assert marked[-1] == ["postgres", "postgresql"], out
    (root,) = [line[line.index("ROOT ") + 5 :].strip() for line in out.splitlines() if "ROOT " in line]
    assert not Path(root).exists(), "the server the session asked for is stopped and its files removed"
