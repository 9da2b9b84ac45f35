"""The timer heap against a hand trace and a sorted-list model."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from loom.actors._heap import TimerHeap


def test_heap_hand_example() -> None:
    heap: TimerHeap[str] = TimerHeap()
    steps = [
        ("a", 5000, ["a"]),
        ("b", 3000, ["b", "a"]),
        ("c", 8000, ["b", "a", "c"]),
        ("d", 3000, ["b", "d", "c", "a"]),
        ("e", 1000, ["e", "b", "c", "a", "d"]),
    ]
    for seq, (key, at_ms, array_after) in enumerate(steps, start=1):
        entry = heap.push(key, at_ms)
        assert entry.seq == seq
        assert heap.items() == array_after, f"after push {key}({at_ms})"
        heap.check_invariant()

    first = heap.pop()
    assert first is not None
    assert first.key == "e"
    assert heap.items() == ["b", "d", "c", "a"]
    heap.check_invariant()

    rest = []
    while (popped := heap.pop()) is not None:
        rest.append(popped.key)
        heap.check_invariant()
    assert rest == ["b", "d", "a", "c"]
    assert len(heap) == 0
    assert heap.peek() is None


def test_heap_remove_from_middle_sifts_up() -> None:
    # The last entry (9) moves into the removed slot in the other subtree, where it is smaller
    # than its new parent (50): sifting only down would leave the heap broken.
    heap: TimerHeap[int] = TimerHeap()
    for key, at_ms in enumerate([0, 1, 50, 2, 3, 51, 52, 4, 5, 6, 7, 53, 54, 55, 56, 9]):
        heap.push(key, at_ms)
    heap.check_invariant()
    victim = heap.get(13)  # deadline 55, a grandchild of 50
    assert victim is not None
    heap.remove(victim)
    heap.check_invariant()
    assert heap.items()[:3] == [0, 1, 15]  # 9 (key 15) climbed two levels, to slot 2


def test_heap_refuses_second_entry_and_foreign_entries() -> None:
    heap: TimerHeap[str] = TimerHeap()
    entry = heap.push("a", 10)
    with pytest.raises(KeyError, match="already armed"):
        heap.push("a", 20)
    heap.remove(entry)
    with pytest.raises(ValueError, match="not in this heap"):
        heap.remove(entry)
    assert heap.get("a") is None
    assert "a" not in heap


@pytest.mark.parametrize("seed", range(20))
def test_heap_matches_sorted_model(seed: int) -> None:
    rng = random.Random(seed)
    heap: TimerHeap[int] = TimerHeap()
    model: list[tuple[int, int, int]] = []  # (deadline, seq, key), kept sorted
    next_key = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.5 or not model:
            deadline = rng.randrange(50)  # a small range forces many ties
            entry = heap.push(next_key, deadline)
            model.append((deadline, entry.seq, next_key))
            model.sort()
            next_key += 1
        elif op < 0.75:
            popped = heap.pop()
            assert popped is not None
            assert (popped.deadline_ms, popped.seq, popped.key) == model.pop(0)
        else:
            _deadline, _seq, key = model.pop(rng.randrange(len(model)))
            victim = heap.get(key)
            assert victim is not None
            heap.remove(victim)
        heap.check_invariant()
        assert len(heap) == len(model)
        head = heap.peek()
        assert (head.key if head else None) == (model[0][2] if model else None)


class HeapModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.heap: TimerHeap[int] = TimerHeap()
        self.model: dict[int, tuple[int, int]] = {}  # key -> (deadline, seq)
        self.next_key = 0

    @rule(deadline=st.integers(min_value=0, max_value=20))
    def push(self, deadline: int) -> None:
        entry = self.heap.push(self.next_key, deadline)
        self.model[self.next_key] = (deadline, entry.seq)
        self.next_key += 1

    @precondition(lambda self: self.model)
    @rule()
    def pop(self) -> None:
        expected = min(self.model, key=self.model.__getitem__)
        popped = self.heap.pop()
        assert popped is not None
        assert popped.key == expected
        del self.model[expected]

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        entry = self.heap.get(key)
        assert entry is not None
        self.heap.remove(entry)
        del self.model[key]

    @invariant()
    def heap_property_holds(self) -> None:
        self.heap.check_invariant()
        assert len(self.heap) == len(self.model)


TestHeapStateMachine = HeapModel.TestCase
TestHeapStateMachine.settings = settings(max_examples=100, stateful_step_count=60, deadline=None)
