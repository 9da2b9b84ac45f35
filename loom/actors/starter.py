"""Starting attempts: after a Work changes, check whether it can start, ask the start gates, and claim
(one nonterminal attempt per Work, scope capacity checked before the claim).

One checker runs per Work at a time; a change while it runs makes it check again. A claim refused for
scope capacity is rechecked when some Work changes (a slot may have been freed).
"""

from __future__ import annotations

import inspect
import logging
import secrets
from collections.abc import Callable

from ..kernel.budgets import BudgetExceeded, budget_hold_in_tx
from ..kernel.control import hold_in_tx
from ..kernel.executions import BindingRef, binding_for_in_tx, claim_in_tx, claim_request, claimable
from ..records.errors import Conflict, StorageError
from ..records.events import DiagnosticKind
from ..records.work import Lease, Work
from .shared import Shared
from .supervision import contained, describe

log = logging.getLogger("loom.starter")

LaunchHook = Callable[[Lease, str], None]
"""Called with each new lease and the executor name it runs under."""


class Starter:
    def __init__(self, shared: Shared, launch: LaunchHook) -> None:
        self._s = shared
        self._launch = launch
        self._checking: set[str] = set()
        self._dirty: set[str] = set()
        self._deferred: set[str] = set()
        """Works whose claim scope capacity refused: rechecked when some Work changes."""

    def kick(self, work_id: str) -> None:
        """Check whether ``work_id`` can start an attempt (coalesced: one checker per Work)."""
        if work_id in self._checking:
            self._dirty.add(work_id)
            return
        self._checking.add(work_id)
        self._s.activity.spawn(self._check_work, work_id)

    def on_work_changed(self, work_id: str) -> None:
        self.kick(work_id)
        deferred, self._deferred = self._deferred, set()
        for deferred_id in deferred:
            self.kick(deferred_id)

    async def resync(self) -> None:
        """Check every ready Work in the store (at start, and after a lagging feed)."""
        last = ""
        while works := await self._s.reader.works(state="ready", after_id=last, limit=500):
            for work in works:
                self.kick(work.id)
            last = works[-1].id

    async def _check_work(self, work_id: str) -> None:
        try:
            while True:
                self._dirty.discard(work_id)
                await self._maybe_start(work_id)
                if work_id not in self._dirty:
                    return
        finally:
            self._checking.discard(work_id)

    async def binding_for(self, work: Work) -> BindingRef | None:
        """The binding ``work``'s next attempt runs with (see `binding_for_in_tx`)."""
        config = self._s.config()
        return await self._s.storage.submit(
            binding_for_in_tx, work.id, config, self._s.extensions.advertised()
        )

    async def _maybe_start(self, work_id: str) -> None:
        work = await self._s.reader.work(work_id)
        if work is None or claimable(work) is not None:
            return
        try:
            binding = await self.binding_for(work)
        except StorageError:
            raise
        except Exception as exc:
            await self._hold(work, DiagnosticKind.START_FAILED, "core", "binding", describe(exc), exc)
            return
        if (
            binding is None
            or binding.executor is None
            or binding.executor not in self._s.extensions.executors
        ):
            return
        executor = binding.executor
        if not work.started and not work.released:
            held = await self._gate(work)
            if held is not None:
                try:
                    await self._s.storage.submit(hold_in_tx, work.id, held)
                except Conflict:
                    pass
                return
        config = self._s.config()
        request = claim_request(
            config,
            work,
            owner=self._s.owner,
            token=secrets.token_urlsafe(24),
            lease_ms=self._s.lease_ms,
            binding=binding,
        )
        try:
            lease = await self._s.storage.submit(claim_in_tx, request)
        except BudgetExceeded:
            # the turn does not start: the Work is held with the reason until released or the limit rises
            await self._s.storage.submit(budget_hold_in_tx, work.id, config.budgets)
            return
        except Conflict:
            if request.capacity is not None:
                self._deferred.add(work.id)
            return
        except StorageError:
            raise
        except Exception as exc:
            await self._hold(work, DiagnosticKind.START_FAILED, "core", "claim", describe(exc), exc)
            return
        self._launch(lease, lease.request.executor or executor)

    async def _gate(self, work: Work) -> str | None:
        """Ask the start gates (outside any transaction) whether to hold a first start: the hold's
        reason, or ``None``. A gate that raises or answers something that is not a reason holds the
        Work too, saying so (a person can fix the gate and release)."""
        for name, gate in sorted(self._s.extensions.start_gates.items()):
            try:
                reason = gate(work)
                if inspect.isawaitable(reason):
                    reason = await reason
            except Exception as exc:
                return await self._gate_failed(work, name, describe(exc), exc)
            if reason is None or reason is False or reason == "":
                continue
            if not isinstance(reason, str):
                return await self._gate_failed(
                    work, name, f"answered {type(reason).__name__}, not a reason", None
                )
            return f"start gate {name}: {reason}"
        return None

    async def _gate_failed(self, work: Work, name: str, reason: str, exc: BaseException | None) -> str:
        await contained(
            self._s.storage,
            DiagnosticKind.GATE_FAILED,
            plugin=f"start gate {name}",
            hook="check",
            item=work.id,
            reason=reason,
            exc=exc,
            logger=log,
        )
        return f"start gate {name} failed: {reason}; fix the gate, then release the hold"

    async def _hold(
        self, work: Work, kind: DiagnosticKind, plugin: str, hook: str, reason: str, exc: BaseException | None
    ) -> None:
        """Starting failed for a reason no retry fixes: hold the Work with it, and say so."""
        await contained(
            self._s.storage, kind, plugin=plugin, hook=hook, item=work.id, reason=reason, exc=exc, logger=log
        )
        try:
            await self._s.storage.submit(
                hold_in_tx, work.id, f"could not start an attempt: {reason}; release the hold to try again"
            )
        except Conflict:
            pass
