"""What every part of the `Runtime` handle shares (the handle itself is assembled in `_runtime`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import pluggy

from ..actors.compactor import Compactor
from ..actors.ingress import IngressActor
from ..actors.reconciler import SubscriptionReconciler
from ..actors.recoverer import LeaseRecoverer
from ..actors.router import RouterPool
from ..actors.shared import Draining
from ..actors.timers import TimerActor
from ..config import Config, ConfigHolder
from ..plugins.registry import Extensions
from ..records.clock import Clock
from ..records.errors import InvalidRequest, NotFound
from ..records.validation import MAX_KEY_LEN, check_int, check_text, describe_value
from ..records.work import Work
from ..store import Reader, StorageActor

DEFAULT_LEASE_MS = 60_000
MAX_LIMIT = 100_000


@attrs.define(kw_only=True)
class Parts:
    """The runtime's private parts: the store, its readers, the plugins, and the actors running now."""

    storage: StorageActor
    reader: Reader
    actor_reader: Reader
    """Reads served by the storage actor (batched with writes), for the router's small frequent reads."""
    clock: Clock
    holder: ConfigHolder
    plugins: pluggy.PluginManager
    extensions: Extensions
    ingress: IngressActor
    owner: str
    lease_ms: int
    router: RouterPool | None = None
    timers: TimerActor | None = None
    recovery: LeaseRecoverer | None = None
    subscriptions: SubscriptionReconciler | None = None
    waiters: Any = None
    """The `_results.Waiters` of the tasks waiting for an outcome (made at the first wait)."""
    compaction: Compactor | None = None
    unlaunched: dict[str, int] = attrs.Factory(dict)
    """The attempts claimed here and not yet handed to their executor (`Shared.unlaunched`): a clean
    close unmarks them."""
    held: dict[str, Callable[[], None]] = attrs.Factory(dict)
    """The attempts the runtime's runners hold the lease of (`Shared.held`)."""
    draining: Draining = attrs.Factory(Draining)
    """The runtime's drain (`Shared.draining`, `Runtime.drain`)."""
    readmit: bool = False
    """The configuration changed with no router running: the next host admission pass first lets the
    Work passed over for capacity or a missing binding be looked at again."""

    def config(self) -> Config:
        return self.holder.current


class RuntimeBase:
    """The base of the handle's parts: they all reach the runtime through ``self._p``."""

    def __init__(self, parts: Parts) -> None:
        self._p = parts

    async def _known_work(self, work_id: str) -> Work:
        """The Work ``work_id`` names (checked as a lookup), or `NotFound`."""
        lookup("work_id", work_id)
        found = await self._p.reader.work(work_id)
        if found is None:
            raise NotFound(f"no work with id {work_id!r}")
        return found

    async def _submit(self, proc: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._p.storage.submit(proc, *args, **kwargs)


def check_limit(limit: object) -> int:
    return check_int("limit", limit, 1, MAX_LIMIT)


def lookup(field: str, value: object) -> str:
    """An id or key to look up: any valid Unicode text up to `MAX_KEY_LEN` (unknown ones are `NotFound`)."""
    return check_text(field, value, max_len=MAX_KEY_LEN, strip=False)


def after(field: str, value: object) -> str:
    """A paging cursor: ``""`` (from the start) or an id."""
    return "" if value == "" else lookup(field, value)


E = TypeVar("E", bound=enum.Enum)


def member(field: str, cls: type[E], value: object) -> E | None:
    """``None``, or a member of ``cls`` given as itself or its value."""
    if value is None:
        return None
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in cls)
        raise InvalidRequest(
            f"{field} must be one of {choices}, got {describe_value(value)}", field=field
        ) from None
