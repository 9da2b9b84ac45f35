"""The plugin manager: project ``loom``, every hookspec (docs/plugins.md), built-ins like third parties."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pluggy
import pytest

import loom
from loom.plugins import PROJECT_NAME, make_plugin_manager
from loom.plugins import hookspecs as specs
from loom.plugins._manager import BUILTIN_PLUGINS, ENTRY_POINT_GROUP

HOOKS = {
    "loom_route_handlers",
    "loom_executors",
    "loom_recurrence_policies",
    "loom_call_gates",
    "loom_start_gates",
    "loom_alias_filters",
    "loom_authorize_alias",
    "loom_work_kinds",
}


def test_every_design_hook_is_declared_and_no_other() -> None:
    declared = {name for name in dir(specs) if name.startswith("loom_")}
    assert declared == HOOKS
    assert (PROJECT_NAME, ENTRY_POINT_GROUP) == ("loom", "loom")


def test_builtins_register_like_third_party_plugins() -> None:
    pm = make_plugin_manager(load_entry_points=False)
    assert set(BUILTIN_PLUGINS) == {name for name, _ in pm.list_name_plugin()}
    handlers: dict[str, Any] = {}
    for result in pm.hook.loom_route_handlers():
        handlers.update(result)
    assert {"correlate", "explicit_work", "fresh", "schedule"} <= set(handlers)
    policies: dict[str, Any] = {}
    for result in pm.hook.loom_recurrence_policies():
        policies.update(result)
    assert set(policies) == {"cron", "calendar"}


class Gate:
    @loom.hookimpl
    def loom_start_gates(self) -> Mapping[str, Any]:
        return {"budget": lambda work: "over budget"}


def test_a_third_party_plugin_object_answers_hooks_keyword_only() -> None:
    pm = make_plugin_manager([Gate()], load_entry_points=False)
    [gates] = pm.hook.loom_start_gates()
    assert gates["budget"](None) == "over budget"
    with pytest.raises(TypeError):
        pm.hook.loom_authorize_alias("a", "b", None)  # hooks are called keyword-only


def test_plugin_objects_go_by_their_class_each_once() -> None:
    """What start-up logs as the plugins loaded (`Runtime.plugin_names`) names each object by its
    class, numbered when two share one; a module by its name. Catches pluggy's default for an object,
    its id (a bare number in the log), and two objects of one class refused as one name."""
    pm = make_plugin_manager([Gate(), Gate(), loom.App()], load_entry_points=False)
    names = {name for name, _ in pm.list_name_plugin()} - set(BUILTIN_PLUGINS)
    assert names == {f"{__name__}.Gate", f"{__name__}.Gate#2", "loom.plugins.app.App"}


class Misspelled:
    @loom.hookimpl
    def loom_route_handler(self) -> Mapping[str, Any]:  # not a hook: the real one is loom_route_handlers
        return {}


def test_an_implementation_of_an_unknown_hook_is_refused() -> None:
    with pytest.raises(pluggy.PluginValidationError, match="loom_route_handler"):
        make_plugin_manager([Misspelled()], load_entry_points=False)


async def test_named_arming_calls_check_their_kind() -> None:
    from loom.testing import T0_MS

    async with loom.open_runtime(
        ":memory:", clock=loom.ManualClock(start_ms=T0_MS), load_entry_points=False
    ) as rt:
        with pytest.raises(loom.InvalidRequest, match="interval_ms is required"):
            await rt.arm_recurring(
                loom.TimerSpec(id="t", fire_at_ms=T0_MS, source="s", type="x.y", scope="acme")
            )
        assert await rt.timers() == []
        timer = await rt.arm_recurrence(
            "cron",
            {"schedule_id": "hourly", "cron": "0 * * * *"},
            timer_id="hourly",
            fire_at_ms=T0_MS + 3_600_000,
            source="cron",
            type="job.due",
            scope="acme",
        )
        assert (timer.recurrence, timer.spec, timer.state) == (
            "cron",
            {"schedule_id": "hourly", "cron": "0 * * * *"},
            loom.TimerState.ARMED,
        )
