"""What the storage actor keeps of committed transactions across them (`loom.store._carried.Carried`)
stays within its bounds: `KEPT` Works' pending inputs and `KEPT_INPUTS` inputs over them all;
`KEPT_ROUTED` routed inputs and `KEPT_ROUTED_BYTES` of their payloads; `KEPT_KV` KV entries;
`KEPT_OF_WORKS` Works' records.

Catches: a keep that never forgets (memory growing with every Work and input a runtime ever saw), a
count of inputs or payload bytes that drifts from what is kept (the bound enforced against the wrong
number), and a list or payload longer than the whole bound kept anyway.
"""

from __future__ import annotations

import attrs
import pytest

from loom.store import _carried
from loom.store._carried import Carried


def ids(work: str, n: int) -> tuple[str, ...]:
    return tuple(f"ev_{work}_{i}" for i in range(n))


def test_pending_inputs_kept_are_counted_and_replaced() -> None:
    carried = Carried()
    carried.keep_pending("a", (ids("a", 3), 3))
    carried.keep_pending("b", (ids("b", 2), 2))
    carried.keep_pending("a", (ids("a", 1), 3))  # (a's list replaced: its three no longer count)
    assert carried.inputs == 3
    carried.forget_pending("b")
    assert (carried.inputs, list(carried.pending)) == (1, ["a"])
    carried.forget_pending()
    assert (carried.inputs, carried.pending) == (0, {})


def test_past_either_bound_everything_kept_is_forgotten_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_carried, "KEPT", 3)
    monkeypatch.setattr(_carried, "KEPT_INPUTS", 10)
    carried = Carried()
    for work in "abc":
        carried.keep_pending(work, (ids(work, 1), 1))
    carried.keep_pending("d", (ids("d", 1), 1))  # a fourth Work: the three before are forgotten
    assert (list(carried.pending), carried.inputs) == (["d"], 1)
    carried.keep_pending("e", (ids("e", 9), 9))  # 1 + 9 inputs fit; one more does not
    carried.keep_pending("f", (ids("f", 1), 1))
    assert (list(carried.pending), carried.inputs) == (["f"], 1)
    carried.keep_pending("g", (ids("g", 11), 11))  # longer than the whole bound: not kept
    assert (list(carried.pending), carried.inputs) == (["f"], 1)


@attrs.frozen
class Routed:
    """An Event as `Carried.keep_routed` sees one: its id."""

    id: str


def test_routed_inputs_kept_are_taken_once_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_carried, "KEPT_ROUTED", 3)
    monkeypatch.setattr(_carried, "KEPT_ROUTED_BYTES", 100)
    carried = Carried()
    carried.keep_routed(Routed("a"), "cp-a", 40)
    carried.keep_routed(Routed("b"), "cp-b", 40)
    assert carried.take_routed("a") == (Routed("a"), "cp-a")
    assert (carried.take_routed("a"), carried.routed_bytes) == (None, 40)  # taken once
    carried.keep_routed(Routed("c"), "cp-c", 60)  # 40 + 60 fit; one byte more does not
    carried.keep_routed(Routed("d"), "cp-d", 1)
    assert (list(carried.routed), carried.routed_bytes) == (["d"], 1)
    for event in "efg":
        carried.keep_routed(Routed(event), f"cp-{event}", 1)  # a fourth Event: the three before go
    assert (list(carried.routed), carried.routed_bytes) == (["g"], 1)
    carried.keep_routed(Routed("h"), "cp-h", 101)  # larger than the whole bound: not kept
    assert (list(carried.routed), carried.routed_bytes) == (["g"], 1)
    carried.clear()
    assert (carried.routed, carried.routed_bytes) == ({}, 0)


def test_kv_entries_kept_are_forgotten_when_written_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit keeps the KV entries its transaction read (`Carried.kv`), forgets those it wrote, and
    keeps at most `KEPT_KV` (past it, everything kept is forgotten first; a transaction that read more
    than the whole bound keeps nothing)."""
    monkeypatch.setattr(_carried, "KEPT_KV", 3)
    carried = Carried()
    _carried.ToCarry().commit(carried, {}, {("n", "a"): "A", ("n", "b"): None})
    written = _carried.ToCarry()
    written.kv_written.add(("n", "a"))
    written.commit(carried, {}, {("n", "c"): "C"})
    assert carried.kv == {("n", "b"): None, ("n", "c"): "C"}
    _carried.ToCarry().commit(carried, {}, {("n", "d"): "D", ("n", "e"): "E"})  # 2 + 2 > 3
    assert carried.kv == {("n", "d"): "D", ("n", "e"): "E"}
    _carried.ToCarry().commit(carried, {}, {("n", k): k for k in "fghi"})  # more than the bound
    assert carried.kv == {("n", "d"): "D", ("n", "e"): "E"}
    carried.clear()
    assert carried.kv == {}


def committed_works(carried: Carried, told: dict[str, object], written: tuple[str, ...] = ()) -> None:
    """Commit one transaction that wrote the Works ``written`` and knew each Work in ``told`` so."""
    to_carry = _carried.ToCarry()
    for work_id in written:
        to_carry.work_written(work_id)
    for work_id, record in told.items():
        to_carry.tell("work", work_id, record)
    to_carry.commit(carried, {}, {})


def test_works_records_are_forgotten_when_written_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Work's records a commit knew are kept (beside those it did not write), a Work written by a later
    commit is forgotten unless that commit knew it anew, a record made by asking its transaction is not
    kept (the transaction is gone), and past `KEPT_OF_WORKS` Works everything kept is forgotten first.
    Catches: a written Work kept, an impure record carried out of its transaction, and no bound."""
    monkeypatch.setattr(_carried, "KEPT_OF_WORKS", 3)
    carried = Carried()
    pure = _carried.Lazy(lambda: "made", pure=True)
    committed_works(carried, {"a": "a1", "b": "b1", "c": pure})
    committed_works(carried, {"b": "b2"}, written=("a", "b"))
    assert carried.of_works == {"b": {"work": "b2"}, "c": {"work": pure}}
    committed_works(carried, {"d": _carried.Lazy(lambda: "asks", pure=False)}, written=("d",))
    assert "d" not in carried.of_works  # (nor anything older of d: it was written)
    committed_works(carried, {"e": "e1", "f": "f1"})  # 2 + 2 Works: over the bound of 3
    assert carried.of_works == {"e": {"work": "e1"}, "f": {"work": "f1"}}
