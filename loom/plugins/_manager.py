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
        pm.register(plugin)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    return pm
