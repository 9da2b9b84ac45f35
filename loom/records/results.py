"""A Work's outcome as callers read it (`Runtime.result`, ``GET /work/{id}/result``)."""

from __future__ import annotations

from typing import Any

import attrs

from .frozen import freeze
from .work import RetryState, WorkState


@attrs.frozen(kw_only=True)
class WorkResult:
    """A Work's outcome as it stands (`Runtime.result`): its state, and the value or the error of its
    last ended attempt.

    ``settled`` says nothing more happens by itself: the Work is terminal (``done``), or its retry
    budget is spent (``retry`` is ``exhausted``; it is held until an operator retries or cancels it).
    ``value`` is what the last ended attempt completed with (`Completed.value`); ``error`` is why it
    failed, when it failed. ``next_retry_at_ms`` is when its retry backoff ends (``None``: it is in
    none)."""

    work_id: str
    state: WorkState
    done: bool
    settled: bool
    value: Any = attrs.field(default=None, hash=False, converter=freeze)
    error: str | None = None
    attempts: int = 0
    failures: int = 0
    retry: RetryState | None = None
    next_retry_at_ms: int | None = None
    held: bool = False
    hold_reason: str | None = None
    execution_id: str | None = None
    """The attempt ``value`` or ``error`` comes from (``None``: no attempt has ended)."""
    ended_at_ms: int | None = None
