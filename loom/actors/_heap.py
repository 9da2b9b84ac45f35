"""The timer min-heap.

Entries are ordered by ``(deadline_ms, seq)``: ``seq`` counts schedules, so timers due at the
same instant fire in the order they were scheduled and the order never depends on the heap's
shape. The array is 0-based (children of ``i`` are ``2i+1`` and ``2i+2``). Each entry remembers
its index and the heap keeps a key -> entry map, so ``remove`` (cancel, reschedule) finds its
slot in O(1) and costs O(log n) like ``push`` and ``pop``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Entry(Generic[K]):
    """One armed timer. ``index`` is its slot in the heap array, or -1 once out of the heap."""

    # Slots keep an armed timer small: the heap may hold millions of them.
    __slots__ = ("deadline_ms", "index", "key", "seq")

    def __init__(self, key: K, deadline_ms: int, seq: int, index: int = -1) -> None:
        self.key = key
        self.deadline_ms = deadline_ms
        self.seq = seq
        self.index = index

    def __repr__(self) -> str:
        return f"Entry(key={self.key!r}, deadline_ms={self.deadline_ms}, seq={self.seq}, index={self.index})"


def _less(a: Entry[K], b: Entry[K]) -> bool:
    # Spelled out rather than comparing tuples: no allocation on the hot path.
    return a.deadline_ms < b.deadline_ms or (a.deadline_ms == b.deadline_ms and a.seq < b.seq)


class TimerHeap(Generic[K]):
    """A binary min-heap of timers with at most one entry per key."""

    __slots__ = ("_by_key", "_items", "_seq")

    def __init__(self) -> None:
        self._items: list[Entry[K]] = []
        self._by_key: dict[K, Entry[K]] = {}
        self._seq = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def items(self) -> list[K]:
        """The keys in array order."""
        return [entry.key for entry in self._items]

    def get(self, key: K) -> Entry[K] | None:
        """The entry armed for ``key``, if any."""
        return self._by_key.get(key)

    def peek(self) -> Entry[K] | None:
        """The next entry to fire (``None`` when empty)."""
        return self._items[0] if self._items else None

    def push(self, key: K, deadline_ms: int) -> Entry[K]:
        """Arm ``key`` at ``deadline_ms`` with the next sequence number.

        Raises `KeyError` if ``key`` is already armed: there is never more than one entry for a
        key (remove it first to move it).
        """
        if key in self._by_key:
            raise KeyError(f"timer heap: key {key!r} is already armed")
        self._seq += 1
        entry = Entry(key, deadline_ms, self._seq, len(self._items))
        self._items.append(entry)
        self._by_key[key] = entry
        self._sift_up(entry.index)
        return entry

    def pop(self) -> Entry[K] | None:
        """Remove and return the next entry to fire (``None`` when empty)."""
        if not self._items:
            return None
        return self._remove_at(0)

    def remove(self, entry: Entry[K]) -> Entry[K]:
        """Remove ``entry`` from wherever it is; raises `ValueError` if it is not in this heap."""
        i = entry.index
        if not (0 <= i < len(self._items)) or self._items[i] is not entry:
            raise ValueError(f"timer heap: {entry!r} is not in this heap")
        return self._remove_at(i)

    def _remove_at(self, i: int) -> Entry[K]:
        items = self._items
        entry = items[i]
        last = items.pop()
        if last is not entry:
            items[i] = last
            last.index = i
            # The moved entry came from the bottom, but not necessarily from below slot i:
            # it may belong lower (sift down) or, when i is in another subtree, higher (sift up).
            self._sift_down(i)
            self._sift_up(last.index)
        del self._by_key[entry.key]
        entry.index = -1
        return entry

    def _sift_up(self, i: int) -> None:
        items = self._items
        entry = items[i]
        while i > 0:
            parent_i = (i - 1) >> 1
            parent = items[parent_i]
            if not _less(entry, parent):
                break
            items[i] = parent
            parent.index = i
            i = parent_i
        items[i] = entry
        entry.index = i

    def _sift_down(self, i: int) -> None:
        items = self._items
        n = len(items)
        entry = items[i]
        while True:
            child_i = 2 * i + 1
            if child_i >= n:
                break
            child = items[child_i]
            right_i = child_i + 1
            if right_i < n and _less(items[right_i], child):
                child_i = right_i
                child = items[right_i]
            if not _less(child, entry):
                break
            items[i] = child
            child.index = i
            i = child_i
        items[i] = entry
        entry.index = i

    def check_invariant(self) -> None:
        """Raise `AssertionError` unless the heap property and the index/key bookkeeping hold (for tests)."""
        items = self._items
        if len(self._by_key) != len(items):
            raise AssertionError(f"key map holds {len(self._by_key)} entries, the array {len(items)}")
        for i, entry in enumerate(items):
            if entry.index != i:
                raise AssertionError(f"{entry!r} remembers the wrong index (it is at {i})")
            if self._by_key.get(entry.key) is not entry:
                raise AssertionError(f"{entry!r} is not the entry mapped for its key")
            if i > 0 and _less(entry, parent := items[(i - 1) >> 1]):
                raise AssertionError(f"{entry!r} is smaller than its parent {parent!r}")
