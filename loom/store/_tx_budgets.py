"""The budget part of `Tx`: ledgers, and the budget a held Work waits on."""

from __future__ import annotations

from typing import Any

from ..records.budgets import BudgetLedger
from ._tx_base import TxBase

LEDGER_COLUMNS = 'budget, subject, "window", unit, amount, warned, exceeded, updated_at_ms'


def ledger_from_row(row: tuple[Any, ...]) -> BudgetLedger:
    return BudgetLedger(
        budget=row[0],
        subject=row[1],
        window=row[2],
        unit=row[3],
        amount=row[4],
        warned=bool(row[5]),
        exceeded=bool(row[6]),
        updated_at_ms=row[7],
    )


class BudgetsTx(TxBase):
    def ledger(self, budget: str, subject: str, window: str) -> BudgetLedger | None:
        row = self._one(
            f'SELECT {LEDGER_COLUMNS} FROM budget_ledgers WHERE budget = ? AND subject = ? AND "window" = ?',
            (budget, subject, window),
        )
        return ledger_from_row(row) if row else None

    def charge_ledger(
        self, budget: str, subject: str, window: str, unit: str, amount: float, now_ms: int
    ) -> BudgetLedger:
        """Add ``amount`` to the ledger (made at zero if new); return it as it is now."""
        self._conn.execute(
            'INSERT INTO budget_ledgers (budget, subject, "window", unit, amount, updated_at_ms)'
            ' VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (budget, subject, "window") DO UPDATE SET'
            " amount = budget_ledgers.amount + excluded.amount, unit = excluded.unit, updated_at_ms = excluded.updated_at_ms",
            (budget, subject, window, unit, amount, now_ms),
        )
        ledger = self.ledger(budget, subject, window)
        assert ledger is not None
        return ledger

    def mark_ledger(self, budget: str, subject: str, window: str, *, warned: bool, exceeded: bool) -> None:
        self._conn.execute(
            'UPDATE budget_ledgers SET warned = ?, exceeded = ? WHERE budget = ? AND subject = ? AND "window" = ?',
            (int(warned), int(exceeded), budget, subject, window),
        )

    def ledgers(self, *, budget: str | None = None, subject: str | None = None) -> list[BudgetLedger]:
        where, params = [], []
        if budget is not None:
            where.append("budget = ?")
            params.append(budget)
        if subject is not None:
            where.append("subject = ?")
            params.append(subject)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return [
            ledger_from_row(row)
            for row in self._all(
                f'SELECT {LEDGER_COLUMNS} FROM budget_ledgers{clause} ORDER BY budget, subject, "window"',
                params,
            )
        ]

    def budget_hold(self, work_id: str) -> str | None:
        row = self._one("SELECT budget_hold FROM works WHERE id = ?", (work_id,))
        return row[0] if row else None

    def budget_held_works(self) -> list[str]:
        return [
            row[0] for row in self._all("SELECT id FROM works WHERE budget_hold IS NOT NULL ORDER BY id", ())
        ]
