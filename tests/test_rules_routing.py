"""Routing rules checked one kernel transaction at a time on an in-memory store (docs/architecture.md:
routing applies a decision atomically and revalidates ownership). Each test names the rule and the wrong
implementation it catches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from loom import CausalLimits, EventIn, Policy
from loom.kernel.accept import accept_in_tx
from loom.kernel.control import cancel_in_tx
from loom.kernel.executions import BindingRef, ClaimRequest, KindPolicy, claim_in_tx
from loom.kernel.recovery import Expired, recover_claim_in_tx
from loom.kernel.resolve import RouteRef, RouteRequest
from loom.kernel.route_records import RouteResult
from loom.kernel.routing import route_in_tx
from loom.records.work import CheckpointStatus, Deliver
from loom.store import SQLiteStore, Tx
from loom.testing import T0_MS

R = TypeVar("R")
SCOPE = "acme"
LIMITS = CausalLimits()


class Kernel:
    def __init__(self) -> None:
        self.conn = SQLiteStore(path=":memory:").open_writer()
        self.n = 0
        self.now = T0_MS

    def run(self, proc: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            result = proc(Tx(self.conn), self.now, *args, **kwargs)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result

    def accept(self, event: EventIn, *, trusted: bool = False) -> Any:
        return self.run(lambda tx, now: accept_in_tx(tx, now, event, LIMITS, trusted=trusted))

    def event(self, key: str | None, *, scope: str = SCOPE, **fields: Any) -> Any:
        self.n += 1
        return self.accept(
            EventIn(source="t", delivery_id=f"e{self.n}", type="r.go", scope=scope, key=key, **fields)
        )

    def deliver(
        self,
        event_id: str,
        work_id: str,
        *,
        reopen: bool = False,
        policy: Policy = Policy.QUEUE,
        **decision: Any,
    ) -> RouteResult:
        work = self.run(lambda tx, now: tx.work(work_id))
        ref = RouteRef(name="r", scope=SCOPE, declared=policy, policy=policy, reopen=reopen)
        request = RouteRequest(
            event_id=event_id,
            decision=Deliver(work_id=work_id, **decision),
            route=ref,
            expected_revision=work.revision if work else None,
            generation=1,
        )
        return self.run(route_in_tx, request, LIMITS)

    def work_owning(self, key: str) -> str:
        work_id = f"w-{key}"
        result = self.deliver(self.event(key).id, work_id, create=True, attach_keys=(key,))
        assert result.checkpoint.status is CheckpointStatus.ROUTED
        return work_id

    def pending(self, work_id: str) -> tuple[str, ...]:
        return self.run(lambda tx, now: tx.work(work_id).pending_inputs)


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    k = Kernel()
    yield k
    k.conn.close()


def test_an_event_on_a_key_another_work_owns_is_not_delivered_elsewhere(kernel: Kernel) -> None:
    """A key has one owner: an Event on key ``a`` cannot be delivered to a Work that does not own
    ``a``. Catches: a delivery that skips the key-owner check (the owner's wait and acceptance order
    would never see that Event)."""
    kernel.work_owning("a")
    b = kernel.work_owning("b")
    event = kernel.event("a")
    result = kernel.deliver(event.id, b)
    assert result.checkpoint.status is CheckpointStatus.UNROUTED
    assert "owned by work w-a" in (result.checkpoint.reason or "")
    assert event.id not in kernel.pending(b)


def test_an_event_is_never_delivered_to_work_in_another_scope(kernel: Kernel) -> None:
    """Work belongs to one scope. Catches: a delivery that skips the scope check (a route in one
    scope could hand its Events to another tenant's Work)."""
    a = kernel.work_owning("a")
    event = kernel.event(None, scope="other")
    result = kernel.deliver(event.id, a)
    assert result.checkpoint.status is CheckpointStatus.UNROUTED
    assert "scope" in (result.checkpoint.reason or "")
    assert event.id not in kernel.pending(a)


def test_a_budget_event_of_another_work_can_be_delivered(kernel: Kernel) -> None:
    """A budget Event never becomes the input of the Work it counts, but routes can act on it:
    another Work may take it. Catches: a rule that drops every budget Event whatever Work it counts."""
    kernel.work_owning("a")
    watcher = kernel.work_owning("b")
    notice = kernel.accept(
        EventIn(
            source="core",
            delivery_id="budget.exceeded/usd/w-a/life",
            type="core.budget.exceeded",
            scope=SCOPE,
            payload={"work": "w-a", "budget": "usd"},
        ),
        trusted=True,
    )
    result = kernel.deliver(notice.id, watcher)
    assert result.checkpoint.status is CheckpointStatus.ROUTED
    assert notice.id in kernel.pending(watcher)


def test_an_event_naming_terminal_work_gets_terminal_never_a_successor(kernel: Kernel) -> None:
    """A late Event for terminal Work gets ``terminal``; only a keyed Event that does not name its Work
    may open a successor under a reopen route. Catches: a reopen that also applies to an Event naming
    the terminal Work itself (an explicit target would be silently redirected to a new Work)."""
    a = kernel.work_owning("a")
    kernel.run(cancel_in_tx, a)
    named = kernel.event("a", work_id=a)
    result = kernel.deliver(named.id, a, reopen=True)
    assert result.checkpoint.status is CheckpointStatus.TERMINAL
    assert result.checkpoint.work_id == a
    keyed = kernel.event("a")
    reopened = kernel.deliver(keyed.id, a, reopen=True)
    assert reopened.checkpoint.status is CheckpointStatus.ROUTED
    assert reopened.checkpoint.work_id != a, "the control case: a keyed Event does open a successor"


def test_an_inject_against_an_attempt_being_recovered_queues(kernel: Kernel) -> None:
    """Active-event policies apply to a running attempt only; other Work queues its input. Catches: a
    policy that looks only at whether an attempt exists (an inject against an attempt whose lease
    expired and is being recovered would be recorded as injected, though nothing can take it)."""
    a = kernel.work_owning("a")
    lease = kernel.run(
        claim_in_tx,
        ClaimRequest(
            work_id=a,
            owner="node-1",
            token="token-1",
            lease_ms=1_000,
            binding=BindingRef(name="fake", executor="fake", capabilities=frozenset({"inject"})),
            kind=KindPolicy(),
            capacity=None,
            generation=1,
            handed=True,
        ),
    )
    kernel.now = lease.expires_at_ms
    seen = Expired(execution_id=lease.execution_id, epoch=lease.epoch)
    recovery = kernel.run(recover_claim_in_tx, seen, owner="node-2", token="token-2", lease_ms=1_000)
    assert recovery is not None
    assert not recovery.relaunch
    event = kernel.event("a")
    result = kernel.deliver(event.id, a, policy=Policy.INJECT)
    assert result.checkpoint.status is CheckpointStatus.ROUTED
    assert result.checkpoint.effective_policy is Policy.QUEUE
    assert kernel.run(lambda tx, now: tx.intents_of_execution(lease.execution_id)) == []
    assert event.id in kernel.pending(a)
