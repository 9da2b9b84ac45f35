"""`Runtime.check`: what the configuration in force gets wrong, with the schedules the store holds
(``loom config check``, and ``loom serve`` at start: see `loom.config.check`)."""

from __future__ import annotations

from ..config import Config
from ..config._keys import key_path
from ..config.check import ArmedSchedule, Finding, check_config, check_schedules
from ..plugins.registry import Extensions
from ..records.timers import TimerState
from ..records.validation import describe_exception
from ..store import Reader
from ._base import RuntimeBase

MAX_SCHEDULES = 10_000
"""The most armed recurring timers a check reads (beyond them it says so)."""


class Checks(RuntimeBase):
    async def check(self, *, schedules: bool = True) -> list[Finding]:
        """Routes whose Work nothing can start, bindings, Work kinds and scopes nothing uses, and (with
        ``schedules``) schedules that never start anything: an armed recurring timer whose Event no
        route takes, a schedule route nothing feeds, a schedule found invalid. Nothing is changed."""
        return await findings(self._p.config(), self._p.extensions, self._p.reader if schedules else None)


async def findings(config: Config, extensions: Extensions, reader: Reader | None) -> list[Finding]:
    """What `Runtime.check` reports, for ``config`` under ``extensions``, with the schedules ``reader``
    holds (``None``: the configuration alone)."""
    found = check_config(
        config, standing_handlers=extensions.standing_handlers(), plugin_kinds=tuple(extensions.work_kinds)
    )
    found += _binding_findings(config, extensions)
    if reader is None:
        return found
    armed: list[ArmedSchedule] = []
    after = ""
    while True:
        page = await reader.timers(state=TimerState.ARMED.value, after_id=after, limit=1000)
        armed += [
            ArmedSchedule(timer_id=t.id, type=t.type, scope=t.scope)
            for t in page
            if t.recurrence is not None or t.interval_ms is not None
        ]
        if len(page) < 1000:
            break
        if len(armed) >= MAX_SCHEDULES:
            found.append(
                Finding(
                    key="timers",
                    message=f"more than {MAX_SCHEDULES} recurring timers: only those were checked",
                )
            )
            break
        after = page[-1].id
    found += check_schedules(
        config, armed, schedule_handlers=set(extensions.standing_handlers()) or ("schedule",)
    )
    invalid = await reader.timers(state=TimerState.INVALID.value, after_id="", limit=100)
    found += [
        Finding(
            key=f"timers.{t.id}",
            message=f"schedule {t.id!r} is invalid and will never fire again: {t.reason or 'no reason kept'}",
        )
        for t in invalid
        if t.recurrence is not None or t.interval_ms is not None
    ]
    return found


def _binding_findings(config: Config, extensions: Extensions) -> list[Finding]:
    """What each binding's executor reports of its ``config`` through its optional ``check_config``
    (`loom.records.executor`): a finding each, under the binding's key. A check that raises is a
    finding too, naming the executor."""
    found: list[Finding] = []
    for scope, declared in sorted(config.scopes.items()):
        for name, binding in sorted(declared.bindings.items()):
            check = getattr(extensions.executors.get(binding.executor), "check_config", None)
            if check is None:
                continue
            where = key_path("scopes", scope, "bindings", name, "config")
            try:
                said = [str(line) for line in check(binding.config)]
            except Exception as exc:
                said = [f"executor {binding.executor!r} could not check it: {describe_exception(exc)}"]
            found += [Finding(key=where, message=line) for line in said]
    return found
