"""``GET /watch``: Work changes as server-sent events (docs/http-api.md "Watching"), for ``loom watch``
and the web view.

Each commit that changes Work is followed, once the commit is known, by one ``work`` event per
changed Work holding the Work as it is then (``{"work": {...}, "at_ms": ...}``), in commit order; a
comment line every `KEEPALIVE_S` keeps proxies from closing a quiet stream. A watcher that falls
behind gets a ``lagged`` event (list again to catch up), and a commit by another node sharing the
database a ``changed`` event (at most one a second; the changes committed through this node arrive
as ``work`` events).
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import trio
from starlette.responses import Response, StreamingResponse

from ..records.errors import NotFound
from ..records.notices import Committed, Lagged, StoreChanged, WorkChanged
from ..records.validation import check_text, validate_scope
from ..runtime import Runtime
from ._ops import Call, Service, Watches
from ._wire import query_int, query_text, to_data

KEEPALIVE_S = 15.0
WATCH_CAPACITY = 4096
"""Commit batches a watcher may fall behind before it is told ``lagged``."""


def sse(kind: str, data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


SCOPES_KEPT = 4096
"""Works' scopes a scope-filtered watch keeps (a Work's scope never changes), so that it reads only the
Works it sends, not every Work that changes."""


def _in_scope(work_scope: str, scope: str | None) -> bool:
    return scope is None or work_scope == scope or work_scope.startswith(scope + "/")


async def changes(
    rt: Runtime, *, scope: str | None, work_id: str | None, limit: float, watches: Watches
) -> AsyncIterator[bytes]:
    """The stream's bytes: an opening comment once the watch is in place (a client that waits for it
    misses no later change), then events until ``limit`` Work changes were sent or ``watches`` end."""
    sent = 0
    heard_other = -math.inf
    async with rt.watch(capacity=WATCH_CAPACITY) as notices:
        yield b": watching loom Work changes\n\n"
        changed: dict[str, None] = {}
        scopes: dict[str, str] = {}
        iterator = notices.__aiter__()
        while sent < limit and not watches.ended():
            notice = None
            with trio.move_on_after(KEEPALIVE_S) as wait, watches.ending(wait):
                try:
                    notice = await iterator.__anext__()
                except StopAsyncIteration:
                    return
            if watches.ended():
                return
            if notice is None:
                yield b": keep-alive\n\n"
            elif isinstance(notice, WorkChanged):
                changed[notice.work_id] = None
            elif isinstance(notice, Committed) and changed:
                for work_id_changed in list(changed):
                    if (work_id is not None and work_id_changed != work_id) or not _in_scope(
                        scopes.get(work_id_changed, scope or ""), scope
                    ):
                        continue  # (not one this watch sends: no read)
                    try:
                        work = await rt.work(work_id_changed)
                    except NotFound:
                        continue
                    if len(scopes) >= SCOPES_KEPT:
                        scopes.clear()
                    scopes[work_id_changed] = work.scope
                    if _in_scope(work.scope, scope):
                        yield sse("work", {"work": to_data(work), "at_ms": notice.at_ms})
                        sent += 1
                        if sent >= limit:
                            return
                changed.clear()
            elif isinstance(notice, Lagged):
                changed.clear()
                yield sse("lagged", {"message": "this watch fell behind: list the Work again to catch up"})
            elif isinstance(notice, StoreChanged) and notice.origin:
                now = trio.current_time()
                if now - heard_other >= 1.0:
                    heard_other = now
                    yield sse("changed", {"message": "another node committed changes", "node": notice.origin})


async def watch(s: Service, call: Call) -> Response:
    scope = query_text(call.query, "scope")
    if scope is not None:
        validate_scope(scope, field="scope")
    work_id = query_text(call.query, "work")
    if work_id is not None:
        check_text("work", work_id)  # (an id, refused as every other route refuses a malformed one)
    limit = query_int(call.query, "limit", 0, 1, 1_000_000) or math.inf
    return StreamingResponse(
        changes(s.rt, scope=scope, work_id=work_id, limit=limit, watches=s.watches),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
