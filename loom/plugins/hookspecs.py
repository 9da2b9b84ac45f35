"""Hook specifications (docstring-only). Hooks are sync and called keyword-only.

Hooks that need I/O return objects with async methods that actors await outside any
transaction. Pure policies (recurrence, trigger selection, alias filters) may be called
inside a transaction and must be deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._markers import hookspec


@hookspec
def loom_route_handlers() -> Mapping[str, Any]:
    """Return route handlers by name.

    A handler is ``(event, scope, work, route) -> Decision`` over detached snapshots
    (``work`` is ``None`` when no Work is selected yet). It is deterministic and does no
    I/O; it may be sync or async (the router awaits it in that Work's own task).
    """


@hookspec
def loom_executors() -> Mapping[str, Any]:
    """Return executors by name.

    An executor has async ``launch``, ``inject``, ``interrupt``, ``recover`` and
    ``resume`` methods and declares its capabilities (inject, interrupt, resume, adopt),
    which route and binding validation check; with ``validate_config`` it also checks each binding's
    config as the configuration is loaded (`loom.records.executor`).
    """


@hookspec
def loom_recurrence_policies() -> Mapping[str, Any]:
    """Return recurrence policies by timer kind.

    A policy is pure: ``(timer, now_ms, spec) -> (Occurrence | Skip, Replacement | None)``.
    Core validates both answers inside the firing transaction.
    """


@hookspec
def loom_call_gates() -> Mapping[str, Any]:
    """Return toolbelt call gates by name: ``(call: GatedCall) -> None | RefuseCall | WaitForCall``
    (sync or async, called outside any transaction, in gate-name order, before the call runs).

    ``None`` lets the call through; `RefuseCall` makes `CallRefused` its result and changes nothing;
    `WaitForCall` parks the attempt on the wait under its fence (the call raises `CallParked`). A gate
    that raises, or answers anything else, refuses the call with a diagnostic.
    """


@hookspec
def loom_start_gates() -> Mapping[str, Any]:
    """Return start gates by name: a gate may hold Work before its first attempt starts."""


@hookspec
def loom_alias_filters() -> Mapping[str, Any]:
    """Return pure subscription filters by name: ``(source_event, filter) -> bool``.

    A `SubscriptionSpec` names one with ``filter_name`` and gives it the opaque ``filter``. It is called
    inside the reconcile transaction, so it must be deterministic and do no I/O; ``True`` aliases the
    Event. One that raises or answers anything but a bool skips its subscription for that pass.
    """


@hookspec(firstresult=True)
def loom_authorize_alias(source_scope: str, target_scope: str, subscription: Any) -> bool | None:
    """Authorise a cross-scope alias of ``subscription`` (a `Subscription`) from ``source_scope`` into
    ``target_scope``; called outside storage, again on every reconcile pass, and may be async. ``True``
    consents; ``False`` refuses; ``None`` means no opinion, and when no plugin has one it is refused.
    Consent publishes aliases only: it grants no ownership or write authority in the source scope."""


@hookspec
def loom_work_kinds() -> Mapping[str, Any]:
    """Return Work kind policies by kind: standing, run-once, resume capable, trigger
    selection and retry budget."""
