"""The public API changes only on purpose."""

import loom
import loom.testing

EXPECTED = {
    "CausalLimits",
    "CausalRefused",
    "CallRefused",
    "CallParked",
    "GatedCall",
    "GateAnswer",
    "RefuseCall",
    "WaitForCall",
    "CausalRejection",
    "Clock",
    "Config",
    "ConfigError",
    "Conflict",
    "Event",
    "EventIn",
    "InvalidRequest",
    "KVEntry",
    "LoomError",
    "ManualClock",
    "NotAccepting",
    "NotAdoptable",
    "NotFound",
    "OffsetClock",
    "RejectionReason",
    "Runtime",
    "SQLiteStore",
    "SchemaTooNew",
    "StaleAuthority",
    "StorageClosed",
    "StorageError",
    "StorageLost",
    "StorageUnavailable",
    "WaitTimedOut",
    "App",
    "NodeInUse",
    "WorkResult",
    "SystemClock",
    "hookimpl",
    "open_runtime",
    "Executor",
    "Toolbelt",
    "Diagnostic",
    "PollReport",
    "WorkHistory",
    "FireRequest",
    "Firing",
    "FiringResult",
    "Occurrence",
    "Replacement",
    "Skip",
    "Timer",
    "TimerSpec",
    "TimerState",
    "Capability",
    "Checkpoint",
    "CheckpointStatus",
    "Completed",
    "Deliver",
    "Drop",
    "Execution",
    "ExecutionState",
    "Failed",
    "Handoff",
    "Intent",
    "IntentStatus",
    "Lease",
    "BudgetLedger",
    "Recovery",
    "Policy",
    "RunRequest",
    "Unmatched",
    "Work",
    "WorkState",
    "Decision",
    "Wait",
    "RetryState",
    "Waiting",
    "WaitSpec",
    "WaitState",
    "Outcome",
    "IntentKind",
    "Watch",
    "DiagnosticKind",
    "IllegalTransition",
    "notices",
    "ReconcileReport",
    "Subscription",
    "SubscriptionSpec",
    "SubscriptionState",
}


def test_loom_exports_exactly_the_public_api() -> None:
    # ``@py_builtins`` and ``@pytest_ar``: pytest rewrote loom's asserts (its pytest11 plugin makes it
    # a plugin distribution); they are not names anyone can import
    exported = {n for n in dir(loom) if not n.startswith(("_", "@"))} - {
        "actors",
        "kernel",
        "plugins",
        "store",
        "testing",
        "service",
        "records",
        "config",
        "runtime",
    }
    assert exported == EXPECTED


def test_errors_also_subclass_their_builtins() -> None:
    assert issubclass(loom.InvalidRequest, ValueError)
    assert issubclass(loom.NotFound, LookupError)
    assert issubclass(loom.StaleAuthority, PermissionError)
    assert issubclass(loom.CausalRefused, PermissionError)
    assert issubclass(loom.Conflict, RuntimeError)
    assert issubclass(loom.StorageError, OSError)
    assert all(
        issubclass(getattr(loom, n), loom.LoomError) for n in EXPECTED if n.endswith(("Error", "Refused"))
    )


def test_testing_exports() -> None:
    assert {"ManualClock", "OffsetClock", "Driver", "RuntimeDriver", "ScenarioFailure", "T0_MS"} <= set(
        dir(loom.testing)
    )
