"""The subscription reconciler: reconcile passes driven by commit notices (docs/architecture.md,
"Dependency subscriptions and alias Events").

It owns no rule (those are in `kernel.subscriptions`): it chooses which subscriptions a pass visits,
asks the alias authoriser about the cross-scope ones outside any transaction, and submits
``reconcile_in_tx``. A declared, installed or rearmed subscription (`SubscriptionChanged`) and a new
Event on a key some subscription watches each trigger a pass over just those; at start, and whenever
the feed lags, it sweeps every pending and active one (so a subscription declared with a wait just
before a crash is installed after the restart). `Runtime.reconcile_subscriptions` makes the same kind
of pass, bounded and fair by the durable cursor, for hosts that drive the runtime themselves.

A failing plugin (an authoriser or filter that raises or answers nonsense) is contained: an ERROR log
with its traceback, a durable diagnostic, that subscription skipped this pass, the others go on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence

import trio

from ..config import CausalLimits
from ..kernel.subscriptions import (
    PluginFailure,
    due_subscriptions_in_tx,
    live_subscriptions_in_tx,
    reconcile_in_tx,
    subscriptions_for_in_tx,
)
from ..plugins.registry import Extensions
from ..records.core_events import CORE_PREFIX
from ..records.events import DiagnosticKind
from ..records.notices import EventAccepted, Lagged, Notice, StoreChanged, SubscriptionChanged
from ..records.subscriptions import AliasAuthorization, ReconcileReport, Subscription
from ..store import NoticeFeed, StorageActor
from .activity import Progress
from .supervision import contained, describe

log = logging.getLogger("loom.subscriptions")

PAGE = 100
"""Subscriptions one pass visits at most (one storage request, authorisation asked before it)."""


async def authorize(
    storage: StorageActor, extensions: Extensions, sub: Subscription
) -> AliasAuthorization | None:
    """Ask ``loom_authorize_alias`` about one cross-scope subscription, outside storage. No answer
    (no plugin, or every plugin answers ``None``) is a refusal. ``None``: the authoriser raised or
    answered nonsense (contained); the subscription is skipped this pass."""
    hook = extensions.authorize_alias
    answer: object = None
    try:
        if hook is not None:
            answer = hook(source_scope=sub.source_scope, target_scope=sub.target_scope, subscription=sub)
            if inspect.isawaitable(answer):
                answer = await answer
    except Exception as exc:
        await _contained(storage, sub, f"raised {describe(exc)}", exc)
        return None
    if answer is not None and not isinstance(answer, bool):
        await _contained(storage, sub, f"answered {type(answer).__name__}, not true, false or None", None)
        return None
    if answer is True:
        reason = "allowed by loom_authorize_alias"
    elif answer is False:
        reason = "loom_authorize_alias refused it"
    else:
        reason = "no loom_authorize_alias plugin answered (no opinion is a refusal)"
    return AliasAuthorization(
        namespace=sub.namespace,
        id=sub.id,
        revision=sub.revision,
        source_scope=sub.source_scope,
        target_scope=sub.target_scope,
        allowed=answer is True,
        reason=reason,
    )


async def _contained(
    storage: StorageActor, sub: Subscription, reason: str, exc: BaseException | None
) -> None:
    await contained(
        storage,
        DiagnosticKind.SUBSCRIPTION_FAILED,
        plugin="alias authoriser",
        hook="loom_authorize_alias",
        item=sub.name,
        reason=reason,
        exc=exc,
        logger=log,
    )


def log_failures(failures: Sequence[PluginFailure]) -> None:
    for failure in failures:
        exc = failure.exc
        log.error(
            "subscription %s skipped this pass: %s",
            failure.subscription,
            failure.reason,
            exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None,
        )


async def reconcile(
    storage: StorageActor, extensions: Extensions, limits: CausalLimits, subs: Sequence[Subscription]
) -> ReconcileReport:
    """One pass over ``subs``: authorise the cross-scope ones (outside storage, every pass), then
    reconcile them all in one storage request, each visit atomic with its aliases and wakes."""
    answers: dict[str, AliasAuthorization] = {}
    for sub in subs:
        if sub.cross_scope:
            answer = await authorize(storage, extensions, sub)
            if answer is not None:
                answers[sub.name] = answer
    result = await storage.submit(reconcile_in_tx, list(subs), answers, extensions.alias_filters, limits)
    log_failures(result.failures)
    return result.report


def _identity(name: str) -> tuple[str, str]:
    namespace, _, id = name.partition("/")  # a namespace holds no "/"
    return namespace, id


class SubscriptionReconciler:
    def __init__(
        self, storage: StorageActor, extensions: Extensions, *, limits: Callable[[], CausalLimits]
    ) -> None:
        self._storage = storage
        self._extensions = extensions
        self._limits = limits
        self._watched: set[str] = set()
        """Source keys of pending and active subscriptions (a superset: a key found unwatched is dropped)."""
        self._dirty_keys: set[str] = set()
        self._dirty_names: set[tuple[str, str]] = set()
        self._sweep = True
        self._check = False
        """The periodic check of a shared database came round: one fair, bounded pass is due."""
        self._busy = False
        self._feed: NoticeFeed | None = None
        self._progress = Progress()

    @property
    def idle(self) -> bool:
        """No unread notice and no pass pending or running."""
        feed = self._feed
        return (
            not self._busy
            and not self._sweep
            and not self._check
            and not self._dirty_keys
            and not self._dirty_names
            and (feed is None or not feed.pending)
        )

    async def wait_idle(self) -> None:
        """Return once `idle` (a host's quiescence check)."""
        await self._progress.wait_until(lambda: self.idle)

    async def run(
        self, *, task_status: trio.TaskStatus[SubscriptionReconciler] = trio.TASK_STATUS_IGNORED
    ) -> None:
        feed = self._feed = self._storage.feed(capacity=4096, concerns=self._concerns)
        try:
            task_status.started(self)
            while True:
                while self._sweep or self._check or self._dirty_keys or self._dirty_names:
                    self._busy = True
                    try:
                        await self._pass()
                    finally:
                        self._busy = False
                self._progress.signal()
                for notice in await feed.next_batch():
                    self._on_notice(notice)
        except* trio.EndOfChannel:
            pass  # the storage actor stopped: the runtime is going down (the rest, if any, goes on)
        finally:
            self._storage.unsubscribe(feed)
            self._feed = None
            self._progress.signal()

    def _concerns(self, notices: list[Notice]) -> bool:
        """Whether a committed batch may give the reconciler work (`NoticeFeed.concerns`): a
        subscription changed, or an Event came on a key one watches (`_on_notice` is what it does
        with them). While a pass runs (it may be learning of new keys) every batch does."""
        if self._busy or self._sweep:
            return True
        watched = self._watched
        for notice in notices:
            if isinstance(notice, EventAccepted):
                if notice.event.key in watched:
                    return True
            elif isinstance(notice, SubscriptionChanged | Lagged | StoreChanged):
                return True
        return False

    def _on_notice(self, notice: Notice) -> None:
        if isinstance(notice, EventAccepted):
            event = notice.event
            if event.key in self._watched and not event.type.startswith(CORE_PREFIX):
                self._dirty_keys.add(event.key)
        elif isinstance(notice, SubscriptionChanged):
            self._watched.add(notice.source_key)
            self._dirty_names.add((notice.namespace, notice.id))
        elif isinstance(notice, Lagged) or (isinstance(notice, StoreChanged) and notice.everything):
            self._sweep = True
        elif isinstance(notice, StoreChanged):
            # another node's subscriptions: their new Events here need aliases too, and an Event this
            # node accepted before it heard of them is found by a pass over them
            self._watched.update(notice.subscription_keys)
            self._dirty_keys.update(notice.subscription_keys)
            self._check = self._check or notice.check

    async def _pass(self) -> None:
        if self._sweep:
            self._sweep = self._check = False
            await self._sweep_all()
            return
        if self._check:
            self._check = False
            due: list[Subscription] = await self._storage.submit(due_subscriptions_in_tx, PAGE)
            self._after(await reconcile(self._storage, self._extensions, self._limits(), due))
            return
        names = [self._dirty_names.pop() for _ in range(min(PAGE, len(self._dirty_names)))]
        keys = [self._dirty_keys.pop() for _ in range(min(PAGE, len(self._dirty_keys)))]
        subs: list[Subscription] = await self._storage.submit(subscriptions_for_in_tx, names, keys)
        self._watched.difference_update(set(keys) - {sub.source_key for sub in subs})
        self._after(await reconcile(self._storage, self._extensions, self._limits(), subs))

    async def _sweep_all(self) -> None:
        """Visit every pending and active subscription (at start, and after a lagging feed)."""
        self._watched.clear()
        after = ("", "")
        while True:
            page: list[Subscription] = await self._storage.submit(live_subscriptions_in_tx, after, PAGE)
            self._watched.update(sub.source_key for sub in page)
            if page:
                self._after(await reconcile(self._storage, self._extensions, self._limits(), page))
            if len(page) < PAGE:
                return
            after = (page[-1].namespace, page[-1].id)

    def _after(self, report: ReconcileReport) -> None:
        # a backlog longer than one visit continues in the next pass, after the others' turn
        self._dirty_names.update(_identity(name) for name in report.more)
