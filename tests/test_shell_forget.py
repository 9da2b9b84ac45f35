"""What the shell executor removes when an attempt's logs pass their retention (`ShellExecutor.forget`,
docs/operations.md "Retention"): the directories the attempt pinned, and nothing else. Ids follow
from Work ids, so another store (a staging server on the same host, a restored copy started beside
production) may have an attempt of the same id, in a directory of its own under the same state
directory."""

from __future__ import annotations

from pathlib import Path

from loom.plugins.shell import ShellExecutor


def made(root: Path, name: str) -> Path:
    directory = root / name
    directory.mkdir(mode=0o700, parents=True)
    (directory / "stdout").write_text("out")
    return directory


async def test_forgetting_an_attempt_removes_only_the_directories_it_pinned(tmp_path: Path) -> None:
    """Catches a forget that removes every directory named after the execution id: it removed
    another store's running attempt, whose command then ended as "killed before it recorded an exit
    status" and ran again."""
    root = tmp_path / "state"
    executor = ShellExecutor(state_dir=root)
    mine, earlier = made(root, "ex_1-mine"), made(root, "ex_1-unused")
    theirs, other = made(root, "ex_1-theirs"), made(root, "ex_2-other")
    outside = made(tmp_path, "ex_1-outside")
    metadata = {"dir": str(mine), "earlier": [str(earlier), str(outside), str(other)], "pid": 1}
    await executor.forget("ex_1", metadata)
    assert not mine.exists()
    assert not earlier.exists()
    assert theirs.exists(), "another store's attempt of the same id keeps its directory"
    assert other.exists(), "a directory of another attempt is never removed, even if named"
    assert outside.exists(), "nothing outside the state directory is removed"
    await executor.forget("ex_1", metadata)  # idempotent
    await executor.forget("ex_1", {"dir": 7, "earlier": "ex_1-theirs"})  # malformed: nothing to remove
    assert theirs.exists()
