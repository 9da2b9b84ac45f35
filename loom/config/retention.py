"""Retention: how long what has ended is kept, per scope with inheritance; and how compaction runs.

``[retention]`` holds the global settings, ``[scopes.<scope>.retention]`` a scope's own. Each setting
is inherited on its own, like a scope's capacity: a Work, Event or timer follows the nearest scope,
itself or an ancestor, that declares the setting, else ``[retention]``, else the default (a week).
Diagnostics and the dedup window are not tied to a scope, so only ``[retention]`` declares them.
Durations are written ``"7d"``, ``"12h"``, ``"90m"``, ``"30s"``, ``"250ms"`` (or combined, ``"1d12h"``),
an integer of milliseconds, or ``"forever"`` (docs/operations.md, "Retention").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from ..records.errors import ConfigError
from ..records.validation import validate_scope

FOREVER = -1
"""A retention that never ends (Kafka's ``retention.ms = -1``): nothing of the kind is removed."""
SECOND_MS = 1000
DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
MAX_RETENTION_MS = 100 * 366 * DAY_MS
MAX_BATCH = 10_000

SCOPED = ("works", "events", "timers", "attempt_logs")
"""The settings a scope may declare (what a Work, Event or timer of the scope follows)."""
GLOBAL = ("diagnostics", "dedup")
"""The settings only ``[retention]`` declares."""
SETTINGS = SCOPED + GLOBAL

_UNITS = {"w": WEEK_MS, "d": DAY_MS, "h": 3_600_000, "m": 60_000, "s": SECOND_MS, "ms": 1}
_PART = re.compile(r"(\d+)(ms|w|d|h|m|s)")
_WHOLE = re.compile(r"(?:\d+(?:ms|w|d|h|m|s))+")


def parse_duration(value: object, key: str, *, maximum: int = MAX_RETENTION_MS, forever: bool = True) -> int:
    """A duration in ms (``FOREVER`` for ``"forever"``), or `ConfigError` at ``key`` saying what is expected."""
    expected = "a duration such as '7d', '12h', '30m' or '250ms'" + (", or 'forever'" if forever else "")
    if isinstance(value, str):
        text = value.strip().lower()
        if forever and text == "forever":
            return FOREVER
        if _WHOLE.fullmatch(text):
            ms = sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(text))
            if ms <= maximum:
                return ms
            raise ConfigError(f"must be at most {format_duration(maximum)}, got {value!r}", key=key)
        raise ConfigError(f"must be {expected}, got {value!r}", key=key)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == FOREVER and forever:
            return FOREVER
        if 0 <= value <= maximum:
            return value
        raise ConfigError(f"must be {expected} (or milliseconds from 0 to {maximum}), got {value!r}", key=key)
    raise ConfigError(f"must be {expected}, got {type(value).__name__} {value!r}", key=key)


def format_duration(ms: int) -> str:
    """The shortest text `parse_duration` reads back as ``ms``."""
    if ms == FOREVER:
        return "forever"
    if ms == 0:
        return "0s"
    parts = []
    for unit in ("w", "d", "h", "m", "s", "ms"):
        size = _UNITS[unit]
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts)


def _duration(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None:
        key = f"retention.{attribute.name.removesuffix('_ms')}"
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"must be milliseconds (an integer) or FOREVER, got {value!r}", key=key)
        parse_duration(value, key)


@attrs.frozen(kw_only=True)
class Retention:
    """How long each kind of history is kept after it ends, in ms (`FOREVER`: always); ``None``: not
    declared here (a scope inherits it, the global table takes the default).

    * ``works``: a finished Work with its attempts, history, inputs, waits and results, after it ended;
      and a Work's ended attempts (but its latest), after they ended;
    * ``events``: a routed Event with its payload and routing checkpoint, after it was routed;
    * ``timers``: a fired, cancelled, disabled or invalid timer with its firing ledger, after it ended;
      and the ledger entries of a recurring timer, after each firing;
    * ``attempt_logs``: what an executor keeps of an ended attempt (the shell executor's directory:
      its logs and files), after the attempt ended;
    * ``diagnostics``: a diagnostic, after it was recorded (global only);
    * ``dedup``: how long a removed Event's tombstone (and a removed Work's or timer's) answers for its
      identity, counted from its acceptance (global only; the default is forever).
    """

    works_ms: int | None = attrs.field(default=None, validator=_duration)
    events_ms: int | None = attrs.field(default=None, validator=_duration)
    timers_ms: int | None = attrs.field(default=None, validator=_duration)
    attempt_logs_ms: int | None = attrs.field(default=None, validator=_duration)
    diagnostics_ms: int | None = attrs.field(default=None, validator=_duration)
    dedup_ms: int | None = attrs.field(default=None, validator=_duration)

    def declared(self) -> dict[str, int]:
        """The settings declared here, by their TOML name."""
        return {name: value for name in SETTINGS if (value := getattr(self, f"{name}_ms")) is not None}

    def to_toml(self) -> dict[str, str]:
        return {name: format_duration(ms) for name, ms in self.declared().items()}


DEFAULTS = Retention(
    works_ms=WEEK_MS,
    events_ms=WEEK_MS,
    timers_ms=WEEK_MS,
    attempt_logs_ms=WEEK_MS,
    diagnostics_ms=WEEK_MS,
    dedup_ms=FOREVER,
)
"""Everything that ended is kept a week; a removed Event's identity answers for it forever."""


def check_scope_retention(retention: Retention) -> None:
    """A scope declares only the settings tied to a scope."""
    for name in GLOBAL:
        if getattr(retention, f"{name}_ms") is not None:
            raise ConfigError(
                "is not tied to a scope: declare it under [retention] (it applies to every scope)",
                key=f"retention.{name}",
            )


@attrs.frozen(kw_only=True)
class Compaction:
    """How the compactor runs: a sweep every ``every_ms`` of the clock, in pages of ``batch`` rows per
    table, one short transaction per page."""

    every_ms: int = attrs.field(default=60_000)
    batch: int = attrs.field(default=100)

    def __attrs_post_init__(self) -> None:
        every = parse_duration(self.every_ms, "compaction.every", forever=False)
        if every < SECOND_MS:
            raise ConfigError(f"must be at least 1s, got {format_duration(every)}", key="compaction.every")
        if (
            isinstance(self.batch, bool)
            or not isinstance(self.batch, int)
            or not 1 <= self.batch <= MAX_BATCH
        ):
            raise ConfigError(
                f"must be an integer from 1 to {MAX_BATCH}, got {self.batch!r}", key="compaction.batch"
            )

    def to_toml(self) -> dict[str, Any]:
        return {"every": format_duration(self.every_ms), "batch": self.batch}


@attrs.frozen(kw_only=True)
class ScopeRetention:
    """The retention in force for one scope (each in ms, or `FOREVER`), and where each came from."""

    works_ms: int
    events_ms: int
    timers_ms: int
    attempt_logs_ms: int


def retention_for(scopes: Mapping[str, Any], default: Retention, scope: str) -> ScopeRetention:
    """The retention in force in ``scope``: per setting, the nearest scope (itself or an ancestor) that
    declares it, else ``default`` (the global table), else `DEFAULTS`."""
    parts = validate_scope(scope, field="scope").split("/")
    ancestry = ["/".join(parts[:i]) for i in range(len(parts), 0, -1)]  # nearest first
    chain = [scopes[s].retention for s in ancestry if s in scopes]
    resolved: dict[str, int] = {}
    for name in SCOPED:
        field = f"{name}_ms"
        found = next(
            (getattr(r, field) for r in chain if r is not None and getattr(r, field) is not None), None
        )
        if found is None:
            found = getattr(default, field)
        if found is None:
            found = getattr(DEFAULTS, field)
        resolved[field] = found
    return ScopeRetention(**resolved)


def global_setting(default: Retention, name: str) -> int:
    """A global setting (``diagnostics`` or ``dedup``) in force."""
    value = getattr(default, f"{name}_ms")
    return int(getattr(DEFAULTS, f"{name}_ms") if value is None else value)
