"""loom: a durable coordination runtime on trio.

The names below are loaded on first use (PEP 562), so ``import loom`` and the ``loom`` command line
start fast: a command that only talks to a server never imports the runtime.
"""

from __future__ import annotations as _annotations

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

__version__ = "0.1.0"

if _TYPE_CHECKING:
    from . import notices as notices
    from .config import CausalLimits as CausalLimits
    from .config import Config as Config
    from .plugins import hookimpl as hookimpl
    from .plugins.app import App as App
    from .records.budgets import BudgetLedger as BudgetLedger
    from .records.clock import Clock as Clock
    from .records.clock import ManualClock as ManualClock
    from .records.clock import OffsetClock as OffsetClock
    from .records.clock import SystemClock as SystemClock
    from .records.errors import CallParked as CallParked
    from .records.errors import CallRefused as CallRefused
    from .records.errors import CausalRefused as CausalRefused
    from .records.errors import ConfigError as ConfigError
    from .records.errors import Conflict as Conflict
    from .records.errors import IllegalTransition as IllegalTransition
    from .records.errors import InvalidRequest as InvalidRequest
    from .records.errors import LoomError as LoomError
    from .records.errors import NodeInUse as NodeInUse
    from .records.errors import NotAccepting as NotAccepting
    from .records.errors import NotAdoptable as NotAdoptable
    from .records.errors import NotFound as NotFound
    from .records.errors import SchemaTooNew as SchemaTooNew
    from .records.errors import StaleAuthority as StaleAuthority
    from .records.errors import StorageClosed as StorageClosed
    from .records.errors import StorageError as StorageError
    from .records.errors import StorageLost as StorageLost
    from .records.errors import StorageUnavailable as StorageUnavailable
    from .records.errors import WaitTimedOut as WaitTimedOut
    from .records.events import CausalRejection as CausalRejection
    from .records.events import Diagnostic as Diagnostic
    from .records.events import DiagnosticKind as DiagnosticKind
    from .records.events import Event as Event
    from .records.events import EventIn as EventIn
    from .records.events import KVEntry as KVEntry
    from .records.events import RejectionReason as RejectionReason
    from .records.executor import Executor as Executor
    from .records.executor import GateAnswer as GateAnswer
    from .records.executor import GatedCall as GatedCall
    from .records.executor import RefuseCall as RefuseCall
    from .records.executor import Toolbelt as Toolbelt
    from .records.executor import WaitForCall as WaitForCall
    from .records.results import WorkResult as WorkResult
    from .records.subscriptions import ReconcileReport as ReconcileReport
    from .records.subscriptions import Subscription as Subscription
    from .records.subscriptions import SubscriptionSpec as SubscriptionSpec
    from .records.subscriptions import SubscriptionState as SubscriptionState
    from .records.timers import FireRequest as FireRequest
    from .records.timers import Firing as Firing
    from .records.timers import FiringResult as FiringResult
    from .records.timers import Occurrence as Occurrence
    from .records.timers import Replacement as Replacement
    from .records.timers import Skip as Skip
    from .records.timers import Timer as Timer
    from .records.timers import TimerSpec as TimerSpec
    from .records.timers import TimerState as TimerState
    from .records.waits import Wait as Wait
    from .records.waits import Waiting as Waiting
    from .records.waits import WaitSpec as WaitSpec
    from .records.waits import WaitState as WaitState
    from .records.work import Capability as Capability
    from .records.work import Checkpoint as Checkpoint
    from .records.work import CheckpointStatus as CheckpointStatus
    from .records.work import Completed as Completed
    from .records.work import Decision as Decision
    from .records.work import Deliver as Deliver
    from .records.work import Drop as Drop
    from .records.work import Execution as Execution
    from .records.work import ExecutionState as ExecutionState
    from .records.work import Failed as Failed
    from .records.work import Handoff as Handoff
    from .records.work import Intent as Intent
    from .records.work import IntentKind as IntentKind
    from .records.work import IntentStatus as IntentStatus
    from .records.work import Lease as Lease
    from .records.work import Outcome as Outcome
    from .records.work import Policy as Policy
    from .records.work import Recovery as Recovery
    from .records.work import RetryState as RetryState
    from .records.work import RunRequest as RunRequest
    from .records.work import Unmatched as Unmatched
    from .records.work import Work as Work
    from .records.work import WorkState as WorkState
    from .runtime import PollReport as PollReport
    from .runtime import Runtime as Runtime
    from .runtime import Watch as Watch
    from .runtime import WorkHistory as WorkHistory
    from .runtime import open_runtime as open_runtime
    from .store import SQLiteStore as SQLiteStore

_WHERE: dict[str, str] = {
    "notices": ".",
    "CausalLimits": ".config",
    "Config": ".config",
    "hookimpl": ".plugins",
    "App": ".plugins.app",
    "BudgetLedger": ".records.budgets",
    "Clock": ".records.clock",
    "ManualClock": ".records.clock",
    "OffsetClock": ".records.clock",
    "SystemClock": ".records.clock",
    "CallParked": ".records.errors",
    "CallRefused": ".records.errors",
    "CausalRefused": ".records.errors",
    "ConfigError": ".records.errors",
    "Conflict": ".records.errors",
    "IllegalTransition": ".records.errors",
    "InvalidRequest": ".records.errors",
    "LoomError": ".records.errors",
    "NodeInUse": ".records.errors",
    "NotAccepting": ".records.errors",
    "NotAdoptable": ".records.errors",
    "NotFound": ".records.errors",
    "SchemaTooNew": ".records.errors",
    "StaleAuthority": ".records.errors",
    "StorageClosed": ".records.errors",
    "StorageError": ".records.errors",
    "StorageLost": ".records.errors",
    "StorageUnavailable": ".records.errors",
    "WaitTimedOut": ".records.errors",
    "CausalRejection": ".records.events",
    "Diagnostic": ".records.events",
    "DiagnosticKind": ".records.events",
    "Event": ".records.events",
    "EventIn": ".records.events",
    "KVEntry": ".records.events",
    "RejectionReason": ".records.events",
    "Executor": ".records.executor",
    "GateAnswer": ".records.executor",
    "GatedCall": ".records.executor",
    "RefuseCall": ".records.executor",
    "Toolbelt": ".records.executor",
    "WaitForCall": ".records.executor",
    "WorkResult": ".records.results",
    "ReconcileReport": ".records.subscriptions",
    "Subscription": ".records.subscriptions",
    "SubscriptionSpec": ".records.subscriptions",
    "SubscriptionState": ".records.subscriptions",
    "FireRequest": ".records.timers",
    "Firing": ".records.timers",
    "FiringResult": ".records.timers",
    "Occurrence": ".records.timers",
    "Replacement": ".records.timers",
    "Skip": ".records.timers",
    "Timer": ".records.timers",
    "TimerSpec": ".records.timers",
    "TimerState": ".records.timers",
    "Wait": ".records.waits",
    "Waiting": ".records.waits",
    "WaitSpec": ".records.waits",
    "WaitState": ".records.waits",
    "Capability": ".records.work",
    "Checkpoint": ".records.work",
    "CheckpointStatus": ".records.work",
    "Completed": ".records.work",
    "Decision": ".records.work",
    "Deliver": ".records.work",
    "Drop": ".records.work",
    "Execution": ".records.work",
    "ExecutionState": ".records.work",
    "Failed": ".records.work",
    "Handoff": ".records.work",
    "Intent": ".records.work",
    "IntentKind": ".records.work",
    "IntentStatus": ".records.work",
    "Lease": ".records.work",
    "Outcome": ".records.work",
    "Policy": ".records.work",
    "Recovery": ".records.work",
    "RetryState": ".records.work",
    "RunRequest": ".records.work",
    "Unmatched": ".records.work",
    "Work": ".records.work",
    "WorkState": ".records.work",
    "PollReport": ".runtime",
    "Runtime": ".runtime",
    "Watch": ".runtime",
    "WorkHistory": ".runtime",
    "open_runtime": ".runtime",
    "SQLiteStore": ".store",
}
"""Each public name and the module it comes from (``.``: a submodule of that name)."""

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> _Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'loom' has no attribute {name!r}")
    module = _importlib.import_module(f"loom.{name}" if where == "." else f"loom{where}")
    value = module if where == "." else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
