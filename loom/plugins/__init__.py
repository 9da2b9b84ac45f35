"""Plugins: hook specifications and the built-in plugins (DESIGN section 5)."""

from ._manager import PROJECT_NAME as PROJECT_NAME
from ._manager import hookimpl as hookimpl
from ._manager import hookspec as hookspec
from ._manager import make_plugin_manager as make_plugin_manager
