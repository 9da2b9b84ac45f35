"""What every part of the `Runtime` handle shares (the handle itself is assembled in `_runtime`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pluggy

from ..actors.ingress import IngressActor
from ..actors.router import RouterPool
from ..actors.timers import TimerActor
from ..config import Config, ConfigHolder
from ..plugins.registry import Extensions
from ..records.clock import Clock
from ..records.errors import InvalidRequest
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

    def config(self) -> Config:
        return self.holder.current


class RuntimeBase:
    """The base of the handle's parts: they all reach the runtime through ``self._p``."""

    def __init__(self, parts: Parts) -> None:
        self._p = parts

    async def _submit(self, proc: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self._p.storage.submit(proc, *args, **kwargs)


def check_limit(limit: object) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit
