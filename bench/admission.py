"""Admission under scope capacity: the cost of starting N ready Works that share one slot.

Run from the repository root::

    python bench/admission.py [--works N] [--backend sqlite|postgres] [--url URL]

N Works become ready in scope ``shop`` (capacity 1) while the first one runs; the runtime's own starter
then drains them, each attempt completing at once. The script counts the claims the admission pass
tries (each one starts an attempt or finds its Work changed) and the storage requests of the whole
drain, per Work started, and checks the Works started in the order they became ready. A starter that
tries every waiting Work whenever a slot frees costs N(N-1)/2 claims. See bench/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import trio
from backend import add_options, check_options, chosen

import loom
import loom.kernel.admission
from loom import Completed, Config, EventIn, open_runtime
from loom.plugins.python_executor import PythonExecutor
from loom.testing.internals import storage_of

CONFIG = Config.from_dict(
    {
        "scopes": {
            "shop": {
                "capacity": 1,
                "routes": [{"name": "orders", "types": ["order.*"], "create_work": True, "binding": "py"}],
                "bindings": {"py": {"executor": "python", "config": {"function": "run"}}},
            }
        }
    }
)


class Drain:
    def __init__(self, works: int) -> None:
        self.works = works
        self.started: list[str] = []
        self.first = trio.Event()
        self.go = trio.Event()
        self.done = trio.Event()

    async def run(self, request: Any, toolbelt: Any) -> Completed:
        self.started.append(request.work_id)
        if len(self.started) == 1:
            self.first.set()
            await self.go.wait()
        if len(self.started) == self.works:
            self.done.set()
        return Completed()


async def measure(store: Any, works: int) -> tuple[int, int, float, bool]:
    claims = 0
    real = loom.kernel.admission.claim_in_tx

    def counted(tx: Any, now_ms: int, request: Any) -> Any:
        nonlocal claims
        claims += 1
        return real(tx, now_ms, request)

    loom.kernel.admission.claim_in_tx = counted  # type: ignore[assignment]
    try:
        drain = Drain(works)
        executor = PythonExecutor()
        executor.register("run", drain.run)
        async with open_runtime(store, config=CONFIG, plugins=[executor], load_entry_points=False) as rt:
            await rt.publish(
                EventIn(source="b", delivery_id="0", type="order.placed", scope="shop", key="o/0")
            )
            await drain.first.wait()
            for i in range(1, works):
                await rt.publish(
                    EventIn(source="b", delivery_id=str(i), type="order.placed", scope="shop", key=f"o/{i}")
                )
                await rt.wait_idle()  # ready before the next, so readiness order is publish order
            ready = [(await rt.work_for_key(f"o/{i}")).id for i in range(works)]
            claims_before = claims - 1
            requests_before = storage_of(rt).stats.requests
            started = time.perf_counter()
            drain.go.set()
            await drain.done.wait()
            await rt.wait_idle()
            seconds = time.perf_counter() - started
            requests = storage_of(rt).stats.requests - requests_before
            in_order = drain.started == ready
        return claims - claims_before, requests, seconds, in_order
    finally:
        loom.kernel.admission.claim_in_tx = real  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--works", type=int, default=100, help="Works sharing the one slot (default 100)")
    add_options(parser)
    args = parser.parse_args(argv)
    check_options(parser, args)
    with chosen(args, "loom-bench-admission-") as backend:
        header = backend.server() if backend.postgres else "SQLite file, synchronous=FULL"
        print(f"# {sys.platform}, python {sys.version.split()[0]}, {header}")
        claims, requests, _seconds, in_order = trio.run(measure, backend.store("admission.db"), args.works)
        drained = args.works - 1
        print(
            f"{args.works} Works under capacity 1: {claims} claims to start the {drained} waiting "
            f"({claims / drained:.2f} per start; trying every waiting Work at each freed slot would take "
            f"{drained * (drained - 1) // 2:,}), {requests / drained:.1f} storage requests per start, "
            f"readiness order {'kept' if in_order else 'NOT KEPT'}"
        )
        if not in_order:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
