"""``loom demo`` and ``python -m loom``, run as a user runs them (subprocesses): the tour covers each
step, says what happened in words and ISO times, runs again on a fresh file, and refuses a bad ``--db``
in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import loom

EPOCH_MS = re.compile(r"\b1[6-9]\d{11}\b")


def run(*args: str, tmp: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)} if tmp is not None else None
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


def test_the_demo_tours_every_step_and_reruns_on_a_fresh_file(tmp_path: Path) -> None:
    """Catches a demo that breaks on its second run (an old file: every Event a duplicate), skips a step,
    prints raw epoch milliseconds, or leaves files behind."""
    for _ in range(2):
        done = run("demo", tmp=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        out = done.stdout
        assert re.search(r"accepted order\.placed for order/1 as ev_\w+ \(sequence 1\)", out), out
        assert "the same delivery again is recognised as a duplicate" in out
        assert "order/2's wait is woken at 2026-01-01T09:20:00Z by the approval" in out
        assert "order/3's wait is woken at 2026-01-01T10:00:00Z by its own timeout" in out
        assert "killed with SIGKILL" in out
        assert re.search(r"it adopted it under a new lease \(epoch 1 -> 2\)", out), out
        assert "build/7 is completed after 1 attempt" in out
        assert "3 occurrences fired, each once; the schedule's Work ran 3 times" in out
        assert not EPOCH_MS.search(out), "times print as ISO 8601, never epoch ms"
        assert done.stderr == ""
        assert "leaves nothing behind" in out
        assert list(tmp_path.iterdir()) == [], "the demo leaves nothing behind"


def test_the_demo_uses_the_db_it_is_given_and_refuses_one_that_exists(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "demo.db"
    done = run("demo", "--db", str(db))
    assert done.returncode == 0, done.stderr[-3000:]
    assert db.is_file()
    again = run("demo", "--db", str(db))
    assert again.returncode == 1
    assert (
        again.stderr
        == f"loom: --db {db} already exists; the demo needs a fresh file (remove it or choose another)\n"
    )


def test_the_demo_refuses_a_path_it_cannot_create_in_one_line() -> None:
    done = run("demo", "--db", "/proc/loom-demo/demo.db")
    assert done.returncode == 1
    assert done.stderr.startswith("loom: cannot create the demo database /proc/loom-demo/demo.db")
    assert done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr


def test_python_dash_m_loom_is_the_cli() -> None:
    done = run("--version")
    assert (done.returncode, done.stdout) == (0, f"loom {loom.__version__}\n")
