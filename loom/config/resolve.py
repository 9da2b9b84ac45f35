"""Route and binding resolution: what is in force in a target scope.

Routes resolve root to leaf: a descendant's same-name route replaces the whole ancestor route in its
original slot, new names append; bindings are inherited by name, the nearest definition replacing the whole
binding; inherited routes resolve their binding in the *target* scope. An inject or interrupt route whose
binding lacks the capability takes its explicit fallback, never an inferred queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..records.errors import ConfigError
from ..records.validation import validate_scope
from ..records.work import Policy
from ._keys import key_path, known
from .model import EffectiveBinding, EffectiveRoute, Route, ScopeConfig

IMPLEMENTED_BY = {"inject": "inject", "interrupt": "interrupt", "adopt": "recover"}
"""The method an executor implements each capability with (`loom.plugins.registry.offered`); ``resume``
needs none of its own (without ``resume``, ``launch`` continues the parked attempt)."""

Scopes = Mapping[str, ScopeConfig]


def scope_ancestry(scope: str) -> tuple[str, ...]:
    """The scope and its ancestors, root first: ``acme/web`` -> ``("acme", "acme/web")``."""
    parts = validate_scope(scope, field="scope").split("/")
    return tuple("/".join(parts[: i + 1]) for i in range(len(parts)))


def resolve_bindings(scopes: Scopes, scope: str) -> dict[str, EffectiveBinding]:
    """The bindings in force in ``scope``: inherited by name, the nearest definition replacing the whole
    binding (its opaque config included). Ordered by first definition, root to leaf."""
    found: dict[str, EffectiveBinding] = {}
    for ancestor in scope_ancestry(scope):
        declared = scopes.get(ancestor)
        if declared is not None:
            for name, binding in declared.bindings.items():
                found[name] = EffectiveBinding(name=name, scope=ancestor, binding=binding)
    return found


def resolve_routes(
    scopes: Scopes, scope: str, advertised: Mapping[str, frozenset[str]] | None, *, file: str | None
) -> tuple[EffectiveRoute, ...]:
    """The routes in force in ``scope``, in evaluation order; with ``advertised`` (executor name ->
    capabilities) an inject or interrupt route is also checked against what its executor offers."""
    slots: list[tuple[str, int, Route]] = []
    slot_of: dict[str, int] = {}
    for ancestor in scope_ancestry(scope):
        declared = scopes.get(ancestor)
        if declared is None:
            continue
        for index, route in enumerate(declared.routes):
            if route.name in slot_of:
                slots[slot_of[route.name]] = (ancestor, index, route)
            else:
                slot_of[route.name] = len(slots)
                slots.append((ancestor, index, route))
    bindings = resolve_bindings(scopes, scope)
    resolved = []
    for slot, (defined_in, index, route) in enumerate(slots):
        key = f"{key_path('scopes', defined_in)}.routes[{index}]"
        seen_from = "" if defined_in == scope else f" (as inherited by scope {scope!r})"
        binding = None
        if route.binding is not None:
            binding = bindings.get(route.binding)
            if binding is None:
                raise ConfigError(
                    f"unknown binding {route.binding!r}{seen_from}: no binding of that name in scope {scope!r} "
                    f"or its ancestors{known(bindings)}",
                    file=file,
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
                file=file,
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
            f" (in its capabilities, with its {IMPLEMENTED_BY.get(capability, capability)} method)"
        )
    else:
        return False
    return True
