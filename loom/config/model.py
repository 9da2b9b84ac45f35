"""Configuration records: causal limits, store settings, Work kinds, bindings, routes,
scopes, and routes and bindings as seen from a target scope.

Records check their own rules when constructed, so a config built in Python is held to the same rules as
one read from TOML; errors are keyed relative to the record and re-keyed by the reader.
"""

from __future__ import annotations

import enum
import fnmatch
import re
from typing import Any

import attrs

from ..records.errors import ConfigError, InvalidRequest
from ..records.frozen import frozen_object
from ..records.validation import MAX_REASON_LEN, check_text, describe_value, validate_scope
from ..records.work import Capability, Policy
from ._keys import bounded, check_json, check_name, key_path, optional_bounded
from .retention import Retention, check_scope_retention

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

_PATTERN_RE = re.compile(r"^[A-Za-z0-9_.:/*?\[\]!-]+$")


class Synchronous(enum.StrEnum):
    """SQLite ``PRAGMA synchronous`` for the store."""

    FULL = "FULL"
    NORMAL = "NORMAL"


def retry_delays(attempts: int) -> tuple[int, ...]:
    """The default backoff, in ms, for a budget of ``attempts`` total failure attempts.

    One delay follows each failure but the last: ``retry_delays(3) == (300_000, 600_000)``, and a
    four-attempt budget adds 15 minutes: ``retry_delays(4) == (300_000, 600_000, 900_000)``.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_RETRY_ATTEMPTS:
        raise ConfigError(
            f"must be an integer from 1 to {MAX_RETRY_ATTEMPTS}, got {describe_value(attempts)}",
            key="retry_attempts",
        )
    return tuple(RETRY_STEP_MS * failure for failure in range(1, attempts))


@attrs.frozen(kw_only=True)
class CausalLimits:
    """Causal bounds: maximum derived depth and new derived Events per root per UTC minute."""

    max_depth: int = attrs.field(default=32, validator=bounded(1, MAX_CAUSAL_DEPTH, "causal"))
    per_minute: int = attrs.field(default=128, validator=bounded(1, MAX_PER_MINUTE, "causal"))

    def stricter(self, other: CausalLimits) -> CausalLimits:
        """The tighter of each bound (one of the two as it is, when it is the tighter in both)."""
        if self.max_depth <= other.max_depth and self.per_minute <= other.per_minute:
            return self
        if other.max_depth <= self.max_depth and other.per_minute <= self.per_minute:
            return other
        return CausalLimits(
            max_depth=min(self.max_depth, other.max_depth),
            per_minute=min(self.per_minute, other.per_minute),
        )


class BudgetPer(enum.StrEnum):
    """What one ledger of a budget adds up: each Work's own, each scope's, or every scope's together."""

    WORK = "work"
    SCOPE = "scope"
    ALL = "all"


class BudgetWindow(enum.StrEnum):
    """The period a ledger covers: the whole life (of the Work, or of the store), a UTC day, a UTC week
    (ISO weeks, from Monday)."""

    LIFE = "life"
    DAY = "day"
    WEEK = "week"


MAX_BUDGET_AMOUNT = 1e15


def _check_amount(key: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_BUDGET_AMOUNT:
        raise ConfigError(
            f"must be a number above 0 and at most {MAX_BUDGET_AMOUNT:g}, got {describe_value(value)}",
            key=key,
        )


def _positive_amount(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    _check_amount(attribute.name, value)


@attrs.frozen(kw_only=True)
class Budget:
    """A budget: a ``limit`` on the amount of ``unit`` consumed, added up ``per``
    Work, scope or all scopes over a ``window``, for Work in ``scope`` and the scopes under it (every
    scope when ``None``). Executors report usage in their own units (``usd``, ``tokens``, ...); the
    runtime counts ``turns`` and ``attempts`` itself. A turn does not start once a ledger reached its
    limit; crossing ``warning`` (below the limit) or the limit accepts a ``core.budget.warning`` or
    ``core.budget.exceeded`` Event.
    """

    name: str
    unit: str
    limit: float = attrs.field(validator=_positive_amount)
    warning: float | None = None
    per: BudgetPer = BudgetPer.WORK
    window: BudgetWindow = BudgetWindow.LIFE
    scope: str | None = None

    def __attrs_post_init__(self) -> None:
        check_name(self.name, "name")
        check_name(self.unit, "unit")
        if self.warning is not None:
            _check_amount("warning", self.warning)
            if self.warning >= self.limit:
                raise ConfigError(
                    f"must be below the limit ({self.limit:g}), got {self.warning:g}", key="warning"
                )
        if self.scope is not None:
            try:
                validate_scope(self.scope, field="scope")
            except InvalidRequest as exc:
                raise ConfigError(str(exc), key="scope") from None

    def applies_to(self, scope: str) -> bool:
        """Whether Work in ``scope`` is counted by this budget."""
        return self.scope is None or scope == self.scope or scope.startswith(self.scope + "/")


@attrs.frozen(kw_only=True)
class StoreConfig:
    """Store settings: SQLite's ``synchronous`` level (FULL survives power loss; NORMAL only a crash)."""

    synchronous: Synchronous = Synchronous.FULL


@attrs.frozen(kw_only=True)
class WorkKindPolicy:
    """The policy of one Work kind.

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
    retry_attempts: int = attrs.field(default=3, validator=bounded(1, MAX_RETRY_ATTEMPTS))
    retry_backoff_ms: tuple[int, ...] = attrs.field(
        default=attrs.Factory(lambda self: retry_delays(self.retry_attempts), takes_self=True)
    )
    reopen: bool = False
    timeout_ms: int | None = attrs.field(default=None, validator=optional_bounded(1, MAX_TIMEOUT_MS))
    """The execution timeout: active time an attempt may run (a wait pauses it); ``None``: none."""
    fail_on_exhaustion: bool = False
    """A spent retry budget fails the Work (terminal; a later retry needs a successor) instead of holding it."""

    def __attrs_post_init__(self) -> None:
        check_name(self.trigger, "trigger")
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
    config: dict[str, Any] = attrs.field(factory=dict, hash=False, converter=frozen_object)

    def __attrs_post_init__(self) -> None:
        check_name(self.executor, "executor")
        check_json(self.config, "config")


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
    config: dict[str, Any] = attrs.field(factory=dict, hash=False, converter=frozen_object)

    def __attrs_post_init__(self) -> None:
        check_name(self.name, "name")
        check_name(self.handler, "handler")
        if self.binding is not None:
            check_name(self.binding, "binding")
        if self.work_kind is not None:
            check_name(self.work_kind, "work_kind")
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
        if self.reason:  # the kernel holds a dropped Event's reason to the same rule ("": the default)
            try:
                check_text("reason", self.reason, max_len=MAX_REASON_LEN, strip=False)
            except InvalidRequest as exc:
                raise ConfigError(str(exc).removeprefix("reason "), key="reason") from None
        if self.reason is not None and Policy.DROP not in self.policies:
            raise ConfigError("only a route that can drop records a reason", key="reason")
        if self.create_work and self.policy is Policy.DROP:
            raise ConfigError("a drop route cannot create Work", key="create_work")
        check_json(self.config, "config")

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
    """What one scope declares: ordered routes, bindings by name, the capacity of running attempts, and
    the retention of what ends in it (each setting inherited on its own: `loom.config.retention`)."""

    routes: tuple[Route, ...] = ()
    bindings: dict[str, Binding] = attrs.field(factory=dict, hash=False)
    capacity: int | None = attrs.field(default=None, validator=optional_bounded(1, MAX_SCOPE_CAPACITY))
    retention: Retention | None = None

    def __attrs_post_init__(self) -> None:
        if self.retention is not None:
            if not isinstance(self.retention, Retention):
                raise ConfigError(
                    f"must be a Retention, got {type(self.retention).__name__}", key="retention"
                )
            check_scope_retention(self.retention)
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
            check_name(name, key_path("bindings", name))

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
        return key_path(key_path("scopes", self.scope), "bindings", self.name)


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
        return f"{key_path('scopes', self.scope)}.routes[{self.index}]"

    def matches(self, event_type: str) -> bool:
        return self.route.matches(event_type)
