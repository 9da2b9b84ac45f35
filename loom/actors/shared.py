"""What the router's parts share: the store, the configuration in force, the plugins and the clock."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from ..config import Config
from ..plugins.registry import Extensions, offered
from ..records.clock import Clock
from ..store import Reader, StorageActor
from .activity import Activity


@attrs.define(eq=False)
class Draining:
    """A runtime's drain before a clean stop (`Runtime.drain`): once ``on``, its actors claim nothing
    more (their admission requests start nothing) and an attempt claimed just before is not launched
    (a clean close unmarks it, so the next open launches it as never handed). ``running`` is kept all
    along: the attempts this runtime's runners run now, by execution id, with their executor."""

    on: bool = False
    running: dict[str, object] = attrs.Factory(dict)
    _changed: trio.Event | None = None

    def enter(self, execution_id: str, executor: object) -> None:
        self.running[execution_id] = executor

    def leave(self, execution_id: str) -> None:
        if self.running.pop(execution_id, None) is not None and self._changed is not None:
            self._changed.set()

    def unadoptable(self) -> int:
        """How many running attempts' executors cannot adopt them after a restart (a function dies with
        its process): the attempts a drain waits for. An adoptable one (a shell command) goes on after
        the stop and is adopted by the next open."""
        return sum(1 for executor in self.running.values() if "adopt" not in offered(executor))

    async def settled(self) -> None:
        """Return once no unadoptable attempt runs here."""
        while self.unadoptable():
            self._changed = trio.Event()
            await self._changed.wait()


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
    """The attempts this runtime claimed and has not handed to their executor yet (execution id: the
    epoch of its lease). A claim marks its attempt handed in its own commit (it is launched at once);
    a clean close unmarks those still here (`recovery.release_leases_in_tx`), so the next open
    relaunches them as never handed. Shared by the runtime's actors (one dict, kept by the runtime)."""
    held: dict[str, Callable[[], None]] = attrs.Factory(dict)
    """The attempts this runtime's runners hold the lease of (execution id: a call that has the runner
    renew it now). A completion or a wait committed by another path than the runner's own commit (the
    service's toolbelt: `Runtime.complete`) calls it, so the runner finds at once that the attempt
    ended and stops what still runs of it, not at its next renewal. Shared like ``unlaunched``."""
    draining: Draining = attrs.Factory(Draining)
    """The runtime's drain (one, kept by the runtime, shared like ``unlaunched``)."""
