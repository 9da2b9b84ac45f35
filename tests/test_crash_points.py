"""Crash points (docs/testing.md "Crash points"): stop the storage actor just before or just after a commit
while many producers publish, reopen the file, and check that nothing acknowledged was lost,
nothing was half-written, and a replay of every offer converges on each Event exactly once."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from loom import CausalLimits, Config, Event, EventIn, ManualClock, Runtime, StorageClosed, open_runtime
from loom.config.model import MAX_PER_MINUTE
from loom.store import FaultHook
from loom.testing import T0_MS, raw
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint

T0 = T0_MS
PRODUCERS = 10
OFFERS_PER_PRODUCER = 20
SEED_ROOTS = 4
# High enough that no derived Event is refused: every offer must end up accepted.
CONFIG = Config(causal=CausalLimits(per_minute=MAX_PER_MINUTE))

Delivery = tuple[str, str]


@attrs.frozen
class Offer:
    event: EventIn
    parent_id: str | None = None
    cause_id: str | None = None

    @property
    def delivery(self) -> Delivery:
        return (self.event.source, self.event.delivery_id)


async def submit(rt: Runtime, offer: Offer) -> Event:
    if offer.parent_id is None:
        return await rt.publish(offer.event)
    return await rt.publish_derived(offer.event, parent_id=offer.parent_id, cause_id=offer.cause_id)


@asynccontextmanager
async def runtime(path: str, clock: ManualClock, fault: FaultHook | None = None) -> AsyncIterator[Runtime]:
    # no background actors: every batch the crash hook counts is one the producers submitted, so the
    # crash always cuts the stream short (the router's own reads would otherwise count as batches)
    async with open_runtime(
        path, clock=clock, config=CONFIG, load_entry_points=False, fault=fault, actors=()
    ) as rt:
        yield rt


class Load:
    """Producers offering a stream of root and derived Events, some citing a cause."""

    def __init__(self, rng: random.Random, clock: ManualClock, seeds: list[Event]) -> None:
        self.rng = rng
        self.clock = clock
        self.seeds = seeds
        self.offers: list[Offer] = []
        self.by_producer: dict[int, list[Offer]] = {p: [] for p in range(PRODUCERS)}
        self.acknowledged: dict[Delivery, Event] = {}
        self.unexpected: list[BaseException] = []

    async def produce(self, rt: Runtime, producer: int, rng: random.Random) -> None:
        own: list[Event] = []  # this producer's acknowledged Events: parents it may derive from
        for n in range(OFFERS_PER_PRODUCER):
            delivery_id = f"p{producer}-{n}"
            if rng.random() < 0.35:
                offer = Offer(
                    EventIn(
                        source="ext",
                        delivery_id=delivery_id,
                        type="ext.arrived",
                        scope="acme",
                        key=f"ext/{producer}/{n}",
                        payload={"n": n},
                    )
                )
            else:
                parent = rng.choice(self.seeds + own)
                cause = rng.choice(self.seeds) if rng.random() < 0.4 else None
                offer = Offer(
                    EventIn(
                        source="bot",
                        delivery_id=delivery_id,
                        type="bot.derived",
                        scope="acme",
                        payload={"n": n},
                    ),
                    parent_id=parent.id,
                    cause_id=cause.id if cause else None,
                )
            self.offers.append(offer)
            self.by_producer[producer].append(offer)
            try:
                accepted = await submit(rt, offer)
            except StorageClosed:
                return  # the storage actor crashed: this offer is not acknowledged
            except Exception as exc:
                self.unexpected.append(exc)
                raise
            self.acknowledged[offer.delivery] = accepted
            own.append(accepted)
            if rng.random() < 0.15:
                self.clock.advance(rng.choice([1_000, 25_000, 60_000]))


def contains(exc: BaseException | None, kind: type[BaseException]) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(kind) is not None
    return isinstance(exc, kind)


def read_store(path: str) -> tuple[list[dict[str, object]], Counter[tuple[str, int]], set[str], int]:
    """Everything the database holds: events, causal buckets, pinned roots, rejections."""
    events = raw.query(path, "SELECT * FROM events ORDER BY seq")
    buckets = Counter(
        {(r["root_id"], r["minute"]): r["count"] for r in raw.query(path, "SELECT * FROM causal_buckets")}
    )
    roots = {r["root_id"] for r in raw.query(path, "SELECT root_id FROM causal_roots")}
    rejections = raw.query(path, "SELECT count(*) AS n FROM kv WHERE namespace = 'core.causal.rejections'")[
        0
    ]["n"]
    return events, buckets, roots, rejections


def check_consistent(path: str) -> dict[Delivery, dict[str, object]]:
    """No half-written acceptance: every Event has its root pin or its bucket charges, and no more."""
    events, buckets, roots, rejections = read_store(path)
    by_id = {e["id"]: e for e in events}
    by_delivery = {(str(e["source"]), str(e["delivery_id"])): e for e in events}
    assert len(by_id) == len(by_delivery) == len(events), "each Event stored once"
    assert rejections == 0

    assert roots == {e["id"] for e in events if e["parent_id"] is None}, "every root pinned, nothing else"
    charges: Counter[tuple[str, int]] = Counter()
    for e in events:
        if e["parent_id"] is None:
            assert (e["root_id"], e["depth"]) == (e["id"], 0)
            continue
        parent = by_id[e["parent_id"]]
        cause = by_id[e["cause_id"]] if e["cause_id"] is not None else parent
        assert e["root_id"] == cause["root_id"]
        assert e["depth"] == max(int(parent["depth"]), int(cause["depth"])) + 1  # type: ignore[call-overload]
        minute = int(e["accepted_at_ms"]) // 60_000  # type: ignore[call-overload]
        for root in {cause["root_id"], parent["root_id"]}:
            charges[(str(root), minute)] += 1
    assert buckets == charges, "bucket counts equal the derived Events charged to each root and minute"
    return by_delivery


@pytest.mark.parametrize("seed", [11, 23, 37, 41, 59])
@pytest.mark.parametrize("boundary", [BEFORE_COMMIT, AFTER_COMMIT])
async def test_a_crash_at_a_commit_boundary_loses_nothing_acknowledged_and_replay_converges(
    durable_store: str, boundary: Boundary, seed: int
) -> None:
    rng = random.Random(seed)
    path = durable_store
    clock = ManualClock(start_ms=T0)
    async with runtime(path, clock) as rt:
        seeds = [
            await rt.publish(
                EventIn(
                    source="bot", delivery_id=f"seed-{i}", type="bot.seeded", scope="acme", key=f"seed/{i}"
                )
            )
            for i in range(SEED_ROOTS)
        ]
    load = Load(rng, clock, seeds)

    # Every producer makes its offers one after another, so there are at least
    # OFFERS_PER_PRODUCER batches: the crash is sure to come.
    fault = CrashAt(boundary, rng.randint(1, OFFERS_PER_PRODUCER))
    stopped_by: BaseException | None = None
    try:
        async with runtime(path, clock, fault) as rt, trio.open_nursery() as producers:
            for p in range(PRODUCERS):
                producers.start_soon(load.produce, rt, p, random.Random(rng.random()))
    except BaseException as exc:  # CrashPoint, possibly in a group with other actors' endings
        stopped_by = exc
    assert fault.fired
    assert contains(stopped_by, CrashPoint), f"the runtime did not stop with CrashPoint: {stopped_by!r}"
    assert load.unexpected == [], "producers saw only acknowledgements or StorageClosed"
    assert len(load.offers) > len(load.acknowledged), "the crash cut some offers short"

    # Reopened: every acknowledged Event is there once, as acknowledged; nothing is invented.
    after_crash = check_consistent(path)
    offered = {offer.delivery for offer in load.offers}
    seeded = {("bot", f"seed-{i}") for i in range(SEED_ROOTS)}
    assert set(after_crash) <= offered | seeded
    for delivery, event in load.acknowledged.items():
        assert delivery in after_crash, f"acknowledged {delivery} was lost"
        assert (after_crash[delivery]["id"], after_crash[delivery]["seq"]) == (event.id, event.seq)
    if boundary == BEFORE_COMMIT:
        assert set(after_crash) == set(load.acknowledged) | seeded, "the crashed batch left no trace"

    # Replay every offer (each producer's in its order): committed ones come back as
    # duplicates of what was stored, the rest are accepted now.
    async def replay(rt: Runtime, offers: list[Offer]) -> None:
        for offer in offers:
            result = await submit(rt, offer)
            assert result.duplicate == (offer.delivery in after_crash)
            if result.duplicate:
                assert (result.id, result.seq) == (
                    after_crash[offer.delivery]["id"],
                    after_crash[offer.delivery]["seq"],
                )

    async with runtime(path, clock) as rt, trio.open_nursery() as nursery:
        for offers in load.by_producer.values():
            nursery.start_soon(replay, rt, offers)

    final = check_consistent(path)
    assert set(final) == offered | seeded, "each offered Event present exactly once"
    for delivery, row in after_crash.items():
        assert final[delivery] == row, "replay changed nothing already committed"


@pytest.mark.parametrize("boundary", [BEFORE_COMMIT, AFTER_COMMIT])
@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 13])
async def test_a_crash_with_every_actor_running_ends_the_runtime_with_the_crash_point_alone(
    tmp_path: Path, boundary: Boundary, batch: int
) -> None:
    """docs/testing.md: the runtime ends with `CrashPoint`. With every actor running, the actors'
    closed feeds and refused requests follow the crash. Catches a runtime that ends with a group
    holding them beside it, some not loom's (``trio.EndOfChannel`` from a closed feed), so a test's
    ``except* CrashPoint`` let the rest out (seen with the default actors, run to run different)."""
    db = str(tmp_path / "loom.db")

    async def run() -> None:
        async with open_runtime(db, clock=ManualClock(start_ms=T0_MS), fault=CrashAt(boundary, batch)) as rt:
            for n in range(30):
                await rt.publish(EventIn(source="t", delivery_id=f"d-{n}", type="a", scope="s"))
            await rt.wait_idle()

    with trio.fail_after(30), pytest.raises(CrashPoint):
        await run()
