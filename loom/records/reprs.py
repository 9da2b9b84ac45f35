"""Reprs that show each instant (a field ending in ``at_ms``) as ISO 8601 UTC beside its milliseconds,
so a record printed in a log, a test failure or a REPL reads as a time: ``created_at_ms=1767258000000
(2026-01-01T09:00:00Z)``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

import attrs

C = TypeVar("C", bound=type)

MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def instant(ms: object) -> str:
    """``repr(ms)``, and the ISO 8601 UTC time it is when it is one."""
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms <= MAX_MS:
        return repr(ms)
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    text = moment.isoformat(timespec="milliseconds" if ms % 1000 else "seconds").replace("+00:00", "Z")
    return f"{ms} ({text})"


def with_instants(cls: C) -> C:
    """Give an attrs record a repr that shows its instants as `instant` does."""
    names = [field.name for field in attrs.fields(cls) if field.repr]

    def __repr__(self: Any) -> str:
        parts = [
            f"{name}={instant(getattr(self, name)) if name.endswith('at_ms') else repr(getattr(self, name))}"
            for name in names
        ]
        return f"{type(self).__name__}({', '.join(parts)})"

    cls.__repr__ = __repr__  # type: ignore[method-assign,assignment]
    return cls
