"""Running an attempt: launch it through its executor, renew its lease while it runs, and commit its
outcome (whoever claims an attempt holds and renews its lease from the claim, through launch and observation, until the outcome commits or the
lease is lost; losing it stops the launch).

The executor is a boundary: a launch that raises, or answers something that is not an outcome, fails
the attempt with that reason (logged with its traceback, and a diagnostic). A completion blocked
behind an accepted Event not yet routed waits for that Event's checkpoint, renewing the lease all
the while, however long that takes.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import trio

from ..config import Config
from ..kernel.chains import adopt_then_complete_in_tx, complete_then_start_in_tx
from ..kernel.executions import CompletionBlocked, KindPolicy, kind_policy, record_outcome_in_tx
from ..kernel.recovery import not_adoptable_in_tx
from ..records.errors import CallParked, InvalidRequest, NotAdoptable, StaleAuthority, StorageError
from ..records.events import DiagnosticKind
from ..records.executor import Executor
from ..records.validation import storable_text, validate_outcome
from ..records.work import ExecutionState, Failed, Lease, Outcome
from .shared import Shared
from .starter import admit_request
from .supervision import contained, describe
from .toolbelt import RuntimeToolbelt

log = logging.getLogger("loom.attempts")

ENDED_BY_ITSELF = frozenset(
    {
        ExecutionState.COMPLETED,
        ExecutionState.HANDOFF,
        ExecutionState.FAILED,
        ExecutionState.PARKED,
        ExecutionState.WAITED,
    }
)
"""The states an attempt's own authority ends it in (a control's fence moves it to ``stopping`` or
``cancelled`` and stops it itself)."""


class _Renewal:
    """One attempt's place in `Renewals`: its toolbelt (holding the current lease) and the scope that
    observes its launch."""

    __slots__ = ("check", "ended", "lost", "observing", "queued", "returned", "toolbelt")

    def __init__(
        self,
        toolbelt: RuntimeToolbelt,
        observing: trio.CancelScope,
        lost: Callable[[], Awaitable[object]] | None,
    ) -> None:
        self.toolbelt: RuntimeToolbelt | None = toolbelt
        """``None`` once ended (as are ``observing``, ``lost`` and ``check``)."""
        self.observing: trio.CancelScope | None = observing
        self.lost = lost
        """Called when the lease is lost, before the launch's observation is cancelled."""
        self.returned = False
        """The launch returned: its runner commits what it answered, and a lease it loses from here on
        is no news to anyone."""
        self.check: Callable[[], None] | None = None
        """Its entry in `Shared.held`."""
        self.ended = False
        self.queued = False
        """In the heap (not being renewed right now)."""


class Renewals:
    """The leases of the attempts one runner holds, each renewed a third of the way through (two thirds
    of it still to run), from one task that sleeps on the clock until the earliest is due (a task and a
    clock sleep per attempt cost more than most attempts take). Each renewal runs in a task of its
    own, so a slow store delays no other; a lost lease cancels the attempt's observing scope. An
    attempt that ends is dropped when its turn comes (or when ended ones outnumber the rest)."""

    COMPACT_AT = 1024
    """Ended entries past which the heap is rebuilt without them (when they are most of it)."""

    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._heap: list[tuple[int, int, _Renewal]] = []
        self._order = itertools.count()
        self._ended = 0
        self._earlier = trio.Event()
        self._running = False

    def add(
        self,
        toolbelt: RuntimeToolbelt,
        observing: trio.CancelScope,
        lost: Callable[[], Awaitable[object]] | None = None,
    ) -> _Renewal:
        renewal = _Renewal(toolbelt, observing, lost)
        renewal.check = partial(self._check, renewal)
        self._s.held[toolbelt.lease.execution_id] = renewal.check
        self._push(renewal)
        if not self._running:
            self._running = True
            self._s.activity.start_uncounted(self._run)  # it sleeps on the clock: never busy
        return renewal

    def end(self, renewal: _Renewal) -> None:
        if renewal.ended or renewal.toolbelt is None:
            return
        renewal.ended = True
        execution_id = renewal.toolbelt.lease.execution_id
        if self._s.held.get(execution_id) is renewal.check:
            del self._s.held[execution_id]
        # what it holds goes now, not when its turn comes: its request's inputs may be large, and
        # its check refers back to it (a cycle only the collector would break)
        renewal.check = renewal.lost = renewal.toolbelt = renewal.observing = None
        if not renewal.queued:
            return  # being renewed now: it does not go back
        self._ended += 1
        if self._ended > self.COMPACT_AT and 2 * self._ended > len(self._heap):
            for entry in self._heap:
                entry[2].queued = not entry[2].ended
            self._heap = [entry for entry in self._heap if entry[2].queued]
            heapq.heapify(self._heap)
            self._ended = 0

    def _push(self, renewal: _Renewal) -> None:
        assert renewal.toolbelt is not None  # (not ended)
        lease = renewal.toolbelt.lease
        due = lease.expires_at_ms - self._s.lease_ms * 2 // 3
        if not self._heap or due < self._heap[0][0]:
            self._earlier.set()  # the task sleeps until a later moment: it looks again
        heapq.heappush(self._heap, (due, next(self._order), renewal))
        renewal.queued = True

    async def _run(self) -> None:
        clock = self._s.clock
        while True:
            while self._heap and self._heap[0][2].ended:
                heapq.heappop(self._heap)[2].queued = False
                self._ended -= 1
            self._earlier = earlier = trio.Event()
            if not self._heap:
                await earlier.wait()
                continue
            due, _, renewal = self._heap[0]
            if due > clock.now_ms():
                async with trio.open_nursery() as nursery:

                    async def on_clock(due: int = due) -> None:
                        await clock.sleep_until(due)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(on_clock)
                    await earlier.wait()
                    nursery.cancel_scope.cancel()
                continue
            heapq.heappop(self._heap)
            renewal.queued = False
            self._s.activity.start_uncounted(self._renew, renewal)

    def _check(self, renewal: _Renewal) -> None:
        """Renew ``renewal``'s lease now (its attempt may have ended by another path: `Shared.held`)."""
        if not renewal.ended:
            self._s.activity.start_uncounted(self._renew, renewal, False)

    async def _renew(self, renewal: _Renewal, again: bool = True) -> None:
        """Renew one lease (``again``: and queue its next renewal); losing it stops the launch (this
        runner stops observing the attempt and commits nothing), once ``renewal.lost`` has seen to what
        the attempt left running."""
        toolbelt, observing, lost = renewal.toolbelt, renewal.observing, renewal.lost
        if toolbelt is None or observing is None:
            return  # ended
        try:
            await toolbelt.heartbeat()
        except StaleAuthority as exc:
            if renewal.ended:
                return  # its outcome committed meanwhile, or another renewal found it lost
            log.info("execution %s lost its lease: %s", toolbelt.lease.execution_id, exc)
            self.end(renewal)
            if lost is not None and not renewal.returned:
                await lost()
            observing.cancel()
            return
        if again and not renewal.ended:
            self._push(renewal)


class AttemptRunner:
    def __init__(self, shared: Shared, *, chain: bool = False) -> None:
        """``chain``: the runtime's starter runs, so a completion that leaves input waiting starts the
        next attempt in the same commit (`chains.complete_then_start_in_tx`), run here as well."""
        self._s = shared
        self._chain = chain
        self._renewals = Renewals(shared)

    def start(self, lease: Lease, executor_name: str, *, metadata: Mapping[str, Any] | None = None) -> None:
        """Run the attempt ``lease`` holds, in a task of its own. With ``metadata`` (a recovery that
        found the attempt handed to its executor), the executor's ``recover`` adopts it instead."""
        executor = self._s.extensions.executors[executor_name]
        if metadata is None and not lease.request.resumed:
            # its claim marked it handed: until its executor has it, a clean close unmarks it
            self._s.unlaunched[lease.execution_id] = lease.epoch
            if self._s.draining.on:
                return  # claimed just before the drain: the next open launches it
        self._s.activity.spawn(self._run, lease, executor_name, executor, self._s.config(), metadata)

    def unlaunched(self, lease: Lease) -> None:
        """``lease``'s attempt was claimed and will not be launched here (the runtime is closing): a
        clean close unmarks it, so the next open relaunches it as never handed."""
        if not lease.request.resumed:
            self._s.unlaunched[lease.execution_id] = lease.epoch

    async def _run(
        self, lease: Lease, name: str, executor: Executor, config: Config, metadata: Mapping[str, Any] | None
    ) -> None:
        """Hold and renew the lease from the claim through launch to the committed outcome."""
        kind = kind_policy(config, lease.request.kind)
        toolbelt = RuntimeToolbelt(
            self._s.storage,
            lease,
            limits=config.causal,
            generation=config.generation,
            lease_ms=self._s.lease_ms,
            policies=self._s.extensions.recurrence_policies,
            gates=self._s.extensions.call_gates,
            kind=kind,
            budgets=config.budgets,
        )
        outcome: Outcome | None = None
        observing = trio.CancelScope()
        toolbelt.on_park = observing.cancel  # a call gate parked it: its outcome is the wait
        # renewed until the outcome commits
        renewal = self._renewals.add(toolbelt, observing, partial(self._lost, lease, name, executor))
        self._s.draining.enter(lease.execution_id, executor)  # until its outcome commits
        try:
            with observing:
                if metadata is not None:
                    outcome = await self._recover(lease, name, executor, toolbelt, metadata)
                else:
                    outcome = await self._launch(lease, name, executor, toolbelt)
            renewal.returned = True
            if outcome is not None and not observing.cancelled_caught and not toolbelt.parked:
                await self._commit(toolbelt, outcome, kind, recovered=metadata is not None)
        finally:
            self._renewals.end(renewal)
            self._s.draining.leave(lease.execution_id)
        # ended without a close: launched, or its lease was lost before (it is another's to recover)
        self._launched(lease)

    async def _lost(self, lease: Lease, name: str, executor: Executor) -> None:
        """``lease`` was lost. An attempt that ended under it by another path than this runner's commit
        (its process ended it through the service's toolbelt: a completion, a wait) leaves nobody to
        stop what still runs of it, so its executor is asked to interrupt it here. An attempt lost to a
        recovery is left to the recovering executor's ``recover``, and one a control fenced (a cancel,
        an interrupt) is stopped by that control. (An execution deadline fails the attempt and stops
        it too: its executor may be asked twice, and an interrupt of a stopped attempt returns.)"""
        interrupt = getattr(executor, "interrupt", None)
        if interrupt is None:
            return
        execution = await self._s.reader.execution(lease.execution_id)
        if (
            execution is None
            or execution.attempt != lease.attempt
            or execution.epoch != lease.epoch
            or execution.state not in ENDED_BY_ITSELF
        ):
            return
        try:
            await interrupt(lease.execution_id)
        except Exception as exc:
            reason = f"stopping an attempt that ended through its toolbelt failed: {describe(exc)}"
            await self._contain(name, "interrupt", lease, reason, exc, DiagnosticKind.INTERRUPT_FAILED)

    def _launched(self, lease: Lease) -> None:
        if self._s.unlaunched.get(lease.execution_id) == lease.epoch:
            del self._s.unlaunched[lease.execution_id]

    async def _recover(
        self,
        lease: Lease,
        name: str,
        executor: Executor,
        toolbelt: RuntimeToolbelt,
        metadata: Mapping[str, Any],
    ) -> Outcome | None:
        """Ask the executor to verify the expired attempt; adopt it, or fail it as not adoptable."""
        recover = getattr(executor, "recover", None)
        try:
            if recover is None:
                raise NotAdoptable(f"executor {name!r} cannot adopt an attempt (it has no recover)")
            # the executor's own work is not work in flight: it steps out of the activity count
            answer = await self._s.activity.outside(partial(recover, lease.request, toolbelt, dict(metadata)))
        except StaleAuthority as exc:
            # its adoption was refused: cancelled, or recovered again meanwhile
            log.info("recovery of execution %s lost its authority: %s", lease.execution_id, exc)
            return None
        except NotAdoptable as exc:
            try:
                await self._s.storage.submit(
                    not_adoptable_in_tx, toolbelt.authority, str(exc) or "unverifiable"
                )
            except StaleAuthority:
                pass  # cancelled, or recovered by another recoverer meanwhile
            return None
        except StorageError:
            raise  # the store failed under the executor's toolbelt call: not the executor's fault
        except Exception as exc:
            # a boundary failure fails this one attempt: it could not be verified (retry applies)
            reason = f"executor {name!r} recover raised {describe(exc)}"
            await self._contain(name, "recover", lease, reason, exc)
            try:
                await self._s.storage.submit(not_adoptable_in_tx, toolbelt.authority, reason)
            except StaleAuthority:
                pass
            return None
        try:
            outcome = validate_outcome(answer, field=f"executor {name!r} recovered outcome")
        except InvalidRequest as exc:
            await self._contain(name, "recover", lease, str(exc), None)
            outcome = Failed(error=storable_text(str(exc)))
        # a finished result the executor did not adopt is adopted by its completion's own commit
        # (`chains.adopt_then_complete_in_tx`): under the new fence, with no request of its own
        return outcome

    async def _launch(
        self, lease: Lease, name: str, executor: Executor, toolbelt: RuntimeToolbelt
    ) -> Outcome:
        """The executor's outcome, or a `Failed` naming what went wrong at the boundary."""
        resume = getattr(executor, "resume", None) if lease.request.resumed else None
        # a closing runtime hands nothing more out: what it claimed and never launched stays unlaunched
        await trio.lowlevel.checkpoint_if_cancelled()
        self._launched(lease)  # handed from here on: a close no longer unmarks it
        try:
            # a running execution is not work in flight: it steps out of the activity count
            if resume is not None:
                answer = await self._s.activity.outside(partial(resume, lease.request, toolbelt))
            else:
                answer = await self._s.activity.outside(partial(executor.launch, lease.request, toolbelt))
        except CallParked:
            return Failed(error="parked by a call gate")  # not committed: the attempt is parked
        except StorageError:
            raise  # the store failed under the executor's toolbelt call: not the executor's fault
        except Exception as exc:
            reason = f"executor {name!r} raised {describe(exc)}"
            await self._contain(name, "launch", lease, reason, exc)
            return Failed(error=storable_text(reason))
        try:
            return validate_outcome(answer, field=f"executor {name!r} outcome")
        except InvalidRequest as exc:
            reason = str(exc)
            await self._contain(name, "launch", lease, reason, None)
            return Failed(error=storable_text(reason))

    async def _commit(
        self, toolbelt: RuntimeToolbelt, outcome: Outcome, kind: KindPolicy, *, recovered: bool = False
    ) -> None:
        """Commit the outcome under the lease (still renewed); a completion blocked behind an unrouted
        Event waits for that Event's checkpoint and tries again, with no limit but the lease.
        ``recovered``: the outcome is a recovered attempt's, adopted in the same commit if its executor
        did not adopt it."""
        storage, activity = self._s.storage, self._s.activity
        lease = toolbelt.lease
        while True:
            try:
                config = self._s.config()
                adopting = recovered and not toolbelt.adopted
                if adopting or not self._chain:
                    await storage.submit(
                        adopt_then_complete_in_tx if adopting else record_outcome_in_tx,
                        toolbelt.authority,
                        outcome,
                        kind,
                        config.causal,
                        config.budgets,
                    )
                    return
                following = await storage.submit(
                    complete_then_start_in_tx,
                    toolbelt.authority,
                    outcome,
                    kind,
                    config.causal,
                    config.budgets,
                    admit_request(self._s),
                )
                if following is not None:
                    self.start(following, following.request.executor or "")
                return
            except StaleAuthority as exc:
                # the attempt had already ended (it parked on a wait, was cancelled or recovered
                # elsewhere): its executor's return has nothing left to record, which is normal
                log.debug(
                    "execution %s had already ended; its executor's return is not recorded (%s)",
                    lease.execution_id,
                    exc,
                )
                return
            except CompletionBlocked as blocked:
                await activity.wait_routed(blocked.event_id, partial(self._is_routed, blocked.event_id))
            except StorageError:
                raise
            except Exception as exc:
                reason = f"committing the outcome failed: {describe(exc)}"
                await self._contain("core", "complete", lease, reason, exc)
                if isinstance(outcome, Failed):
                    return  # the lease expires; recovery takes it from there
                outcome = Failed(error=storable_text(reason))

    async def _is_routed(self, event_id: str) -> bool:
        return await self._s.reader.checkpoint(event_id) is not None

    async def _contain(
        self,
        plugin: str,
        hook: str,
        lease: Lease,
        reason: str,
        exc: BaseException | None,
        kind: DiagnosticKind = DiagnosticKind.EXECUTOR_FAILED,
    ) -> None:
        await contained(
            self._s.storage,
            kind,
            plugin=plugin,
            hook=hook,
            item=lease.execution_id,
            reason=reason,
            exc=exc,
            logger=log,
            work=lease.work_id,
            attempt=lease.attempt,
        )
