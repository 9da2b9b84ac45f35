"""The shell executor: runs each attempt as a subprocess.

A binding names the command and, optionally, its environment, working directory and timings::

    [scopes.ops.bindings.build]
    executor = "shell"
    capabilities = ["inject", "interrupt", "adopt"]
    config = { command = ["make", "release"], env = { CI = "1" }, cwd = "/srv/app", grace_s = 10 }

Every key of it is checked when a configuration naming the binding is loaded (`ShellExecutor.validate_config`,
by the checks each launch makes): a bad one refuses the configuration, naming the key.

Each attempt gets a directory of its own under the executor's ``state_dir`` holding ``request.json``
(the attempt, its trigger and inputs), ``inbox.jsonl`` (injected input), ``ack`` (the process
acknowledges), ``token`` (its current bearer token), ``stdout``, ``stderr`` and ``status.json``. The
process sees them through its environment, beside ``LOOM_URL``, ``LOOM_EXECUTION_ID`` and
``LOOM_TOKEN`` for calling the toolbelt over HTTP (see `environment`).

* Exit status 0 completes the attempt (the injected inputs the process acknowledged count as
  consumed); any other status fails it, with the status and the tail of its stderr.
* ``inject`` appends ``{"id": <event id>, "event": {...}}`` as one JSON line to the inbox and waits
  until the process writes that id as a line of the ack file: then it is accepted. A process that has
  exited does not accept; one that stays silent past ``ack_timeout_s`` leaves the answer ambiguous
  (the runtime tries the same Event again, so a process should ignore an id it has seen).
* ``interrupt`` sends SIGTERM and, after ``grace_s`` seconds, SIGKILL to the attempt's process group,
  and returns once the process is gone. However an attempt ends (it exits, is interrupted, cancelled,
  timed out, or stopped by a close under ``on_close = "stop"``), whatever is left of its process group
  (the grandchildren it started) is killed: nothing of an attempt outlives it.
* The process starts with only its own descriptors (stdin from ``/dev/null``, stdout and stderr to
  its files): nothing loom holds open (the service's listening socket, the database) leaks into it.
* ``forget`` removes an ended attempt's directories once the ``attempt_logs`` retention passed
  (docs/operations.md, "Retention").
* The process runs in a session of its own, through a small wrapper that records its exit status.
  When the runtime closes or dies while it runs, it goes on: the runtime's next open recovers the
  attempt, and `ShellExecutor.recover` adopts the process by its pinned pid and start time (read from
  ``/proc/<pid>/stat``, so a recycled pid is never mistaken for it), or says it cannot
  (`NotAdoptable`): the attempt then fails and its retry policy applies. ``on_close = "stop"`` in the
  binding config stops the process instead when the runtime closes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from ..records.errors import InvalidRequest, NotAccepting, NotAdoptable, NotFound
from ..records.events import Event
from ..records.executor import Toolbelt
from ..records.serde import unstructure
from ..records.work import Failed, Outcome, RunRequest
from ._manager import hookimpl
from ._shell_config import DEFAULT_GRACE_S, ShellConfig, parse_config, read_config
from ._shell_process import (
    StateDirRefused,
    _inbox_ids,
    _open_pidfd,
    _outcome,
    _read_lines,
    _read_status,
    _wait_exit,
    _write_new,
    append_own,
    boot_id,
    end_group,
    end_left_group,
    end_processes,
    inheritable_descriptors,
    private_dir,
    process_start_time,
    processes_under,
    tail_text,
    take_over,
    write_private,
)

log = logging.getLogger("loom.shell")

WRAPPER = str(Path(__file__).with_name("_shell_wrapper.py"))
POLL_S = 0.02
"""How often the ack file is read while an inject waits (a file has no readiness to wait on)."""

STREAMS = ("stdout", "stderr")


def _spawn(directory: Path, config: ShellConfig, env: dict[str, str]) -> int:
    """Start the wrapper (which starts the command) in a session of its own, with no descriptor of
    this process but its own stdin, stdout and stderr; its pid."""
    create = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    return os.posix_spawn(
        sys.executable,
        [sys.executable, WRAPPER, str(directory / "status.json"), config.cwd or "", *config.command],
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(directory / "stdout"), create, 0o600),
            (os.POSIX_SPAWN_OPEN, 2, str(directory / "stderr"), create, 0o600),
            *((os.POSIX_SPAWN_CLOSE, fd) for fd in inheritable_descriptors()),
        ],
        setsid=True,
    )


@attrs.define(eq=False)
class _Running:
    directory: Path
    pid: int
    config: ShellConfig
    exited: trio.Event = attrs.Factory(trio.Event)
    interrupted: bool = False
    written: set[str] = attrs.Factory(set)
    acked: list[str] = attrs.Factory(list)

    def read_acks(self) -> None:
        for line in _read_lines(self.directory / "ack"):
            if line and line in self.written and line not in self.acked:
                self.acked.append(line)


def environment(directory: Path, request: RunRequest, token: str, url: str | None) -> dict[str, str]:
    """What the process finds in its environment besides the binding's ``env``."""
    env = {
        "LOOM_EXECUTION_ID": request.execution_id,
        "LOOM_WORK_ID": request.work_id,
        "LOOM_ATTEMPT": str(request.attempt),
        "LOOM_TOKEN": token,
        "LOOM_TOKEN_FILE": str(directory / "token"),
        "LOOM_REQUEST": str(directory / "request.json"),
        "LOOM_INBOX": str(directory / "inbox.jsonl"),
        "LOOM_ACK": str(directory / "ack"),
        "LOOM_DIR": str(directory),
    }
    if url:
        env["LOOM_URL"] = url
    return env


def _request_json(request: RunRequest) -> str:
    data = {
        "execution_id": request.execution_id,
        "work_id": request.work_id,
        "attempt": request.attempt,
        "scope": request.scope,
        "kind": request.kind,
        "binding": request.binding,
        "resumed": request.resumed,
        "trigger": _event_json(request.trigger) if request.trigger is not None else None,
        "origin": _event_json(request.origin) if request.origin is not None else None,
        "inputs": [_event_json(event) for event in request.inputs],
    }
    return json.dumps(data, indent=2, sort_keys=True)


def _event_json(event: Event) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(unstructure(event), default=_plain))
    return data


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | list):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


class ShellExecutor:
    """Executor ``shell`` (built in). Register another instance with ``plugins=[ShellExecutor(...)]``
    to choose its ``state_dir`` or ``url``; one registered later under the same name replaces it."""

    capabilities = frozenset({"inject", "interrupt", "adopt"})

    def __init__(self, name: str = "shell", *, state_dir: str | Path | None = None, url: str | None = None):
        self.name = name
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.url = url
        """The HTTP address the process is given as ``LOOM_URL`` (default: this process's ``LOOM_URL``)."""
        self._running: dict[str, _Running] = {}

    @hookimpl
    def loom_executors(self) -> Mapping[str, Any]:
        return {self.name: self}

    def validate_config(self, config: Mapping[str, Any]) -> None:
        """A binding's config, checked when a configuration is loaded by the checks each launch makes
        (`read_config`): `ConfigError` naming the key that is wrong."""
        parse_config(config)

    def _root(self) -> Path:
        if self.state_dir is not None:
            return self.state_dir
        return Path(tempfile.gettempdir()) / f"loom-shell-{os.getuid()}"

    # -- launch ---------------------------------------------------------------------------------------

    async def launch(self, request: RunRequest, toolbelt: Toolbelt, earlier: tuple[str, ...] = ()) -> Outcome:
        """Run the command in a directory of its own (``earlier``: those a recovery found unused)."""
        try:
            config = read_config(request.config)
        except InvalidRequest as exc:
            return Failed(error=str(exc))
        token = toolbelt.lease.token
        url = self.url or os.environ.get("LOOM_URL")
        try:
            directory = await trio.to_thread.run_sync(self._prepare, request, token)
        except (StateDirRefused, OSError) as exc:
            return Failed(error=f"shell executor: {exc}")
        env = {**os.environ, **config.env, **environment(directory, request, token, url)}
        # the directory is recorded before anything starts there: a loom killed from here on leaves an
        # attempt its recovery finds (the process, by its claim on the directory, or nothing started)
        await toolbelt.pin({"dir": str(directory), "boot_id": boot_id(), "earlier": list(earlier)})
        try:
            pid = _spawn(directory, config, env)
        except (OSError, ValueError) as exc:  # (ValueError: what the OS cannot take, such as a NUL)
            return Failed(error=f"shell executor: cannot start {config.command[0]!r}: {exc}")
        pidfd = os.pidfd_open(pid)
        running = _Running(directory, pid, config)
        self._running[request.execution_id] = running
        try:
            try:
                await toolbelt.pin(
                    {
                        "pid": pid,
                        "start_time": process_start_time(pid),
                        "boot_id": boot_id(),
                        "dir": str(directory),
                        "earlier": list(earlier),
                    }
                )
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._stop(running, pidfd)
                    await end_group(pid)
                raise
            try:
                await _wait_exit(pidfd)
            except trio.Cancelled:
                if config.stop_on_close:
                    with trio.CancelScope(shield=True):
                        await self._stop(running, pidfd)
                        await end_group(pid)
                raise  # otherwise it goes on; the next open adopts it
            await end_group(pid)
            return await self._finish(running)
        finally:
            os.close(pidfd)
            running.exited.set()
            self._forget_running(request.execution_id, running)

    def _forget_running(self, execution_id: str, running: _Running) -> None:
        """``running`` is no longer watched here. Another watch of the same attempt may have taken its
        place (a second recovery adopted the process while this one was being cancelled): that one
        stays, for an interrupt to find."""
        if self._running.get(execution_id) is running:
            del self._running[execution_id]

    def _prepare(self, request: RunRequest, token: str) -> Path:
        root = self._root()
        private_dir(root)
        directory = Path(tempfile.mkdtemp(prefix=f"{request.execution_id}-", dir=root))  # mode 0700
        write_private(directory / "request.json", _request_json(request))
        write_private(directory / "inbox.jsonl", "")
        write_private(directory / "ack", "")
        write_private(directory / "token", token)
        return directory

    async def _finish(self, running: _Running) -> Outcome:
        running.read_acks()
        status = _read_status(running.directory / "status.json")
        return _outcome(running.directory, status, running.acked, running.interrupted)

    # -- inject ---------------------------------------------------------------------------------------

    async def inject(self, execution_id: str, event: Event) -> None:
        """Accepted once the process acknowledges the id; `NotAccepting` if it is not running here or
        exits first; ambiguous (`TimeoutError`) if it stays silent for ``ack_timeout_s``."""
        running = self._running.get(execution_id)
        if running is None or running.exited.is_set():
            raise NotAccepting(f"execution {execution_id} is not running in the shell executor")
        running.read_acks()
        if event.id in running.acked:
            return
        if event.id not in running.written:
            line = json.dumps({"id": event.id, "event": _event_json(event)}, sort_keys=True) + "\n"
            append_own(running.directory / "inbox.jsonl", line)
            running.written.add(event.id)
        with trio.move_on_after(running.config.ack_timeout_s):
            while True:
                running.read_acks()
                if event.id in running.acked:
                    return
                if running.exited.is_set():
                    raise NotAccepting(f"execution {execution_id} exited before it acknowledged {event.id}")
                with trio.move_on_after(POLL_S):
                    await running.exited.wait()
        raise TimeoutError(
            f"execution {execution_id} did not acknowledge {event.id} within {running.config.ack_timeout_s:g}s"
        )

    # -- interrupt ------------------------------------------------------------------------------------

    async def interrupt(self, execution_id: str) -> None:
        """SIGTERM, then SIGKILL after the grace period; returns once the process has exited."""
        running = self._running.get(execution_id)
        if running is None:
            return
        running.interrupted = True
        await self._stop(running, None)

    async def _stop(self, running: _Running, pidfd: int | None) -> None:
        """SIGTERM to the attempt's whole process group (the command and whatever it started; the wrapper
        stays to record how the command ended), SIGKILL to the group after the grace period; until the
        wrapper has exited (watched on ``pidfd`` by the caller's own task, or through the task watching
        it, which then kills what is left of the group: `end_group`)."""
        try:
            os.killpg(running.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        with trio.move_on_after(running.config.grace_s):
            await (_wait_exit(pidfd) if pidfd is not None else running.exited.wait())
            return
        try:
            os.killpg(running.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        await (_wait_exit(pidfd) if pidfd is not None else running.exited.wait())

    async def _relaunch(
        self, request: RunRequest, toolbelt: Toolbelt, why: str, metadata: Mapping[str, Any]
    ) -> Outcome:
        """Run an attempt whose command never started, now, under the recoverer's lease."""
        await toolbelt.adopt()
        log.info("execution %s: %s; it runs now", request.execution_id, why)
        return await self.launch(request, toolbelt, _directories(metadata))

    # -- logs -----------------------------------------------------------------------------------------

    async def logs(self, execution_id: str, metadata: Mapping[str, Any], *, tail: int) -> Mapping[str, str]:
        """The end (``tail`` bytes) of the attempt's ``stdout`` and ``stderr``, from the directory it
        pinned; `NotFound` once the directory is gone (removed after its retention)."""
        directory = metadata.get("dir")
        if not isinstance(directory, str) or Path(directory).parent != self._root():
            raise NotFound(f"the shell executor kept no directory for execution {execution_id}")
        folder = Path(directory)

        def read() -> dict[str, str]:
            if not folder.is_dir():
                raise NotFound(f"the logs of execution {execution_id} are gone ({folder} was removed)")
            return {name: tail_text(folder / name, tail) for name in STREAMS}

        return await trio.to_thread.run_sync(read)

    # -- recover --------------------------------------------------------------------------------------

    async def recover(self, request: RunRequest, toolbelt: Toolbelt, metadata: Mapping[str, Any]) -> Outcome:
        """Adopt the attempt's process after a restart: verified by pid, start time and boot id, then
        watched to its exit; one that already ended is read from its status file. The process is found
        by what the attempt pinned, or, when its loom died before it pinned the process, by the wrapper's
        claim on the attempt's directory. An attempt whose command never started (its loom died before,
        or a recovery claimed its directory first) runs now, as the same attempt: a command never runs
        twice. `NotAdoptable` when none of this can be verified."""
        directory = metadata.get("dir")
        if not metadata:
            # nothing pinned: the directory is pinned before anything is spawned, so nothing started
            return await self._relaunch(request, toolbelt, "its loom stopped before it started anything", {})
        if not isinstance(directory, str) or Path(directory).parent != self._root():
            raise NotAdoptable(
                f"the shell executor pinned no directory of its own ({self._root()}) for this attempt"
            )
        pid, start_time, boot = metadata.get("pid"), metadata.get("start_time"), metadata.get("boot_id")
        if not isinstance(pid, int) or not isinstance(start_time, int):
            try:
                private_dir(Path(directory), create=False)
            except (StateDirRefused, OSError) as exc:
                raise NotAdoptable(f"shell executor: {exc}") from None
            claim = await trio.to_thread.run_sync(take_over, Path(directory))
            if claim is None:
                why = "its loom stopped before its command started"
                return await self._relaunch(request, toolbelt, why, metadata)
            pid, start_time, boot = claim.get("pid"), claim.get("start_time"), claim.get("boot_id")
            if not isinstance(pid, int) or not isinstance(start_time, int):
                raise NotAdoptable(f"the claim on {directory} names no process")
        try:
            config = read_config(request.config)
        except InvalidRequest as exc:
            raise NotAdoptable(str(exc)) from None
        folder = Path(directory)
        same_boot = boot in (None, "", boot_id())
        running = _Running(folder, pid, config)
        running.written.update(_inbox_ids(folder))
        pidfd = _open_pidfd(pid) if same_boot else None
        try:
            if pidfd is None or process_start_time(pid) != start_time:
                status = _read_status(folder / "status.json")
                if status is None:
                    why = "the machine restarted since" if not same_boot else f"process {pid} is gone"
                    raise NotAdoptable(f"{why} and left no exit status in {folder}")
                await toolbelt.adopt()
                if same_boot:
                    await trio.to_thread.run_sync(end_left_group, pid, request.execution_id)
                running.read_acks()
                return _outcome(folder, status, running.acked, interrupted=False)
            try:
                private_dir(folder, create=False)
            except (StateDirRefused, OSError) as exc:
                raise NotAdoptable(f"shell executor: {exc}") from None
            await toolbelt.adopt()
            _write_new(folder / "token", toolbelt.lease.token)
            self._running[request.execution_id] = running
            try:
                await _wait_exit(pidfd)
                await end_group(pid)
                return await self._finish(running)
            except trio.Cancelled:
                if config.stop_on_close:
                    with trio.CancelScope(shield=True):
                        await self._stop(running, pidfd)
                        await end_group(pid)
                raise
            finally:
                running.exited.set()
                self._forget_running(request.execution_id, running)
        finally:
            if pidfd is not None:
                os.close(pidfd)

    # -- what a loom that died left running ---------------------------------------------------------

    async def lingering(self) -> list[str]:
        """The execution ids of attempts with processes running on this machine, in directories under
        ``state_dir``, that no task of this executor watches (a loom that died left them)."""
        found = await trio.to_thread.run_sync(processes_under, self._root())
        return sorted(execution_id for execution_id in found if execution_id not in self._running)

    async def end_lingering(
        self, execution_id: str, metadata: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        """Stop what runs of an attempt that has ended: its processes in the directory its launch
        pinned (SIGTERM, then SIGKILL after the binding's ``grace_s``), until they have exited."""
        directory = metadata.get("dir")
        if execution_id in self._running or not isinstance(directory, str):
            return
        try:
            grace_s = read_config(config).grace_s
        except InvalidRequest:
            grace_s = DEFAULT_GRACE_S
        found = await trio.to_thread.run_sync(processes_under, self._root(), metadata.get("pid"))
        pids = [pid for pid, where in found.get(execution_id, ()) if where == directory]
        if await end_processes(pids, execution_id, directory, grace_s):
            log.info(
                "execution %s had ended; its %d process(es) left running are stopped", execution_id, len(pids)
            )

    # -- forget ---------------------------------------------------------------------------------------

    async def forget(self, execution_id: str, metadata: Mapping[str, Any]) -> None:
        """Remove what this executor keeps of an ended attempt (once its ``attempt_logs`` retention
        passed): the directories the attempt pinned (one per launch) under ``state_dir``, with its
        request, inbox, logs and status. Only those: another store's attempt may have the same id in a
        directory of its own. Idempotent; nothing else is touched, nor an attempt running here."""
        if execution_id not in self._running:
            await trio.to_thread.run_sync(self._forget, execution_id, _directories(metadata))

    def _forget(self, execution_id: str, directories: tuple[str, ...]) -> None:
        root = self._root()
        for name in directories:
            directory = Path(name)
            if directory.parent == root and directory.name.startswith(f"{execution_id}-"):
                if directory.is_dir() and not directory.is_symlink():
                    shutil.rmtree(directory, ignore_errors=True)


def _directories(metadata: Mapping[str, Any]) -> tuple[str, ...]:
    """The directories an attempt's launches pinned: its last (``dir``) and the ``earlier`` ones."""
    earlier = metadata.get("earlier")
    found = [metadata.get("dir"), *(earlier if isinstance(earlier, list) else ())]
    return tuple(name for name in found if isinstance(name, str))


def default_executor() -> ShellExecutor:
    """The built-in ``shell`` executor (set its ``url`` or ``state_dir`` before opening a runtime)."""
    return _DEFAULT


_DEFAULT = ShellExecutor()


@hookimpl
def loom_executors() -> Mapping[str, Any]:
    return {_DEFAULT.name: _DEFAULT}
