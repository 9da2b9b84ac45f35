"""`loom.App` (docs/plugins.md, "Serving your Python code"): functions and executors registered with
decorators run embedded (``plugins=[app]``) and served (``loom serve --app module:object``, or the
configuration's ``app``); a bad app or configuration is refused in one line naming what is wrong; the
configuration is found as documented (``--config``, ``LOOM_CONFIG``, ``./loom.toml``)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from service_kit import start_server

import loom
from loom import EventIn, InvalidRequest, ManualClock, open_runtime
from loom.records.work import WorkState
from loom.service._apps import find_config, load_app
from loom.testing import T0_MS

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "service_app"
CONFIG = loom.Config.from_toml("""
[work_kinds.once]
retry_attempts = 1
fail_on_exhaustion = true

[scopes.shop.bindings.run]
executor = "python"
config = { function = "run" }

[[scopes.shop.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
work_kind = "once"
binding = "run"
""")
_names = itertools.count()


def job(n: int, **payload: Any) -> EventIn:
    return EventIn(
        source="t", delivery_id=f"j-{n}", type="job.run", scope="shop", key=f"job/{n}", payload=payload
    )


async def run_one(app: loom.App, **payload: Any) -> loom.WorkResult:
    async with open_runtime(
        ":memory:", clock=ManualClock(start_ms=T0_MS), config=CONFIG, plugins=[app], load_entry_points=False
    ) as rt:
        accepted = await rt.publish(job(1, **payload))
        checkpoint = await rt.wait_routed(accepted.id, timeout=30)
        assert checkpoint is not None
        assert checkpoint.work_id is not None
        return await rt.wait_for(checkpoint.work_id, timeout=30)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return request.trigger.payload['x'] * 2", (WorkState.COMPLETED, 42, None)),
        ("return loom.Completed(value=[1, 2])", (WorkState.COMPLETED, [1, 2], None)),
        ("return loom.Failed(error='no')", (WorkState.FAILED, None, "no")),
        ("raise ValueError('bad input')", (WorkState.FAILED, None, "ValueError: bad input")),
        ("return {1, 2}", (WorkState.FAILED, None, "not JSON data")),
    ],
)
@pytest.mark.parametrize("asynchronous", [True, False])
async def test_a_function_answers_a_value_or_an_outcome_and_an_exception_fails_the_attempt(
    body: str, expected: tuple[WorkState, Any, str | None], asynchronous: bool
) -> None:
    """Catches a function whose return value is lost (or taken for an outcome it is not), a plain
    function that is not run, and an exception that escapes instead of failing the attempt."""
    app = loom.App()
    namespace: dict[str, Any] = {"loom": loom}
    exec(f"{'async ' if asynchronous else ''}def run(request, toolbelt):\n    {body}\n", namespace)
    app.function("run")(namespace["run"])
    result = await run_one(app, x=21)
    state, value, error = expected
    assert (result.state, result.value) == (state, value)
    if error is None:
        assert result.error is None
    else:
        assert error in (result.error or "")


@pytest.mark.parametrize(
    "call",
    ["toolbelt.emit(event)", "trio.from_thread.run(toolbelt.emit, event)"],
    ids=["direct", "from_thread"],
)
async def test_a_plain_function_calls_the_toolbelt_from_its_thread(call: str) -> None:
    """A plain ``def`` runs in a worker thread, where the toolbelt's methods are async. Catches a
    ``toolbelt.emit(event)`` there that makes a coroutine nothing runs (seen: the attempt completed
    and emitted nothing, a RuntimeWarning in the log), and a wrapper that breaks the documented
    ``trio.from_thread.run(toolbelt.emit, event)``."""
    app = loom.App()
    namespace: dict[str, Any] = {"loom": loom, "trio": trio}
    body = (
        "    event = loom.EventIn(source='fn', delivery_id=request.execution_id, type='note.made',"
        " scope='shop')\n"
        f"    emitted = {call}\n"
        "    return emitted.delivery_id\n"
    )
    exec(f"def run(request, toolbelt):\n{body}", namespace)
    app.function("run")(namespace["run"])
    async with open_runtime(
        ":memory:", clock=ManualClock(start_ms=T0_MS), config=CONFIG, plugins=[app], load_entry_points=False
    ) as rt:
        accepted = await rt.publish(job(1))
        checkpoint = await rt.wait_routed(accepted.id, timeout=30)
        assert checkpoint is not None
        assert checkpoint.work_id is not None
        result = await rt.wait_for(checkpoint.work_id, timeout=30)
        assert result.state is WorkState.COMPLETED, result.error
        assert [e.delivery_id for e in await rt.events() if e.source == "fn"] == [result.value]


async def test_a_plain_function_whose_attempt_was_cancelled_is_told_its_calls_are_stale() -> None:
    """docs/plugins.md: after the lease is lost every toolbelt call raises `StaleAuthority`. Catches the
    call from a worker thread that raised ``trio.Cancelled`` instead (the call ran in the attempt's
    task, whose observation the cancel stopped): a BaseException no ``except Exception`` of the
    function catches, nor ``except StaleAuthority``."""
    app = loom.App()
    started, go, called = threading.Event(), threading.Event(), threading.Event()
    seen: list[str] = []

    @app.function("run")
    def run(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> str:
        started.set()
        assert go.wait(30)
        try:
            toolbelt.emit(EventIn(source="fn", delivery_id="late", type="note.made", scope="shop"))
            seen.append("emitted")
        except loom.StaleAuthority as exc:
            seen.append(f"stale: {exc}")
        except BaseException as exc:  # (what the function met instead)
            seen.append(f"raised {exc!r}")
        called.set()
        return "late"

    async with open_runtime(
        ":memory:", clock=ManualClock(start_ms=T0_MS), config=CONFIG, plugins=[app], load_entry_points=False
    ) as rt:
        accepted = await rt.publish(job(1))
        checkpoint = await rt.wait_routed(accepted.id, timeout=30)
        assert checkpoint is not None
        assert checkpoint.work_id is not None
        assert await trio.to_thread.run_sync(started.wait, 30)
        assert (await rt.cancel(checkpoint.work_id)).state is WorkState.CANCELLED
        go.set()
        assert await trio.to_thread.run_sync(called.wait, 30)
        assert len(seen) == 1, seen
        assert seen[0].startswith("stale: toolbelt.emit: this attempt was stopped"), seen
        assert [e for e in await rt.events() if e.source == "fn"] == []


def test_app_registration_refuses_what_it_cannot_run() -> None:
    """Catches an app that accepts an executor loom could not call, or a nameless function."""
    app = loom.App()
    with pytest.raises(InvalidRequest, match="name must be a non-empty string"):
        app.function("")
    with pytest.raises(InvalidRequest, match="has no launch, inject, interrupt, capabilities"):
        app.executor("mine")(object())
    with pytest.raises(InvalidRequest, match=r"config must be a loom\.Config"):
        loom.App(config="loom.toml")  # type: ignore[arg-type]
    assert app.loom_executors() == {}  # no function, no python executor: a binding to it is refused


def test_a_second_registration_under_one_name_is_refused() -> None:
    """Catches a second ``@app.function("dup")`` (or executor, handler, gate) that replaces the first in
    silence (seen: the first never ran, and nothing said so)."""
    app = loom.App()

    @app.function("dup")
    async def first(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> str:
        return "first"

    with pytest.raises(InvalidRequest, match=r"App\.function\('dup'\): something is registered under 'dup'"):
        app.function("dup")(first)
    app.route_handler("h")(lambda event, scope, work, route: None)
    with pytest.raises(InvalidRequest, match=r"App\.route_handler\('h'\)"):
        app.route_handler("h")(lambda event, scope, work, route: None)
    assert app.functions == ("dup",)


def _module(tmp_path: Path, text: str) -> str:
    name = f"loom_test_app_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(text)
    return name


@pytest.mark.parametrize(
    ("text", "attribute", "message"),
    [
        (None, "app", "no module named"),
        ("x = 1\n", "app", "has no 'app'"),
        ("app = 5\n", "app", "app is a int, not a loom.App"),
        ("import nothing_such_here\n", "app", "ModuleNotFoundError: No module named 'nothing_such_here' [(]"),
        ("raise RuntimeError('config missing')\n", "app", "RuntimeError: config missing [(]"),
        ("def broken(:\n", "app", "SyntaxError"),
        ("import sys\nsys.exit(3)\n", "app", r"importing 'loom_test_app_\d+' called sys.exit\(3\)"),
    ],
)
def test_a_bad_app_is_refused_in_one_line_naming_what_is_wrong(
    tmp_path: Path, text: str | None, attribute: str, message: str
) -> None:
    """Catches an import failure shown as a traceback, or an app that is not an App used anyway."""
    name = _module(tmp_path, text) if text is not None else "loom_test_absent_module"
    with pytest.raises(InvalidRequest, match=message) as refused:
        load_app(f"{name}:{attribute}", search=[tmp_path])
    assert "\n" not in str(refused.value)
    assert str(refused.value).startswith(f"--app {name}:{attribute}: ")
    with pytest.raises(InvalidRequest, match="must be module:object"):
        load_app("tasks.app", search=[tmp_path])


def test_an_app_is_imported_from_the_given_directory(tmp_path: Path) -> None:
    name = _module(tmp_path, "import loom\nholder = type('H', (), {'app': loom.App()})\n")
    assert isinstance(load_app(f"{name}:holder.app", search=[tmp_path]), loom.App)


def test_the_configuration_is_found_in_the_documented_order(tmp_path: Path) -> None:
    """Catches a ./loom.toml that is not found, and an order other than --config, LOOM_CONFIG, ./loom.toml."""
    given, named, local = tmp_path / "given.toml", tmp_path / "named.toml", tmp_path / "loom.toml"
    for path in (given, named, local):
        path.write_text("")
    env = {"LOOM_CONFIG": str(named)}
    assert find_config(given, env=env, cwd=tmp_path).path == given
    assert find_config(None, env=env, cwd=tmp_path).path == named
    assert find_config(None, env={}, cwd=tmp_path).path == local
    local.unlink()
    assert find_config(None, env={}, cwd=tmp_path).path is None
    with pytest.raises(InvalidRequest, match="no such configuration file"):
        find_config(None, env={"LOOM_CONFIG": str(local)}, cwd=tmp_path)
    with pytest.raises(InvalidRequest, match="a directory, not a configuration file"):
        find_config(None, env={"LOOM_CONFIG": str(tmp_path)}, cwd=tmp_path)


def loom_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loom", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


async def test_the_example_app_is_served_from_its_directory_and_answers_its_results(tmp_path: Path) -> None:
    """Catches a serve that cannot run Python functions, a ./loom.toml (and the app it names) that is not
    found, a result that does not reach the command line, and a failure that stays silent."""
    env = {"PYTHONDONTWRITEBYTECODE": "1", "LOOM_CONFIG": ""}
    server = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path / "shop.db", env=env, extra=["--log-level", "info"], cwd=EXAMPLE)
    )
    try:
        url = ["--url", server.url]
        sent = await trio.to_thread.run_sync(lambda: loom_cli(
            "send", "order.placed", "--scope", "shop", "--key", "order/1",
            "--payload", '{"items": [{"sku": "A", "qty": 2, "price": 5}]}', *url, cwd=tmp_path))  # fmt: skip
        assert sent.returncode == 0, sent.stderr
        assert "routed by route 'orders' (scope shop) to work wk_" in sent.stdout
        work = sent.stdout.split("to work ")[1].split()[0]
        waited = await trio.to_thread.run_sync(lambda: loom_cli("work", "wait", work, *url, cwd=tmp_path))
        assert waited.returncode == 0, waited.stderr
        assert waited.stdout.strip() == f'work {work} completed: {{"items": 1, "total": 10}}'

        bad = await trio.to_thread.run_sync(lambda: loom_cli(
            "send", "order.placed", "--scope", "shop", "--key", "order/2", "--payload", "{}", *url,
            cwd=tmp_path))  # fmt: skip
        failing = bad.stdout.split("to work ")[1].split()[0]
        unsettled = await trio.to_thread.run_sync(
            lambda: loom_cli("work", "wait", failing, "--timeout", "1", *url, cwd=tmp_path)
        )
        assert unsettled.returncode == 2, unsettled.stdout + unsettled.stderr
        assert "ValueError: order order/2 has no items" in unsettled.stdout
        shown = await trio.to_thread.run_sync(lambda: loom_cli("work", "get", failing, *url, cwd=tmp_path))
        assert "backoff: the next attempt at" in shown.stdout
        assert "attempt_failed: attempt 1" in shown.stdout
    finally:
        assert server.stop() == 0
    log = server.log.read_text()
    assert f"config: configuration {EXAMPLE / 'loom.toml'} (./loom.toml in the working directory)" in log
    assert "app: App(functions=['price', 'receipt'])" in log
    assert f"work {failing}: attempt 1 (" in log
    assert "failed: executor 'python' raised ValueError: order order/2 has no items" in log
    assert not (EXAMPLE / "__pycache__").exists()
    assert (tmp_path / "shop.db").stat().st_size > 0  # after the server stopped


def test_the_example_app_runs_embedded(tmp_path: Path) -> None:
    """Catches an app that works served but not embedded: the same object is a plugin of open_runtime."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "embedded.py")],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "order/1: completed with {'items': 1, 'total': 10}" in done.stdout
    assert "completed, 'receipt for order/1: 10'" in done.stdout
