"""Plugins: hook specifications and the built-in plugins."""

from ._manager import PROJECT_NAME as PROJECT_NAME
from ._manager import hookimpl as hookimpl
from ._manager import hookspec as hookspec
from ._manager import make_plugin_manager as make_plugin_manager
