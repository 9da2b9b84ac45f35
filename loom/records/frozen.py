"""Immutable JSON data: what records hand to plugins and callers cannot change the store's truth.

`freeze` turns JSON-shaped data into `FrozenDict` and `FrozenList`, subclasses of ``dict`` and
``list`` (so ``isinstance`` checks, ``json.dumps`` and comparisons work as before) whose mutating
methods raise ``TypeError``. A caller who wants to change one makes a copy: ``dict(event.payload)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NoReturn


def _immutable(self: object, *args: object, **kwargs: object) -> NoReturn:
    raise TypeError(f"{type(self).__name__} is immutable (copy it with dict(...) or list(...) to change it)")


class FrozenDict(dict[str, Any]):
    """A ``dict`` that cannot change after it is made (see `freeze`)."""

    __slots__ = ()

    __setitem__ = _immutable
    __delitem__ = _immutable
    __ior__ = _immutable
    clear = _immutable
    pop = _immutable
    popitem = _immutable
    setdefault = _immutable
    update = _immutable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_frozen_dict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return self


class FrozenList(list[Any]):
    """A ``list`` that cannot change after it is made (see `freeze`)."""

    __slots__ = ()

    __setitem__ = _immutable
    __delitem__ = _immutable
    __iadd__ = _immutable
    __imul__ = _immutable
    append = _immutable
    extend = _immutable
    insert = _immutable
    remove = _immutable
    pop = _immutable
    clear = _immutable
    sort = _immutable
    reverse = _immutable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_frozen_list, (list(self),))

    def __copy__(self) -> FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenList:
        return self


def _frozen_dict(data: dict[str, Any]) -> FrozenDict:
    return FrozenDict(data)


def _frozen_list(data: list[Any]) -> FrozenList:
    return FrozenList(data)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def freeze(value: Any) -> Any:
    """An immutable deep copy of JSON-shaped ``value`` (already frozen data is returned as it is)."""
    kind = type(value)
    if kind in _SCALARS:  # the common leaves, told apart before the isinstance checks below
        return value
    if kind is dict:
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, FrozenDict | FrozenList):
        return value
    if isinstance(value, dict):
        return FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return FrozenList(freeze(item) for item in value)
    return value


def frozen_object(value: Any) -> Any:
    """`freeze` for a record's JSON-object field: a mapping comes out a `FrozenDict`; anything else is
    left for the record's own validation to refuse. A `FrozenDict` is kept as it is (`freeze` makes every
    one deeply frozen), so a record copied with ``attrs.evolve`` shares its payload instead of copying it."""
    kind = type(value)
    if kind is FrozenDict:
        return value
    if kind is dict:
        return freeze(value)
    if isinstance(value, Mapping):
        return freeze(dict(value))
    return value


def frozen_optional_object(value: Any) -> Any:
    return None if value is None else frozen_object(value)


def is_valid_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a lone surrogate does not)."""
    if text.isascii():  # (a flag the string holds: most text is ASCII)
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


NOT_PLAIN: Any = object()
"""What `freeze_plain` answers for data it does not take."""
_PLAIN_OBJECTS = (dict, FrozenDict)
_PLAIN_ARRAYS = (list, tuple, FrozenList)


def freeze_plain(value: Any, *, max_depth: int, low: int, high: int, depth: int = 1) -> Any:
    """`freeze` for plain JSON data, each object's keys sorted (as canonical JSON text has them): objects
    (``dict``, `FrozenDict`) with valid Unicode string keys, arrays (``list``, ``tuple``, `FrozenList`),
    valid Unicode strings, integers from ``low`` to ``high``, finite floats, booleans and null, at most
    ``max_depth`` levels deep. `NOT_PLAIN` for anything else (a subclass of one of these too): the
    caller takes a path that says what is wrong, or reads the data as JSON text reads back."""
    kind = type(value)
    if kind is str:
        return value if value.isascii() or is_valid_unicode(value) else NOT_PLAIN
    if kind is int:
        return value if low <= value <= high else NOT_PLAIN
    if value is None or kind is bool:
        return value
    if kind is float:
        return value if math.isfinite(value) else NOT_PLAIN
    if depth > max_depth:
        return NOT_PLAIN
    if kind in _PLAIN_OBJECTS:
        items = []
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or is_valid_unicode(key)):
                return NOT_PLAIN
            frozen = freeze_plain(item, max_depth=max_depth, low=low, high=high, depth=depth + 1)
            if frozen is NOT_PLAIN:
                return NOT_PLAIN
            items.append((key, frozen))
        items.sort(key=_first)
        return FrozenDict(items)
    if kind in _PLAIN_ARRAYS:
        array = []
        for item in value:
            frozen = freeze_plain(item, max_depth=max_depth, low=low, high=high, depth=depth + 1)
            if frozen is NOT_PLAIN:
                return NOT_PLAIN
            array.append(frozen)
        return FrozenList(array)
    return NOT_PLAIN


def _first(pair: tuple[str, Any]) -> str:
    return pair[0]


def thaw(value: Any) -> Any:
    """A plain, mutable deep copy of frozen JSON data."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value
