"""Start gates: asked, outside any transaction, whether a Work's first start goes ahead.

A gate answers ``None`` (or ``False``, or ``""``) to let it through, or a reason to hold it. A gate that
raises or answers something that is not a reason holds the Work too, saying so (a person can fix the
gate and release it). Both the starter and `Runtime.claim` ask through here.
"""

from __future__ import annotations

import inspect
import logging

from ..plugins.registry import Extensions
from ..records.events import DiagnosticKind
from ..records.validation import storable_text
from ..records.work import Work
from ..store import StorageActor
from .supervision import contained, describe


async def ask_start_gates(
    storage: StorageActor, extensions: Extensions, work: Work, logger: logging.Logger
) -> str | None:
    """The hold reason for ``work``'s first start, or ``None`` when every gate lets it through."""
    for name, gate in sorted(extensions.start_gates.items()):
        try:
            reason = gate(work)
            if inspect.isawaitable(reason):
                reason = await reason
        except Exception as exc:
            return await _gate_failed(storage, work, name, describe(exc), exc, logger)
        if reason is None or reason is False or reason == "":
            continue
        if not isinstance(reason, str):
            return await _gate_failed(
                storage, work, name, f"answered {type(reason).__name__}, not a reason", None, logger
            )
        return storable_text(f"start gate {name}: {reason}")  # a hold reason, kept as every store keeps one
    return None


async def _gate_failed(
    storage: StorageActor,
    work: Work,
    name: str,
    reason: str,
    exc: BaseException | None,
    logger: logging.Logger,
) -> str:
    await contained(
        storage,
        DiagnosticKind.GATE_FAILED,
        plugin=f"start gate {name}",
        hook="check",
        item=work.id,
        reason=reason,
        exc=exc,
        logger=logger,
    )
    return f"start gate {name} failed: {reason}; fix the gate, then release the hold"
