"""Firing a schedule: the catch-up plan, the overlap policy, core's recurrence hook and the route handler.

Core asks the policy registered for a recurring timer's kind what to do when the timer fires; the
answer is computed here from the stored spec alone (pure, deterministic), so a replayed firing
gets the same answer.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ...config.model import WorkKindPolicy
from ...records.errors import InvalidRequest
from ...records.events import Event
from ...records.ids import stable_id
from ...records.timers import Occurrence, RecurrencePolicy, Replacement, Skip, Timer, TimerSpec
from ...records.work import Decision, Deliver, Drop, Unmatched, Work
from .._manager import hookimpl
from .instants import check_instant, forward, next_occurrence, occurrence_id, occurrences, previous_occurrence
from .spec import Overlap, ScheduleSpec, spec_from_mapping, to_overlap

MAX_COUNTED_SKIPS = 1000
"""A firing counts at most this many skipped occurrences (see `FiringPlan.skipped_count_truncated`)."""


class OverlapAction(enum.StrEnum):
    """`overlap_decision`'s answer."""

    START = "start"
    BUFFER = "buffer"
    SKIP = "skip"


@attrs.frozen(kw_only=True)
class FiringPlan:
    """What to do when the timer armed for ``scheduled_ms`` fires at ``now_ms``.

    The due occurrences are ``scheduled_ms`` and every occurrence in ``(scheduled_ms, now_ms]``.
    At most one of them fires (``fire_ms``); the rest are skipped, summarised by a count and the
    first and last skipped instants. ``next_ms`` (always > ``now_ms``) is when to arm the timer
    again, or ``None`` when the schedule has no occurrence after ``now_ms`` (it ended, e.g. its
    last named year is over): the due occurrence still fires, and nothing replaces the timer.
    """

    schedule_id: str
    scheduled_ms: int
    now_ms: int
    fire_ms: int | None
    """The occurrence to fire now: the latest due one within the catch-up window, if any."""
    skipped_count: int
    """Due occurrences not fired (counted up to `MAX_COUNTED_SKIPS`)."""
    skipped_count_truncated: bool
    """True when there were more skipped occurrences than were counted."""
    skipped_first_ms: int | None
    skipped_last_ms: int | None
    next_ms: int | None

    @property
    def occurrence_id(self) -> str | None:
        """The identity of the occurrence that fires now, if one does."""
        return None if self.fire_ms is None else occurrence_id(self.schedule_id, self.fire_ms)

    @property
    def next_occurrence_id(self) -> str | None:
        """The identity of the occurrence the re-armed timer is for (``None`` if the schedule ended)."""
        return None if self.next_ms is None else occurrence_id(self.schedule_id, self.next_ms)


def plan_firing(spec: ScheduleSpec, scheduled_ms: int, now_ms: int) -> FiringPlan:
    """Plan the firing of the timer armed for ``scheduled_ms`` (an occurrence) at ``now_ms``.

    A timer armed for an instant that is no occurrence of ``spec`` (armed as it is, `POST /timers`
    with any ``fire_at_ms``) is for the schedule's first occurrence from that instant on: none fires
    before it (the plan fires nothing and arms the timer again for it: ``next_ms``).
    """
    for name, value in (("scheduled_ms", scheduled_ms), ("now_ms", now_ms)):
        check_instant("plan_firing", name, value)
    if now_ms < scheduled_ms:
        raise InvalidRequest(
            f"schedule {spec.schedule_id!r}: a timer armed for {scheduled_ms} cannot fire earlier, at {now_ms}"
        )
    first = next(forward(spec, scheduled_ms - 1), None)
    if first != scheduled_ms:
        if first is None or first > now_ms:
            return FiringPlan(
                schedule_id=spec.schedule_id,
                scheduled_ms=scheduled_ms,
                now_ms=now_ms,
                fire_ms=None,
                skipped_count=0,
                skipped_count_truncated=False,
                skipped_first_ms=None,
                skipped_last_ms=None,
                next_ms=first,
            )
        scheduled_ms = first
    latest = previous_occurrence(spec, now_ms + 1)
    latest_due = latest if latest is not None and latest > scheduled_ms else scheduled_ms
    fire_ms = latest_due if latest_due >= now_ms - spec.catch_up_ms else None

    count, truncated, first, last = 0, False, None, None
    if fire_ms != scheduled_ms:
        first = scheduled_ms
        if fire_ms is None:
            last = latest_due
        else:
            before_fire = previous_occurrence(spec, fire_ms)
            last = before_fire if before_fire is not None and before_fire > scheduled_ms else scheduled_ms
        count = 1
        for _ in occurrences(spec, scheduled_ms, last):
            if count == MAX_COUNTED_SKIPS:
                truncated = True
                break
            count += 1
    return FiringPlan(
        schedule_id=spec.schedule_id,
        scheduled_ms=scheduled_ms,
        now_ms=now_ms,
        fire_ms=fire_ms,
        skipped_count=count,
        skipped_count_truncated=truncated,
        skipped_first_ms=first,
        skipped_last_ms=last,
        next_ms=next(forward(spec, now_ms), None),
    )


def overlap_decision(spec: ScheduleSpec, running: int, buffered: int) -> OverlapAction:
    """Whether an occurrence due now starts, waits in the buffer, or is skipped.

    ``running`` is how many runs of the schedule are still going, ``buffered`` how many
    occurrences already wait for them to end.
    """
    for name, value in (("running", running), ("buffered", buffered)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequest(f"overlap_decision: {name} must be a non-negative integer, got {value!r}")
    return _overlap_action(spec.overlap, running, buffered)


def _overlap_action(overlap: Overlap, running: int, buffered: int) -> OverlapAction:
    if running == 0 or overlap is Overlap.ALLOW_ALL:
        return OverlapAction.START
    if overlap is Overlap.BUFFER_ONE and buffered == 0:
        return OverlapAction.BUFFER
    return OverlapAction.SKIP


# --- The hooks ----------------------------------------------------------------------------------

PlanPolicy = Callable[[int, int, Mapping[str, Any]], FiringPlan]


def _plan_policy(kind: str) -> PlanPolicy:
    def policy(timer_fire_at_ms: int, now_ms: int, spec: Mapping[str, Any]) -> FiringPlan:
        parsed = spec_from_mapping(spec)
        if parsed.kind != kind:
            raise InvalidRequest(f"schedule {parsed.schedule_id!r}: a {kind} timer needs a {kind} spec")
        return plan_firing(parsed, timer_fire_at_ms, now_ms)

    policy.__name__ = policy.__qualname__ = f"{kind}_policy"
    policy.__doc__ = f"The {kind} recurrence policy: `plan_firing` over a stored {kind} spec."
    return policy


cron_policy = _plan_policy("cron")
calendar_policy = _plan_policy("calendar")


def _core_policy(plan_policy: PlanPolicy) -> RecurrencePolicy:
    """Core's recurrence contract over a plan: the occurrence (or a skip) and the replacement."""

    def policy(
        timer: Timer, now_ms: int, spec: Mapping[str, Any]
    ) -> tuple[Occurrence | Skip, Replacement | None]:
        plan = plan_policy(timer.fire_at_ms, now_ms, spec)
        # A schedule that ended has no replacement: core settles the timer once this firing is done.
        replacement = None
        if plan.next_ms is not None and plan.next_occurrence_id is not None:
            replacement = Replacement(fire_at_ms=plan.next_ms, delivery_id=plan.next_occurrence_id)
        skipped = {
            "skipped": plan.skipped_count,
            "skipped_truncated": plan.skipped_count_truncated,  # (then at least that many)
            "skipped_first_ms": plan.skipped_first_ms,
            "skipped_last_ms": plan.skipped_last_ms,
        }
        if plan.fire_ms is None and plan.skipped_count == 0:
            reason = (
                f"armed for {plan.scheduled_ms}, which is no occurrence of schedule {plan.schedule_id!r}"
                + (
                    f": it fires first at its first occurrence, {plan.next_ms}"
                    if plan.next_ms
                    else ", nor is any later"
                )
            )
            return Skip(reason=reason, skipped=0), replacement
        if plan.fire_ms is None or plan.occurrence_id is None:
            many = (
                f"at least {plan.skipped_count}" if plan.skipped_count_truncated else str(plan.skipped_count)
            )
            reason = f"{many} occurrence(s) older than the catch-up window were skipped"
            return Skip(reason=reason, skipped=plan.skipped_count), replacement
        payload = {"schedule": plan.schedule_id, "overlap": str(spec.get("overlap", Overlap.SKIP)), **skipped}
        return Occurrence(
            occurrence_ms=plan.fire_ms, delivery_id=plan.occurrence_id, payload=payload
        ), replacement

    return policy


@hookimpl
def loom_recurrence_policies() -> Mapping[str, RecurrencePolicy]:
    return {"cron": _core_policy(cron_policy), "calendar": _core_policy(calendar_policy)}


SCHEDULE_KIND = "schedule"
"""The standing Work kind a ``schedule`` route's Work takes when the route names none."""


def schedule_handler(event: Event, scope: str, work: Work | None, route: Any) -> Decision:
    """Route handler ``schedule``: one standing Work per schedule, with the overlap policy.

    Each occurrence is a run: the Work is standing (a completed run leaves it ready for the next
    occurrence). A route without ``work_kind`` uses the built-in standing kind ``schedule``; a route
    that names a kind must name a standing one, or the configuration is refused.

    An occurrence for a schedule whose previous run is still going is delivered (allow all),
    delivered as the one buffered run (buffer one), or dropped (skip). A delivered occurrence gets
    the route's active-event policy; with ``queue`` it waits, and the next attempt takes every
    waiting occurrence as its input.
    """
    schedule_id = event.payload.get("schedule")
    if not isinstance(schedule_id, str):
        return Unmatched(reason="not a schedule occurrence (no schedule in its payload)")
    overlap = to_overlap(event.payload.get("overlap", Overlap.SKIP))
    running = 1 if work is not None and work.current_execution_id is not None else 0
    # A running attempt's inputs stay pending until it ends, and the snapshot does not say which
    # they are: count the one occurrence it started with as taken, the rest as buffered.
    pending = len(work.pending_inputs) if work is not None else 0
    buffered = max(pending - running, 0)
    action = _overlap_action(overlap, running, buffered)
    if action is OverlapAction.SKIP:
        return Drop(reason=f"schedule {schedule_id}: the previous run is still going (overlap {overlap})")
    key = schedule_key(schedule_id)
    if work is not None:
        return Deliver(work_id=work.id, attach_keys=(key,))
    return Deliver(
        work_id=stable_id("wk", scope, key),
        create=True,
        attach_keys=(key,),
        kind=route.route.work_kind or SCHEDULE_KIND,
    )


schedule_handler.standing_work_kind = SCHEDULE_KIND  # type: ignore[attr-defined]
schedule_handler.pure = True  # type: ignore[attr-defined]


@hookimpl
def loom_route_handlers() -> Mapping[str, Any]:
    return {"schedule": schedule_handler}


@hookimpl
def loom_work_kinds() -> Mapping[str, WorkKindPolicy]:
    return {SCHEDULE_KIND: WorkKindPolicy(standing=True)}


def schedule_key(schedule_id: str) -> str:
    """The key of a schedule's Work; its occurrences carry it, so the router hands the handler that
    Work's snapshot (and routes one schedule's occurrences in order)."""
    return f"schedule/{schedule_id}"


def schedule_timer(
    spec: ScheduleSpec,
    *,
    now_ms: int,
    source: str,
    type: str,
    scope: str,
    payload: Mapping[str, Any] | None = None,
) -> TimerSpec:
    """A root recurrence timer for ``spec``, armed for its next occurrence after ``now_ms``."""
    first = next_occurrence(spec, now_ms)
    return TimerSpec(
        id=f"schedule:{spec.schedule_id}", fire_at_ms=first, source=source, type=type, scope=scope,
        key=schedule_key(spec.schedule_id), payload=dict(payload or {}), delivery_id=spec.schedule_id,
        recurrence=spec.kind, spec=spec.to_mapping(),
    )  # fmt: skip
