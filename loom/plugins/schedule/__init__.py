"""Cron and calendar recurrence: the built-in ``schedule`` plugin.

Core supplies calendar recurrence as a hook: a recurring timer stores an opaque spec, and when it
fires, core asks the policy registered for its kind what to do. This package is that policy, as
pure, deterministic functions over integer Unix milliseconds (no clock, no I/O), so core may call
it inside the firing transaction.

A schedule is a `ScheduleSpec`: either a ``cron`` expression or a `Calendar` (local times of day on
chosen weekdays), read as local wall-clock time in an IANA ``timezone``. A cron expression has five
fields (minute hour day-of-month month day-of-week) or ``@daily``-style aliases; six or seven fields
carry seconds (and a year), and are refused unless ``seconds`` says where they are (`SecondsField`),
because other cron tools disagree.

Defaults, and what they mean:

* ``dst_gap="shift_forward"``: a local time that does not exist (the spring-forward gap, e.g.
  02:30 on the day clocks jump from 02:00 to 03:00) fires at the first instant after the gap
  (03:00 local). ``"skip"`` drops that day's occurrence instead.
* ``dst_fold="first"``: a local time that happens twice (the fall-back hour) fires once, at its
  first occurrence. ``"both"`` fires at each.
* ``catch_up_ms=6 h``: when a timer fires late (an outage, a clock jump), only the most recent
  due occurrence no older than six hours fires; every other due occurrence is recorded as
  skipped (a count and the first/last, never a list and never a burst). The next fire time is
  always in the future, however far the clock jumped.
* ``overlap="skip"``: an occurrence due while the previous run is still going is skipped;
  ``"buffer_one"`` keeps one to start when the run ends; ``"allow_all"`` keeps every one. (On a
  runtime, the ``schedule`` route handler runs a schedule as one standing Work, of the built-in
  standing kind ``schedule`` unless the route names another standing kind, which runs one attempt
  at a time: kept occurrences wait as its input, and the next attempt takes them all.)

Occurrence identity is deterministic: ``occurrence_id(schedule_id, occurrence_ms)`` is
``f"{schedule_id}@{occurrence_ms}"``, so a replayed or duplicated firing names the same occurrence.

The modules: `spec` (the spec and its validation), `cron` (cron expressions and their search),
`cron_fields` (what each cron field means, and where cron tools disagree), `calendar` (calendar
schedules), `instants` (local times to instants, DST) and `policy` (firing, overlap, the hooks).
The plugin manager registers this package by name, so the hook implementations are attributes here.
"""

from __future__ import annotations

from .calendar import WEEKDAYS as WEEKDAYS
from .calendar import Calendar as Calendar
from .cron import CronExpression as CronExpression
from .cron import SecondsField as SecondsField
from .cron import parse_cron as parse_cron
from .instants import HOUR_MS as HOUR_MS
from .instants import DstFold as DstFold
from .instants import DstGap as DstGap
from .instants import next_occurrence as next_occurrence
from .instants import occurrence_id as occurrence_id
from .instants import occurrences as occurrences
from .instants import previous_occurrence as previous_occurrence
from .policy import MAX_COUNTED_SKIPS as MAX_COUNTED_SKIPS
from .policy import SCHEDULE_KIND as SCHEDULE_KIND
from .policy import FiringPlan as FiringPlan
from .policy import OverlapAction as OverlapAction
from .policy import PlanPolicy as PlanPolicy
from .policy import calendar_policy as calendar_policy
from .policy import cron_policy as cron_policy
from .policy import loom_recurrence_policies as loom_recurrence_policies
from .policy import loom_route_handlers as loom_route_handlers
from .policy import loom_work_kinds as loom_work_kinds
from .policy import overlap_decision as overlap_decision
from .policy import plan_firing as plan_firing
from .policy import schedule_handler as schedule_handler
from .policy import schedule_key as schedule_key
from .policy import schedule_timer as schedule_timer
from .spec import DEFAULT_CATCH_UP_MS as DEFAULT_CATCH_UP_MS
from .spec import Overlap as Overlap
from .spec import ScheduleSpec as ScheduleSpec
from .spec import spec_from_mapping as spec_from_mapping
