"""A short run of every benchmark, failing when a figure falls past its floor.

Run from the repository root (CI runs it)::

    python bench/check.py [--only NAME,...]

Each figure is a ratio measured within one run of its script (or a count that does not depend on the
machine), so a slow or busy machine moves it little; each floor is about half the figure these runs
reached on a 2-core machine (bench/README.md), so noise cannot fail it, while a lost batch, an extra
commit per item or a starter that claims every waiting Work again does. The whole check takes about a
minute.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import attrs

HERE = Path(__file__).parent


@attrs.frozen
class Floor:
    name: str
    """What the figure says, as a reader of the report would put it."""
    script: str
    args: tuple[str, ...]
    pattern: str
    """A regular expression whose first group is the figure, matched against the script's output."""
    limit: float
    at_least: bool = True
    """``True``: the figure must not fall below ``limit``; ``False``: it must not rise above it."""
    reached: str = ""
    """The figure these runs reached (bench/README.md), for the report."""


FLOORS = (
    Floor(
        "acceptance, 100 producers / raw commit-per-row",
        "accept.py",
        ("--events", "3000", "--serial-events", "200", "--rounds", "1"),
        r"ratio loom-100/raw-commit-per-row: ([\d.]+)",
        1.2,
        reached="2.3-6.0",
    ),
    Floor(
        "acceptance, 1 producer / raw commit-per-row",
        "accept.py",
        ("--events", "3000", "--serial-events", "200", "--rounds", "1"),
        r"ratio loom-1/raw-commit-per-row: ([\d.]+)",
        0.12,
        reached="0.31-0.75",
    ),
    Floor(
        "route, claim, run and complete, 100 Works / acceptance",
        "route.py",
        ("--events", "300"),
        r"ratio route-100/accept: ([\d.]+)",
        0.05,
        reached="0.08-0.20",
    ),
    Floor(
        "route, claim, run and complete, 1 Work / acceptance",
        "route.py",
        ("--events", "300"),
        r"ratio route-1/accept: ([\d.]+)",
        0.08,
        reached="0.19-0.42 (0.02-0.05 when each Event was routed, and started an attempt, in a commit of its own)",
    ),
    Floor(
        "timers fired by the timer actor / raw one firing per commit",
        "timers.py",
        ("--fire", "2000", "--poll", "1000", "--armed", "100000", "--serial", "300"),
        r"ratio actor/raw-one-per-commit: ([\d.]+)",
        0.8,
        reached="1.2-3.7",
    ),
    Floor(
        "timers fired by rt.poll / raw one firing per commit",
        "timers.py",
        ("--fire", "2000", "--poll", "1000", "--armed", "100000", "--serial", "300"),
        r"ratio poll/raw-one-per-commit: ([\d.]+)",
        0.6,
        reached="1.0-3.2",
    ),
    Floor(
        "start with pending timers / raw scan of them (at most)",
        "timers.py",
        ("--fire", "2000", "--poll", "1000", "--armed", "100000", "--serial", "300"),
        r"startup with [\d,]+ pending timers .*\(ratio to the raw scan ([\d.]+)\)",
        1.5,
        at_least=False,
        reached="0.01-0.07 (4.6 when the timer actor rebuilt a heap of every armed timer)",
    ),
    Floor(
        "wakes to started continuations / acceptance",
        "waits.py",
        ("--waiting", "500", "--samples", "50", "--wakes", "300", "--timers", "50"),
        r"wakes to started continuations.*= ([\d.]+)x acceptance",
        0.04,
        reached="0.14-0.25",
    ),
    Floor(
        "recovered attempts / acceptance",
        "recovery.py",
        ("--attempts", "500", "--rounds", "1"),
        r"ratio recovered-per-s/acceptance-per-s: ([\d.]+)",
        0.06,
        reached="0.13-0.23",
    ),
    Floor(
        "storage requests per recovered attempt (at most)",
        "recovery.py",
        ("--attempts", "500", "--rounds", "1"),
        r"storage requests in [\d,]+ commits, ([\d.]+) and",
        2.0,
        at_least=False,
        reached="1.0 (3.0 when the runner adopted a finished result in a request of its own)",
    ),
    Floor(
        "POST /events, one Event per request / the HTTP stack alone (an empty handler)",
        "http.py",
        ("--events", "1000", "--works", "200", "--renders", "5", "--rounds", "1"),
        r"ratio http/empty-stack: ([\d.]+)",
        0.3,
        reached="0.51-0.75 (0.12 when each answer read its Event and routing back from the store)",
    ),
    Floor(
        "a read through the runtime / the same read through one trio.to_thread hop (at most)",
        "reads.py",
        ("--reads", "2000"),
        r"ratio loom-read/raw-hop-read: ([\d.]+)",
        2.0,
        at_least=False,
        reached="0.73-0.80 (6.1-6.3 when each read took four thread hops through sqlite-anyio)",
    ),
    Floor(
        "claims per start, 50 Works under capacity 1 (at most)",
        "admission.py",
        ("--works", "50"),
        r"\(([\d.]+) per start;",
        2.0,
        at_least=False,
        reached="1.02 (25 when every waiting Work was tried at each freed slot)",
    ),
)

CEILING = (
    "ceiling.py",
    ("--events", "1000", "--wakes", "300", "--timers", "2000", "--attempts", "300", "--jobs", "300"),
)
"""One short run of `ceiling.py`: each hot path's write statements per item (a count: an extra statement
per item fails it), and loom's rate as a fraction of those statements replayed alone (halving it takes
a loom that does twice the work around the same statements)."""

FLOORS += tuple(
    Floor(
        f"write statements per item, {path} (at most)",
        *CEILING,
        rf"(?m)^{path}: .*\(([\d.]+) statements per item\)",
        limit,
        at_least=False,
        reached=reached,
    )
    for path, limit, reached in (
        ("acceptance", 2.6, "2.1"),
        (
            "route-100",
            8.5,
            "6.8-7.4, with the inputs each attempt takes (8.3-9.7 before Works' records were carried;"
            " 10.4-11.8 before routed inputs and attempts were kept and an end's move went with the claim"
            " after it)",
        ),
        (
            "wakes",
            16.0,
            "15.1 (17.1-18.4 before the waiting Work and the parked attempt's row were carried; 19.4 before"
            " attempts were kept; 24.4 before the wake's move waited for its claim)",
        ),
        ("timers", 4.5, "4.0"),
        (
            "recovery",
            9.0,
            "8.2 (9.2 before an adoption's move went with the outcome's end; 10.2 before settling a"
            " recovered lease read no admission facts; 13.1-13.3 before the page"
            " of expired leases read each attempt whole with its Work's scope and kind, and an attempt's"
            " row was kept as written; 14.1-14.3 before the adoption told the segment clock)",
        ),
        (
            "due-jobs",
            12.5,
            "12.0-12.1 (13.0-13.1 before a new Work's routing read whether any Work was removed, once, rather"
            " than its id's tombstone; 14.1 before Works' records were carried; 15.1 before attempts were"
            " kept; 16.1 before pending inputs were)",
        ),
    )
) + tuple(
    Floor(
        f"{path}: loom / its write statements replayed alone",
        *CEILING,
        rf"(?m)^{path}: .*loom/replay ([\d.]+)",
        0.1,
        reached=reached,
    )
    for path, reached in (
        ("acceptance", "0.33-0.44"),
        (
            "route-100",
            "0.19-0.21 (0.23-0.31 with the reads carried Works' records took out: a slower replay)",
        ),
        ("wakes", "0.21-0.24 (0.24-0.32 with the reads carried Works' records took out: a slower replay)"),
        ("timers", "0.30-0.41"),
        ("recovery", "0.25-0.47"),
        ("due-jobs", "0.18-0.28"),
    )
)
FLOORS += tuple(
    Floor(
        f"objects per item freed by the cyclic collector, {path} (at most)",
        *CEILING,
        rf"(?m)^{path}: .*; ([\d.]+) objects per item freed by the cyclic collector",
        1.0,
        at_least=False,
        reached=reached,
    )
    for path, reached in (
        ("acceptance", "0.00"),
        (
            "route-100",
            "0.00 (8.2-14.3 when a batch's transaction and each lease renewal were reference cycles)",
        ),
        ("wakes", "0.00 (13.7-26.1 when a batch's transaction and each lease renewal were reference cycles)"),
        ("timers", "0.00"),
        ("recovery", "0.00"),
        ("due-jobs", "0.00"),
    )
)


def run(script: str, args: tuple[str, ...]) -> str:
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args], capture_output=True, text=True, timeout=600, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="scripts to run, e.g. accept.py,timers.py (default: all)")
    args = parser.parse_args(argv)
    only = {name.strip() for name in args.only.split(",") if name.strip()}
    outputs: dict[tuple[str, tuple[str, ...]], str] = {}
    failed: list[str] = []
    started = time.perf_counter()
    for floor in FLOORS:
        if only and floor.script not in only:
            continue
        key = (floor.script, floor.args)
        if key not in outputs:
            outputs[key] = run(floor.script, floor.args)
        found = re.search(floor.pattern, outputs[key])
        if found is None:
            failed.append(f"{floor.name}: {floor.script} printed no such figure ({floor.pattern})")
            print(f"MISSING  {floor.name}")
            continue
        figure = float(found.group(1))
        ok = figure >= floor.limit if floor.at_least else figure <= floor.limit
        bound = ">=" if floor.at_least else "<="
        print(
            f"{'ok' if ok else 'FAILED':8} {floor.name}: {figure:g} (floor {bound} {floor.limit:g}; reached {floor.reached})"
        )
        if not ok:
            failed.append(f"{floor.name}: {figure:g}, floor {bound} {floor.limit:g}")
    print(f"# {time.perf_counter() - started:.0f} s")
    if failed:
        print("\n".join(["bench/check.py: figures past their floors:", *failed]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
