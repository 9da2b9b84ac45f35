"""White-box access for fault-injection and negative-control tests: the parts `Runtime` keeps private.

These are test seams, not a stable API: a test that drives a kernel procedure on the storage actor
directly (a driver that breaks one rule on purpose) or inspects the timer actor's in-memory heap.
"""

from __future__ import annotations

from ..actors.timer_service import TimerService
from ..runtime import Runtime
from ..store import StorageActor


def storage_of(runtime: Runtime) -> StorageActor:
    """The runtime's storage actor: ``await storage_of(rt).submit(procedure, *args)``."""
    return runtime._p.storage


def timer_service_of(runtime: Runtime) -> TimerService[str]:
    """The timer actor's in-memory service (its heap of armed timers); the timer actor must be running."""
    timers = runtime._p.timers
    if timers is None:
        raise LookupError("the timers actor is not running in this runtime")
    return timers.service
