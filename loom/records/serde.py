"""The one private cattrs converter (JSON-safe).

Records go to plain dicts and back; enums travel as their string values.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import cattrs

T = TypeVar("T")

converter = cattrs.Converter(forbid_extra_keys=True)


def unstructure(obj: Any) -> Any:
    return converter.unstructure(obj)


def structure(data: Any, cls: type[T]) -> T:
    return converter.structure(data, cls)


def dumps(obj: Any) -> str:
    """Serialise a record (or plain JSON data) to canonical JSON text."""
    return json.dumps(converter.unstructure(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def loads(text: str, cls: type[T]) -> T:
    return converter.structure(json.loads(text), cls)
