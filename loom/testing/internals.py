"""White-box access for fault-injection and negative-control tests: the parts `Runtime` keeps private.

These are test seams, not a stable API: a test that drives a kernel procedure on the storage actor
directly (a driver that breaks one rule on purpose) or asks the timer actor when it next wakes.
"""

from __future__ import annotations

from ..actors.timers import TimerActor
from ..runtime import Runtime
from ..store import StorageActor


def storage_of(runtime: Runtime) -> StorageActor:
    """The runtime's storage actor: ``await storage_of(rt).submit(procedure, *args)``."""
    return runtime._p.storage


def timer_actor_of(runtime: Runtime) -> TimerActor:
    """The running timer actor (its ``next_due_ms`` is the one deadline it keeps in memory)."""
    timers = runtime._p.timers
    if timers is None:
        raise LookupError("the timers actor is not running in this runtime")
    return timers
