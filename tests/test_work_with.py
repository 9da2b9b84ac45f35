"""`records.work.work_with`: the copy of a Work with some fields changed that the hot paths tell their
transaction, as `attrs.evolve` would make it."""

from __future__ import annotations

import attrs
import pytest

from loom.records.work import ExecutionState, Work, WorkState, work_with

WORK = Work(
    id="w-1",
    scope="shop",
    kind="order",
    state=WorkState.RUNNING,
    revision=3,
    keys=("k",),
    held=False,
    hold_reason=None,
    parent_id=None,
    predecessor_id=None,
    generation=0,
    created_at_ms=1,
    updated_at_ms=2,
    attempts=1,
    current_execution_id="ex-1",
    pending_inputs=("e-1", "e-2"),
    started=True,
    execution_state=ExecutionState.RUNNING,
    wait_id="wt-1",
    failures=2,
    blocked="start:x",
)


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"state": WorkState.READY, "revision": 4, "current_execution_id": None, "execution_state": None},
        {"wait_id": None, "pending_inputs": ("e-2",), "released": True},
    ],
)
def test_a_work_with_changes_is_what_evolve_makes(changes: dict[str, object]) -> None:
    """Every field not changed is copied, every one changed is taken (compared with `attrs.evolve`,
    field by field: a field added to Work later is compared too). Catches: a field left out of the copy
    (its default taken instead of the Work's) or a change not applied."""
    made = work_with(WORK, **changes)
    assert made == attrs.evolve(WORK, **changes)
    for field in attrs.fields(Work):
        assert getattr(made, field.name) == changes.get(field.name, getattr(WORK, field.name)), field.name


def test_an_unknown_field_is_refused() -> None:
    """As `attrs.evolve`: a change naming no field of Work fails (it would be dropped silently)."""
    with pytest.raises(TypeError):
        work_with(WORK, no_such_field=1)
