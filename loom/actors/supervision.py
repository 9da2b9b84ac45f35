"""Supervision at the boundaries: code loom does not own (route handlers, start gates, executors) and
answers it did not make are contained per item.

`contained` logs the failure with its traceback on a ``loom.*`` logger (ERROR) and records a durable
diagnostic naming the plugin, the hook, the item and the reason; the caller then takes the item's
defined failure path. Only storage failures (`StorageError`) propagate: they stop the runtime.
"""

from __future__ import annotations

import logging
from typing import Any

from ..kernel.diagnostics import record_diagnostic_in_tx
from ..records.errors import StorageError
from ..records.events import DiagnosticKind
from ..records.validation import storable_text
from ..store import StorageActor

log = logging.getLogger("loom.supervision")


DESCRIBED_LEN = 1_000
"""The most of an exception's ``Type: message`` a reason quotes (a reason holds at most 2,000 characters,
and most quote one after words of their own)."""


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, for a diagnostic or an attempt's error, as every store keeps
    a reason (`storable_text`: an exception's message may hold anything, of any length)."""
    text = str(exc)
    return storable_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, DESCRIBED_LEN)


async def contained(
    storage: StorageActor,
    kind: DiagnosticKind,
    *,
    plugin: str,
    hook: str,
    item: str,
    reason: str,
    exc: BaseException | None = None,
    logger: logging.Logger = log,
    **detail: Any,
) -> None:
    """Log a contained failure (with its traceback) and record its diagnostic.

    A failure to record the diagnostic is logged too; only a storage failure propagates.
    """
    logger.error(
        "%s %s failed for %s: %s",
        plugin,
        hook,
        item,
        reason,
        exc_info=(type(exc), exc, exc.__traceback__) if exc else None,
    )
    data = {"plugin": plugin, "hook": hook, "item": item, "reason": reason, **detail}
    try:
        await storage.submit(record_diagnostic_in_tx, kind, item, f"{plugin} {hook}: {reason}", data)
    except StorageError:
        raise
    except Exception:
        log.exception("could not record the diagnostic for %s", item)
