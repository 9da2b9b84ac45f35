"""Key paths and value checks shared by the config records and the TOML reader.

Errors name the TOML key path (``scopes."acme/web".routes[1].policy``) so a person can find it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import math
import re
from collections.abc import Collection, Iterator
from typing import Any

import attrs

from ..records.errors import ConfigError
from ..records.frozen import is_valid_unicode
from ..records.validation import MAX_INT, MAX_PAYLOAD_DEPTH, MIN_INT, describe_value

MAX_NAME_LEN = 200

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
_BARE_KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")


def bounded(low: int, high: int, section: str = "") -> Any:
    """An attrs validator; the error's key is the attribute, under ``section`` when the record has one."""

    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ConfigError(
                f"must be an integer from {low} to {high}, got {describe_value(value)}",
                key=join_key(section, attribute.name),
            )

    return check


def optional_bounded(low: int, high: int) -> Any:
    check = bounded(low, high)

    def optional(instance: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def key_path(path: str, *names: object) -> str:
    """Append TOML keys to a dotted path, quoting those that are not bare keys (a key that is not a
    string is shown by its ``repr``; one that is not valid Unicode is escaped, so a message naming it
    stays printable text)."""
    for name in names:
        text = name if isinstance(name, str) else repr(name)
        part = text if _BARE_KEY_RE.match(text) else json.dumps(text, ensure_ascii=not is_valid_unicode(text))
        path = f"{path}.{part}" if path else part
    return path


def join_key(path: str, key: str | None) -> str:
    if not key:
        return path
    if not path or key.startswith("["):
        return path + key
    return f"{path}.{key}"


def known(names: Collection[str]) -> str:
    return f" (known: {', '.join(sorted(names))})" if names else ""


@contextlib.contextmanager
def rekey(file: str | None, path: str) -> Iterator[None]:
    """Give a record's own `ConfigError` (keyed relative to the record) the file and the full key path."""
    try:
        yield
    except ConfigError as exc:
        if exc.file is not None:
            raise
        raise ConfigError(exc.reason, file=file, key=join_key(path, exc.key)) from None


def check_name(value: object, key: str) -> None:
    if not isinstance(value, str) or not _NAME_RE.match(value) or len(value) > MAX_NAME_LEN:
        raise ConfigError(
            f"must be a name of letters, digits, '_', '.', ':' or '-' starting with a letter or digit, "
            f"got {describe_value(value)}",
            key=key,
        )


def check_json(value: object, key: str, depth: int = 1) -> None:
    """Opaque tables must be JSON data, held to the payload rules (string keys, valid Unicode, 64-bit
    integers, finite floats, at most `MAX_PAYLOAD_DEPTH` levels): they are passed to plugins and
    recorded with decisions."""
    if isinstance(value, dict | list) and depth > MAX_PAYLOAD_DEPTH:
        raise ConfigError(f"is nested more than {MAX_PAYLOAD_DEPTH} levels deep", key=key)
    if isinstance(value, dict):
        for name, item in value.items():
            if not isinstance(name, str):
                raise ConfigError(f"keys must be strings, got {describe_value(name)}", key=key)
            if not is_valid_unicode(name):
                raise ConfigError(f"keys must be valid Unicode text, got {describe_value(name)}", key=key)
            check_json(item, key_path(key, name), depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_json(item, f"{key}[{i}]", depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"must be JSON data, got {describe_value(value)}", key=key)
    elif isinstance(value, str):
        if not is_valid_unicode(value):
            raise ConfigError(
                f"must be valid Unicode text (it holds a lone surrogate): {describe_value(value)}", key=key
            )
    elif isinstance(value, int) and not isinstance(value, bool):
        if not MIN_INT <= value <= MAX_INT:
            raise ConfigError(f"must be an integer within 64 bits, got {describe_value(value)}", key=key)
    elif not (value is None or isinstance(value, bool)):
        raise ConfigError(f"must be JSON data (no dates or times), got {type(value).__name__}", key=key)


def plain(value: Any) -> Any:
    """Unstructured records to TOML/JSON-compatible data: no ``None``, lists for tuples and sets."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items() if item is not None}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, frozenset | set):
        return sorted(plain(item) for item in value)
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    return value
