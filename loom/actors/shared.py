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
    unlaunched: dict[str, int] = attrs.Factory(dict)
    held: dict[str, Callable[[], None]] = attrs.Factory(dict)
    """The attempts this runtime's runners hold the lease of (execution id: a call that has the runner
    renew it now). A completion or a wait committed by another path than the runner's own commit (the
    service's toolbelt: `Runtime.complete`) calls it, so the runner finds at once that the attempt
    ended and stops what still runs of it, not at its next renewal. Shared like ``unlaunched``."""
    """The attempts this runtime claimed and has not handed to their executor yet (execution id: the
    epoch of its lease). A claim marks its attempt handed in its own commit (it is launched at once);
    a clean close unmarks those still here (`recovery.release_leases_in_tx`), so the next open
    relaunches them as never handed. Shared by the runtime's actors (one dict, kept by the runtime)."""
