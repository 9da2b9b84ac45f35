"""The bounded passes of the `Runtime` handle, for hosts that drive the runtime themselves: starting
attempts (`claim` one Work, `admit` from the ready queue), `poll` (route, fire, recover),
`recover_expired` and `compact`. Each makes the same kernel pass the corresponding actor makes.
"""

from __future__ import annotations

import logging

import attrs

from ..actors.activity import Activity
from ..actors.compactor import sweep
from ..actors.gates import ask_start_gates
from ..actors.lanes import RoutingLanes
from ..actors.shared import Shared
from ..config.retention import MAX_BATCH
from ..kernel.admission import Admission, AdmitRequest, admit_in_tx, readmit_in_tx, start_in_tx
from ..kernel.budgets import rebudget_in_tx
from ..kernel.compaction import DEFAULT_LIMIT
from ..kernel.control import hold_in_tx
from ..kernel.diagnostics import record_diagnostic_in_tx
from ..kernel.executions import BindingRef, claimable
from ..kernel.firing import FirePass, fire_due_in_tx
from ..kernel.recovery import RecoverPass, recover_expired_in_tx
from ..kernel.timers import MAX_DUE
from ..records.compaction import CompactionReport
from ..records.errors import Conflict, InvalidRequest, NotFound
from ..records.events import DiagnosticKind
from ..records.seeds import token_seed
from ..records.timers import Firing
from ..records.validation import MAX_LEASE_MS, check_int, check_text
from ..records.work import Lease, Recovery
from ._base import DEFAULT_LEASE_MS, RuntimeBase, check_limit, lookup

log = logging.getLogger("loom.runtime")


@attrs.frozen(kw_only=True)
class PollReport:
    """What one `Runtime.poll` pass did."""

    routed: int
    """Events routed (or found already routed) in this pass."""
    firings: tuple[Firing, ...]
    failures: tuple[str, ...]
    recoveries: tuple[Recovery, ...] = ()
    """Expired attempts this pass claimed for recovery, for the host to relaunch, adopt
    (`Runtime.adopt`) or declare not adoptable (`Runtime.not_adoptable`)."""


class Passes(RuntimeBase):
    async def claim(
        self, work_id: str, *, owner: str, lease_ms: int = DEFAULT_LEASE_MS, binding: BindingRef | None = None
    ) -> Lease:
        """Start the Work's next attempt under a fresh lease, through the same claim as the admission
        pass: scope capacity and budgets apply, and a first start goes to the start gates (a gate's
        reason holds the Work, and the claim is refused with it).

        Without ``binding``, the attempt pins the binding of the route that routed its earliest
        pending input (or none: the host runs it itself). `Conflict` says why it cannot start now
        (`AtCapacity` for a full scope, `BudgetExceeded` after holding the Work for its budget).
        """
        lookup("work_id", work_id)
        check_text("owner", owner)
        check_int("lease_ms", lease_ms, 1, MAX_LEASE_MS)
        if binding is not None and not isinstance(binding, BindingRef):
            raise InvalidRequest(f"binding must be a BindingRef, got {type(binding).__name__}")
        work = await self._p.reader.work(work_id)
        if work is None:
            raise NotFound(f"no work with id {work_id!r}")
        extensions = self._p.extensions
        if extensions.start_gates and not work.started and not work.released and claimable(work) is None:
            reason = await ask_start_gates(self._p.storage, extensions, work, log)
            if reason is not None:
                await self._submit(hold_in_tx, work_id, reason)
                raise Conflict(f"cannot claim: work {work_id} is held: {reason}")
        started: Lease | Conflict = await self._submit(
            start_in_tx, work_id, self._admit_request(owner, lease_ms, 1), binding
        )
        if isinstance(started, Conflict):
            raise started
        return started

    async def admit(
        self, limit: int = 100, *, owner: str | None = None, lease_ms: int = DEFAULT_LEASE_MS
    ) -> list[Lease]:
        """One admission pass for a host that runs its own executors: start up to ``limit`` attempts from
        the head of the ready queue, in the order their Works became ready, under scope capacity and
        budgets (what the starter of a runtime with a router does). Each lease is the host's to run and
        complete; a Work nothing can start now is left for a later pass. First starts go through the start
        gates first."""
        check_limit(limit)
        if owner is not None:
            check_text("owner", owner)
        check_int("lease_ms", lease_ms, 1, MAX_LEASE_MS)
        await self._readmit()
        leases: list[Lease] = []
        gated: set[str] = set()
        while len(leases) < limit:
            request = attrs.evolve(
                self._admit_request(owner or self._p.owner, lease_ms, limit - len(leases)),
                skip=frozenset(gated),
            )
            admission: Admission = await self._submit(admit_in_tx, request)
            leases += [started.lease for started in admission.started]
            for work, binding in admission.gate:
                gated.add(work.id)
                reason = await ask_start_gates(self._p.storage, self._p.extensions, work, log)
                if reason is not None:
                    await self._submit(hold_in_tx, work.id, reason)
                    continue
                single = attrs.evolve(request, limit=1, token_seed=token_seed())
                lease: Lease | Conflict = await self._submit(start_in_tx, work.id, single, binding)
                if not isinstance(lease, Conflict):
                    leases.append(lease)
            if not admission.more and not admission.gate:
                break
        return leases

    async def _readmit(self) -> None:
        if self._p.readmit:
            self._p.readmit = False
            await self._submit(readmit_in_tx)

    def _admit_request(self, owner: str, lease_ms: int, limit: int) -> AdmitRequest:
        extensions = self._p.extensions
        return AdmitRequest(
            config=self._p.config(),
            owner=owner,
            lease_ms=lease_ms,
            limit=limit,
            token_seed=token_seed(),
            advertised=extensions.advertised(),
            executors=None,
            gated=bool(extensions.start_gates),
        )

    async def poll(self, limit: int = 100) -> PollReport:
        """One bounded host pass: unless the router actor runs, route up to ``limit`` unrouted Events (in
        acceptance order, from the routing watermark, running route handlers outside any transaction);
        fire up to ``limit`` due timers (earliest first: the timer actor's own pass); and, unless the
        recovery actor runs, claim up to ``limit`` attempts whose lease expired for recovery (see
        `recover_expired`). A concern whose actor runs is left to it: two routers would race for one
        lane. Starting attempts is `admit` (or `claim`).

        With no router, timer or recovery actor running, calling this in a loop drives the runtime. One
        item's failure is recorded as a safe diagnostic and the pass goes on; a storage failure is raised.
        """
        check_limit(limit)
        p = self._p
        recoveries = await self.recover_expired(limit) if p.recovery is None else []
        routed = 0
        if p.router is None:
            await self._submit(rebudget_in_tx, p.config().budgets)
            routed = await self._route_pass(limit)
        done: FirePass = await self._submit(
            fire_due_in_tx, min(limit, MAX_DUE), p.config().causal, p.extensions.recurrence_policies
        )
        firings: list[Firing] = []
        failures: list[str] = []
        for request, result in zip(done.requests, done.results, strict=True):
            if isinstance(result, str):
                message = f"timer {request.timer_id}: firing failed: {result}"
                failures.append(message)
                await self._submit(
                    record_diagnostic_in_tx, DiagnosticKind.POLL_ITEM_FAILED, request.timer_id, message, {}
                )
            else:
                firings.append(result)
        return PollReport(
            routed=routed, firings=tuple(firings), failures=tuple(failures), recoveries=tuple(recoveries)
        )

    async def recover_expired(self, limit: int = 100, *, owner: str | None = None) -> list[Recovery]:
        """Claim up to ``limit`` attempts whose lease has expired (fairly, by a durable cursor) for
        recovery by the caller, each at the next epoch with a new token (what the recovery actor does,
        for a host that runs its own executors). A live lease is never taken, and two recoverers never
        both win one attempt.

        Each `Recovery` is the caller's to finish: a ``relaunch`` runs the same attempt again under its
        lease; otherwise verify the process and `adopt` it, or declare it `not_adoptable` (it fails,
        and the retry policy applies). A recovery left alone is recovered again once its lease expires.
        """
        check_limit(limit)
        if owner is not None:
            check_text("owner", owner)
        done: RecoverPass = await self._submit(
            recover_expired_in_tx,
            limit,
            owner=owner or self._p.owner,
            token_seed=token_seed(),
            lease_ms=self._p.lease_ms,
            executors=frozenset(self._p.extensions.executors),
        )
        return list(done.recoveries)

    async def compact(self, limit: int = DEFAULT_LIMIT, *, dry_run: bool = False) -> CompactionReport:
        """One compaction sweep now (what the compaction actor does at each wake): executors forget the
        logs whose ``attempt_logs`` retention passed, then passes of up to ``limit`` rows per kind of
        row, each one short transaction, remove what ended once its retention passed and nothing refers
        to any more, until each kind of row was gone through once. Returns what it removed.

        With ``dry_run`` nothing is written and no executor is asked to forget anything: the same sweep
        runs in one transaction that is rolled back, and the report says what it would remove now
        (docs/operations.md)."""
        check_int("limit", limit, 1, MAX_BATCH)
        if not isinstance(dry_run, bool):
            raise InvalidRequest(f"dry_run must be true or false, got {dry_run!r}", field="dry_run")
        p = self._p
        return await sweep(
            p.storage,
            p.config(),
            p.extensions.executors,
            limit=limit,
            dry_run=dry_run,
            sole=not p.storage.shared,
        )

    async def _route_pass(self, limit: int) -> int:
        p = self._p
        shared = Shared(
            storage=p.storage,
            reader=p.actor_reader,
            config=p.config,
            extensions=p.extensions,
            clock=p.clock,
            activity=Activity(),
            owner=p.owner,
            lease_ms=p.lease_ms,
        )
        return await RoutingLanes(shared).route_pass(limit)
