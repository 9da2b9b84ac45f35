"""Two loom trees side by side on one hot path: runs alternated, each in a fresh process.

Run from the repository root::

    git worktree add /tmp/loom-before <commit>
    python bench/ab.py /tmp/loom-before . --path route-100 --runs 6

Each run prints the path's rate (items per second) and the storage thread's CPU per item (microseconds,
``time.thread_time`` around each batch the storage actor runs), then the medians of each tree. The runs of
the two trees take turns, so a machine that slows down or speeds up meanwhile moves both alike. The paths
are `ceiling.py`'s workloads (a fresh SQLite file each, WAL, ``synchronous=FULL``): ``route-100``,
``route-1`` (`route.py`'s routed Events into 100 standing Works, or one), ``wakes``, ``due-jobs``,
``recovery``, ``timers``, ``acceptance``, and ``acceptance-1`` (`route.py`'s acceptance with one producer:
a publish's round trip). See bench/README.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

PATHS = {
    "route-100": ("route_100", 3000),
    "route-1": ("route_1", 1000),
    "wakes": ("wakes", 2000),
    "due-jobs": ("due_jobs", 2000),
    "recovery": ("recovered", 2000),
    "timers": ("fired", 20000),
    "acceptance": ("acceptance", 10000),
    "acceptance-1": ("acceptance_1", 2000),
}

ONE_RUN = """
import sys, tempfile, time
from pathlib import Path
tree, workload, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, tree + "/bench"]
import trio, ceiling, route
import loom
from loom.store import SQLiteStore, _actor
assert loom.__file__.startswith(str(Path(tree).resolve())), loom.__file__
cpu = [0.0]
run = _actor.StorageActor._execute_until_settled
def timed(self, *args):
    started = time.thread_time()
    try:
        return run(self, *args)
    finally:
        cpu[0] += time.thread_time() - started
_actor.StorageActor._execute_until_settled = timed
class Window:  # the timed part, as ceiling.py's recorder marks it (nothing recorded)
    def begin(self): self.cpu = cpu[0]
    def end(self): self.cpu = cpu[0] - self.cpu
window = Window()
path = str(Path(tempfile.mkdtemp()) / "ab.db")
if workload in ("route_100", "route_1"):
    keys = 100 if workload == "route_100" else 1
    window.begin()
    rate = trio.run(route.routed, SQLiteStore(path=path, synchronous="FULL"), n, 100, keys).rate
    window.end()
elif workload == "acceptance_1":
    window.begin()
    rate = trio.run(route.acceptance, SQLiteStore(path=path, synchronous="FULL"), n, 1).rate
    window.end()
else:
    rate = trio.run(getattr(ceiling, workload), path, window, n)
print(rate, 1e6 * window.cpu / n)
"""


def one_run(tree: Path, workload: str, n: int) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, "-c", ONE_RUN, str(tree.resolve()), workload, str(n)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[-2]), float(out[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="a loom tree (a git worktree of an earlier commit)")
    parser.add_argument("after", type=Path, help="another loom tree (``.``: this one)")
    parser.add_argument("--path", choices=sorted(PATHS), default="route-100")
    parser.add_argument("--runs", type=int, default=5, help="runs of each tree (default 5)")
    parser.add_argument("--items", type=int, default=None, help="items per run (default: the path's)")
    args = parser.parse_args(argv)
    workload, n = PATHS[args.path]
    n = args.items or n
    figures: dict[Path, list[tuple[float, float]]] = {args.before: [], args.after: []}
    print(f"# {args.path}: {n:,} items per run, {args.runs} runs of each tree, alternated")
    for run in range(args.runs):
        for tree in (args.before, args.after):
            rate, cpu = one_run(tree, workload, n)
            figures[tree].append((rate, cpu))
            print(f"{tree}  run {run + 1}: {rate:,.0f} items/s, storage-thread CPU {cpu:,.0f} us per item")
    for tree, runs in figures.items():
        rates, cpus = [r for r, _ in runs], [c for _, c in runs]
        print(
            f"{tree}: median {statistics.median(rates):,.0f} items/s ({min(rates):,.0f} to {max(rates):,.0f}),"
            f" storage-thread CPU median {statistics.median(cpus):,.0f} us per item"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
