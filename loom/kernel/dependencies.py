"""Declaring dependency subscriptions: who may depend on what, the identity rules, and the stored
record. A dependent never takes the key it depends on (its owner keeps it); it subscribes to it instead.

A wait's declaration (stored pending in its registration transaction) and the host's `subscribe`
(installed at once) both go through `declare_in_tx`, so the same checks hold either way. This module
needs nothing from `subscriptions` or `waits`: `waits` imports it to persist what a wait declares, and
`subscriptions` imports both.
"""

from __future__ import annotations

import attrs

from ..records.errors import Conflict, InvalidRequest
from ..records.notices import SubscriptionChanged
from ..records.subscriptions import Subscription, SubscriptionSpec, SubscriptionState
from ..records.validation import MAX_KEY_LEN, check_subscription_spec, check_text
from ..records.work import Work
from ..store import Tx

_DECLARATION = (
    "dependent_key",
    "wait_id",
    "source_key",
    "source_scope",
    "target_scope",
    "types",
    "after",
    "filter_name",
    "filter",
    "label",
)


def declared_record(
    work: Work,
    spec: SubscriptionSpec,
    *,
    dependent_key: str,
    wait_id: str | None,
    state: SubscriptionState,
    now_ms: int,
) -> Subscription:
    """The record a new declaration stores: its checkpoint starts at ``after`` (0: all history)."""
    return Subscription(
        namespace=spec.namespace,
        id=spec.id,
        work_id=work.id,
        dependent_key=dependent_key,
        wait_id=wait_id,
        source_key=spec.source_key,
        source_scope=spec.source_scope if spec.source_scope is not None else work.scope,
        target_scope=work.scope,
        types=tuple(spec.types),
        after=spec.after,
        filter_name=spec.filter_name,
        filter=spec.filter,
        label=spec.label,
        state=state,
        checkpoint_seq=spec.after,
        revision=1,
        authorized=None,
        reason=None,
        created_at_ms=now_ms,
        updated_at_ms=now_ms,
    )


def same_declaration(a: Subscription, b: Subscription) -> bool:
    return all(getattr(a, name) == getattr(b, name) for name in _DECLARATION)


def plan_declaration_in_tx(
    tx: Tx,
    now_ms: int,
    work: Work,
    spec: SubscriptionSpec,
    *,
    dependent_key: str | None,
    wait_id: str | None,
    state: SubscriptionState,
    field: str = "subscription",
) -> tuple[Subscription, Subscription | None]:
    """What declaring ``spec`` for ``work`` leads to, without writing: the record it stores (or the
    identical one already stored), and the stored one it matches or replaces (``None``: a new one).

    The dependent key (default: the Work's first key) must be the Work's own: an alias never lands on
    another Work's key. The source key must not be the Work's own either (it would wait on it
    directly). The identity belongs to one Work; a later wait of that Work may declare a woken one
    again (pending, keeping its checkpoint while its source is unchanged). Anything else that reuses
    an identity is a `Conflict`.
    """
    check_subscription_spec(field, spec)
    if work.state.terminal:
        raise Conflict(f"work {work.id} is {work.state}: it cannot subscribe")
    key = dependent_key if dependent_key is not None else (work.keys[0] if work.keys else None)
    if key is None:
        raise InvalidRequest(f"{field}: work {work.id} owns no key an alias could be published on")
    check_text(f"{field}.dependent_key", key, max_len=MAX_KEY_LEN)
    owner = tx.key_owner(key)
    if owner != work.id:
        held = f"owned by work {owner}" if owner is not None else "owned by no work"
        raise InvalidRequest(
            f"{field}.dependent_key: key {key!r} is {held}, not by work {work.id} "
            "(aliases land on a key the dependent owns)"
        )
    if tx.key_owner(spec.source_key) == work.id:
        raise InvalidRequest(
            f"{field}.source_key: key {spec.source_key!r} is work {work.id}'s own; wait on it directly"
        )
    fresh = declared_record(work, spec, dependent_key=key, wait_id=wait_id, state=state, now_ms=now_ms)
    existing = tx.subscription(spec.namespace, spec.id)
    if existing is None:
        return fresh, None
    if existing.work_id != work.id:
        raise InvalidRequest(f"{field}.id: subscription {existing.name} belongs to work {existing.work_id}")
    if same_declaration(existing, fresh):
        return existing, existing
    if existing.state is SubscriptionState.WOKEN and wait_id is not None:
        same_source = (existing.source_key, existing.source_scope) == (fresh.source_key, fresh.source_scope)
        redeclared = attrs.evolve(
            fresh,
            state=SubscriptionState.PENDING,
            checkpoint_seq=max(existing.checkpoint_seq, spec.after) if same_source else spec.after,
            revision=existing.revision + 1,
            created_at_ms=existing.created_at_ms,
        )
        return redeclared, existing
    raise Conflict(
        f"subscription {existing.name} already exists ({existing.state}, wait {existing.wait_id}) with "
        "another declaration"
    )


def declare_in_tx(
    tx: Tx,
    now_ms: int,
    work: Work,
    spec: SubscriptionSpec,
    *,
    dependent_key: str | None,
    wait_id: str | None,
    state: SubscriptionState,
    field: str = "subscription",
) -> Subscription:
    """Store the declaration of ``spec`` by ``work`` (see `plan_declaration_in_tx` for the rules)."""
    record, existing = plan_declaration_in_tx(
        tx, now_ms, work, spec, dependent_key=dependent_key, wait_id=wait_id, state=state, field=field
    )
    if existing is record:
        return record
    if existing is None:
        tx.insert_subscription(record)
    else:
        tx.redeclare_subscription(existing, record)
    tx.notify(SubscriptionChanged(namespace=record.namespace, id=record.id, source_key=record.source_key))
    return record
