"""Budgets: retry bounds failures, budgets bound everything else a Work consumes.

Executors report usage in named units on each result; the runtime counts ``turns`` (every started
attempt or continuation) and ``attempts`` (every new attempt) itself. Each configured `Budget` adds the
amounts up in ledgers per Work, per scope or across every scope, over the Work's life or a UTC day or
week, and never decides what counts as a cost. A turn is admitted where it starts (the claim): once a
ledger of the Work has reached its limit, the turn does not start and the Work is held with the reason,
nonterminal, input queueing, until an operator releases it (one more turn) or raises the limit.
Crossing a warning threshold or a limit accepts a root ``core.budget.warning`` or
``core.budget.exceeded`` Event in the Work's scope, once per ledger; routes can act on it, and it never
becomes that Work's input.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from ..config import Budget, BudgetPer, BudgetWindow, CausalLimits
from ..records.budgets import BudgetLedger
from ..records.core_events import BUDGET_EXCEEDED, BUDGET_WARNING, CORE_SOURCE
from ..records.errors import Conflict
from ..records.events import EventIn
from ..records.ids import core_delivery_id
from ..records.notices import WorkChanged
from ..records.work import Work
from ..store import Tx
from .accept import accept_in_tx

ALL_SUBJECT = "*"
"""The subject of a ledger across every scope."""


class BudgetExceeded(Conflict):
    """A turn did not start: a ledger of the Work reached its limit (the Work is to be held)."""

    def __init__(self, message: str, budget: str) -> None:
        super().__init__(message)
        self.budget = budget


def window_of(window: BudgetWindow, now_ms: int) -> str:
    """The ledger window ``now_ms`` falls in: ``life``, ``day:YYYY-MM-DD`` or ``week:YYYY-Www`` (UTC,
    ISO weeks from Monday)."""
    if window is BudgetWindow.LIFE:
        return "life"
    day = datetime.datetime.fromtimestamp(now_ms / 1000, tz=datetime.UTC).date()
    if window is BudgetWindow.DAY:
        return f"day:{day.isoformat()}"
    year, week, _ = day.isocalendar()
    return f"week:{year:04d}-W{week:02d}"


def subject_of(budget: Budget, work: Work) -> str:
    if budget.per is BudgetPer.WORK:
        return work.id
    if budget.per is BudgetPer.SCOPE:
        return work.scope
    return ALL_SUBJECT


def charge_in_tx(
    tx: Tx,
    now_ms: int,
    work: Work,
    amounts: Mapping[str, float],
    budgets: Sequence[Budget],
    limits: CausalLimits,
) -> None:
    """Add ``amounts`` (by unit) to every ledger of ``work`` that counts that unit; a ledger crossing its
    warning threshold or its limit accepts its Event (once per ledger and window)."""
    for budget in budgets:
        amount = amounts.get(budget.unit)
        if not amount or not budget.applies_to(work.scope):
            continue
        subject, window = subject_of(budget, work), window_of(budget.window, now_ms)
        ledger = tx.charge_ledger(budget.name, subject, window, budget.unit, float(amount), now_ms)
        warned = ledger.warned or (budget.warning is not None and ledger.amount >= budget.warning)
        exceeded = ledger.exceeded or ledger.amount >= budget.limit
        if (warned, exceeded) == (ledger.warned, ledger.exceeded):
            continue
        tx.mark_ledger(budget.name, subject, window, warned=warned, exceeded=exceeded)
        # one charge may cross both: the warning is announced all the same, before the limit
        if warned and not ledger.warned:
            _announce(tx, now_ms, BUDGET_WARNING, budget, ledger, work, limits)
        if exceeded and not ledger.exceeded:
            _announce(tx, now_ms, BUDGET_EXCEEDED, budget, ledger, work, limits)


def _announce(
    tx: Tx,
    now_ms: int,
    type: str,
    budget: Budget,
    ledger: BudgetLedger,
    work: Work,
    limits: CausalLimits,
) -> None:
    """A root Event in the Work's scope, once per ledger and window (its delivery id says which)."""
    kind = type.rsplit(".", 1)[-1]
    accept_in_tx(
        tx,
        now_ms,
        EventIn(
            source=CORE_SOURCE,
            delivery_id=core_delivery_id(f"budget.{kind}", budget.name, ledger.subject, ledger.window),
            type=type,
            scope=work.scope,
            payload={
                "budget": budget.name,
                "unit": budget.unit,
                "amount": ledger.amount,
                "limit": budget.limit,
                "warning": budget.warning,
                "per": budget.per.value,
                "subject": ledger.subject,
                "window": ledger.window,
                "work": work.id,
            },
        ),
        limits,
        trusted=True,
    )


def over_limit(tx: Tx, now_ms: int, work: Work, budgets: Sequence[Budget]) -> tuple[Budget, float] | None:
    """The first budget whose ledger for ``work`` has reached its limit now, with its amount."""
    for budget in budgets:
        if not budget.applies_to(work.scope):
            continue
        ledger = tx.ledger(budget.name, subject_of(budget, work), window_of(budget.window, now_ms))
        if ledger is not None and ledger.amount >= budget.limit:
            return budget, ledger.amount
    return None


def hold_reason(budget: Budget, amount: float, work: Work, now_ms: int) -> str:
    return (
        f"budget {budget.name!r} reached its limit: {amount:g} of {budget.limit:g} {budget.unit} "
        f"({budget.per.value} {subject_of(budget, work)}, {window_of(budget.window, now_ms)}); release "
        "the work for one more turn, or raise the limit"
    )


def admit_turn(tx: Tx, now_ms: int, work: Work, budgets: Sequence[Budget]) -> None:
    """Raise `BudgetExceeded` if a turn of ``work`` must not start (an operator's release lets one
    through whatever the ledgers say)."""
    if work.released or not budgets:
        return
    over = over_limit(tx, now_ms, work, budgets)
    if over is not None:
        budget, amount = over
        raise BudgetExceeded(
            f"cannot start a turn of work {work.id}: {hold_reason(budget, amount, work, now_ms)}", budget.name
        )


def budget_hold_in_tx(tx: Tx, now_ms: int, work_id: str, budgets: Sequence[Budget]) -> Work | None:
    """Hold ``work_id`` because a ledger reached its limit (checked again here); ``None`` when it need
    not be held (no ledger is over any more, it is terminal, or it is held already)."""
    work = tx.work(work_id)
    if work is None or work.state.terminal or work.held or work.released:
        return None
    over = over_limit(tx, now_ms, work, budgets)
    if over is None:
        return None
    budget, amount = over
    tx.update_work(
        work.id,
        now_ms,
        held=1,
        hold_reason=hold_reason(budget, amount, work, now_ms),
        budget_hold=budget.name,
    )
    tx.notify(WorkChanged(work_id=work.id))
    return tx.work(work.id)


def rebudget_in_tx(tx: Tx, now_ms: int, budgets: Sequence[Budget]) -> list[str]:
    """After a configuration change: release every Work a budget held whose ledgers are all below their
    limits now (the limit was raised, or the budget removed). Returns their ids."""
    released: list[str] = []
    for work_id in tx.budget_held_works():
        work = tx.work(work_id)
        if work is None or work.state.terminal or not work.held:
            tx.update_work(work_id, now_ms, budget_hold=None)
            continue
        if over_limit(tx, now_ms, work, budgets) is None:
            tx.update_work(work.id, now_ms, held=0, hold_reason=None, budget_hold=None)
            tx.notify(WorkChanged(work_id=work.id))
            released.append(work.id)
    return released
