"""Work kinds as the kernel sees them: pure policy derived from configuration (the retry budget)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence

import attrs

from ..config import Config
from ..config.model import retry_delays
from ..records.events import Event

TriggerSelector = Callable[[Sequence[Event]], int]


@attrs.frozen(kw_only=True)
class KindPolicy:
    """What the kernel needs of a Work kind (pure policy).

    ``retry_backoff_ms``: the delay after each failure but the last (a budget of ``len + 1`` failure
    attempts); ``fail_on_exhaustion``: a spent budget fails the Work instead of holding it.
    """

    standing: bool = False
    run_once: bool = False
    select_trigger: TriggerSelector | None = None
    timeout_ms: int | None = None
    retry_backoff_ms: tuple[int, ...] = retry_delays(3)
    fail_on_exhaustion: bool = False

    @property
    def retry_attempts(self) -> int:
        return len(self.retry_backoff_ms) + 1


TRIGGER_SELECTORS: Mapping[str, TriggerSelector] = {
    "first": lambda inputs: 0,
    "newest": lambda inputs: len(inputs) - 1,
}
"""Built-in trigger selection by Work kind (``first`` is the default)."""


def kind_policy(config: Config, kind: str | None) -> KindPolicy:
    """The kernel's view of a configured Work kind (an unknown or absent kind: the defaults)."""
    policy = config.work_kinds.get(kind or "")
    if policy is None:
        return KindPolicy()
    return KindPolicy(
        standing=policy.standing,
        run_once=policy.run_once,
        select_trigger=TRIGGER_SELECTORS.get(policy.trigger),
        timeout_ms=policy.timeout_ms,
        retry_backoff_ms=policy.retry_backoff_ms,
        fail_on_exhaustion=policy.fail_on_exhaustion,
    )


def pin_retry(kind: KindPolicy) -> dict[str, object]:
    """The retry part of a kind policy as it is pinned on an attempt at its claim."""
    return {
        "standing": kind.standing,
        "backoff_ms": list(kind.retry_backoff_ms),
        "fail_on_exhaustion": kind.fail_on_exhaustion,
    }


def pinned_retry_text(kind: KindPolicy) -> str:
    """`pin_retry` as the JSON text an attempt's row holds (made once per policy, not at every claim)."""
    return _retry_text(kind.standing, tuple(kind.retry_backoff_ms), kind.fail_on_exhaustion)


@functools.lru_cache(maxsize=256)
def _retry_text(standing: bool, backoff_ms: tuple[int, ...], fail_on_exhaustion: bool) -> str:
    pinned = {"standing": standing, "backoff_ms": list(backoff_ms), "fail_on_exhaustion": fail_on_exhaustion}
    return json.dumps(pinned)


def pinned_retry(pinned: Mapping[str, object] | None) -> KindPolicy:
    """The retry policy an attempt was claimed under (the defaults for an attempt pinned none)."""
    if not pinned:
        return KindPolicy()
    backoff = pinned.get("backoff_ms")
    return KindPolicy(
        standing=bool(pinned.get("standing")),
        retry_backoff_ms=tuple(int(d) for d in backoff) if isinstance(backoff, list) else retry_delays(3),
        fail_on_exhaustion=bool(pinned.get("fail_on_exhaustion")),
    )
