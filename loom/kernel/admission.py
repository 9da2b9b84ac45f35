"""Admission: which ready Work starts its next attempt, and in what order.

The database decides. A Work that could start an attempt now (`executions.start_refusal` finds nothing
against it) is in the **ready queue**, at the place it took when it became ready (``ready_seq``: the
tail then). `settle_in_tx` keeps the queue true: the storage actor calls it after every request, for
each Work the request touched, so no procedure can forget it. The **admission pass** (`admit_in_tx`)
takes Works from the head of the queue, in readiness order, and starts each one it can, under scope
capacity (`capacity.capacity_pool`), budgets and, for a first start, the start gates; the starter
actor and the host verb `Runtime.admit` both make it, and `Runtime.claim` starts one named Work through
the same claim.

A Work the pass cannot start now leaves the pass's view (``blocked``) instead of being looked at again
and again: one waiting for a slot in a full pool (``capacity:<scope>``) until an attempt of that pool
stops counting, which lets the first such Work in readiness order back in; one that nothing here can
start (``start:<reason>``, with a diagnostic) until the Work changes or the configuration does. So a
pass reads only Works it can act on, a pool full of waiting Work costs nothing until a slot frees, and
within a pool Works start in the order they became ready.

On a shared database the pass locks the rows it reads and skips those another node's pass holds
(``FOR UPDATE SKIP LOCKED``), so nodes divide the queue; a pool's slots are counted under a lock of
that pool, taken also when a slot frees, so two nodes never both take its last slot and a freed slot
is never missed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from ..config import Config
from ..records.errors import Conflict, NotFound
from ..records.events import DiagnosticKind
from ..records.notices import WorkChanged, WorkReady
from ..records.work import Lease, Work
from ..store import AdmissionFacts, Tx
from .authority import lease_token
from .budgets import BudgetExceeded, budget_hold_in_tx
from .capacity import Pool, capacity_pool
from .executions import (
    NO_BINDING,
    AtCapacity,
    BindingRef,
    binding_for_in_tx,
    claim_in_tx,
    claim_request,
    claimable,
    start_refusal,
)

START_BLOCK = "start:"
"""The prefix of ``blocked`` for a Work nothing here can start (cleared whenever the Work changes)."""

DEFAULT_PAGE = 200


def settle_in_tx(tx: Tx, now_ms: int) -> None:
    """Bring the ready queue up to date with what this request did: each Work it touched joins the
    queue's tail if it can start now and was not queued, leaves it if it can no longer start, and is
    looked at again if it was passed over as unstartable; each pool an attempt stopped counting in lets
    its first waiting Work back in. Each Work the pass may now find is announced (`WorkReady`). Each
    Work touched records this commit's time as its last change (``updated_at_ms``)."""
    touched, tx.touched = tx.touched, {}
    for work_id, fence_only in touched.items():
        if fence_only:  # its live attempt took a new fence: whether it can start did not change
            tx.mark_changed(work_id, now_ms)
            continue
        facts = tx.admission_facts(work_id)
        if facts is None:
            continue
        if facts.updated_at_ms < now_ms:  # its inputs or attempts changed, not its own row
            tx.mark_changed(work_id, now_ms)
        startable = _startable(work_id, facts)
        if startable and facts.ready_seq is None:
            tx.enqueue_work(work_id, now_ms)
            tx.notify(WorkReady(work_id=work_id))
        elif startable and facts.blocked is not None and facts.blocked.startswith(START_BLOCK):
            tx.block_work(work_id, None)
            tx.notify(WorkReady(work_id=work_id))
        elif not startable and facts.ready_seq is not None:
            tx.dequeue_work(work_id)
    freed, tx.freed_pools = tx.freed_pools, []
    for pool in freed:
        tx.lock_pool(pool)
        for work_id in tx.unblock(Pool(pool, 0).blocked, 1):
            tx.notify(WorkReady(work_id=work_id))


def _startable(work_id: str, facts: AdmissionFacts | Work) -> bool:
    """Whether the Work can start now, from its admission facts or the Work itself (the same fields)."""
    has_pending = facts.has_pending if isinstance(facts, AdmissionFacts) else bool(facts.pending_inputs)
    return (
        start_refusal(
            work_id,
            facts.state,
            held=facts.held,
            hold_reason=None,
            retry=facts.retry,
            execution_state=facts.execution_state,
            execution_id=None,
            has_pending=has_pending,
        )
        is None
    )


def readmit_in_tx(tx: Tx, now_ms: int) -> int:
    """The configuration changed (capacities, routes, bindings): every Work the pass passed over is
    looked at again. Returns how many."""
    count = tx.unblock_all()
    if count:
        tx.notify(WorkReady(work_id=None))
    return count


@attrs.frozen(kw_only=True)
class AdmitRequest:
    """One admission pass: who claims, and what it can run."""

    config: Config
    owner: str
    lease_ms: int
    limit: int
    """How many attempts the pass starts at most."""
    token_seed: str
    """A secret the caller drew at random for this pass: each lease's token is derived from it and the
    claim's place in the pass (procedures make no randomness of their own)."""
    advertised: Mapping[str, Collection[str]]
    """Executor name -> the capabilities it offers (what a binding may pin)."""
    executors: frozenset[str] | None = None
    """The executors the caller launches (a runtime's starter): a Work whose binding names none of them
    is passed over as unstartable. ``None``: the caller runs every attempt itself (a host), under its
    binding or none; its leases count as handed."""
    gated: bool = False
    """First starts go to the start gates (outside storage) before they are claimed: the pass returns
    them instead of claiming them."""
    skip: frozenset[str] = frozenset()
    """Works the caller is still deciding about (their gates are being asked), or knows it cannot run:
    passed by (the page grows by as many, so they never crowd out the rest)."""
    sole: bool = True
    """The caller's runtime is the only one on its store, so what its executors cannot run nothing
    can: such a Work is passed over for good (until it or the configuration changes), with a
    diagnostic. Several nodes may install different executors: then it is left to the others
    (`Admission.elsewhere`)."""
    page: int = DEFAULT_PAGE
    """How many queued Works the pass looks at, at most."""


@attrs.frozen(kw_only=True)
class Started:
    lease: Lease
    executor: str | None


@attrs.frozen(kw_only=True)
class Admission:
    """What one pass did."""

    started: tuple[Started, ...] = ()
    gate: tuple[tuple[Work, BindingRef], ...] = ()
    """First starts to put to the start gates, with the binding each would run under."""
    elsewhere: tuple[str, ...] = ()
    """Works whose executor is not installed here, left for another node (not ``sole``)."""
    looked_at: int = 0
    claims: int = 0
    """Claims tried (each started an attempt, or found the Work changed under it)."""
    more: bool = False
    """The pass stopped at its limit or its page: another pass may find more to start."""


def admit_in_tx(tx: Tx, now_ms: int, req: AdmitRequest) -> Admission:
    """Start what can start from the head of the ready queue, in readiness order (see the module)."""
    page = tx.admission_page(req.page + len(req.skip))
    started: list[Started] = []
    gate: list[tuple[Work, BindingRef]] = []
    elsewhere: list[str] = []
    slots: dict[str, int] = {}
    looked_at = claims = 0
    for work_id, _ in page:
        if len(started) >= req.limit:
            return Admission(
                started=tuple(started),
                gate=tuple(gate),
                elsewhere=tuple(elsewhere),
                looked_at=looked_at,
                claims=claims,
                more=True,
            )
        looked_at += 1
        if work_id in req.skip:
            continue
        try:
            with tx.savepoint():
                claimed = _look_at(tx, now_ms, work_id, req, slots, gate, elsewhere, len(started))
        except Exception as exc:
            if tx.is_storage_failure(exc):
                raise
            _failed_start(tx, now_ms, work_id, exc)
            continue
        if claimed is not None:
            claims += 1
            if isinstance(claimed, Lease):
                started.append(Started(lease=claimed, executor=claimed.request.executor))
    for scope, free in slots.items():
        # a slot this pass could not fill (its Work could not start after all) goes to the next in line
        if free > 0:
            for work_id in tx.unblock(Pool(scope, 0).blocked, free):
                tx.notify(WorkReady(work_id=work_id))
    if elsewhere:
        # the rows this pass held are free again once it commits: a node that can run them, whose
        # own pass skipped them meanwhile, looks again
        tx.notify(WorkReady(work_id=None))
    return Admission(
        started=tuple(started),
        gate=tuple(gate),
        elsewhere=tuple(elsewhere),
        looked_at=looked_at,
        claims=claims,
        more=len(page) >= req.page + len(req.skip),
    )


def _look_at(
    tx: Tx,
    now_ms: int,
    work_id: str,
    req: AdmitRequest,
    slots: dict[str, int],
    gate: list[tuple[Work, BindingRef]],
    elsewhere: list[str],
    index: int,
) -> Lease | Conflict | None:
    """Start one queued Work if it can start: the lease, what refused its claim, or ``None`` when no
    claim was tried (it was passed over, or goes to the start gates)."""
    work = tx.work(work_id)
    if work is None or claimable(work) is not None:
        tx.touch(work_id)  # it cannot start after all: settling takes it out of the queue
        return None
    pool = capacity_pool(req.config, work.scope)
    if pool is not None and _free_slots(tx, pool, slots) <= 0:
        tx.block_work(work.id, pool.blocked)
        return None
    binding = binding_for_in_tx(tx, now_ms, work.id, req.config, req.advertised)
    why = _unstartable(binding, req.executors)
    if why is not None:
        if req.sole or binding is None or binding.executor is None:
            _pass_over(tx, now_ms, work, why)
        else:
            elsewhere.append(work.id)  # another node may have the executor
        return None
    if req.gated and not work.started and not work.released:
        gate.append((work, binding or NO_BINDING))
        return None
    claimed = _claim(tx, now_ms, work, binding or NO_BINDING, req, lease_token(req.token_seed, index))
    if isinstance(claimed, AtCapacity):
        slots[claimed.pool] = 0
        tx.block_work(work.id, Pool(claimed.pool, 0).blocked)
    elif isinstance(claimed, BudgetExceeded):
        pass  # held for its budget: it left the queue
    elif isinstance(claimed, Conflict):
        tx.block_work(work.id, START_BLOCK + str(claimed))  # looked at again once it changes
    elif pool is not None:
        slots[pool.scope] -= 1
    return claimed


def _failed_start(tx: Tx, now_ms: int, work_id: str, exc: Exception) -> None:
    """Starting a Work failed for a reason no retry fixes: it is held with the reason, and a diagnostic
    says so (a person can fix the cause and release it)."""
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    tx.add_diagnostic(
        DiagnosticKind.START_FAILED,
        work_id,
        f"core claim: {reason}",
        {"plugin": "core", "hook": "claim", "item": work_id, "reason": reason},
        now_ms,
    )
    work = tx.work(work_id)
    if work is not None and not work.state.terminal and not work.held:
        tx.update_work(
            work_id,
            now_ms,
            held=1,
            hold_reason=f"could not start an attempt: {reason}; release the hold to try again",
        )
        tx.notify(WorkChanged(work_id=work_id))


def start_in_tx(
    tx: Tx, now_ms: int, work_id: str, req: AdmitRequest, binding: BindingRef | None = None
) -> Lease | Conflict:
    """Start one named Work now (a host's claim, or a first start its gates let through), through the
    same claim as the pass: under ``binding`` (default: the one its input names, or none), capacity and
    budgets. Returns the lease, or the refusal for the caller to raise after the commit: `AtCapacity`,
    `BudgetExceeded` (the Work is held with the reason in this same commit) or another `Conflict`."""
    if binding is None:
        binding = binding_for_in_tx(tx, now_ms, work_id, req.config, req.advertised) or NO_BINDING
    work = tx.work(work_id)
    if work is None:
        raise NotFound(f"no work with id {work_id!r}")
    return _claim(tx, now_ms, work, binding, req, lease_token(req.token_seed, 0))


def start_at_once_in_tx(
    tx: Tx, now_ms: int, work_id: str, req: AdmitRequest, *, index: int = 0
) -> Lease | None:
    """Start ``work_id`` now if an admission pass made right now would start it: it can start, no scope
    capacity applies to it (a pool keeps its readiness order through the queue), its binding runs
    here and no start gate must be asked first. ``None``: the ready queue decides, as for any Work
    (a refusal for its budget holds it, as the pass would). ``index``: this start's place among those
    one procedure makes with ``req`` (each lease token differs); none with a ``limit`` below 1 (a
    draining runtime's)."""
    if req.limit < 1:
        return None
    work = tx.kept_work(work_id)  # kept when this transaction just wrote it (a wake, a completion)
    if work is not None:
        if not _startable(work_id, work) or capacity_pool(req.config, work.scope) is not None:
            return None
    else:
        facts = tx.admission_facts(work_id)  # one indexed row: most Works routed to are running already
        if facts is None or not _startable(work_id, facts):
            return None
        if capacity_pool(req.config, facts.scope) is not None:
            return None
        work = tx.work(work_id)
    if work is None or claimable(work) is not None:
        return None
    if req.gated and not work.started and not work.released:
        return None
    binding = binding_for_in_tx(tx, now_ms, work.id, req.config, req.advertised)
    if _unstartable(binding, req.executors) is not None:
        return None
    claimed = _claim(tx, now_ms, work, binding or NO_BINDING, req, lease_token(req.token_seed, index))
    return claimed if isinstance(claimed, Lease) else None


def _free_slots(tx: Tx, pool: Pool, slots: dict[str, int]) -> int:
    if pool.scope not in slots:
        tx.lock_pool(pool.scope)
        slots[pool.scope] = pool.capacity - tx.pool_running(pool.scope)
    return slots[pool.scope]


def _unstartable(binding: BindingRef | None, executors: frozenset[str] | None) -> str | None:
    """Why nothing here can start a Work with this binding (``None``: something can)."""
    if executors is None:
        return None  # the host runs it, under this binding or none
    if binding is None or binding.executor is None:
        return (
            "no route that brought its input names a binding, and no earlier attempt ran under one: "
            "name a binding on the route, or claim it from the host (Runtime.claim)"
        )
    if binding.executor not in executors:
        return f"its binding {binding.name!r} runs executor {binding.executor!r}, which is not installed here"
    return None


def _pass_over(tx: Tx, now_ms: int, work: Work, why: str) -> None:
    """Leave a Work nothing here can start out of the pass's view until it (or the configuration)
    changes, and say why once."""
    tx.block_work(work.id, START_BLOCK + why)
    tx.add_diagnostic(
        DiagnosticKind.START_FAILED, work.id, f"work {work.id} cannot start: {why}", {"work": work.id}, now_ms
    )


def _claim(
    tx: Tx, now_ms: int, work: Work, binding: BindingRef, req: AdmitRequest, token: str
) -> Lease | Conflict:
    """Claim ``work``'s next attempt in a savepoint of its own: the lease, or what refused it (a Work
    refused for its budget is held with the reason, until released or the limit rises)."""
    request = claim_request(
        req.config,
        work,
        owner=req.owner,
        token=token,
        lease_ms=req.lease_ms,
        binding=binding,
        # handed from this commit: the host runs it itself, a runtime hands it to its executor at once
        # (a clean close unmarks what it never handed: `recovery.release_leases_in_tx`)
        handed=True,
    )
    try:
        with tx.savepoint():
            lease: Lease = claim_in_tx(tx, now_ms, request)
        return lease
    except BudgetExceeded as exc:
        budget_hold_in_tx(tx, now_ms, work.id, req.config.budgets)
        return exc
    except Conflict as exc:
        return exc
