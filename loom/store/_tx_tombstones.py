"""The tombstones part of `Tx`: what answers for removed Events, Works and timers, their expiry and
the other expiries that go from the head of a table (oldest first), and giving freed space back.

Rules are the kernel's (`kernel.compaction`, `kernel.accept.delivered`); this part only stores and finds.
"""

from __future__ import annotations

from ._tx_base import TxBase


class TombstonesTx(TxBase):
    # -- expiry from the head: oldest first, stopping at the first that is not due -------------------
    # (each returns how many rows were due)

    def expire_event_tombstones(self, before_ms: int, limit: int) -> int:
        return self._expire_head("event_tombstones", "seq", "accepted_at_ms", before_ms, limit)

    def expire_diagnostics(self, before_ms: int, limit: int) -> int:
        return self._expire_head("diagnostics", "id", "at_ms", before_ms, limit)

    def _expire_head(self, table: str, order: str, at: str, before_ms: int, limit: int) -> int:
        """Remove rows from the head of ``table`` (by ``order``, which follows time) while their ``at`` is
        by ``before_ms``: a page, and never a scan of what is not due."""
        rows = self._all(f"SELECT {order}, {at} FROM {table} ORDER BY {order} LIMIT ?", (limit,))
        due = []
        for key, when in rows:
            if when > before_ms:
                break
            due.append((key,))
        self._conn.executemany(f"DELETE FROM {table} WHERE {order} = ?", due)
        return len(due)

    def expire_removed(self, table: str, before_ms: int, limit: int) -> int:
        """Tombstones of removed Works or timers removed by ``before_ms``."""
        assert table in ("removed_works", "removed_timers")
        rows = self._all(
            f"SELECT id FROM {table} WHERE removed_at_ms <= ? ORDER BY removed_at_ms, id LIMIT ?",
            (before_ms, limit),
        )
        self._conn.executemany(f"DELETE FROM {table} WHERE id = ?", rows)
        return len(rows)

    def kv_page(self, namespace: str, after_key: str, limit: int) -> list[tuple[str, int]]:
        """(key, updated_at) of a namespace's entries after ``after_key``, in key order."""
        rows = self._all(
            "SELECT key, updated_at_ms FROM kv WHERE namespace = ? AND key > ? ORDER BY key LIMIT ?",
            (namespace, after_key, limit),
        )
        return [(r[0], r[1]) for r in rows]

    def kv_delete(self, namespace: str, keys: list[str]) -> None:
        for key in keys:
            self._kv.pop((namespace, key), None)
            self._to_carry.kv_written.add((namespace, key))
        self._conn.executemany(
            "DELETE FROM kv WHERE namespace = ? AND key = ?", [(namespace, k) for k in keys]
        )

    def expire_buckets(self, before_minute: int, limit: int) -> int:
        """Causal buckets of minutes before ``before_minute`` (only the current minute is ever charged)."""
        rows = self._all(
            "SELECT root_id, minute FROM causal_buckets WHERE minute < ? ORDER BY minute LIMIT ?",
            (before_minute, limit),
        )
        self._conn.executemany("DELETE FROM causal_buckets WHERE root_id = ? AND minute = ?", rows)
        return len(rows)

    # -- tombstones that answer for what was removed ----------------------------------------------------

    def event_tombstone(self, source: str, delivery_id: str) -> tuple[int, int] | None:
        """(seq, accepted_at) of a removed Event with this delivery identity."""
        row = self._one(
            "SELECT seq, accepted_at_ms FROM event_tombstones WHERE source = ? AND delivery_id = ?",
            (source, delivery_id),
        )
        return (int(row[0]), int(row[1])) if row else None

    def work_removed(self, work_id: str) -> bool:
        """Whether compaction removed a Work of this id (it stays taken until its tombstone expires). A
        database alone first reads whether any is at all, once: a Work routed on a store never compacted
        reads nothing more (each new Work's routing asks)."""
        if self._caching:
            if self._removed_works is None:
                self._removed_works = self._one("SELECT EXISTS (SELECT 1 FROM removed_works)") == (1,)
            if not self._removed_works:
                return False
        return self._one("SELECT 1 FROM removed_works WHERE id = ?", (work_id,)) is not None

    def forget_removed_timer(self, timer_id: str) -> None:
        self._conn.execute("DELETE FROM removed_timers WHERE id = ?", (timer_id,))

    # -- giving space back ------------------------------------------------------------------------------

    def free_pages(self) -> int:
        """Pages of the file that hold nothing (SQLite; ``0`` elsewhere)."""
        if self.dialect.shared:
            return 0
        row = self._one("PRAGMA freelist_count")
        return int(row[0]) if row else 0

    def release_pages(self, pages: int) -> int:
        """Give up to ``pages`` free pages back to the file system at this commit (SQLite with incremental
        vacuum; a file without it keeps them for reuse). Returns the bytes released."""
        if self.dialect.shared or pages <= 0:
            return 0
        mode = self._one("PRAGMA auto_vacuum")
        if not mode or int(mode[0]) != 2:
            return 0
        size = self._one("PRAGMA page_size")
        before = self.free_pages()
        for _ in range(min(pages, before)):
            # each step of the pragma releases one page (a driver runs one step per execute)
            self._conn.execute("PRAGMA incremental_vacuum(1)")
        return (before - self.free_pages()) * (int(size[0]) if size else 0)
