"""Records for dependency subscriptions and their alias Events (docs/concepts.md,
"Subscription"; docs/architecture.md, "Dependency subscriptions and alias Events").

A Work that depends on a key another Work owns never takes that key: it subscribes to it. Each
accepted source Event on the key becomes an *alias* Event on a key the dependent owns, derived from
the original (its causal chain and budget), with the stable delivery identity (subscription
namespace/id, original Event id) and a minimal payload naming lineage, never the provider's body.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .events import Event
from .frozen import frozen_optional_object
from .states import Lifecycle


class SubscriptionState(enum.StrEnum):
    PENDING = "pending"
    """Declared with a wait (or rearmed): a reconcile pass installs it, scanning history from its
    checkpoint. A crash before that only delays it."""
    ACTIVE = "active"
    """Installed: every reconcile pass turns new matching source Events into aliases."""
    DISABLED = "disabled"
    """Its wait is blocked (the causal limits refused the wake): the release rearms it."""
    WOKEN = "woken"
    """Its wait woke: it emits nothing more (a later wait of the same Work may declare it again)."""
    CANCELLED = "cancelled"
    """Its Work was cancelled or ended: it emits nothing, ever."""


SUBSCRIPTION_LIFECYCLE = Lifecycle[SubscriptionState](
    "subscription",
    {
        SubscriptionState.PENDING: frozenset(
            {
                SubscriptionState.ACTIVE,
                SubscriptionState.DISABLED,
                SubscriptionState.WOKEN,
                SubscriptionState.CANCELLED,
            }
        ),
        SubscriptionState.ACTIVE: frozenset(
            {SubscriptionState.DISABLED, SubscriptionState.WOKEN, SubscriptionState.CANCELLED}
        ),
        SubscriptionState.DISABLED: frozenset({SubscriptionState.PENDING, SubscriptionState.CANCELLED}),
        SubscriptionState.WOKEN: frozenset({SubscriptionState.PENDING}),
        SubscriptionState.CANCELLED: frozenset(),
    },
)

LIVE_STATES = (SubscriptionState.PENDING, SubscriptionState.ACTIVE)
"""The states a reconcile pass visits."""


@attrs.frozen(kw_only=True)
class SubscriptionSpec:
    """What a dependent Work subscribes to.

    ``namespace`` and ``id`` identify the registration (the alias's source is ``namespace/id``, so a
    namespace holds no ``/``). ``source_key`` is the other Work's key; ``source_scope`` the scope its
    Events are accepted in (``None``: the dependent's own scope; another scope needs the
    ``loom_authorize_alias`` hook's consent). ``types``: source Event type patterns, OR'd (empty: any
    type). ``after``: the exclusive sequence the scan starts after (0: all history). ``filter_name``
    names a pure ``loom_alias_filters`` entry that decides each source Event with the opaque
    ``filter``. ``label`` travels in every alias's payload.
    """

    namespace: str
    id: str
    source_key: str
    source_scope: str | None = None
    types: tuple[str, ...] = ()
    after: int = 0
    filter_name: str | None = None
    filter: Mapping[str, Any] | None = attrs.field(default=None, hash=False, converter=frozen_optional_object)
    label: str = ""


@attrs.frozen(kw_only=True)
class Subscription:
    """A stored subscription: its identity, the dependent Work and key, the source, and the checkpoint
    (the highest source sequence it has decided), persisted together."""

    namespace: str
    id: str
    work_id: str
    dependent_key: str
    """One key the dependent Work owns: every alias is published on it."""
    wait_id: str | None
    """The wait that declared it (``None``: subscribed by the host, it lives as long as its Work)."""
    source_key: str
    source_scope: str
    target_scope: str
    """The dependent Work's scope (fixed for its life), where the aliases are accepted."""
    types: tuple[str, ...]
    after: int
    filter_name: str | None
    filter: Mapping[str, Any] | None = attrs.field(hash=False, converter=frozen_optional_object)
    label: str
    state: SubscriptionState
    checkpoint_seq: int
    revision: int
    """Bumped by every change of declaration or state: an authorisation answer is for one revision."""
    authorized: bool | None
    """The last answer for a cross-scope subscription (``None``: same scope, or not asked yet)."""
    reason: str | None
    """Why it emits nothing now (refused authorisation, a failing filter), or why it ended."""
    created_at_ms: int
    updated_at_ms: int

    @property
    def name(self) -> str:
        """``namespace/id``: the source of its aliases and the subject of its diagnostics."""
        return f"{self.namespace}/{self.id}"

    @property
    def cross_scope(self) -> bool:
        """Its aliases leave the source Events' scope, so each publication needs authorisation."""
        return self.source_scope != self.target_scope


@attrs.frozen(kw_only=True)
class AliasAuthorization:
    """An answer of ``loom_authorize_alias``, asked outside storage, with the snapshot it was asked
    about: the kernel publishes under it only while the subscription is still at that revision and
    those scopes."""

    namespace: str
    id: str
    revision: int
    source_scope: str
    target_scope: str
    allowed: bool
    reason: str

    def covers(self, subscription: Subscription) -> bool:
        return (
            self.namespace == subscription.namespace
            and self.id == subscription.id
            and self.revision == subscription.revision
            and self.source_scope == subscription.source_scope
            and self.target_scope == subscription.target_scope
        )


@attrs.frozen(kw_only=True)
class ReconcileReport:
    """What one bounded reconcile pass did."""

    visited: int
    """Subscriptions looked at."""
    installed: tuple[str, ...]
    """Pending subscriptions installed (``namespace/id``)."""
    aliases: tuple[str, ...]
    """Alias Events accepted, in acceptance order."""
    refused: tuple[str, ...]
    """Source Events whose alias was refused (diagnosed and checkpointed past)."""
    skipped: tuple[str, ...]
    """Subscriptions that emitted nothing this pass: not authorised, a failing filter, or changed since
    they were authorised (asked again next pass)."""
    more: tuple[str, ...] = ()
    """Subscriptions with more source history to scan than one visit takes."""


AliasFilter = Callable[[Event, Mapping[str, Any] | None], bool]
"""A pure filter from ``loom_alias_filters``: ``(source_event, filter) -> bool`` (true: alias it)."""
