"""The timer kinds of the runtime's own control timers, by Event type (see `timer_kind`)."""

from __future__ import annotations

from collections.abc import Mapping

from . import deadlines, retry, waits
from .timer_kind import TimerKind

TIMER_KINDS: Mapping[str, TimerKind] = {
    kind.event_type: kind for kind in (deadlines.TIMER_KIND, waits.TIMER_KIND, retry.TIMER_KIND)
}
