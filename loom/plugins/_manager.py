"""The pluggy plugin manager: project ``loom``, entry-point group ``loom``."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType

import pluggy

from . import hookspecs
from ._markers import PROJECT_NAME, hookimpl, hookspec

__all__ = ["ENTRY_POINT_GROUP", "PROJECT_NAME", "hookimpl", "hookspec", "make_plugin_manager"]

ENTRY_POINT_GROUP = "loom"

BUILTIN_PLUGINS: tuple[str, ...] = ("loom.plugins.handlers", "loom.plugins.schedule", "loom.plugins.shell")
"""Built-in plugins, registered exactly as third-party ones are."""


def _name_of(pm: pluggy.PluginManager, plugin: object) -> str | None:
    """The name a plugin object goes by in logs and `Runtime.plugin_names`: a module's own name, else its
    class's (``mypkg.plugin.Gate``), numbered when another plugin took it; ``None`` for one already registered
    (pluggy refuses it, as it would have)."""
    if pm.is_registered(plugin):
        return None
    own = getattr(plugin, "__name__", None)
    if isinstance(own, str):
        return own
    kind = type(plugin)
    name = f"{kind.__module__}.{kind.__qualname__}"
    number = 1
    while pm.has_plugin(name if number == 1 else f"{name}#{number}"):
        number += 1
    return name if number == 1 else f"{name}#{number}"


def make_plugin_manager(
    plugins: Iterable[object] = (), *, load_entry_points: bool = True
) -> pluggy.PluginManager:
    """A manager with every hookspec, the built-ins, ``plugins`` and (optionally) entry points."""
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_PLUGINS:
        module: ModuleType = importlib.import_module(name)
        pm.register(module, name=name)
    for plugin in plugins:
        pm.register(plugin, name=_name_of(pm, plugin))
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    return pm
