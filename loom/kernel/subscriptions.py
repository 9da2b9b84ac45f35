"""Dependency subscriptions: installation with a backscan, bounded fair reconcile passes, and alias
Events (docs/architecture.md, "Dependency subscriptions and alias Events").

A visit scans the source key's accepted history after the subscription's checkpoint. Each matching
source Event (its type passes, it is not a ``core.*`` control Event, the pure alias filter says yes)
becomes one alias Event: derived from the original (same causal chain and budget), published on the
dependent's key for the dependent Work, with the delivery identity ``(namespace/id, original id)`` and
a payload of lineage only. Accepting the alias, advancing the checkpoint and the wake it causes commit
together; a replay or a second pass finds the alias by its identity and adds nothing. A refused alias
is diagnosed and checkpointed past, so it is never retried in a loop. Woken and cancelled subscriptions
are never visited: they emit nothing.

Cross-scope aliases need ``loom_authorize_alias``'s consent. The hook runs outside storage (the
reconciler actor or the runtime asks it); its answer comes in as an `AliasAuthorization` naming the
revision and scopes it was asked about, and is used only while the subscription still matches them.
It is asked again on every pass, so a revoked consent stops new aliases at the next one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..config import CausalLimits
from ..records.core_events import CORE_PREFIX
from ..records.errors import InvalidRequest, NotFound
from ..records.events import CausalRejection, DiagnosticKind, Event, EventIn
from ..records.subscriptions import (
    LIVE_STATES,
    AliasAuthorization,
    AliasFilter,
    ReconcileReport,
    Subscription,
    SubscriptionSpec,
    SubscriptionState,
)
from ..records.validation import check_int, describe_exception, storable_text
from ..store import Tx
from ._common import require_work
from .accept import accept_derived_in_tx
from .dependencies import declare_in_tx, plan_declaration_in_tx
from .waits import type_matches, wake_on_key_in_tx

SUBSCRIPTIONS_NAMESPACE = "core.subscriptions"
RECONCILE_CURSOR = "reconcile_cursor"
SCAN_PAGE = 200
"""Source Events one visit decides at most; a longer backlog is reported as ``more``."""
MAX_RECONCILE = 10_000


@attrs.frozen(kw_only=True)
class PluginFailure:
    """An alias filter that raised or answered nonsense, kept for the caller to log with its
    traceback (the diagnostic is already committed)."""

    subscription: str
    reason: str
    exc: BaseException | None = attrs.field(default=None, eq=False)


@attrs.frozen(kw_only=True)
class Reconciled:
    """What a reconcile procedure did, and the plugin failures it contained."""

    report: ReconcileReport
    failures: tuple[PluginFailure, ...] = ()
    subscription: Subscription | None = None
    """The subscription `subscribe_in_tx` stored (as it is after its backscan)."""


@attrs.define
class _Pass:
    installed: list[str] = attrs.Factory(list)
    aliases: list[str] = attrs.Factory(list)
    refused: list[str] = attrs.Factory(list)
    skipped: list[str] = attrs.Factory(list)
    more: list[str] = attrs.Factory(list)
    failures: list[PluginFailure] = attrs.Factory(list)

    def result(self, visited: int, subscription: Subscription | None = None) -> Reconciled:
        report = ReconcileReport(
            visited=visited,
            installed=tuple(self.installed),
            aliases=tuple(self.aliases),
            refused=tuple(self.refused),
            skipped=tuple(self.skipped),
            more=tuple(self.more),
        )
        return Reconciled(report=report, failures=tuple(self.failures), subscription=subscription)


# -- pure decisions -------------------------------------------------------------------------------------


def alias_payload(sub: Subscription, original: Event) -> dict[str, Any]:
    """Lineage only: never the provider's body, which may not be readable in the dependent's scope."""
    return {"subscription": sub.name, "event": original.id, "source_type": original.type, "label": sub.label}


def alias_event(sub: Subscription, original: Event) -> EventIn:
    """The alias of ``original``: its type, on the dependent's key, for the dependent Work, with the
    stable delivery identity (``namespace/id``, original Event id)."""
    return EventIn(
        source=sub.name,
        delivery_id=original.id,
        type=original.type,
        scope=sub.target_scope,
        key=sub.dependent_key,
        work_id=sub.work_id,
        payload=alias_payload(sub, original),
    )


def is_candidate(sub: Subscription, event: Event) -> bool:
    """A source Event the subscription could alias (before its filter): its type passes, and it is not
    one of the runtime's own control Events."""
    return not event.type.startswith(CORE_PREFIX) and type_matches(sub.types, event.type)


# -- procedures -----------------------------------------------------------------------------------------


def subscribe_in_tx(
    tx: Tx,
    now_ms: int,
    work_id: str,
    spec: SubscriptionSpec,
    dependent_key: str | None,
    authorization: AliasAuthorization | None,
    filters: Mapping[str, AliasFilter],
    limits: CausalLimits,
) -> Reconciled:
    """Install a subscription of ``work_id`` (trusted host call) and backscan its source history in the
    same transaction. Subscribing again with the same declaration returns the stored one."""
    work = require_work(tx, work_id)
    sub = declare_in_tx(
        tx, now_ms, work, spec, dependent_key=dependent_key, wait_id=None, state=SubscriptionState.ACTIVE
    )
    acc = _Pass()
    _visit(tx, now_ms, sub, authorization, filters, limits, acc)
    return acc.result(1, tx.subscription(sub.namespace, sub.id))


def planned_subscription_in_tx(
    tx: Tx, now_ms: int, work_id: str, spec: SubscriptionSpec, dependent_key: str | None
) -> Subscription:
    """What `subscribe_in_tx` would store (or the identical one stored), without writing: what the
    authoriser of a cross-scope subscription is asked about before it is installed."""
    work = require_work(tx, work_id)
    planned, _ = plan_declaration_in_tx(
        tx, now_ms, work, spec, dependent_key=dependent_key, wait_id=None, state=SubscriptionState.ACTIVE
    )
    return planned


def due_subscriptions_in_tx(tx: Tx, now_ms: int, limit: int) -> list[Subscription]:
    """Up to ``limit`` pending and active subscriptions, fair across calls: a persisted cursor starts
    each call after the last subscription the previous one returned (wrapping around), so idle ones at
    the front cannot take every pass."""
    check_int("limit", limit, 1, MAX_RECONCILE)
    entry = tx.kv_get(SUBSCRIPTIONS_NAMESPACE, RECONCILE_CURSOR)
    cursor = (str(entry.value["namespace"]), str(entry.value["id"])) if entry else ("", "")
    subs = tx.live_subscriptions(cursor, limit)
    if len(subs) < limit:
        subs += tx.live_subscriptions(cursor, limit - len(subs), wrapped=True)
    if subs:
        last = subs[-1]
        tx.kv_put(
            SUBSCRIPTIONS_NAMESPACE, RECONCILE_CURSOR, {"namespace": last.namespace, "id": last.id}, now_ms
        )
    return subs


def subscriptions_for_in_tx(
    tx: Tx, now_ms: int, names: Sequence[tuple[str, str]], keys: Sequence[str]
) -> list[Subscription]:
    """The pending and active subscriptions named, and those whose source is one of ``keys``."""
    found: dict[tuple[str, str], Subscription] = {}
    for namespace, id in names:
        sub = tx.subscription(namespace, id)
        if sub is not None and sub.state in LIVE_STATES:
            found[namespace, id] = sub
    for sub in tx.live_subscriptions_on_keys(keys):
        found.setdefault((sub.namespace, sub.id), sub)
    return [found[name] for name in sorted(found)]


def live_subscriptions_in_tx(tx: Tx, now_ms: int, after: tuple[str, str], limit: int) -> list[Subscription]:
    """A page of pending and active subscriptions in identity order (a full sweep, not the cursor)."""
    return tx.live_subscriptions(after, limit)


def reconcile_in_tx(
    tx: Tx,
    now_ms: int,
    visits: Sequence[Subscription],
    authorizations: Mapping[str, AliasAuthorization],
    filters: Mapping[str, AliasFilter],
    limits: CausalLimits,
) -> Reconciled:
    """Visit each subscription (as chosen by `due_subscriptions_in_tx` or `subscriptions_for_in_tx`):
    install it if pending and publish its new aliases. ``authorizations`` holds the hook's answers by
    ``namespace/id`` for the cross-scope ones; each visit rereads the subscription, so one that ended
    or changed since it was chosen is judged as it is now."""
    acc = _Pass()
    for chosen in visits:
        sub = tx.subscription(chosen.namespace, chosen.id)
        if sub is not None:
            _visit(tx, now_ms, sub, authorizations.get(sub.name), filters, limits, acc)
    return acc.result(len(visits))


# -- one visit --------------------------------------------------------------------------------------------


def _visit(
    tx: Tx,
    now_ms: int,
    sub: Subscription,
    authorization: AliasAuthorization | None,
    filters: Mapping[str, AliasFilter],
    limits: CausalLimits,
    acc: _Pass,
) -> None:
    if sub.state not in LIVE_STATES:
        return  # woken, disabled or cancelled: it emits nothing
    work = require_work(tx, sub.work_id)
    if work.state.terminal:
        tx.set_subscription_state(
            sub, SubscriptionState.CANCELLED, now_ms, reason=f"its work is {work.state}"
        )
        return
    if sub.cross_scope:
        if authorization is None or not authorization.covers(sub):
            acc.skipped.append(sub.name)  # not asked about it as it is now: asked again next pass
            return
        if not authorization.allowed:
            _unauthorized(tx, now_ms, sub, authorization.reason)
            acc.skipped.append(sub.name)
            return
        if sub.authorized is not True:
            tx.record_subscription_answer(sub, now_ms, authorized=True, reason=None)
            sub = attrs.evolve(sub, authorized=True, reason=None)
    if sub.state is SubscriptionState.PENDING:
        tx.set_subscription_state(sub, SubscriptionState.ACTIVE, now_ms)
        acc.installed.append(sub.name)
        installed = tx.subscription(sub.namespace, sub.id)
        assert installed is not None
        sub = installed
    _scan(tx, now_ms, sub, filters, limits, acc)


def _scan(
    tx: Tx,
    now_ms: int,
    sub: Subscription,
    filters: Mapping[str, AliasFilter],
    limits: CausalLimits,
    acc: _Pass,
) -> None:
    """Decide the next page of source Events after the checkpoint, in sequence order."""
    chosen: AliasFilter | None = None
    if sub.filter_name is not None:
        chosen = filters.get(sub.filter_name)
        if chosen is None:
            _failed(tx, now_ms, sub, f"no alias filter named {sub.filter_name!r} is registered", None, acc)
            return
    checkpoint = sub.checkpoint_seq
    page = tx.source_events(sub.source_scope, sub.source_key, checkpoint, SCAN_PAGE)
    for event in page:
        if not is_candidate(sub, event):
            checkpoint = event.seq
            continue
        if chosen is not None:
            try:
                verdict: object = chosen(event, sub.filter)  # a plugin's answer: checked, not trusted
            except Exception as exc:
                tx.advance_subscription_checkpoint(sub, checkpoint, now_ms)
                why = f"alias filter {sub.filter_name!r} raised {describe_exception(exc)} on event {event.id}"
                _failed(tx, now_ms, sub, why, exc, acc)
                return
            if not isinstance(verdict, bool):
                tx.advance_subscription_checkpoint(sub, checkpoint, now_ms)
                why = f"alias filter {sub.filter_name!r} answered {type(verdict).__name__}, not true or false"
                _failed(tx, now_ms, sub, why, None, acc)
                return
            if not verdict:
                checkpoint = event.seq
                continue
        published = _publish(tx, now_ms, sub, event, limits, acc)
        checkpoint = event.seq
        if published:
            # acceptance, checkpoint and wake commit together; a wake ends the wait's subscriptions
            tx.advance_subscription_checkpoint(sub, checkpoint, now_ms)
            wake_on_key_in_tx(tx, now_ms, sub.dependent_key, limits)
            current = tx.subscription(sub.namespace, sub.id)
            if current is None or current.state is not SubscriptionState.ACTIVE:
                return
    tx.advance_subscription_checkpoint(sub, checkpoint, now_ms)
    if sub.reason is not None:
        tx.record_subscription_answer(sub, now_ms, authorized=sub.authorized, reason=None)
    if len(page) == SCAN_PAGE:
        acc.more.append(sub.name)


def _publish(
    tx: Tx, now_ms: int, sub: Subscription, original: Event, limits: CausalLimits, acc: _Pass
) -> bool:
    """Accept the alias of ``original``; ``False`` when it was refused or had been accepted before."""
    try:
        with tx.savepoint():
            alias = accept_derived_in_tx(tx, now_ms, alias_event(sub, original), original.id, limits)
    except (InvalidRequest, NotFound) as exc:
        _refused(tx, now_ms, sub, original, f"acceptance refused it: {exc}", acc)
        return False
    if isinstance(alias, CausalRejection):
        _refused(tx, now_ms, sub, original, alias.describe(), acc)
        return False
    if alias.duplicate:
        if alias.work_id != sub.work_id or alias.parent_id != original.id:
            _refused(
                tx,
                now_ms,
                sub,
                original,
                f"its delivery identity is taken by event {alias.id}, not an alias",
                acc,
            )
        return False  # aliased before (a replay, a second pass): nothing new
    acc.aliases.append(alias.id)
    return True


def _refused(tx: Tx, now_ms: int, sub: Subscription, original: Event, why: str, acc: _Pass) -> None:
    """A refused alias branch: diagnosed, and the caller checkpoints past it (no retry loop)."""
    message = storable_text(f"subscription {sub.name}: the alias of event {original.id} was refused: {why}")
    detail = {"subscription": sub.name, "event": original.id, "seq": original.seq}
    tx.add_diagnostic(DiagnosticKind.ALIAS_REFUSED, sub.name, message, detail, now_ms)
    acc.refused.append(original.id)


def _unauthorized(tx: Tx, now_ms: int, sub: Subscription, why: str) -> None:
    """No consent for a cross-scope alias: it publishes nothing (diagnosed when the answer changes)."""
    # (``why`` may quote an authoriser's answer: held to what every store keeps)
    reason = storable_text(
        f"not authorised to alias from scope {sub.source_scope!r} into {sub.target_scope!r}: {why}"
    )
    if sub.authorized is False and sub.reason == reason:
        return
    tx.record_subscription_answer(sub, now_ms, authorized=False, reason=reason)
    detail = {"subscription": sub.name, "source_scope": sub.source_scope, "target_scope": sub.target_scope}
    tx.add_diagnostic(
        DiagnosticKind.ALIAS_UNAUTHORIZED, sub.name, f"subscription {sub.name}: {reason}", detail, now_ms
    )


def _failed(tx: Tx, now_ms: int, sub: Subscription, why: str, exc: BaseException | None, acc: _Pass) -> None:
    """A filter failed: the subscription is skipped this pass (nothing past the checkpoint), the others
    go on. Diagnosed when the reason changes; the caller logs every failure."""
    acc.skipped.append(sub.name)
    acc.failures.append(PluginFailure(subscription=sub.name, reason=why, exc=exc))
    if sub.reason == why:
        return
    tx.record_subscription_answer(sub, now_ms, authorized=sub.authorized, reason=why)
    detail = {
        "subscription": sub.name,
        "hook": "loom_alias_filters",
        "filter": sub.filter_name,
        "reason": why,
    }
    tx.add_diagnostic(
        DiagnosticKind.SUBSCRIPTION_FAILED, sub.name, f"subscription {sub.name}: {why}", detail, now_ms
    )
