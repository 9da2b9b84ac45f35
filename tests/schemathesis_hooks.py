"""Schemathesis hooks for ``loom serve``'s OpenAPI document (tests/test_service_server.py).

Two kinds of refusal of a well-formed request depend on more than the request, so no JSON Schema can
say them: an Event sent to an explicit ``work_id`` is refused when that Work is unknown, in another
scope, or when its key belongs to another Work (the store decides), and a recurrence timer's ``spec``
is read by its recurrence policy (a plugin: a cron expression is checked by the cron parser). Requests
generated to be valid leave those fields out; everything else they hold must be accepted, and every
request generated to be invalid must be refused.
"""

from __future__ import annotations

from typing import Any

import schemathesis

_STATEFUL_FIELDS = {
    "/events": ("work_id",),
    "/executions/{execution_id}/emit": ("work_id",),
    "/timers": ("work_id", "recurrence", "spec"),
    "/executions/{execution_id}/timer": ("work_id", "recurrence", "spec"),
}


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    for name in _STATEFUL_FIELDS.get(case.operation.path, ()):
        case.body.pop(name, None)
    return case
