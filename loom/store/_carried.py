"""What committed transactions knew that the transactions after them may take (`Carried`)."""

from __future__ import annotations

KEPT = 100_000
"""How many keys' owners, and how many Works' pending inputs, the storage actor keeps across
transactions (`TxBase.committed`)."""

Pending = tuple[tuple[str, ...], int | None]
"""A Work's pending inputs' Event ids in acceptance order, and the newest one's sequence (at least)."""


class Carried:
    """What committed transactions knew that the transactions after them may take (the storage actor
    keeps it, on a database alone only, while its writer is the only one on the file): keys' owners (a
    key is attached once, and detached only when compaction removes its Work) and Works' pending inputs
    (written only through `InputsTx`, and compaction, which tell what they change)."""

    __slots__ = ("owners", "pending")

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}
        self.pending: dict[str, Pending] = {}

    def clear(self) -> None:
        self.owners.clear()
        self.pending.clear()
