"""The core side of the recurrence contract (calendar recurrence as a hook).

A recurrence policy is a plugin's pure function ``(timer, now_ms, spec) -> (Occurrence | Skip,
Replacement | None)``. Core validates every answer before using it: the occurrence keeps the timer's
source and parent and has a well-formed identity and payload; the replacement fires after now, at a
time loom can store, with an identity distinct from the occurrence's. At arm, the policy is asked
once as if the timer fired at its first instant (`dry_run`), so an unknown kind or a spec the policy
refuses is an `InvalidRequest` then, not a timer found invalid at its first firing.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..records.errors import InvalidRequest
from ..records.timers import Occurrence, RecurrencePolicy, Replacement, Skip, Timer
from ..records.validation import MAX_TIME_MS, check_json_value, check_text, describe_value


def check_answer(timer: Timer, now_ms: int, answer: object, replacement: object) -> str | None:
    """Why a policy's answer cannot be used (``None``: it can)."""
    if not isinstance(answer, Occurrence | Skip):
        return f"policy answered {type(answer).__name__}, not an Occurrence or Skip"
    if replacement is not None and not isinstance(replacement, Replacement):
        return f"policy answered a {type(replacement).__name__} replacement, not a Replacement"
    try:
        if isinstance(answer, Occurrence):
            if answer.source is not None and answer.source != timer.source:
                return f"the occurrence changes the source from {timer.source!r} to {answer.source!r}"
            if answer.parent_id is not None and answer.parent_id != timer.parent_id:
                return "the occurrence changes the timer's parent"
            check_text("the occurrence's delivery_id", answer.delivery_id)
            payload: object = answer.payload
            if not isinstance(payload, Mapping):
                return f"the occurrence's payload is a {type(payload).__name__}, not a JSON object"
            check_json_value("the occurrence's payload", payload)
        if isinstance(replacement, Replacement):
            fire_at = replacement.fire_at_ms
            if isinstance(fire_at, bool) or not isinstance(fire_at, int) or not 0 <= fire_at <= MAX_TIME_MS:
                return f"the replacement's fire_at_ms is not a time loom can store: {describe_value(fire_at)}"
            if fire_at <= now_ms:
                return f"the replacement fires at {fire_at}, not after now ({now_ms})"
            check_text("the replacement's delivery_id", replacement.delivery_id)
            if isinstance(answer, Occurrence) and replacement.delivery_id == answer.delivery_id:
                return "the replacement has the same identity as the occurrence"
    except InvalidRequest as exc:
        return str(exc)
    return None


def dry_run(timer: Timer, policies: Mapping[str, RecurrencePolicy]) -> None:
    """Ask the timer's policy what its first firing would be; `InvalidRequest` naming the problem if
    the kind is unknown, the policy refuses the spec, or its answer is unusable."""
    assert timer.recurrence is not None
    policy = policies.get(timer.recurrence)
    if policy is None:
        known = ", ".join(sorted(policies)) or "none"
        raise InvalidRequest(
            f"timer.recurrence: no recurrence policy is registered for {timer.recurrence!r} (known: {known})",
            field="timer.recurrence",
        )
    try:
        answer, replacement = policy(timer, timer.fire_at_ms, timer.spec or {})
    except InvalidRequest as exc:
        raise InvalidRequest(
            f"timer.spec: recurrence policy {timer.recurrence!r} refuses it: {exc}", field="timer.spec"
        ) from None
    except Exception as exc:
        raise InvalidRequest(
            f"timer.spec: recurrence policy {timer.recurrence!r} raised {type(exc).__name__}: {exc}",
            field="timer.spec",
        ) from None
    problem = check_answer(timer, timer.fire_at_ms, answer, replacement)
    if problem is not None:
        raise InvalidRequest(
            f"timer.spec: recurrence policy {timer.recurrence!r}: {problem}", field="timer.spec"
        )
