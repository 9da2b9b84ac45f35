"""Steps that commit together on the hot path: a routed Event starts its Work's attempt, and a completed
attempt starts the next, each in the same transaction (docs/architecture.md, "Admission").

Starting at once is only a shortcut past the admission pass, never around its rules: it is taken only
when the pass, made right then, would start this very Work first (it can start, no scope capacity
makes it wait its turn, its binding runs here, and no start gate must be asked), and otherwise the
Work waits in the ready queue as usual. One commit and one round trip fewer per attempt.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import Budget, CausalLimits
from ..records.waits import Waiting
from ..records.work import Execution, Lease, Outcome
from ..store import Tx
from .admission import AdmitRequest, start_at_once_in_tx
from .authority import Authority
from .executions import KindPolicy, complete_in_tx
from .resolve import RouteRequest
from .route_records import RouteResult
from .routing import route_in_tx


def route_then_start_in_tx(
    tx: Tx, now_ms: int, req: RouteRequest, limits: CausalLimits, admit: AdmitRequest
) -> tuple[RouteResult, Lease | None]:
    """Route one Event (`route_in_tx`), then start the Work it was routed to if it can start at once."""
    result = route_in_tx(tx, now_ms, req, limits)
    work_id = result.checkpoint.work_id
    if result.replay or work_id is None:
        return result, None
    return result, start_at_once_in_tx(tx, now_ms, work_id, admit)


def complete_then_start_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    outcome: Outcome,
    kind: KindPolicy,
    limits: CausalLimits,
    budgets: Sequence[Budget],
    admit: AdmitRequest,
) -> tuple[Execution, Lease | None]:
    """Commit an attempt's outcome (`complete_in_tx`), then start the Work's next attempt if input is
    waiting for it and it can start at once (a standing Work's queue, a retry due now)."""
    execution = complete_in_tx(tx, now_ms, auth, outcome, kind, limits, budgets)
    if isinstance(outcome, Waiting):
        return execution, None  # a wait's wake, not this commit, decides what comes next
    return execution, start_at_once_in_tx(tx, now_ms, execution.work_id, admit)
