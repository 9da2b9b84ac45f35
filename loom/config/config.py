"""`Config`: the whole validated configuration; each accepted change is a new generation.

It holds scopes, ordered routes with inheritance,
bindings, policies and their fallbacks, Work kinds and retry budgets. Anything refused raises `ConfigError`
naming the file, the key and the reason, and the previous generation stays in force (`ConfigHolder`).
"""

from __future__ import annotations

import os
import tomllib
import weakref
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import attrs

from ..records.errors import ConfigError, InvalidRequest
from ..records.serde import converter
from ..records.validation import MAX_INT, describe_value, validate_scope
from ._keys import check_name, key_path, known, plain, rekey
from .model import (
    DEFAULT_TRIGGER,
    Budget,
    CausalLimits,
    EffectiveBinding,
    EffectiveRoute,
    ScopeConfig,
    StoreConfig,
    WorkKindPolicy,
)
from .reader import Where, structure_config_fields
from .resolve import resolve_bindings, resolve_routes
from .retention import Compaction, Retention, ScopeRetention, retention_for


@attrs.frozen(kw_only=True)
class Config:
    """The whole validated configuration; each accepted change is a new generation.

    ``scopes`` maps scope paths to what each declares (a parent of a declared scope need not be declared).
    ``file`` names the source in error messages; it is not part of the configuration's value.
    """

    app: str | None = None
    """``module:object``: the `loom.App` that ``loom serve`` loads (its ``--app`` wins); the runtime itself
    does not read it."""
    causal: CausalLimits = attrs.field(factory=CausalLimits)
    store: StoreConfig = attrs.field(factory=StoreConfig)
    scopes: dict[str, ScopeConfig] = attrs.field(factory=dict, hash=False)
    work_kinds: dict[str, WorkKindPolicy] = attrs.field(factory=dict, hash=False)
    budgets: tuple[Budget, ...] = ()
    retention: Retention = attrs.field(factory=Retention)
    """The global retention (``[retention]``); a scope may declare its own (`retention_in`)."""
    compaction: Compaction = attrs.field(factory=Compaction)
    generation: int = 1
    file: str | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if (
            isinstance(self.generation, bool)
            or not isinstance(self.generation, int)
            or not 1 <= self.generation <= MAX_INT
        ):
            raise ConfigError(
                f"must be an integer from 1 to {MAX_INT}, got {describe_value(self.generation)}",
                file=self.file,
                key="generation",
            )
        for name in self.scopes:
            try:
                validate_scope(name, field="a scope")
            except InvalidRequest as exc:
                raise ConfigError(str(exc), file=self.file, key=key_path("scopes", name)) from None
        for name in self.work_kinds:
            with rekey(self.file, "work_kinds"):
                check_name(name, key_path("", name))
        for scope in self.scopes:
            resolve_routes(self.scopes, scope, None, file=self.file)
        if not isinstance(self.retention, Retention):
            raise ConfigError(
                f"must be a Retention, got {type(self.retention).__name__}", file=self.file, key="retention"
            )
        if not isinstance(self.compaction, Compaction):
            raise ConfigError(
                f"must be a Compaction, got {type(self.compaction).__name__}",
                file=self.file,
                key="compaction",
            )
        names: set[str] = set()
        for i, budget in enumerate(self.budgets):
            if budget.name in names:
                raise ConfigError(
                    f"budget {budget.name!r} is declared twice", file=self.file, key=f"budgets[{i}].name"
                )
            names.add(budget.name)

    # -- loading --------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, *, generation: int = 1) -> Config:
        """Read and validate a TOML file; a ``path`` that is not one (not a str or a `Path`, a NUL
        character, a name the file system cannot encode) is refused as a file that cannot be read is
        (`ConfigError`)."""
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
        if not isinstance(name, str):
            raise ConfigError(
                f"expected the path of a TOML file (a str or a Path), got {describe_value(name)}"
            )
        if "\0" in name:
            raise ConfigError("cannot read the file: its path holds a NUL character", file=repr(name))
        try:
            text = Path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the file: {exc}", file=name) from None
        except UnicodeEncodeError as exc:
            reason = f"its path is not a file name this system can write ({exc.reason})"
            raise ConfigError(f"cannot read the file: {reason}", file=repr(name)) from None
        return cls.from_toml(text, file=str(path), generation=generation)

    @classmethod
    def from_toml(cls, text: str, *, file: str = "<string>", generation: int = 1) -> Config:
        """Parse and validate TOML text; ``file`` names the source in error messages."""
        if not isinstance(text, str):
            raise ConfigError(f"expected TOML text (a str), got {type(text).__name__}", file=file)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}", file=file) from None
        except RecursionError:
            raise ConfigError("not valid TOML: nested too deeply to read", file=file) from None
        except ValueError as exc:  # an integer too long to read (over 4,300 digits)
            raise ConfigError(f"not valid TOML: {exc}", file=file) from None
        return cls.from_dict(data, file=file, generation=generation)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, file: str = "<dict>", generation: int = 1) -> Config:
        """Structure and validate plain data shaped like the TOML file (JSON-compatible values)."""
        fields = structure_config_fields(data, Where(file, ""))
        with rekey(file, ""):
            return cls(generation=generation, file=file, **fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain data that ``from_dict`` reads back to an equal config (without ``generation``)."""
        data: dict[str, Any] = plain(converter.unstructure(self))
        data.pop("generation", None)
        data.pop("file", None)
        # durations as the TOML file writes them
        data["retention"] = self.retention.to_toml()
        data["compaction"] = self.compaction.to_toml()
        for name, scope in self.scopes.items():
            data["scopes"][name].pop("retention", None)
            if scope.retention is not None:
                data["scopes"][name]["retention"] = scope.retention.to_toml()
        return data

    def retention_in(self, scope: str) -> ScopeRetention:
        """The retention in force for what ends in ``scope`` (each setting from the nearest scope that
        declares it, else ``[retention]``, else the default)."""
        return retention_for(self.scopes, self.retention, scope)

    def routes_for(self, scope: str) -> tuple[EffectiveRoute, ...]:
        """The routes in force in ``scope``, in evaluation order (see `effective_routes`)."""
        return resolve_routes(self.scopes, scope, None, file=self.file)

    # -- validation against plugins -------------------------------------------------------------------

    def validate(
        self,
        *,
        executors: Mapping[str, Collection[str]] | None = None,
        handlers: Collection[str] | None = None,
        work_kinds: Collection[str] | None = None,
        triggers: Collection[str] | None = None,
        standing_handlers: Mapping[str, str] | None = None,
    ) -> None:
        """Check the config against the registered plugins; raise `ConfigError` on the first problem.

        ``executors`` maps each executor name to the capabilities it advertises; ``handlers`` are the route
        handler names; ``work_kinds`` the kinds plugins define (besides ``[work_kinds]``); ``triggers`` the
        trigger-selection policies (``first`` is built in); ``standing_handlers`` maps a route handler to the
        standing Work kind its Work takes when the route names none (the ``schedule`` handler runs every
        occurrence of a schedule on one standing Work): a route with such a handler that names a kind must
        name a declared, standing one. Omitted collections are not checked.
        """
        file = self.file
        for scope_name, scope in self.scopes.items():
            for name, binding in scope.bindings.items():
                if executors is not None and binding.executor not in executors:
                    hint = (
                        " (it runs the functions of a loom.App: embedded, open_runtime(plugins=[app]);"
                        " served, loom serve --app module:app)"
                        if binding.executor == "python"
                        else ""
                    )
                    raise ConfigError(
                        f"unknown executor {binding.executor!r}{known(executors)}{hint}",
                        file=file,
                        key=key_path(key_path("scopes", scope_name), "bindings", name, "executor"),
                    )
            for i, route in enumerate(scope.routes):
                where = f"{key_path('scopes', scope_name)}.routes[{i}]"
                if handlers is not None and route.handler not in handlers:
                    raise ConfigError(
                        f"unknown route handler {route.handler!r}{known(handlers)}",
                        file=file,
                        key=f"{where}.handler",
                    )
                if standing_handlers and route.handler in standing_handlers:
                    self._check_standing(route.name, route.handler, route.work_kind, where, standing_handlers)
                if (
                    work_kinds is not None
                    and route.work_kind is not None
                    and not (route.work_kind in self.work_kinds or route.work_kind in work_kinds)
                ):
                    raise ConfigError(
                        f"unknown work kind {route.work_kind!r}{known({*self.work_kinds, *work_kinds})}",
                        file=file,
                        key=f"{where}.work_kind",
                    )
        if triggers is not None:
            for kind, policy in self.work_kinds.items():
                if policy.trigger != DEFAULT_TRIGGER and policy.trigger not in triggers:
                    raise ConfigError(
                        f"unknown trigger selection {policy.trigger!r}{known({DEFAULT_TRIGGER, *triggers})}",
                        file=file,
                        key=key_path("work_kinds", kind, "trigger"),
                    )
        if executors is None:
            return
        advertised = {name: frozenset(str(c) for c in caps) for name, caps in executors.items()}
        for scope_name in self.scopes:
            resolve_routes(self.scopes, scope_name, advertised, file=file)
        for scope_name, scope in self.scopes.items():
            for name, binding in scope.bindings.items():
                missing = sorted(c for c in binding.capabilities if c not in advertised[binding.executor])
                if missing:
                    has = ", ".join(sorted(advertised[binding.executor])) or "nothing"
                    raise ConfigError(
                        f"pins {', '.join(missing)}, which executor {binding.executor!r} does not advertise "
                        f"(it advertises: {has})",
                        file=file,
                        key=key_path(key_path("scopes", scope_name), "bindings", name, "capabilities"),
                    )

    def _check_standing(
        self, route: str, handler: str, kind: str | None, where: str, standing_handlers: Mapping[str, str]
    ) -> None:
        if kind is None:
            return  # the handler's own standing kind is implied
        policy = self.work_kinds.get(kind)
        if policy is not None and policy.standing:
            return
        implied = standing_handlers[handler]
        need = (
            f"work kind {kind!r} is not declared: add [work_kinds.{kind}] with standing = true"
            if policy is None
            else f"work kind {kind!r} is not standing: add standing = true to [work_kinds.{kind}]"
        )
        raise ConfigError(
            f"route {route!r} uses handler {handler!r}, which runs every occurrence on one standing Work, "
            f"but {need}, or leave work_kind out to use the built-in {implied!r} kind",
            file=self.file,
            key=f"{where}.work_kind",
        )


_RESOLVED: dict[int, tuple[weakref.ReferenceType[Config], dict[tuple[str, str], Any]]] = {}
"""Routes and bindings resolved per scope, for each live `Config` (both immutable): a configuration is
resolved once per scope, not at every routing and claim."""


def _resolved(config: Config) -> dict[tuple[str, str], Any]:
    key = id(config)
    entry = _RESOLVED.get(key)
    if entry is not None and entry[0]() is config:
        return entry[1]
    cache: dict[tuple[str, str], Any] = {}
    _RESOLVED[key] = (weakref.ref(config, lambda _: _RESOLVED.pop(key, None)), cache)
    return cache


def effective_bindings(config: Config, scope: str) -> dict[str, EffectiveBinding]:
    """The bindings in force in ``scope``: inherited by name, the nearest definition replacing the whole
    binding (its opaque config included). Ordered by first definition, root to leaf."""
    resolved = _resolved(config)
    found: dict[str, EffectiveBinding] | None = resolved.get(("bindings", scope))
    if found is None:
        found = resolved["bindings", scope] = resolve_bindings(config.scopes, scope)
    return dict(found)  # a copy: the caller may change it


def effective_routes(config: Config, scope: str) -> tuple[EffectiveRoute, ...]:
    """The routes in force in ``scope``, in evaluation order.

    Resolved root to leaf: a descendant's same-name route replaces the whole ancestor route in its original
    slot; new names append. Each route's binding is resolved in ``scope``, not in the scope defining it.
    """
    resolved = _resolved(config)
    routes: tuple[EffectiveRoute, ...] | None = resolved.get(("routes", scope))
    if routes is None:
        routes = resolved["routes", scope] = resolve_routes(config.scopes, scope, None, file=config.file)
    return routes
