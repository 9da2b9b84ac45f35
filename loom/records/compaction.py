"""What compaction did (or, in a dry run, would do): counts per kind of row (docs/operations.md)."""

from __future__ import annotations

import attrs

COUNTS = (
    "events",
    "works",
    "attempts",
    "timers",
    "firings",
    "diagnostics",
    "ledgers",
    "buckets",
    "tombstones",
    "logs",
)


@attrs.frozen(kw_only=True)
class CompactionReport:
    """What one compaction pass, or a run of passes, removed (or would remove, in a dry run)."""

    events: int = 0
    """Routed Events removed, each leaving a tombstone of its identity for the dedup window."""
    works: int = 0
    """Finished Works removed, with everything that was their own."""
    attempts: int = 0
    """Ended attempts removed (with their Work, or on their own when older than the retention)."""
    timers: int = 0
    """Ended timers removed, with their ledgers."""
    firings: int = 0
    """Firing ledger entries removed (with their timer, or of a timer still armed)."""
    diagnostics: int = 0
    ledgers: int = 0
    """Budget ledgers of a day or week that ended."""
    buckets: int = 0
    """Causal buckets of minutes that passed."""
    tombstones: int = 0
    """Tombstones whose dedup window ended (their identities may be used again)."""
    logs: int = 0
    """Attempts whose logs their executor forgot."""
    kept: int = 0
    """Rows past their retention kept because something still refers to them."""
    released_bytes: int = 0
    """Space given back to the file system (SQLite with incremental vacuum)."""
    more: bool = False
    """A page was full: another pass may find more."""
    dry_run: bool = False

    @property
    def removed(self) -> int:
        """Every row removed (tombstones expired included; logs forgotten are not rows)."""
        return sum(getattr(self, name) for name in COUNTS if name != "logs")

    def __add__(self, other: CompactionReport) -> CompactionReport:
        summed = {
            name: getattr(self, name) + getattr(other, name) for name in (*COUNTS, "kept", "released_bytes")
        }
        return CompactionReport(**summed, more=other.more, dry_run=self.dry_run or other.dry_run)


@attrs.frozen(kw_only=True)
class StoreSize:
    """How big the store is: rows per table, and bytes."""

    rows: dict[str, int] = attrs.field(factory=dict, hash=False)
    bytes: int = 0
    """The database's size: SQLite's main file (its ``-wal`` file comes on top, folded in at each
    checkpoint); PostgreSQL's whole database."""
    free_bytes: int = 0
    """The part of it that holds nothing: pages compaction freed that the file keeps for reuse (SQLite;
    a file with incremental vacuum gives them back as compaction goes)."""
