"""Budgets (docs/recovery.md "Budgets"): ledgers per Work, scope and every scope over a life, a UTC day or a UTC
week; a turn does not start once a ledger reached its limit; warning and limit Events.

Host-driven runtimes (no background actors) make each step one call, plus one test through the
router's starter. Each test names the wrong implementation it catches.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loom import (
    CausalLimits,
    Completed,
    Config,
    ConfigError,
    Conflict,
    EventIn,
    InvalidRequest,
    Lease,
    Policy,
    Runtime,
    Waiting,
    WaitSpec,
    WaitState,
    WorkState,
    open_runtime,
)
from loom.config import BudgetWindow
from loom.kernel.accept import accept_in_tx
from loom.kernel.budgets import window_of
from loom.kernel.executions import BindingRef
from loom.kernel.resolve import RouteRef, RouteRequest
from loom.kernel.routing import route_in_tx
from loom.plugins.handlers import work_id_for_key
from loom.records.work import CheckpointStatus, Deliver
from loom.store import SQLiteStore, Tx
from loom.testing import T0_MS, ManualClock, RuntimeDriver

SCOPE = "acme"
DAY = 86_400_000


def config(*budgets: dict[str, Any], scopes: tuple[str, ...] = (SCOPE,)) -> Config:
    # standing Work: a completed turn leaves it ready for the next Event's turn
    route = {"name": "r", "types": ["r.*"], "create_work": True, "work_kind": "job"}
    return Config.from_dict(
        {
            "scopes": {scope: {"routes": [route]} for scope in scopes},
            "work_kinds": {"job": {"standing": True}},
            "budgets": list(budgets),
        }
    )


def usd(limit: float, **more: Any) -> dict[str, Any]:
    return {"name": "usd", "unit": "usd", "limit": limit, **more}


@pytest.fixture
def budgets() -> list[dict[str, Any]]:
    return [usd(10, warning=8)]


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock, budgets: list[dict[str, Any]]) -> AsyncIterator[Runtime]:
    cfg = config(*budgets)
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        yield rt


async def turn(rt: Runtime, key: str = "a", n: int = 0, *, scope: str = SCOPE) -> Lease:
    await rt.publish(EventIn(source="t", delivery_id=f"{key}-{n}", type="r.go", scope=scope, key=key))
    await rt.poll()
    return await rt.claim(work_id_for_key(scope, key), owner="host")


async def spend(rt: Runtime, lease: Lease, amount: float) -> None:
    await rt.complete(lease, Completed(usage={"usd": amount}))


async def budget_events(rt: Runtime) -> list[Any]:
    return [e for e in await rt.events(limit=1000) if e.type.startswith("core.budget.")]


# -- configuration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "key", "reason"),
    [
        (usd(0), "limit", "above 0"),
        (usd(5, warning=5), "warning", "below the limit"),
        ({"name": "usd", "limit": 5}, "unit", "is required"),
        (usd(5, per="day"), "per", "unknown budget ledger"),
        (usd(5, window="month"), "window", "unknown budget window"),
        (usd(5, scope="/bad"), "scope", ""),
    ],
)
def test_a_bad_budget_is_refused_naming_its_key(budget: dict[str, Any], key: str, reason: str) -> None:
    """Catches: a budget with no limit, a warning at or over it, or an unknown ledger kind accepted
    (a budget that can never hold anything, or holds everything)."""
    with pytest.raises(ConfigError, match=rf"budgets\[0\]\.{key}: .*{reason}"):
        config(budget)


def test_budget_names_are_unique() -> None:
    with pytest.raises(ConfigError, match=r"budgets\[1\]\.name: budget 'usd' is declared twice"):
        config(usd(5), {**usd(6), "unit": "tokens"})


def test_windows_are_utc_days_and_iso_weeks_from_monday() -> None:
    """Catches: local-time windows, or weeks starting on Sunday (or at the epoch's Thursday)."""
    sunday = int(datetime.datetime(2026, 11, 29, 23, 59, 59, 999000, tzinfo=datetime.UTC).timestamp() * 1000)
    monday = sunday + 1
    assert window_of(BudgetWindow.DAY, sunday) == "day:2026-11-29"
    assert window_of(BudgetWindow.DAY, monday) == "day:2026-11-30"
    assert window_of(BudgetWindow.WEEK, sunday) == "week:2026-W48"
    assert window_of(BudgetWindow.WEEK, monday) == "week:2026-W49"
    assert window_of(BudgetWindow.LIFE, monday) == "life"


def test_windows_are_utc_whatever_the_hosts_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Budget windows are UTC days and weeks. Catches: windows computed in the host's local time (a
    host at UTC+14 would put Sunday 23:59 UTC in Monday's day and the next ISO week)."""
    sunday = int(datetime.datetime(2026, 11, 29, 23, 59, 0, tzinfo=datetime.UTC).timestamp() * 1000)
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        assert datetime.datetime.fromtimestamp(sunday / 1000).day == 30, "the host zone is not in effect"
        assert window_of(BudgetWindow.DAY, sunday) == "day:2026-11-29"
        assert window_of(BudgetWindow.WEEK, sunday) == "week:2026-W48"
    finally:
        monkeypatch.undo()
        time.tzset()


# -- usage is charged; a turn does not start at the limit ----------------------------------------------


async def test_usage_adds_up_per_work_and_a_turn_stops_at_the_limit(rt: Runtime) -> None:
    """Catches: a ledger that keeps only the last result, a check at ``>`` instead of ``>=`` (one turn
    too many), or a refused turn that leaves the Work claimable (a poll loop would keep trying) or
    terminal."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 6)
    lease = await turn(rt, "a", 1)
    await spend(rt, lease, 4)  # 10 of 10: the limit is reached
    (ledger,) = await rt.budget_ledgers(subject=lease.work_id)
    assert (ledger.amount, ledger.window, ledger.exceeded) == (10, "life", True)
    await rt.publish(EventIn(source="t", delivery_id="a-2", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    with pytest.raises(Conflict, match="budget 'usd' reached its limit: 10 of 10 usd"):
        await rt.claim(lease.work_id, owner="host")
    work = await rt.work(lease.work_id)
    assert work.held
    assert "release the work for one more turn, or raise the limit" in (work.hold_reason or "")
    assert work.state is WorkState.READY
    await rt.publish(EventIn(source="t", delivery_id="a-3", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    assert len((await rt.work(lease.work_id)).pending_inputs) == 2, "input stops queueing while held"
    # another Work has its own ledger
    other = await turn(rt, "b", 0)
    assert other.attempt == 1


async def test_a_release_allows_exactly_one_more_turn(rt: Runtime) -> None:
    """Catches: a release that clears the budget for good (every later turn would run over it), or one
    the budget check ignores (the Work could never run again without raising the limit)."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 10)
    with pytest.raises(Conflict):
        await turn(rt, "a", 1)
    await rt.release(lease.work_id)
    lease = await rt.claim(lease.work_id, owner="host")
    await spend(rt, lease, 1)
    with pytest.raises(Conflict, match="11 of 10"):
        await turn(rt, "a", 2)
    assert (await rt.work(lease.work_id)).held


async def test_releasing_a_hold_of_a_running_work_grants_no_turn_past_its_budget(rt: Runtime) -> None:
    """The one more turn a release grants answers a budget hold (or a start gate's, before the first
    start). Catches a release of an operator's hold on a running Work that left the next turn free of
    the budget: the attempt then spent past the limit, and the next turn started anyway (seen: the
    ledger at 15 of 10 and attempt 2 running)."""
    lease = await turn(rt, "a", 0)
    await rt.hold(lease.work_id, reason="look at it")
    await rt.release(lease.work_id)
    await spend(rt, lease, 15)
    with pytest.raises(Conflict, match="15 of 10"):
        await turn(rt, "a", 1)
    assert (await rt.work(lease.work_id)).held


@pytest.mark.parametrize("budgets", [[{"name": "turns", "unit": "turns", "limit": 1}]])
async def test_a_release_lets_one_resume_through_and_no_more(rt: Runtime) -> None:
    """A resumed attempt is a turn like any other (docs/recovery.md, "Budgets"): an operator's release
    lets exactly one more through, whether it starts an attempt or resumes a parked one. Catches: a
    resume that leaves the release in force (every later resume of the parked attempt would run over
    the limit without another release)."""
    resumable = BindingRef(name=None, executor=None, capabilities=frozenset({"resume"}))
    await rt.publish(EventIn(source="t", delivery_id="a-0", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    lease = await rt.claim(work_id_for_key(SCOPE, "a"), owner="host", binding=resumable)  # 1 of 1 turns
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("r.go",))))
    for n in (1, 2):
        await rt.publish(EventIn(source="t", delivery_id=f"a-{n}", type="r.go", scope=SCOPE, key="a"))
        await rt.poll()
        assert (await rt.waits(lease.work_id))[-1].state is WaitState.WOKEN
        with pytest.raises(Conflict, match="budget 'turns' reached its limit"):
            await rt.claim(lease.work_id, owner="host", binding=resumable)
        assert (await rt.work(lease.work_id)).held
        await rt.release(lease.work_id)
        resumed = await rt.claim(lease.work_id, owner="host", binding=resumable)
        assert (resumed.execution_id, resumed.request.resumed) == (lease.execution_id, True)
        assert not (await rt.work(lease.work_id)).released, "the release is spent by the resume"
        await rt.complete(resumed, Waiting(wait=WaitSpec(types=("r.go",))))


async def test_usage_added_to_a_parked_attempt_counts_against_the_budget(rt: Runtime) -> None:
    """A host's later acknowledgement of a parked attempt may add usage (`Runtime.enrich_wait`), and that
    usage is charged to the Work's ledgers like a result's. Catches: an enrichment that records the
    usage on the attempt but charges no ledger (the spend would escape its limit)."""
    resumable = BindingRef(name=None, executor=None, capabilities=frozenset({"resume"}))
    await rt.publish(EventIn(source="t", delivery_id="a-0", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    lease = await rt.claim(work_id_for_key(SCOPE, "a"), owner="host", binding=resumable)
    await rt.complete(lease, Waiting(wait=WaitSpec(types=("r.go",)), usage={"usd": 3}))
    await rt.enrich_wait(lease, usage={"usd": 7})
    (ledger,) = await rt.budget_ledgers(subject=lease.work_id)
    assert (ledger.amount, ledger.exceeded) == (10, True)


async def test_raising_the_limit_releases_the_work_it_held(rt: Runtime) -> None:
    """Catches: a budget hold that only an operator's release can end (a raised limit would leave the
    Work stuck)."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 10)
    with pytest.raises(Conflict):
        await turn(rt, "a", 1)
    rt.reload(config(usd(20)))
    await rt.poll()
    work = await rt.work(lease.work_id)
    assert not work.held
    assert (await rt.claim(work.id, owner="host")).attempt == 2


async def test_a_changed_budget_still_reached_keeps_the_work_held(rt: Runtime) -> None:
    """A configuration change releases only the Work whose ledgers are all below their limits now.
    Catches: a reload that lifts every budget hold (a Work still at its limit would start another
    turn)."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 10)
    with pytest.raises(Conflict):
        await turn(rt, "a", 1)
    rt.reload(config(usd(10, warning=5)))
    await rt.poll()
    work = await rt.work(lease.work_id)
    assert work.held
    assert "budget 'usd' reached its limit" in (work.hold_reason or "")
    with pytest.raises(Conflict):
        await rt.claim(work.id, owner="host")


async def test_an_operator_hold_is_not_lifted_by_a_raised_limit(rt: Runtime) -> None:
    """Catches: a raised limit that releases every held Work, whoever held it."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 10)
    with pytest.raises(Conflict):
        await turn(rt, "a", 1)
    await rt.hold(lease.work_id, reason="audit first")
    rt.reload(config(usd(20)))
    await rt.poll()
    work = await rt.work(lease.work_id)
    assert (work.held, work.hold_reason) == (True, "audit first")


@pytest.mark.parametrize("budgets", [[usd(10, per="scope")]])
async def test_a_scope_ledger_adds_up_every_work_in_the_scope(rt: Runtime) -> None:
    """Catches: ledgers kept per Work only (a scope budget would never be reached)."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 6)
    lease = await turn(rt, "b", 0)
    await spend(rt, lease, 4)
    (ledger,) = await rt.budget_ledgers()
    assert (ledger.subject, ledger.amount) == (SCOPE, 10)
    with pytest.raises(Conflict, match="scope acme"):
        await turn(rt, "c", 0)


async def test_an_all_scopes_ledger_and_the_budget_scope_filter(loom_store: str, clock: ManualClock) -> None:
    """Catches: an ``all`` ledger split by scope, or a budget charged for Work outside its scope."""
    cfg = config(
        usd(10, per="all", name="all-usd"),
        {"name": "web-usd", "unit": "usd", "limit": 100, "scope": "acme/web"},
        scopes=(SCOPE, "acme/web", "other"),
    )
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        await spend(rt, await turn(rt, "a", 0, scope="acme/web"), 3)
        await spend(rt, await turn(rt, "b", 0, scope="other"), 7)
        ledgers = {(x.budget, x.subject): x.amount for x in await rt.budget_ledgers()}
        assert ledgers == {("all-usd", "*"): 10, ("web-usd", work_id_for_key("acme/web", "a")): 3}
        with pytest.raises(Conflict, match="all-usd"):
            await turn(rt, "c", 0, scope="acme")


@pytest.mark.parametrize("budgets", [[usd(10, window="day")]])
async def test_a_day_ledger_starts_again_each_utc_day(rt: Runtime, clock: ManualClock) -> None:
    """Catches: a day window that never rolls over (a daily budget would become a lifetime one)."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 10)
    with pytest.raises(Conflict):
        await turn(rt, "a", 1)
    await rt.release(lease.work_id)
    clock.advance(DAY)
    lease = await rt.claim(lease.work_id, owner="host")
    await spend(rt, lease, 9)
    windows = {x.window: x.amount for x in await rt.budget_ledgers()}
    assert windows == {"day:2026-01-01": 10, "day:2026-01-02": 9}
    await rt.publish(EventIn(source="t", delivery_id="a-9", type="r.go", scope=SCOPE, key="a"))
    await rt.poll()
    assert (await rt.claim(lease.work_id, owner="host")).attempt == 3


@pytest.mark.parametrize("budgets", [[{"name": "turns", "unit": "turns", "limit": 2}]])
async def test_the_runtime_counts_turns_itself(rt: Runtime) -> None:
    """Catches: turns counted from executor reports only (a budget on turns would never be reached)."""
    for n in range(2):
        await rt.complete(await turn(rt, "a", n), Completed())
    with pytest.raises(Conflict, match="2 of 2 turns"):
        await turn(rt, "a", 2)


async def test_reported_usage_must_be_a_non_negative_amount_in_its_own_units(rt: Runtime) -> None:
    """Catches: negative usage accepted (it would refund a ledger), or an executor reporting the units
    the runtime counts itself (it could hide its turns)."""
    lease = await turn(rt, "a", 0)
    for usage, reason in (({"usd": -1}, "must not be negative"), ({"turns": 1}, "counted by the runtime")):
        with pytest.raises(InvalidRequest, match=reason):
            await rt.complete(lease, Completed(usage=usage))
    assert await rt.budget_ledgers() == []


# -- warning and limit Events ---------------------------------------------------------------------------


async def test_crossing_the_warning_and_the_limit_accepts_one_root_event_each(rt: Runtime) -> None:
    """Catches: an Event on every charge over the threshold (a flood), none at all, or one derived from
    the Work's chain (it would spend that chain's causal budget)."""
    lease = await turn(rt, "a", 0)
    await spend(rt, lease, 5)
    assert await budget_events(rt) == []
    lease = await turn(rt, "a", 1)
    await spend(rt, lease, 3.5)  # 8.5: over the warning of 8
    lease = await turn(rt, "a", 2)
    await spend(rt, lease, 0.5)  # 9: still warned, no second Event
    lease = await turn(rt, "a", 3)
    await spend(rt, lease, 2)  # 11: over the limit
    events = await budget_events(rt)
    assert [e.type for e in events] == ["core.budget.warning", "core.budget.exceeded"]
    for event in events:
        assert event.parent_id is None
        assert event.depth == 0
        assert event.scope == SCOPE
        assert event.payload["work"] == lease.work_id
        assert event.payload["budget"] == "usd"
    assert events[1].payload["amount"] == 11
    history = await rt.history(lease.work_id)
    assert not {e.id for e in events} & {c.event_id for c in history.checkpoints}


async def test_a_budget_event_is_routed_by_its_type_not_to_the_work_it_counts(
    loom_store: str, clock: ManualClock
) -> None:
    """Budget Events are root Events in the Work's scope that routes can act on, and never the counted
    Work's own input (docs/recovery.md, "Budgets"): they name the Work in their payload only. A route
    that makes fresh Work per Event hands each one to a watcher of its own. Catches: a budget Event
    that names the counted Work as its target (``work_id``): every route would resolve it to that
    Work, where it is dropped, so no route could ever act on it."""
    cfg = Config.from_dict(
        {
            "scopes": {
                SCOPE: {
                    "routes": [
                        {
                            "name": "watch",
                            "types": ["core.budget.*"],
                            "handler": "fresh",
                            "create_work": True,
                        },
                        {"name": "r", "types": ["r.*"], "create_work": True, "work_kind": "job"},
                    ]
                }
            },
            "work_kinds": {"job": {"standing": True}},
            "budgets": [usd(10, warning=8)],
        }
    )
    async with open_runtime(loom_store, clock=clock, config=cfg, actors=(), load_entry_points=False) as rt:
        lease = await turn(rt, "a", 0)
        await spend(rt, lease, 10)  # the warning and the limit, crossed in one charge
        await rt.poll()
        warning, exceeded = await budget_events(rt)
        assert (warning.type, exceeded.type) == ("core.budget.warning", "core.budget.exceeded")
        assert exceeded.work_id is None, "the counted Work is named in the payload only"
        assert exceeded.payload["work"] == lease.work_id
        checkpoint = await rt.checkpoint(exceeded.id)
        assert checkpoint is not None
        assert checkpoint.status is CheckpointStatus.ROUTED, checkpoint.reason
        assert checkpoint.work_id not in (None, lease.work_id)
        watcher = await rt.work(checkpoint.work_id or "")
        assert watcher.pending_inputs == (exceeded.id,)
        assert exceeded.id not in (await rt.work(lease.work_id)).pending_inputs


async def test_reaching_the_warning_exactly_warns(rt: Runtime) -> None:
    """The warning threshold is reached at ``amount >= warning``, as the limit is. Catches: a warning
    checked with ``>`` (a ledger standing exactly at its warning would never warn)."""
    await spend(rt, await turn(rt, "a", 0), 8)  # 8 of 10: exactly the warning
    assert [e.type for e in await budget_events(rt)] == ["core.budget.warning"]
    (ledger,) = await rt.budget_ledgers()
    assert (ledger.warned, ledger.exceeded) == (True, False)


def test_a_budget_event_never_becomes_its_works_input() -> None:
    """Catches: a route (a handler targeting the Work the payload names) that hands the Work its own
    budget Event as input (the Work's next turn would start because its budget ran out)."""
    conn = SQLiteStore(path=":memory:").open_writer()

    def run(proc: Any, *args: Any) -> Any:
        conn.execute("BEGIN IMMEDIATE")
        result = proc(Tx(conn), T0_MS, *args)
        conn.execute("COMMIT")
        return result

    limits = CausalLimits()
    ref = RouteRef(name="r", scope=SCOPE, declared=Policy.QUEUE, policy=Policy.QUEUE)
    start = run(accept_in_tx, EventIn(source="t", delivery_id="s", type="r.go", scope=SCOPE, key="a"), limits)
    create = Deliver(work_id="w1", create=True, attach_keys=("a",))
    first = RouteRequest(event_id=start.id, decision=create, route=ref, expected_revision=None, generation=1)
    run(route_in_tx, first, limits)
    notice = EventIn(
        source="core",
        delivery_id="budget.exceeded/usd/w1/life",
        type="core.budget.exceeded",
        scope=SCOPE,
        payload={"work": "w1", "budget": "usd"},
    )
    exceeded = run(lambda tx, now: accept_in_tx(tx, now, notice, limits, trusted=True))
    revision = run(lambda tx, now: tx.work("w1").revision)
    decision = Deliver(work_id="w1")
    request = RouteRequest(
        event_id=exceeded.id, decision=decision, route=ref, expected_revision=revision, generation=1
    )
    result = run(route_in_tx, request, limits)
    assert result.checkpoint.status is CheckpointStatus.DROP
    assert "never becomes the input" in (result.checkpoint.reason or "")
    assert exceeded.id not in run(lambda tx, now: tx.work("w1").pending_inputs)
    conn.close()


# -- through the router: the starter holds the Work instead of starting it -----------------------------


async def test_the_starter_holds_work_over_budget_instead_of_launching(loom_drivers: Any) -> None:
    """Catches: a starter that retries a refused claim forever, or launches over the limit."""
    cfg = Config.from_dict(
        {
            "scopes": {
                SCOPE: {
                    "bindings": {"fake": {"executor": "fake"}},
                    "routes": [
                        {
                            "name": "r",
                            "types": ["r.*"],
                            "create_work": True,
                            "binding": "fake",
                            "work_kind": "job",
                        }
                    ],
                }
            },
            "work_kinds": {"job": {"standing": True}},
            "budgets": [usd(1)],
        }
    )
    driver: RuntimeDriver
    async with loom_drivers(config=cfg) as driver:
        rt = driver.runtime
        driver.fake.auto_complete = False
        await rt.publish(EventIn(source="t", delivery_id="a-0", type="r.go", scope=SCOPE, key="a"))
        work_id = work_id_for_key(SCOPE, "a")

        async def launched() -> bool:
            return bool(driver.fake.launches_of(work_id))

        await driver.until(launched, "the first launch")
        driver.fake.finish(work_id, Completed(usage={"usd": 1}))
        await driver.settle()
        await rt.publish(EventIn(source="t", delivery_id="a-1", type="r.go", scope=SCOPE, key="a"))
        await driver.settle()
        work = await rt.work(work_id)
        assert work.held
        assert "budget 'usd'" in (work.hold_reason or "")
        assert len(driver.fake.launches_of(work_id)) == 1
        await rt.release(work_id)

        async def relaunched() -> bool:
            return len(driver.fake.launches_of(work_id)) == 2

        await driver.until(relaunched, "one more turn after the release")
