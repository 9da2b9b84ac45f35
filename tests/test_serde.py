"""The private cattrs converter (`loom.records.serde`): records survive a round trip, as dicts and as JSON."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from cattrs.errors import ClassValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from loom import (
    CausalLimits,
    CausalRejection,
    Config,
    ConfigError,
    Event,
    EventIn,
    KVEntry,
    RejectionReason,
)
from loom.config.model import MAX_CAUSAL_DEPTH, MAX_PER_MINUTE
from loom.records import serde as _serde

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=4)
texts = st.text(min_size=1, max_size=20)
optional_texts = st.none() | texts
ms = st.integers(min_value=0, max_value=2**53)

event_ins = st.builds(
    EventIn,
    source=texts,
    delivery_id=texts,
    type=texts,
    scope=texts,
    key=optional_texts,
    work_id=optional_texts,
    payload=json_objects,
)
events = st.builds(
    Event,
    id=texts,
    seq=st.integers(min_value=1, max_value=2**62),
    source=texts,
    delivery_id=texts,
    type=texts,
    scope=texts,
    key=optional_texts,
    work_id=optional_texts,
    execution_id=optional_texts,
    payload=json_objects,
    parent_id=optional_texts,
    cause_id=optional_texts,
    root_id=texts,
    depth=st.integers(min_value=0, max_value=MAX_CAUSAL_DEPTH + 1),
    accepted_at_ms=ms,
    duplicate=st.booleans(),
)
rejections = st.builds(
    CausalRejection,
    reason=st.sampled_from(RejectionReason),
    root_id=texts,
    depth=st.integers(min_value=1, max_value=MAX_CAUSAL_DEPTH + 1),
    limit=st.integers(min_value=1, max_value=MAX_CAUSAL_DEPTH),
    budget=st.integers(min_value=1, max_value=MAX_PER_MINUTE),
    minute=st.integers(min_value=0, max_value=2**40),
    source=texts,
    delivery_id=texts,
    type=texts,
    parent_id=texts,
    cause_id=optional_texts,
    work_id=optional_texts,
    execution_id=optional_texts,
    at_ms=ms,
)
kv_entries = st.builds(KVEntry, namespace=texts, key=texts, value=json_objects, updated_at_ms=ms)
limits = st.builds(
    CausalLimits,
    max_depth=st.integers(min_value=1, max_value=MAX_CAUSAL_DEPTH),
    per_minute=st.integers(min_value=1, max_value=MAX_PER_MINUTE),
)
configs = st.builds(Config, causal=limits, generation=st.integers(min_value=1, max_value=2**40))

RECORDS: list[tuple[type[Any], st.SearchStrategy[Any]]] = [
    (EventIn, event_ins),
    (Event, events),
    (CausalRejection, rejections),
    (KVEntry, kv_entries),
    (CausalLimits, limits),
    (Config, configs),
]
record_and_strategy = pytest.mark.parametrize(
    ("cls", "strategy"), RECORDS, ids=[cls.__name__ for cls, _ in RECORDS]
)


@record_and_strategy
def test_unstructure_then_structure_gives_back_an_equal_record(
    cls: type[Any], strategy: st.SearchStrategy[Any]
) -> None:
    @settings(max_examples=60)
    @given(strategy)
    def round_trip(record: Any) -> None:
        assert _serde.structure(_serde.unstructure(record), cls) == record

    round_trip()


@record_and_strategy
def test_dumps_then_loads_gives_back_an_equal_record(
    cls: type[Any], strategy: st.SearchStrategy[Any]
) -> None:
    @settings(max_examples=60)
    @given(strategy)
    def round_trip(record: Any) -> None:
        text = _serde.dumps(record)
        back = _serde.loads(text, cls)
        assert back == record
        assert _serde.dumps(back) == text, "dumps is canonical: the same record gives the same text"

    round_trip()


@record_and_strategy
def test_unstructured_records_are_plain_json_data(cls: type[Any], strategy: st.SearchStrategy[Any]) -> None:
    @settings(max_examples=60)
    @given(strategy)
    def plain(record: Any) -> None:
        data = _serde.unstructure(record)
        assert isinstance(data, dict)
        assert set(data) == {a.name for a in attrs.fields(cls)}
        assert json.loads(json.dumps(data, allow_nan=False)) == data

    plain()


@settings(max_examples=60)
@given(rejections)
def test_a_rejection_reason_travels_as_its_string_value(rejection: CausalRejection) -> None:
    data = json.loads(_serde.dumps(rejection))
    assert data["reason"] == rejection.reason.value
    assert _serde.structure(data, CausalRejection).reason is rejection.reason


@settings(max_examples=60)
@given(events)
def test_dumps_sorts_keys_and_has_no_spaces_between_tokens(event: Event) -> None:
    text = _serde.dumps(event)
    assert text == json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"))


@settings(max_examples=60)
@given(events, st.text(min_size=1).filter(lambda k: k not in {a.name for a in attrs.fields(Event)}))
def test_structure_refuses_unknown_keys(event: Event, extra: str) -> None:
    data = {**_serde.unstructure(event), extra: 1}
    with pytest.raises(ClassValidationError):
        _serde.structure(data, Event)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"max_depth": 0, "per_minute": 1}, "max_depth"),
        ({"max_depth": 1, "per_minute": -5}, "per_minute"),
        ({"max_depth": MAX_CAUSAL_DEPTH + 1, "per_minute": 1}, "max_depth"),
        ({"max_depth": 1, "per_minute": MAX_PER_MINUTE + 1}, "per_minute"),
    ],
)
def test_structuring_out_of_range_limits_is_refused_naming_the_key(data: dict[str, int], key: str) -> None:
    with pytest.raises(ClassValidationError) as excinfo:
        _serde.loads(json.dumps({"causal": data, "generation": 1}), Config)
    found: list[ConfigError] = []

    def collect(exc: BaseException) -> None:
        if isinstance(exc, ConfigError):
            found.append(exc)
        for inner in getattr(exc, "exceptions", ()):
            collect(inner)

    collect(excinfo.value)
    assert len(found) == 1
    assert found[0].key is not None
    assert found[0].key.endswith(key)
