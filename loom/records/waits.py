"""Records for event waits.

A Wait is a durable subscription of one attempt on its Work's keys: a type allowlist (empty: any
type), an exclusive watermark (``after_seq``) and an optional timeout. Exactly one accepted Event wakes
it: the lowest acceptance sequence among its matches and its own accepted timeout.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import attrs

from .frozen import frozen_object
from .reprs import with_instants
from .states import Lifecycle
from .subscriptions import SubscriptionSpec


class WaitState(enum.StrEnum):
    ACTIVE = "active"
    WOKEN = "woken"
    BLOCKED = "blocked"
    """The causal limits refused its wake (or its timeout): the Work is held until an operator releases it."""
    CANCELLED = "cancelled"


WAIT_LIFECYCLE = Lifecycle[WaitState](
    "wait",
    {
        WaitState.ACTIVE: frozenset({WaitState.WOKEN, WaitState.BLOCKED, WaitState.CANCELLED}),
        WaitState.BLOCKED: frozenset({WaitState.ACTIVE, WaitState.CANCELLED}),
        WaitState.WOKEN: frozenset(),
        WaitState.CANCELLED: frozenset(),
    },
)


@attrs.frozen(kw_only=True)
class WaitSpec:
    """What an attempt waits for.

    ``keys``: the Work's own keys to watch (empty: all of them). ``types``: Event type patterns, OR'd
    (empty: any type). ``after_seq``: the exclusive watermark (``None``: the attempt's acknowledged
    watermark, the highest sequence it was handed). ``timeout_ms``: wake on a timeout Event this long
    after registration (``None``: no timeout). ``subscriptions``: dependencies on keys other Works own,
    persisted as pending with the wait and installed by the next reconcile pass; their aliases land on
    the wait's first key, so a matching one wakes it.
    """

    keys: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    after_seq: int | None = None
    timeout_ms: int | None = None
    subscriptions: tuple[SubscriptionSpec, ...] = ()


@attrs.frozen(kw_only=True)
class Waiting:
    """An attempt's outcome that parks it on a wait (with a resume-capable binding) or ends it, to be
    continued by attempt N+1 with the winner. ``consumed_inputs`` proves what it took in before it
    parked (applied before the registration scan); ``artifacts`` are references kept with its history."""

    wait: WaitSpec = attrs.field(factory=WaitSpec)
    consumed_inputs: tuple[str, ...] = ()
    usage: Mapping[str, float] = attrs.field(factory=dict, hash=False)
    artifacts: tuple[str, ...] = ()


@with_instants
@attrs.frozen(kw_only=True)
class Wait:
    """A registered wait and, once woken, its history."""

    id: str
    work_id: str
    execution_id: str
    attempt: int
    epoch: int
    state: WaitState
    keys: tuple[str, ...]
    types: tuple[str, ...]
    after_seq: int
    resume: bool
    """The attempt parks and resumes (a resume-capable binding); otherwise attempt N+1 continues."""
    timeout_at_ms: int | None
    timeout_timer_id: str | None
    """Kept on history after the timer fired and was deleted: the timeout stays recognisable."""
    timeout_delivery_id: str | None
    winner_event_id: str | None
    bridge_event_id: str | None
    """The ``core.wait.woken`` Event that carries the continuation's causal authority."""
    reason: str | None
    created_at_ms: int
    woken_at_ms: int | None
    detail: Mapping[str, Any] = attrs.field(factory=dict, hash=False, converter=frozen_object)
