"""Validation of untrusted input: plain functions that raise `InvalidRequest` naming the bad field.

Nothing is stored when one of them refuses; kernel procedures call them again (they trust no caller),
except the checks whose result they are handed (an Event's `CheckedPayload`, made where it was offered).
The limits, as documented for users:

* text (ids, keys, sources, reasons) is valid Unicode (no lone surrogates), without control
  characters; ids and sources are at most 200 characters, keys 500, reasons 2,000;
* a payload is a JSON object with string keys, at most 1 MiB as canonical JSON and 64 levels deep;
  integers in it fit in 64 bits and floats are finite; a timer's payload leaves room for the fields
  firing adds (`FIRING_RESERVE_BYTES`);
* times are integer Unix milliseconds from 0 to `MAX_TIME_MS` (year 9999); durations and sequence
  numbers are integers in their documented ranges (never ``bool``, never a float or a string).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from .core_events import CORE_PREFIX
from .errors import InvalidRequest
from .events import EventIn
from .frozen import NOT_PLAIN, FrozenDict, freeze_plain, frozen_object, is_valid_unicode
from .subscriptions import SubscriptionSpec
from .waits import Waiting, WaitSpec
from .work import Completed, Failed, Handoff, Lease, Outcome, RunRequest

MAX_ID_LEN = 200
MAX_KEY_LEN = 500
MAX_REASON_LEN = 2_000
MAX_PAYLOAD_BYTES = 1_048_576
MAX_PAYLOAD_DEPTH = 64
MAX_VALUE_BYTES = MAX_PAYLOAD_BYTES
"""The largest result an attempt may complete with (`Completed.value`), as canonical JSON: a payload's limit."""
FIRING_RESERVE_BYTES = 4_096
"""Room a timer's payload leaves for the fields its firing adds (timer id, occurrence, skipped counts)."""
MAX_TIME_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the last instant a time may name."""
MAX_SEQ = 2**63 - 1
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)

_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*\Z")
_SCOPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*\Z")
_UNFIT_RE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
"""A control character (below 32, or DEL) or a lone surrogate (which no UTF-8 text holds)."""


_MAX_INT_DIGITS = 60
"""An integer with more digits than this is described by its size: Python refuses to write one of
more than 4,300 digits as text at all (`sys.get_int_max_str_digits`), and a message has no use for it."""


def describe_value(value: object) -> str:
    """A caller's value as a message shows it: its ``repr``, at most 80 characters. It never raises:
    an integer too long to write is described by its number of digits, and a value whose ``repr``
    fails (one holding such an integer, or a ``__repr__`` that raises) by its type."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * _MAX_INT_DIGITS:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'a negative' if value < 0 else 'an'} integer of about {digits:,} digits"
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__} that cannot be shown"
    return text if len(text) <= 80 else text[:77] + "..."


_describe = describe_value


def check_text(
    field: str, value: object, *, max_len: int = MAX_ID_LEN, strip: bool = True, optional: bool = False
) -> str:
    """A non-empty string of valid Unicode, at most ``max_len`` characters, without control characters
    (and, with ``strip``, without surrounding whitespace)."""
    if value is None and optional:
        return value  # type: ignore[return-value]
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a string, got {type(value).__name__}", field=field)
    if not value or (strip and value.strip() != value):
        raise InvalidRequest(
            f"{field} must be non-empty without surrounding whitespace: {_describe(value)}", field=field
        )
    if len(value) > max_len:
        raise InvalidRequest(f"{field} is longer than {max_len} characters", field=field)
    if _UNFIT_RE.search(value) is not None:  # (one pass for both: a lone surrogate is named first)
        if not is_valid_unicode(value):
            raise InvalidRequest(
                f"{field} is not valid Unicode text (it holds a lone surrogate)", field=field
            )
        raise InvalidRequest(f"{field} contains control characters: {_describe(value)}", field=field)
    return value


def check_reason(field: str, value: object) -> str:
    """A human-readable reason: valid Unicode, not blank, at most `MAX_REASON_LEN` characters."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a string, got {type(value).__name__}", field=field)
    if not value.strip():
        raise InvalidRequest(f"{field} must be a non-empty string", field=field)
    if len(value) > MAX_REASON_LEN:
        raise InvalidRequest(f"{field} is longer than {MAX_REASON_LEN} characters", field=field)
    if not is_valid_unicode(value):
        raise InvalidRequest(f"{field} is not valid Unicode text (it holds a lone surrogate)", field=field)
    if "\x00" in value:
        raise InvalidRequest(
            f"{field} holds a NUL character (U+0000), which no store keeps in text", field=field
        )
    return value


_UNSTORABLE_RE = re.compile("[\x00\ud800-\udfff]")
"""A NUL (PostgreSQL's text holds none) or a lone surrogate (no UTF-8 text holds one)."""


def storable_text(text: str, limit: int = MAX_REASON_LEN) -> str:
    """Text loom makes from what it did not make (an exception's message, a process's output) as a
    reason is kept on every store: each NUL and lone surrogate written as its ``\\uXXXX`` escape, a blank
    one named, and one longer than ``limit`` characters cut, its end marked ``...``."""
    if _UNSTORABLE_RE.search(text) is not None:
        text = _UNSTORABLE_RE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    if not text.strip():
        text = "(no text)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


DESCRIBED_LEN = 1_000
"""The most of an exception's ``Type: message`` a reason quotes (a reason holds at most 2,000 characters,
and most quote one after words of their own)."""


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of an exception, for a diagnostic or an attempt's error, as every store keeps
    a reason (`storable_text`: an exception's message may hold anything, of any length)."""
    text = str(exc)
    return storable_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, DESCRIBED_LEN)


def check_int(field: str, value: object, low: int, high: int) -> int:
    """An integer (not a bool, float or string) from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(
            f"{field} must be an integer, got {type(value).__name__} {_describe(value)}", field=field
        )
    if not low <= value <= high:
        raise InvalidRequest(
            f"{field} must be from {low} to {high}, got {describe_value(value)}", field=field
        )
    return value


def check_time(field: str, value: object) -> int:
    """Integer Unix milliseconds from 0 to `MAX_TIME_MS`."""
    return check_int(field, value, 0, MAX_TIME_MS)


def check_keys(field: str, keys: object) -> tuple[str, ...]:
    """A sequence of correlation keys (each `check_text` with `MAX_KEY_LEN`), as a tuple."""
    if isinstance(keys, str) or not isinstance(keys, list | tuple):
        raise InvalidRequest(f"{field} must be a list of keys, got {type(keys).__name__}", field=field)
    return tuple(check_text(f"{field}[{i}]", key, max_len=MAX_KEY_LEN) for i, key in enumerate(keys))


def validate_scope(scope: object, *, field: str = "event.scope") -> str:
    if not isinstance(scope, str) or not _SCOPE_RE.match(scope) or len(scope) > MAX_ID_LEN:
        raise InvalidRequest(
            f"{field} must be a path like 'org/team/repo', got {_describe(scope)}", field=field
        )
    return scope


def check_json_value(field: str, value: Any, depth: int = 1) -> None:
    """JSON data: objects (a ``dict``: ``json.dumps`` writes no other mapping) with string keys, arrays
    (``list`` or ``tuple``), valid Unicode strings, 64-bit integers, finite floats, booleans and null,
    at most `MAX_PAYLOAD_DEPTH` levels deep (checked before going deeper, so no input can exhaust the
    stack)."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if not is_valid_unicode(value):
            raise InvalidRequest(
                f"{field} holds a string that is not valid Unicode (a lone surrogate)", field=field
            )
        return
    if isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            raise InvalidRequest(f"{field} holds an integer outside 64 bits: {_describe(value)}", field=field)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest(f"{field} holds a number JSON cannot carry: {value!r}", field=field)
        return
    if isinstance(value, dict | list | tuple):
        if depth > MAX_PAYLOAD_DEPTH:
            raise InvalidRequest(f"{field} is nested more than {MAX_PAYLOAD_DEPTH} levels deep", field=field)
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InvalidRequest(
                        f"{field} has a {type(key).__name__} key {_describe(key)}: JSON object keys are strings",
                        field=field,
                    )
                if not is_valid_unicode(key):
                    raise InvalidRequest(
                        f"{field} has a key that is not valid Unicode (a lone surrogate)", field=field
                    )
                check_json_value(f"{field}.{key}" if len(field) < 200 else field, item, depth + 1)
        else:
            for i, item in enumerate(value):
                check_json_value(f"{field}[{i}]" if len(field) < 200 else field, item, depth + 1)
        return
    raise InvalidRequest(f"{field} holds {_a(type(value).__name__)}, which is not JSON data", field=field)


def _a(noun: str) -> str:
    """``noun`` with its article: "a set", "an object"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
canonical_json = _CANONICAL.encode
"""JSON data's canonical text: keys sorted, no spaces, ASCII only (``json.dumps`` with those options,
its encoder made once)."""


def payload_json(payload: object, *, field: str = "event.payload", max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """Check a JSON object (see `check_json_value`) and return its canonical JSON text, at most
    ``max_bytes`` long."""
    if not isinstance(payload, dict):
        raise InvalidRequest(f"{field} must be a JSON object, got {type(payload).__name__}", field=field)
    check_json_value(field, payload)
    return sized_payload_json(payload, field=field, max_bytes=max_bytes)


def sized_payload_json(
    payload: Mapping[str, Any], *, field: str = "event.payload", max_bytes: int = MAX_PAYLOAD_BYTES
) -> str:
    """The canonical JSON text of a payload already checked (`check_json_value`), at most ``max_bytes``
    long."""
    text = canonical_json(payload)
    if len(text) > max_bytes:  # ASCII-only text (non-ASCII is escaped): one byte per character
        raise InvalidRequest(f"{field} is larger than {max_bytes} bytes as JSON ({len(text)})", field=field)
    return text


def value_json(value: object, *, field: str = "value", max_bytes: int = MAX_VALUE_BYTES) -> str:
    """Check a result value (any JSON value, see `check_json_value`) and return its canonical JSON text,
    at most ``max_bytes`` long: a larger one is refused, naming its size (store a reference instead)."""
    check_json_value(field, value)
    text = canonical_json(value)
    if len(text) > max_bytes:  # ASCII-only text (non-ASCII is escaped): one byte per character
        raise InvalidRequest(
            f"{field} is larger than {max_bytes} bytes as JSON ({len(text)}): keep large results elsewhere "
            "and complete with a reference to them",
            field=field,
        )
    return text


def validate_event_in(event: object, *, allow_core: bool = False) -> EventIn:
    """Check an offered Event; raise `InvalidRequest` naming the first bad field.

    ``allow_core`` is for trusted control paths: external ingress may not publish the
    privileged ``core.*`` family.
    """
    validated_payload(event, allow_core=allow_core)
    assert isinstance(event, EventIn)
    return event


def validated_payload(event: object, *, allow_core: bool = False, max_bytes: int = MAX_PAYLOAD_BYTES) -> str:
    """`validate_event_in`, returning the payload's canonical JSON text (serialised once)."""
    return payload_json(checked_event_fields(event, allow_core=allow_core).payload, max_bytes=max_bytes)


def checked_event_fields(event: object, *, allow_core: bool = False) -> EventIn:
    """The Event, checked by every rule of `validate_event_in` but the payload's (for a caller that
    checks the payload itself, or has)."""
    if not isinstance(event, EventIn):
        raise InvalidRequest(f"expected an EventIn, got {type(event).__name__}")
    check_text("event.source", event.source)
    check_text("event.delivery_id", event.delivery_id)
    if not isinstance(event.type, str) or not _TYPE_RE.match(event.type) or len(event.type) > MAX_ID_LEN:
        raise InvalidRequest(
            f"event.type must be a dotted name like 'pr.opened', got {_describe(event.type)}",
            field="event.type",
        )
    if event.type.startswith(CORE_PREFIX) and not allow_core:
        raise InvalidRequest(
            f"event.type {event.type!r} is in the privileged core.* family", field="event.type"
        )
    validate_scope(event.scope)
    check_text("event.key", event.key, max_len=MAX_KEY_LEN, optional=True)
    check_text("event.work_id", event.work_id, optional=True)
    return event


@attrs.frozen
class CheckedPayload:
    """An Event's payload as `checked_payload` checked it: its canonical JSON text (what is stored) and
    that text read back as frozen data (what the accepted Event holds), both made once, where the Event
    was offered."""

    text: str
    value: Mapping[str, Any]


def checked_payload(event: object, *, allow_core: bool = False) -> CheckedPayload:
    """`validated_payload`, with the text read back (`CheckedPayload`)."""
    return checked_object(checked_event_fields(event, allow_core=allow_core).payload)


def checked_object(
    payload: object, *, field: str = "event.payload", max_bytes: int = MAX_PAYLOAD_BYTES
) -> CheckedPayload:
    """`payload_json`, with the text read back (`CheckedPayload`). Plain JSON data (``dict``, ``list``,
    ``tuple``, ``str``, ``int``, ``float``, ``bool``, ``None``, and frozen data) is checked and frozen in
    one walk, its objects' keys in the text's order; anything else (a subclass of one of these, or a
    value the rules refuse) takes the text and reads it back, so the value is always what the text
    reads as, and a refusal names its field as `payload_json` does."""
    if type(payload) is dict or type(payload) is FrozenDict:
        value = freeze_plain(payload, max_depth=MAX_PAYLOAD_DEPTH, low=MIN_INT, high=MAX_INT)
        if value is not NOT_PLAIN:
            return CheckedPayload(sized_payload_json(value, field=field, max_bytes=max_bytes), value)
    text = payload_json(payload, field=field, max_bytes=max_bytes)
    return CheckedPayload(text, frozen_object(json.loads(text)))


MAX_LEASE_MS = 7 * 24 * 3_600_000
"""The longest lease a claim or renewal may ask for (a week)."""
MAX_RETRY_AFTER_MS = 24 * 3_600_000
"""The longest retry hint an executor may give (a day); a longer one is refused, never retried at once."""
CORE_UNITS = ("turns", "attempts")
"""Budget units the runtime counts itself: every started turn (an attempt or a continuation after a
wait), and every new attempt."""


def check_lease(field: str, lease: object) -> Lease:
    """A `Lease` whose fenced identity (execution, attempt, epoch, token) is well formed; whether it is
    still current is for the store to say (`StaleAuthority`)."""
    if not isinstance(lease, Lease):
        raise InvalidRequest(f"{field} must be a Lease, got {type(lease).__name__}", field=field)
    check_text(f"{field}.execution_id", lease.execution_id)
    check_int(f"{field}.attempt", lease.attempt, 1, MAX_INT)
    check_int(f"{field}.epoch", lease.epoch, 1, MAX_INT)
    check_text(f"{field}.token", lease.token, max_len=MAX_KEY_LEN)
    if not isinstance(lease.request, RunRequest):
        raise InvalidRequest(
            f"{field}.request must be a RunRequest, got {type(lease.request).__name__}",
            field=f"{field}.request",
        )
    check_text(f"{field}.request.kind", lease.request.kind, optional=True)
    return lease


def validate_outcome(outcome: object, *, field: str = "outcome") -> Outcome:
    """An attempt's outcome as an executor or host reports it: `Completed`, `Handoff` or `Failed`,
    with consumed input ids, a usage table of named finite amounts, and (for `Failed`) an error text
    and an optional retry hint."""
    if not isinstance(outcome, Completed | Handoff | Failed | Waiting):
        raise InvalidRequest(
            f"{field} must be a Completed, Handoff, Failed or Waiting outcome, got {type(outcome).__name__} "
            f"{_describe(outcome)}",
            field=field,
        )
    consumed: object = outcome.consumed_inputs
    if isinstance(consumed, str) or not isinstance(consumed, list | tuple):
        raise InvalidRequest(
            f"{field}.consumed_inputs must be a list of event ids, got {type(consumed).__name__}",
            field=f"{field}.consumed_inputs",
        )
    for i, event_id in enumerate(consumed):
        check_text(f"{field}.consumed_inputs[{i}]", event_id)
    usage: object = outcome.usage
    if not isinstance(usage, Mapping):
        raise InvalidRequest(
            f"{field}.usage must be a table of named amounts, got {type(outcome.usage).__name__}",
            field=f"{field}.usage",
        )
    for unit, amount in usage.items():
        check_text(f"{field}.usage key", unit)
        if isinstance(amount, bool) or not isinstance(amount, int | float) or not math.isfinite(amount):
            raise InvalidRequest(
                f"{field}.usage[{unit!r}] must be a finite number, got {_describe(amount)}",
                field=f"{field}.usage[{unit!r}]",
            )
        if isinstance(amount, int) and not MIN_INT <= amount <= MAX_INT:
            raise InvalidRequest(
                f"{field}.usage[{unit!r}] is outside 64 bits", field=f"{field}.usage[{unit!r}]"
            )
        if amount < 0:
            raise InvalidRequest(
                f"{field}.usage[{unit!r}] must not be negative, got {describe_value(amount)}",
                field=f"{field}.usage[{unit!r}]",
            )
        if unit in CORE_UNITS:
            raise InvalidRequest(
                f"{field}.usage[{unit!r}]: {unit!r} is counted by the runtime itself, not reported",
                field=f"{field}.usage[{unit!r}]",
            )
    if isinstance(outcome, Waiting):
        check_wait_spec(f"{field}.wait", outcome.wait)
        artifacts: object = outcome.artifacts
        if isinstance(artifacts, str) or not isinstance(artifacts, list | tuple):
            raise InvalidRequest(
                f"{field}.artifacts must be a list of references, got {type(artifacts).__name__}",
                field=f"{field}.artifacts",
            )
        for i, ref in enumerate(artifacts):
            check_text(f"{field}.artifacts[{i}]", ref, max_len=MAX_REASON_LEN)
    if isinstance(outcome, Completed):
        value_json(outcome.value, field=f"{field}.value")
    if isinstance(outcome, Failed):
        check_reason(f"{field}.error", outcome.error)
        if outcome.retry_after_ms is not None:
            check_int(f"{field}.retry_after_ms", outcome.retry_after_ms, 0, MAX_RETRY_AFTER_MS)
        for flag in ("rate_limited", "retryable"):
            if not isinstance(getattr(outcome, flag), bool):
                raise InvalidRequest(
                    f"{field}.{flag} must be true or false, got {_describe(getattr(outcome, flag))}",
                    field=f"{field}.{flag}",
                )
    return outcome


def check_wait_spec(field: str, spec: object) -> WaitSpec:
    """A well-formed `WaitSpec` (whether its keys belong to the Work is checked at registration)."""
    if not isinstance(spec, WaitSpec):
        raise InvalidRequest(f"{field} must be a WaitSpec, got {type(spec).__name__}", field=field)
    check_keys(f"{field}.keys", spec.keys)
    types: object = spec.types
    if isinstance(types, str) or not isinstance(types, list | tuple):
        raise InvalidRequest(
            f"{field}.types must be a list of type patterns, got {type(types).__name__}",
            field=f"{field}.types",
        )
    for i, pattern in enumerate(types):
        check_text(f"{field}.types[{i}]", pattern)
    if spec.after_seq is not None:
        check_int(f"{field}.after_seq", spec.after_seq, 0, MAX_SEQ)
    if spec.timeout_ms is not None:
        check_int(f"{field}.timeout_ms", spec.timeout_ms, 1, MAX_TIME_MS)
    subscriptions: object = spec.subscriptions
    if isinstance(subscriptions, str) or not isinstance(subscriptions, list | tuple):
        raise InvalidRequest(
            f"{field}.subscriptions must be a list of SubscriptionSpec, got {type(subscriptions).__name__}"
        )
    seen: set[tuple[str, str]] = set()
    for i, sub in enumerate(subscriptions):
        check_subscription_spec(f"{field}.subscriptions[{i}]", sub)
        if (sub.namespace, sub.id) in seen:
            raise InvalidRequest(
                f"{field}.subscriptions[{i}]: subscription {sub.namespace}/{sub.id} is declared twice"
            )
        seen.add((sub.namespace, sub.id))
    return spec


MAX_SUBSCRIPTION_PART = 99
"""Namespace and id each: joined by ``/`` they are the aliases' source, at most `MAX_ID_LEN` long."""
MAX_FILTER_BYTES = 65_536


def check_subscription_spec(field: str, spec: object) -> SubscriptionSpec:
    """A well-formed `SubscriptionSpec` (whether the keys belong to whom they should is checked when it
    is stored)."""
    if not isinstance(spec, SubscriptionSpec):
        raise InvalidRequest(f"{field} must be a SubscriptionSpec, got {type(spec).__name__}")
    check_text(f"{field}.namespace", spec.namespace, max_len=MAX_SUBSCRIPTION_PART)
    if "/" in spec.namespace:
        # ``namespace/id`` must name one subscription only: ("a/b", "c") and ("a", "b/c") would collide
        raise InvalidRequest(f"{field}.namespace must not contain '/': {_describe(spec.namespace)}")
    check_text(f"{field}.id", spec.id, max_len=MAX_SUBSCRIPTION_PART)
    check_text(f"{field}.source_key", spec.source_key, max_len=MAX_KEY_LEN)
    if spec.source_scope is not None:
        validate_scope(spec.source_scope, field=f"{field}.source_scope")
    types: object = spec.types
    if isinstance(types, str) or not isinstance(types, list | tuple):
        raise InvalidRequest(f"{field}.types must be a list of type patterns, got {type(types).__name__}")
    for i, pattern in enumerate(types):
        check_text(f"{field}.types[{i}]", pattern)
    check_int(f"{field}.after", spec.after, 0, MAX_SEQ)
    check_text(f"{field}.filter_name", spec.filter_name, optional=True)
    if spec.filter is not None:
        if spec.filter_name is None:
            raise InvalidRequest(f"{field}.filter needs a filter_name naming the alias filter that reads it")
        payload_json(spec.filter, field=f"{field}.filter", max_bytes=MAX_FILTER_BYTES)
    label: object = spec.label
    if not isinstance(label, str):
        raise InvalidRequest(f"{field}.label must be a string, got {type(label).__name__}")
    if label:
        check_text(f"{field}.label", label, max_len=MAX_ID_LEN, strip=False)
    return spec
