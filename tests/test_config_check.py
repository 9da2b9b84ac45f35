"""No silent misconfiguration (docs/configuration.md, "Checking a configuration"): ``loom config check``
and ``loom serve`` at start report routes whose Work nothing can start, bindings, kinds and scopes
nothing uses, and schedules that never start anything; a Work nothing can start says why."""

from __future__ import annotations

import signal
import tomllib
from pathlib import Path

import pytest
import trio
from typer.testing import CliRunner

import loom
from loom.config.check import check_config
from loom.plugins.schedule import ScheduleSpec, schedule_timer
from loom.records.work import WorkState
from loom.service.cli import app
from loom.service.serve import serve
from loom.testing import T0_MS

MISCONFIGURED = """
[work_kinds.unused]
retry_attempts = 2

[scopes.shop.bindings.worker]
executor = "shell"
config = { command = ["true"] }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true

[scopes.empty]
capacity = 2

[[scopes.ops.routes]]
name = "nightly"
types = ["report.due"]
handler = "schedule"
binding = "report"

[scopes.ops.bindings.report]
executor = "shell"
config = { command = ["true"] }
"""


def test_a_configuration_reports_what_nothing_uses_or_nothing_can_start() -> None:
    """Catches each silent misconfiguration going unreported (and a clean one reported)."""
    findings = {str(f) for f in check_config(loom.Config.from_toml(MISCONFIGURED))}
    assert findings == {
        "scopes.shop.routes[0]: route 'orders' creates Work but names no binding: nothing starts that Work"
        " (its attempts run under the binding of the route that brought its input), so it stays ready with"
        " a start_failed diagnostic; name a binding, or claim it from a host",
        "scopes.shop.bindings.worker: binding 'worker' is named by no route in force in scope 'shop' or below"
        " it: nothing runs on it",
        "work_kinds.unused: work kind 'unused' is given by no route (work_kind = 'unused'): no Work has it",
        "scopes.empty: scope 'empty' has no route in force, here or below it: every Event sent to it is"
        " unmatched (it starts nothing)",
    }
    clean = loom.Config.load(Path(__file__).resolve().parent.parent / "examples" / "loom.toml")
    assert check_config(clean, standing_handlers={"schedule": "schedule"}) == []


IDLE_SETTINGS = """
[work_kinds.job]
standing = true
retry_attempts = 4
resume = true

[work_kinds.plain]
retry_attempts = 4

[work_kinds.quiet]
standing = true

[[scopes.ops.routes]]
name = "r"
types = ["job.*"]
create_work = true
binding = "b"
work_kind = "job"

[[scopes.ops.routes]]
name = "p"
types = ["p.*"]
create_work = true
binding = "b"
work_kind = "plain"

[[scopes.ops.routes]]
name = "q"
types = ["q.*"]
create_work = true
binding = "b"
work_kind = "quiet"

[scopes.ops.bindings.b]
executor = "shell"
config = { command = ["true"] }
"""


def test_work_kind_settings_that_change_nothing_are_reported() -> None:
    """A kind's ``resume`` (a binding's capability decides) and a standing kind's retry budget (it has
    none) do nothing. Catches either going unreported, and a retry budget reported on a kind that is
    not standing (where it applies)."""
    findings = [str(f) for f in check_config(loom.Config.from_toml(IDLE_SETTINGS))]
    assert [f.split(":")[0] for f in findings] == ["work_kinds.job.resume", "work_kinds.job"]
    assert "resume capability" in findings[0]
    assert "no retry budget" in findings[1]


async def test_schedules_that_never_start_anything_are_reported(tmp_path: Path) -> None:
    """Catches a schedule route nothing feeds, and an armed schedule whose Events no route takes."""
    config = loom.Config.from_toml(MISCONFIGURED)
    clock = loom.ManualClock(start_ms=T0_MS)
    async with loom.open_runtime(str(tmp_path / "x.db"), clock=clock, config=config, actors=()) as rt:
        before = {f.key for f in await rt.check()}
        assert "scopes.ops.routes[0]" in before  # the nightly route: no schedule feeds it
        nightly = ScheduleSpec(schedule_id="nightly", cron="0 2 * * *")
        await rt.arm(schedule_timer(nightly, now_ms=T0_MS, source="ops", type="report.due", scope="ops"))
        stray = ScheduleSpec(schedule_id="stray", cron="0 3 * * *")
        await rt.arm(schedule_timer(stray, now_ms=T0_MS, source="ops", type="report.lost", scope="ops"))
        after = {str(f) for f in await rt.check()}
        assert not any(f.startswith("scopes.ops.routes[0]") for f in after)
        assert (
            "timers.schedule:stray: schedule 'schedule:stray' fires 'report.lost' Events in scope 'ops', which"
            " matches no route there: its occurrences start nothing"
        ) in after
        assert not {f.key for f in await rt.check(schedules=False)} & {"timers.schedule:stray"}


async def test_a_work_nothing_can_start_carries_the_reason(tmp_path: Path) -> None:
    """Catches a Work left ready for ever with nothing saying why (a route with no binding)."""
    config = loom.Config.from_toml(MISCONFIGURED)
    async with loom.open_runtime(str(tmp_path / "x.db"), config=config, load_entry_points=False) as rt:
        event = await rt.publish(loom.EventIn(source="s", delivery_id="1", type="order.placed", scope="shop",
                                              key="order/1"))  # fmt: skip
        checkpoint = await rt.wait_routed(event.id, timeout=30)
        assert checkpoint is not None
        assert checkpoint.work_id is not None
        await rt.wait_idle()
        work = await rt.work(checkpoint.work_id)
        assert work.state is WorkState.READY
        assert work.blocked is not None
        assert "no route that brought its input names a binding" in work.blocked
        (diagnostic,) = await rt.latest_diagnostics(work.id)
        assert diagnostic.kind == "start_failed"


def test_loom_config_check_reports_and_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a check that exits 0 on a misconfiguration, or one that cannot find ./loom.toml."""
    (tmp_path / "loom.toml").write_text(MISCONFIGURED)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOOM_CONFIG", raising=False)
    result = CliRunner().invoke(app, ["config", "check"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert (
        lines[0] == f"checking configuration {tmp_path / 'loom.toml'} (./loom.toml in the working directory)"
    )
    assert sum(line.startswith("warning: ") for line in lines) == 4  # schedules need the store (--db)
    assert lines[-1] == "4 things to look at"
    store = loom.SQLiteStore(path=str(tmp_path / "x.db"))
    store.close_writer(store.open_writer())  # a loom database: a path that is none is refused
    with_store = CliRunner().invoke(app, ["config", "check", "--db", str(tmp_path / "x.db")])
    assert "warning: scopes.ops.routes[0]: route 'nightly' runs schedules" in with_store.stdout


PYTHON_BINDINGS = """
[scopes.app.bindings.typo]
executor = "python"
config = { function = "okk" }

[scopes.app.bindings.unnamed]
executor = "python"
config = { fn = "ok" }

[scopes.app.bindings.right]
executor = "python"
config = { function = "ok" }

[[scopes.app.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
binding = "typo"

[[scopes.app.routes]]
name = "others"
types = ["other.*"]
create_work = true
binding = "unnamed"

[[scopes.app.routes]]
name = "rights"
types = ["right.*"]
create_work = true
binding = "right"
"""


async def test_a_python_binding_naming_no_registered_function_is_reported() -> None:
    """Catches a check that passes a binding every attempt of which fails ("no function registered"):
    a misspelt function, and a config without one; a registered function is not reported."""
    app = loom.App()

    @app.function("ok")
    async def ok(request: loom.RunRequest, toolbelt: loom.Toolbelt) -> str:
        return "ok"

    config = loom.Config.from_dict(tomllib.loads(PYTHON_BINDINGS))
    async with loom.open_runtime(":memory:", config=config, plugins=[app], actors=()) as rt:
        found = {f.key: f.message for f in await rt.check()}
    assert set(found) == {"scopes.app.bindings.typo.config", "scopes.app.bindings.unnamed.config"}
    assert found["scopes.app.bindings.typo.config"] == (
        "function: no function is registered as 'okk' (registered: 'ok'): every attempt fails"
    )
    assert found["scopes.app.bindings.unnamed.config"].startswith("function: names no function")


def test_loom_config_check_refuses_a_configuration_that_cannot_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[scopes.shop.bindings.py]\nexecutor = "python"\n')
    result = CliRunner().invoke(app, ["config", "check", "--config", str(bad)], catch_exceptions=False)
    assert result.exit_code == 1
    assert "unknown executor 'python'" in result.stderr
    assert "loom serve --app module:app" in result.stderr


async def test_serve_logs_what_the_configuration_gets_wrong_at_start(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Catches a server that starts on a misconfiguration without a word."""
    config = tmp_path / "loom.toml"
    config.write_text(MISCONFIGURED)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: serve(tmp_path / "x.db", config, "127.0.0.1:0",
                                                      log_level="warning", task_status=task_status))  # fmt: skip
        signal.raise_signal(signal.SIGTERM)
    warned = [line for line in capfd.readouterr().err.splitlines() if "configuration: " in line]
    assert any("route 'orders' creates Work but names no binding" in line for line in warned), warned
    assert any("route 'nightly' runs schedules, but no armed schedule" in line for line in warned), warned
