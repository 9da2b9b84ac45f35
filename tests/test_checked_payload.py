"""An offered payload is checked, written as canonical text and frozen in one walk (`checked_object`,
which `checked_payload` and a timer's firing use). What the accepted Event holds must be exactly what
its stored text reads back as, and the walk must accept and refuse exactly what `payload_json` does:
an Event read back from the store after a restart must be the one its publisher was answered with.

Each test names the wrong implementations it catches.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loom import InvalidRequest
from loom.records.frozen import FrozenDict, FrozenList, freeze, frozen_object
from loom.records.validation import (
    MAX_INT,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    MIN_INT,
    CheckedPayload,
    checked_object,
    payload_json,
)


class Level(enum.IntEnum):
    HIGH = 3


class Name(str):
    """A ``str`` subclass: JSON text holds its characters, and reads back a plain ``str``."""


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, and with objects' keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (a != a and b != b)


def outcome(call: Any, payload: Any) -> CheckedPayload | str:
    try:
        return call(payload)
    except InvalidRequest as exc:
        return f"refused: {exc} ({exc.field})"


def the_old_way(payload: Any) -> CheckedPayload:
    """What `checked_payload` did before the one walk: check, write the text, read it back."""
    text = payload_json(payload)
    return CheckedPayload(text, frozen_object(json.loads(text)))


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=MIN_INT - 2, max_value=MAX_INT + 2)
    | st.sampled_from([MIN_INT, MAX_INT, 2**64, Level.HIGH, float("nan"), float("-inf"), -0.0, 1e308])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
    | st.sampled_from(["\ud800", "a\udfffb", Name("sub"), "é\u2028"])
)
keys = st.text(max_size=6) | st.sampled_from(["\udc00", "b", "a", "timer"])
json_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.lists(inner, max_size=3).map(freeze)
        | st.dictionaries(keys, inner, max_size=4)
        | st.dictionaries(keys, inner, max_size=3).map(freeze)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(keys, json_like, max_size=5) | st.dictionaries(keys, json_like, max_size=3).map(freeze)
)
def test_one_walk_accepts_refuses_and_writes_exactly_what_checking_then_reading_back_did(
    payload: dict[str, Any],
) -> None:
    # catches: keys left in the publisher's order (the stored text reads back sorted); a tuple kept as
    # a tuple, an IntEnum or str subclass kept as itself (the text reads back list, int, str); an
    # integer past 64 bits, a NaN or infinity, a lone surrogate in a key or a string let through the
    # walk (payload_json refuses them); a refusal with another message or field than payload_json's
    new, old = outcome(checked_object, payload), outcome(the_old_way, payload)
    if isinstance(old, str):
        assert new == old
        return
    assert isinstance(new, CheckedPayload)
    assert new.text == old.text
    assert same(new.value, old.value), (new.value, old.value)
    assert isinstance(new.value, FrozenDict)


@pytest.mark.parametrize("container", ["object", "array"])
def test_the_walk_takes_as_many_levels_as_the_limit_and_refuses_one_more(container: str) -> None:
    # catches: the walk's depth counted from 0 (it would refuse the 64th level, or take the 65th)
    def nest(levels: int) -> dict[str, Any]:
        value: Any = 1
        for _ in range(levels - 1):
            value = {"a": value} if container == "object" else [value]
        return {"a": value}

    deepest = checked_object(nest(MAX_PAYLOAD_DEPTH))
    assert deepest.text == payload_json(nest(MAX_PAYLOAD_DEPTH))
    with pytest.raises(InvalidRequest, match=f"more than {MAX_PAYLOAD_DEPTH} levels deep"):
        checked_object(nest(MAX_PAYLOAD_DEPTH + 1))


def test_the_walk_refuses_a_payload_one_byte_over_its_limit_and_takes_one_at_it() -> None:
    # catches: a walk that writes the text without checking its size
    overhead = len(json.dumps({"a": ""}, separators=(",", ":")))
    at_limit = {"a": "x" * (MAX_PAYLOAD_BYTES - overhead)}
    assert len(checked_object(at_limit).text) == MAX_PAYLOAD_BYTES
    with pytest.raises(InvalidRequest, match="larger than"):
        checked_object({"a": "x" * (MAX_PAYLOAD_BYTES - overhead + 1)})


def test_the_value_is_a_copy_the_publisher_cannot_change_afterwards() -> None:
    # catches: a walk that keeps the publisher's own lists or dicts inside the frozen value
    inner = [1, 2]
    payload = {"list": inner, "obj": {"k": inner}}
    checked = checked_object(payload)
    inner.append(3)
    payload["obj"]["k"] = None
    assert checked.value == {"list": [1, 2], "obj": {"k": [1, 2]}}
    assert isinstance(checked.value["list"], FrozenList)
    assert json.loads(checked.text) == checked.value
