"""Running an attempt: launch it through its executor, renew its lease while it runs, and commit its
outcome (seed 003 "Lease recovery, retry and cancellation": whoever claims an attempt holds and
renews its lease from the claim, through launch and observation, until the outcome commits or the
lease is lost; losing it stops the launch).
"""

from __future__ import annotations

import logging

import trio

from ..config import Config
from ..kernel.authority import Authority
from ..kernel.executions import complete_in_tx, kind_policy
from ..records.errors import Conflict, StaleAuthority
from ..records.executor import Executor
from ..records.work import Failed, Lease, Outcome
from .shared import Shared
from .toolbelt import RuntimeToolbelt

log = logging.getLogger("loom.router")

MAX_COMPLETION_RETRIES = 100


class AttemptRunner:
    def __init__(self, shared: Shared) -> None:
        self._s = shared

    def start(self, lease: Lease, executor_name: str) -> None:
        """Run the attempt ``lease`` holds, in a task of its own."""
        executor = self._s.extensions.executors[executor_name]
        self._s.activity.spawn(self._run, lease, executor, self._s.config())

    async def _run(self, lease: Lease, executor: Executor, config: Config) -> None:
        """Hold and renew the lease from the claim through launch to the committed outcome."""
        activity = self._s.activity
        toolbelt = RuntimeToolbelt(
            self._s.storage,
            lease,
            limits=config.causal,
            generation=config.generation,
            lease_ms=self._s.lease_ms,
        )
        outcome: Outcome
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._renew, toolbelt, executor)  # not counted: it sleeps on the clock

            async def launch() -> Outcome:
                try:
                    return await executor.launch(lease.request, toolbelt)
                except Exception as exc:
                    return Failed(error=f"executor raised {type(exc).__name__}: {exc}")

            # a running execution is not routing work in flight
            outcome = await activity.outside(launch)
            nursery.cancel_scope.cancel()
        kind = kind_policy(config, lease.request.kind)
        for _ in range(MAX_COMPLETION_RETRIES):
            changes = activity.changes
            try:
                await self._s.storage.submit(complete_in_tx, Authority.of(toolbelt.lease), outcome, kind)
                return
            except StaleAuthority as exc:
                log.info("execution %s ended without authority: %s", lease.execution_id, exc)
                return
            except Conflict:
                # unrouted input for this Work: wait for routing to settle, then retry
                await activity.wait_change(changes)

    async def _renew(self, toolbelt: RuntimeToolbelt, executor: Executor) -> None:
        lease_ms = self._s.lease_ms
        while True:
            lease = toolbelt.lease
            await self._s.clock.sleep_until(lease.expires_at_ms - lease_ms * 2 // 3)
            try:
                await toolbelt.heartbeat()
            except StaleAuthority:
                # losing the lease stops the launch
                await executor.interrupt(lease.execution_id)
                return
