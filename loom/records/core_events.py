"""Every ``core.*`` Event type the runtime itself emits, in one place.

External ingress may not publish this family (see `validation.validate_event_in`); these are
the runtime's own control and audit Events. Each is accepted under the causal bounds like any
derived Event, and none of them becomes a Work's input.
"""

from __future__ import annotations

CORE_PREFIX = "core."
"""The privileged family: only the runtime (and trusted control paths) may accept these types."""

CORE_SOURCE = "core"
"""The source namespace of the runtime's own Events."""

WORK_CREATED = "core.work.created"
"""A child Work was created, or a reopen policy made a successor; the payload names both Works."""

MANUAL_INTERRUPT = "core.manual.interrupt"
"""An operator interrupted a running attempt; the control, not an input."""

EXECUTION_TIMEOUT = "core.execution.timeout"
"""An attempt's active-time deadline came; firing it fences and fails that segment."""

REPLAY_REQUESTED = "core.replay.requested"
"""An operator replayed an Event that had stayed unrouted; the payload names it and what it replaces."""

WAIT_TIMEOUT = "core.wait.timeout"
"""A wait's own timeout, accepted when its timer fires; the wake arbitrates it like any match."""

WAIT_WOKEN = "core.wait.woken"
"""The bridge of a wake: derived from the winner, it carries the continuation's causal authority."""

WAIT_BLOCKED = "core.wait.blocked"
"""A wake the causal limits refused: names the wait, the winner and the reason; the Work is held."""

WORK_RELEASED = "core.work.released"
"""An operator released a held Work: outside input, the parent of a blocked wait's next wake."""

RETRY_DUE = "core.retry.due"
"""A failed attempt's backoff expired: routing it makes the Work eligible (if its failure is current)."""

RETRY_REQUESTED = "core.retry.requested"
"""An operator asked for the next attempt: clears backoff or exhaustion and resets the budget."""

BUDGET_WARNING = "core.budget.warning"
"""A budget ledger crossed its warning threshold (a root Event in the Work's scope; never its input)."""

BUDGET_EXCEEDED = "core.budget.exceeded"
"""A budget ledger reached its limit: the Work's next turn does not start (never the Work's input)."""

ALL_CORE_TYPES = (
    BUDGET_WARNING,
    BUDGET_EXCEEDED,
    RETRY_DUE,
    RETRY_REQUESTED,
    WORK_CREATED,
    MANUAL_INTERRUPT,
    EXECUTION_TIMEOUT,
    REPLAY_REQUESTED,
    WAIT_TIMEOUT,
    WAIT_WOKEN,
    WAIT_BLOCKED,
    WORK_RELEASED,
)
