"""Negative controls: each breaks exactly one rule (with ``monkeypatch``, for one run) and requires the
named shared scenario, or the pinned rule below, to fail with a `ScenarioFailure` naming that rule.

The unbroken runtime passes the same scenarios in `test_scenarios_routing` and `test_scenarios_causal`
on both backends; `test_every_control_breaks_a_shared_scenario` keeps the two lists joined.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import pytest

import loom.actors.ingress
import loom.actors.lanes
import loom.config.config
import loom.config.resolve
import loom.kernel.chains
import loom.kernel.executions
import loom.runtime._host
from loom import (
    CausalLimits,
    CausalRejection,
    Deliver,
    Event,
    EventIn,
    FireRequest,
    FiringResult,
    NotFound,
    TimerSpec,
    TimerState,
)
from loom.config.model import EffectiveBinding, ScopeConfig
from loom.config.resolve import scope_ancestry
from loom.kernel.accept import accept_derived_in_tx
from loom.kernel.causal import check_and_charge_in_tx
from loom.kernel.resolve import RouteRequest
from loom.kernel.routing import RouteResult, route_in_tx
from loom.kernel.timers import cancel_timer_in_tx
from loom.records.work import Execution, InputState
from loom.store import Tx
from loom.testing import T0_MS, RuntimeDriver, ScenarioFailure, scenarios
from loom.testing._scenario import expect
from loom.testing.pytest_plugin import DriverFactory

Scenario = Callable[[RuntimeDriver], Awaitable[None]]
Breaks = Callable[[pytest.MonkeyPatch], None]
RouteInTx = Callable[[Tx, int, RouteRequest, CausalLimits], RouteResult]
MINUTE = 60_000

# -- the broken rules -----------------------------------------------------------------------------------


def route_out_of_acceptance_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's per-Work order check in ``route_in_tx`` sees no earlier unrouted Event, so a later
    Event whose handler returns first is routed ahead (the backlog join on attachment and the
    completion check still see them: only the order check is broken)."""
    earlier_unrouted_for = Tx.earlier_unrouted_for

    def unordered(
        self: Tx, work_id: str, scope: str, keys: Sequence[str], before_seq: int, *, after_seq: int = 0
    ) -> list[Event]:
        if sys._getframe(2).f_code.co_name == "_check_order":  # the order check route_in_tx makes
            return []
        return earlier_unrouted_for(self, work_id, scope, keys, before_seq, after_seq=after_seq)

    monkeypatch.setattr(Tx, "earlier_unrouted_for", unordered)


def _merge(ancestor: Mapping[str, Any], descendant: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(ancestor)
    for key, value in descendant.items():
        inherited = merged.get(key)
        if isinstance(inherited, Mapping) and isinstance(value, Mapping):
            value = _merge(inherited, value)
        merged[key] = value
    return merged


def merge_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A descendant's binding is merged recursively into the inherited one instead of replacing it."""

    def merging(scopes: Mapping[str, ScopeConfig], scope: str) -> dict[str, EffectiveBinding]:
        found: dict[str, EffectiveBinding] = {}
        for ancestor in scope_ancestry(scope):
            declared = scopes.get(ancestor)
            for name, binding in declared.bindings.items() if declared is not None else ():
                inherited = found.get(name)
                if inherited is not None:
                    binding = attrs.evolve(
                        binding,
                        capabilities=inherited.binding.capabilities | binding.capabilities,
                        config=_merge(inherited.binding.config, binding.config),
                    )
                found[name] = EffectiveBinding(name=name, scope=ancestor, binding=binding)
        return found

    monkeypatch.setattr(loom.config.resolve, "resolve_bindings", merging)
    monkeypatch.setattr(loom.config.config, "resolve_bindings", merging)


def _router_route_in_tx(monkeypatch: pytest.MonkeyPatch, wrap: Callable[[RouteInTx], RouteInTx]) -> None:
    """Replace the ``route_in_tx`` the router's lanes apply decisions with: the kernel's, which they
    submit through `chains.route_then_start_in_tx` (re-bound there)."""
    assert loom.kernel.chains.route_in_tx is route_in_tx
    monkeypatch.setattr(loom.kernel.chains, "route_in_tx", wrap(route_in_tx))


def attach_keys_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router attaches a decision's keys one at a time, each checked just before it is attached:
    keys before an owned one stay attached when the owned one aborts the decision. (Without an owned
    key the outcome equals the atomic apply, so the wrapper leaves that case to it.)"""

    def wrap(apply: RouteInTx) -> RouteInTx:
        def one_at_a_time(tx: Tx, now_ms: int, req: RouteRequest, limits: CausalLimits) -> RouteResult:
            decision, event = req.decision, tx.event(req.event_id)
            if isinstance(decision, Deliver) and event is not None and tx.checkpoint(event.id) is None:
                free: list[str] = []
                for key in decision.attach_keys:
                    owner = tx.key_owner(key)
                    if owner is None:
                        free.append(key)
                    elif owner != decision.work_id:
                        for attached in free:  # attached before the owned key was reached
                            tx.attach_key(attached, decision.work_id, event.seq, now_ms)
                        break
            return apply(tx, now_ms, req, limits)

        return one_at_a_time

    _router_route_in_tx(monkeypatch, wrap)


def skip_work_revision_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The router's request claims the Work's current revision, so a decision made from a stale
    snapshot is applied instead of being re-evaluated."""

    def wrap(apply: RouteInTx) -> RouteInTx:
        def unchecked(tx: Tx, now_ms: int, req: RouteRequest, limits: CausalLimits) -> RouteResult:
            if isinstance(req.decision, Deliver) and (work := tx.work(req.decision.work_id)) is not None:
                req = attrs.evolve(req, expected_revision=work.revision)
            return apply(tx, now_ms, req, limits)

        return unchecked

    _router_route_in_tx(monkeypatch, wrap)


def charge_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replayed derived Event is charged to its root's budget (refused when the budget is full)."""

    def charging(
        tx: Tx, now_ms: int, event: EventIn, parent_id: str, limits: CausalLimits, **kwargs: Any
    ) -> Event | CausalRejection:
        accepted = accept_derived_in_tx(tx, now_ms, event, parent_id, limits, **kwargs)
        parent = tx.event(parent_id)
        if isinstance(accepted, Event) and accepted.duplicate and parent is not None:
            charged = check_and_charge_in_tx(tx, now_ms, event, parent, None, limits)
            if isinstance(charged, CausalRejection):
                return charged
        return accepted

    monkeypatch.setattr(loom.actors.ingress, "accept_derived_in_tx", charging)


def consume_without_dispatched_intent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A completion's ``consumed_inputs`` consumes any pending input it names, whether or not an inject
    intent for it was dispatched (or accepted)."""

    apply_proofs = loom.kernel.executions.apply_proofs_in_tx

    def over_claiming(tx: Tx, now_ms: int, execution: Execution, consumed: Sequence[str]) -> None:
        apply_proofs(tx, now_ms, execution, consumed)
        for event_id in dict.fromkeys(consumed):
            if tx.input_state(execution.work_id, event_id) is InputState.PENDING:
                tx.consume_input(execution.work_id, event_id, execution.id)

    monkeypatch.setattr(loom.kernel.executions, "apply_proofs_in_tx", over_claiming)


def cancel_without_tombstone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelling a timer deletes its row instead of keeping it as a revision tombstone."""

    def deleting(tx: Tx, now_ms: int, timer_id: str, revision: int) -> Any:
        cancelled = cancel_timer_in_tx(tx, now_ms, timer_id, revision)
        tx._conn.execute("DELETE FROM timers WHERE id = ?", (timer_id,))
        return cancelled

    monkeypatch.setattr(loom.runtime._host, "cancel_timer_in_tx", deleting)


# -- rules pinned here (not steps of a shared scenario) ---------------------------------------------------


async def timer_revision_tombstones(driver: RuntimeDriver) -> None:
    """A firing request for an older revision (cancelled, then recreated under a new one) does nothing:
    it answers ``stale`` and accepts no Event; the cancelled timer stays readable as a tombstone."""
    rt = driver.runtime
    at = T0_MS + MINUTE
    spec = TimerSpec(id="t", fire_at_ms=at, source="clock", type="clock.tick", scope="acme")
    armed = await rt.arm(spec)
    expect(armed.revision == 1, f"a new timer starts at revision 1: {armed}")
    await rt.cancel_timer("t", revision=1)
    try:
        tombstone = await rt.timer("t")
    except NotFound:
        tombstone = None
    expect(
        tombstone is not None and (tombstone.state, tombstone.revision) == (TimerState.CANCELLED, 1),
        f"the cancelled timer is not kept as a cancelled tombstone at revision 1: {tombstone}",
    )
    driver.clock.set(at)
    await driver.settle()

    async def accepted_ticks() -> list[Event]:
        return [e for e in await rt.events(limit=1000) if e.type == "clock.tick"]

    stale = await rt.fire(FireRequest(timer_id="t", revision=1, fire_at_ms=at))
    expect(
        stale.result is FiringResult.STALE and not await accepted_ticks(),
        f"a firing request for the cancelled revision 1 was not stale: {stale}",
    )
    again = await rt.arm(spec)  # the same definition, due now: recreated under a new revision
    expect(again.revision == 2, f"re-arming a cancelled timer did not recreate it at revision 2: {again}")
    stale = await rt.fire(FireRequest(timer_id="t", revision=1, fire_at_ms=at))
    expect(
        stale.result is FiringResult.STALE,
        f"a firing request for revision 1 fired the timer recreated at revision 2: {stale}",
    )
    await driver.settle()
    firings = await rt.firings("t")
    expect(
        [(f.revision, f.result) for f in firings] == [(2, FiringResult.ACCEPTED)],
        f"only revision 2 fires, once: {firings}",
    )
    ticks = await accepted_ticks()
    expect(
        [e.id for e in ticks] == [firings[0].event_id],
        f"the stale requests accepted an event: {ticks}",
    )


# -- the controls -------------------------------------------------------------------------------------------


@attrs.frozen
class Control:
    name: str
    breaks: Breaks
    scenario: Scenario
    match: str
    """A pattern of the failure message, naming the broken rule."""


CONTROLS = (
    Control(
        "out of acceptance order",
        route_out_of_acceptance_order,
        scenarios.multi_key_attachment_conflict_and_order,
        r"e7 was routed while the earlier e6|committed out of acceptance order",
    ),
    Control(
        "merged bindings",
        merge_bindings,
        scenarios.scope_route_inheritance,
        r"did not use acme/web's binding, which replaces the inherited one whole",
    ),
    Control(
        "keys attached one at a time",
        attach_keys_one_at_a_time,
        scenarios.multi_key_attachment_conflict_and_order,
        r"attached the free key k4 named before the owned k3 \(attachment is atomic\)",
    ),
    Control(
        "no Work revision check",
        skip_work_revision_check,
        scenarios.multi_key_attachment_conflict_and_order,
        r"applied from a stale Work snapshot",
    ),
    Control(
        "replays charged",
        charge_replays,
        scenarios.causal_depth_rate_replay_and_clock,
        r"a replay is not charged",
    ),
    Control(
        "consumed without a dispatched intent",
        consume_without_dispatched_intent,
        scenarios.completion_inject_orders,
        r"consumed an input whose inject intent was never dispatched or was not accepted",
    ),
)
PINNED = (
    Control(
        "timer cancelled without a tombstone",
        cancel_without_tombstone,
        timer_revision_tombstones,
        r"not kept as a cancelled tombstone",
    ),
)


@pytest.mark.parametrize("control", CONTROLS + PINNED, ids=lambda c: c.name)
async def test_breaking_one_rule_fails_its_scenario(
    control: Control, loom_drivers: DriverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    control.breaks(monkeypatch)
    async with loom_drivers() as driver:
        with pytest.raises(ScenarioFailure, match=control.match):
            await control.scenario(driver)


@pytest.mark.parametrize("pinned", PINNED, ids=lambda c: c.scenario.__name__)
async def test_pinned_rule_holds(pinned: Control, loom_drivers: DriverFactory) -> None:
    async with loom_drivers() as driver:
        await pinned.scenario(driver)


def test_every_control_breaks_a_shared_scenario() -> None:
    """Each control's scenario is one the unbroken runtime passes in the scenario tests."""
    assert all(c.scenario in scenarios.ALL_SCENARIOS for c in CONTROLS)
    assert {c.scenario for c in CONTROLS} >= {
        scenarios.multi_key_attachment_conflict_and_order,
        scenarios.scope_route_inheritance,
    }
