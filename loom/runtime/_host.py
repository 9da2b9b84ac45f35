"""The trusted host API of the `Runtime` handle: executions for hosts that run their own executors,
operator controls, timers, and the bounded host pass `poll`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import attrs

from ..actors.toolbelt import RuntimeToolbelt
from ..kernel.authority import Authority
from ..kernel.continuation import enrich_waiting_in_tx
from ..kernel.control import cancel_in_tx, hold_in_tx, manual_interrupt_in_tx, release_in_tx
from ..kernel.executions import complete_in_tx, kind_policy, renew_in_tx
from ..kernel.firing import fire_timer_in_tx
from ..kernel.recovery import (
    adopt_in_tx,
    not_adoptable_in_tx,
    presented_lease_in_tx,
)
from ..kernel.replay import replay_in_tx
from ..kernel.retry import retry_in_tx
from ..kernel.time_floor import mark_time_in_tx
from ..kernel.timers import MAX_DUE, arm_in_tx, cancel_timer_in_tx, check_fire_request, due_in_tx
from ..records.errors import InvalidRequest
from ..records.events import Event
from ..records.timers import FireRequest, Firing, Timer, TimerSpec
from ..records.validation import (
    MAX_INT,
    MAX_KEY_LEN,
    MAX_LEASE_MS,
    check_int,
    check_lease,
    check_reason,
    check_text,
    validate_outcome,
)
from ..records.waits import Waiting, WaitSpec
from ..records.work import Execution, Intent, Lease, Outcome, Work
from ._base import DEFAULT_LEASE_MS, RuntimeBase, lookup

log = logging.getLogger("loom.runtime")


def _listed(field: str, value: object) -> tuple[Any, ...]:
    """A list or tuple argument as a tuple (the record it goes into checks its items)."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidRequest(f"{field} must be a list, got {type(value).__name__}")
    return tuple(value)


def _mapping(field: str, value: object) -> None:
    """A table argument (the record it goes into checks its keys and values)."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{field} must be a table, got {type(value).__name__}")


class Host(RuntimeBase):
    # -- executions (for hosts that run their own executors, and tests) --------------

    async def renew(self, lease: Lease, *, lease_ms: int = DEFAULT_LEASE_MS) -> Lease:
        """Extend the lease ``lease`` holds (`StaleAuthority` if it is no longer current)."""
        check_lease("lease", lease)
        check_int("lease_ms", lease_ms, 1, MAX_LEASE_MS)
        expires = await self._submit(renew_in_tx, Authority.of(lease), lease_ms)
        return attrs.evolve(lease, expires_at_ms=expires)

    async def complete(self, lease: Lease, outcome: Outcome) -> Execution:
        """Commit an attempt's outcome under its fence (`StaleAuthority` if the lease is stale)."""
        check_lease("lease", lease)
        validate_outcome(outcome)
        config = self._p.config()
        kind = kind_policy(config, lease.request.kind)
        execution: Execution = await self._submit(
            complete_in_tx, Authority.of(lease), outcome, kind, config.causal, config.budgets
        )
        self._ended_elsewhere(execution.id)
        return execution

    async def wait(
        self,
        lease: Lease,
        spec: WaitSpec | None = None,
        *,
        consumed_inputs: Sequence[str] = (),
        usage: Mapping[str, float] | None = None,
        artifacts: Sequence[str] = (),
    ) -> Execution:
        """End the attempt's active segment on a wait (trusted host call: the host observed its executor
        finish or suspend the segment). With a resume-capable binding the attempt parks and resumes at a
        higher epoch once woken; otherwise attempt N+1 continues with the winner. Registration scans
        accepted history and may wake at once. Same as ``complete(lease, Waiting(...))``."""
        if usage is not None:
            _mapping("usage", usage)
        outcome = Waiting(
            wait=spec if spec is not None else WaitSpec(),
            consumed_inputs=_listed("consumed_inputs", consumed_inputs),
            usage=dict(usage or {}),
            artifacts=_listed("artifacts", artifacts),
        )
        return await self.complete(lease, outcome)

    async def enrich_wait(
        self, lease: Lease, *, usage: Mapping[str, float] | None = None, artifacts: Sequence[str] = ()
    ) -> Execution:
        """Add usage and artifact references to a parked attempt's waiting result, without reviving its
        authority. A terminal waiting outcome (an attempt that ended on its wait) is final (`Conflict`);
        after the resume, the old epoch is stale (`StaleAuthority`)."""
        check_lease("lease", lease)
        if usage is not None:
            _mapping("usage", usage)
        listed = _listed("artifacts", artifacts)
        validate_outcome(Waiting(usage=dict(usage or {}), artifacts=listed), field="enrichment")
        execution: Execution = await self._submit(
            enrich_waiting_in_tx,
            Authority.of(lease),
            dict(usage or {}),
            listed,
            self._p.config().budgets,
            self._p.config().causal,
        )
        return execution

    async def lease_for(self, execution_id: str, token: str) -> Lease:
        """The lease of the running attempt ``execution_id``, for a caller that presents only its current
        token (an executor's subprocess calling the service's toolbelt). The token is compared in
        constant time; one that is not the attempt's current token (stale, another attempt's, or an
        attempt that is not running or does not exist) is `StaleAuthority`."""
        lookup("execution_id", execution_id)
        check_text("token", token, max_len=MAX_KEY_LEN)
        lease: Lease = await self._submit(presented_lease_in_tx, execution_id, token)
        return lease

    def toolbelt(self, lease: Lease, *, lease_ms: int = DEFAULT_LEASE_MS) -> RuntimeToolbelt:
        """The fenced toolbelt of the attempt ``lease`` holds (emit, child Work, timers, heartbeat).
        Its calls go through the call gates as an executor's do (docs/recovery.md "Gated calls"): a
        refused call raises `CallRefused`; one a gate turns into a wait parks the attempt and raises
        `CallParked`, and a runner here that launched it stops what still runs of it."""
        check_lease("lease", lease)
        check_int("lease_ms", lease_ms, 1, MAX_LEASE_MS)
        config = self._p.config()
        toolbelt = RuntimeToolbelt(
            self._p.storage,
            lease,
            limits=config.causal,
            generation=config.generation,
            lease_ms=lease_ms,
            policies=self._p.extensions.recurrence_policies,
            gates=self._p.extensions.call_gates,
            kind=kind_policy(config, lease.request.kind),
            budgets=config.budgets,
        )
        toolbelt.on_park = partial(self._ended_elsewhere, lease.execution_id)
        return toolbelt

    def _ended_elsewhere(self, execution_id: str) -> None:
        """An attempt ended by another path than its runner's own commit (a completion or a wait
        through a toolbelt a host built: the service's): a runner here that launched it finds its
        lease gone now, and stops what still runs of it, not at its next renewal."""
        held = self._p.held.get(execution_id)
        if held is not None:
            held()

    # -- operator controls ----------------------------------------------------------

    async def hold(self, work_id: str, *, reason: str) -> Work:
        """Hold Work: no attempt starts until it is released; its input keeps queueing."""
        lookup("work_id", work_id)
        check_reason("reason", reason)
        work: Work = await self._submit(hold_in_tx, work_id, reason)
        return work

    async def release(self, work_id: str) -> Work:
        """Release a hold; the next start goes through (start gates let it through once)."""
        lookup("work_id", work_id)
        work: Work = await self._submit(release_in_tx, work_id, self._p.config().causal)
        return work

    async def cancel(self, work_id: str) -> Work:
        """Cancel Work (terminal): every token of its attempts loses authority at this commit."""
        lookup("work_id", work_id)
        work: Work = await self._submit(cancel_in_tx, work_id)
        return work

    async def interrupt(
        self, work_id: str, *, reason: str = "operator interrupt", request_id: str | None = None
    ) -> Intent:
        """Interrupt the running attempt (``core.manual.interrupt``); the Work stays ready with its input."""
        lookup("work_id", work_id)
        check_reason("reason", reason)
        if request_id is not None:
            check_text("request_id", request_id)
        intent: Intent = await self._submit(
            manual_interrupt_in_tx,
            work_id,
            request_id or secrets.token_hex(8),
            reason,
            self._p.config().causal,
        )
        return intent

    async def retry(
        self, work_id: str, *, reason: str = "operator retry", request_id: str | None = None
    ) -> Event:
        """Request the next attempt now: a ``core.retry.requested`` Event clears a backoff or a spent
        budget (and its hold), cancels the old retry timer, resets the failure budget and becomes the
        next attempt's input. Refused while an attempt is live, while the Work waits (its wake starts
        the next attempt), or once the Work is terminal (`Conflict`)."""
        lookup("work_id", work_id)
        check_reason("reason", reason)
        if request_id is not None:
            check_text("request_id", request_id)
        requested: Event = await self._submit(
            retry_in_tx, work_id, request_id or secrets.token_hex(8), reason, self._p.config().causal
        )
        return requested

    async def replay(
        self, event_id: str, *, reason: str = "operator replay", request_id: str | None = None
    ) -> Event:
        """Route again an Event that stayed ``unrouted`` (a handler error, a key owned elsewhere, a failed
        apply), once, under the configuration in force now: it reaches its Work after the Events routed
        there meanwhile (an ``unrouted`` Event holds none back). Returns the ``core.replay.requested``
        control Event that records the request; repeating ``request_id`` returns it again. Any other
        checkpoint is final: `Conflict`."""
        lookup("event_id", event_id)
        check_reason("reason", reason)
        if request_id is not None:
            check_text("request_id", request_id)
        replayed: Event = await self._submit(
            replay_in_tx, event_id, request_id or secrets.token_hex(8), reason, self._p.config().causal
        )
        return replayed

    # -- timers ---------------------------------------------------------------------

    async def arm(self, spec: TimerSpec) -> Timer:
        """Arm a root timer (trusted: an independent schedule or an operator action).

        With ``interval_ms`` it recurs at a fixed interval; with ``recurrence`` (a policy kind
        such as ``cron``) and an opaque ``spec`` it recurs by that policy.
        """
        timer: Timer = await self._submit(arm_in_tx, spec, policies=self._p.extensions.recurrence_policies)
        return timer

    async def arm_recurring(self, spec: TimerSpec) -> Timer:
        """Arm a root timer that recurs every ``spec.interval_ms``; each occurrence has its own
        delivery identity ``{delivery_id}@{occurrence_ms}``."""
        if not isinstance(spec, TimerSpec):
            raise InvalidRequest(f"expected a TimerSpec, got {type(spec).__name__}")
        if spec.interval_ms is None:
            raise InvalidRequest("arm_recurring: timer.interval_ms is required")
        return await self.arm(spec)

    async def arm_recurrence(
        self,
        kind: str,
        spec: Mapping[str, Any],
        *,
        timer_id: str,
        fire_at_ms: int,
        source: str,
        type: str,
        scope: str,
        key: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Timer:
        """Arm a configured root timer whose recurrence policy ``kind`` (a plugin's, e.g. ``cron``)
        interprets the opaque ``spec`` at each firing."""
        _mapping("timer.spec", spec)  # (``type`` is an argument here: the checks live outside)
        if payload is not None:
            _mapping("timer.payload", payload)
        return await self.arm(
            TimerSpec(
                id=timer_id,
                fire_at_ms=fire_at_ms,
                source=source,
                type=type,
                scope=scope,
                key=key,
                payload=dict(payload) if payload is not None else {},
                recurrence=kind,
                spec=dict(spec),
            )
        )

    async def cancel_timer(self, timer_id: str, *, revision: int) -> Timer:
        """Cancel a timer at ``revision`` (a stale revision is a `Conflict`)."""
        lookup("timer_id", timer_id)
        check_int("revision", revision, 1, MAX_INT)
        timer: Timer = await self._submit(cancel_timer_in_tx, timer_id, revision)
        return timer

    async def due(self, limit: int = 100) -> list[FireRequest]:
        """Up to ``limit`` due firing requests (bounded; a persisted cursor keeps it fair). The cursor's
        move commits without waiting for the disk when nothing else shares its commit: a process kill
        keeps it; a power loss may take the last moves back (the next call then starts where an
        earlier one did), never a firing."""
        check_int("limit", limit, 1, MAX_DUE)
        requests: list[FireRequest] = await self._p.storage.submit_relaxed(due_in_tx, limit)
        return requests

    async def fire(self, request: FireRequest) -> Firing:
        """Fire one timer identity (idempotent: a committed firing is answered from the ledger)."""
        check_fire_request(request)
        firing: Firing = await self._submit(
            fire_timer_in_tx, request, self._p.config().causal, self._p.extensions.recurrence_policies
        )
        return firing

    async def mark_time(self) -> int:
        """Record the clock's current reading as the store's time floor (it never goes down) and return
        the floor. A host whose clock moves only when told (``loom serve --test-clock``) records each
        move, and starts its clock at `time_floor` after a restart, so time never runs backwards."""
        floor: int = await self._submit(mark_time_in_tx)
        return floor

    # -- the bounded host pass ------------------------------------------------------

    async def adopt(self, lease: Lease) -> Lease:
        """The recovering attempt's process is verified: it runs again under ``lease`` (the recoverer's,
        from `Recovery.lease`); the old token stays stale. Idempotent for the same lease."""
        check_lease("lease", lease)
        execution: Execution = await self._submit(adopt_in_tx, Authority.of(lease))
        return attrs.evolve(lease, expires_at_ms=execution.expires_at_ms or lease.expires_at_ms)

    async def not_adoptable(self, lease: Lease, reason: str) -> Execution:
        """The recovering attempt's process cannot be verified: the attempt fails under the recoverer's
        fence (``lease``), the Work is ready again and its retry policy applies."""
        check_lease("lease", lease)
        check_reason("reason", reason)
        failed: Execution = await self._submit(not_adoptable_in_tx, Authority.of(lease), reason)
        return failed
