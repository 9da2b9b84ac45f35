"""Lease recovery and adoption.

Expiry is exclusive: at ``now == expires_at`` a lease has lost authority, which makes the same attempt
recoverable, never a licence to launch another. A recoverer claims the attempt at a higher epoch with a
new token and persists recovery-in-progress authority (``recovering``), then asks the executor, outside
any transaction, to verify the process or finished handle from the attempt's pinned metadata. Adoption
moves it back to ``running`` under the recoverer's lease (the old token stays stale whatever owner names
or process ids are reused); an executor that cannot verify answers `NotAdoptable`, and the attempt fails
under the new fence, with the retry policy applied. An attempt never handed to its executor is
relaunched as the same attempt under the new epoch, spending no retry: a runtime's claim counts as
handed from its commit (it launches the attempt at once), so these are the attempts a clean close
claimed and never launched (`release_leases_in_tx` unmarks them) and claims made as not handed.

Competing recoverers cannot both win: each claim is a compare-and-set on the epoch it read. A recovery
that itself loses its lease is recovered again, at yet another epoch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from ..records.errors import NotFound, StaleAuthority
from ..records.events import DiagnosticKind, Event
from ..records.notices import LeaseRecovered, WorkChanged
from ..records.validation import check_json_value
from ..records.work import Execution, ExecutionState, Lease, Recovery, RunRequest, WorkState
from ..store import Tx
from ._common import origin_of, require_event, require_work
from .authority import Authority, authorize, authorize_recovery, lease_token, same_token
from .executions import consume_claimed_inputs_in_tx
from .intents import stale_open_intents_in_tx
from .retry import apply_failure_in_tx
from .segments import end_segment_in_tx

RECOVERY_NAMESPACE = "core.recovery"
CURSOR = "cursor"


@attrs.frozen(kw_only=True)
class Expired:
    """An attempt whose lease has expired, as seen at ``epoch`` (a claim of it must still find it so)."""

    execution_id: str
    epoch: int
    work: tuple[str, str | None] | None = None
    """Its Work's scope and kind, read with it (``None``: not read)."""


def expired_in_tx(tx: Tx, now_ms: int, limit: int) -> list[Expired]:
    """Up to ``limit`` attempts whose lease has expired, fair across calls at a fixed clock: a durable
    cursor over (expiry, id) starts each call after the last one returned, wrapping around."""
    entry = tx.kv_get(RECOVERY_NAMESPACE, CURSOR)
    cursor = (int(entry.value["expires_at_ms"]), str(entry.value["id"])) if entry else (-1, "")
    found = tx.expired_leases(now_ms, cursor, limit)
    if len(found) < limit and entry is not None:
        seen = {x[0] for x in found}
        found += [x for x in tx.expired_leases(now_ms, (-1, ""), limit - len(found)) if x[0] not in seen]
    if found:
        last_id, _, last_expiry, _ = found[-1]
        tx.kv_put(RECOVERY_NAMESPACE, CURSOR, {"expires_at_ms": last_expiry, "id": last_id}, now_ms)
    return [
        Expired(execution_id=execution_id, epoch=epoch, work=work) for execution_id, epoch, _, work in found
    ]


@attrs.frozen(kw_only=True)
class RecoverPass:
    recoveries: tuple[Recovery, ...]
    more: bool
    """The pass found as many expired attempts as it may take: another may find more."""


def recover_expired_in_tx(
    tx: Tx,
    now_ms: int,
    limit: int,
    *,
    owner: str,
    token_seed: str,
    lease_ms: int,
    executors: frozenset[str] = frozenset(),
) -> RecoverPass:
    """The recovery pass that the lease recoverer and `Runtime.recover_expired` both make: claim up to
    ``limit`` attempts whose lease has expired (`expired_in_tx`, fair), each at the next epoch under a
    token derived from ``token_seed`` (`recover_claim_in_tx`), in one transaction."""
    expired = expired_in_tx(tx, now_ms, limit)
    recoveries = []
    for index, seen in enumerate(expired):
        recovery = recover_claim_in_tx(
            tx,
            now_ms,
            seen,
            owner=owner,
            token=lease_token(token_seed, index),
            lease_ms=lease_ms,
            executors=executors,
        )
        if recovery is not None:
            recoveries.append(recovery)
    return RecoverPass(recoveries=tuple(recoveries), more=len(expired) >= limit)


def recover_claim_in_tx(
    tx: Tx,
    now_ms: int,
    seen: Expired,
    *,
    owner: str,
    token: str,
    lease_ms: int,
    executors: frozenset[str] = frozenset(),
) -> Recovery | None:
    """Claim an expired attempt's recovery at the next epoch. ``None``: it is not expired (a live lease
    is never stolen), or it changed since it was seen (another recoverer, a completion, a cancel).

    ``executors``: the executors the claimer can launch; an attempt never handed to its executor is
    relaunched only by a claimer that has it (anyone else recovers it, to find it not adoptable)."""
    execution = tx.execution(seen.execution_id)
    if execution is None or execution.epoch != seen.epoch:
        return None
    if execution.state not in (ExecutionState.RUNNING, ExecutionState.RECOVERING):
        return None
    if execution.expires_at_ms is None or now_ms < execution.expires_at_ms:
        return None
    work = seen.work or tx.work_scope_kind(execution.work_id)
    if work is None:
        raise NotFound(f"no work with id {execution.work_id!r}")
    scope, kind = work
    relaunch = execution.handed_at_ms is None and not execution.metadata and execution.executor in executors
    epoch = execution.epoch + 1
    expires = now_ms + lease_ms
    state = ExecutionState.RUNNING if relaunch else ExecutionState.RECOVERING
    fence: dict[str, Any] = {"epoch": epoch, "token": token, "owner": owner, "expires_at_ms": expires}
    if relaunch:
        fence["handed_at_ms"] = now_ms  # the claimer launches it at once, as a claim's
    if state is execution.state:
        tx.update_execution(execution.id, **fence)  # the new fence alone (a relaunch, a recovery again)
    else:
        tx.set_execution_state(execution, state, fence_only=True, **fence)  # live before and after
    tx.notify(WorkChanged(work_id=execution.work_id))
    tx.notify(
        LeaseRecovered(execution_id=execution.id, work_id=execution.work_id, epoch=epoch, relaunch=relaunch)
    )
    inputs = tuple(tx.input_events(execution.inputs))  # (in one query)
    resumed = _resumed_winner(tx, execution)
    trigger = resumed or (require_event(tx, execution.trigger_id) if execution.trigger_id else None)
    request = RunRequest(
        work_id=execution.work_id,
        execution_id=execution.id,
        attempt=execution.attempt,
        scope=scope,
        kind=kind,
        trigger=trigger,
        inputs=inputs,
        binding=execution.binding,
        config=execution.binding_config or {},
        executor=execution.executor,
        resumed=resumed is not None,
        origin=origin_of(tx, trigger),
    )
    lease = Lease(
        execution_id=execution.id,
        work_id=execution.work_id,
        attempt=execution.attempt,
        epoch=epoch,
        token=token,
        owner=owner,
        expires_at_ms=expires,
        request=request,
    )
    return Recovery(lease=lease, relaunch=relaunch, metadata=dict(execution.metadata or {}))


def presented_lease_in_tx(tx: Tx, now_ms: int, execution_id: str, token: str) -> Lease:
    """The lease of the running attempt ``execution_id`` whose current token is ``token`` (compared in
    constant time), for a process that holds only the token (an executor's subprocess calling the
    service's toolbelt). A token that is not the attempt's current one (stale, another attempt's, or an
    attempt that is not running) is `StaleAuthority`, whether or not the attempt exists."""
    stored = tx.execution_token(execution_id)
    if stored is None or not same_token(stored, token):
        raise StaleAuthority(
            f"execution {execution_id!r}: the token presented is not its current lease's "
            "(stale, or another execution's)"
        )
    execution = tx.execution(execution_id)
    assert execution is not None
    current = authorize(
        tx,
        now_ms,
        Authority(execution_id=execution.id, attempt=execution.attempt, epoch=execution.epoch, token=token),
    )
    assert current.owner is not None
    assert current.expires_at_ms is not None
    work = require_work(tx, current.work_id)
    resumed = _resumed_winner(tx, current)
    trigger = resumed or (require_event(tx, current.trigger_id) if current.trigger_id else None)
    request = RunRequest(
        work_id=work.id,
        execution_id=current.id,
        attempt=current.attempt,
        scope=work.scope,
        kind=work.kind,
        trigger=trigger,
        inputs=tuple(require_event(tx, event_id) for event_id in current.inputs),
        binding=current.binding,
        config=current.binding_config or {},
        executor=current.executor,
        resumed=resumed is not None,
        origin=origin_of(tx, trigger),
    )
    return Lease(
        execution_id=current.id,
        work_id=work.id,
        attempt=current.attempt,
        epoch=current.epoch,
        token=token,
        owner=current.owner,
        expires_at_ms=current.expires_at_ms,
        request=request,
    )


def _resumed_winner(tx: Tx, execution: Execution) -> Event | None:
    """The winner a resumed attempt was continued with (``None``: it never resumed)."""
    if execution.epoch <= 1:
        return None  # a resume takes the next epoch: an attempt still at its first never resumed
    woken = [
        w for w in tx.waits_of_work(execution.work_id) if w.execution_id == execution.id and w.winner_event_id
    ]
    return tx.event(woken[-1].winner_event_id or "") if woken else None


def adopt_in_tx(tx: Tx, now_ms: int, auth: Authority) -> Execution:
    """The executor verified the process (or its finished result): the attempt runs again under the
    recoverer's lease, with the new token only. Idempotent: the same adoption already committed (the
    attempt runs at this epoch under this token) answers it again."""
    adopted = adopt_fence_in_tx(tx, now_ms, auth)
    return adopted if adopted is not None else authorize(tx, now_ms, auth)


def adopt_fence_in_tx(tx: Tx, now_ms: int, auth: Authority, *, later: bool = False) -> Execution | None:
    """`adopt_in_tx` for a caller that goes on under the fence at once: the attempt as this adoption left
    it (not read back: only its state moved, and ``auth`` holds it, as `authorize` would find in this
    transaction), or ``None`` when the same adoption was already committed. ``later``: the move to
    running is written with the caller's next move of the attempt's state (`Tx.write_state_later`)."""
    current = tx.execution(auth.execution_id)
    if (
        current is not None
        and current.state is ExecutionState.RUNNING
        and (current.epoch, current.attempt) == (auth.epoch, auth.attempt)
    ):
        return None
    execution = authorize_recovery(tx, now_ms, auth)
    clock = tx.execution_segment_clock(execution.id)  # (read with the attempt: no query)
    if later:
        tx.set_execution_state_later(execution, ExecutionState.RUNNING)
    else:
        tx.set_execution_state(execution, ExecutionState.RUNNING)
    tx.known("segment_clock", execution.id, clock)  # its state alone moved: the outcome's end reads none
    tx.notify(WorkChanged(work_id=execution.work_id))
    return attrs.evolve(execution, state=ExecutionState.RUNNING)


def not_adoptable_in_tx(tx: Tx, now_ms: int, auth: Authority, reason: str) -> Execution:
    """The executor could not verify the process: the attempt fails under the new fence (its claimed
    inputs are consumed, as any failed attempt's), the Work is ready, and the retry policy applies.
    "Unverifiable" does not prove the process stopped; the executor's own exclusion must keep a
    replacement from overlapping it."""
    execution = authorize_recovery(tx, now_ms, auth)
    work = require_work(tx, execution.work_id)
    consume_claimed_inputs_in_tx(tx, execution)
    stale_open_intents_in_tx(tx, now_ms, execution.id)
    end_segment_in_tx(tx, now_ms, execution)
    error = f"not adoptable when recovered (its lease expired, or its runtime closed): {reason}"
    outcome = {"kind": "failed", "error": error, "recovery": True}
    tx.set_execution_state(
        execution, ExecutionState.FAILED, token=None, ended_at_ms=now_ms, outcome=json.dumps(outcome)
    )
    if work.state is WorkState.RUNNING:
        tx.set_work_state(work, WorkState.READY, now_ms)
    tx.add_diagnostic(
        DiagnosticKind.RECOVERY_FAILED,
        execution.id,
        error,
        {"work": work.id, "epoch": execution.epoch},
        now_ms,
    )
    tx.notify(WorkChanged(work_id=work.id))
    failed = tx.execution(execution.id)
    assert failed is not None
    apply_failure_in_tx(tx, now_ms, work.id, failed, error=error)
    return failed


def next_expiry_in_tx(tx: Tx, now_ms: int) -> int | None:
    """The earliest expiry among running and recovering attempts (``None``: none holds a lease)."""
    return tx.next_lease_expiry()


def pin_metadata_in_tx(tx: Tx, now_ms: int, auth: Authority, metadata: Mapping[str, Any]) -> None:
    """The executor pins opaque metadata with the segment (a process id and start time, a handle):
    recovery hands it back to `recover`."""
    execution = authorize(tx, now_ms, auth)
    check_json_value("metadata", metadata)
    tx.update_execution(execution.id, metadata=json.dumps(dict(metadata), sort_keys=True))


def release_leases_in_tx(tx: Tx, now_ms: int, owner: str, unlaunched: Mapping[str, int] | None = None) -> int:
    """A clean close: every lease ``owner`` holds expires now, so the next open recovers its attempts
    at once rather than after a lease length. ``unlaunched`` names the attempts (execution id: the
    epoch of the lease) it claimed and never handed to their executor: their claims marked them
    handed, and they are unmarked, so the next open relaunches them as never handed (no retry spent)."""
    for execution_id, epoch in sorted((unlaunched or {}).items()):
        execution = tx.execution(execution_id)
        if (
            execution is not None
            and execution.epoch == epoch
            and execution.owner == owner
            and execution.state is ExecutionState.RUNNING
            and execution.handed_at_ms is not None
            and not execution.metadata
        ):
            tx.update_execution(execution.id, handed_at_ms=None)
    return tx.release_leases(owner, now_ms)


def release_incarnations_in_tx(tx: Tx, now_ms: int, node: str, owner: str) -> int:
    """A node opens on a shared database, holding its node name (no other live process has it): the
    leases its earlier incarnations left (a kill) expire now, so their attempts are recovered at once;
    other nodes' leases wait for their expiry."""
    return tx.release_incarnations(node, owner, now_ms)


def release_dead_leases_in_tx(tx: Tx, now_ms: int) -> int:
    """An open that knows no other process holds a lease on its store (a SQLite file, whose lock it
    holds: every earlier process that held one is dead, whatever name it held it under, its own
    included) and that holds none yet: the lease of every attempt an executor ran expires now, so the
    attempts the killed process left are recovered at once, not a lease length later. A host claim's
    lease (no executor) keeps its term: its holder is the embedder's code, which a close of the runtime
    alone does not end."""
    return tx.release_leases(None, now_ms, executors_only=True)
