"""`CausalTx`: the causal bounds' rows (a root's pinned limits, its per-minute buckets)."""

from __future__ import annotations

from . import _sql
from ._tx_base import TxBase


class CausalTx(TxBase):
    def causal_root_limits(self, root_id: str) -> tuple[int, int] | None:
        """A root's pinned limits (``None``: it has none, the defaults). Where no root is pinned (every
        root accepted under the default limits), no read: a transaction alone on its database reads
        once whether any is, and only its own pins say yes again (`roots_pinned`)."""
        if not self.roots_pinned():
            return None
        row = self._one("SELECT max_depth, per_minute FROM causal_roots WHERE root_id = ?", (root_id,))
        return (int(row[0]), int(row[1])) if row else None

    def roots_pinned(self) -> bool:
        """Whether any root may have pinned limits (``False`` is sure; on a shared database, always true)."""
        if not self._caching:
            return True
        if self._pinned_roots is None:
            self._pinned_roots = self._one("SELECT EXISTS (SELECT 1 FROM causal_roots)") == (1,)
        return self._pinned_roots

    def pin_causal_root(self, root_id: str, max_depth: int, per_minute: int) -> None:
        self._conn.execute(
            "INSERT INTO causal_roots (root_id, max_depth, per_minute) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (root_id, max_depth, per_minute),
        )
        if self._pinned_roots is not None:
            self._pinned_roots = True

    def bucket_count(self, root_id: str, minute: int) -> int:
        row = self._one(_sql.BUCKET_COUNT, (root_id, minute))
        return int(row[0]) if row else 0

    def charge_bucket_under(self, root_id: str, minute: int, limit: int) -> bool:
        """Add one to a root's bucket for ``minute`` if it holds fewer than ``limit`` (at least 1): whether
        it did (a full bucket is left as it is). The check and the charge in one statement, which
        changes one row when it charges and none when the bucket is full (no ``RETURNING``: it costs)."""
        assert limit >= 1, "a bucket that takes nothing is checked, not charged"
        cur = self._conn.execute(
            "INSERT INTO causal_buckets (root_id, minute, count) VALUES (?, ?, 1)"
            " ON CONFLICT (root_id, minute) DO UPDATE SET count = causal_buckets.count + 1"
            " WHERE causal_buckets.count < ?",
            (root_id, minute, limit),
        )
        return bool(cur.rowcount == 1)

    def charge_bucket(self, root_id: str, minute: int) -> None:
        """Add one to a root's bucket for ``minute`` (the count is not read back: the check before the
        charge read it)."""
        self._conn.execute(
            "INSERT INTO causal_buckets (root_id, minute, count) VALUES (?, ?, 1)"
            " ON CONFLICT (root_id, minute) DO UPDATE SET count = causal_buckets.count + 1",
            (root_id, minute),
        )
