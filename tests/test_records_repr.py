"""A record's repr shows each instant as ISO 8601 UTC beside its milliseconds (logs, test failures)."""

from __future__ import annotations

import attrs
import pytest

import loom
from loom.records.reprs import instant

T9 = 1_767_258_000_000  # 2026-01-01T09:00:00Z


def test_an_instant_shows_its_iso_time_beside_the_milliseconds() -> None:
    assert instant(T9) == "1767258000000 (2026-01-01T09:00:00Z)"
    assert instant(T9 + 5) == "1767258000005 (2026-01-01T09:00:00.005Z)"
    assert instant(None) == "None"
    assert instant(-1) == "-1"


@pytest.mark.parametrize("cls", [loom.Event, loom.Work, loom.Timer, loom.Firing, loom.Wait, loom.Checkpoint,
                                 loom.Execution, loom.Diagnostic])  # fmt: skip
def test_every_instant_field_of_a_record_reads_as_a_time(cls: type) -> None:
    """Catches a record whose repr prints raw milliseconds, or drops a field."""
    names = [f.name for f in attrs.fields(cls)]
    assert any(name.endswith("at_ms") for name in names), cls
    record = object.__new__(cls)
    for f in attrs.fields(cls):
        object.__setattr__(record, f.name, T9 if f.name.endswith("at_ms") else f"<{f.name}>")
    text = repr(record)
    assert text.startswith(f"{cls.__name__}(")
    for name in names:
        expected = "1767258000000 (2026-01-01T09:00:00Z)" if name.endswith("at_ms") else f"'<{name}>'"
        assert f"{name}={expected}" in text, (name, text)
