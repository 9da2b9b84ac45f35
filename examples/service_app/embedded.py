"""The service app of tasks.py, embedded: the same `loom.App` given to ``open_runtime``.

Run it as it is:  python examples/service_app/embedded.py
It uses a fresh SQLite file in a temporary directory and prints each Work's result.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

import loom

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tasks import app  # noqa: E402  # the module beside this file


async def main() -> None:
    config = loom.Config.load(HERE / "loom.toml")
    with tempfile.TemporaryDirectory() as folder:
        async with loom.open_runtime(str(Path(folder) / "shop.db"), config=config, plugins=[app]) as rt:
            order = loom.EventIn(source="shop", delivery_id="o-1", type="order.placed", scope="shop",
                                 key="order/1", payload={"items": [{"sku": "A", "qty": 2, "price": 5}]})  # fmt: skip
            accepted = await rt.publish(order)
            checkpoint = await rt.wait_routed(accepted.id, timeout=10)  # which route, which Work
            if checkpoint is None or checkpoint.work_id is None:
                raise SystemExit(f"order/1 was not routed to a Work: {checkpoint}")
            result = await rt.wait_for(checkpoint.work_id, timeout=30)
            print(f"order/1: {result.state} with {result.value}")
            await rt.wait_idle()
            for work in await rt.works(scope="shop"):
                done = await rt.wait_for(work.id, timeout=30)
                print(f"  {work.id} ({work.keys or 'no key'}): {done.state}, {done.value!r}")


if __name__ == "__main__":
    trio.run(main)
