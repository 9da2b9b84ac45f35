"""The HTTP service's wire format: request bodies and query strings parsed into loom's records, records
rendered as JSON, and every refusal as one error shape (docs/http-api.md).

Parsing here checks only the shape (a JSON object, known fields, JSON types); the rules for values are
the runtime's, which names the bad field (`InvalidRequest.field`). A refusal is
``{"error": <kind>, "field": <name or null>, "message": <text>}`` and changes nothing.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from starlette.responses import Response

from ..records.clock import iso_ms
from ..records.errors import (
    CallParked,
    CallRefused,
    CausalRefused,
    Conflict,
    InvalidRequest,
    LoomError,
    NotAccepting,
    NotAdoptable,
    NotFound,
    StaleAuthority,
    StorageError,
)
from ..records.serde import unstructure
from ..records.validation import MAX_ID_LEN, MAX_INT, MAX_KEY_LEN, MAX_REASON_LEN, MAX_TIME_MS, MIN_INT

MAX_BODY_BYTES = 2 * 1024 * 1024
"""The largest request body: a payload may be 1 MiB as canonical JSON, and a body carries it as
the client wrote it (with spaces or escapes) among the other fields."""

MAX_PAGE = 1000
"""The largest page a list endpoint answers."""


# -- errors -------------------------------------------------------------------------------


@attrs.frozen
class ErrorKind:
    status: int
    name: str
    meaning: str


BAD_REQUEST = ErrorKind(400, "invalid_request", "bad input: the field and the reason are named")
UNAUTHORIZED = ErrorKind(401, "unauthorized", "no bearer token, or not one this route takes")
STALE = ErrorKind(403, "stale_authority", "the token is not the execution's current lease token")
NOT_FOUND = ErrorKind(404, "not_found", "no such object (or route)")
FORBIDDEN = ErrorKind(403, "forbidden", "a browser page of another origin may not change anything here")
METHOD = ErrorKind(405, "method_not_allowed", "the path does not take this method (see Allow)")
CONFLICT = ErrorKind(409, "conflict", "the object's state or revision refuses the change; reread it")
CAUSAL = ErrorKind(409, "causal_refused", "the causal bounds refused a derived Event")
CALL_REFUSED = ErrorKind(403, "call_refused", "a call gate refused the toolbelt call: nothing changed")
CALL_PARKED = ErrorKind(
    409,
    "call_parked",
    "a call gate turned the toolbelt call into a wait: the call did not run, and the attempt is parked"
    " on the gate's wait (exit: its continuation makes the call again)",
)
TOO_LARGE = ErrorKind(413, "too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
MEDIA_TYPE = ErrorKind(415, "unsupported_media_type", "a body must be sent as Content-Type: application/json")
MISDIRECTED = ErrorKind(421, "misdirected_request", "the Host header names a host this server does not serve")
UNAVAILABLE = ErrorKind(503, "unavailable", "the store failed or is closed; nothing was committed")
INTERNAL = ErrorKind(500, "internal", "a fault in loom (logged); never an answer to bad input")


class HTTPError(Exception):
    """A refusal made by the service itself (before the runtime was asked)."""

    def __init__(self, kind: ErrorKind, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.field = field
        self.message = message


def error_body(kind: ErrorKind, message: str, field: str | None) -> dict[str, Any]:
    return {"error": kind.name, "field": field, "message": message}


def classify(
    exc: BaseException, prefixes: Sequence[str] = (), renames: Mapping[str, str] | None = None
) -> tuple[ErrorKind, str | None]:
    """The one map from loom's errors to HTTP answers, with the field named as the client wrote it
    (``prefixes`` are the record names the runtime puts before a body's fields, like ``event.``;
    ``renames`` maps the runtime's argument names to the API's, like ``after_id`` to ``after``)."""
    if isinstance(exc, HTTPError):
        return exc.kind, exc.field
    if isinstance(exc, InvalidRequest):
        field = _client_field(exc.field, prefixes)
        return BAD_REQUEST, (renames or {}).get(field or "", field)
    if isinstance(exc, NotFound):
        return NOT_FOUND, None
    if isinstance(exc, StaleAuthority):
        return STALE, None
    if isinstance(exc, CausalRefused):
        return CAUSAL, None
    if isinstance(exc, CallRefused):
        return CALL_REFUSED, None
    if isinstance(exc, CallParked):
        return CALL_PARKED, None
    if isinstance(exc, Conflict | NotAccepting | NotAdoptable):
        return CONFLICT, None
    if isinstance(exc, StorageError):
        return UNAVAILABLE, None
    return INTERNAL, None


def _client_field(field: str | None, prefixes: Sequence[str]) -> str | None:
    if field is None:
        return None
    for prefix in prefixes:
        if field.startswith(prefix) and len(field) > len(prefix):
            return field[len(prefix) :]
    return field


def error_response(
    exc: BaseException, prefixes: Sequence[str] = (), renames: Mapping[str, str] | None = None
) -> Response:
    kind, field = classify(exc, prefixes, renames)
    if kind is INTERNAL:
        message = "internal error (logged)"
    elif isinstance(exc, HTTPError):
        message = exc.message
    else:
        message = str(exc)
    headers = {"WWW-Authenticate": "Bearer"} if kind is UNAUTHORIZED else None
    return json_response(error_body(kind, message, field), kind.status, headers=headers)


# -- rendering ----------------------------------------------------------------------------


def _default(value: object) -> Any:
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


def to_data(value: object) -> Any:
    """A record (or plain data holding records) as JSON data."""
    return unstructure(value)


def json_bytes(data: Any) -> bytes:
    return json.dumps(unstructure(data), default=_default, ensure_ascii=False, allow_nan=False).encode()


def json_response(data: Any, status: int = 200, *, headers: Mapping[str, str] | None = None) -> Response:
    return Response(json_bytes(data), status_code=status, media_type="application/json", headers=headers)


def iso(ms: int | None) -> str:
    """Unix milliseconds as ISO 8601 UTC (``2026-01-01T00:00:00.000Z``)."""
    if ms is None:
        return ""
    return iso_ms(ms)


# -- bodies -------------------------------------------------------------------------------


@attrs.frozen
class Field:
    """One field of a JSON body: its JSON type, whether it is required, and whether ``null`` is allowed.

    ``kind`` is one of ``string``, ``integer``, ``boolean``, ``object``, ``strings`` (an array of
    strings), ``amounts`` (an object of numbers) and ``json`` (any JSON value).
    """

    name: str
    kind: str
    required: bool = False
    nullable: bool = False
    doc: str = ""
    schema: Mapping[str, Any] = attrs.field(factory=dict)
    """More of its JSON Schema, for the OpenAPI document (limits the runtime checks)."""


# JSON Schema for the documented limits of `loom.records.validation` (the runtime checks them)
# Whitespace as Python's str.strip() reads it, spelled out: JSON Schema validators differ on ``\s``.
_SPACE = r"\t\n\u000b\f\r\u001c-\u001f \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_CONTROL = r"\u0000-\u001f\u007f"
TEXT = {
    "minLength": 1,
    "maxLength": MAX_ID_LEN,
    "pattern": rf"^[^{_SPACE}{_CONTROL}]([^{_CONTROL}]*[^{_SPACE}{_CONTROL}])?$",
}
KEY = {**TEXT, "maxLength": MAX_KEY_LEN}
LOOKUP = {"minLength": 1, "maxLength": MAX_KEY_LEN, "pattern": rf"^[^{_CONTROL}]+$"}
REASON_TEXT = {  # not blank, and no NUL (which no store keeps in text)
    "minLength": 1,
    "maxLength": MAX_REASON_LEN,
    "pattern": rf"^[^\u0000]*[^{_SPACE}\u0000][^\u0000]*$",
}
JSON_VALUE_REF = {"$ref": "#/components/schemas/JsonValue"}
JSON_VALUE = {
    "description": "JSON data as loom stores it: integers within 64 bits, finite numbers, valid Unicode",
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "integer", "minimum": MIN_INT, "maximum": MAX_INT},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": JSON_VALUE_REF},
        {"type": "object", "additionalProperties": JSON_VALUE_REF},
    ],
}
JSON_OBJECT = {"additionalProperties": JSON_VALUE_REF}
"""A payload or spec: a JSON object of `JSON_VALUE` (at most 1 MiB and 64 levels deep)."""
TYPE = {"maxLength": MAX_ID_LEN, "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"}
OUTSIDE_CORE = {**TYPE, "not": {"pattern": r"^core\."}}
"""An Event type a client may send: the ``core.*`` family is the runtime's own."""
SCOPE = {"maxLength": MAX_ID_LEN, "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)*$"}
TIME = {"minimum": 0, "maximum": MAX_TIME_MS}


def _bad(field: str | None, message: str) -> HTTPError:
    return HTTPError(BAD_REQUEST, message, field=field)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


class _Repeats(dict[str, Any]):
    """A decoded JSON object in which a member name was repeated (``repeated``: the first one)."""

    repeated: str = ""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) == len(pairs):
        return data
    repeats = _Repeats(data)
    seen: set[str] = set()
    for name, _ in pairs:
        if name in seen:
            repeats.repeated = name
            break
        seen.add(name)
    return repeats


def _repeated_member(data: Any) -> tuple[str, str]:
    """The first repeated member name in decoded JSON, and where it is as a field path
    (``payload.items[0].a``)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value, _Repeats):
                return value.repeated, f"{path}.{value.repeated}" if path else value.repeated
            stack += [(f"{path}.{key}" if path else key, item) for key, item in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value)))]
    raise AssertionError("no repeated member")


_MAX_DIGITS = sys.get_int_max_str_digits() or 4300


def parse_json(raw: bytes) -> Any:
    """Decode a body as strict JSON (UTF-8; no NaN or Infinity; each member name once per object:
    JSON leaves the meaning of a repeated name open, so it is refused, never read as its last
    value); refusals are 400 naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(None, "the body is not UTF-8 text") from None
    repeats = False

    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal repeats
        data = _object(pairs)
        repeats = repeats or isinstance(data, _Repeats)
        return data

    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=pairs_hook)
    except RecursionError:
        raise _bad(None, "the body is nested too deeply to be read") from None
    except ValueError as exc:
        if "sys.set_int_max_str_digits" in str(exc):  # Python's own limit on decimal digits
            raise _bad(None, f"the body holds a number of more than {_MAX_DIGITS} digits") from None
        raise _bad(None, f"the body is not valid JSON: {exc}") from None
    if repeats:
        name, where = _repeated_member(data)
        raise _bad(where, f"the member {name!r} appears more than once in one object ({where}): send it once")
    return data


_JSON_TYPES = {
    "string": "a string",
    "integer": "an integer",
    "boolean": "true or false",
    "object": "a JSON object",
    "strings": "an array of strings",
    "amounts": "an object of numbers",
    "json": "JSON data",
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits(kind: str, value: object) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return _is_int(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "strings":
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == "json":
        return True  # the runtime checks what JSON data it takes
    if kind == "amounts":
        return isinstance(value, dict) and all(
            isinstance(item, int | float) and not isinstance(item, bool) for item in value.values()
        )
    raise AssertionError(kind)


def parse_body(raw: bytes, fields: Sequence[Field], *, empty_ok: bool = False) -> dict[str, Any]:
    """A JSON object holding only ``fields``, each of its JSON type; returns the fields given
    (``null`` for a nullable one is kept as ``None``)."""
    if not raw.strip():
        if empty_ok and not any(f.required for f in fields):
            return {}
        raise _bad(None, "the body must be a JSON object")
    return parse_fields(parse_json(raw), fields)


def parse_fields(data: Any, fields: Sequence[Field], what: str = "the body") -> dict[str, Any]:
    """`parse_body` for JSON already decoded (``what`` names it in a refusal)."""
    if not isinstance(data, dict):
        raise _bad(None, f"{what} must be a JSON object, got {_json_name(data)}")
    known = {f.name: f for f in fields}
    for name in data:
        if name not in known:
            expected = ", ".join(known) or "no fields"
            raise _bad(name, f"unknown field {name!r} (expected: {expected})")
    out: dict[str, Any] = {}
    for f in fields:
        if f.name not in data:
            if f.required:
                raise _bad(f.name, f"{f.name} is required")
            continue
        value = data[f.name]
        if value is None and f.kind != "json":  # null is JSON data
            if not f.nullable:
                raise _bad(f.name, f"{f.name} must be {_JSON_TYPES[f.kind]}, got null")
        elif f.kind == "integer" and isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON has one number type: 3.0 is the integer 3 (as JSON Schema reads it)
        elif not _fits(f.kind, value):
            raise _bad(f.name, f"{f.name} must be {_JSON_TYPES[f.kind]}, got {_json_name(value)}")
        out[f.name] = value
    return out


def _json_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# -- query strings ------------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]{1,19}\Z")


def query_int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    if not _DIGITS.match(raw):
        raise _bad(name, f"{name} must be a whole number from {low} to {high}, got {raw[:40]!r}")
    value = int(raw)
    if not low <= value <= high:
        raise _bad(name, f"{name} must be from {low} to {high}, got {value}")
    return value


def query_text(params: Mapping[str, str], name: str) -> str | None:
    """A text filter, or ``None`` when it is left out; an empty one is refused (leave it out)."""
    raw = params.get(name)
    if raw == "":
        raise _bad(name, f"{name} is empty: give a value, or leave {name} out")
    return raw


def form_params(params: Mapping[str, str]) -> dict[str, str]:
    """A web form's query: a field left empty in the form is the same as one left out."""
    return {name: value for name, value in params.items() if value != ""}


def query_limit(params: Mapping[str, str], default: int = 100) -> int:
    return query_int(params, "limit", default, 1, MAX_PAGE)


def is_loom_error(exc: BaseException) -> bool:
    return isinstance(exc, LoomError | HTTPError)
