"""Validated configuration records (DESIGN section 6).

Limits are positive and bounded; anything else is refused with a `ConfigError` that
names the key and the reason.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._errors import ConfigError

MAX_CAUSAL_DEPTH = 1024
MAX_PER_MINUTE = 100_000


def _bounded(low: int, high: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(
                f"must be an integer from {low} to {high}, got {value!r}",
                key=f"{type(instance).__name__.lower()}.{attribute.name}",
            )

    return check


@attrs.frozen(kw_only=True)
class CausalLimits:
    """Causal bounds: maximum derived depth and new derived Events per root per UTC minute."""

    max_depth: int = attrs.field(default=32, validator=_bounded(1, MAX_CAUSAL_DEPTH))
    per_minute: int = attrs.field(default=128, validator=_bounded(1, MAX_PER_MINUTE))

    def stricter(self, other: CausalLimits) -> CausalLimits:
        return CausalLimits(
            max_depth=min(self.max_depth, other.max_depth),
            per_minute=min(self.per_minute, other.per_minute),
        )


@attrs.frozen(kw_only=True)
class Config:
    """The whole validated configuration; each accepted change is a new generation."""

    causal: CausalLimits = attrs.field(factory=CausalLimits)
    generation: int = 1
