"""`Extensions`: what the registered plugins provide, merged by name once at startup.

Built-in plugins register exactly like third-party ones; when two provide the same name, the one
registered first wins (pluggy calls the last registered first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import pluggy

from ..config.model import WorkKindPolicy
from ..config.resolve import IMPLEMENTED_BY
from ..records.errors import ConfigError, InvalidRequest
from ..records.executor import Executor
from ..records.subscriptions import AliasFilter
from ..records.timers import RecurrencePolicy


def merged(results: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge hook results; pluggy calls the last registered first, so earlier plugins win last."""
    out: dict[str, Any] = {}
    for result in reversed(results):
        out.update(result or {})
    return out


@attrs.frozen(kw_only=True)
class Extensions:
    """Route handlers, executors, start and call gates, recurrence policies, Work kinds and alias
    filters, by name, and the alias authoriser (``loom_authorize_alias``, first answer wins; ``None``: no
    plugin answers)."""

    handlers: Mapping[str, Any] = attrs.field(factory=dict)
    executors: Mapping[str, Executor] = attrs.field(factory=dict)
    start_gates: Mapping[str, Any] = attrs.field(factory=dict)
    call_gates: Mapping[str, Any] = attrs.field(factory=dict)
    recurrence_policies: Mapping[str, RecurrencePolicy] = attrs.field(factory=dict)
    work_kinds: Mapping[str, WorkKindPolicy] = attrs.field(factory=dict)
    alias_filters: Mapping[str, AliasFilter] = attrs.field(factory=dict)
    authorize_alias: Callable[..., Any] | None = None

    @classmethod
    def of(cls, pm: pluggy.PluginManager) -> Extensions:
        kinds = merged(pm.hook.loom_work_kinds())
        for name, kind in kinds.items():
            if not isinstance(kind, WorkKindPolicy):
                raise ConfigError(
                    f"a plugin's work kind {name!r} is a {type(kind).__name__}, not a WorkKindPolicy"
                )
        return cls(
            handlers=merged(pm.hook.loom_route_handlers()),
            executors=merged(pm.hook.loom_executors()),
            start_gates=merged(pm.hook.loom_start_gates()),
            call_gates=merged(pm.hook.loom_call_gates()),
            recurrence_policies=merged(pm.hook.loom_recurrence_policies()),
            work_kinds=kinds,
            alias_filters=merged(pm.hook.loom_alias_filters()),
            authorize_alias=pm.hook.loom_authorize_alias,
        )

    def standing_handlers(self) -> dict[str, str]:
        """Route handler -> the standing Work kind it declares (``standing_work_kind``): its Work takes that
        kind when the route names none, and a route that names one must name a standing kind."""
        out: dict[str, str] = {}
        for name, handler in self.handlers.items():
            kind = getattr(handler, "standing_work_kind", None)
            if isinstance(kind, str):
                out[name] = kind
        return out

    def advertised(self) -> dict[str, frozenset[str]]:
        """Executor name -> the capabilities it advertises and implements now (`offered`; read live: an
        executor may change them)."""
        return {name: offered(executor) for name, executor in self.executors.items()}


def offered(executor: object) -> frozenset[str]:
    """The capabilities ``executor`` advertises (its ``capabilities``) and implements (has the method
    for: `IMPLEMENTED_BY`): one advertised without its method is not offered, so a route or binding
    that needs it is refused when the configuration loads, as for one not advertised."""
    return frozenset(
        name
        for name in (str(c) for c in getattr(executor, "capabilities", ()))
        if name not in IMPLEMENTED_BY or callable(getattr(executor, IMPLEMENTED_BY[name], None))
    )


class LiveCapabilities(Mapping[str, frozenset[str]]):
    """Executor name -> the capabilities it advertises, read at each lookup (config validation
    sees what the executors offer when a config is loaded, not when the runtime started)."""

    def __init__(self, executors: Mapping[str, Any]) -> None:
        self._executors = executors

    def __getitem__(self, name: str) -> frozenset[str]:
        return offered(self._executors[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._executors)

    def __len__(self) -> int:
        return len(self._executors)

    def validate_binding(self, executor: str, config: Mapping[str, Any]) -> None:
        """Have ``executor`` check a binding's ``config`` as the configuration is loaded, with its optional
        ``validate_config`` (`loom.records.executor`): `ConfigError` keyed within the config when it is
        refused. An executor without one takes any config; one unknown here is refused elsewhere."""
        check = getattr(self._executors.get(executor), "validate_config", None)
        if check is None:
            return
        try:
            check(config)
        except ConfigError:
            raise
        except InvalidRequest as exc:
            raise ConfigError(str(exc), key=exc.field) from None
        except Exception as exc:  # a check that breaks refuses the config, saying how
            raise ConfigError(
                f"executor {executor!r} could not check it: {type(exc).__name__}: {exc}"
            ) from None
