"""Durable acceptance through `open_runtime` (docs/concepts.md "Event" and "Causal bounds":
acceptance and dedup, rejection evidence, cited causation), on SQLite ``:memory:`` and on a file."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from loom import (
    CausalLimits,
    CausalRefused,
    CausalRejection,
    Config,
    ConfigError,
    Event,
    EventIn,
    InvalidRequest,
    ManualClock,
    NotFound,
    RejectionReason,
    Runtime,
    open_runtime,
)
from loom.config.model import MAX_CAUSAL_DEPTH, MAX_PER_MINUTE
from loom.kernel.accept import accept_derived_in_tx, accept_in_tx
from loom.kernel.causal import REJECTIONS_NAMESPACE
from loom.records.ids import event_id
from loom.records.notices import EventAccepted
from loom.records.validation import MAX_PAYLOAD_BYTES
from loom.store import Tx
from loom.testing import T0_MS
from loom.testing.internals import storage_of

T0 = T0_MS
MINUTE = T0 // 60_000
SECRET = "s3cr3t-token-0b5e"


def ev(delivery_id: str, **fields: Any) -> EventIn:
    values: dict[str, Any] = {"source": "github", "type": "pr.opened", "scope": "acme/web", **fields}
    return EventIn(delivery_id=delivery_id, **values)


@pytest.fixture
def file_path(tmp_path: Path) -> str:
    return str(tmp_path / "loom.db")


@asynccontextmanager
async def runtime(path: str, clock: ManualClock, config: Config | None = None) -> AsyncIterator[Runtime]:
    async with open_runtime(path, clock=clock, config=config, load_entry_points=False) as rt:
        yield rt


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    async with runtime(loom_store, clock) as handle:
        yield handle


async def stored(rt: Runtime) -> list[Event]:
    return await rt.events(limit=100_000)


async def bucket(rt: Runtime, root_id: str, minute: int = MINUTE) -> int:
    def count(tx: Tx, now_ms: int) -> int:
        return tx.bucket_count(root_id, minute)

    return await storage_of(rt).submit(count)


async def refused(
    rt: Runtime, event: EventIn, parent_id: str, cause_id: str | None = None
) -> CausalRejection:
    with pytest.raises(CausalRefused) as excinfo:
        await rt.publish_derived(event, parent_id=parent_id, cause_id=cause_id)
    rejection = excinfo.value.rejection
    assert isinstance(rejection, CausalRejection)
    return rejection


async def chain(rt: Runtime, parent: Event, length: int, prefix: str, **fields: Any) -> Event:
    """Derive ``length`` Events, each from the one before; return the last."""
    for i in range(length):
        parent = await rt.publish_derived(ev(f"{prefix}-{i}", **fields), parent_id=parent.id)
    return parent


# -- root acceptance ----------------------------------------------------------


async def test_a_valid_root_event_is_stored_with_its_full_envelope(rt: Runtime, clock: ManualClock) -> None:
    offered = ev("d-1", key="pr/42", payload={"n": 42, "labels": ["a", "b"], "draft": False})
    accepted = await rt.publish(offered)
    assert accepted == Event(
        id=event_id("github", "d-1"),
        seq=accepted.seq,
        source="github",
        delivery_id="d-1",
        type="pr.opened",
        scope="acme/web",
        key="pr/42",
        work_id=None,
        execution_id=None,
        payload={"n": 42, "labels": ["a", "b"], "draft": False},
        parent_id=None,
        cause_id=None,
        root_id=accepted.id,
        depth=0,
        accepted_at_ms=T0,
        duplicate=False,
    )
    assert accepted.is_root
    assert accepted.seq >= 1
    assert await stored(rt) == [accepted]
    assert await rt.event(accepted.id) == accepted
    assert await rt.event_by_delivery("github", "d-1") == accepted


async def test_sequences_strictly_increase_in_acceptance_order(rt: Runtime, clock: ManualClock) -> None:
    sequential = []
    for i in range(5):
        sequential.append((await rt.publish(ev(f"seq-{i}"))).seq)
        clock.advance(1_000)
    assert sequential == sorted(sequential)
    assert len(set(sequential)) == 5

    concurrent: list[int] = []

    async def publish(i: int) -> None:
        concurrent.append((await rt.publish(ev(f"conc-{i}"))).seq)

    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(publish, i)
    assert len(set(concurrent)) == 40
    assert min(concurrent) > max(sequential)
    seqs = [e.seq for e in await stored(rt)]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 45


async def test_an_accepted_event_is_immutable(rt: Runtime, clock: ManualClock) -> None:
    accepted = await rt.publish(ev("d-1", payload={"n": 1}))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        accepted.seq = 99  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        accepted.payload = {}  # type: ignore[misc]
    with pytest.raises(TypeError, match="immutable"):
        accepted.payload["n"] = 2  # the same object reached the router: it must not change
    publisher_payload = {"n": 1, "keys": ["a"]}
    copied = await rt.publish(ev("d-2", payload=publisher_payload))
    publisher_payload["keys"].append("b")  # the publisher's own dict is not the Event's
    assert copied.payload == {"n": 1, "keys": ["a"]}
    with pytest.raises(TypeError, match="immutable"):
        copied.payload["keys"].append("c")
    clock.advance(60_000)
    again = await rt.publish(ev("d-1", type="pr.closed", payload={"n": 3}))
    assert (await rt.event(accepted.id)).payload == {"n": 1}
    assert attrs.evolve(again, duplicate=False) == await rt.event(accepted.id)
    assert again.accepted_at_ms == T0


# -- validation -----------------------------------------------------------------

BAD_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("event.source", {"source": ""}),
    ("event.source", {"source": " github"}),
    ("event.source", {"source": "github\t"}),
    ("event.source", {"source": 123}),
    ("event.source", {"source": "x" * 201}),
    ("event.delivery_id", {"delivery_id": ""}),
    ("event.delivery_id", {"delivery_id": "d-1 "}),
    ("event.delivery_id", {"delivery_id": "d\x01"}),
    ("event.delivery_id", {"delivery_id": "d\x1f1"}),  # the last C0 control character
    ("event.delivery_id", {"delivery_id": "d\x7f1"}),  # DEL is a control character too
    ("event.type", {"type": ""}),
    ("event.type", {"type": "pr opened"}),
    ("event.type", {"type": ".opened"}),
    ("event.type", {"type": "pr.opened\n"}),
    ("event.type", {"type": "t" * 201}),
    ("event.type", {"type": "core.work.created"}),
    ("event.type", {"type": "core.retry.requested"}),
    ("event.scope", {"scope": ""}),
    ("event.scope", {"scope": "/acme"}),
    ("event.scope", {"scope": "acme/"}),
    ("event.scope", {"scope": "acme//web"}),
    ("event.scope", {"scope": "ac me"}),
    ("event.scope", {"scope": "acme/ web"}),
    ("event.scope", {"scope": "acme/web\n"}),
    ("event.key", {"key": ""}),
    ("event.key", {"key": " pr/42"}),
    ("event.work_id", {"work_id": "w-1 "}),
    ("event.payload", {"payload": {"x": {1, 2}}}),
    ("event.payload", {"payload": {"x": float("nan")}}),
    ("event.payload", {"payload": {"x": float("inf")}}),
    ("event.payload", {"payload": {"x": object()}}),
    ("event.payload", {"payload": {"x": b"bytes"}}),
    ("event.payload", {"payload": [1, 2]}),
    ("event.payload", {"payload": "text"}),
    ("event.payload", {"payload": None}),
    ("event.payload", {"payload": {"x": "a" * MAX_PAYLOAD_BYTES}}),
]


def bad_event(fields: dict[str, Any]) -> EventIn:
    values: dict[str, Any] = {
        "source": "github",
        "delivery_id": "d-1",
        "type": "pr.opened",
        "scope": "acme/web",
    }
    return EventIn(**{**values, **fields})


@pytest.mark.parametrize(
    ("field", "fields"),
    BAD_EVENTS,
    # (an object's repr names its address: ids that differ between runs, which parallel runs refuse)
    ids=[re.sub(r" at 0x[0-9a-f]+", "", f"{f}={v!r}")[:60] for f, v in BAD_EVENTS],
)
async def test_an_invalid_event_is_refused_naming_the_field_and_nothing_is_stored(
    rt: Runtime, field: str, fields: dict[str, Any]
) -> None:
    names_field = rf"^{re.escape(field)}\b"
    requests = storage_of(rt).stats.requests
    with pytest.raises(InvalidRequest, match=names_field):
        await rt.publish(bad_event(fields))
    assert storage_of(rt).stats.requests == requests, "refused before reaching storage"
    # The kernel procedure checks the same rules itself (it trusts no caller).
    with pytest.raises(InvalidRequest, match=names_field):
        await storage_of(rt).submit(accept_in_tx, bad_event(fields), CausalLimits())
    assert await stored(rt) == []


async def test_an_oversized_payload_names_the_limit(rt: Runtime) -> None:
    with pytest.raises(InvalidRequest, match=rf"event\.payload is larger than {MAX_PAYLOAD_BYTES} bytes"):
        await rt.publish(ev("d-1", payload={"x": "a" * MAX_PAYLOAD_BYTES}))
    just_fits = {"x": "a" * (MAX_PAYLOAD_BYTES - len('{"x":""}'))}
    assert (await rt.publish(ev("d-2", payload=just_fits))).payload == just_fits


async def test_publishing_something_that_is_not_an_event_is_refused(rt: Runtime) -> None:
    with pytest.raises(InvalidRequest, match="EventIn"):
        await rt.publish({"source": "github", "delivery_id": "d-1"})  # type: ignore[arg-type]
    assert await stored(rt) == []


async def test_an_invalid_derived_event_is_refused_naming_the_field(rt: Runtime) -> None:
    root = await rt.publish(ev("root"))
    with pytest.raises(InvalidRequest, match=r"^event\.scope"):
        await rt.publish_derived(ev("child", scope="acme//web"), parent_id=root.id)
    assert await stored(rt) == [root]
    assert await bucket(rt, root.id) == 0


async def test_the_core_family_is_open_to_trusted_derived_acceptance_only(rt: Runtime) -> None:
    root = await rt.publish(ev("root"))
    with pytest.raises(InvalidRequest, match="core"):
        await rt.publish(ev("core-1", type="core.work.created"))
    child = await rt.publish_derived(ev("core-1", type="core.work.created"), parent_id=root.id)
    assert child.type == "core.work.created"


# -- duplicates -----------------------------------------------------------------


async def test_a_duplicate_delivery_returns_the_original_and_stores_nothing(
    rt: Runtime, clock: ManualClock
) -> None:
    feed = storage_of(rt).feed()
    original = await rt.publish(ev("d-1", key="pr/1", payload={"v": 1}))
    clock.advance(5 * 60_000)
    again = await rt.publish(
        EventIn(
            source="github", delivery_id="d-1", type="pr.closed", scope="other", key="pr/2", payload={"v": 2}
        )
    )
    assert again.duplicate
    assert attrs.evolve(again, duplicate=False) == original
    assert (again.id, again.seq, again.type, again.payload, again.accepted_at_ms) == (
        original.id,
        original.seq,
        "pr.opened",
        {"v": 1},
        T0,
    )
    assert await stored(rt) == [original]

    other_source = await rt.publish(ev("d-1", source="gitlab"))
    assert not other_source.duplicate
    assert other_source.id != original.id
    # catches a duplicate check made by an insert that conflicts: it spends a sequence (SQLite)
    assert other_source.seq == original.seq + 1, "the duplicate drew a sequence"
    accepted_ids: list[str] = []
    while len(accepted_ids) < 2:  # other batches (routing checkpoints) carry other notices
        accepted_ids += [n.event_id for n in await feed.next_batch() if isinstance(n, EventAccepted)]
    assert accepted_ids == [original.id, other_source.id], "a duplicate publishes no notice"


async def test_concurrent_duplicates_accept_exactly_one(rt: Runtime) -> None:
    results: list[Event] = []

    async def publish(i: int) -> None:
        results.append(await rt.publish(ev("same", payload={"attempt": i})))

    async with trio.open_nursery() as nursery:
        for i in range(25):
            nursery.start_soon(publish, i)
    assert sum(not r.duplicate for r in results) == 1
    assert {(r.id, r.seq) for r in results} == {(results[0].id, results[0].seq)}
    assert len(await stored(rt)) == 1


# -- derived acceptance ---------------------------------------------------------


async def test_a_derived_event_takes_its_root_and_depth_from_its_parent(rt: Runtime) -> None:
    root = await rt.publish(ev("root"))
    child = await rt.publish_derived(ev("child"), parent_id=root.id)
    grandchild = await rt.publish_derived(ev("grandchild", source="bot"), parent_id=child.id)
    assert (child.parent_id, child.root_id, child.depth, child.cause_id) == (root.id, root.id, 1, None)
    assert (grandchild.parent_id, grandchild.root_id, grandchild.depth) == (child.id, root.id, 2)
    assert not child.is_root
    other = await rt.publish(ev("other-root"))
    from_other = await rt.publish_derived(ev("from-other"), parent_id=other.id)
    assert (from_other.root_id, from_other.depth) == (other.id, 1)
    assert await stored(rt) == [root, child, grandchild, other, from_other]
    assert await bucket(rt, root.id) == 2
    assert await bucket(rt, other.id) == 1


async def test_the_events_of_a_root_are_the_root_and_what_derives_from_it_in_order(rt: Runtime) -> None:
    # A root is found by its id and its descendants by the root's index: a read that searched only the
    # index would miss the root, one that searched only ids would miss the descendants, and a limit or a
    # filter applied to either half alone would answer too many or the wrong ones.
    root = await rt.publish(ev("root"))
    other = await rt.publish(ev("other-root"))
    child = await rt.publish_derived(ev("child", type="pr.closed"), parent_id=root.id)
    await rt.publish_derived(ev("from-other"), parent_id=other.id)
    grandchild = await rt.publish_derived(ev("grandchild"), parent_id=child.id)
    assert await rt.events(root_id=root.id) == [root, child, grandchild]
    assert await rt.events(root_id=root.id, limit=2) == [root, child]
    assert await rt.events(root_id=root.id, after_seq=root.seq) == [child, grandchild]
    assert await rt.events(root_id=root.id, type="pr.opened") == [root, grandchild]
    assert await rt.events(root_id=root.id, type="pr.closed") == [child]
    assert await rt.events(root_id=child.id) == []  # a derived Event is no root
    assert await rt.events(root_id=other.id, limit=1) == [other]


async def test_citing_the_trigger_itself_is_the_default(rt: Runtime) -> None:
    root = await rt.publish(ev("root", key="pr/1"))
    child = await rt.publish_derived(ev("child"), parent_id=root.id, cause_id=root.id)
    assert (child.cause_id, child.depth, child.root_id) == (None, 1, root.id)
    assert await bucket(rt, root.id) == 1


async def test_an_unknown_parent_is_not_found_and_nothing_is_stored(rt: Runtime) -> None:
    root = await rt.publish(ev("root"))
    with pytest.raises(NotFound, match="ev_missing"):
        await rt.publish_derived(ev("orphan"), parent_id="ev_missing")
    assert await stored(rt) == [root]
    assert await rt.causal_rejections() == []


async def test_the_kernel_refuses_a_malformed_parent_or_cause_id_naming_the_field(rt: Runtime) -> None:
    """Derived acceptance checks ``parent_id`` and ``cause_id`` itself (it trusts no caller), naming the
    field and storing nothing. Catches dropping either check in ``accept_derived_in_tx``: a parent id
    with surrounding whitespace would then be looked up and answered `NotFound`, and a cause id that is
    no string would be refused without naming ``cause_id`` (or reach the store as a number)."""
    root = await rt.publish(ev("root", key="pr/1"))
    for parent_id, cause_id, field in [(f" {root.id}", None, "parent_id"), (root.id, 7, "cause_id")]:
        with pytest.raises(InvalidRequest, match=f"^{field}") as excinfo:
            await storage_of(rt).submit(
                accept_derived_in_tx, ev("child"), parent_id, CausalLimits(), cause_id=cause_id
            )
        assert excinfo.value.field == field
    assert await stored(rt) == [root]
    assert await bucket(rt, root.id) == 0


async def test_depth_33_is_refused_with_a_redacted_durable_diagnostic(
    rt: Runtime, clock: ManualClock
) -> None:
    root = await rt.publish(ev("root"))
    deepest = await chain(rt, root, 32, "link")
    assert deepest.depth == 32
    rejection = await refused(rt, ev("too-deep", payload={"token": SECRET}), deepest.id)
    assert rejection.reason is RejectionReason.DEPTH_LIMIT
    assert (rejection.depth, rejection.limit, rejection.root_id) == (33, 32, root.id)
    assert (rejection.parent_id, rejection.source, rejection.delivery_id) == (
        deepest.id,
        "github",
        "too-deep",
    )
    assert rejection.at_ms == T0
    assert await rt.causal_rejections() == [rejection]
    entries = await rt.kv(REJECTIONS_NAMESPACE)
    assert len(entries) == 1
    assert SECRET not in json.dumps(entries[0].value)
    assert "payload" not in entries[0].value
    assert len(await stored(rt)) == 33, "the refused Event was not stored"
    assert await bucket(rt, root.id) == 32, "a refusal consumes no token"

    clock.advance(60_000)  # a new minute restores rate, never depth
    await refused(rt, ev("too-deep-later"), deepest.id)


async def test_refusals_whose_source_and_delivery_id_join_alike_keep_a_diagnostic_each(
    loom_store: str, clock: ManualClock
) -> None:
    """Each refused Event keeps its own durable diagnostic, named by its parent, source and delivery id.
    Sources and delivery ids may hold ``|``: (``a|b``, ``c``) and (``a``, ``b|c``) are two Events, and
    joining the three parts with ``|`` gave them one key, so the second refusal overwrote the first."""
    async with runtime(loom_store, clock, Config(causal=CausalLimits(per_minute=1))) as rt:
        root = await rt.publish(ev("root"))
        await rt.publish_derived(ev("child"), parent_id=root.id)
        first = await refused(rt, ev("c", source="a|b"), root.id)
        second = await refused(rt, ev("b|c", source="a"), root.id)
        assert sorted(await rt.causal_rejections(), key=lambda r: r.source) == [second, first]
        assert len(await rt.kv(REJECTIONS_NAMESPACE)) == 2


async def test_a_root_accepts_128_derived_events_per_utc_minute(rt: Runtime, clock: ManualClock) -> None:
    root = await rt.publish(ev("root"))
    clock.advance(59_000)  # still the first minute
    siblings: list[Event] = []

    async def derive(i: int) -> None:
        siblings.append(await rt.publish_derived(ev(f"sibling-{i}"), parent_id=root.id))

    async with trio.open_nursery() as nursery:
        for i in range(128):
            nursery.start_soon(derive, i)
    assert len(siblings) == 128
    assert await bucket(rt, root.id) == 128

    rejection = await refused(rt, ev("sibling-128", payload={"token": SECRET}), root.id)
    assert rejection.reason is RejectionReason.RATE_LIMIT
    assert (rejection.root_id, rejection.budget, rejection.minute) == (root.id, 128, MINUTE)
    assert SECRET not in json.dumps([e.value for e in await rt.kv(REJECTIONS_NAMESPACE)])
    assert len(await stored(rt)) == 129

    # Deduplication precedes charging: replaying an accepted sibling costs nothing.
    replay = await rt.publish_derived(ev("sibling-7", payload={"changed": True}), parent_id=root.id)
    assert replay.duplicate
    assert replay.id == event_id("github", "sibling-7")
    assert len(await rt.causal_rejections()) == 1
    assert await bucket(rt, root.id) == 128

    # Grandchildren share the root's budget.
    await refused(rt, ev("grandchild"), siblings[0].id)

    # Independent roots continue.
    other = await rt.publish(ev("other-root"))
    await rt.publish_derived(ev("other-child"), parent_id=other.id)

    # The next UTC minute restores the rate.
    clock.advance(1_000)
    accepted = await rt.publish_derived(ev("sibling-128"), parent_id=root.id)
    assert not accepted.duplicate
    assert await bucket(rt, root.id, MINUTE + 1) == 1


async def test_rate_counters_survive_a_reopen(file_path: str, clock: ManualClock) -> None:
    async with runtime(file_path, clock) as rt:
        root = await rt.publish(ev("root"))
        async with trio.open_nursery() as nursery:
            for i in range(128):
                nursery.start_soon(partial(rt.publish_derived, ev(f"sibling-{i}"), parent_id=root.id))
    async with runtime(file_path, clock) as rt:
        assert await bucket(rt, root.id) == 128
        rejection = await refused(rt, ev("sibling-128"), root.id)
        assert rejection.reason is RejectionReason.RATE_LIMIT
        assert len(await rt.causal_rejections()) == 1


async def test_a_root_keeps_its_pinned_limits_across_a_reopen_with_looser_config(
    file_path: str, clock: ManualClock
) -> None:
    strict = Config(causal=CausalLimits(max_depth=2, per_minute=3))
    async with runtime(file_path, clock, strict) as rt:
        root = await rt.publish(ev("root"))
        await rt.publish_derived(ev("a"), parent_id=root.id)
    async with runtime(file_path, clock) as rt:  # default, looser limits
        b = await rt.publish_derived(ev("b"), parent_id=root.id)
        await rt.publish_derived(ev("c"), parent_id=b.id)
        assert (await refused(rt, ev("d"), root.id)).reason is RejectionReason.RATE_LIMIT
        clock.advance(60_000)
        depth = await refused(rt, ev("e"), (await rt.event_by_delivery("github", "c")).id)
        assert (depth.reason, depth.depth, depth.limit) == (RejectionReason.DEPTH_LIMIT, 3, 2)


async def test_configured_limits_apply(loom_store: str, clock: ManualClock) -> None:
    async with runtime(loom_store, clock, Config(causal=CausalLimits(max_depth=2, per_minute=3))) as rt:
        root = await rt.publish(ev("root"))
        child = await rt.publish_derived(ev("child"), parent_id=root.id)
        grandchild = await rt.publish_derived(ev("grandchild"), parent_id=child.id)
        deep = await refused(rt, ev("great-grandchild"), grandchild.id)
        assert (deep.reason, deep.depth, deep.limit) == (RejectionReason.DEPTH_LIMIT, 3, 2)
        await rt.publish_derived(ev("sibling"), parent_id=root.id)
        rate = await refused(rt, ev("one-too-many"), child.id)
        assert (rate.reason, rate.budget) == (RejectionReason.RATE_LIMIT, 3)


async def test_a_root_pinned_looser_than_the_configuration_now_in_force_gets_the_stricter_limits(
    loom_store: str, clock: ManualClock
) -> None:
    """A root's pinned limits are never looser than the current configuration (docs/concepts.md): a
    root pinned by a trusted path with depth 10 and 100 a minute, under a configuration of depth 2 and
    3 a minute, is held to 2 and 3. Catches ``root_limits`` answering the pin alone."""
    async with runtime(loom_store, clock, Config(causal=CausalLimits(max_depth=2, per_minute=3))) as rt:
        root = await storage_of(rt).submit(
            accept_in_tx, ev("root"), CausalLimits(max_depth=10, per_minute=100)
        )
        grandchild = await chain(rt, root, 2, "link")
        deep = await refused(rt, ev("too-deep"), grandchild.id)
        assert (deep.reason, deep.depth, deep.limit) == (RejectionReason.DEPTH_LIMIT, 3, 2)
        await rt.publish_derived(ev("third"), parent_id=root.id)
        rate = await refused(rt, ev("fourth"), root.id)
        assert (rate.reason, rate.budget) == (RejectionReason.RATE_LIMIT, 3)


async def test_a_depth_refusal_records_the_roots_own_pinned_budget(rt: Runtime) -> None:
    """The redacted diagnostic of a depth refusal names the limits of the root it counts against: its
    ``budget`` is that root's per-minute budget (pinned at 5 here), not the configured 128. Catches the
    depth branch of ``check_and_charge_in_tx`` recording the configured budget."""
    root = await storage_of(rt).submit(accept_in_tx, ev("root"), CausalLimits(max_depth=1, per_minute=5))
    child = await rt.publish_derived(ev("child"), parent_id=root.id)
    rejection = await refused(rt, ev("grandchild"), child.id)
    assert (rejection.reason, rejection.depth, rejection.limit) == (RejectionReason.DEPTH_LIMIT, 2, 1)
    assert (rejection.root_id, rejection.budget) == (root.id, 5)
    assert await rt.causal_rejections() == [rejection]


@pytest.mark.parametrize("key", ["max_depth", "per_minute"])
@pytest.mark.parametrize("value", [0, -1, "too-big", True, False, 1.5, "5", None])
def test_invalid_causal_limits_are_refused_naming_the_key(key: str, value: Any) -> None:
    if value == "too-big":
        value = (MAX_CAUSAL_DEPTH if key == "max_depth" else MAX_PER_MINUTE) + 1
    with pytest.raises(ConfigError, match=key) as excinfo:
        CausalLimits(**{key: value})
    assert excinfo.value.key is not None
    assert excinfo.value.key.endswith(key)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ((2, 50), (5, 100), (2, 50)),
        ((5, 100), (2, 50), (2, 50)),
        ((2, 100), (5, 50), (2, 50)),
        ((3, 7), (3, 7), (3, 7)),
    ],
)
def test_stricter_takes_the_tighter_of_each_bound(
    a: tuple[int, int], b: tuple[int, int], expected: tuple[int, int]
) -> None:
    """Each bound is the tighter of the two, whichever side holds it. Catches answering one side whole
    when it is tighter in one bound only (the third case: depth from one, the rate from the other)."""
    limits = CausalLimits(max_depth=a[0], per_minute=a[1]).stricter(
        CausalLimits(max_depth=b[0], per_minute=b[1])
    )
    assert (limits.max_depth, limits.per_minute) == expected


def test_the_largest_causal_limits_are_accepted() -> None:
    limits = CausalLimits(max_depth=MAX_CAUSAL_DEPTH, per_minute=MAX_PER_MINUTE)
    assert (limits.max_depth, limits.per_minute) == (MAX_CAUSAL_DEPTH, MAX_PER_MINUTE)


# -- cited causation --------------------------------------------------------------


async def test_a_cited_emission_takes_the_causes_root_and_the_deeper_depth(rt: Runtime) -> None:
    report_root = await rt.publish(ev("report-root", key="report/1"))
    report = await chain(rt, report_root, 5, "report", key="report/1")  # depth 5, keyed
    trigger_root = await rt.publish(ev("timer-slot", key="slot/1"))
    trigger = await chain(rt, trigger_root, 2, "slot")  # depth 2
    fix = await rt.publish_derived(ev("fix"), parent_id=trigger.id, cause_id=report.id)
    assert (fix.parent_id, fix.cause_id, fix.root_id, fix.depth) == (trigger.id, report.id, report_root.id, 6)
    assert await bucket(rt, report_root.id) == 5 + 1
    assert await bucket(rt, trigger_root.id) == 2 + 1, "both roots pay"

    shallow = await rt.publish_derived(ev("fix-2"), parent_id=report.id, cause_id=trigger_root.id)
    assert (shallow.depth, shallow.root_id) == (6, trigger_root.id), "never shallower than its trigger"


@pytest.mark.parametrize(
    ("cause_fields", "reason"),
    [
        ({"scope": "acme/other"}, "scope"),
        ({"source": "gitlab"}, "source namespace"),
        ({"key": None}, "no correlation key"),
    ],
)
async def test_an_ineligible_cause_is_refused_before_anything_commits(
    rt: Runtime, cause_fields: dict[str, Any], reason: str
) -> None:
    cause = await rt.publish(ev("cause", **{"key": "report/1", **cause_fields}))
    trigger = await rt.publish(ev("trigger"))
    before = await stored(rt)
    with pytest.raises(InvalidRequest, match=reason):
        await rt.publish_derived(ev("fix"), parent_id=trigger.id, cause_id=cause.id)
    assert await stored(rt) == before
    assert await bucket(rt, trigger.id) == 0
    assert await bucket(rt, cause.id) == 0
    assert await rt.causal_rejections() == []


async def test_a_missing_cause_is_refused_before_anything_commits(rt: Runtime) -> None:
    trigger = await rt.publish(ev("trigger"))
    with pytest.raises(InvalidRequest, match=r"ev_missing.*not an accepted event"):
        await rt.publish_derived(ev("fix"), parent_id=trigger.id, cause_id="ev_missing")
    assert await stored(rt) == [trigger]
    assert await bucket(rt, trigger.id) == 0


async def test_a_cited_emission_is_checked_against_the_stricter_roots_depth_limit(
    loom_store: str, clock: ManualClock
) -> None:
    async with runtime(loom_store, clock, Config(causal=CausalLimits(max_depth=10))) as rt:
        # A report root pinned (by a trusted path) with a depth limit of 3.
        report = await storage_of(rt).submit(
            accept_in_tx, ev("report", key="report/1"), CausalLimits(max_depth=3, per_minute=128)
        )
        trigger_root = await rt.publish(ev("slot"))
        trigger = await chain(rt, trigger_root, 3, "slot")  # depth 3: fine under its own limit of 10

        assert (await rt.publish_derived(ev("plain"), parent_id=trigger.id)).depth == 4
        rejection = await refused(rt, ev("fix", payload={"token": SECRET}), trigger.id, report.id)
        assert (rejection.reason, rejection.depth, rejection.limit) == (RejectionReason.DEPTH_LIMIT, 4, 3)
        assert (rejection.parent_id, rejection.cause_id, rejection.root_id) == (
            trigger.id,
            report.id,
            report.id,
        )
        assert await bucket(rt, report.id) == 0
        assert SECRET not in json.dumps([e.value for e in await rt.kv(REJECTIONS_NAMESPACE)])


@pytest.mark.parametrize("full", ["cause", "trigger"])
async def test_a_cited_emission_is_refused_when_either_roots_bucket_is_full(
    loom_store: str, clock: ManualClock, full: str
) -> None:
    async with runtime(loom_store, clock, Config(causal=CausalLimits(per_minute=4))) as rt:
        report = await rt.publish(ev("report", key="report/1"))
        trigger = await rt.publish(ev("slot"))
        busy = report if full == "cause" else trigger
        idle = trigger if full == "cause" else report
        for i in range(4):
            await rt.publish_derived(ev(f"burst-{i}"), parent_id=busy.id)
        assert await bucket(rt, busy.id) == 4
        assert await bucket(rt, idle.id) == 0

        rejection = await refused(rt, ev("fix"), trigger.id, report.id)
        assert (rejection.reason, rejection.root_id) == (RejectionReason.RATE_LIMIT, busy.id)
        assert await bucket(rt, idle.id) == 0, "nothing is charged when refused"
        assert await rt.causal_rejections() == [rejection]
        # The idle root still has room for emissions of its own.
        await rt.publish_derived(ev("own"), parent_id=idle.id)
        assert await bucket(rt, idle.id) == 1
