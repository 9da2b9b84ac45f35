"""The configuration generation in force (DESIGN section 6)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from .config import Config


@attrs.define
class ConfigHolder:
    """The configuration generation in force, owned by one actor.

    ``replace`` validates a new config against the registered plugins and makes it the next generation;
    if it is refused, `ConfigError` is raised and the current generation stays in force.
    """

    _current: Config
    _executors: Mapping[str, Collection[str]] | None = attrs.field(default=None, kw_only=True)
    _handlers: Collection[str] | None = attrs.field(default=None, kw_only=True)
    _work_kinds: Collection[str] | None = attrs.field(default=None, kw_only=True)
    _triggers: Collection[str] | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        self._check(self._current)

    @property
    def current(self) -> Config:
        return self._current

    def replace(self, new: Config) -> Config:
        """Validate ``new`` and put it in force as the next generation; return it."""
        candidate = attrs.evolve(new, generation=self._current.generation + 1)
        self._check(candidate)
        self._current = candidate
        return candidate

    def _check(self, config: Config) -> None:
        config.validate(
            executors=self._executors,
            handlers=self._handlers,
            work_kinds=self._work_kinds,
            triggers=self._triggers,
        )
