"""The documented limits of public input at their edges (`loom.records.validation`; docs/architecture.md,
"Input is checked at every public entry"): the last valid value of each limit is accepted and the first
invalid one is refused with `InvalidRequest` naming the field. These are the pure checks every entry
point and kernel procedure calls; `test_acceptance` and `test_robustness` show that a refused call
stores nothing. Each test names the rule and the wrong implementations it catches.
"""

from __future__ import annotations

from typing import Any

import pytest

from loom import Config, ConfigError, EventIn, InvalidRequest, ManualClock, TimerSpec, open_runtime
from loom.records.validation import (
    MAX_ID_LEN,
    MAX_INT,
    MAX_KEY_LEN,
    MAX_PAYLOAD_DEPTH,
    MAX_REASON_LEN,
    MAX_TIME_MS,
    MIN_INT,
    check_int,
    check_reason,
    check_time,
    payload_json,
    validate_event_in,
)


def event(**fields: Any) -> EventIn:
    values: dict[str, Any] = {"source": "github", "delivery_id": "d-1", "type": "pr.opened", "scope": "acme"}
    return EventIn(**{**values, **fields})


def refused(field: str, call: Any, *args: Any, **kwargs: Any) -> None:
    with pytest.raises(InvalidRequest) as excinfo:
        call(*args, **kwargs)
    assert excinfo.value.field == field


def nested(levels: int) -> dict[str, Any]:
    """A JSON object ``levels`` objects deep (the payload itself is the first level)."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"d": value}
    return value


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("source", MAX_ID_LEN),
        ("delivery_id", MAX_ID_LEN),
        ("work_id", MAX_ID_LEN),
        ("key", MAX_KEY_LEN),
        ("type", MAX_ID_LEN),
        ("scope", MAX_ID_LEN),
    ],
)
def test_an_event_field_may_be_as_long_as_its_limit_and_no_longer(name: str, limit: int) -> None:
    """Ids, sources, types and scopes are at most 200 characters, keys 500. Catches a limit compared with
    ``>=`` (the longest valid value refused), one too loose (201 admitted), and a key held to the id
    limit."""
    assert getattr(validate_event_in(event(**{name: "a" * limit})), name) == "a" * limit
    refused(f"event.{name}", validate_event_in, event(**{name: "a" * (limit + 1)}))


@pytest.mark.parametrize("code", [*range(32), 127])
def test_every_control_character_is_refused_in_text(code: int) -> None:
    """Text holds no control character: NUL to 0x1f, and DEL. Catches a check that forgets DEL, starts
    after NUL, or stops short of 0x1f."""
    refused("event.delivery_id", validate_event_in, event(delivery_id=f"d{chr(code)}1"))


def test_printable_text_around_the_control_characters_is_accepted() -> None:
    """The characters just outside the control ranges are ordinary text (space inside, ``~``, non-ASCII)."""
    for text in ("d 1", "d~1", "d\x801", "dé1"):
        assert validate_event_in(event(delivery_id=text)).delivery_id == text


def test_a_reason_may_be_2000_characters_of_valid_unicode_and_not_blank() -> None:
    """A reason is valid Unicode, not blank, at most 2,000 characters; surrounding spaces are its own
    business. Catches the length compared with ``>=`` or one too loose, a blank reason (only spaces)
    admitted, and a lone surrogate admitted (it could not be stored as UTF-8)."""
    assert check_reason("reason", "r" * MAX_REASON_LEN) == "r" * MAX_REASON_LEN
    assert check_reason("reason", " why ") == " why "
    refused("reason", check_reason, "reason", "r" * (MAX_REASON_LEN + 1))
    refused("reason", check_reason, "reason", " \t ")
    refused("reason", check_reason, "reason", "why \ud800")


def test_integer_ranges_include_both_ends() -> None:
    """An integer argument lies from its low to its high end, both included, and is never a bool; a time
    is Unix milliseconds from 0 (the epoch itself) to the end of year 9999. Catches either end made
    exclusive, a bool taken for an integer, and times that start at 1."""
    assert check_int("limit", 1, 1, 10) == 1
    assert check_int("limit", 10, 1, 10) == 10
    refused("limit", check_int, "limit", 0, 1, 10)
    refused("limit", check_int, "limit", 11, 1, 10)
    refused("limit", check_int, "limit", True, 0, 10)
    assert check_time("at_ms", 0) == 0
    assert check_time("at_ms", MAX_TIME_MS) == MAX_TIME_MS
    refused("at_ms", check_time, "at_ms", -1)
    refused("at_ms", check_time, "at_ms", MAX_TIME_MS + 1)


def test_a_payload_may_nest_64_levels_and_carry_any_64_bit_integer() -> None:
    """A payload is at most 64 levels deep and its integers fit in 64 bits, both ends included; floats are
    finite. Catches the depth compared with ``>=`` or one too loose, a 64-bit end made exclusive, and an
    infinity admitted (only NaN refused)."""
    assert payload_json(nested(MAX_PAYLOAD_DEPTH))
    refused("event.payload" + ".d" * MAX_PAYLOAD_DEPTH, payload_json, nested(MAX_PAYLOAD_DEPTH + 1))
    assert payload_json({"ints": [MIN_INT, MAX_INT]}) == f'{{"ints":[{MIN_INT},{MAX_INT}]}}'
    for bad in (MIN_INT - 1, MAX_INT + 1, float("inf"), float("-inf"), float("nan")):
        refused("event.payload.x", payload_json, {"x": bad})


def test_a_payload_may_be_exactly_as_large_as_its_limit() -> None:
    """The size limit counts the canonical JSON text: a payload of exactly ``max_bytes`` is accepted, one
    byte more is refused. Catches the size compared with ``>=`` or one too loose."""
    text = '{"x":"aaaa"}'
    assert payload_json({"x": "aaaa"}, max_bytes=len(text)) == text
    refused("event.payload", payload_json, {"x": "aaaaa"}, max_bytes=len(text))


HUGE = 10**4300
"""An integer of 4,301 digits: Python refuses to write one this long as text (`sys.get_int_max_str_digits`),
so a message that shows it with ``repr`` or an f-string raises a bare `ValueError` instead."""


@pytest.mark.parametrize("huge", [HUGE, -HUGE, [HUGE]], ids=["positive", "negative", "in-a-list"])
def test_an_integer_too_long_to_write_is_refused_naming_its_field(huge: Any) -> None:
    """An integer of any length is input like any other: refused with `InvalidRequest` (or `ConfigError`)
    naming the field, its size described rather than written out. Catches a refusal whose message
    writes the value (Python raises `ValueError` for more than 4,300 digits, which escapes the API)."""
    refused("event.payload.n" + ("[0]" if isinstance(huge, list) else ""), payload_json, {"n": huge})
    if isinstance(huge, int):
        refused("limit", check_int, "limit", huge, 1, 10)
        refused("at_ms", check_time, "at_ms", huge)
        with pytest.raises(InvalidRequest, match="integer of about 4,301 digits"):
            check_int("limit", huge, 1, 10)
    with pytest.raises(ConfigError, match=r"causal\.max_depth"):
        Config.from_dict({"causal": {"max_depth": huge}})
    with pytest.raises(ConfigError, match=r"budgets\[0\]\.limit"):
        Config.from_dict({"budgets": [{"name": "u", "unit": "u", "limit": huge}]})
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.from_toml(f"[causal]\nmax_depth = {'9' * 4301}")


async def test_a_host_call_given_an_integer_too_long_to_write_refuses_it_and_stores_nothing(
    loom_store: str, clock: ManualClock
) -> None:
    """At the public entries: publishing such a payload, and integer arguments of reads and timers, are
    refused with `InvalidRequest` and store nothing. Catches any entry whose refusal writes the value."""
    async with open_runtime(loom_store, clock=clock, actors=(), load_entry_points=False) as rt:
        with pytest.raises(InvalidRequest, match=r"event\.payload\.n holds an integer outside 64 bits"):
            await rt.publish(event(payload={"n": HUGE}))
        with pytest.raises(InvalidRequest, match="after_seq"):
            await rt.events(after_seq=HUGE)
        with pytest.raises(InvalidRequest, match="limit"):
            await rt.due(limit=HUGE)
        with pytest.raises(InvalidRequest, match="state"):
            await rt.works(state=HUGE)  # type: ignore[arg-type]
        spec = TimerSpec(id="t", fire_at_ms=HUGE, source="s", type="t.t", scope="acme")
        with pytest.raises(InvalidRequest, match=r"timer\.fire_at_ms"):
            await rt.arm(spec)
        assert await rt.events() == []
        assert await rt.timers() == []


async def test_a_browsing_reads_bad_key_prefix_is_refused_naming_key_prefix(clock: ManualClock) -> None:
    """`Runtime.works_changed`'s ``key_prefix`` is checked as itself. Catches: the check of a key
    reused under the name ``key`` (the message and the error's field name an argument the call has
    not)."""
    async with open_runtime(":memory:", clock=clock, actors=(), load_entry_points=False) as rt:
        for bad in ("", "a\x00b", 7):
            with pytest.raises(InvalidRequest) as excinfo:
                await rt.works_changed(key_prefix=bad)  # type: ignore[arg-type]
            assert excinfo.value.field == "key_prefix"
            assert "key_prefix" in str(excinfo.value)
        assert await rt.works_changed(key_prefix="order/") == []
