"""The execution's fenced toolbelt: emit, create child Work, heartbeat.

Every call presents the lease; a stale one fails with `StaleAuthority` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..config import CausalLimits
from ..kernel.authority import Authority
from ..kernel.executions import renew_in_tx
from ..kernel.recovery import adopt_in_tx, pin_metadata_in_tx
from ..kernel.toolbelt import arm_derived_in_tx, create_child_in_tx, emit_in_tx
from ..records.errors import CausalRefused, InvalidRequest, StaleAuthority
from ..records.events import CausalRejection, Event, EventIn
from ..records.timers import RecurrencePolicy, Timer, TimerSpec
from ..records.validation import check_keys, payload_json
from ..records.work import ExecutionState, Lease, Work
from ..store import StorageActor, Tx


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
    ) -> None:
        self._policies = dict(policies or {})
        self._storage = storage
        self._lease = lease
        self._limits = limits
        self._generation = generation
        self._lease_ms = lease_ms

    @property
    def lease(self) -> Lease:
        return self._lease

    async def emit(self, event: EventIn, *, cause_id: str | None = None) -> Event:
        """Emit a derived Event (its parent is the attempt's trigger); `CausalRefused` over the bounds."""
        result = await self._storage.submit(
            emit_in_tx, Authority.of(self._lease), event, self._limits, cause_id=cause_id
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
        result = await self._storage.submit(
            create_child_in_tx,
            Authority.of(self._lease),
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
        return await self._storage.submit(arm_derived_in_tx, Authority.of(self._lease), spec, self._policies)

    async def heartbeat(self) -> None:
        """Renew the lease."""
        expires = await self._storage.submit(renew_in_tx, Authority.of(self._lease), self._lease_ms)
        self._lease = attrs.evolve(self._lease, expires_at_ms=expires)

    async def pin(self, metadata: Mapping[str, Any]) -> None:
        """Pin opaque executor metadata with the attempt's segment (a process id and start time, a
        handle): if the lease is lost, recovery hands it back to the executor's ``recover``. It is held
        to the payload rules (a JSON object, at most `MAX_PAYLOAD_BYTES`)."""
        payload_json(metadata, field="metadata")
        await self._storage.submit(pin_metadata_in_tx, Authority.of(self._lease), dict(metadata))

    async def adopt(self) -> None:
        """During recovery: the process is verified; the attempt runs again under this toolbelt's lease
        (a new token: the old one stays stale). Idempotent."""
        try:
            await self._storage.submit(adopt_in_tx, Authority.of(self._lease))
        except StaleAuthority:
            execution_state = await self._storage.submit(
                _state_of, self._lease.execution_id, self._lease.epoch
            )
            if not execution_state:
                raise


def _state_of(tx: Tx, now_ms: int, execution_id: str, epoch: int) -> bool:
    """Whether the attempt already runs at ``epoch`` (an adoption already committed)."""
    execution = tx.execution(execution_id)
    return execution is not None and execution.epoch == epoch and execution.state is ExecutionState.RUNNING
