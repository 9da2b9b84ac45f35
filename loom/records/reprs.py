"""Reprs that show each instant (a field ending in ``at_ms``) as ISO 8601 UTC beside its milliseconds,
so a record printed in a log, a test failure or a REPL reads as a time: ``created_at_ms=1767258000000
(2026-01-01T09:00:00Z)``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import attrs

C = TypeVar("C", bound=type)

MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc_moment(ms: int) -> datetime | None:
    """Unix milliseconds as an aware UTC `datetime`, exactly: integer arithmetic, never a float
    (``ms / 1000`` rounds 253402300799999 to ``.998``). ``None``: a `datetime` cannot hold it (before
    year 1 or after year 9999)."""
    try:
        return _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return None


def iso_utc(ms: int, *, whole_seconds: bool = False) -> str | None:
    """Unix milliseconds as ISO 8601 UTC with milliseconds (``2026-01-01T09:00:00.000Z``; without them
    for a whole second when ``whole_seconds``); ``None`` when no date can show it (`utc_moment`)."""
    moment = utc_moment(ms)
    if moment is None:
        return None
    spec = "seconds" if whole_seconds and ms % 1000 == 0 else "milliseconds"
    return moment.isoformat(timespec=spec).replace("+00:00", "Z")


def instant(ms: object) -> str:
    """``repr(ms)``, and the ISO 8601 UTC time it is when it is one."""
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 <= ms <= MAX_MS:
        return repr(ms)
    return f"{ms} ({iso_utc(ms, whole_seconds=True)})"


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
