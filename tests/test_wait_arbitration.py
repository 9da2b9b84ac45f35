"""Wake arbitration against a reference model (docs/concepts.md "Wait": "Wake arbitration is serializable per
Wait/Work"; "Replaying a match, a loser, a stale timer fire or wake scan cannot produce a second
transition").

The pure decision, `arbitrate`, picks the lowest accepted sequence. The stateful property drives the
real kernel procedures on an in-memory store with random interleavings: matching and other Events
accepted now and routed now or later, the Work's own Events, clock moves, the timeout firing,
cancellation, replays of routing, firing and wake scans, and compaction with a retention of nothing (it
removes whatever nothing refers to any more). The model: a wait wakes at most once,
with the first candidate accepted (a match, or its own accepted timeout), provided some wake attempt
came after that candidate and before any cancellation; the clock alone wakes nothing; and its timeout
timer stays armed exactly while nothing has woken, fired or cancelled it (a wake that leaves the
timeout armed is caught). Compaction changes none of it: it never removes what a wait may still find
(an Event on its key after its watermark, its accepted timeout), and a timeout it removed once ended
answers as ended.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loom import CausalLimits, Config, Deliver, EventIn, Policy, WaitSpec, WaitState
from loom.kernel.accept import accept_in_tx
from loom.kernel.authority import Authority
from loom.kernel.compaction import CompactRequest, compact_in_tx, raise_watermark_in_tx
from loom.kernel.control import cancel_in_tx
from loom.kernel.executions import BindingRef, ClaimRequest, KindPolicy, claim_in_tx, complete_in_tx
from loom.kernel.firing import fire_timer_in_tx
from loom.kernel.resolve import RouteRef, RouteRequest
from loom.kernel.routing import route_in_tx
from loom.kernel.toolbelt import emit_in_tx
from loom.kernel.waits import Candidate, arbitrate, timeout_timer_id, wake_in_tx
from loom.records.timers import FireRequest, TimerState
from loom.records.waits import Waiting
from loom.store import SQLiteStore, Tx
from loom.testing import T0_MS

R = TypeVar("R")
LIMITS = CausalLimits(per_minute=100_000)
TIMEOUT_MS = 10_000
NOTHING_KEPT = Config.from_dict({"retention": {"works": 0, "events": 0, "timers": 0, "attempt_logs": 0}})


@given(st.lists(st.tuples(st.integers(1, 10_000), st.booleans()), unique_by=lambda c: c[0], max_size=20))
def test_arbitration_picks_the_lowest_sequence_whatever_the_order(raw: list[tuple[int, bool]]) -> None:
    candidates = [Candidate(seq=seq, event_id=f"e{seq}", timeout=timeout) for seq, timeout in raw]
    winner = arbitrate(candidates)
    if not candidates:
        assert winner is None
        return
    assert winner is not None
    assert winner.seq == min(seq for seq, _ in raw)
    for permutation in itertools.islice(itertools.permutations(candidates), 6):
        assert arbitrate(permutation) == winner, "the order in which candidates are seen never matters"


class Kernel:
    """Kernel procedures run one transaction each on an in-memory store (what the storage actor does,
    without the actor)."""

    def __init__(self) -> None:
        self.conn = SQLiteStore(path=":memory:").open_writer()
        self.now = T0_MS

    def run(self, proc: Callable[..., R], *args: Any) -> R:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            result = proc(Tx(self.conn), self.now, *args)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result

    def close(self) -> None:
        self.conn.close()


@attrs.define
class Model:
    state: WaitState = WaitState.ACTIVE
    first_candidate: str | None = None
    """The first candidate accepted after registration (matches and its own timeout)."""
    winner: str | None = None
    timer_armed: bool = True

    def opportunity(self) -> None:
        """A wake attempt: routing an Event on the key, the timeout firing, a wake scan."""
        if self.state is WaitState.ACTIVE and self.first_candidate is not None:
            self.state, self.winner, self.timer_armed = WaitState.WOKEN, self.first_candidate, False


def _route(kernel: Kernel, event_id: str, work_id: str) -> None:
    """Route an Event to the Work as a handler that saw its current revision would."""
    ref = RouteRef(name="r", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)
    revision = kernel.run(lambda tx, now: tx.work(work_id).revision)
    request = RouteRequest(
        event_id=event_id,
        decision=Deliver(work_id=work_id),
        route=ref,
        expected_revision=revision,
        generation=1,
    )
    kernel.run(route_in_tx, request, LIMITS)


def _setup(kernel: Kernel) -> tuple[str, Any]:
    """A Work owning key ``k`` with a claimed attempt (it will wait on ``w.*`` Events on ``k``)."""
    start = kernel.run(
        accept_in_tx, EventIn(source="t", delivery_id="start", type="w.start", scope="acme", key="k"), LIMITS
    )
    ref = RouteRef(name="r", scope="acme", declared=Policy.QUEUE, policy=Policy.QUEUE)
    kernel.run(
        route_in_tx,
        RouteRequest(
            event_id=start.id,
            decision=Deliver(work_id="w1", create=True, attach_keys=("k",)),
            route=ref,
            expected_revision=None,
            generation=1,
        ),
        LIMITS,
    )
    lease = kernel.run(
        claim_in_tx,
        ClaimRequest(
            work_id="w1",
            owner="t",
            token=secrets.token_hex(8),
            lease_ms=60_000,
            binding=BindingRef(name=None, executor=None),
            kind=KindPolicy(),
            capacity=None,
            generation=1,
        ),
    )
    return "w1", lease


OPS = st.lists(
    st.sampled_from(
        [
            "match_routed",
            "match_unrouted",
            "match_unrouted",
            "other_type",
            "other_key",
            "route_later",
            "route_later",
            "half_way",
            "deadline",
            "deadline",
            "fire",
            "scan",
            "cancel",
            "compact",
            "compact",
        ]
    ),
    max_size=12,
)
"""The interleavings: a matching Event routed at once or left unrouted, Events that do not match, routing
a left Event later, the clock moving half-way or to the deadline (which fires the timeout, twice: the
repeat answers from the ledger), firing at the current clock, a repeated wake scan, cancellation, and
compaction of everything nothing refers to."""


@settings(max_examples=300, deadline=None)
@given(pre=st.lists(st.sampled_from(["match", "own"]), max_size=2), ops=OPS)
@example(pre=[], ops=["match_unrouted", "deadline"])  # an unrouted match beats the timeout due after it
@example(pre=[], ops=["deadline", "match_routed"])  # a timeout accepted first beats a later match
@example(pre=["own"], ops=["scan", "half_way"])  # the Work's own Event and the clock alone wake nothing
def test_a_wait_wakes_once_with_the_first_candidate_accepted(pre: list[str], ops: list[str]) -> None:
    kernel = Kernel()
    try:
        _check(kernel, pre, ops)
    finally:
        kernel.close()


def _check(kernel: Kernel, pre: list[str], ops: list[str]) -> None:
    work_id, lease = _setup(kernel)
    counter = itertools.count()
    model = Model()
    unrouted: list[str] = []

    def accept(kind: str, *, own: bool = False) -> str:
        n = next(counter)
        key = "other" if kind == "other_key" else "k"
        type_ = "x.note" if kind == "other_type" else "w.note"
        event = EventIn(source="t", delivery_id=f"e{n}", type=type_, scope="acme", key=key)
        if own:
            accepted = kernel.run(emit_in_tx, Authority.of(lease), event, LIMITS)
        else:
            accepted = kernel.run(accept_in_tx, event, LIMITS)
        if kind == "match" and not own and model.state is WaitState.ACTIVE and model.first_candidate is None:
            model.first_candidate = accepted.id
        return str(accepted.id)

    # before registration, after the attempt's watermark: a match (found by registration's own scan)
    # or an Event the attempt itself emitted (never a candidate for its own wait)
    for kind in pre:
        unrouted.append(accept("match", own=kind == "own"))
    kernel.run(
        complete_in_tx,
        Authority.of(lease),
        Waiting(wait=WaitSpec(types=("w.*",), timeout_ms=TIMEOUT_MS)),
        KindPolicy(),
        LIMITS,
    )
    model.opportunity()  # registration scans accepted history
    deadline = T0_MS + TIMEOUT_MS

    def fire() -> None:
        request = FireRequest(
            timer_id=timeout_timer_id(_wait_of(kernel, work_id).id), revision=1, fire_at_ms=deadline
        )
        first = kernel.run(fire_timer_in_tx, request, LIMITS, {})
        again = kernel.run(fire_timer_in_tx, request, LIMITS, {})
        assert again.event_id == first.event_id, "a repeated firing answers from the ledger"
        if first.event_id is None and not model.timer_armed:
            return  # an ended timeout compaction removed: its firing is stale, and nothing fires
        if kernel.now >= deadline and model.timer_armed:
            model.timer_armed = False
            if first.event_id is not None and model.first_candidate is None:
                model.first_candidate = first.event_id
            model.opportunity()

    for op in ops:
        if op in ("match_routed", "match_unrouted", "other_type", "other_key"):
            event_id = accept("match" if op.startswith("match") else op)
            if op != "other_key":
                unrouted.append(event_id)
            while op == "match_routed" and unrouted:  # routing follows acceptance order
                _route(kernel, unrouted.pop(0), work_id)
                model.opportunity()
        elif op == "route_later" and unrouted:
            _route(kernel, unrouted.pop(0), work_id)
            model.opportunity()
        elif op == "half_way":
            kernel.now = max(kernel.now, T0_MS + TIMEOUT_MS // 2)
        elif op == "deadline":
            kernel.now = max(kernel.now, deadline)
            fire()
        elif op == "fire":
            fire()
        elif op == "scan":
            kernel.run(wake_in_tx, _wait_of(kernel, work_id).id, LIMITS)
            model.opportunity()
        elif op == "compact":
            kernel.run(raise_watermark_in_tx)
            while kernel.run(compact_in_tx, CompactRequest(config=NOTHING_KEPT, limit=5)).report.more:
                pass
        elif op == "cancel":
            if model.state is WaitState.ACTIVE:
                model.state = WaitState.CANCELLED
            model.timer_armed = False
            kernel.run(cancel_in_tx, work_id)
            _assert_agrees(kernel, work_id, model, op)
            return  # the Work is terminal: nothing more happens to this wait
        _assert_agrees(kernel, work_id, model, op)


def _assert_agrees(kernel: Kernel, work_id: str, model: Model, after: str) -> None:
    wait = _wait_of(kernel, work_id)
    assert wait.state is model.state, f"after {after}: the wait is {wait.state}, the model says {model.state}"
    assert wait.winner_event_id == model.winner, (
        f"after {after}: the winner is not the first candidate accepted"
    )
    # the wait's timeout stays armed exactly while the wait is active: a wake (or a cancel) disarms it
    timer = kernel.run(lambda tx, now: tx.timer(timeout_timer_id(wait.id)))
    armed = timer is not None and timer.state is TimerState.ARMED  # (an ended timer may be compacted)
    assert armed == model.timer_armed, (
        f"after {after}: the timeout timer is {timer and timer.state}, the model says armed={model.timer_armed}"
    )


def _wait_of(kernel: Kernel, work_id: str) -> Any:
    (wait,) = kernel.run(lambda tx, now: tx.waits_of_work(work_id))
    return wait
