"""White-box access for fault-injection and negative-control tests: the parts `Runtime` keeps private.

These are test seams, not a stable API: a test that drives a kernel procedure on the storage actor
directly (a driver that breaks one rule on purpose) or asks the timer actor when it next wakes.
"""

from __future__ import annotations

from ..actors.activity import Activity
from ..actors.router import RouterPool
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


def router_of(runtime: Runtime) -> RouterPool:
    """The running router (``concerned_by(notices)``: whether a committed batch wakes it)."""
    router = runtime._p.router
    if router is None:
        raise LookupError("the router is not running in this runtime")
    return router


def activity_of(runtime: Runtime) -> Activity:
    """What the running router's parts have in flight (``routed_waiters``: a step waits for an Event's
    routing checkpoint)."""
    return router_of(runtime)._s.activity
