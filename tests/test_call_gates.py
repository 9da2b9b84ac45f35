"""Gated calls (docs/recovery.md "Gated calls"): a call gate turns a toolbelt call into a wait under the same
registration rules, or refuses it; a refusal is the call's result and changes no state.

An execution under the python executor makes the calls (an approval flow: deploying needs an
``approval.granted`` Event on the Work's key). Each test names the wrong implementation it catches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from loom import (
    CallParked,
    CallRefused,
    Completed,
    Config,
    DiagnosticKind,
    EventIn,
    ExecutionState,
    GatedCall,
    RefuseCall,
    RunRequest,
    Toolbelt,
    WaitForCall,
    WaitSpec,
    WaitState,
    WorkState,
    hookimpl,
)
from loom.plugins.handlers import work_id_for_key
from loom.plugins.python_executor import PythonExecutor

SCOPE = "acme"


class Approvals:
    """Call gate ``approvals``: a ``deploy`` (an executor's own operation) or an emit of ``prod.*``
    waits for ``approval.granted`` unless the Work was approved; ``delete`` is always refused."""

    def __init__(self) -> None:
        self.approved: set[str] = set()
        self.calls: list[GatedCall] = []
        self.answer: Callable[[GatedCall], Any] | None = None

    @hookimpl
    def loom_call_gates(self) -> dict[str, Any]:
        return {"approvals": self.decide}

    def decide(self, call: GatedCall) -> Any:
        self.calls.append(call)
        if self.answer is not None:
            return self.answer(call)
        if call.operation == "delete":
            return RefuseCall(reason="deletes are not allowed from executions")
        event = call.args.get("event")
        gated = call.operation == "deploy" or (event is not None and event.type.startswith("prod."))
        if gated and call.work_id not in self.approved:
            return WaitForCall(wait=WaitSpec(types=("approval.*",), timeout_ms=3_600_000))
        return None


def config(*, resume: bool = False) -> Config:
    binding: dict[str, Any] = {"executor": "python", "config": {"function": "job"}}
    if resume:
        binding["capabilities"] = ["resume"]
    return Config.from_dict(
        {
            "scopes": {
                SCOPE: {
                    "bindings": {"py": binding},
                    "routes": [
                        {"name": "r", "types": ["job.*", "approval.*"], "create_work": True, "binding": "py"}
                    ],
                }
            }
        }
    )


def ev(delivery_id: str, type: str = "job.start", key: str = "a") -> EventIn:
    return EventIn(source="t", delivery_id=delivery_id, type=type, scope=SCOPE, key=key)


@pytest.fixture
def gate() -> Approvals:
    return Approvals()


@pytest.fixture
def executor() -> PythonExecutor:
    return PythonExecutor()


async def test_a_refusal_is_the_calls_result_and_changes_nothing(
    loom_drivers: Any, gate: Approvals, executor: PythonExecutor
) -> None:
    """Catches: a refused call that runs anyway, or a refusal that fails (or parks) the attempt."""
    seen: list[BaseException] = []

    @executor.function("job")
    async def job(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        try:
            await toolbelt.gated("delete", {"what": "everything"})
        except CallRefused as refused:
            seen.append(refused)
        return Completed()

    async with loom_drivers(config=config(), plugins=[gate, executor]) as driver:
        rt = driver.runtime
        await rt.publish(ev("a-0"))
        await driver.settle()
        (refused,) = seen
        assert "deletes are not allowed" in str(refused)
        assert (refused.gate, refused.operation) == ("approvals", "delete")  # type: ignore[attr-defined]
        work = await rt.work(work_id_for_key(SCOPE, "a"))
        assert work.state is WorkState.COMPLETED
        assert await rt.waits(work.id) == []


async def test_a_gate_turns_an_emit_into_a_wait_and_the_call_runs_after_the_wake(
    loom_drivers: Any, gate: Approvals, executor: PythonExecutor
) -> None:
    """Catches: a gated emit that publishes before the wait (the gate would approve nothing), a
    gated call that fails the attempt instead of parking it, or a continuation that skips the gate."""
    outcomes: list[str] = []

    @executor.function("job")
    async def job(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        try:
            await toolbelt.emit(ev(f"deploy-{request.attempt}", "prod.deploy"))
        except CallParked:
            outcomes.append(f"parked {request.attempt}")
            raise
        outcomes.append(f"emitted {request.attempt}")
        return Completed()

    async with loom_drivers(config=config(), plugins=[gate, executor]) as driver:
        rt = driver.runtime
        await rt.publish(ev("a-0"))
        await driver.settle()
        work_id = work_id_for_key(SCOPE, "a")
        assert outcomes == ["parked 1"]
        work = await rt.work(work_id)
        assert work.state is WorkState.WAITING
        (wait,) = await rt.waits(work_id)
        assert (wait.state, wait.types) == (WaitState.ACTIVE, ("approval.*",))
        assert wait.timeout_at_ms is not None
        assert not [e for e in await rt.events(limit=100) if e.type == "prod.deploy"], "the gated emit ran"
        execution = await rt.execution(wait.execution_id)
        assert execution.state is ExecutionState.WAITED, "the gated attempt failed instead of parking"
        assert await rt.diagnostics(kind=DiagnosticKind.EXECUTOR_FAILED) == []

        gate.approved.add(work_id)
        await rt.publish(ev("ok", "approval.granted"))
        await driver.settle()
        assert outcomes == ["parked 1", "emitted 2"]
        (woken,) = await rt.waits(work_id)
        assert woken.state is WaitState.WOKEN
        assert [c.operation for c in gate.calls] == ["emit", "emit"], "the gate did not decide again"
        assert [e.delivery_id for e in await rt.events(limit=100) if e.type == "prod.deploy"] == ["deploy-2"]


async def test_a_resume_capable_attempt_parks_on_the_gate_and_resumes_at_a_higher_epoch(
    loom_drivers: Any, gate: Approvals
) -> None:
    """Catches: a gated park that ends the attempt although its binding can resume it, or a resume
    that keeps the old token valid."""

    class Resumable(PythonExecutor):
        capabilities = frozenset({"inject", "interrupt", "resume"})

        async def resume(self, request: RunRequest, toolbelt: Toolbelt) -> Any:
            return await self.launch(request, toolbelt)

    executor = Resumable()
    leases: list[Any] = []

    @executor.function("job")
    async def job(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        leases.append(toolbelt.lease)
        await toolbelt.gated("deploy", {"target": "prod"})
        return Completed()

    async with loom_drivers(config=config(resume=True), plugins=[gate, executor]) as driver:
        rt = driver.runtime
        await rt.publish(ev("a-0"))
        await driver.settle()
        work_id = work_id_for_key(SCOPE, "a")
        execution = await rt.execution(leases[0].execution_id)
        assert execution.state is ExecutionState.PARKED
        gate.approved.add(work_id)
        await rt.publish(ev("ok", "approval.granted"))
        await driver.settle()
        first, second = leases
        assert (second.execution_id, second.attempt, second.epoch) == (first.execution_id, 1, first.epoch + 1)
        assert (await rt.work(work_id)).state is WorkState.COMPLETED


async def test_a_gate_timeout_wakes_the_attempt_like_any_wait(
    loom_drivers: Any, gate: Approvals, executor: PythonExecutor
) -> None:
    """Catches: a gated wait registered without its timeout (an approval never given would strand
    the Work)."""
    attempts: list[int] = []

    @executor.function("job")
    async def job(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        attempts.append(request.attempt)
        if request.attempt == 1:
            await toolbelt.gated("deploy")
        return Completed()

    async with loom_drivers(config=config(), plugins=[gate, executor]) as driver:
        await driver.runtime.publish(ev("a-0"))
        await driver.settle()
        driver.clock.advance(3_600_000)
        await driver.settle()
        assert attempts == [1, 2]
        (wait,) = await driver.runtime.waits(work_id_for_key(SCOPE, "a"))
        winner = await driver.runtime.event(wait.winner_event_id or "")
        assert winner.type == "core.wait.timeout"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (lambda call: 1 / 0, "ZeroDivisionError"),
        (lambda call: "yes", "answers None, RefuseCall or WaitForCall"),
        (lambda call: RefuseCall(reason=""), "reason"),
        (lambda call: WaitForCall(wait="approval"), "wait"),  # type: ignore[arg-type]
        # waits the state of things refuses: the gate's fault too (it used to reach the caller as a
        # bare Conflict, with no diagnostic)
        (lambda call: WaitForCall(wait=WaitSpec(types=("x.*",), keys=("not-mine",))), "not owned"),
        (lambda call: WaitForCall(wait=WaitSpec(types=("x.*",), after_seq=10**9)), "beyond accepted"),
    ],
    ids=["raises", "malformed", "empty-reason", "bad-wait", "unowned-key", "future-after-seq"],
)
async def test_a_failing_or_malformed_gate_refuses_the_call_with_a_diagnostic(
    loom_drivers: Any, gate: Approvals, executor: PythonExecutor, answer: Any, why: str
) -> None:
    """Catches: a gate failure that escapes into the executor as a builtin error (failing the attempt),
    or one taken as a pass (the gated call would run unchecked)."""
    gate.answer = answer
    seen: list[BaseException] = []

    @executor.function("job")
    async def job(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        try:
            await toolbelt.emit(ev("prod-0", "prod.deploy"))
        except CallRefused as refused:
            seen.append(refused)
        return Completed()

    async with loom_drivers(config=config(), plugins=[gate, executor]) as driver:
        await driver.runtime.publish(ev("a-0"))

        async def answered() -> bool:  # (the function runs outside what settling waits for)
            if not seen:
                return False
            work = await driver.runtime.work(work_id_for_key(SCOPE, "a"))
            return work.state is WorkState.COMPLETED

        await driver.until(answered, "the gated call's answer and the attempt's end")
        await driver.settle()
        (refused,) = seen
        assert why in str(refused)
        (diagnostic,) = await driver.runtime.diagnostics(kind=DiagnosticKind.GATE_FAILED)
        assert diagnostic.detail["operation"] == "emit"
        assert not [e for e in await driver.runtime.events(limit=100) if e.type == "prod.deploy"]


async def test_an_async_gate_is_awaited(loom_drivers: Any, executor: PythonExecutor) -> None:
    """Catches: an async gate's coroutine taken as its answer (it would be refused as malformed, or
    let through unawaited)."""

    class Async:
        @hookimpl
        def loom_call_gates(self) -> dict[str, Any]:
            async def refuse_later(call: GatedCall) -> RefuseCall:
                await trio.lowlevel.checkpoint()
                return RefuseCall(reason="decided asynchronously")

            return {"async": refuse_later}

    seen: list[str] = []

    @executor.function("job")
    async def job(request: RunRequest, toolbelt: Toolbelt) -> Completed:
        try:
            await toolbelt.emit(ev("free-0", "free.note"))
        except CallRefused as refused:
            seen.append(str(refused))
        return Completed()

    async with loom_drivers(config=config(), plugins=[Async(), executor]) as driver:
        await driver.runtime.publish(ev("a-0"))
        await driver.settle()
        assert seen == ["call gate 'async' refused emit: decided asynchronously"]
