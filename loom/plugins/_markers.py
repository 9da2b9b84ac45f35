"""The pluggy markers of project ``loom``: hook specifications (`hookspec`) and implementations (`hookimpl`)."""

from __future__ import annotations

import pluggy

PROJECT_NAME = "loom"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
