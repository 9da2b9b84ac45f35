"""Call gates guard every toolbelt (docs/recovery.md "Gated calls"): the one a host builds
(`Runtime.toolbelt`) and the service's HTTP toolbelt a shell command calls, as well as the one the
runtime hands an executor in its process (`test_call_gates`). A refused call is `403 call_refused` and
changes nothing; a call a gate turns into a wait is `409 call_parked`, the attempt is parked, and its
token is stale from then on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from service_kit import Api, api, order, refusal

import loom
from loom import (
    CallParked,
    CallRefused,
    ExecutionState,
    GatedCall,
    RefuseCall,
    WaitForCall,
    WaitSpec,
    hookimpl,
)


class Gate:
    """Refuses an emit of ``prod.*``; turns arming a timer into a wait for ``approval.*``."""

    def __init__(self) -> None:
        self.calls: list[GatedCall] = []

    @hookimpl
    def loom_call_gates(self) -> dict[str, Any]:
        return {"guard": self.decide}

    def decide(self, call: GatedCall) -> Any:
        self.calls.append(call)
        event = call.args.get("event")
        if event is not None and event.type.startswith("prod."):
            return RefuseCall(reason="no production events from attempts")
        if call.operation == "arm_timer":
            return WaitForCall(wait=WaitSpec(types=("approval.*",)))
        return None


async def claimed(a: Api, n: int) -> loom.Lease:
    assert (await a.client.post("/events", json=order(n))).status_code == 201
    await a.rt.wait_idle()
    work = await a.rt.work_for_key(f"order/{n}")
    return await a.rt.claim(work.id, owner="host")


def bearer(lease: loom.Lease) -> dict[str, str]:
    return {"Authorization": f"Bearer {lease.token}"}


def emitted(type: str) -> dict[str, Any]:
    return {"source": "job", "delivery_id": f"job/{type}", "type": type, "scope": "shop"}


async def test_the_http_toolbelt_asks_the_call_gates(tmp_path: Path) -> None:
    """Catches a shell command that goes around a gate through `$LOOM_URL` (the HTTP toolbelt was not
    gated), a refusal that changes something, and a park answered as a server fault."""
    gate = Gate()
    async with api(tmp_path, plugins=(gate,)) as a:
        lease = await claimed(a, 1)
        tools = f"/executions/{lease.execution_id}"
        refused = await a.unchanged(
            a.client.post(f"{tools}/emit", json=emitted("prod.deploy"), headers=bearer(lease))
        )
        body = refusal(refused, 403, "call_refused")
        assert "call gate 'guard' refused emit: no production events from attempts" in body["message"]
        assert [call.operation for call in gate.calls] == ["emit"]
        assert gate.calls[0].execution_id == lease.execution_id
        let_through = await a.client.post(f"{tools}/emit", json=emitted("test.ran"), headers=bearer(lease))
        assert let_through.status_code == 201, let_through.text
        timer = {"id": "remind", "fire_at_ms": a.clock.now_ms() + 60_000, "source": "job", "type": "job.remind",
                 "scope": "shop"}  # fmt: skip
        parked = await a.client.post(f"{tools}/timer", json=timer, headers=bearer(lease))
        body = refusal(parked, 409, "call_parked")
        assert "turned arm_timer into a wait" in body["message"]
        execution = await a.rt.execution(lease.execution_id)
        assert execution.state is ExecutionState.WAITED, "the attempt waits on the gate's wait"
        assert [wait.state.value for wait in await a.rt.waits(lease.work_id)] == ["active"]
        assert [t.id for t in await a.rt.timers(work_id=lease.work_id)] == [], "the gated call did not run"
        after = await a.client.post(f"{tools}/emit", json=emitted("test.again"), headers=bearer(lease))
        refusal(after, 403, "stale_authority")


async def test_a_toolbelt_a_host_builds_asks_the_call_gates(tmp_path: Path) -> None:
    """Catches `Runtime.toolbelt` going around the gates (a host's own executor could emit what every
    other path refuses)."""
    gate = Gate()
    async with api(tmp_path, plugins=(gate,)) as a:
        lease = await claimed(a, 2)
        toolbelt = a.rt.toolbelt(lease)
        with pytest.raises(CallRefused, match="no production events from attempts"):
            await toolbelt.emit(loom.EventIn(**emitted("prod.deploy")))
        with pytest.raises(CallParked):
            await toolbelt.arm_timer(
                loom.TimerSpec(
                    id="remind",
                    fire_at_ms=a.clock.now_ms() + 60_000,
                    source="job",
                    type="job.r",
                    scope="shop",
                )
            )
        assert (await a.rt.execution(lease.execution_id)).state is ExecutionState.WAITED
