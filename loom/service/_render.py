"""Rendering for the command line: times in local time with their offset and a relative form, records
as aligned lines and tables.

The server's JSON is shown as it comes, each string in it through `printable` (a control character
shown escaped, so one field stays on one line), with every instant (a key ending in ``at_ms``, such as
``fire_at_ms`` or ``accepted_at_ms``) written as local time with its UTC offset and how far it is
from now (``2026-01-01 10:00:00+01:00 (in 4 min)``) instead of Unix milliseconds. ``--json`` prints
the milliseconds as they are.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..records.reprs import iso_utc, utc_moment

MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What a terminal does not show as itself: the C0 controls (newline, CR, tab, BEL, ESC, ...), DEL,
the C1 controls, the line and paragraph separators, and the bidirectional embeddings, overrides and
isolates (which reorder what a line shows)."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(value: object, keep: str = "") -> str:
    """``str(value)`` safe to print: each character of `_UNSAFE` not in ``keep`` shown escaped as
    Python writes it (``\\n``, ``\\x1b``, ``\\u202e``).

    Every string the server answers (a hold reason, a function's error, a diagnostic) holds what
    someone sent. Printed raw, a newline in it forges a line of the CLI's own (``state  completed``),
    a CR overwrites what came before it, and an escape sequence drives the terminal. Human output
    shows each through this one function, so one field stays one field on one line; ``--json``
    prints the answer as it is."""
    text = str(value)
    return _UNSAFE.sub(lambda found: _escaped(found.group(), keep), text)


def _escaped(char: str, keep: str) -> str:
    if char in keep:
        return char
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def iso(ms: int) -> str:
    """Unix milliseconds as ISO 8601 UTC (``2026-01-01T09:00:00Z``; milliseconds only when there are);
    an instant no date can show as its milliseconds (``253402300800999 ms``)."""
    return iso_utc(ms, whole_seconds=True) or f"{ms} ms"


def local(ms: int) -> str:
    """Unix milliseconds as local time with its UTC offset (``2026-01-01 10:00:00+01:00``; the
    machine's zone, or ``TZ``; milliseconds only when there are). Exact (integer arithmetic); an
    instant no date can show, here or in the local zone, as its milliseconds (``253402300800999 ms``)."""
    moment = utc_moment(ms)
    try:
        shown = None if moment is None else moment.astimezone()
    except (OverflowError, OSError, ValueError):  # the local zone's offset takes it past year 9999
        shown = None
    if shown is None:
        return f"{ms} ms"
    return shown.isoformat(sep=" ", timespec="milliseconds" if ms % 1000 else "seconds")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def relative(ms: int, now: int) -> str:
    """How far ``ms`` is from ``now``: ``in 4 min``, ``3 s ago``, ``now``."""
    delta = ms - now
    size = abs(delta)
    if size < 1000:
        return "now"
    for unit, width in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if size >= width:
            amount = size // width
            text = f"{amount} {unit}"
            break
    return f"in {text}" if delta > 0 else f"{text} ago"


def when(ms: object, now: int | None = None) -> str:
    """An instant for a person: local time with its offset and its relative form; ``-`` for none."""
    if not _is_ms(ms):
        return "-" if ms is None else printable(ms)
    assert isinstance(ms, int)
    return f"{local(ms)} ({relative(ms, now_ms() if now is None else now)})"


def is_instant_key(key: str) -> bool:
    return key.endswith("at_ms")


def humanize(value: Any, key: str = "", now: int | None = None) -> Any:
    """``value`` with every instant under an ``*at_ms`` key as `when` shows it (the key loses ``_ms``)."""
    now = now_ms() if now is None else now
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for name, item in value.items():
            name = str(name)
            if is_instant_key(name) and _is_ms(item):
                out[name.removesuffix("_ms")] = when(item, now)
            else:
                out[name] = humanize(item, name, now)
        return out
    if isinstance(value, list | tuple):
        return [humanize(item, key, now) for item in value]
    return value


def humanize_rows(rows: Sequence[Any]) -> list[dict[str, Any]]:
    now = now_ms()
    return [humanize(row, now=now) for row in rows if isinstance(row, Mapping)]


def _is_ms(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MS


def items_of(answer: Any, *names: str) -> list[Any]:
    """The list in an answer: the answer itself, or its first list under one of ``names``."""
    if isinstance(answer, list):
        return answer
    if isinstance(answer, Mapping):
        for name in names:
            if isinstance(answer.get(name), list):
                return list(answer[name])
        for value in answer.values():
            if isinstance(value, list):
                return list(value)
    return []


def scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(scalar(item) for item in value) or "-"
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True) if value else "-"  # (ASCII: escapes every control)
    return printable(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """Aligned columns (``(heading, key)`` pairs) over already humanized rows."""
    cells = [[heading.upper() for heading, _ in columns]]
    cells += [[scalar(row.get(key)) for _, key in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
                     for line in cells)  # fmt: skip


def block(record: Mapping[str, Any], indent: str = "") -> str:
    """A humanized record as ``key  value`` lines; nested records and lists of records indented."""
    width = max((len(printable(key)) for key in record), default=0)
    lines: list[str] = []
    for name, value in record.items():
        key = printable(name)
        if isinstance(value, Mapping) and value:
            lines.append(f"{indent}{key}:")
            lines.append(block(value, indent + "  "))
        elif isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
            lines.append(f"{indent}{key}:")
            for item in value:
                lines.append(
                    f"{indent}  - " + "  ".join(f"{printable(k)}={scalar(v)}" for k, v in item.items())
                )
        else:
            lines.append(f"{indent}{key.ljust(width)}  {scalar(value)}")
    return "\n".join(lines)


def work_view(answer: Mapping[str, Any]) -> str:
    """``GET /work/{id}`` for a person: the Work, its wait, pending input, timers and history."""
    view = humanize(answer)
    work = view.get("work")
    if not isinstance(work, Mapping):
        return block(view)
    held = f"yes: {work.get('hold_reason') or '-'}" if work.get("held") else "no"
    fields = {
        "state": work.get("state"),
        "scope": work.get("scope"),
        "kind": work.get("kind"),
        "keys": work.get("keys"),
        "held": held,
        "attempts": work.get("attempts"),
        "retry": work.get("retry"),
        "created": work.get("created_at"),
    }
    result = view.get("result") if isinstance(view.get("result"), Mapping) else {}
    if result.get("next_retry_at"):
        fields["retry"] = f"{work.get('retry')}: the next attempt at {result['next_retry_at']}"
    if work.get("blocked"):
        fields["blocked"] = work["blocked"]
    if result.get("error"):
        fields["last error"] = result["error"]
    if result.get("value") is not None:
        fields["value"] = json.dumps(result["value"], sort_keys=True)
    p = printable
    lines = [f"work {p(work.get('id'))}", block(fields, "  ")]
    wait = view.get("wait")
    if isinstance(wait, Mapping):
        types = scalar(wait.get("types")) if wait.get("types") else "any type"
        timeout = f", times out at {p(wait['timeout_at'])}" if wait.get("timeout_at") else ""
        lines.append(f"  wait      {p(wait.get('id'))}: {p(wait.get('state'))}, for {types}{timeout}")
    pending = [e for e in view.get("pending_inputs") or () if isinstance(e, Mapping)]
    if pending:
        lines.append("pending input:")
        lines += [
            f"  {p(e.get('accepted_at', '-'))}  {p(e.get('id'))}  {p(e.get('type'))}  seq {p(e.get('seq'))}"
            for e in pending
        ]
    timers = [t for t in view.get("timers") or () if isinstance(t, Mapping)]
    if timers:
        lines.append("timers:")
        lines += [
            f"  {p(t.get('id'))}  {p(t.get('state'))}  fires at {p(t.get('fire_at', '-'))}" for t in timers
        ]
    diagnostics = [d for d in view.get("diagnostics") or () if isinstance(d, Mapping)]
    if diagnostics:
        lines.append("diagnostics (newest first):")
        lines += [
            f"  {p(d.get('at', '-'))}  {p(d.get('kind'))}: {p(d.get('message'))}" for d in diagnostics[:5]
        ]
    history = view.get("history")
    if isinstance(history, Mapping):
        checkpoints = [c for c in history.get("checkpoints") or () if isinstance(c, Mapping)]
        executions = [x for x in history.get("executions") or () if isinstance(x, Mapping)]
        if checkpoints:
            lines.append("routed events:")
            for c in checkpoints:
                route = f" by route {p(c['route'])}" if c.get("route") else ""
                reason = f": {p(c['reason'])}" if c.get("reason") else ""
                lines.append(
                    f"  {p(c.get('at', '-'))}  {p(c.get('event_id'))}  {p(c.get('status'))}{route}{reason}"
                )
        if executions:
            lines.append("attempts:")
            for x in executions:
                outcome = x.get("outcome") if isinstance(x.get("outcome"), Mapping) else {}
                error = f": {p(outcome['error'])}" if outcome and outcome.get("error") else ""
                ended = f" -> {p(x['ended_at'])}" if x.get("ended_at") else ""
                started = p(x.get("created_at", "-"))
                state = p(attempt_state(x))
                lines.append(f"  {p(x.get('attempt'))}  {p(x.get('id'))}  {state}  {started}{ended}{error}")
    return "\n".join(lines)


def attempt_state(execution: Mapping[str, Any]) -> Any:
    """How an attempt stands or ended, as ``loom_attempts_ended_total``'s ``outcome`` tells it: its
    state, except ``interrupted`` for one an interrupt stopped (recorded ``cancelled`` with the outcome
    ``{"kind": "interrupted"}``; ``cancelled`` is left for an attempt cancelled with its Work),
    ``not_adoptable`` for a failure its recovery recorded (its executor could not verify it after its
    lease was lost) and ``timed_out`` for one failed at its execution deadline."""
    outcome = execution.get("outcome")
    state = execution.get("state")
    if isinstance(outcome, Mapping):
        if state == "cancelled" and outcome.get("kind") == "interrupted":
            return "interrupted"
        if state == "failed" and outcome.get("recovery"):
            return "not_adoptable"
        if state == "failed" and "timeout_event_id" in outcome:
            return "timed_out"
    return state
