"""loom beside APScheduler 4, Huey and DBOS: durable submit, due jobs run to recorded done, lateness.

Run from the repository root::

    python bench/peers.py [--submits N] [--due N] [--late N] [--spacing-ms MS] [--producers P]
                          [--only loom,apscheduler,huey,dbos] [--dir DIR] [--envs DIR] [--quick]

Each peer is installed into an environment of its own under ``--envs`` (default
``~/.cache/loom-bench-peers``; made and filled with pip on first use, reused after) and measured by
bench/peer_jobs.py run as a subprocess there; loom's own figures run in this process. None of them is
a loom dependency. Every database is a SQLite file in one temporary directory under ``--dir`` (default:
the system temp dir), so all share one disk, in WAL mode with ``synchronous=FULL``. Each figure is given
as a ratio to raw sqlite3 commit-per-row inserts measured just before and just after that workload of
that system (their mean), in the same run. A peer that cannot be installed or run is reported with its
reason. See bench/README.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import accept
import attrs
import trio

import loom
from loom.plugins.python_executor import PythonExecutor
from loom.records.executor import Toolbelt
from loom.records.work import Outcome, RunRequest
from loom.store import SQLiteStore
from loom.testing import raw

HERE = Path(__file__).parent
CHILD = HERE / "peer_jobs.py"
SCOPE = "bench"
MIN_LEAD_S = 3.0
CHILD_TIMEOUT_S = 900


@attrs.frozen
class Peer:
    name: str
    requirements: tuple[str, ...]
    """What pip installs into the peer's own environment."""
    store: str
    """The peer's durable store here, as the report names it."""
    submit: str
    due: str
    """How a job is submitted, and how a job due at a moment is made, in the peer's own terms."""


PEERS = {
    "apscheduler": Peer(
        "APScheduler",
        ("--pre", "apscheduler[sqlalchemy]>=4.0.0a1", "aiosqlite", "sniffio"),
        "AsyncScheduler, SQLAlchemyDataStore on SQLite through aiosqlite",
        "add_job, returning after its insert committed",
        "add_schedule with a DateTrigger; done = JobReleased, after the job's release committed",
    ),
    "huey": Peer(
        "Huey",
        ("huey",),
        "SqliteHuey(fsync=True), a consumer of 8 worker threads",
        "calling the task (enqueue), returning after its insert committed",
        "task.schedule(eta=...); done = SIGNAL_COMPLETE, after the result was stored",
    ),
    "dbos": Peer(
        "DBOS",
        ("dbos",),
        "its SQLite system database, a queue (polling every 1 s)",
        "DBOS.enqueue_workflow, returning after the ENQUEUED status row committed",
        "enqueue with SetEnqueueOptions(delay_seconds=...); done = status SUCCESS (its updated_at)",
    ),
}
LOOM_HOW = (
    "rt.publish of distinct Events, returning after its group commit",
    "rt.arm timers into a fresh-Work route, a python executor function completing at once; done = the "
    "attempt's completion (its ended_at)",
)

ROUTED = loom.Config.from_dict(
    {
        "scopes": {
            SCOPE: {
                "bindings": {"py": {"executor": "python", "config": {"function": "done"}}},
                "routes": [{"name": "due", "handler": "fresh", "create_work": True, "binding": "py"}],
            }
        }
    }
)


# -- results --------------------------------------------------------------------------------------


@attrs.define
class System:
    """One system's results by workload, each with the raw commit-per-row rates measured just before and
    just after it (``raw``), and why any workload could not be measured."""

    key: str
    label: str
    results: dict[str, dict[str, Any]] = attrs.Factory(dict)
    failures: dict[str, str] = attrs.Factory(dict)

    def baseline(self, workload: str) -> float:
        """The raw commit-per-row rate around ``workload``: the mean of the one before and the one after."""
        before, after = self.results[workload]["raw"]
        return float(before + after) / 2

    def ratio(self, workload: str) -> float | None:
        """``workload``'s rate over its baseline (``None``: not measured)."""
        result = self.results.get(workload, {})
        return result["rate"] / self.baseline(workload) if "rate" in result else None

    def lateness(self, which: str) -> float | None:
        return self.results.get("lateness", {}).get(f"{which}_ms")

    def commits(self, ms: float) -> float:
        """``ms`` in raw commit-per-row transactions of the lateness figure's baseline."""
        return ms * self.baseline("lateness") / 1000


def say(line: str) -> None:
    print(line, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def lead_for(n: int, rate: float | None) -> float:
    """Seconds from now to the due moment: enough for ``n`` submits at ``rate`` to be in, twice over."""
    return max(MIN_LEAD_S, 1.0 + 2.0 * n / rate) if rate else 60.0


# -- loom, in this process -------------------------------------------------------------------------


async def loom_due(
    store: SQLiteStore, n: int, producers: int, lead: float, spacing_ms: float
) -> dict[str, Any]:
    """``n`` timers armed from ``producers`` tasks, due ``lead`` s from now (``spacing_ms`` apart when
    positive: the lateness workload), each firing an Event that a route gives to fresh Work whose
    python function completes at once."""
    executor = PythonExecutor()
    late_ms: list[float] = []
    all_started = trio.Event()

    @executor.function("done")
    async def done(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        late_ms.append(time.time() * 1000 - request.inputs[0].payload["due_ms"])
        if len(late_ms) == n:
            all_started.set()
        return loom.Completed()

    async with loom.open_runtime(
        store, clock=loom.SystemClock(), config=ROUTED, plugins=[executor], load_entry_points=False
    ) as rt:
        due_ms = int((time.time() + lead) * 1000)

        def due_of(i: int) -> int:
            return due_ms + int(i * spacing_ms)

        async def arm(first: int) -> None:
            for i in range(first, n, producers):
                spec = loom.TimerSpec(
                    id=f"job-{i}",
                    fire_at_ms=due_of(i),
                    source="bench",
                    type="bench.due",
                    scope=SCOPE,
                    payload={"due_ms": due_of(i)},
                )
                await rt.arm(spec)

        async with trio.open_nursery() as nursery:
            for p in range(producers):
                nursery.start_soon(arm, p)
        ready_ms = time.time() * 1000
        with trio.fail_after(lead + n * spacing_ms / 1000 + 600):
            await all_started.wait()
            await rt.wait_idle()  # every completion has committed
    (row,) = raw.query(
        store, "SELECT count(*) AS n, max(ended_at_ms) AS last FROM executions WHERE state = 'completed'"
    )
    assert row["n"] == n, f"{row['n']} of {n} attempts completed"
    if ready_ms > due_ms:
        return {"overran_s": (ready_ms - due_ms) / 1000}
    if spacing_ms:
        return {
            "p50_ms": percentile(late_ms, 0.5),
            "p99_ms": percentile(late_ms, 0.99),
            "max_ms": max(late_ms),
        }
    return {"rate": n / ((row["last"] - due_ms) / 1000), "slack_s": (due_ms - ready_ms) / 1000}


def loom_run(tmp: Path, workload: str, args: argparse.Namespace, lead: float) -> dict[str, Any]:
    """One loom workload; a failure is reported as the peers' are (``{"error": why}``), not raised."""
    try:
        return loom_workload(tmp, workload, args, lead)
    except Exception as exc:  # reported beside the other systems' figures
        return {"error": f"{type(exc).__name__}: {exc}"}


def loom_workload(tmp: Path, workload: str, args: argparse.Namespace, lead: float) -> dict[str, Any]:
    store = SQLiteStore(path=str(tmp / f"loom-{workload}-{time.monotonic_ns()}.db"), synchronous="FULL")
    if workload == "submit":
        rate, _ = trio.run(accept.loom_acceptance, store, args.submits, args.producers)
        return {"rate": rate, "settings": "journal_mode=wal, synchronous=FULL (SQLiteStore's own setting)"}
    if workload == "due":
        return trio.run(loom_due, store, args.due, args.producers, lead, 0.0)
    return trio.run(loom_due, store, args.late, args.producers, lead, args.spacing_ms)


# -- a peer, in its own environment ------------------------------------------------------------------


def last_words(text: str) -> str:
    """The last meaningful line of a failed command's output (pip's location warnings left out)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("WARNING: Location")]
    return lines[-1] if lines else "(no output)"


def child(python: Path, system: str, workload: str, *options: str) -> dict[str, Any]:
    """Run bench/peer_jobs.py in the peer's environment; its JSON result, or ``{"error": why}``.

    ``-P``: bench/ is not put on the module path (bench/http.py would shadow the standard library's)."""
    command = [str(python), "-P", str(CHILD), system, workload, *options]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {CHILD_TIMEOUT_S} s"}
    if done.returncode != 0:
        return {"error": last_words(done.stderr or done.stdout)}
    try:
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": f"no result in its output: {last_words(done.stdout + done.stderr)}"}
    return result


def environment(envs: Path, key: str, peer: Peer) -> tuple[Path | None, str]:
    """The peer's own environment, made and filled on first use: its python and its versions, or
    ``None`` and why it cannot be had."""
    home = envs / key
    python = home / "bin" / "python"
    if python.exists():
        found = child(python, key, "version")
        if "versions" in found:
            return python, describe_versions(found["versions"])
    say(f"# installing {peer.name} into {home} (pip install {' '.join(peer.requirements)})")
    made = subprocess.run(
        [sys.executable, "-m", "venv", str(home)], capture_output=True, text=True, check=False
    )
    if made.returncode != 0:
        return None, f"no environment could be made: {last_words(made.stderr)}"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *peer.requirements],
        capture_output=True,
        text=True,
        check=False,
    )
    if installed.returncode != 0:
        return None, f"pip could not install it: {last_words(installed.stderr)}"
    found = child(python, key, "version")
    if "versions" not in found:
        return None, f"installed, but it does not import: {found.get('error')}"
    return python, describe_versions(found["versions"])


def describe_versions(versions: dict[str, str]) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions.items())


def peer_run(
    python: Path, key: str, tmp: Path, workload: str, lead: float, *, args: argparse.Namespace
) -> dict[str, Any]:
    n = {"submit": args.submits, "due": args.due, "lateness": args.late}[workload]
    return child(
        python,
        key,
        workload,
        "--db",
        str(tmp / f"{key}-{workload}-{time.monotonic_ns()}.db"),
        "--n",
        str(n),
        "--producers",
        str(args.producers),
        "--lead",
        f"{lead:.3f}",
        "--spacing-ms",
        str(args.spacing_ms),
    )


# -- the run ----------------------------------------------------------------------------------------


def measure(
    system: System,
    tmp: Path,
    args: argparse.Namespace,
    run: Callable[[str, float], dict[str, Any]],
    how: tuple[str, str],
) -> None:
    """Every figure of one system, each between two raw baselines, printed as it is measured."""

    def bracketed(workload: str, lead: float) -> dict[str, Any]:
        before = accept.raw_commit_per_row(
            tmp / f"raw-{workload}-{time.monotonic_ns()}.db", args.serial, "FULL"
        )
        result = run(workload, lead)
        after = accept.raw_commit_per_row(
            tmp / f"raw-{workload}-{time.monotonic_ns()}.db", args.serial, "FULL"
        )
        return {**result, "raw": (before, after), "lead": lead}

    for workload, n in (("submit", args.submits), ("due", args.due), ("lateness", args.late)):
        lead = 0.0 if workload == "submit" else lead_for(n, system.results["submit"].get("rate"))
        result = bracketed(workload, lead)
        if "overran_s" in result:  # the submits took longer than the lead: once more, with room
            result = bracketed(workload, 2 * lead + result["overran_s"])
        if "overran_s" in result:
            result["error"] = f"scheduling {n:,} jobs took longer than the {result['lead']:.0f} s lead"
        system.results[workload] = result
        if "error" in result:
            system.failures[workload] = result["error"]
            say(f"{FIGURES[workload](args)}, {system.label}: failed: {result['error']}")
            continue
        before, after = result["raw"]
        raw = f"raw {before:,.0f} before, {after:,.0f} after: {system.baseline(workload):,.0f} rows/s"
        if workload == "submit":
            say(
                f"{FIGURES[workload](args)}, {system.label}: {result['rate']:,.0f} submits/s "
                f"= {system.ratio(workload):.2f} x raw commit-per-row ({raw}; {n:,} submits; {how[0]}; "
                f"its file: {result.get('settings', 'not reported')})"
            )
        elif workload == "due":
            say(
                f"{FIGURES[workload](args)}, {system.label}: {result['rate']:,.0f} jobs/s "
                f"= {system.ratio(workload):.2f} x raw commit-per-row ({raw}; all due at one moment, "
                f"scheduled {result['lead']:.1f} s ahead; {how[1]})"
            )
        else:
            p50, p99 = result["p50_ms"], result["p99_ms"]
            say(
                f"{FIGURES[workload](args)}, {system.label}: p50 {p50:,.1f} ms = {system.commits(p50):,.1f} "
                f"raw commits, p99 {p99:,.1f} ms = {system.commits(p99):,.1f} raw commits, max "
                f"{result['max_ms']:,.1f} ms ({raw}; {n:,} jobs {args.spacing_ms:g} ms apart; due time to "
                "the job function's start)"
            )


FIGURES: dict[str, Callable[[argparse.Namespace], str]] = {
    "submit": lambda args: f"durable submit, {args.producers} producers",
    "due": lambda args: f"{args.due:,} due jobs run to recorded done",
    "lateness": lambda args: "lateness of due jobs under light load",
}


def summary(systems: list[System], args: argparse.Namespace) -> None:
    """One line per figure: which system leads, the rest in order, and any not measured."""

    def line(
        figure: str, value: Callable[[System], float | None], show: Callable[[System, float], str], high: bool
    ) -> None:
        measured = [(s, v) for s in systems if (v := value(s)) is not None]
        measured.sort(key=lambda pair: pair[1], reverse=high)
        missing = [s.label for s in systems if value(s) is None]
        if not measured:
            say(f"summary, {figure}: no system measured")
            return
        (first, best), rest = measured[0], measured[1:]
        say(
            f"summary, {figure}: {first.label} leads at {show(first, best)}"
            + (f"; then {'; '.join(f'{s.label} {show(s, v)}' for s, v in rest)}" if rest else "")
            + (f"; not measured: {', '.join(missing)}" if missing else "")
        )

    def times(s: System, ratio: float) -> str:
        return f"{ratio:.2f}x"

    def ms(s: System, value: float) -> str:
        return f"{value:,.1f} ms ({s.commits(value):,.0f} raw commits)"

    line(f"{FIGURES['submit'](args)}, ratio to raw commit-per-row", lambda s: s.ratio("submit"), times, True)
    line(f"{FIGURES['due'](args)}, ratio to raw commit-per-row", lambda s: s.ratio("due"), times, True)
    line("lateness p50 (lower leads)", lambda s: s.lateness("p50"), ms, False)
    line("lateness p99 (lower leads)", lambda s: s.lateness("p99"), ms, False)
    rates = [rate for s in systems for r in s.results.values() if "raw" in r for rate in r["raw"]]
    if rates:
        say(
            f"raw sqlite3 commit-per-row over the run: median {statistics.median(rates):,.0f} rows/s, "
            f"from {min(rates):,.0f} to {max(rates):,.0f} ({len(rates)} measurements: how much the disk moved)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--submits", type=int, default=5_000, help="durable submits per system (default 5000)"
    )
    parser.add_argument("--due", type=int, default=5_000, help="jobs due at one moment (default 5000)")
    parser.add_argument("--late", type=int, default=200, help="jobs for the lateness figure (default 200)")
    parser.add_argument("--spacing-ms", type=float, default=20.0, help="between lateness jobs (default 20)")
    parser.add_argument("--producers", type=int, default=100, help="concurrent producers (default 100)")
    parser.add_argument("--serial", type=int, default=500, help="raw commit-per-row rows (default 500)")
    parser.add_argument("--only", default="loom,apscheduler,huey,dbos", help="which systems, in this order")
    parser.add_argument("--quick", action="store_true", help="1,000 submits, 1,000 due, 100 late jobs")
    parser.add_argument("--dir", default=None, help="put the temporary database directory here")
    parser.add_argument(
        "--envs",
        default=str(Path.home() / ".cache" / "loom-bench-peers"),
        help="where the peers' own environments are kept (default ~/.cache/loom-bench-peers)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.submits, args.due, args.late = 1_000, 1_000, 100
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(only) - {"loom", *PEERS}
    if unknown or not only:
        parser.error(f"--only takes loom and {', '.join(PEERS)}, got {args.only!r}")
    if min(args.submits, args.due, args.late, args.producers, args.serial) < 1 or args.spacing_ms <= 0:
        parser.error("every count must be at least 1 and --spacing-ms above 0")

    envs = Path(args.envs).expanduser()
    ready: dict[str, tuple[Path | None, str]] = {
        key: environment(envs, key, PEERS[key]) for key in only if key in PEERS
    }
    tmp = Path(tempfile.mkdtemp(prefix="loom-bench-peers-", dir=args.dir))
    try:
        named = ", ".join(
            f"{PEERS[key].name} ({versions if python else 'not available'})"
            for key, (python, versions) in ready.items()
        )
        say(
            f"# {sys.platform}, python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
            f"{os.cpu_count()} cores; loom {loom.__version__} (this tree){', ' if named else ''}{named}; "
            f"every database a SQLite file in {tmp} (WAL, synchronous=FULL); {args.producers} producers, "
            f"{args.submits:,} submits, {args.due:,} due jobs, {args.late:,} lateness jobs "
            f"{args.spacing_ms:g} ms apart"
        )
        systems: list[System] = []
        for key in only:
            if key == "loom":
                system = System("loom", "loom")
                measure(system, tmp, args, lambda w, lead: loom_run(tmp, w, args, lead), LOOM_HOW)
                systems.append(system)
                continue
            peer = PEERS[key]
            python, versions = ready[key]
            if python is None:
                say(f"{peer.name}: not measured: {versions}")
                systems.append(System(key, peer.name, failures={"install": versions}))
                continue
            say(f"# {peer.name}: {peer.store}")
            system = System(key, peer.name)
            measure(
                system,
                tmp,
                args,
                functools.partial(peer_run, python, key, tmp, args=args),
                (peer.submit, peer.due),
            )
            systems.append(system)
        summary(systems, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
