"""Lifecycles: each stateful record's states as a transition table, and the one check every write uses.

The tables are data (STYLE: pure state machines); `Lifecycle.check` raises `IllegalTransition` for a
move the table does not list. The store's state-writing methods call it, so no state write skips it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic, TypeVar

from .errors import IllegalTransition

S = TypeVar("S", bound=enum.Enum)


class Lifecycle(Generic[S]):
    """The legal moves between the states of one kind of record (``what``: its name in messages)."""

    def __init__(self, what: str, moves: Mapping[S, frozenset[S]]) -> None:
        self.what = what
        self.moves = dict(moves)
        missing = [state for state in type(next(iter(moves))) if state not in self.moves]
        if missing:
            raise TypeError(f"{what} lifecycle: no row for {missing}")

    def allows(self, old: S, new: S) -> bool:
        return new in self.moves[old]

    def check(self, ident: str, old: S, new: S) -> None:
        """Raise `IllegalTransition` unless ``old -> new`` is a listed move (staying put is a move only
        where the table lists it)."""
        if not self.allows(old, new):
            raise IllegalTransition(f"{self.what} {ident}: illegal transition {old} -> {new}")

    def terminal(self, state: S) -> bool:
        """A state with no way out."""
        return not self.moves[state]
