"""Commit notices: what a committed batch tells the actors (published only after COMMIT)."""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class EventAccepted:
    """A new Event was durably accepted (duplicates publish nothing)."""

    event_id: str
    seq: int
    type: str
    scope: str
    key: str | None
    work_id: str | None


Notice = EventAccepted
