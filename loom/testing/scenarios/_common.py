"""Helpers the shared scenarios share: the common configuration, Event builders and a start barrier."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from ... import (
    CausalRefused,
    Config,
    Event,
    EventIn,
    NotFound,
    Work,
)
from .._driver import Driver

MINUTE_MS = 60_000
SCOPE = "acme"
WEB = "acme/web"


def _event(
    delivery_id: str,
    *,
    type: str = "test.event",
    source: str = "scenario",
    key: str | None = None,
    payload: dict[str, object] | None = None,
) -> EventIn:
    return EventIn(
        source=source, delivery_id=delivery_id, type=type, scope=SCOPE, key=key, payload=dict(payload or {})
    )


async def _refused(driver: Driver, event: EventIn, parent_id: str) -> CausalRefused | None:
    try:
        await driver.derive(event, parent_id=parent_id)
    except CausalRefused as refusal:
        return refusal
    return None


def _next_minute(now_ms: int) -> int:
    return (now_ms // MINUTE_MS + 1) * MINUTE_MS


def _config(
    routes: Sequence[dict[str, Any]],
    *,
    web_routes: Sequence[dict[str, Any]] = (),
    capabilities: Sequence[str] = (),
    work_kinds: dict[str, Any] | None = None,
    web_bindings: dict[str, Any] | None = None,
    binding_config: dict[str, Any] | None = None,
) -> Config:
    """The common configuration: scope ``acme`` with child ``acme/web`` and binding ``fake``."""
    acme: dict[str, Any] = {
        "bindings": {
            "fake": {
                "executor": "fake",
                "capabilities": list(capabilities),
                "config": dict(binding_config or {}),
            }
        },
        "routes": list(routes),
    }
    web: dict[str, Any] = {"routes": list(web_routes)}
    if web_bindings:
        web["bindings"] = web_bindings
    return Config.from_dict({"scopes": {"acme": acme, WEB: web}, "work_kinds": work_kinds or {}})


def _ev(
    delivery_id: str,
    type: str,
    *,
    key: str | None = None,
    scope: str = SCOPE,
    work_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> EventIn:
    return EventIn(
        source="scenario",
        delivery_id=delivery_id,
        type=type,
        scope=scope,
        key=key,
        work_id=work_id,
        payload=dict(payload or {}),
    )


async def _barrier(n: int, task: Callable[[int], Awaitable[None]]) -> None:
    """Run ``n`` tasks that all start their work at the same moment."""
    ready = 0
    go = trio.Event()
    all_ready = trio.Event()

    async def run(i: int) -> None:
        nonlocal ready
        ready += 1
        if ready == n:
            all_ready.set()
        await go.wait()
        await task(i)

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(run, i)
        await all_ready.wait()
        go.set()


async def _checkpoint(driver: Driver, event: Event) -> Any:
    return await driver.runtime.checkpoint(event.id)


async def _commit_order(driver: Driver, work_id: str, *events: Event) -> list[str]:
    """The delivery ids of ``events`` in the order their checkpoints on ``work_id`` were committed.

    `Runtime.history` lists a Work's checkpoints in commit order, so this is the order the runtime
    applied them, not a view sorted by sequence; compare it with `_acceptance_order`.
    """
    by_id = {e.id: e.delivery_id for e in events}
    history = await driver.runtime.history(work_id)
    return [by_id[c.event_id] for c in history.checkpoints if c.event_id in by_id]


def _acceptance_order(*events: Event) -> list[str]:
    """The delivery ids of ``events`` in acceptance (sequence) order."""
    return [e.delivery_id for e in sorted(events, key=lambda e: e.seq)]


async def _work_of(driver: Driver, key: str) -> Work | None:
    try:
        return await driver.runtime.work_for_key(key)
    except NotFound:
        return None
