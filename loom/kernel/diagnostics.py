"""Durable diagnostics written on behalf of an actor: what went wrong with which item, safe to show.

An actor that contains a failure at a boundary (a plugin raised, an executor answered something that
is not an outcome) logs it with its traceback and records it here, so an operator finds it with
`Runtime.diagnostics` after the process is gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records.events import DiagnosticKind
from ..store import Tx

MAX_MESSAGE = 2_000


def record_diagnostic_in_tx(
    tx: Tx, now_ms: int, kind: DiagnosticKind, subject: str, message: str, detail: Mapping[str, Any]
) -> int:
    """Write one diagnostic; return its id."""
    text = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
    return tx.add_diagnostic(kind, subject, text, dict(detail), now_ms)
