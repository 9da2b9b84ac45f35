"""Every shell block (```sh, bash, shell or console) in README.md and docs/ runs, as written, from a
checkout: a wrong command fails here, not in a reader's terminal.

The blocks of one page run in order, each as one bash script (``set -eo pipefail``), in one
temporary directory that looks like a checkout (the repository's files linked into it), so a page
may build on its earlier blocks (a backup, then its restore). While they run:

* ``loom serve ...`` starts the server in the background on a free loopback port (``--listen`` is
  replaced) and points ``LOOM_URL`` at it, as a second terminal would; the block's end stops it
  with SIGTERM, and a server that does not exit 0 fails the block. A block that calls a server
  (``$LOOM_URL`` or a client command) without starting one gets one on ``server.db``.
* ``pip install ...`` runs as ``pip install --dry-run``: it fails on a bad requirement, and when it
  would fetch anything from the package index that is not installed already (loom's own
  distribution, ``loom-runtime``, must be the checkout, never a namesake from the index).
* ``python -m pytest`` collects the tests instead of running them.
* ``$DATABASE_URL`` is a fresh database of the test PostgreSQL server.

A block that cannot run here carries ``<!-- not run: REASON -->`` on the line before it; they are
counted (`NOT_RUN`), so a new one is a decision. A block that fails without it fails this test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from loom.testing.postgres import PostgresCluster

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^```(\S*)\s*$")
NOT_RUN_MARK = re.compile(r"^<!-- not run: (.+) -->$")
COMMAND = re.compile(r"^(\$ )?(loom|pip|python|curl|sqlite3|pg_dump|pg_restore|psql|kill|systemctl) ")
CLIENT = re.compile(
    r"(?m)(\$LOOM_URL|^\s*loom (send|work|timers|events|health|metrics|watch|compact|diagnostics))"
)
NOT_RUN = 1
"""Blocks marked ``not run`` across README.md and docs/."""

PRELUDE = r"""
set -eo pipefail
__pids=()
__stop() {
    local status=$? p
    for p in "${__pids[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
        if ! wait "$p"; then echo "loom serve (pid $p) did not stop cleanly" >&2; status=1; fi
    done
    exit $status
}
trap __stop EXIT
loom() {
    if [ "$1" != serve ]; then command loom "$@"; return; fi
    local fifo line fd
    fifo=$(mktemp -u); mkfifo "$fifo"
    command loom "$@" --listen 127.0.0.1:0 >"$fifo" 2>>serve.log &
    __pids+=($!)
    exec {fd}<"$fifo"; rm "$fifo"
    if ! read -r line <&$fd; then echo "loom serve did not start:" >&2; tail -n 20 serve.log >&2; return 1; fi
    export LOOM_URL="${line#*listening on }"; LOOM_URL="${LOOM_URL%% *}"; LOOM_URL="${LOOM_URL%,}"
}
pip() {
    if [ "$1" != install ]; then command python -m pip "$@"; return; fi
    shift
    local out extra
    out=$(command python -m pip install --dry-run --disable-pip-version-check "$@")
    extra=$(printf '%s\n' "$out" | sed -n 's/^Would install //p' | tr ' ' '\n' \
        | grep -v -e '^loom-runtime-' -e '^loom-example-plugin-' -e '^$' || true)
    if [ -n "$extra" ]; then echo "pip install $* would fetch from the index: $extra" >&2; return 1; fi
}
python() {
    if [ "$1 $2" = "-m pytest" ]; then
        shift 2; command python -m pytest --collect-only -q -p no:cacheprovider "$@" >/dev/null
    else
        command python "$@"
    fi
}
"""


@attrs.frozen
class Block:
    page: Path
    line: int
    code: str
    not_run: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def shell_blocks(page: Path) -> list[Block]:
    """The shell blocks of ``page``; an untagged block that starts with a command is refused (it
    would escape this test)."""
    lines = page.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        code = lines[i + 1 : end]
        where = f"{page.relative_to(ROOT)}:{i + 1}"
        if fence[1] in SHELL:
            before = next((line for line in reversed(lines[:i]) if line.strip()), "")
            mark = NOT_RUN_MARK.match(before.strip())
            blocks.append(Block(page, i + 1, "\n".join(code) + "\n", mark[1] if mark else None))
        elif fence[1] == "" and code and COMMAND.match(code[0]):
            raise AssertionError(f"{where}: a command in a block not tagged sh")
        i = end + 1
    return blocks


def _checkout(directory: Path) -> Path:
    """A directory that looks like the repository (its files linked), where the blocks may write."""
    directory.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in COPIED:  # blocks cd into these and write there: a copy keeps the checkout clean
            shutil.copytree(entry, directory / entry.name, ignore=shutil.ignore_patterns(*IGNORED))
        elif entry.name not in {".git", ".venv", "test-output"} and not entry.name.endswith(".db"):
            (directory / entry.name).symlink_to(entry)
    return directory


COPIED = {"examples"}
IGNORED = ("__pycache__", "*.db", "*.db-*", "*.db.lock", "*.log", "build", "*.egg-info")


def test_every_shell_block_is_found_and_the_unrun_ones_are_counted() -> None:
    """Catches a marker that drifted away from its block (then nothing is skipped, or the wrong
    block is), a new block skipped without a decision, and a page whose blocks are not found."""
    blocks = [block for page in PAGES for block in shell_blocks(page)]
    assert any(block.page.name == "operations.md" for block in blocks)
    skipped = [block for block in blocks if block.not_run is not None]
    assert len(skipped) == NOT_RUN, [f"{b.where}: {b.not_run}" for b in skipped]
    marks = sum(1 for page in PAGES for line in page.read_text().splitlines() if NOT_RUN_MARK.match(line))
    assert marks == NOT_RUN, "each marker stands right before a shell block"


def test_a_failing_block_fails_and_a_wrong_install_line_is_caught(tmp_path: Path) -> None:
    """The harness itself: a command that fails fails its block, and an install line that would
    take loom from the package index (the namesake ``loom``) is refused."""
    where = _checkout(tmp_path / "checkout")
    assert _run("loom work get --key nothing/here\n", where).returncode != 0
    assert _run("loom nonsense\n", where).returncode != 0
    wrong = _run("pip install --no-deps 'loom'\n", where)
    assert wrong.returncode != 0
    assert "would fetch from the index" in wrong.stderr


def _run(code: str, where: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = PRELUDE
    if CLIENT.search(code) and not re.search(r"(?m)^\s*loom serve ", code):
        script += "loom serve --db server.db\n"
    bin_dir = str(Path(sys.executable).parent)
    base = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
    base.pop("LOOM_URL", None)
    return subprocess.run(
        ["bash", "-c", script + code], cwd=where, env=base, capture_output=True, text=True, timeout=240
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(ROOT)) for page in PAGES])
def test_the_shell_blocks_of_a_page_run(page: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Catches a command in the docs that fails as written: an option renamed or removed, a path
    that moved, an install line naming a distribution that is not this one, a backup or restore
    recipe that does not restore."""
    blocks = [block for block in shell_blocks(page) if block.not_run is None]
    if not blocks:
        return
    env: dict[str, str] = {}
    if any("$DATABASE_URL" in block.code for block in blocks):
        cluster: PostgresCluster = request.getfixturevalue("loom_postgres")
        env["DATABASE_URL"] = cluster.create_database()
        if cluster.bin_dir is not None:
            env["PATH"] = (
                f"{Path(sys.executable).parent}{os.pathsep}{cluster.bin_dir}{os.pathsep}{os.environ['PATH']}"
            )
    where = _checkout(tmp_path / "checkout")
    for block in blocks:
        done = _run(block.code, where, env)
        assert done.returncode == 0, (
            f"{block.where} failed:\n{block.code}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
