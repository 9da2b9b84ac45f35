"""The shell executor's process plumbing: a process as /proc shows it (start time, boot id), the
wrapper's status and output files, and waiting for an exit through a pidfd (docs/plugins.md)."""

from __future__ import annotations

import json
import math
import os
import signal
import stat
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

import trio

from ..records.validation import MAX_REASON_LEN, storable_text
from ..records.work import Completed, Failed, Outcome

TAIL_BYTES = 2000
"""How much of the end of stderr a failure reports."""


# -- the process, as /proc shows it ---------------------------------------------------------------


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or ``None``
    when there is no such process. With the boot id it names one process for good: a pid is reused,
    a (pid, start time) pair is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) is in parentheses and may hold spaces or parentheses itself
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
    except OSError:
        return ""


READ_LIMIT = 16 * 1024 * 1024
"""The most of a file of an attempt's directory read at once (its acknowledgements, its inbox)."""

_OPEN_OWN = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


def read_own(path: Path, limit: int, *, tail: bool = False) -> tuple[bytes, int] | None:
    """Up to ``limit`` bytes of the regular file at ``path`` (its first, or with ``tail`` its last) and
    its size; ``None`` when it is no regular file or cannot be read. The attempt's command may replace
    any file of its directory: a FIFO would block the open (and the event loop with it) for ever, a
    link would read elsewhere, a file of gigabytes would fill the memory."""
    try:
        fd = os.open(path, _OPEN_OWN)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        size = info.st_size
        if tail and size > limit:
            os.lseek(fd, size - limit, os.SEEK_SET)
        chunks: list[bytes] = []
        while limit > 0 and (chunk := os.read(fd, min(limit, 1 << 20))):
            chunks.append(chunk)
            limit -= len(chunk)
        return b"".join(chunks), size
    except OSError:
        return None
    finally:
        os.close(fd)


def tail_text(path: Path, limit: int = TAIL_BYTES, *, strip: bool = False) -> str:
    """The last ``limit`` bytes of a file as text (``...`` first when it holds more); ``""`` when it
    cannot be read, or is no regular file (`read_own`)."""
    found = read_own(path, limit, tail=True)
    if found is None:
        return ""
    data, size = found
    text = data.decode("utf-8", errors="replace")
    text = text.strip() if strip else text
    return ("..." + text) if size > limit else text


def _tail(path: Path) -> str:
    return tail_text(path, TAIL_BYTES, strip=True)


def _read_lines(path: Path) -> list[str]:
    found = read_own(path, READ_LIMIT)
    if found is None:
        return []
    return [line.strip() for line in found[0].decode("utf-8", errors="replace").splitlines()]


def _read_json(path: Path) -> Any:
    """The JSON value a small file of an attempt's directory holds; ``None`` if none."""
    found = read_own(path, 1 << 16)
    try:
        return None if found is None else json.loads(found[0].decode("utf-8"))
    except ValueError:
        return None


def _read_status(path: Path) -> dict[str, Any] | None:
    status = _read_json(path)
    return status if isinstance(status, dict) and isinstance(status.get("exit"), int) else None


def append_own(path: Path, text: str) -> None:
    """Append ``text`` to a file of an attempt's directory; one that is no regular file (a FIFO with no
    reader, a link) refuses it (`OSError`) rather than block or write elsewhere."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is no regular file")
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def _outcome(directory: Path, status: dict[str, Any] | None, acked: list[str], interrupted: bool) -> Outcome:
    """The attempt's outcome from the wrapper's status file (``None``: the wrapper itself was killed)."""
    if status is not None and status["exit"] == 0 and not interrupted:
        return Completed(consumed_inputs=tuple(acked))
    if status is None:
        how = "it was killed before it recorded an exit status"
    elif "error" in status:
        how = str(status["error"])
    elif isinstance(status.get("signal"), int):
        how = f"killed by signal {status['signal']}"
    else:
        how = f"exit status {status['exit']}"
    return Failed(error=_failure(interrupted, how, _tail(directory / "stderr")), consumed_inputs=tuple(acked))


def _failure(interrupted: bool, how: str, stderr: str) -> str:
    """The attempt's error: how it ended and the end of its stderr, as every store keeps a reason (what
    the process wrote may hold a NUL or run past a reason's length: its end is what is kept)."""
    head = storable_text(f"{'interrupted; ' if interrupted else ''}{how}", MAX_REASON_LEN // 4)
    if not stderr:
        return head
    tail = storable_text(stderr, sys.maxsize)
    room = MAX_REASON_LEN - len(head) - len("; stderr: ")
    return f"{head}; stderr: {tail if len(tail) <= room else '...' + tail[3 - room :]}"


# -- private files ----------------------------------------------------------------------------------
#
# The state directory holds each attempt's bearer token and its input: it is this user's alone. A
# directory under a shared /tmp may have been made by someone else first (its name is predictable),
# so an existing one is used only when it is a directory (not a link) owned by this user.


class StateDirRefused(Exception):
    """The state directory cannot be kept private; nothing was written in it."""


def private_dir(path: Path, *, create: bool = True) -> None:
    """Make ``path`` this user's private directory (mode 0700), or check that it already is one:
    owned by this user and not a symbolic link (one open to others is closed to 0700)."""
    try:
        if create:
            path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateDirRefused(f"cannot create the state directory {path}: {exc.strerror or exc}") from None
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise StateDirRefused(f"the state directory {path} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise StateDirRefused(f"the state directory {path} is not a directory of its own (a link or a file)")
    if info.st_uid != os.geteuid():
        raise StateDirRefused(
            f"the state directory {path} belongs to user id {info.st_uid}, not to this user"
            f" ({os.geteuid()}): refusing to keep tokens where another user can reach them"
            " (choose the executor's state_dir)"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)


def write_private(path: Path, text: str, *, replace: bool = False) -> None:
    """Write ``path`` readable by this user only (0600); ``replace``: atomically over an old one."""
    target = path.with_name(path.name + ".partial") if replace else path
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(target, flags if replace else flags | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a partial file left by a crash keeps its old mode through O_TRUNC
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    if replace:
        os.replace(target, path)


def _write_new(path: Path, text: str) -> None:
    write_private(path, text, replace=True)


def _inbox_ids(folder: Path) -> list[str]:
    ids = []
    for line in _read_lines(folder / "inbox.jsonl"):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            ids.append(entry["id"])
    return ids


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (it stays bound to that process, so the start time read after it is the
    process it watches), or ``None`` when there is no such process."""
    if pid <= 0 or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, PermissionError):
        return None


async def _wait_exit(pidfd: int) -> None:
    await trio.lowlevel.wait_readable(pidfd)  # readable once the process has exited


def _reap(pid: int) -> None:
    """Reap the process if it is this process's own child (a runtime reopened in the same program)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def session_of(pid: int) -> int | None:
    """The session id of the process ``pid`` (``/proc/<pid>/stat`` field 6), or ``None`` when there is
    no such process (or it is not this user's to read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
        return int(stat[stat.rindex(")") + 2 :].split()[3])
    except (OSError, ValueError, IndexError):
        return None


def _end_session(pid: int) -> None:
    """The wrapper ``pid`` has exited: kill what is left of its process group and of its session (the
    grandchildren the command started: ``work & sleep 600``, and those that took a group of their own,
    as ``timeout`` or a shell's job control do; one that started a session of its own, ``setsid``, is
    left), then reap it. Its own child is reaped only after, so its pid (the group's and the session's
    id) cannot be reused meanwhile."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(pid) and session_of(int(entry.name)) == pid:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    _reap(pid)


async def end_group(pid: int) -> None:
    """`_end_session`, in a worker thread (it reads ``/proc``)."""
    await trio.to_thread.run_sync(_end_session, pid)


def end_left_group(pid: int, execution_id: str) -> None:
    """The wrapper ``pid`` exited while no loom watched it: kill what is left of its session (the
    grandchildren the command started), each process checked to be the attempt's by the
    ``LOOM_EXECUTION_ID`` in its environment. The wrapper is gone, so its pid may name another session
    by now: the group alone does not prove a process is the attempt's."""
    mark = f"LOOM_EXECUTION_ID={execution_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or session_of(int(entry.name)) != pid:
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            continue  # it ended meanwhile, or it is not this user's to read


def take_over(folder: Path) -> dict[str, Any] | None:
    """Recovery of an attempt whose loom died after pinning its directory and before pinning its
    process: the wrapper's claim on the directory (``pid``, ``start_time``, ``boot_id``: the process
    started, adopt it), or ``None`` when this call claimed it first, as abandoned (no command ran there
    or ever will: the wrapper, if it starts late, finds the claim and exits; run the attempt anew)."""
    claim = folder / "claim"
    partial = folder / f"claim.recovery.{os.getpid()}"
    try:
        write_private(partial, json.dumps({"abandoned": True}), replace=True)
    except FileNotFoundError:
        return None  # the directory is gone: nothing can start there
    try:
        os.link(partial, claim)
    except FileExistsError:
        found = _read_json(claim)
        if isinstance(found, dict) and found.get("abandoned") is True:
            return None  # an earlier recovery took it: still nothing ran there
        return found if isinstance(found, dict) else {}
    finally:
        partial.unlink(missing_ok=True)
    return None


def inheritable_descriptors() -> list[int]:
    """This process's descriptors above stderr that a spawned process would inherit (loom opens none
    of its own so: a library's may be). A shell attempt is started with each of them closed."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:
                pass  # closed meanwhile (the listing's own descriptor)
    return found


def _attempt_environment(entry: Path) -> tuple[str, str] | None:
    """``(LOOM_EXECUTION_ID, LOOM_DIR)`` from the environment of the process ``entry`` (a ``/proc/<pid>``),
    or ``None`` when it names none, has ended, or is not this user's to read."""
    try:
        items = (entry / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found: dict[bytes, str] = {}
    for item in items:
        name, sep, value = item.partition(b"=")
        if sep and name in (b"LOOM_EXECUTION_ID", b"LOOM_DIR"):
            found[name] = os.fsdecode(value)
    execution_id, directory = found.get(b"LOOM_EXECUTION_ID"), found.get(b"LOOM_DIR")
    return (execution_id, directory) if execution_id and directory else None


def processes_under(root: Path, session: object = None) -> dict[str, set[tuple[int, str]]]:
    """Every process of this machine run for an attempt whose directory is under ``root`` (its
    ``LOOM_DIR``), by execution id: ``(pid, directory)`` each; with ``session`` (an attempt's wrapper's
    pid), only those still in its session (one that started a session of its own, ``setsid``, was
    meant to outlive the attempt). One scan of ``/proc``; this process is never among them."""
    found: dict[str, set[tuple[int, str]]] = {}
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        if isinstance(session, int) and session_of(int(entry.name)) != session:
            continue
        named = _attempt_environment(entry)
        if named is not None and Path(named[1]).parent == root:
            found.setdefault(named[0], set()).add((int(entry.name), named[1]))
    return found


def _pidfd_of(pid: int, execution_id: str, directory: str) -> int | None:
    """A pidfd for ``pid`` once it is checked, through the pidfd, to still be the attempt's process
    (its pid may name another process since the scan)."""
    fd = _open_pidfd(pid)
    if fd is not None and _attempt_environment(Path(f"/proc/{pid}")) != (execution_id, directory):
        os.close(fd)
        return None
    return fd


async def end_processes(pids: Collection[int], execution_id: str, directory: str, grace_s: float) -> int:
    """SIGTERM to each of the attempt's processes ``pids`` (each checked to be still the attempt's: the
    ``LOOM_EXECUTION_ID`` and ``LOOM_DIR`` of its environment), SIGKILL to those left after ``grace_s``;
    until each has exited. How many were signalled."""
    fds = [fd for fd in (_pidfd_of(pid, execution_id, directory) for pid in pids) if fd is not None]
    try:
        for how in (signal.SIGTERM, signal.SIGKILL):
            for fd in fds:
                try:
                    signal.pidfd_send_signal(fd, how)
                except ProcessLookupError:
                    pass  # it exited meanwhile
            with trio.move_on_after(grace_s if how is signal.SIGTERM else math.inf):
                for fd in fds:
                    await _wait_exit(fd)
                return len(fds)
        return len(fds)
    finally:
        for fd in fds:
            os.close(fd)
