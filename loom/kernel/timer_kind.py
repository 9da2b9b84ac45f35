"""`TimerKind`: what a kernel module does when a timer of its own Event type fires or is refused.

Timers whose template is a runtime control Event (an execution deadline, and later wait timeouts
and retry backoffs) carry out their effect inside the firing transaction. Each module that arms
such timers defines its `TimerKind`; `timer_kinds` lists them for `firing`, so firing dispatches
on the timer's type instead of special-casing each.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..config import CausalLimits
from ..records.events import CausalRejection, Event
from ..records.timers import Timer
from ..store import Tx


@attrs.frozen(kw_only=True)
class TimerKind:
    event_type: str
    on_fired: Callable[[Tx, int, Timer, Event, CausalLimits], None]
    """The firing accepted ``event`` (a new Event, never a duplicate): apply its effect."""
    on_refused: Callable[[Tx, int, Timer, CausalRejection, CausalLimits], None]
    """The causal bounds refused the firing (``rejection`` says which limit, and the figures): apply
    what must happen without an Event."""
