"""Budget ledgers as read back."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class BudgetLedger:
    """What one budget has counted for one subject (a Work id, a scope, or ``*`` for every scope) in one
    window (``life``, ``day:2026-11-30`` or ``week:2026-W49``)."""

    budget: str
    subject: str
    window: str
    unit: str
    amount: float
    warned: bool
    """The warning threshold was crossed (its ``core.budget.warning`` Event was accepted)."""
    exceeded: bool
    """The limit was reached (its ``core.budget.exceeded`` Event was accepted)."""
    updated_at_ms: int
