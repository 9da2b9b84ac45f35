"""The configuration generation in force."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from ._keys import key_path, rekey
from .config import Config
from .model import WorkKindPolicy


@runtime_checkable
class ValidatesBindings(Protocol):
    """Executors by name that can also check a binding's config as it is loaded (the runtime's
    `loom.plugins.registry.LiveCapabilities`): `ConfigError` keyed within the config if it is refused."""

    def validate_binding(self, executor: str, config: Mapping[str, Any]) -> None: ...


@attrs.define
class ConfigHolder:
    """The configuration generation in force, owned by one actor.

    ``replace`` validates a new config against the registered plugins and makes it the next generation;
    if it is refused, `ConfigError` is raised and the current generation stays in force.

    ``kinds`` are the Work kinds plugins define (the schedule plugin's standing ``schedule`` kind): each
    generation in force holds them beside its own ``[work_kinds]``, a declared kind of the same name
    winning. ``standing_handlers`` maps a route handler to the standing kind its Work needs (see
    `Config.validate`). When the executors can check a binding's config (`ValidatesBindings`), each
    binding's config is checked by its executor as well, and refused naming its key
    (``scopes.ops.bindings.build.config.command``).
    """

    _current: Config
    _executors: Mapping[str, Collection[str]] | None = attrs.field(default=None, kw_only=True)
    _handlers: Collection[str] | None = attrs.field(default=None, kw_only=True)
    _work_kinds: Collection[str] | None = attrs.field(default=None, kw_only=True)
    _triggers: Collection[str] | None = attrs.field(default=None, kw_only=True)
    _kinds: Mapping[str, WorkKindPolicy] = attrs.field(factory=dict, kw_only=True)
    _standing_handlers: Mapping[str, str] = attrs.field(factory=dict, kw_only=True)

    def __attrs_post_init__(self) -> None:
        self._current = self._with_plugin_kinds(self._current)
        self._check(self._current)

    @property
    def current(self) -> Config:
        return self._current

    def replace(self, new: Config) -> Config:
        """Validate ``new`` and put it in force as the next generation; return it."""
        candidate = self._with_plugin_kinds(attrs.evolve(new, generation=self._current.generation + 1))
        self._check(candidate)
        self._current = candidate
        return candidate

    def _check(self, config: Config) -> None:
        config.validate(
            executors=self._executors,
            handlers=self._handlers,
            work_kinds=self._work_kinds,
            triggers=self._triggers,
            standing_handlers=self._standing_handlers,
        )
        executors: object = self._executors
        if isinstance(executors, ValidatesBindings):
            for scope_name, scope in config.scopes.items():
                for name, binding in scope.bindings.items():
                    where = key_path(key_path("scopes", scope_name), "bindings", name, "config")
                    with rekey(config.file, where):
                        executors.validate_binding(binding.executor, binding.config)

    def _with_plugin_kinds(self, config: Config) -> Config:
        missing = {name: kind for name, kind in self._kinds.items() if name not in config.work_kinds}
        if not missing:
            return config
        return attrs.evolve(config, work_kinds={**missing, **config.work_kinds})
