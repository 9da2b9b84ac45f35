"""Guards that make a regression fail instead of hang, and clean up after it (a pytest plugin:
`tests/conftest.py` imports its hooks and fixtures; an inner session loads it with ``-p guards``).

* Every test runs under pytest-timeout's ``timeout`` (pyproject sets the default; a test may say
  ``@pytest.mark.timeout(seconds)``), with ``timeout_method = "signal"``: the test fails with its
  traceback, and its fixtures are torn down.
* A trio test is cancelled a little earlier (`MARGIN_S`), from inside trio (`pytest_runtest_call`):
  it fails with `TestTimedOut`, its ``finally`` blocks and async fixtures run, and the next test
  finds trio as it should. The deadline is trio's clock: a test on a mock clock that jumps is not
  for this. pytest-timeout's signal stays the backstop for a test that
  blocks its event loop (a signal landing inside trio's own loop would break trio for the rest of the
  session).
* After each test, child processes it started and left running are killed and the test errs naming
  them (`reap_children`), so a test that fails or times out half way leaves no process behind.

The throwaway PostgreSQL server has a guard of its own (`loom.testing.postgres`): it is stopped when
the session ends, however it ends.
"""

from __future__ import annotations

import functools
import inspect
import os
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from loom.testing.postgres import GUARD_MARK

MARGIN_S = 30.0
"""A trio test is cancelled this long before its time limit (at most half of it), so that its
teardown ends before pytest-timeout's signal comes."""
STARTED = pytest.StashKey[float]()
"""When the item's test protocol began: pytest-timeout counts its setup and teardown too."""


class TestTimedOut(Exception):
    """A trio test ran past its deadline and was cancelled."""

    __test__ = False  # not a test class, whatever its name says


def time_limit(item: pytest.Item) -> float:
    """The item's pytest-timeout limit in seconds (0: none): its ``timeout`` mark, else the option's
    or the ini's."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and (marker.args or "timeout" in marker.kwargs):
        return float(marker.args[0] if marker.args else marker.kwargs["timeout"])
    option = item.config.getoption("timeout", None)
    if option is not None:
        return float(option)
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:  # no pytest-timeout: no limit
        return 0.0


def with_deadline(
    test: Callable[..., Awaitable[None]], seconds: float, limit: float, nodeid: str
) -> Callable[..., Any]:
    """``test`` cancelled after ``seconds``, failing with `TestTimedOut`."""

    @functools.wraps(test)
    async def run(**kwargs: Any) -> None:
        with trio.move_on_after(seconds) as scope:
            await test(**kwargs)
        if scope.cancelled_caught:
            raise TestTimedOut(
                f"{nodeid} was cancelled {seconds:.1f}s into its run, near its time limit of {limit:g}s "
                "(setup included): @pytest.mark.timeout(seconds) gives it more"
            )

    return run


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    item.stash[STARTED] = time.monotonic()
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Before pytest-trio wraps a trio test for ``trio.run`` (its own hook, inside this one), put its
    function under a deadline `MARGIN_S` before its time limit. (An async fixture would not do:
    pytest-trio runs only the fixtures a test names.)"""
    limit = time_limit(item)
    if (
        isinstance(item, pytest.Function)
        and item.get_closest_marker("trio") is not None
        and inspect.iscoroutinefunction(item.obj)
        and not hasattr(item.obj, "hypothesis")
        and limit > 0
    ):
        elapsed = time.monotonic() - item.stash.get(STARTED, time.monotonic())
        left = limit - min(MARGIN_S, limit / 2) - elapsed
        item.obj = with_deadline(item.obj, max(left, 0.0), limit, item.nodeid)
    yield


# -- child processes -------------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[int, str]]:
    """Every process's parent pid and state, from ``/proc`` (empty where there is none)."""
    table: dict[int, tuple[int, str]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return table
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def live_descendants() -> set[int]:
    """Processes below this one, still running (not zombies), except the PostgreSQL server's guard."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if table[pid][1] not in "ZX" and GUARD_MARK not in _cmdline(pid)}


@pytest.fixture(autouse=True)
def reap_children() -> Iterator[None]:
    """Kill the child processes a test leaves running, and fail it naming them."""
    before = live_descendants()
    yield
    left = live_descendants() - before
    if not left:
        return
    names = {pid: _cmdline(pid) for pid in left}
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail(
        "the test left child processes running (killed now): "
        + "; ".join(f"{pid} {cmd[:120]}" for pid, cmd in sorted(names.items())),
        pytrace=False,
    )
