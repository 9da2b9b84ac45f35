"""The execution's fenced toolbelt: emit, create child Work, arm timers, heartbeat, pin and adopt.

Every call presents the lease; a stale one fails with `StaleAuthority` and changes nothing. Call gates
(docs/recovery.md, "Gated calls") are asked about each operation before it runs, outside any transaction: a
refusal is the call's result (`CallRefused`, nothing changes); a wait parks the attempt on it under its
fence exactly as a `Waiting` outcome does, and the call raises `CallParked`. The gated operation never
ran: once woken, the attempt may make the call again, and the gates decide again.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..config import Budget, CausalLimits
from ..kernel.authority import Authority
from ..kernel.executions import KindPolicy, renew_in_tx
from ..kernel.recovery import adopt_in_tx, pin_metadata_in_tx
from ..kernel.toolbelt import arm_derived_in_tx, create_child_in_tx, emit_in_tx, park_on_call_in_tx
from ..records.errors import CallParked, CallRefused, CausalRefused, Conflict, InvalidRequest
from ..records.events import CausalRejection, DiagnosticKind, Event, EventIn
from ..records.executor import GatedCall, RefuseCall, WaitForCall
from ..records.timers import RecurrencePolicy, Timer, TimerSpec
from ..records.validation import check_keys, check_reason, check_text, check_wait_spec, payload_json
from ..records.waits import Waiting, WaitSpec
from ..records.work import Lease, Work
from ..store import StorageActor
from .supervision import contained, describe

log = logging.getLogger("loom.toolbelt")


class RuntimeToolbelt:
    def __init__(
        self,
        storage: StorageActor,
        lease: Lease,
        *,
        limits: CausalLimits,
        generation: int,
        lease_ms: int,
        policies: Mapping[str, RecurrencePolicy] | None = None,
        gates: Mapping[str, Any] | None = None,
        kind: KindPolicy | None = None,
        budgets: Sequence[Budget] = (),
    ) -> None:
        # (the runtime's registries, built once at its start: shared, not copied per attempt)
        self._policies: Mapping[str, RecurrencePolicy] = policies if policies is not None else {}
        self._storage = storage
        self._lease = lease
        self._authority = Authority.of(lease)
        """What every call presents (checked once: a lease is immutable, and a renewal moves only its
        expiry)."""
        self._limits = limits
        self._generation = generation
        self._lease_ms = lease_ms
        self._gates: Mapping[str, Any] = gates if gates is not None else {}
        self._kind = kind or KindPolicy()
        self._budgets = tuple(budgets)
        self.parked = False
        self.adopted = False
        """The executor adopted the recovered attempt (`adopt`): its outcome commits with no adoption of
        its own."""
        """A call gate parked the attempt: its authority is released, and its outcome is the wait."""
        self.on_park: Callable[[], object] | None = None

    @property
    def lease(self) -> Lease:
        return self._lease

    @property
    def authority(self) -> Authority:
        """The lease's fenced identity, as every call presents it."""
        return self._authority

    async def emit(self, event: EventIn, *, cause_id: str | None = None) -> Event:
        """Emit a derived Event (its parent is the attempt's trigger); `CausalRefused` over the bounds."""
        if self._gates:
            await self.gated("emit", {"event": event, "cause_id": cause_id})
        result = await self._storage.submit(
            emit_in_tx, self._authority, event, self._limits, cause_id=cause_id
        )
        if isinstance(result, CausalRejection):
            raise CausalRefused(result.describe(), rejection=result)
        return result

    async def create_child(self, name: str, *, keys: Sequence[str] = (), kind: str | None = None) -> Work:
        """Create child Work in this Work's scope; ``name`` makes it idempotent."""
        seen: set[str] = set()
        for i, key in enumerate(check_keys("create_child: keys", keys)):
            if key in seen:  # a second attach of one key would break the store's key ownership
                raise InvalidRequest(f"create_child: keys[{i}] repeats the key {key!r}")
            seen.add(key)
        if self._gates:
            await self.gated("create_child", {"name": name, "keys": tuple(keys), "kind": kind})
        result = await self._storage.submit(
            create_child_in_tx,
            self._authority,
            name,
            keys,
            kind,
            self._generation,
            self._limits,
        )
        if isinstance(result, CausalRejection):
            raise CausalRefused(result.describe(), rejection=result)
        return result

    async def arm_timer(self, spec: TimerSpec) -> Timer:
        """Arm a timer in this Work's scope; its firing derives from the attempt's trigger."""
        if self._gates:
            await self.gated("arm_timer", {"spec": spec})
        return await self._storage.submit(arm_derived_in_tx, self._authority, spec, self._policies)

    async def heartbeat(self) -> None:
        """Renew the lease."""
        expires = await self._storage.submit(renew_in_tx, self._authority, self._lease_ms)
        self._lease = attrs.evolve(self._lease, expires_at_ms=expires)

    async def pin(self, metadata: Mapping[str, Any]) -> None:
        """Pin opaque executor metadata with the attempt's segment (a process id and start time, a
        handle): if the lease is lost, recovery hands it back to the executor's ``recover``. It is held
        to the payload rules (a JSON object, at most `MAX_PAYLOAD_BYTES`)."""
        payload_json(metadata, field="metadata")
        await self._storage.submit(pin_metadata_in_tx, self._authority, dict(metadata))

    async def adopt(self) -> None:
        """During recovery: the process is verified; the attempt runs again under this toolbelt's lease
        (a new token: the old one stays stale). Idempotent."""
        await self._storage.submit(adopt_in_tx, self._authority)
        self.adopted = True

    async def gated(self, operation: str, args: Mapping[str, Any] | None = None) -> None:
        """Ask the call gates (in name order) about ``operation`` before running it: return when every
        gate lets it through; raise `CallRefused` when one refuses (or fails: a gate that raises or
        answers something else refuses, with a diagnostic); park the attempt on a gate's wait and raise
        `CallParked`. The toolbelt's own operations are gated by themselves; an executor calls this
        before an operation of its own."""
        check_text("operation", operation)
        if args is not None and not isinstance(args, Mapping):
            raise InvalidRequest(f"args must be a table, got {type(args).__name__}")
        if not self._gates:
            return
        request = self._lease.request
        call = GatedCall(
            operation=operation,
            args=dict(args or {}),
            work_id=request.work_id,
            execution_id=request.execution_id,
            attempt=request.attempt,
            scope=request.scope,
            kind=request.kind,
        )
        for name in sorted(self._gates):
            answer = await self._ask(name, call)
            if answer is None:
                continue
            if isinstance(answer, RefuseCall):
                raise CallRefused(
                    f"call gate {name!r} refused {operation}: {answer.reason}", gate=name, operation=operation
                )
            wait_id = await self._park(name, call, answer.wait)
            raise CallParked(
                f"call gate {name!r} turned {operation} into a wait ({wait_id}): the call did not run; "
                "return, and make it again once the attempt continues",
                gate=name,
                operation=operation,
                wait_id=wait_id,
            )

    async def _ask(self, name: str, call: GatedCall) -> RefuseCall | WaitForCall | None:
        """One gate's answer, checked; a gate that raises or answers something else refuses the call."""
        gate = self._gates[name]
        try:
            answer = gate(call)
            if inspect.isawaitable(answer):
                answer = await answer
            if isinstance(answer, RefuseCall):
                check_reason("reason", answer.reason)
            elif isinstance(answer, WaitForCall):
                check_wait_spec("wait", answer.wait)
            elif answer is not None:
                raise InvalidRequest(
                    f"a call gate answers None, RefuseCall or WaitForCall, got {type(answer).__name__}"
                )
        except Exception as exc:
            raise await self._gate_failed(name, call, f"failed: {describe(exc)}", exc) from None
        return answer  # type: ignore[no-any-return]

    async def _gate_failed(
        self, name: str, call: GatedCall, what: str, exc: BaseException | None
    ) -> CallRefused:
        """Gate ``name`` failed ``call`` (``what``): a ``gate_failed`` diagnostic, and the refusal that
        is the call's result."""
        reason = f"call gate {name!r} {what}; the call did not run"
        await contained(
            self._storage,
            DiagnosticKind.GATE_FAILED,
            plugin=f"call gate {name!r}",
            hook="call",
            item=call.execution_id,
            reason=reason,
            exc=exc,
            logger=log,
            work=call.work_id,
            operation=call.operation,
        )
        return CallRefused(reason, gate=name, operation=call.operation)

    async def _park(self, name: str, call: GatedCall, wait: WaitSpec) -> str | None:
        """Register gate ``name``'s wait under this lease, exactly as a `Waiting` outcome would. A wait
        the state of things refuses (a key the Work does not own, an ``after_seq`` past history) is
        the gate's fault, not the caller's: the call is refused with a ``gate_failed`` diagnostic."""
        try:
            wait_id: str | None = await self._storage.submit(
                park_on_call_in_tx,
                self._authority,
                Waiting(wait=wait),
                self._kind,
                self._limits,
                self._budgets,
            )
        except (Conflict, InvalidRequest) as exc:
            what = f"answered a wait that cannot be registered: {describe(exc)}"
            raise await self._gate_failed(name, call, what, None) from None
        self.parked = True
        if self.on_park is not None:
            self.on_park()
        return wait_id
