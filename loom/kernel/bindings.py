"""Which binding a Work's next attempt runs with: the executor, its capabilities and its configuration.

A route names a binding; a continuation, a retry or input through a route that names none carries on
with the binding the Work last ran with (docs/concepts.md, "Binding").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import attrs

from ..config import Config, effective_bindings, effective_routes
from ..records.ids import stable_id
from ..records.work import Execution, ExecutionState
from ..store import Tx
from ._common import require_work


@attrs.frozen(kw_only=True)
class BindingRef:
    """The binding an attempt is pinned to: executor and the capabilities it may use."""

    name: str | None
    executor: str | None
    capabilities: frozenset[str] = frozenset()
    config: Mapping[str, Any] = attrs.field(factory=dict, hash=False)


NO_BINDING = BindingRef(name=None, executor=None)
"""A host's own claim with no binding: it runs the attempt itself."""


def binding_for_in_tx(
    tx: Tx, now_ms: int, work_id: str, config: Config, advertised: Mapping[str, Collection[str]]
) -> BindingRef | None:
    """The binding a Work's next attempt runs with: that of the route which routed its earliest
    pending input, resolved in the Work's scope, pinning only capabilities its executor advertises.

    A continuation (the last attempt ended on a wait, which was woken) carries on with the binding the
    waited attempt ran with, whichever route its winner came by. Input that came through no route (a
    retry, a manual retry request) continues with the binding the Work's last attempt ran with, as
    configured now (or as it was pinned, if it is no longer configured); input through routes that name
    no binding (they only pass input to the Work) continues with it where it is configured.

    ``None``: no pending input came through a route with a binding, and no attempt ran under one (a
    host may still claim).
    """
    work = require_work(tx, work_id)
    routes = {route.name: route for route in effective_routes(config, work.scope)}
    if work.execution_state is ExecutionState.PARKED:
        # a parked attempt resumes with the binding it was pinned to
        parked = tx.live_execution(work.id)
        assert parked is not None
        pinned = effective_bindings(config, work.scope).get(parked.binding or "")
        return BindingRef(
            name=parked.binding,
            executor=parked.executor,
            capabilities=parked.capabilities,
            config=pinned.binding.config if pinned is not None else {},
        )
    # the last attempt's state alone first: its whole row is needed only for a continuation, or when
    # no pending input names a binding
    last_id = stable_id("ex", work.id, str(work.attempts)) if work.attempts else None
    if last_id is not None and tx.execution_state(last_id) is ExecutionState.WAITED:
        last = tx.execution(last_id)
        assert last is not None
        # a continuation: attempt N+1 carries on the waited attempt, whatever route its winner came by
        return _binding_of(config, work.scope, last, advertised)
    unrouted = False  # some pending input came through no route (a retry, a manual retry request)
    for _, checkpoint in tx.input_checkpoints(work.pending_inputs):
        unrouted = unrouted or (checkpoint is not None and checkpoint.route is None)
        route = routes.get(checkpoint.route or "") if checkpoint else None
        if route is None or route.binding is None:
            continue
        binding = route.binding.binding
        capabilities = frozenset(str(c) for c in binding.capabilities)
        return BindingRef(
            name=route.binding.name,
            executor=binding.executor,
            capabilities=capabilities & frozenset(advertised.get(binding.executor, ())),
            config=binding.config,
        )
    last = tx.execution(last_id) if last_id is not None else None
    if last is None:
        return None
    # no pending input names a binding: the Work carries on with the binding it last ran with; input
    # through a route that names none (it only passes input to its Work) does so only where that
    # binding is configured, so an attempt a host claimed under a binding of its own stays the host's
    return _binding_of(config, work.scope, last, advertised, pinned=unrouted)


def _binding_of(
    config: Config,
    scope: str,
    last: Execution,
    advertised: Mapping[str, Collection[str]],
    *,
    pinned: bool = True,
) -> BindingRef | None:
    """The binding ``last`` ran with, as configured now, or (with ``pinned``) as it was pinned if it
    is no longer configured; ``None`` if it ran under no executor."""
    if last.executor is None:
        return None
    configured = effective_bindings(config, scope).get(last.binding or "")
    if configured is not None:
        binding = configured.binding
        return BindingRef(
            name=last.binding,
            executor=binding.executor,
            capabilities=frozenset(str(c) for c in binding.capabilities)
            & frozenset(advertised.get(binding.executor, ())),
            config=binding.config,
        )
    if not pinned:
        return None
    return BindingRef(
        name=last.binding,
        executor=last.executor,
        capabilities=last.capabilities & frozenset(advertised.get(last.executor, ())),
        config=dict(last.binding_config or {}),
    )
