"""The execution's fenced toolbelt, as procedures: emit, create child Work, arm a timer (executors must have trusted causal ancestry).

Every call presents the attempt's authority; its parent is the attempt's trigger, so everything an
execution derives stays on the trigger's causal chain and is charged to its root's budget.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..config import Budget, CausalLimits
from ..records.core_events import CORE_PREFIX, CORE_SOURCE, WORK_CREATED
from ..records.errors import Conflict, InvalidRequest
from ..records.events import CausalRejection, Event, EventIn
from ..records.ids import core_delivery_id, stable_id
from ..records.notices import WorkChanged
from ..records.timers import RecurrencePolicy, Timer, TimerSpec
from ..records.validation import check_keys, check_text, checked_event_fields, checked_payload
from ..records.waits import Waiting
from ..records.work import Execution, Work
from ..store import Tx
from ._common import require_work
from .accept import accept_derived_in_tx
from .authority import Authority, authorize
from .checkpoints import control_checkpoint
from .executions import KindPolicy, complete_in_tx
from .timers import arm_in_tx, timer_template, validate_spec


def emit_in_tx(
    tx: Tx, now_ms: int, auth: Authority, event: EventIn, limits: CausalLimits, cause_id: str | None = None
) -> Event | CausalRejection:
    """Emit a derived Event from the attempt's trigger, charged to the causal bounds."""
    execution = authorize(tx, now_ms, auth)
    checked = checked_payload(event)  # an execution may not emit the privileged core.* family
    work = require_work(tx, execution.work_id)
    if event.scope != work.scope:
        raise InvalidRequest(
            f"emit: event.scope {event.scope!r} is not the emitting work's scope {work.scope!r}",
            field="event.scope",
        )
    parent = _authority_parent(execution)
    return accept_derived_in_tx(
        tx, now_ms, event, parent, limits, cause_id=cause_id, execution_id=execution.id, checked=checked
    )


def create_child_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    name: str,
    keys: Sequence[str],
    kind: str | None,
    generation: int,
    limits: CausalLimits,
) -> Work | CausalRejection:
    """Create child Work in the parent's scope, atomically with its ``core.work.created`` Event."""
    check_text("create_child: name", name)
    keys = check_keys("create_child: keys", keys)
    check_text("create_child: kind", kind, optional=True)
    execution = authorize(tx, now_ms, auth)
    parent_work = require_work(tx, execution.work_id)
    child_id = stable_id("wk", parent_work.id, "child", name)
    existing = tx.work(child_id)
    if existing is not None:
        return existing
    for key in keys:
        owner = tx.key_owner(key)
        if owner is not None:
            raise Conflict(f"create_child: key {key!r} is already owned by work {owner}")
    created = accept_derived_in_tx(
        tx,
        now_ms,
        EventIn(
            source=CORE_SOURCE,
            delivery_id=core_delivery_id("work.created", child_id),
            type=WORK_CREATED,
            scope=parent_work.scope,
            payload={"parent": parent_work.id, "child": child_id, "name": name},
        ),
        _authority_parent(execution),
        limits,
        execution_id=execution.id,
    )
    if isinstance(created, CausalRejection):
        return created
    tx.insert_work(
        id=child_id,
        scope=parent_work.scope,
        kind=kind,
        parent_id=parent_work.id,
        predecessor_id=None,
        generation=generation,
        now_ms=now_ms,
    )
    for key in keys:
        tx.attach_key(key, child_id, created.seq, now_ms)
    control_checkpoint(tx, now_ms, created, child_id, "records the creation of a child work")
    tx.notify(WorkChanged(work_id=child_id))
    return require_work(tx, child_id)


def _authority_parent(execution: Execution) -> str:
    """What an execution's derived actions descend from: its causal authority (the wake bridge of a
    continuation), else its trigger."""
    parent = execution.authority_id or execution.trigger_id
    if parent is None:
        raise InvalidRequest(f"execution {execution.id} has no trigger to derive from")
    return parent


def arm_derived_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    spec: TimerSpec,
    policies: Mapping[str, RecurrencePolicy] | None = None,
) -> Timer:
    """Arm a timer under an execution's lease; it inherits the attempt's trigger as its parent,
    so its firing stays on the trigger's causal chain even days later."""
    execution = authorize(tx, now_ms, auth)
    # an execution may not schedule the privileged core.* family (a forged core.execution.timeout):
    # the template's fields are checked as an Event's (`validate_spec` checked its payload)
    validate_spec(spec)
    checked_event_fields(timer_template(spec, spec.delivery_id or spec.id))
    parent = _authority_parent(execution)
    work = tx.work(execution.work_id)
    assert work is not None
    if spec.scope != work.scope:
        raise InvalidRequest(f"timer.scope {spec.scope!r} is not the arming work's scope {work.scope!r}")
    existing = tx.timer(spec.id)
    if existing is not None and not _armed_by_work(tx, existing, work.id):
        # re-arming would recreate someone else's timer (a root schedule, its own deadline)
        raise Conflict(f"timer {spec.id!r} was not armed by an execution of work {work.id}")
    return arm_in_tx(tx, now_ms, spec, parent_id=parent, execution_id=execution.id, policies=policies)


def _armed_by_work(tx: Tx, timer: Timer, work_id: str) -> bool:
    if timer.execution_id is None or timer.type.startswith(CORE_PREFIX):
        return False
    armed_by = tx.execution(timer.execution_id)
    return armed_by is not None and armed_by.work_id == work_id


def park_on_call_in_tx(
    tx: Tx,
    now_ms: int,
    auth: Authority,
    waiting: Waiting,
    kind: KindPolicy,
    limits: CausalLimits,
    budgets: Sequence[Budget],
) -> str | None:
    """A call gate turned a toolbelt call into a wait: the attempt ends its segment on it exactly as a
    `Waiting` outcome would; returns the wait's id."""
    execution = complete_in_tx(tx, now_ms, auth, waiting, kind, limits, budgets)
    waits = [w for w in tx.waits_of_work(execution.work_id) if w.execution_id == execution.id]
    return waits[-1].id if waits else None
