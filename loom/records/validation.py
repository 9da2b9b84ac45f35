"""Validation of untrusted input: plain functions that raise `InvalidRequest` naming the bad field.

Nothing is stored when one of them refuses; kernel procedures call them again (they trust no caller).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from .core_events import CORE_PREFIX
from .errors import InvalidRequest
from .events import EventIn

MAX_ID_LEN = 200
MAX_PAYLOAD_BYTES = 1_048_576

_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*\Z")
_SCOPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*\Z")


def _check_text(field: str, value: object, *, max_len: int = MAX_ID_LEN) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"event.{field} must be a string, got {type(value).__name__}")
    if not value or value.strip() != value:
        raise InvalidRequest(f"event.{field} must be non-empty without surrounding whitespace: {value!r}")
    if len(value) > max_len:
        raise InvalidRequest(f"event.{field} is longer than {max_len} characters")
    if any(ord(c) < 32 for c in value):
        raise InvalidRequest(f"event.{field} contains control characters: {value!r}")
    return value


def validate_scope(scope: object, *, field: str = "event.scope") -> str:
    if not isinstance(scope, str) or not _SCOPE_RE.match(scope) or len(scope) > MAX_ID_LEN:
        raise InvalidRequest(f"{field} must be a path like 'org/team/repo', got {scope!r}")
    return scope


def payload_json(payload: object, *, field: str = "event.payload") -> str:
    """Serialise a payload, refusing anything that is not a JSON object of bounded size."""
    if not isinstance(payload, Mapping):
        raise InvalidRequest(f"{field} must be a JSON object, got {type(payload).__name__}")
    try:
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{field} is not JSON-serialisable: {exc}") from None
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidRequest(f"{field} is larger than {MAX_PAYLOAD_BYTES} bytes")
    return text


def validate_event_in(event: object, *, allow_core: bool = False) -> EventIn:
    """Check an offered Event; raise `InvalidRequest` naming the first bad field.

    ``allow_core`` is for trusted control paths: external ingress may not publish the
    privileged ``core.*`` family.
    """
    validated_payload(event, allow_core=allow_core)
    assert isinstance(event, EventIn)
    return event


def validated_payload(event: object, *, allow_core: bool = False) -> str:
    """`validate_event_in`, returning the payload's canonical JSON text (serialised once)."""
    if not isinstance(event, EventIn):
        raise InvalidRequest(f"expected an EventIn, got {type(event).__name__}")
    _check_text("source", event.source)
    _check_text("delivery_id", event.delivery_id)
    if not isinstance(event.type, str) or not _TYPE_RE.match(event.type) or len(event.type) > MAX_ID_LEN:
        raise InvalidRequest(f"event.type must be a dotted name like 'pr.opened', got {event.type!r}")
    if event.type.startswith(CORE_PREFIX) and not allow_core:
        raise InvalidRequest(f"event.type {event.type!r} is in the privileged core.* family")
    validate_scope(event.scope)
    if event.key is not None:
        _check_text("key", event.key, max_len=500)
    if event.work_id is not None:
        _check_text("work_id", event.work_id)
    return payload_json(event.payload)
