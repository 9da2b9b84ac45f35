"""What a runtime keeps in memory once the work is done: nothing of an ended attempt (its request holds
its inputs, whose payloads may be large) and nothing of a committed transaction (its notices and the
records it knew), freed as soon as they end rather than when the cyclic collector next runs."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from loom import Completed, Config, EventIn, RunRequest, open_runtime
from loom.plugins.python_executor import PythonExecutor
from loom.records.executor import Toolbelt
from loom.records.work import Outcome, WorkState
from loom.store._tx import Tx

CONFIG = Config.from_toml("""
[scopes.shop.bindings.py]
executor = "python"
config = { function = "run" }

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
binding = "py"
""")


@pytest.fixture
def no_collector() -> Iterator[None]:
    """The cyclic collector off: what is still alive at the end is held, or on a cycle."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def alive(kind: type) -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is kind)


async def test_ended_attempts_and_committed_transactions_are_freed_at_once(
    loom_store: str, no_collector: None
) -> None:
    requests: list[weakref.ref[RunRequest]] = []
    executor = PythonExecutor()

    @executor.function("run")
    async def run(request: RunRequest, toolbelt: Toolbelt) -> Outcome:
        requests.append(weakref.ref(request))
        return Completed()

    async with open_runtime(loom_store, config=CONFIG, plugins=[executor], load_entry_points=False) as rt:
        for n in range(20):
            await rt.publish(
                EventIn(
                    source="shop",
                    delivery_id=f"o-{n}",
                    type="order.placed",
                    scope="shop",
                    key=f"order/{n}",
                    payload={"lines": "x" * 10_000},
                )
            )
        await rt.wait_idle()
        works = [await rt.work_for_key(f"order/{n}") for n in range(20)]
        assert all(w is not None and w.state is WorkState.COMPLETED for w in works)
        assert len(requests) == 20
        # the lease renewals held each ended attempt's request (and its inputs) until its renewal
        # was due, tens of seconds on; a transaction's records made on demand referred back to it
        assert [ref for ref in requests if ref() is not None] == []
        assert alive(Tx) == 0
