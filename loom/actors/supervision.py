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
from ..records.validation import describe_exception
from ..store import StorageActor

log = logging.getLogger("loom.supervision")


describe = describe_exception
"""``Type: message`` of an exception, as every store keeps a reason (`describe_exception`)."""


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
