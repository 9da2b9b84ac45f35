"""Scope capacity: which pool of running attempts a Work counts against.

A scope's ``capacity`` bounds the attempts running at once in that scope and its descendants, except
those under a descendant that declares a capacity of its own (that descendant is a pool of its own).
So a Work's pool is the nearest scope, itself or an ancestor, that declares a capacity (``None``: no
capacity applies). What counts is in `CAPACITY_STATES`: running, stopping and recovering attempts.
"""

from __future__ import annotations

import attrs

from ..config import Config
from ..config.resolve import scope_ancestry


@attrs.frozen
class Pool:
    scope: str
    """The scope that declares the capacity."""
    capacity: int

    @property
    def blocked(self) -> str:
        """What a Work passed over for want of a slot here records as its reason."""
        return f"capacity:{self.scope}"


def capacity_pool(config: Config, scope: str) -> Pool | None:
    """The pool a Work in ``scope`` counts against under ``config`` (``None``: no capacity applies)."""
    for ancestor in reversed(scope_ancestry(scope)):
        declared = config.scopes.get(ancestor)
        if declared is not None and declared.capacity is not None:
            return Pool(ancestor, declared.capacity)
    return None
