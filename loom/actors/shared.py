"""What the router's parts share: the store, the configuration in force, the plugins and the clock."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..config import Config
from ..plugins.registry import Extensions
from ..records.clock import Clock
from ..store import Reader, StorageActor
from .activity import Activity


@attrs.frozen(kw_only=True)
class Shared:
    storage: StorageActor
    reader: Reader
    config: Callable[[], Config]
    """The generation in force now (read at each decision, so a reload applies to the next one)."""
    extensions: Extensions
    clock: Clock
    activity: Activity
    owner: str
    """This runtime's name on the leases it holds."""
    lease_ms: int
