"""The ingress actor: validation, dedup and the durable acceptance acknowledgement.

Each offered Event is validated before it reaches storage (a bad one gets an error
naming the field and nothing is stored), then accepted by ``accept_in_tx``. Requests
are handled concurrently, so many producers share one group commit.
"""

from __future__ import annotations

import attrs
import trio

from .._config import CausalLimits
from .._errors import CausalRefused
from .._records import CausalRejection, Event, EventIn, validate_event_in
from ..kernel.accept import accept_derived_in_tx, accept_in_tx
from ..store import StorageActor


@attrs.define(eq=False)
class _Offer:
    event: EventIn
    trusted: bool
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Event | None = None
    error: BaseException | None = None


class IngressActor:
    def __init__(
        self,
        storage: StorageActor,
        limits: CausalLimits,
        *,
        mailbox_size: int = 4096,
        max_in_flight: int = 4096,
    ) -> None:
        self._storage = storage
        self.limits = limits
        self._send, self._receive = trio.open_memory_channel[_Offer](mailbox_size)
        self._in_flight = trio.CapacityLimiter(max_in_flight)

    async def run(self, *, task_status: trio.TaskStatus[IngressActor] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery, self._receive:
            task_status.started(self)
            async for offer in self._receive:
                await self._in_flight.acquire_on_behalf_of(offer)
                nursery.start_soon(self._accept, offer)

    async def _accept(self, offer: _Offer) -> None:
        try:
            offer.result = await self._storage.submit(
                accept_in_tx, offer.event, self.limits, trusted=offer.trusted
            )
        except Exception as exc:
            offer.error = exc
        finally:
            self._in_flight.release_on_behalf_of(offer)
            offer.done.set()

    async def publish(self, event: EventIn, *, trusted: bool = False) -> Event:
        """Accept a root Event; return it once committed (or the original, marked duplicate)."""
        validate_event_in(event, allow_core=trusted)
        offer = _Offer(event, trusted)
        await self._send.send(offer)
        await offer.done.wait()
        if offer.error is not None:
            raise offer.error
        assert offer.result is not None
        return offer.result

    async def publish_derived(
        self,
        event: EventIn,
        *,
        parent_id: str,
        cause_id: str | None = None,
        execution_id: str | None = None,
    ) -> Event:
        """Accept an Event derived from ``parent_id`` (trusted authority) under the causal bounds.

        Raises `CausalRefused` after the refusal's diagnostic has committed.
        """
        validate_event_in(event, allow_core=True)
        result = await self._storage.submit(
            accept_derived_in_tx, event, parent_id, self.limits, cause_id=cause_id, execution_id=execution_id
        )
        if isinstance(result, CausalRejection):
            raise CausalRefused(result.describe(), rejection=result)
        return result
