"""Reading a configuration from TOML or plain data into config records.

Shapes are checked here by hand rather than with the cattrs converter, because an error must name the TOML
key path (``scopes."acme/web".routes[1].policy``) and cattrs' lenient coercions would accept a string where
a list of patterns belongs. Every key must be taken, or it is refused as unknown (with a suggestion).
"""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

import attrs

from ..records.errors import ConfigError
from ..records.validation import MAX_PAYLOAD_DEPTH
from ..records.work import Capability, Policy
from ._keys import key_path, rekey
from .model import (
    Binding,
    Budget,
    BudgetPer,
    BudgetWindow,
    CausalLimits,
    Route,
    ScopeConfig,
    StoreConfig,
    Synchronous,
    WorkKindPolicy,
)
from .retention import GLOBAL, SCOPED, SETTINGS, Compaction, Retention, parse_duration

E = TypeVar("E", bound=enum.Enum)


@attrs.frozen
class Where:
    file: str
    path: str

    def at(self, name: object) -> Where:
        return Where(self.file, key_path(self.path, name))

    def index(self, i: int) -> Where:
        return Where(self.file, f"{self.path}[{i}]")

    def error(self, reason: str) -> ConfigError:
        return ConfigError(reason, file=self.file, key=self.path or None)


_MISSING: Any = object()


class _Table:
    """One table being read: every key must be taken, or it is refused as unknown."""

    def __init__(self, value: object, where: Where, known: tuple[str, ...]) -> None:
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

    def get(self, name: str, check: Callable[[Any, Where], Any], default: Any = _MISSING) -> Any:
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


def _str(value: Any, where: Where) -> str:
    if not isinstance(value, str):
        raise where.error(f"must be a string, got {_describe(value)}")
    return value


def _bool(value: Any, where: Where) -> bool:
    if not isinstance(value, bool):
        raise where.error(f"must be true or false, got {_describe(value)}")
    return value


def _int(value: Any, where: Where) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise where.error(f"must be an integer, got {_describe(value)}")
    return value


def _list(item: Callable[[Any, Where], Any]) -> Callable[[Any, Where], tuple[Any, ...]]:
    def check(value: Any, where: Where) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise where.error(f"must be an array, got {_describe(value)}")
        return tuple(item(element, where.index(i)) for i, element in enumerate(value))

    return check


def _table_value(value: Any, where: Where) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise where.error(f"must be a table, got {_describe(value)}")
    copied: dict[str, Any] = _copy(value)
    return copied


def _copy(value: Any) -> Any:
    """A copy of plain data, every mapping as a ``dict`` (`_check_depth` bounds its recursion)."""
    if isinstance(value, Mapping):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [_copy(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


MAX_DEPTH = MAX_PAYLOAD_DEPTH + 8
"""How deep configuration data may nest: an opaque table's own limit below the deepest key that holds
one (``scopes.<scope>.routes[<i>].config``). Checked before anything recurses into the data."""


def _check_depth(data: Any, where: Where) -> None:
    """Refuse data nested more than `MAX_DEPTH` levels, walking it level by level (no recursion)."""
    level: list[tuple[Where, Any]] = [(where, data)]
    for _ in range(MAX_DEPTH):
        nested: list[tuple[Where, Any]] = []
        for at, value in level:
            if isinstance(value, Mapping):
                nested += [(at.at(key), item) for key, item in value.items()]
            elif isinstance(value, list | tuple):
                nested += [(at.index(i), item) for i, item in enumerate(value)]
        if not nested:
            return
        level = nested
    raise level[0][0].error(f"is nested more than {MAX_DEPTH} levels deep")


def _enum(cls: type[E], what: str) -> Callable[[Any, Where], E]:
    def check(value: Any, where: Where) -> E:
        if isinstance(value, str):
            for member in cls:
                if member.value == value:
                    return member
        choices = ", ".join(str(member.value) for member in cls)
        raise where.error(f"unknown {what} {value!r}; expected one of: {choices}")

    return check


def _policy(value: Any, where: Where) -> Policy:
    if value == "coalesce":
        raise where.error(
            "'coalesce' is not a policy: queue is lossless and ordered, and one pending run already comes "
            "from one attempt per Work taking all its pending input; newest-delivery replacement belongs "
            "to an extension (trigger selection or a drop route)"
        )
    return _enum(Policy, "policy")(value, where)


def _fallback(value: Any, where: Where) -> tuple[Policy, ...]:
    if isinstance(value, str):
        return (_policy(value, where),)
    return _list(_policy)(value, where)


_ROOT_KEYS = ("causal", "store", "scopes", "work_kinds", "budgets", "retention", "compaction")
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


def structure_config_fields(data: Mapping[str, Any], where: Where) -> dict[str, Any]:
    """The top-level fields of a `Config` read from ``data`` (each section checked as it is read)."""
    _check_depth(data, where)
    root = _Table(data, where, _ROOT_KEYS)
    return {
        "causal": root.get("causal", _causal, CausalLimits()),
        "store": root.get("store", _store, StoreConfig()),
        "scopes": root.get("scopes", _mapping(_scope), {}),
        "work_kinds": root.get("work_kinds", _mapping(_work_kind), {}),
        "budgets": root.get("budgets", _list(_budget), ()),
        "retention": root.get("retention", _retention(SETTINGS), Retention()),
        "compaction": root.get("compaction", _compaction, Compaction()),
    }


def _retention(allowed: tuple[str, ...]) -> Callable[[Any, Where], Retention]:
    def check(value: Any, where: Where) -> Retention:
        if isinstance(value, Mapping):
            for name in GLOBAL:
                if name in value and name not in allowed:
                    raise where.at(name).error(
                        "is not tied to a scope: declare it under [retention] (it applies to every scope)"
                    )
        table = _Table(value, where, allowed)
        fields = {
            f"{name}_ms": table.get(name, lambda v, w: _duration(v, w)) for name in allowed if table.has(name)
        }
        return Retention(**fields)

    return check


def _duration(value: Any, where: Where, *, forever: bool = True) -> int:
    with rekey(where.file, ""):
        return parse_duration(value, where.path, forever=forever)


def _compaction(value: Any, where: Where) -> Compaction:
    table = _Table(value, where, ("every", "batch"))
    fields: dict[str, Any] = {}
    if table.has("every"):
        fields["every_ms"] = table.get("every", lambda v, w: _duration(v, w, forever=False))
    if table.has("batch"):
        fields["batch"] = table.get("batch", _int)
    with rekey(where.file, ""):
        return Compaction(**fields)


def _mapping(item: Callable[[Any, Where], Any]) -> Callable[[Any, Where], dict[str, Any]]:
    def check(value: Any, where: Where) -> dict[str, Any]:
        table = _table_value(value, where)
        for name in table:
            if not isinstance(name, str):
                raise where.at(name).error(f"keys must be strings, got {_describe(name)}")
        return {name: item(element, where.at(name)) for name, element in table.items()}

    return check


def _causal(value: Any, where: Where) -> CausalLimits:
    table = _Table(value, where, ("max_depth", "per_minute"))
    fields = {name: table.get(name, _int) for name in ("max_depth", "per_minute") if table.has(name)}
    with rekey(where.file, ""):  # CausalLimits' keys already start at ``causal``
        return CausalLimits(**fields)


def _store(value: Any, where: Where) -> StoreConfig:
    table = _Table(value, where, ("synchronous",))
    return StoreConfig(
        synchronous=table.get("synchronous", _enum(Synchronous, "synchronous level"), Synchronous.FULL)
    )


def _number(value: Any, where: Where) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise where.error(f"must be a number, got {_describe(value)}")
    return value


def _budget(value: Any, where: Where) -> Budget:
    readers: dict[str, Callable[[Any, Where], Any]] = {
        "name": _str,
        "unit": _str,
        "limit": _number,
        "warning": _number,
        "per": _enum(BudgetPer, "budget ledger"),
        "window": _enum(BudgetWindow, "budget window"),
        "scope": _str,
    }
    table = _Table(value, where, tuple(readers))
    for required in ("name", "unit", "limit"):
        if not table.has(required):
            raise where.at(required).error("is required")
    fields = {name: table.get(name, read) for name, read in readers.items() if table.has(name)}
    with rekey(where.file, where.path):
        return Budget(**fields)


def _work_kind(value: Any, where: Where) -> WorkKindPolicy:
    readers: dict[str, Callable[[Any, Where], Any]] = {
        "standing": _bool,
        "run_once": _bool,
        "resume": _bool,
        "trigger": _str,
        "retry_attempts": _int,
        "retry_backoff_ms": _list(_int),
        "reopen": _bool,
        "timeout_ms": _int,
        "fail_on_exhaustion": _bool,
    }
    table = _Table(value, where, tuple(readers))
    fields = {name: table.get(name, read) for name, read in readers.items() if table.has(name)}
    with rekey(where.file, where.path):
        return WorkKindPolicy(**fields)


def _scope(value: Any, where: Where) -> ScopeConfig:
    table = _Table(value, where, ("capacity", "bindings", "routes", "retention"))
    routes = table.get("routes", _list(_route), ())
    bindings = table.get("bindings", _mapping(_binding), {})
    capacity = table.get("capacity", _int, None)
    retention = table.get("retention", _retention(SCOPED), None)
    with rekey(where.file, where.path):
        return ScopeConfig(routes=routes, bindings=bindings, capacity=capacity, retention=retention)


def _binding(value: Any, where: Where) -> Binding:
    table = _Table(value, where, ("executor", "capabilities", "config"))
    fields = {
        "executor": table.get("executor", _str),
        "capabilities": frozenset(table.get("capabilities", _list(_enum(Capability, "capability")), ())),
        "config": table.get("config", _table_value, {}),
    }
    with rekey(where.file, where.path):
        return Binding(**fields)


def _route(value: Any, where: Where) -> Route:
    readers: dict[str, Callable[[Any, Where], Any]] = {
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
    with rekey(where.file, where.path):
        return Route(**fields)
