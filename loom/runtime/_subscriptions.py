"""The subscription part of the `Runtime` handle: subscribing a Work to another Work's key, the bounded
host pass `reconcile_subscriptions`, and reads (docs/concepts.md, "Subscription").

The alias authoriser is asked here, outside storage, about the subscription as it will be stored; the
kernel installs and backscans under that answer only if nothing changed in between.
"""

from __future__ import annotations

from ..actors.reconciler import authorize, log_failures, reconcile
from ..kernel.subscriptions import (
    MAX_RECONCILE,
    Reconciled,
    due_subscriptions_in_tx,
    planned_subscription_in_tx,
    subscribe_in_tx,
)
from ..records.errors import NotFound
from ..records.subscriptions import ReconcileReport, Subscription, SubscriptionSpec
from ..records.validation import MAX_KEY_LEN, check_int, check_subscription_spec, check_text
from ._base import RuntimeBase, lookup


class Subscriptions(RuntimeBase):
    async def subscribe(
        self, work_id: str, spec: SubscriptionSpec, *, dependent_key: str | None = None
    ) -> Subscription:
        """Subscribe Work ``work_id`` to ``spec.source_key``, a key another Work owns (trusted host call):
        each matching source Event becomes one alias Event on ``dependent_key`` (default: the Work's
        first key), which the Work owns. Installs it and scans the source history in one transaction;
        subscribing again with the same declaration returns the stored one.

        A source in another scope needs ``loom_authorize_alias``'s consent, asked now and on every
        reconcile pass; without it the subscription is stored but publishes nothing."""
        lookup("work_id", work_id)
        check_subscription_spec("subscription", spec)
        if dependent_key is not None:
            check_text("dependent_key", dependent_key, max_len=MAX_KEY_LEN)
        p = self._p
        planned: Subscription = await self._submit(planned_subscription_in_tx, work_id, spec, dependent_key)
        authorization = await authorize(p.storage, p.extensions, planned) if planned.cross_scope else None
        result: Reconciled = await self._submit(
            subscribe_in_tx,
            work_id,
            spec,
            dependent_key,
            authorization,
            p.extensions.alias_filters,
            p.config().causal,
        )
        log_failures(result.failures)
        assert result.subscription is not None
        return result.subscription

    async def reconcile_subscriptions(self, limit: int = 100) -> ReconcileReport:
        """One bounded host pass: visit up to ``limit`` pending and active subscriptions from the durable
        cursor (so idle ones cannot starve the others), installing pending ones and publishing new
        aliases. The subscription actor does the same on its own; this is for hosts that drive the
        runtime themselves (``actors=()``), and is safe alongside it."""
        check_int("limit", limit, 1, MAX_RECONCILE)
        p = self._p
        subs: list[Subscription] = await self._submit(due_subscriptions_in_tx, limit)
        return await reconcile(p.storage, p.extensions, p.config().causal, subs)

    async def subscriptions(self, work_id: str) -> list[Subscription]:
        """The Work's subscriptions, by identity, whatever their state."""
        lookup("work_id", work_id)
        return await self._p.reader.subscriptions_of_work(work_id)

    async def subscription(self, namespace: str, id: str) -> Subscription:
        lookup("namespace", namespace)
        lookup("id", id)
        found = await self._p.reader.subscription(namespace, id)
        if found is None:
            raise NotFound(f"no subscription {namespace}/{id}")
        return found
