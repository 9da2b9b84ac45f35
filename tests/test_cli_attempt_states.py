"""What ``loom work get`` says of how each attempt ended (against the fake server of `test_cli`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_cli import T9, WORK_VIEW, FakeServer, loom_cli, paris_time

__all__ = ["paris_time"]  # local time is Paris, and now a little after 09:04 UTC, for every test here


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


def _attempt(attempt: int, state: str, outcome: dict[str, object] | None) -> dict[str, object]:
    return {"attempt": attempt, "id": f"ex_{attempt}", "state": state, "outcome": outcome,
            "created_at_ms": T9, "ended_at_ms": T9 + 1000}  # fmt: skip


def test_an_interrupted_attempt_is_shown_as_interrupted(server: FakeServer) -> None:
    """Catches ``loom work get`` showing an attempt an operator interrupted as ``cancelled`` (its
    recorded state), where its JSON ``outcome.kind`` and ``loom_attempts_ended_total{outcome=...}``
    say ``interrupted``; an attempt cancelled with its Work stays ``cancelled``."""
    history = {"checkpoints": [], "executions": [
        _attempt(1, "cancelled", {"kind": "interrupted"}),
        _attempt(2, "cancelled", {"kind": "interrupted", "confirmed": False}),
        _attempt(3, "cancelled", None),
        _attempt(4, "completed", {"kind": "completed", "value": 1}),
    ]}  # fmt: skip
    server.answers["GET", "/work/wk_1"] = (200, {**WORK_VIEW, "history": history})
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    attempts = [line.split()[:3] for line in lines[lines.index("attempts:") + 1 :]]
    assert attempts == [
        ["1", "ex_1", "interrupted"],
        ["2", "ex_2", "interrupted"],
        ["3", "ex_3", "cancelled"],
        ["4", "ex_4", "completed"],
    ]


FAILURES = [
    ("failed", {"kind": "failed", "error": "boom"}, "failed"),
    ("failed", {"kind": "failed", "error": "lost", "recovery": {"reason": "not adoptable"}}, "not_adoptable"),
    ("failed", {"kind": "failed", "error": "late", "timeout_event_id": "ev_1"}, "timed_out"),
]


def test_a_failure_is_shown_as_what_ended_it(server: FakeServer) -> None:
    """Catches ``loom work get`` showing an attempt that could not be adopted after its lease was lost,
    or that reached its execution deadline, as a plain ``failed``, where the attempts-ended metric and
    the console tell them apart."""
    history = {"checkpoints": [], "executions": [
        _attempt(n, state, outcome) for n, (state, outcome, _) in enumerate(FAILURES, 1)
    ]}  # fmt: skip
    server.answers["GET", "/work/wk_1"] = (200, {**WORK_VIEW, "history": history})
    result = loom_cli("work", "get", "wk_1", "--url", server.url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    shown = [line.split()[2] for line in lines[lines.index("attempts:") + 1 :]]
    assert shown == [expected for _, _, expected in FAILURES]


@pytest.mark.parametrize(("state", "outcome", "expected"), FAILURES)
def test_the_cli_tells_an_end_as_the_attempts_ended_notice_does(
    state: str, outcome: dict[str, object], expected: str
) -> None:
    """Catches the CLI's reading drifting from the store's (`ended_as`, which names the metric's
    outcome label)."""
    import json

    from loom.records.work import ExecutionState
    from loom.service._render import attempt_state
    from loom.store._tx_executions import ended_as

    assert attempt_state({"state": state, "outcome": outcome}) == expected
    assert ended_as(ExecutionState(state), json.dumps(outcome)) == expected
