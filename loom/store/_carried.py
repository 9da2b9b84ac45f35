"""What committed transactions knew that the transactions after them may take (`Carried`)."""

from __future__ import annotations

KEPT = 100_000
"""How many keys' owners, and how many Works' pending inputs, the storage actor keeps across
transactions (`TxBase.committed`)."""

KEPT_INPUTS = 250_000
"""How many pending inputs, over every Work, the storage actor keeps across transactions."""

Pending = tuple[tuple[str, ...], int | None]
"""A Work's pending inputs' Event ids in acceptance order, and the newest one's sequence (at least)."""


class Carried:
    """What committed transactions knew that the transactions after them may take (the storage actor
    keeps it, on a database alone only, while its writer is the only one on the file): keys' owners (a
    key is attached once, and detached only when compaction removes its Work) and Works' pending inputs
    (written only through `InputsTx`, and compaction, which tell what they change)."""

    __slots__ = ("inputs", "owners", "pending")

    def __init__(self) -> None:
        self.owners: dict[str, str] = {}
        self.pending: dict[str, Pending] = {}
        self.inputs = 0
        """How many pending inputs `pending` holds, over every Work."""

    def clear(self) -> None:
        self.owners.clear()
        self.forget_pending()

    def forget_pending(self, work_id: str | None = None) -> None:
        """Forget the pending inputs kept of ``work_id`` (``None``: of every Work)."""
        if work_id is None:
            self.pending.clear()
            self.inputs = 0
        elif (dropped := self.pending.pop(work_id, None)) is not None:
            self.inputs -= len(dropped[0])

    def keep_pending(self, work_id: str, pending: Pending) -> None:
        """Keep ``pending`` as the pending inputs of ``work_id`` (at most `KEPT` Works and `KEPT_INPUTS`
        inputs are kept: past either, everything kept is forgotten first)."""
        self.forget_pending(work_id)
        if len(pending[0]) > KEPT_INPUTS:
            return  # (read again when asked for)
        if len(self.pending) >= KEPT or self.inputs + len(pending[0]) > KEPT_INPUTS:
            self.forget_pending()
        self.pending[work_id] = pending
        self.inputs += len(pending[0])
