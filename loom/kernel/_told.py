"""A Work as a procedure's writes left it, which the procedure tells its transaction
(`TxBase.known_lazily`) rather than have the next reader read it again."""

from __future__ import annotations

from typing import Any

from ..records.work import ExecutionState, Work, WorkState, work_with


def claimed_work(work: Work, revision: int, execution_id: str, now_ms: int) -> Work:
    """``work`` as its claim wrote it: running its new attempt, every input it held still pending (what
    the attempt's end reads next, on a database alone from an earlier commit: `Carried.of_works`)."""
    return work_with(
        work,
        state=WorkState.RUNNING,
        revision=revision,
        updated_at_ms=now_ms,
        attempts=work.attempts + 1,
        started=True,
        released=False,
        current_execution_id=execution_id,
        execution_state=ExecutionState.RUNNING,
    )


def ended_work(work: Work, taken: tuple[str, ...], state: WorkState, revision: int, now_ms: int) -> Work:
    """``work`` as its attempt's end wrote it: without the attempt or the inputs it took (``taken``: the
    attempt's own, not the whole attempt, which a Work kept across commits would keep alive)."""
    pending = tuple(event_id for event_id in work.pending_inputs if event_id not in taken)
    now: dict[str, Any] = {"state": state, "revision": revision, "updated_at_ms": now_ms}
    return work_with(work, **now, pending_inputs=pending, current_execution_id=None, execution_state=None)
