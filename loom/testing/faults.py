"""Crash points: stop the storage actor just before or just after a commit.

A `CrashAt` hook passed as ``open_runtime(fault=...)`` raises `CrashPoint` in the
storage actor's worker thread at the chosen boundary. Before the commit the open
transaction is dropped with the connection (as a killed process would lose it); after
the commit the data is durable but no caller hears back. The runtime then stops with
`CrashPoint`; tests reopen the file and check that nothing acknowledged is lost and
nothing half-written exists.
"""

from __future__ import annotations

import enum

import attrs

from ..records.errors import InvalidRequest
from ..store import CrashPoint, as_store

__all__ = ["AFTER_COMMIT", "BEFORE_COMMIT", "Boundary", "CrashAt", "CrashPoint", "storage_failure"]


class Boundary(enum.StrEnum):
    BEFORE_COMMIT = "before_commit"
    AFTER_COMMIT = "after_commit"


BEFORE_COMMIT = Boundary.BEFORE_COMMIT
AFTER_COMMIT = Boundary.AFTER_COMMIT


def _boundary(value: object) -> Boundary:
    """A crash point's boundary; anything else is refused, naming the two (one that matched no
    boundary would never fire, and the test that set it would pass without its crash)."""
    for boundary in Boundary:
        if isinstance(value, str) and value == boundary.value:
            return boundary
    raise InvalidRequest(
        f"CrashAt boundary must be {BEFORE_COMMIT.value!r} or {AFTER_COMMIT.value!r}, got {value!r}"
    )


@attrs.define
class CrashAt:
    """Crash at ``boundary`` of the ``batch``-th batch (1-based) the storage actor runs.

    Batches are counted from the actor's start; migrations at open are not batches.
    """

    boundary: Boundary = attrs.field(converter=_boundary)
    batch: int = attrs.field()
    fired: bool = False

    @batch.validator
    def _check_batch(self, attribute: object, value: object) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidRequest(f"CrashAt batch must be a whole number from 1, got {value!r}")

    def __call__(self, point: str, batch_no: int) -> None:
        if not self.fired and point == self.boundary and batch_no >= self.batch:
            self.fired = True
            raise CrashPoint(f"crash point: {point} of batch {batch_no}")


def storage_failure(store: str, message: str = "disk I/O error") -> Exception:
    """An error the driver of ``store``'s backend raises when the store itself fails (a full disk,
    an I/O error), for a procedure to raise on purpose: the batch it is in must fail as a whole."""
    return as_store(store).dialect.failure(message)
