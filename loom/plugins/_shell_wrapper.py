"""The shell executor's wrapper: runs one command and records how it ended.

Run as ``python _shell_wrapper.py STATUS_FILE CWD ARGV...`` (by path, so it imports nothing of loom;
an empty CWD keeps the current directory). It starts the command in the process group loom made for
the attempt (loom signals the whole group: SIGTERM, SIGINT and SIGHUP reach the command, and the
wrapper stays to see it end), waits for it, and writes ``{"exit": N}`` (or ``{"exit": 128 + S, "signal": S}``, or ``{"exit": 127, "error": ...}`` when the
command cannot start) to STATUS_FILE atomically before it exits with the same status. A loom that
restarted while the command ran is not its parent and cannot wait for it, so it reads this file.

Before the command starts, the wrapper claims the attempt's directory (``claim``: its pid, start time
and boot id), so a loom killed between spawning it and recording its pid still finds the process to
adopt; a recovery that claimed the directory first (nothing had started) keeps the command from
running here, and runs it itself: a command never runs twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any


def _write(path: str, status: dict[str, Any]) -> None:
    partial = f"{path}.partial"
    fd = os.open(
        partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
    )  # private, as the rest of its directory
    with open(fd, "w", encoding="utf-8") as file:
        json.dump(status, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def _stay(signum: int, frame: object) -> None:
    """A stop signal reached the whole group, the command included: the wrapper stays to record how
    the command ends (a handler, not SIG_IGN, so the command starts with the default disposition)."""


def _claim(directory: str) -> bool:
    """Take the attempt's directory for this process before the command starts: ``claim`` names this
    process (pid, start time, boot id), created only if it does not exist yet (a hard link either
    succeeds or finds one). A recovery that found the directory unclaimed took it first (its loom died
    before this process started): then the command must not run, for the recovery runs it."""
    with open("/proc/self/stat", encoding="utf-8") as file:
        stat = file.read()
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as file:
            boot = file.read().strip()
    except OSError:
        boot = ""
    claim = {"pid": os.getpid(), "start_time": int(stat[stat.rindex(")") + 2 :].split()[19]), "boot_id": boot}
    partial = os.path.join(directory, f"claim.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as file:
        json.dump(claim, file)
    try:
        os.link(partial, os.path.join(directory, "claim"))
    except FileExistsError:
        return False
    finally:
        os.unlink(partial)
    return True


def main(argv: list[str]) -> int:
    status_path, cwd, command = argv[0], argv[1] or None, argv[2:]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stay)
    if not _claim(os.path.dirname(status_path) or "."):
        _write(
            status_path, {"exit": 125, "error": "a recovery took the attempt over before its command started"}
        )
        return 125
    try:
        child = subprocess.Popen(command, cwd=cwd)
    except OSError as exc:
        where = f" in {cwd!r}" if cwd else ""
        _write(
            status_path, {"exit": 127, "error": f"cannot run {command[0]!r}{where}: {exc.strerror or exc}"}
        )
        return 127

    code = child.wait()
    if code < 0:
        _write(status_path, {"exit": 128 - code, "signal": -code})
        return 128 - code
    _write(status_path, {"exit": code})
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
