"""The shell executor with real subprocesses: outcomes from exit statuses, the request and credentials
the process sees, injected input acknowledged through the inbox, interrupts by signal, and adoption
after a restart verified by pid and start time (docs/plugins.md "The shell executor"; the executor contract in
``loom/records/executor.py``).

Processes are short ``sh -c`` or ``python -c`` scripts. The tests wait for a process by polling a
file it writes, with a deadline (a real subprocess has nothing else to wait on); never by sleeping.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

import loom
from loom.plugins.shell import (
    ShellExecutor,
    _spawn,
    boot_id,
    environment,
    process_start_time,
    read_config,
)
from loom.testing import T0_MS

POLL_S = 0.01
DEADLINE_S = 20


async def appears(path: Path) -> None:
    """Until the subprocess wrote ``path`` (a deadline, never a fixed sleep)."""
    for _ in range(int(DEADLINE_S / POLL_S)):
        if os.path.exists(path):  # noqa: ASYNC240 - a stat of a local file, polled
            return
        await trio.sleep(POLL_S)
    raise AssertionError(f"{path} never appeared")


def event(n: int = 1, type: str = "job.requested") -> loom.Event:
    return loom.Event(
        id=f"ev-{n}", seq=n, source="test", delivery_id=f"d-{n}", type=type, scope="ops", key="job/1",
        work_id=None, execution_id=None, payload={"n": n}, parent_id=None, cause_id=None,
        root_id=f"ev-{n}", depth=0, accepted_at_ms=T0_MS,
    )  # fmt: skip


def request(config: Mapping[str, Any], execution_id: str = "x-1") -> loom.RunRequest:
    return loom.RunRequest(
        work_id="wk-1", execution_id=execution_id, attempt=1, scope="ops", kind=None, trigger=event(1),
        inputs=(event(1),), binding="sh", config=dict(config), executor="shell",
    )  # fmt: skip


class Toolbelt:
    """The parts of the toolbelt the shell executor uses: its lease, pin and adopt."""

    def __init__(self, req: loom.RunRequest, token: str = "token-1") -> None:
        self.lease = loom.Lease(
            execution_id=req.execution_id, work_id=req.work_id, attempt=1, epoch=1, token=token,
            owner="test", expires_at_ms=T0_MS + 60_000, request=req,
        )  # fmt: skip
        self.pinned: dict[str, Any] | None = None
        self.pinned_event = trio.Event()
        self.adopted = trio.Event()

    async def pin(self, metadata: Mapping[str, Any]) -> None:
        self.pinned = dict(metadata)
        self.pinned_event.set()

    async def adopt(self) -> None:
        self.adopted.set()


def sh(script: str, **config: Any) -> dict[str, Any]:
    return {"command": ["sh", "-c", script], **config}


def py(script: str, **config: Any) -> dict[str, Any]:
    return {"command": [sys.executable, "-c", script], **config}


# -- outcomes ------------------------------------------------------------------------------------------


async def test_a_non_zero_exit_fails_with_the_status_and_the_tail_of_stderr(tmp_path: Path) -> None:
    """Catches an executor that reports any exit as completed, or drops the reason."""
    executor = ShellExecutor(state_dir=tmp_path)
    req = request(sh("echo starting; echo 'boom: the disk is full' >&2; exit 3"))
    outcome = await executor.launch(req, Toolbelt(req))
    assert isinstance(outcome, loom.Failed)
    assert "exit status 3" in outcome.error
    assert "boom: the disk is full" in outcome.error


async def test_a_failure_keeps_the_end_of_any_stderr_as_a_storable_error(tmp_path: Path) -> None:
    """A process that writes a NUL and more than a reason holds to stderr fails with an error every
    store keeps (the NUL as its escape, at most 2,000 characters) that ends with what it wrote last.
    Catches stderr quoted as written: the outcome's commit is refused and the attempt stays running."""
    executor = ShellExecutor(state_dir=tmp_path)
    req = request(sh("head -c 3000 /dev/zero | tr '\\000' x >&2; printf ' a\\000b the end' >&2; exit 3"))
    outcome = await executor.launch(req, Toolbelt(req))
    assert isinstance(outcome, loom.Failed)
    assert loom.records.validation.validate_outcome(outcome) == outcome
    assert outcome.error.startswith("exit status 3; stderr: ...")
    assert outcome.error.endswith("x a\\u0000b the end")


@pytest.mark.timeout(60)
async def test_a_command_that_leaves_fifos_for_its_files_fails_and_blocks_nothing(tmp_path: Path) -> None:
    """The command owns its directory: it may replace its stderr, its acknowledgements or its inbox
    with a FIFO nothing writes to. Catches an executor that opens them as files: the open never returns,
    and with it the event loop (seen: `loom serve` answered nothing, ignored SIGTERM, and hung again
    at each restart, its recovery reading the same file)."""
    executor = ShellExecutor(state_dir=tmp_path)
    fifos = 'for f in stderr ack inbox.jsonl; do rm -f "$LOOM_DIR/$f"; mkfifo "$LOOM_DIR/$f"; done'
    req = request(sh(f"echo gone >&2; {fifos}; exit 3"))
    toolbelt = Toolbelt(req)
    with trio.fail_after(DEADLINE_S):  # (a blocked open would hold the loop: the test's timeout ends it)
        outcome = await executor.launch(req, toolbelt)
        assert isinstance(outcome, loom.Failed)
        assert outcome.error == "exit status 3", "a FIFO is no stderr to quote"
        assert toolbelt.pinned is not None
        logs = await executor.logs(req.execution_id, toolbelt.pinned, tail=100)
        assert logs == {"stdout": "", "stderr": ""}


def running(pid: int) -> bool:
    """The process ``pid`` runs (a zombie no longer does: an orphan's reaper may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


SPAWNS = """
import os, subprocess, sys
grouped = subprocess.Popen(["sleep", "600"], process_group=0)   # a group of its own (as `timeout` takes)
daemon = subprocess.Popen(["sleep", "600"], start_new_session=True)   # a session of its own (setsid)
open(os.environ["OUT"], "w").write(f"{grouped.pid} {daemon.pid}")
"""


async def test_an_attempt_that_ends_kills_its_whole_session_but_not_a_session_it_started(
    tmp_path: Path,
) -> None:
    """docs/plugins.md: however an attempt ends, what is left of it is killed; a process that must
    outlive it starts a session of its own. Catches an end that kills the process group alone (a
    grandchild in a group of its own ran on) and one that kills what ``setsid`` put out of reach."""
    out = tmp_path / "pids"
    req = request(py(SPAWNS, env={"OUT": str(out)}))
    executor, toolbelt = ShellExecutor(state_dir=tmp_path / "state"), Toolbelt(req)
    assert await executor.launch(req, toolbelt) == loom.Completed()
    grouped, daemon = (int(pid) for pid in out.read_text().split())
    try:
        assert not running(grouped), "its own group kept it out of the attempt's end"
        assert running(daemon), "a session of its own outlives the attempt"
        # the next open's sweep of what ended attempts left running (their environment names them)
        assert req.execution_id in await executor.lingering()
        assert toolbelt.pinned is not None
        with trio.fail_after(DEADLINE_S):
            await executor.end_lingering(req.execution_id, toolbelt.pinned, {"grace_s": 1})
        assert running(daemon), "nor does the next open stop it"
    finally:
        os.kill(daemon, 9)


async def test_exit_zero_completes(tmp_path: Path) -> None:
    executor = ShellExecutor(state_dir=tmp_path)
    req = request(sh("exit 0"))
    assert await executor.launch(req, Toolbelt(req)) == loom.Completed()


async def test_a_command_that_cannot_start_fails_naming_it(tmp_path: Path) -> None:
    executor = ShellExecutor(state_dir=tmp_path)
    req = request({"command": [str(tmp_path / "no-such-program")]})
    outcome = await executor.launch(req, Toolbelt(req))
    assert isinstance(outcome, loom.Failed)
    assert "no-such-program" in outcome.error


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "config.command must be a non-empty list of strings"),
        ({"command": "make test"}, "config.command must be a non-empty list of strings"),
        ({"command": ["make"], "env": {"A": 1}}, "config.env must be a table of names to strings"),
        ({"command": ["make"], "grace_s": -1}, "config.grace_s must be seconds"),
        ({"command": ["make"], "on_close": "kill"}, 'config.on_close must be "leave" or "stop"'),
        ({"command": ["make"], "comand": ["x"]}, "unknown config key 'comand'"),
    ],
)
async def test_a_bad_binding_config_fails_the_attempt_naming_the_key(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(loom.InvalidRequest, match="shell executor"):
        read_config(config)
    req = request(config)
    outcome = await ShellExecutor(state_dir=tmp_path).launch(req, Toolbelt(req))
    assert isinstance(outcome, loom.Failed)
    assert message in outcome.error


# -- the state directory: private to this user ---------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


async def test_the_state_directory_and_every_file_in_it_are_private(tmp_path: Path) -> None:
    """Each attempt's token and input used to be written with mode 0644 (readable by every user of the
    machine). Catches any file of the attempt, or a directory, open to the group or to others."""
    root = tmp_path / "shared" / "state"
    req = request(sh("echo out; echo err >&2"))
    assert await ShellExecutor(state_dir=root).launch(req, Toolbelt(req)) == loom.Completed()
    (directory,) = root.iterdir()
    assert _mode(root) == 0o700
    assert _mode(directory) == 0o700
    names = {path.name for path in directory.iterdir()}
    assert names >= {"request.json", "inbox.jsonl", "ack", "token", "stdout", "stderr", "status.json"}
    assert {name: oct(_mode(directory / name)) for name in names} == {name: oct(0o600) for name in names}


async def test_a_state_directory_open_to_others_is_closed_before_use(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir()
    root.chmod(0o777)
    req = request(sh("exit 0"))
    assert await ShellExecutor(state_dir=root).launch(req, Toolbelt(req)) == loom.Completed()
    assert _mode(root) == 0o700


@pytest.mark.parametrize("kind", ["another user's", "a link"])
async def test_a_state_directory_this_user_does_not_own_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Another user can make /tmp/loom-shell-<uid> first (its name is predictable), open to all: the
    executor used to write every attempt's token into it. Now the attempt fails naming the directory,
    nothing is written there and no process starts."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    root = tmp_path / "state"
    if kind == "a link":
        root.symlink_to(elsewhere)
    else:
        root = elsewhere
        if os.geteuid() == 0:
            os.chown(root, 65534, 65534)  # nobody's
        else:  # this user cannot give a directory away: be, to the executor, another user than its owner
            monkeypatch.setattr(os, "geteuid", lambda: os.lstat(root).st_uid + 1)
    started = tmp_path / "started"
    req = request(sh(f"touch {started}"))
    outcome = await ShellExecutor(state_dir=root).launch(req, Toolbelt(req))
    assert isinstance(outcome, loom.Failed)
    assert str(root) in outcome.error
    assert ("belongs to user id" if kind != "a link" else "not a directory of its own") in outcome.error
    assert list(elsewhere.iterdir()) == []
    assert not started.exists()


# -- through a runtime ---------------------------------------------------------------------------------


def runtime_config(command: list[str], policy: str = "queue", **extra: Any) -> loom.Config:
    return loom.Config.from_dict({
        "scopes": {"ops": {
            "bindings": {"sh": {"executor": "shell", "capabilities": ["inject", "interrupt"],
                                "config": {"command": command, **extra}}},
            "routes": [{"name": "jobs", "types": ["job.*"], "create_work": True, "binding": "sh",
                        "policy": policy}],
        }},
    })  # fmt: skip


def job(n: int) -> loom.EventIn:
    return loom.EventIn(
        source="test", delivery_id=f"d-{n}", type="job.requested", scope="ops", key="job/1", payload={"n": n}
    )


async def until_work(rt: loom.Runtime, key: str, state: loom.WorkState) -> loom.Work:
    """Until the Work for ``key`` is in ``state``, woken by commits."""
    async with rt.watch() as notices:
        with trio.fail_after(DEADLINE_S):
            while True:
                try:
                    work = await rt.work_for_key(key)
                except loom.NotFound:
                    work = None
                if work is not None and work.state is state:
                    return work
                await notices.__anext__()


async def until_adopted(rt: loom.Runtime, execution: loom.Execution) -> loom.Execution:
    """Until ``execution`` is adopted (running again, under a higher epoch), woken by commits."""
    async with rt.watch() as notices:
        with trio.fail_after(DEADLINE_S):
            while True:
                now = await rt.execution(execution.id)
                if now.state is loom.ExecutionState.RUNNING and now.epoch > execution.epoch:
                    return now
                await notices.__anext__()


async def test_the_process_sees_its_request_and_credentials_and_exit_zero_completes_the_work(
    tmp_path: Path,
) -> None:
    """Catches a process started without its execution id, token, URL or request file."""
    seen = tmp_path / "seen.json"
    script = (
        "import json, os, pathlib; e = os.environ; "
        "names = ['LOOM_URL', 'LOOM_EXECUTION_ID', 'LOOM_TOKEN', 'JOB']; "
        f"pathlib.Path({str(seen)!r}).write_text(json.dumps({{"
        "'env': {n: e.get(n) for n in names}, "
        "'request': json.loads(pathlib.Path(e['LOOM_REQUEST']).read_text()), "
        "'token_file': pathlib.Path(e['LOOM_TOKEN_FILE']).read_text()}))"
    )
    executor = ShellExecutor(state_dir=tmp_path / "state", url="http://127.0.0.1:8440")
    config = runtime_config([sys.executable, "-c", script], env={"JOB": "nightly"})
    async with loom.open_runtime(
        ":memory:", clock=loom.ManualClock(start_ms=T0_MS), config=config, plugins=[executor]
    ) as rt:
        accepted = await rt.publish(job(1))
        work = await until_work(rt, "job/1", loom.WorkState.COMPLETED)
        (execution,) = (await rt.history(work.id)).executions
    data = json.loads(seen.read_text())
    assert data["env"]["LOOM_URL"] == "http://127.0.0.1:8440"
    assert data["env"]["LOOM_EXECUTION_ID"] == execution.id
    assert data["env"]["LOOM_TOKEN"]
    assert data["env"]["LOOM_TOKEN"] == data["token_file"]
    assert data["env"]["JOB"] == "nightly"
    assert data["request"]["trigger"]["id"] == accepted.id
    assert [e["payload"] for e in data["request"]["inputs"]] == [{"n": 1}]
    assert execution.metadata is not None
    assert set(execution.metadata) >= {"pid", "start_time", "dir"}


ACK_ONE = """
import json, os, pathlib, time
inbox, ack, out = pathlib.Path(os.environ["LOOM_INBOX"]), pathlib.Path(os.environ["LOOM_ACK"]), os.environ["OUT"]
pathlib.Path(out + ".ready").touch()
while not inbox.read_text():
    time.sleep(0.01)
entry = json.loads(inbox.read_text().splitlines()[0])
with ack.open("a") as f:
    f.write(entry["id"] + "\\n")
pathlib.Path(out).write_text(json.dumps(entry["event"]["payload"]))
"""


async def test_injected_input_is_written_to_the_inbox_and_consumed_once_acknowledged(tmp_path: Path) -> None:
    """Catches an inject that never reaches the process, or an exit 0 that leaves acknowledged input
    pending (it would start another attempt with it)."""
    out = tmp_path / "got.json"
    executor = ShellExecutor(state_dir=tmp_path / "state")
    config = runtime_config([sys.executable, "-c", ACK_ONE], policy="inject", env={"OUT": str(out)})
    async with loom.open_runtime(
        ":memory:", clock=loom.ManualClock(start_ms=T0_MS), config=config, plugins=[executor]
    ) as rt:
        await rt.publish(job(1))
        await appears(Path(f"{out}.ready"))
        second = await rt.publish(job(2))
        work = await until_work(rt, "job/1", loom.WorkState.COMPLETED)
        (execution,) = (await rt.history(work.id)).executions
        assert work.pending_inputs == ()
        assert execution.inputs == (execution.trigger_id,)
        assert [i.status for i in await rt.intents(execution.id)] == [loom.IntentStatus.CONSUMED]
        assert (await rt.intents(execution.id))[0].event_id == second.id
    assert json.loads(out.read_text()) == {"n": 2}


async def test_inject_is_not_accepted_by_a_process_that_exits_without_acknowledging(tmp_path: Path) -> None:
    """Catches an inject that answers accepted (or hangs) when the process never read its input."""
    executor = ShellExecutor(state_dir=tmp_path)
    ready = tmp_path / "ready"
    req = request(sh(f'touch {ready}; while [ ! -s "$LOOM_INBOX" ]; do sleep 0.01; done; exit 0'))
    async with trio.open_nursery() as nursery:
        outcomes: list[loom.Outcome] = []

        async def run() -> None:
            outcomes.append(await executor.launch(req, Toolbelt(req)))

        nursery.start_soon(run)
        await appears(ready)
        with pytest.raises(loom.NotAccepting, match="exited before it acknowledged ev-2"):
            await executor.inject(req.execution_id, event(2))
    assert outcomes == [loom.Completed()], "input it never acknowledged is not consumed"
    with pytest.raises(loom.NotAccepting, match="not running"):
        await executor.inject(req.execution_id, event(3))


# -- interrupt -----------------------------------------------------------------------------------------


async def launched(
    executor: ShellExecutor, req: loom.RunRequest, nursery: trio.Nursery, ready: Path
) -> tuple[Toolbelt, list[loom.Outcome]]:
    toolbelt = Toolbelt(req)
    outcomes: list[loom.Outcome] = []

    async def run() -> None:
        outcomes.append(await executor.launch(req, toolbelt))

    nursery.start_soon(run)
    await toolbelt.pinned_event.wait()
    await appears(ready)
    return toolbelt, outcomes


async def test_interrupt_sends_sigterm_and_returns_once_the_process_has_stopped(tmp_path: Path) -> None:
    """Catches an interrupt that returns before the process is gone (a replacement would overlap it)."""
    executor = ShellExecutor(state_dir=tmp_path)
    ready, term = tmp_path / "ready", tmp_path / "term"
    req = request(sh(f"trap 'touch {term}; exit 7' TERM; touch {ready}; while :; do sleep 0.05; done"))
    async with trio.open_nursery() as nursery:
        _, outcomes = await launched(executor, req, nursery, ready)
        await executor.interrupt(req.execution_id)
        assert term.exists(), "the process got SIGTERM"
    (outcome,) = outcomes
    assert isinstance(outcome, loom.Failed)
    assert outcome.error.startswith("interrupted; exit status 7")


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    """Catches an interrupt that waits forever on a process ignoring SIGTERM."""
    executor = ShellExecutor(state_dir=tmp_path)
    ready = tmp_path / "ready"
    req = request(sh(f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done", grace_s=0.2))
    async with trio.open_nursery() as nursery:
        _, outcomes = await launched(executor, req, nursery, ready)
        with trio.fail_after(DEADLINE_S):
            await executor.interrupt(req.execution_id)
    (outcome,) = outcomes
    assert isinstance(outcome, loom.Failed)
    assert outcome.error.startswith("interrupted; it was killed")


# -- recover -------------------------------------------------------------------------------------------


WAIT_FOR_GO = 'touch "$LOOM_DIR/ready"; while [ ! -f "$LOOM_DIR/go" ]; do sleep 0.01; done; exit "${CODE:-0}"'


async def left_running(tmp_path: Path, config: dict[str, Any]) -> tuple[loom.RunRequest, dict[str, Any]]:
    """Launch a process and abandon the launch, as a runtime that closed or died does: the process
    goes on; return its request and pinned metadata."""
    req = request(config)
    toolbelt = Toolbelt(req)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ShellExecutor(state_dir=tmp_path).launch, req, toolbelt)
            await toolbelt.pinned_event.wait()
            assert toolbelt.pinned is not None
            await appears(Path(toolbelt.pinned["dir"]) / "ready")
            scope.cancel()
    assert toolbelt.pinned is not None
    return req, toolbelt.pinned


async def test_recover_adopts_a_process_still_running_after_a_restart(tmp_path: Path) -> None:
    """Catches a recover that relaunches, or returns before the adopted process ends."""
    req, metadata = await left_running(tmp_path, sh(WAIT_FOR_GO))
    assert process_start_time(metadata["pid"]) == metadata["start_time"], "it survived the launch's end"
    restarted = ShellExecutor(state_dir=tmp_path)  # a fresh executor, as after a restart
    toolbelt = Toolbelt(req, token="token-2")
    outcomes: list[loom.Outcome] = []
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            outcomes.append(await restarted.recover(req, toolbelt, metadata))

        nursery.start_soon(run)
        await toolbelt.adopted.wait()
        directory = Path(metadata["dir"])
        assert (directory / "token").read_text() == "token-2", "the process can use its new credentials"
        assert outcomes == [], "recover waits for the adopted process"
        (directory / "go").touch()
    assert outcomes == [loom.Completed()]


async def test_recover_reads_the_exit_status_of_a_process_that_ended_while_loom_was_down(
    tmp_path: Path,
) -> None:
    req, metadata = await left_running(tmp_path, sh(WAIT_FOR_GO, env={"CODE": "4"}))
    directory = Path(metadata["dir"])
    (directory / "go").touch()
    await appears(directory / "status.json")
    toolbelt = Toolbelt(req, token="token-2")
    with trio.fail_after(DEADLINE_S):
        outcome = await ShellExecutor(state_dir=tmp_path).recover(req, toolbelt, metadata)
    assert toolbelt.adopted.is_set()
    assert isinstance(outcome, loom.Failed)
    assert "exit status 4" in outcome.error


async def test_recover_refuses_a_pid_that_now_belongs_to_another_process(tmp_path: Path) -> None:
    """Catches adoption by pid alone: a recycled pid would be watched as if it were the attempt."""
    req = request(sh("exit 0"))
    me = os.getpid()
    start = process_start_time(me)
    assert start is not None
    toolbelt = Toolbelt(req)
    (tmp_path / "x-1-abc").mkdir(mode=0o700)
    metadata = {"pid": me, "start_time": start + 1, "dir": str(tmp_path / "x-1-abc")}
    with pytest.raises(loom.NotAdoptable, match=f"process {me} is gone and left no exit status"):
        await ShellExecutor(state_dir=tmp_path).recover(req, toolbelt, metadata)
    assert not toolbelt.adopted.is_set()


@pytest.mark.parametrize(
    "metadata", [{"pid": "12", "start_time": 1, "dir": "/tmp"}, {"pid": 12, "dir": "/tmp"}, {"pid": 12}]
)
async def test_recover_refuses_metadata_naming_no_directory_of_its_own(
    tmp_path: Path, metadata: dict[str, Any]
) -> None:
    """Catches a recovery that writes its claim into a directory the executor does not own."""
    req = request(sh("exit 0"))
    toolbelt = Toolbelt(req)
    with pytest.raises(loom.NotAdoptable, match="pinned no directory of its own"):
        await ShellExecutor(state_dir=tmp_path).recover(req, toolbelt, metadata)
    assert not toolbelt.adopted.is_set()


async def test_a_restarted_runtime_adopts_the_running_process_instead_of_starting_another(
    tmp_path: Path,
) -> None:
    """End to end: the attempt outlives the runtime that launched it; the next open recovers it through
    the shell executor, which adopts the same process (one attempt, one process, a higher epoch)."""
    db = str(tmp_path / "loom.db")
    starts = tmp_path / "starts"
    script = f'echo started >> {starts}; touch "$LOOM_DIR/ready"; while [ ! -f "$LOOM_DIR/go" ]; do sleep 0.01; done'
    config = runtime_config(["sh", "-c", script])
    clock = loom.ManualClock(start_ms=T0_MS)
    async with loom.open_runtime(
        db, clock=clock, config=config, plugins=[ShellExecutor(state_dir=tmp_path / "state")]
    ) as rt:
        await rt.publish(job(1))
        await appears(starts)
        work = await rt.work_for_key("job/1")
        assert work.current_execution_id is not None
        execution = await rt.execution(work.current_execution_id)
        for _ in range(int(DEADLINE_S / POLL_S)):  # the pin commits just after the process starts
            if execution.metadata is not None:
                break
            await trio.sleep(POLL_S)
            execution = await rt.execution(execution.id)
    assert execution.metadata is not None
    directory = Path(execution.metadata["dir"])
    await appears(directory / "ready")

    async with loom.open_runtime(
        db, clock=clock, config=config, plugins=[ShellExecutor(state_dir=tmp_path / "state")]
    ) as rt:
        await until_adopted(rt, execution)
        (directory / "go").touch()
        work = await until_work(rt, "job/1", loom.WorkState.COMPLETED)
        (adopted,) = (await rt.history(work.id)).executions
    assert adopted.id == execution.id
    assert adopted.epoch > execution.epoch
    assert adopted.state is loom.ExecutionState.COMPLETED
    assert starts.read_text().splitlines() == ["started"], "one process, adopted, never a second start"


# -- the kill -9 window of a start (docs/recovery.md, "A kill during a start") -----------------------------


def counted(tmp_path: Path) -> dict[str, Any]:
    """A command that appends one line to ``runs`` each time it runs, then waits for ``go``."""
    runs, go = tmp_path / "runs", tmp_path / "go"
    return sh(f'echo ran >> "{runs}"; while [ ! -e "{go}" ]; do sleep 0.01; done')


def runs(tmp_path: Path) -> int:
    path = tmp_path / "runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def test_a_process_spawned_before_its_pin_is_adopted_by_its_claim(tmp_path: Path) -> None:
    """A loom killed after spawning the process and before pinning it: the recovery finds the process by
    the wrapper's claim on the pinned directory and adopts it. Catches a recovery that fails the attempt
    (whose command still runs, and would run again on its retry)."""
    executor = ShellExecutor(state_dir=tmp_path / "state")
    req = request(counted(tmp_path))
    directory = executor._prepare(req, "token-1")
    pid = _spawn(
        directory, read_config(req.config), {**os.environ, **environment(directory, req, "token-1", None)}
    )
    await appears(tmp_path / "runs")
    toolbelt = Toolbelt(req, token="token-2")
    async with trio.open_nursery() as nursery:

        async def recover() -> None:
            outcome = await executor.recover(req, toolbelt, {"dir": str(directory), "boot_id": boot_id()})
            assert outcome == loom.Completed()

        nursery.start_soon(recover)
        with trio.fail_after(DEADLINE_S):
            await toolbelt.adopted.wait()
        (tmp_path / "go").touch()
    assert process_start_time(pid) is None  # it ended, and was reaped by the recovery that adopted it
    assert runs(tmp_path) == 1


async def test_a_recovery_that_claims_the_directory_first_runs_the_command_once(tmp_path: Path) -> None:
    """A loom killed after pinning the directory, before the wrapper started: the recovery claims the
    directory as abandoned and runs the attempt itself; a wrapper that starts late finds the claim and
    does not run the command. Catches a start that can run its command twice."""
    executor = ShellExecutor(state_dir=tmp_path / "state")
    req = request(sh(f'echo ran >> "{tmp_path / "runs"}"'))
    directory = executor._prepare(req, "token-1")
    toolbelt = Toolbelt(req, token="token-2")
    outcome = await executor.recover(req, toolbelt, {"dir": str(directory), "boot_id": boot_id()})
    assert outcome == loom.Completed()
    assert toolbelt.adopted.is_set()
    assert runs(tmp_path) == 1
    late = _spawn(
        directory, read_config(req.config), {**os.environ, **environment(directory, req, "token-1", None)}
    )
    _, status = await trio.to_thread.run_sync(os.waitpid, late, 0)
    assert os.waitstatus_to_exitcode(status) == 125
    assert "a recovery took the attempt over" in (directory / "status.json").read_text()
    assert runs(tmp_path) == 1
    again = Toolbelt(req, token="token-3")  # a second recovery (the first one's loom died too)
    assert (
        await executor.recover(req, again, {"dir": str(directory), "boot_id": boot_id()}) == loom.Completed()
    )
    assert runs(tmp_path) == 2  # the first recovery's run never committed: its attempt runs once more


async def test_an_attempt_that_pinned_nothing_runs_when_recovered(tmp_path: Path) -> None:
    """Nothing is spawned before the directory is pinned, so an attempt with nothing pinned never
    started: its recovery runs it (no retry spent, nothing run twice)."""
    req = request(sh(f'echo ran >> "{tmp_path / "runs"}"'))
    toolbelt = Toolbelt(req, token="token-2")
    assert await ShellExecutor(state_dir=tmp_path / "state").recover(req, toolbelt, {}) == loom.Completed()
    assert toolbelt.adopted.is_set()
    assert runs(tmp_path) == 1
