"""Steps larger than their field (docs/schedules.md "Values, ranges, steps and lists"): APScheduler
(``test_invalid_ranges``) and Quartz refuse them, croniter reads the first value alone, and so does
loom, which accepted them before. And the "never occurs" message says why.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from loom import InvalidRequest
from loom.plugins.schedule import ScheduleSpec, next_occurrence


def utc_ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


FIRST: dict[str, Any] = {"seconds": "first"}


@pytest.mark.parametrize(
    ("cron", "fields", "first"),
    [
        ("*/61 * * * *", {}, "2024-01-01T01:00"),
        ("*/60 * * * *", {}, "2024-01-01T01:00"),
        ("0/120 0 8 ? * MON-FRI", FIRST, "2024-01-01T08:00:00"),
        ("0 */24 * * *", {}, "2024-01-02T00:00"),
        ("0 0 */32 * *", {}, "2024-02-01T00:00"),
        ("0 0 1 */13 *", {}, "2025-01-01T00:00"),
        ("0 0 * * */8", {}, "2024-01-07T00:00"),
    ],
)
def test_a_step_larger_than_its_field_names_its_first_value_alone(
    cron: str, fields: dict[str, Any], first: str
) -> None:
    """As croniter reads it (APScheduler and Quartz refuse it): catches such a step refused, which
    would make every schedule armed with it before fail at its next firing."""
    spec = ScheduleSpec(schedule_id="s", cron=cron, **fields)
    assert next_occurrence(spec, utc_ms("2024-01-01T00:00")) == utc_ms(first)


@pytest.mark.parametrize(
    ("cron", "fields", "first"),
    [
        # up to the field's last value, as Quartz accepts: the start alone, or two values
        ("*/59 * * * *", {}, "2024-01-01T00:59"),
        ("59/15 * * * *", {}, "2024-01-01T00:59"),  # documented: :59 only
        ("0 */23 * * *", {}, "2024-01-01T23:00"),
        ("0 0 */31 * *", {}, "2024-02-01T00:00"),
        ("0 0 1 */12 *", {}, "2025-01-01T00:00"),
        ("0 0 * * */7", {}, "2024-01-07T00:00"),
        ("0 0 * * 6/1", {}, "2024-01-06T00:00"),  # documented: Saturday only
        ("0 0 4-6/3 * *", {}, "2024-01-04T00:00"),  # APScheduler alone refuses a step past a range's end
        ("30/59 0 0 1 1 * 2024/500", FIRST, "2024-01-01T00:00:30"),  # years: any step
    ],
)
def test_a_step_up_to_its_field_s_last_value_is_accepted(
    cron: str, fields: dict[str, Any], first: str
) -> None:
    spec = ScheduleSpec(schedule_id="s", cron=cron, **fields)
    assert next_occurrence(spec, utc_ms("2024-01-01T00:00")) == utc_ms(first)


@pytest.mark.parametrize(
    ("cron", "fields", "message"),
    [
        ("0 0 0 29 2 * 2025-2027", FIRST, r"never occurs: the years it allows \(2025-2027\) hold no date it names$"),
        ("0 0 0 ? 2 SUN#5 2025-2031", FIRST, r"never occurs: the years it allows \(2025-2031\) hold no date it names$"),
        ("0 0 0 29 2 * 2025,2026,2097", FIRST, r"the years it allows \(2025,2026,2097\) hold no date it names$"),
        # where DST does play its part, the message still names the time zone and the gap policy
        ("0 30 2 31 3 * 2024", {**FIRST, "timezone": "Europe/Berlin", "dst_gap": "skip"},
         r"never occurs \(in time zone Europe/Berlin, with dst_gap skip\)$"),
    ],
)  # fmt: skip
def test_never_occurs_says_whether_the_years_or_the_dst_gap_leave_no_occurrence(
    cron: str, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as refused:
        ScheduleSpec(schedule_id="s", cron=cron, **fields)
    if "years" in message:
        assert "dst_gap" not in str(refused.value)
