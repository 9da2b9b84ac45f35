"""Starting attempts: admission passes over the ready queue (`kernel.admission`).

The database decides what starts next; this part only decides when to ask. A pass is made whenever a
Work may have become startable (`WorkReady`: it joined the ready queue, a capacity slot freed, the
configuration changed, or another node says so) and again while a pass finds more than it may take at
once. Passes are coalesced: one runs at a time, and a notice while it runs makes one more.

A first start goes to the start gates (outside any transaction) before it is claimed: the pass hands
such Works back, each gate is asked in a task of its own, and the Work is then held with the gate's
reason or started through the same claim (`admission.start_in_tx`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..kernel.admission import Admission, AdmitRequest, admit_in_tx, start_in_tx
from ..kernel.control import hold_in_tx
from ..kernel.executions import BindingRef
from ..records.errors import Conflict
from ..records.seeds import token_seed
from ..records.work import Lease, Work
from .gates import ask_start_gates
from .shared import Shared

log = logging.getLogger("loom.starter")

LaunchHook = Callable[[Lease, str], None]
"""Called with each new lease and the executor name it runs under."""

PASS_LIMIT = 64
"""Attempts one pass starts at most (the next pass goes on where it stopped)."""


def admit_request(shared: Shared, *, limit: int = 1, skip: frozenset[str] = frozenset()) -> AdmitRequest:
    """What this runtime's admission passes (and the starts that commit with a route or a completion)
    claim with: its owner and lease length, the executors it launches, whether start gates are asked.
    A draining runtime (`Draining`) starts nothing: its requests' limit is 0."""
    extensions = shared.extensions
    return AdmitRequest(
        config=shared.config(),
        owner=shared.owner,
        lease_ms=shared.lease_ms,
        limit=0 if shared.draining.on else limit,
        token_seed=token_seed(),
        advertised=extensions.advertised(),
        executors=frozenset(extensions.executors),
        gated=bool(extensions.start_gates),
        skip=skip,
        sole=not shared.storage.shared,
    )


class Starter:
    def __init__(self, shared: Shared, launch: LaunchHook) -> None:
        self._s = shared
        self._launch = launch
        self._again = False
        self._passing = False
        self._gating: set[str] = set()
        """Works whose start gates are being asked now (a pass goes by them)."""
        self._elsewhere: set[str] = set()
        """Works whose executor is not installed here, left to other nodes (forgotten at each check
        of a shared database and at each new configuration, so a pass looks at them again)."""

    def forget_elsewhere(self) -> None:
        """Look again at Works left to other nodes (they may have gone, or the configuration changed)."""
        self._elsewhere.clear()

    def kick(self) -> None:
        """Make a pass soon (coalesced with one that is running or due); none while the runtime drains
        (what is ready stays queued for the next open)."""
        if self._s.draining.on:
            return
        self._again = True
        if not self._passing:
            self._passing = True
            self._s.activity.spawn(self._passes)

    def request(self, *, limit: int = PASS_LIMIT) -> AdmitRequest:
        return admit_request(self._s, limit=limit, skip=frozenset(self._gating | self._elsewhere))

    async def _passes(self) -> None:
        try:
            while self._again and not self._s.draining.on:
                self._again = False
                admission: Admission = await self._s.storage.submit(admit_in_tx, self.request())
                self._elsewhere.update(admission.elsewhere)
                for started in admission.started:
                    self._launch(started.lease, started.executor or "")
                for work, binding in admission.gate:
                    if work.id not in self._gating:
                        self._gating.add(work.id)
                        self._s.activity.spawn(self._gate_then_start, work, binding)
                if admission.more:
                    self._again = True
        finally:
            self._passing = False

    async def _gate_then_start(self, work: Work, binding: BindingRef) -> None:
        """Ask the start gates about a first start; hold the Work with a gate's reason, or start it."""
        storage = self._s.storage
        try:
            reason = await ask_start_gates(storage, self._s.extensions, work, log)
            if reason is not None:
                try:
                    await storage.submit(hold_in_tx, work.id, reason)
                except Conflict:
                    pass  # it ended meanwhile
                return
            if self._s.draining.on:
                return  # it stays queued: the next open asks its gates again
            try:
                lease = await storage.submit(start_in_tx, work.id, self.request(limit=1), binding)
            except Conflict:
                return  # it ended meanwhile
            if isinstance(lease, Conflict):
                return  # full, held for its budget or changed meanwhile: the next pass sees it
            self._launch(lease, lease.request.executor or "")
        finally:
            self._gating.discard(work.id)
            self.kick()
