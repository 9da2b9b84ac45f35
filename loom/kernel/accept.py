"""Acceptance: durable, deduplicated Events with a strictly increasing sequence, and the causation
they cite (docs/concepts.md).

An acknowledgement means committed: the caller hears back only after the batch that
holds these procedures commits.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ..config import CausalLimits
from ..records.errors import InvalidRequest, LoomError, NotFound
from ..records.events import CausalRejection, Event, EventIn
from ..records.ids import event_id
from ..records.notices import EventAccepted
from ..records.validation import CheckedPayload, check_text, checked_payload
from ..store import Tx
from .causal import DEFAULT_LIMITS, check_and_charge_in_tx


def accept_in_tx(
    tx: Tx,
    now_ms: int,
    event: EventIn,
    limits: CausalLimits,
    *,
    trusted: bool = False,
    checked: CheckedPayload | None = None,
) -> Event:
    """Accept an external root Event, or return the original (marked duplicate).

    ``trusted`` admits the privileged ``core.*`` family (operator and control paths).
    A new root pins the causal limits in force for its whole chain.

    ``checked`` is the payload as ``checked_payload(event, allow_core=trusted)`` returned it for this
    very ``event`` (the ingress validates in the publisher's task): the Event's fields are immutable
    text and what is stored is that text, so the rules are not checked twice, nor the text read back.
    Without it, every rule is checked here.
    """
    if checked is None:
        checked = checked_payload(event, allow_core=trusted)
    new_id = event_id(event.source, event.delivery_id)
    if event.work_id is None and limits == DEFAULT_LIMITS:
        # nothing to check or pin before the insert, so the insert is the duplicate check. On a shared
        # database the insert takes the acceptance-order lock first, so another node's acceptance of
        # the same delivery has committed (and the insert sees it) or has not begun its own insert
        inserted = _insert_root(tx, now_ms, event, new_id, checked, if_new=True)
        if inserted is not None:
            return inserted
    existing = delivered(tx, event.source, event.delivery_id, event)
    if existing is not None:
        return attrs.evolve(existing, duplicate=True)
    check_explicit_target_in_tx(tx, event)
    if limits != DEFAULT_LIMITS:
        # a root under the default limits is pinned implicitly (see causal.root_limits)
        tx.pin_causal_root(new_id, limits.max_depth, limits.per_minute)
    accepted = _insert_root(tx, now_ms, event, new_id, checked)
    assert accepted is not None
    return accepted


def _insert_root(
    tx: Tx, now_ms: int, event: EventIn, new_id: str, checked: CheckedPayload, *, if_new: bool = False
) -> Event | None:
    """`_insert` for a root Event: its own causal root, at depth 0."""
    return _insert(
        tx,
        now_ms,
        event,
        new_id,
        parent_id=None,
        cause_id=None,
        root_id=new_id,
        depth=0,
        execution_id=None,
        checked=checked,
        if_new=if_new,
    )


def accept_batch_in_tx(
    tx: Tx,
    now_ms: int,
    events: Sequence[EventIn],
    limits: CausalLimits,
    checked: Sequence[CheckedPayload] | None = None,
) -> list[Event | LoomError]:
    """Accept root Events in the order given, in one transaction: each is accepted, answered as a
    duplicate (of an earlier commit or of an earlier item of the batch), or refused on its own.

    A refusal (`accept_in_tx` raises before it writes anything for that Event) is returned in the
    Event's place and the others go on; a storage failure fails the whole batch, and nothing of it
    is committed. ``checked``: each Event's checked payload, in order (as for `accept_in_tx`).
    """
    if checked is not None and len(checked) != len(events):
        raise InvalidRequest(f"{len(events)} events came with {len(checked)} checked payloads")
    answers: list[Event | LoomError] = []
    for i, event in enumerate(events):
        try:
            answers.append(accept_in_tx(tx, now_ms, event, limits, checked=checked[i] if checked else None))
        except (InvalidRequest, NotFound) as refused:
            answers.append(refused)
    return answers


def accept_derived_in_tx(
    tx: Tx,
    now_ms: int,
    event: EventIn,
    parent_id: str,
    limits: CausalLimits,
    *,
    cause_id: str | None = None,
    execution_id: str | None = None,
    checked: CheckedPayload | None = None,
    unseen: bool = False,
) -> Event | CausalRejection:
    """Accept an Event derived from trusted authority ``parent_id``.

    Dedup comes before charging, so a replay costs nothing. Over the depth limit or a
    root's per-minute budget, a redacted rejection is committed instead of the Event
    and returned; the caller raises `CausalRefused` after the commit. ``checked``: as for
    `accept_in_tx`. ``unseen``: the caller's own state says the delivery identity was never
    accepted (a wait's wake bridge: a wait wakes once), so none is looked up; the insert still
    checks, and one found is loom's own invariant broken.
    """
    if checked is None:
        checked = checked_payload(event, allow_core=True)
    check_text("parent_id", parent_id)
    check_text("cause_id", cause_id, optional=True)
    parent = tx.event(parent_id)
    if parent is None:
        raise NotFound(
            f"derived event {event.source}/{event.delivery_id}: parent event {parent_id!r} does not exist"
        )
    cause = None
    if cause_id is not None and cause_id != parent_id:
        cause = eligible_cause(tx, event, cause_id)
    if not unseen:
        existing = delivered(tx, event.source, event.delivery_id, event)
        if existing is not None:
            return attrs.evolve(existing, duplicate=True)
    check_explicit_target_in_tx(tx, event)
    position = check_and_charge_in_tx(tx, now_ms, event, parent, cause, limits, execution_id=execution_id)
    if isinstance(position, CausalRejection):
        return position
    accepted = _insert(
        tx,
        now_ms,
        event,
        event_id(event.source, event.delivery_id),
        parent_id=parent.id,
        cause_id=cause.id if cause else None,
        root_id=position.root_id,
        depth=position.depth,
        execution_id=execution_id,
        checked=checked,
        if_new=unseen,
    )
    if accepted is None:
        raise AssertionError(f"derived event {event.source}/{event.delivery_id} was accepted before")
    return accepted


def delivered(tx: Tx, source: str, delivery_id: str, like: EventIn | None = None) -> Event | None:
    """The Event accepted with this delivery identity, or ``None``. An Event compaction removed is
    answered by its tombstone (within the dedup window): an Event marked ``compacted`` with the
    original's id, sequence and acceptance time, its other fields taken from ``like`` (the redelivery)
    where given. Every dedup check asks this, so an identity is never accepted twice."""
    found = tx.delivery(source, delivery_id)
    if found is None or isinstance(found, Event):
        return found
    seq, accepted_at_ms = found
    original_id = event_id(source, delivery_id)
    return Event(
        id=original_id,
        seq=seq,
        source=source,
        delivery_id=delivery_id,
        type=like.type if like else "",
        scope=like.scope if like else "",
        key=like.key if like else None,
        work_id=like.work_id if like else None,
        execution_id=None,
        payload=dict(like.payload) if like else {},
        parent_id=None,
        cause_id=None,
        root_id=original_id,
        depth=0,
        accepted_at_ms=accepted_at_ms,
        compacted=True,
    )


def eligible_cause(tx: Tx, event: EventIn, cause_id: str) -> Event:
    """A cited cause must be an accepted Event in the emitting scope and source namespace."""
    cause = tx.event(cause_id)
    if cause is None:
        raise InvalidRequest(f"cited cause {cause_id!r} is not an accepted event", field="cause_id")
    if cause.scope != event.scope:
        raise InvalidRequest(
            f"cited cause {cause_id!r} is in scope {cause.scope!r}, not the emitting scope {event.scope!r}",
            field="cause_id",
        )
    if cause.source != event.source or cause.key is None:
        raise InvalidRequest(
            f"cited cause {cause_id!r} has no correlation key in source namespace {event.source!r}"
        )
    return cause


def _insert(
    tx: Tx,
    now_ms: int,
    event: EventIn,
    new_id: str,
    *,
    parent_id: str | None,
    cause_id: str | None,
    root_id: str,
    depth: int,
    execution_id: str | None,
    checked: CheckedPayload,
    if_new: bool = False,
) -> Event | None:
    """Insert an Event whose payload is ``checked`` (its canonical text is stored, its value held). With
    ``if_new``: only if its delivery identity was never accepted (``None`` if it was;
    `Tx.insert_event`)."""
    seq = tx.insert_event(
        id=new_id,
        source=event.source,
        delivery_id=event.delivery_id,
        type=event.type,
        scope=event.scope,
        key=event.key,
        work_id=event.work_id,
        execution_id=execution_id,
        payload_json=checked.text,
        parent_id=parent_id,
        cause_id=cause_id,
        root_id=root_id,
        depth=depth,
        accepted_at_ms=now_ms,
        if_new=if_new,
    )
    if seq is None:
        return None
    accepted = Event(
        id=new_id,
        seq=seq,
        source=event.source,
        delivery_id=event.delivery_id,
        type=event.type,
        scope=event.scope,
        key=event.key,
        work_id=event.work_id,
        execution_id=execution_id,
        payload=checked.value,
        parent_id=parent_id,
        cause_id=cause_id,
        root_id=root_id,
        depth=depth,
        accepted_at_ms=now_ms,
    )
    tx.accepted(accepted)
    tx.notify(EventAccepted(event=accepted))
    return accepted


def check_explicit_target_in_tx(tx: Tx, event: EventIn) -> None:
    """An explicit Work id must name an existing Work in the same scope whose keys agree.

    Contradictory identity or scope is refused, never overridden.
    """
    if event.work_id is None:
        return
    work = tx.work(event.work_id)
    if work is None:
        raise InvalidRequest(f"event.work_id {event.work_id!r} names no existing work", field="event.work_id")
    if work.scope != event.scope:
        raise InvalidRequest(
            f"event.scope {event.scope!r} contradicts work {work.id}, which is in scope {work.scope!r}"
        )
    if event.key is not None:
        owner = tx.key_owner(event.key)
        if owner is not None and owner != work.id:
            raise InvalidRequest(
                f"event.key {event.key!r} is owned by work {owner}, not by work {work.id}", field="event.key"
            )
