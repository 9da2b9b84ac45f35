"""A fault-injection test written with ``loom.testing``: crash the store at a commit and check what
survives a restart.

Run it as it is:  python examples/test_fault_injection.py   (or: pytest examples/test_fault_injection.py)

`CrashAt` stops loom's storage actor just before or just after the commit of a chosen batch, as a
killed process would stop. Before the commit, nothing of the batch is stored and the publisher never
got an acknowledgement, so it must offer the Event again; after the commit, the Event is durable even
though the publisher never heard back, and offering it again finds the original (``duplicate``).
Either way, after a reopen the Event is stored exactly once. `ManualClock` keeps business time still.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import loom
from loom.testing import T0_MS
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint

pytestmark = pytest.mark.trio  # (or `trio_mode = true` in your pytest configuration)

ORDER = loom.EventIn(source="shop", delivery_id="order-1", type="order.placed", scope="shop", key="order/1")


async def publish_through_a_crash(db: str, boundary: Boundary) -> None:
    """Publish once while the storage actor crashes at ``boundary`` of its first batch."""
    clock = loom.ManualClock(start_ms=T0_MS)
    try:
        async with loom.open_runtime(db, clock=clock, fault=CrashAt(boundary, batch=1), actors=()) as rt:
            with pytest.raises(loom.StorageClosed):
                await rt.publish(ORDER)  # the publisher never hears back
    except* CrashPoint:
        pass  # the runtime stopped, as the process would have


@pytest.mark.parametrize(("boundary", "stored_before_retry"), [(BEFORE_COMMIT, 0), (AFTER_COMMIT, 1)])
async def test_an_event_is_stored_exactly_once_whatever_the_crash(
    tmp_path: Path, boundary: Boundary, stored_before_retry: int
) -> None:
    db = str(tmp_path / "shop.db")
    await publish_through_a_crash(db, boundary)

    async with loom.open_runtime(db, clock=loom.ManualClock(start_ms=T0_MS), actors=()) as rt:
        assert len(await rt.events()) == stored_before_retry
        again = await rt.publish(ORDER)  # the publisher retries what it never saw acknowledged
        assert again.duplicate is (stored_before_retry == 1)
        assert [e.delivery_id for e in await rt.events()] == ["order-1"]


if __name__ == "__main__":
    # pytest in a process of its own: this one has already imported what pytest would rewrite
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", __file__, "-v", "-p", "no:cacheprovider"]))
