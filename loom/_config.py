"""Validated configuration records (DESIGN section 6).

Implements the configuration side of seed 003:

* "Routing and ownership": scopes as path strings; ordered, uniquely named routes per scope resolved root to
  leaf (a descendant's same-name route replaces the whole ancestor route in its original slot, new names
  append); bindings inherited by name, the nearest definition replacing the whole binding, and inherited
  routes resolving their binding in the *target* scope; opaque extension config replaced, never merged;
  validated config generations.
* "Active-event policies and acknowledgements": the policies queue, inject, interrupt and drop; explicit
  fallbacks for an unsupported capability and an explicit error fallback; the validation errors (unknown
  policy, ``coalesce``, fallback cycles, missing capabilities).
* "Pending-job coalescing and standing Work": Work kind policies (standing, run-once, resume capable,
  trigger selection) and, from "Lease recovery, retry and cancellation", the retry budget and backoff.

A config is read from TOML (``Config.load``/``Config.from_toml``) or a plain dict (``Config.from_dict``).
Shapes are checked here by hand rather than with the cattrs converter, because an error must name the TOML
key path (``scopes."acme/web".routes[1].policy``) and cattrs' lenient coercions would accept a string where
a list of patterns belongs. Records check their own rules when constructed, so a config built in Python is
held to the same rules; ``Config.validate`` adds the checks that need the registered plugins. Anything
refused raises `ConfigError` naming the file, the key and the reason, and the previous generation stays in
force (`ConfigHolder`).
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import enum
import fnmatch
import json
import math
import re
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ._errors import ConfigError, InvalidRequest
from ._records import validate_scope
from ._serde import converter

MAX_CAUSAL_DEPTH = 1024
MAX_PER_MINUTE = 100_000
MAX_SCOPE_CAPACITY = 1_000_000
MAX_RETRY_ATTEMPTS = 10
MAX_BACKOFF_MS = 7 * 24 * 3_600_000
MAX_TIMEOUT_MS = 30 * 24 * 3_600_000
RETRY_STEP_MS = 300_000
"""Default backoff step: 5 minutes after failure 1, 10 after failure 2, 15 after failure 3, ..."""
DEFAULT_HANDLER = "correlate"
DEFAULT_TRIGGER = "first"
MAX_NAME_LEN = 200

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_PATTERN_RE = re.compile(r"^[A-Za-z0-9_.:/*?\[\]!-]+$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")

E = TypeVar("E", bound=enum.Enum)


class Policy(enum.StrEnum):
    """What a route does with an Event for Work that has a running attempt."""

    QUEUE = "queue"
    INJECT = "inject"
    INTERRUPT = "interrupt"
    DROP = "drop"

    @property
    def capability(self) -> Capability | None:
        """The executor capability this policy needs, if any."""
        if self is Policy.INJECT:
            return Capability.INJECT
        if self is Policy.INTERRUPT:
            return Capability.INTERRUPT
        return None

    @property
    def is_terminal(self) -> bool:
        """Queue and drop need no capability, so a fallback chain ends at them."""
        return self.capability is None


class Capability(enum.StrEnum):
    """An executor capability that a binding may pin."""

    INJECT = "inject"
    INTERRUPT = "interrupt"
    RESUME = "resume"
    ADOPT = "adopt"


class Synchronous(enum.StrEnum):
    """SQLite ``PRAGMA synchronous`` for the store."""

    FULL = "FULL"
    NORMAL = "NORMAL"


def _bounded(low: int, high: int, section: str = "") -> Any:
    """An attrs validator; the error's key is the attribute, under ``section`` when the record has one."""

    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(
                f"must be an integer from {low} to {high}, got {value!r}", key=_join(section, attribute.name)
            )

    return check


def _optional_bounded(low: int, high: int) -> Any:
    check = _bounded(low, high)

    def optional(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def retry_delays(attempts: int) -> tuple[int, ...]:
    """The default backoff, in ms, for a budget of ``attempts`` total failure attempts.

    One delay follows each failure but the last: ``retry_delays(3) == (300_000, 600_000)``, and a
    four-attempt budget adds 15 minutes: ``retry_delays(4) == (300_000, 600_000, 900_000)``.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_RETRY_ATTEMPTS:
        raise ConfigError(
            f"must be an integer from 1 to {MAX_RETRY_ATTEMPTS}, got {attempts!r}", key="retry_attempts"
        )
    return tuple(RETRY_STEP_MS * failure for failure in range(1, attempts))


@attrs.frozen(kw_only=True)
class CausalLimits:
    """Causal bounds: maximum derived depth and new derived Events per root per UTC minute."""

    max_depth: int = attrs.field(default=32, validator=_bounded(1, MAX_CAUSAL_DEPTH, "causal"))
    per_minute: int = attrs.field(default=128, validator=_bounded(1, MAX_PER_MINUTE, "causal"))

    def stricter(self, other: CausalLimits) -> CausalLimits:
        return CausalLimits(
            max_depth=min(self.max_depth, other.max_depth),
            per_minute=min(self.per_minute, other.per_minute),
        )


@attrs.frozen(kw_only=True)
class StoreConfig:
    """Store settings: SQLite's ``synchronous`` level (FULL survives power loss; NORMAL only a crash)."""

    synchronous: Synchronous = Synchronous.FULL


@attrs.frozen(kw_only=True)
class WorkKindPolicy:
    """The policy of one Work kind (seed 003, "Pending-job coalescing and standing Work").

    ``standing``: a completed attempt leaves the Work ready and idle; failures arm no automatic retry.
    ``run_once``: a handoff outcome settles as completed. ``resume``: parked attempts continue with the
    executor's resume. ``trigger``: the trigger-selection policy that picks an attempt's trigger input.
    ``retry_attempts``: total failure attempts before automatic retries stop; ``retry_backoff_ms``: the
    delay after each failure but the last. ``reopen``: a late Event for terminal Work creates a successor.
    """

    standing: bool = False
    run_once: bool = False
    resume: bool = False
    trigger: str = DEFAULT_TRIGGER
    retry_attempts: int = attrs.field(default=3, validator=_bounded(1, MAX_RETRY_ATTEMPTS))
    retry_backoff_ms: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: retry_delays(self.retry_attempts), takes_self=True)
    )
    reopen: bool = False
    timeout_ms: int | None = attrs.field(default=None, validator=_optional_bounded(1, MAX_TIMEOUT_MS))
    """The execution timeout: active time an attempt may run (a wait pauses it); ``None``: none."""

    def __attrs_post_init__(self) -> None:
        _check_name(self.trigger, "trigger")
        if len(self.retry_backoff_ms) != self.retry_attempts - 1:
            raise ConfigError(
                f"must hold one delay per failure but the last: {self.retry_attempts - 1} for "
                f"retry_attempts = {self.retry_attempts}, got {len(self.retry_backoff_ms)}",
                key="retry_backoff_ms",
            )
        for i, delay in enumerate(self.retry_backoff_ms):
            if isinstance(delay, bool) or not isinstance(delay, int) or not 1 <= delay <= MAX_BACKOFF_MS:
                raise ConfigError(
                    f"must be an integer from 1 to {MAX_BACKOFF_MS} (ms), got {delay!r}",
                    key=f"retry_backoff_ms[{i}]",
                )

    def retry_delay_ms(self, failures: int) -> int | None:
        """The backoff after the ``failures``-th consecutive failure, or ``None`` for no automatic retry.

        ``None`` once the budget is spent, and always for standing Work (its next input is its next attempt).
        """
        if self.standing or not 1 <= failures < self.retry_attempts:
            return None
        return self.retry_backoff_ms[failures - 1]


@attrs.frozen(kw_only=True)
class Binding:
    """An executor binding: which executor runs the Work, which capabilities it pins, and its opaque config.

    An inject or interrupt route needs its binding to pin that capability; ``Config.validate`` checks the
    pinned capabilities against what the executor advertises.
    """

    executor: str
    capabilities: frozenset[Capability] = frozenset()
    config: dict[str, Any] = attrs.field(factory=dict, hash=False)

    def __attrs_post_init__(self) -> None:
        _check_name(self.executor, "executor")
        _check_json(self.config, "config")


@attrs.frozen(kw_only=True)
class Route:
    """One named route of a scope.

    ``types`` are glob patterns over the Event type (empty matches any type). ``handler`` names a route
    handler plugin; ``config`` is the opaque table passed to it. ``policy`` applies when the selected Work has
    a running attempt; ``fallback`` is the ordered list of policies used instead when the bound executor lacks
    the capability (it ends at queue or drop, and never repeats a policy); ``error_fallback`` (queue or drop)
    is used when a supported control fails. ``reason`` is recorded when the route drops an Event.
    """

    name: str
    types: tuple[str, ...] = ()
    handler: str = DEFAULT_HANDLER
    create_work: bool = False
    policy: Policy = Policy.QUEUE
    fallback: tuple[Policy, ...] = ()
    error_fallback: Policy | None = None
    reason: str | None = None
    binding: str | None = None
    work_kind: str | None = None
    config: dict[str, Any] = attrs.field(factory=dict, hash=False)

    def __attrs_post_init__(self) -> None:
        _check_name(self.name, "name")
        _check_name(self.handler, "handler")
        if self.binding is not None:
            _check_name(self.binding, "binding")
        if self.work_kind is not None:
            _check_name(self.work_kind, "work_kind")
        for i, pattern in enumerate(self.types):
            if not isinstance(pattern, str) or not _PATTERN_RE.match(pattern):
                raise ConfigError(
                    f"must be an event type pattern such as 'issue.*', got {pattern!r}", key=f"types[{i}]"
                )
        if self.fallback and self.policy.is_terminal:
            raise ConfigError(
                f"a {self.policy} route needs no capability, so it takes no fallback", key="fallback"
            )
        chain = [self.policy]
        for i, policy in enumerate(self.fallback):
            if chain[-1].is_terminal:
                raise ConfigError(
                    f"{policy} is unreachable: the chain already ends at {chain[-1]}", key=f"fallback[{i}]"
                )
            chain.append(policy)
            if policy in chain[:-1]:
                raise ConfigError(f"fallback cycle: {' -> '.join(chain)}", key=f"fallback[{i}]")
        if self.error_fallback is not None:
            if self.policy.is_terminal:
                raise ConfigError(
                    f"a {self.policy} route sends no control, so it takes no error_fallback",
                    key="error_fallback",
                )
            if not self.error_fallback.is_terminal:
                raise ConfigError(f"must be queue or drop, got {self.error_fallback}", key="error_fallback")
        if self.reason is not None and Policy.DROP not in self.policies:
            raise ConfigError("only a route that can drop records a reason", key="reason")
        if self.create_work and self.policy is Policy.DROP:
            raise ConfigError("a drop route cannot create Work", key="create_work")
        _check_json(self.config, "config")

    @property
    def policies(self) -> tuple[Policy, ...]:
        """Every policy this route can apply: its own, its fallbacks, its error fallback."""
        extra = () if self.error_fallback is None else (self.error_fallback,)
        return (self.policy, *self.fallback, *extra)

    def matches(self, event_type: str) -> bool:
        """Whether ``event_type`` passes this route's type patterns (the handler still decides)."""
        return not self.types or any(fnmatch.fnmatchcase(event_type, pattern) for pattern in self.types)


@attrs.frozen(kw_only=True)
class ScopeConfig:
    """What one scope declares: ordered routes, bindings by name, and the capacity of running attempts."""

    routes: tuple[Route, ...] = ()
    bindings: dict[str, Binding] = attrs.field(factory=dict, hash=False)
    capacity: int | None = attrs.field(default=None, validator=_optional_bounded(1, MAX_SCOPE_CAPACITY))

    def __attrs_post_init__(self) -> None:
        first: dict[str, int] = {}
        for i, route in enumerate(self.routes):
            if route.name in first:
                raise ConfigError(
                    f"duplicate route name {route.name!r} (first at routes[{first[route.name]}]); "
                    "route names are unique within a scope",
                    key=f"routes[{i}].name",
                )
            first[route.name] = i
        for name in self.bindings:
            _check_name(name, _key("bindings", name))

    def route(self, name: str) -> Route | None:
        return next((route for route in self.routes if route.name == name), None)


@attrs.frozen(kw_only=True)
class EffectiveBinding:
    """A binding as seen from a target scope: its name and the nearest scope that defines it."""

    name: str
    scope: str
    binding: Binding

    @property
    def executor(self) -> str:
        return self.binding.executor

    @property
    def key(self) -> str:
        return _key(_key("scopes", self.scope), "bindings", self.name)


@attrs.frozen(kw_only=True)
class EffectiveRoute:
    """A route as seen from a target scope, in its effective slot.

    ``scope`` is the scope whose definition is in force and ``index`` its position there; ``binding`` is
    resolved against the target scope's effective bindings. ``policy`` is the effective policy: the route's
    own, or the first fallback whose capability the binding pins, with ``fallback_reason`` saying why.
    """

    route: Route
    scope: str
    index: int
    slot: int
    target: str
    binding: EffectiveBinding | None
    policy: Policy
    fallback_reason: str | None = None

    @property
    def name(self) -> str:
        return self.route.name

    @property
    def key(self) -> str:
        """The key path of the definition in force, e.g. ``scopes."acme/web".routes[1]``."""
        return f"{_key('scopes', self.scope)}.routes[{self.index}]"

    def matches(self, event_type: str) -> bool:
        return self.route.matches(event_type)


@attrs.frozen(kw_only=True)
class Config:
    """The whole validated configuration; each accepted change is a new generation.

    ``scopes`` maps scope paths to what each declares (a parent of a declared scope need not be declared).
    ``file`` names the source in error messages; it is not part of the configuration's value.
    """

    causal: CausalLimits = attrs.field(factory=CausalLimits)
    store: StoreConfig = attrs.field(factory=StoreConfig)
    scopes: dict[str, ScopeConfig] = attrs.field(factory=dict, hash=False)
    work_kinds: dict[str, WorkKindPolicy] = attrs.field(factory=dict, hash=False)
    generation: int = 1
    file: str | None = attrs.field(default=None, eq=False)

    def __attrs_post_init__(self) -> None:
        if isinstance(self.generation, bool) or not isinstance(self.generation, int) or self.generation < 1:
            raise ConfigError(
                f"must be a positive integer, got {self.generation!r}", file=self.file, key="generation"
            )
        for name in self.scopes:
            try:
                validate_scope(name, field="a scope")
            except InvalidRequest as exc:
                raise ConfigError(str(exc), file=self.file, key=_key("scopes", name)) from None
        for name in self.work_kinds:
            with _rekey(self.file, "work_kinds"):
                _check_name(name, _key("", name))
        for scope in self.scopes:
            _resolve(self, scope, None)

    # -- loading --------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | Path, *, generation: int = 1) -> Config:
        """Read and validate a TOML file."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read the file: {exc}", file=str(path)) from None
        return cls.from_toml(text, file=str(path), generation=generation)

    @classmethod
    def from_toml(cls, text: str, *, file: str = "<string>", generation: int = 1) -> Config:
        """Parse and validate TOML text; ``file`` names the source in error messages."""
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}", file=file) from None
        return cls.from_dict(data, file=file, generation=generation)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, file: str = "<dict>", generation: int = 1) -> Config:
        """Structure and validate plain data shaped like the TOML file (JSON-compatible values)."""
        return _structure_config(data, _Where(file, ""), generation)

    def to_dict(self) -> dict[str, Any]:
        """Plain data that ``from_dict`` reads back to an equal config (without ``generation``)."""
        data: dict[str, Any] = _plain(converter.unstructure(self))
        data.pop("generation", None)
        data.pop("file", None)
        return data

    # -- validation against plugins -------------------------------------------------------------------

    def validate(
        self,
        *,
        executors: Mapping[str, Collection[str]] | None = None,
        handlers: Collection[str] | None = None,
        work_kinds: Collection[str] | None = None,
        triggers: Collection[str] | None = None,
    ) -> None:
        """Check the config against the registered plugins; raise `ConfigError` on the first problem.

        ``executors`` maps each executor name to the capabilities it advertises; ``handlers`` are the route
        handler names; ``work_kinds`` the kinds plugins define (besides ``[work_kinds]``); ``triggers`` the
        trigger-selection policies (``first`` is built in). Omitted collections are not checked.
        """
        file = self.file
        for scope_name, scope in self.scopes.items():
            for name, binding in scope.bindings.items():
                if executors is not None and binding.executor not in executors:
                    raise ConfigError(
                        f"unknown executor {binding.executor!r}{_known(executors)}",
                        file=file,
                        key=_key(_key("scopes", scope_name), "bindings", name, "executor"),
                    )
            for i, route in enumerate(scope.routes):
                where = f"{_key('scopes', scope_name)}.routes[{i}]"
                if handlers is not None and route.handler not in handlers:
                    raise ConfigError(
                        f"unknown route handler {route.handler!r}{_known(handlers)}",
                        file=file,
                        key=f"{where}.handler",
                    )
                if (
                    work_kinds is not None
                    and route.work_kind is not None
                    and not (route.work_kind in self.work_kinds or route.work_kind in work_kinds)
                ):
                    raise ConfigError(
                        f"unknown work kind {route.work_kind!r}{_known([*self.work_kinds, *work_kinds])}",
                        file=file,
                        key=f"{where}.work_kind",
                    )
        if triggers is not None:
            for kind, policy in self.work_kinds.items():
                if policy.trigger != DEFAULT_TRIGGER and policy.trigger not in triggers:
                    raise ConfigError(
                        f"unknown trigger selection {policy.trigger!r}{_known([DEFAULT_TRIGGER, *triggers])}",
                        file=file,
                        key=_key("work_kinds", kind, "trigger"),
                    )
        if executors is None:
            return
        advertised = {name: frozenset(str(c) for c in caps) for name, caps in executors.items()}
        for scope_name in self.scopes:
            _resolve(self, scope_name, advertised)
        for scope_name, scope in self.scopes.items():
            for name, binding in scope.bindings.items():
                missing = sorted(c for c in binding.capabilities if c not in advertised[binding.executor])
                if missing:
                    has = ", ".join(sorted(advertised[binding.executor])) or "nothing"
                    raise ConfigError(
                        f"pins {', '.join(missing)}, which executor {binding.executor!r} does not advertise "
                        f"(it advertises: {has})",
                        file=file,
                        key=_key(_key("scopes", scope_name), "bindings", name, "capabilities"),
                    )


# -- inheritance -----------------------------------------------------------------------------------------


def scope_ancestry(scope: str) -> tuple[str, ...]:
    """The scope and its ancestors, root first: ``acme/web`` -> ``("acme", "acme/web")``."""
    parts = validate_scope(scope, field="scope").split("/")
    return tuple("/".join(parts[: i + 1]) for i in range(len(parts)))


def effective_bindings(config: Config, scope: str) -> dict[str, EffectiveBinding]:
    """The bindings in force in ``scope``: inherited by name, the nearest definition replacing the whole
    binding (its opaque config included). Ordered by first definition, root to leaf."""
    found: dict[str, EffectiveBinding] = {}
    for ancestor in scope_ancestry(scope):
        declared = config.scopes.get(ancestor)
        if declared is not None:
            for name, binding in declared.bindings.items():
                found[name] = EffectiveBinding(name=name, scope=ancestor, binding=binding)
    return found


def effective_routes(config: Config, scope: str) -> tuple[EffectiveRoute, ...]:
    """The routes in force in ``scope``, in evaluation order (seed 003, "Routing and ownership").

    Resolved root to leaf: a descendant's same-name route replaces the whole ancestor route in its original
    slot; new names append. Each route's binding is resolved in ``scope``, not in the scope defining it.
    """
    return _resolve(config, scope, None)


def _resolve(
    config: Config, scope: str, advertised: Mapping[str, frozenset[str]] | None
) -> tuple[EffectiveRoute, ...]:
    slots: list[tuple[str, int, Route]] = []
    slot_of: dict[str, int] = {}
    for ancestor in scope_ancestry(scope):
        declared = config.scopes.get(ancestor)
        if declared is None:
            continue
        for index, route in enumerate(declared.routes):
            if route.name in slot_of:
                slots[slot_of[route.name]] = (ancestor, index, route)
            else:
                slot_of[route.name] = len(slots)
                slots.append((ancestor, index, route))
    bindings = effective_bindings(config, scope)
    resolved = []
    for slot, (defined_in, index, route) in enumerate(slots):
        key = f"{_key('scopes', defined_in)}.routes[{index}]"
        seen_from = "" if defined_in == scope else f" (as inherited by scope {scope!r})"
        binding = None
        if route.binding is not None:
            binding = bindings.get(route.binding)
            if binding is None:
                raise ConfigError(
                    f"unknown binding {route.binding!r}{seen_from}: no binding of that name in scope {scope!r} "
                    f"or its ancestors{_known(bindings)}",
                    file=config.file,
                    key=f"{key}.binding",
                )
        reasons: list[str] = []
        policy = next(
            (p for p in (route.policy, *route.fallback) if not _lacking(p, binding, advertised, reasons)),
            None,
        )
        if policy is None:
            raise ConfigError(
                f"route {route.name!r}{seen_from} cannot {route.policy}: {'; '.join(reasons)}, "
                "and it has no queue or drop fallback to take instead (queue is never inferred)",
                file=config.file,
                key=f"{key}.policy",
            )
        resolved.append(
            EffectiveRoute(
                route=route,
                scope=defined_in,
                index=index,
                slot=slot,
                target=scope,
                binding=binding,
                policy=policy,
                fallback_reason="; ".join(reasons) or None,
            )
        )
    return tuple(resolved)


def _lacking(
    policy: Policy,
    binding: EffectiveBinding | None,
    advertised: Mapping[str, frozenset[str]] | None,
    reasons: list[str],
) -> bool:
    """Whether ``policy`` is unsupported through ``binding``; if so, append the reason to ``reasons``."""
    capability = policy.capability
    if capability is None:
        return False
    if binding is None:
        reasons.append(f"{policy} needs a binding that pins {capability}, and the route names no binding")
    elif capability not in binding.binding.capabilities:
        reasons.append(f"binding {binding.name!r} (scope {binding.scope!r}) does not pin {capability}")
    elif advertised is not None and capability not in advertised.get(binding.executor, frozenset()):
        reasons.append(
            f"executor {binding.executor!r} (binding {binding.name!r}) does not advertise {capability}"
        )
    else:
        return False
    return True


# -- generations -----------------------------------------------------------------------------------------


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


# -- key paths and value checks ---------------------------------------------------------------------------


def _key(path: str, *names: str) -> str:
    """Append TOML keys to a dotted path, quoting those that are not bare keys."""
    for name in names:
        part = name if _BARE_KEY_RE.match(name) else json.dumps(name, ensure_ascii=False)
        path = f"{path}.{part}" if path else part
    return path


def _join(path: str, key: str | None) -> str:
    if not key:
        return path
    if not path or key.startswith("["):
        return path + key
    return f"{path}.{key}"


def _known(names: Collection[str]) -> str:
    return f" (known: {', '.join(sorted(names))})" if names else ""


@contextlib.contextmanager
def _rekey(file: str | None, path: str) -> Iterator[None]:
    """Give a record's own `ConfigError` (keyed relative to the record) the file and the full key path."""
    try:
        yield
    except ConfigError as exc:
        if exc.file is not None:
            raise
        raise ConfigError(exc.reason, file=file, key=_join(path, exc.key)) from None


def _check_name(value: object, key: str) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value) or len(value) > MAX_NAME_LEN:
        raise ConfigError(
            f"must be a name of letters, digits, '_', '.', ':' or '-' starting with a letter or digit, "
            f"got {value!r}",
            key=key,
        )


def _check_json(value: object, key: str) -> None:
    """Opaque tables must be JSON data: they are passed to plugins and recorded with decisions."""
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                raise ConfigError(f"keys must be strings, got {name!r}", key=key)
            _check_json(item, _key(key, name))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_json(item, f"{key}[{i}]")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"must be JSON data, got {value!r}", key=key)
    elif not (value is None or isinstance(value, str | int | bool)):
        raise ConfigError(f"must be JSON data (no dates or times), got {type(value).__name__}", key=key)


def _plain(value: Any) -> Any:
    """Unstructured records to TOML/JSON-compatible data: no ``None``, lists for tuples and sets."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items() if item is not None}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, frozenset | set):
        return sorted(_plain(item) for item in value)
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


# -- structuring -----------------------------------------------------------------------------------------


@attrs.frozen
class _Where:
    file: str
    path: str

    def at(self, name: str) -> _Where:
        return _Where(self.file, _key(self.path, name))

    def index(self, i: int) -> _Where:
        return _Where(self.file, f"{self.path}[{i}]")

    def error(self, reason: str) -> ConfigError:
        return ConfigError(reason, file=self.file, key=self.path or None)


_MISSING: Any = object()


class _Table:
    """One table being read: every key must be taken, or it is refused as unknown."""

    def __init__(self, value: object, where: _Where, known: tuple[str, ...]) -> None:
        if not isinstance(value, Mapping):
            raise where.error(f"must be a table, got {_describe(value)}")
        unknown = [key for key in value if key not in known]
        if unknown:
            hints = [f"{key!r}{_did_you_mean(str(key), known)}" for key in unknown]
            plural = "s" if len(unknown) > 1 else ""
            target = where.at(str(unknown[0])) if len(unknown) == 1 else where
            raise target.error(f"unknown key{plural} {', '.join(hints)}; expected: {', '.join(known)}")
        self.data: Mapping[str, Any] = value
        self.where = where

    def has(self, name: str) -> bool:
        return name in self.data

    def get(self, name: str, check: Callable[[Any, _Where], Any], default: Any = _MISSING) -> Any:
        if name not in self.data:
            if default is _MISSING:
                raise self.where.error(f"missing required key {name!r}")
            return default
        return check(self.data[name], self.where.at(name))


def _did_you_mean(key: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"{type(value).__name__} {value!r}"


def _str(value: Any, where: _Where) -> str:
    if not isinstance(value, str):
        raise where.error(f"must be a string, got {_describe(value)}")
    return value


def _bool(value: Any, where: _Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"must be true or false, got {_describe(value)}")
    return value


def _int(value: Any, where: _Where) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"must be an integer, got {_describe(value)}")
    return value


def _list(item: Callable[[Any, _Where], Any]) -> Callable[[Any, _Where], tuple[Any, ...]]:
    def check(value: Any, where: _Where) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise where.error(f"must be an array, got {_describe(value)}")
        return tuple(item(element, where.index(i)) for i, element in enumerate(value))

    return check


def _table_value(value: Any, where: _Where) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise where.error(f"must be a table, got {_describe(value)}")
    return copy.deepcopy(dict(value))


def _enum(cls: type[E], what: str) -> Callable[[Any, _Where], E]:
    def check(value: Any, where: _Where) -> E:
        if isinstance(value, str):
            for member in cls:
                if member.value == value:
                    return member
        choices = ", ".join(str(member.value) for member in cls)
        raise where.error(f"unknown {what} {value!r}; expected one of: {choices}")

    return check


def _policy(value: Any, where: _Where) -> Policy:
    if value == "coalesce":
        raise where.error(
            "'coalesce' is not a policy: queue is lossless and ordered, and one pending run already comes "
            "from one attempt per Work taking all its pending input; newest-delivery replacement belongs "
            "to an extension (trigger selection or a drop route)"
        )
    return _enum(Policy, "policy")(value, where)


def _fallback(value: Any, where: _Where) -> tuple[Policy, ...]:
    if isinstance(value, str):
        return (_policy(value, where),)
    return _list(_policy)(value, where)


_ROOT_KEYS = ("causal", "store", "scopes", "work_kinds")
_ROUTE_KEYS = (
    "name",
    "types",
    "handler",
    "create_work",
    "policy",
    "fallback",
    "error_fallback",
    "reason",
    "binding",
    "work_kind",
    "config",
)


def _structure_config(data: Mapping[str, Any], where: _Where, generation: int) -> Config:
    root = _Table(data, where, _ROOT_KEYS)
    causal = root.get("causal", _causal, CausalLimits())
    store = root.get("store", _store, StoreConfig())
    scopes = root.get("scopes", _mapping(_scope), {})
    work_kinds = root.get("work_kinds", _mapping(_work_kind), {})
    with _rekey(where.file, where.path):
        return Config(
            causal=causal,
            store=store,
            scopes=scopes,
            work_kinds=work_kinds,
            generation=generation,
            file=where.file,
        )


def _mapping(item: Callable[[Any, _Where], Any]) -> Callable[[Any, _Where], dict[str, Any]]:
    def check(value: Any, where: _Where) -> dict[str, Any]:
        return {name: item(element, where.at(name)) for name, element in _table_value(value, where).items()}

    return check


def _causal(value: Any, where: _Where) -> CausalLimits:
    table = _Table(value, where, ("max_depth", "per_minute"))
    fields = {name: table.get(name, _int) for name in ("max_depth", "per_minute") if table.has(name)}
    with _rekey(where.file, ""):  # CausalLimits' keys already start at ``causal``
        return CausalLimits(**fields)


def _store(value: Any, where: _Where) -> StoreConfig:
    table = _Table(value, where, ("synchronous",))
    return StoreConfig(
        synchronous=table.get("synchronous", _enum(Synchronous, "synchronous level"), Synchronous.FULL)
    )


def _work_kind(value: Any, where: _Where) -> WorkKindPolicy:
    readers: dict[str, Callable[[Any, _Where], Any]] = {
        "standing": _bool,
        "run_once": _bool,
        "resume": _bool,
        "trigger": _str,
        "retry_attempts": _int,
        "retry_backoff_ms": _list(_int),
        "reopen": _bool,
        "timeout_ms": _int,
    }
    table = _Table(value, where, tuple(readers))
    fields = {name: table.get(name, read) for name, read in readers.items() if table.has(name)}
    with _rekey(where.file, where.path):
        return WorkKindPolicy(**fields)


def _scope(value: Any, where: _Where) -> ScopeConfig:
    table = _Table(value, where, ("capacity", "bindings", "routes"))
    routes = table.get("routes", _list(_route), ())
    bindings = table.get("bindings", _mapping(_binding), {})
    capacity = table.get("capacity", _int, None)
    with _rekey(where.file, where.path):
        return ScopeConfig(routes=routes, bindings=bindings, capacity=capacity)


def _binding(value: Any, where: _Where) -> Binding:
    table = _Table(value, where, ("executor", "capabilities", "config"))
    fields = {
        "executor": table.get("executor", _str),
        "capabilities": frozenset(table.get("capabilities", _list(_enum(Capability, "capability")), ())),
        "config": table.get("config", _table_value, {}),
    }
    with _rekey(where.file, where.path):
        return Binding(**fields)


def _route(value: Any, where: _Where) -> Route:
    readers: dict[str, Callable[[Any, _Where], Any]] = {
        "name": _str,
        "types": _list(_str),
        "handler": _str,
        "create_work": _bool,
        "policy": _policy,
        "fallback": _fallback,
        "error_fallback": _policy,
        "reason": _str,
        "binding": _str,
        "work_kind": _str,
        "config": _table_value,
    }
    table = _Table(value, where, _ROUTE_KEYS)
    fields = {name: table.get(name, read) for name, read in readers.items() if table.has(name)}
    if "name" not in fields:
        raise where.error("missing required key 'name'")
    with _rekey(where.file, where.path):
        return Route(**fields)
