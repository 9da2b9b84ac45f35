"""The subscription part of `Tx`: stored subscriptions, their lifecycle-checked state writes, the source
scan, and the deactivations a wait's wake, block, release and cancel apply to the subscriptions it
declared (so `kernel.waits` needs no import of `kernel.subscriptions`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..records.errors import IllegalTransition
from ..records.events import Event
from ..records.subscriptions import SUBSCRIPTION_LIFECYCLE, Subscription, SubscriptionState
from . import _sql
from ._tx_base import TxBase

SUBSCRIPTION_COLUMNS = (
    "namespace, id, work_id, dependent_key, wait_id, source_key, source_scope, target_scope, types,"
    " after_seq, filter_name, filter, label, state, checkpoint_seq, revision, authorized, reason,"
    " created_at_ms, updated_at_ms"
)
SUBSCRIPTION_SELECT = f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions"
LIVE = f"('{SubscriptionState.PENDING.value}', '{SubscriptionState.ACTIVE.value}')"
WAIT_SUBSCRIPTIONS_EXIST = "SELECT EXISTS (SELECT 1 FROM subscriptions WHERE wait_id IS NOT NULL)"
_OPEN = f"('{SubscriptionState.PENDING.value}', '{SubscriptionState.ACTIVE.value}', '{SubscriptionState.DISABLED.value}')"


def subscription_from_row(row: tuple[Any, ...]) -> Subscription:
    return Subscription(
        namespace=row[0],
        id=row[1],
        work_id=row[2],
        dependent_key=row[3],
        wait_id=row[4],
        source_key=row[5],
        source_scope=row[6],
        target_scope=row[7],
        types=tuple(json.loads(row[8])),
        after=row[9],
        filter_name=row[10],
        filter=json.loads(row[11]) if row[11] is not None else None,
        label=row[12],
        state=SubscriptionState(row[13]),
        checkpoint_seq=row[14],
        revision=row[15],
        authorized=None if row[16] is None else bool(row[16]),
        reason=row[17],
        created_at_ms=row[18],
        updated_at_ms=row[19],
    )


def _values(sub: Subscription) -> tuple[Any, ...]:
    return (
        sub.namespace,
        sub.id,
        sub.work_id,
        sub.dependent_key,
        sub.wait_id,
        sub.source_key,
        sub.source_scope,
        sub.target_scope,
        json.dumps(list(sub.types)),
        sub.after,
        sub.filter_name,
        json.dumps(dict(sub.filter), sort_keys=True) if sub.filter is not None else None,
        sub.label,
        sub.state.value,
        sub.checkpoint_seq,
        sub.revision,
        None if sub.authorized is None else int(sub.authorized),
        sub.reason,
        sub.created_at_ms,
        sub.updated_at_ms,
    )


class SubscriptionsTx(TxBase):
    def subscription(self, namespace: str, id: str) -> Subscription | None:
        row = self._one(f"{SUBSCRIPTION_SELECT} WHERE namespace = ? AND id = ?", (namespace, id))
        return subscription_from_row(row) if row else None

    def insert_subscription(self, sub: Subscription) -> None:
        """Store a new subscription (pending, or installed as active)."""
        if sub.state not in (SubscriptionState.PENDING, SubscriptionState.ACTIVE):
            raise IllegalTransition(
                f"subscription {sub.name}: a new one starts pending or active, not {sub.state}"
            )
        marks = ", ".join("?" for _ in range(20))
        self._conn.execute(
            f"INSERT INTO subscriptions ({SUBSCRIPTION_COLUMNS}) VALUES ({marks})", _values(sub)
        )
        self._subscription_written(sub)

    def redeclare_subscription(self, old: Subscription, new: Subscription) -> None:
        """Replace ``old`` (as it was read) with a new declaration of the same identity: a later wait of
        the same Work declares it again. Checked against the lifecycle, one revision later."""
        SUBSCRIPTION_LIFECYCLE.check(old.name, old.state, new.state)
        assert (new.namespace, new.id, new.revision) == (old.namespace, old.id, old.revision + 1)
        sets = ", ".join(f"{name.strip()} = ?" for name in SUBSCRIPTION_COLUMNS.split(",")[2:])
        cur = self._conn.execute(
            f"UPDATE subscriptions SET {sets} WHERE namespace = ? AND id = ? AND state = ? AND revision = ?",
            (*_values(new)[2:], old.namespace, old.id, old.state.value, old.revision),
        )
        self._written(cur, f"subscription {old.name}", old.state, new.state)
        self._subscription_written(new)

    def set_subscription_state(
        self, sub: Subscription, new: SubscriptionState, now_ms: int, *, reason: str | None = None
    ) -> None:
        """Move ``sub`` from the state it was read in to ``new`` (checked against its lifecycle); the
        revision moves on, so an authorisation asked about the old one no longer covers it."""
        SUBSCRIPTION_LIFECYCLE.check(sub.name, sub.state, new)
        cur = self._conn.execute(
            "UPDATE subscriptions SET state = ?, reason = ?, revision = revision + 1, updated_at_ms = ?"
            " WHERE namespace = ? AND id = ? AND state = ?",
            (new.value, reason, now_ms, sub.namespace, sub.id, sub.state.value),
        )
        self._written(cur, f"subscription {sub.name}", sub.state, new)
        self._subscription_written(sub)

    def record_subscription_answer(
        self, sub: Subscription, now_ms: int, *, authorized: bool | None, reason: str | None
    ) -> None:
        """Keep the last authorisation answer and why it emits nothing now (neither is a declaration
        change: the revision stays)."""
        self._conn.execute(
            "UPDATE subscriptions SET authorized = ?, reason = ?, updated_at_ms = ? WHERE namespace = ? AND id = ?",
            (None if authorized is None else int(authorized), reason, now_ms, sub.namespace, sub.id),
        )

    def advance_subscription_checkpoint(self, sub: Subscription, seq: int, now_ms: int) -> None:
        """Every source Event up to ``seq`` is decided (aliased, filtered out or refused); it never moves
        back."""
        self._conn.execute(
            "UPDATE subscriptions SET checkpoint_seq = CASE WHEN checkpoint_seq > ? THEN checkpoint_seq"
            " ELSE ? END, updated_at_ms = ? WHERE namespace = ? AND id = ?",
            (seq, seq, now_ms, sub.namespace, sub.id),
        )

    def subscriptions_of_work(self, work_id: str) -> list[Subscription]:
        rows = self._all(f"{SUBSCRIPTION_SELECT} WHERE work_id = ? ORDER BY namespace, id", (work_id,))
        return [subscription_from_row(r) for r in rows]

    def live_subscriptions(
        self, after: tuple[str, str], limit: int, *, wrapped: bool = False
    ) -> list[Subscription]:
        """Pending and active subscriptions in identity order: those after ``after`` (or, once
        ``wrapped``, those up to it)."""
        op = "<=" if wrapped else ">"
        rows = self._all(
            f"{SUBSCRIPTION_SELECT} WHERE state IN {LIVE} AND (namespace, id) {op} (?, ?)"
            " ORDER BY namespace, id LIMIT ?",
            (after[0], after[1], limit),
        )
        return [subscription_from_row(r) for r in rows]

    def live_subscriptions_on_keys(self, keys: Sequence[str]) -> list[Subscription]:
        """Pending and active subscriptions whose source is one of ``keys`` (the source index)."""
        found: list[Subscription] = []
        for key in dict.fromkeys(keys):
            rows = self._all(
                f"{SUBSCRIPTION_SELECT} WHERE source_key = ? AND state IN {LIVE} ORDER BY namespace, id",
                (key,),
            )
            found.extend(subscription_from_row(r) for r in rows)
        return found

    def source_events(self, scope: str, key: str, after_seq: int, limit: int) -> list[Event]:
        """Accepted Events on ``key`` in ``scope`` after ``after_seq``, in sequence order."""
        rows = self._all(
            f"SELECT {_sql.EVENT_COLUMNS} FROM events e"
            " WHERE e.scope = ? AND e.key = ? AND e.seq > ? ORDER BY e.seq LIMIT ?",
            (scope, key, after_seq, limit),
        )
        return [_sql.event_from_row(r) for r in rows]

    # -- what a wait's wake, block, release and cancel do to its subscriptions ----------------------

    def end_subscriptions_of_wait(
        self, wait_id: str, new: SubscriptionState, reason: str, now_ms: int
    ) -> list[Subscription]:
        """Move every open subscription the wait declared to ``new`` (woken or disabled). Where no wait
        has declared one (read once per transaction on a database alone, as `waits_exist`), nothing is
        read: most waits declare none, and each wake asks."""
        if not self.wait_subscriptions_exist():
            return []
        rows = self._all(f"{SUBSCRIPTION_SELECT} WHERE wait_id = ? AND state IN {LIVE}", (wait_id,))
        subs = [subscription_from_row(r) for r in rows]
        for sub in subs:
            self.set_subscription_state(sub, new, now_ms, reason=reason)
        return subs

    def wait_subscriptions_exist(self) -> bool:
        """Whether any wait may have declared a subscription (any state: a cheap read of one partial
        index). Read once per transaction on a database alone, then only its own writes say yes again;
        on a shared database another node may declare one at any time: always true there."""
        if not self._caching:
            return True
        if self._wait_subscriptions is None:
            self._wait_subscriptions = self._one(WAIT_SUBSCRIPTIONS_EXIST) == (1,)
        return self._wait_subscriptions

    def _subscription_written(self, sub: Subscription) -> None:
        """This transaction wrote ``sub`` (any state: a wait's subscription may be ended later in it)."""
        if sub.wait_id is not None and self._wait_subscriptions is not None:
            self._wait_subscriptions = True

    def rearm_subscriptions_of_wait(self, wait_id: str, reason: str, now_ms: int) -> list[Subscription]:
        """The wait's blocked subscriptions go back to pending: the next reconcile pass installs them."""
        rows = self._all(
            f"{SUBSCRIPTION_SELECT} WHERE wait_id = ? AND state = ?",
            (wait_id, SubscriptionState.DISABLED.value),
        )
        subs = [subscription_from_row(r) for r in rows]
        for sub in subs:
            self.set_subscription_state(sub, SubscriptionState.PENDING, now_ms, reason=reason)
        return subs

    def cancel_subscriptions_of_work(self, work_id: str, reason: str, now_ms: int) -> None:
        """Every subscription of the Work that could still emit ends (its Work was cancelled)."""
        rows = self._all(f"{SUBSCRIPTION_SELECT} WHERE work_id = ? AND state IN {_OPEN}", (work_id,))
        for sub in (subscription_from_row(r) for r in rows):
            self.set_subscription_state(sub, SubscriptionState.CANCELLED, now_ms, reason=reason)
