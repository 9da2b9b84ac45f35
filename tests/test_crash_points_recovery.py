"""Crash points through lease recovery and retry (docs/testing.md "Crash points"; docs/recovery.md).

Five Works, each on its own path through recovery and retry:

* ``adopt``: attempt 1's lease is lost, recovery claims it at epoch 2, the host adopts and completes it.
* ``retry``: attempt 1's lease is lost, recovery finds it not adoptable: it fails under the new fence,
  the retry timer fires ``core.retry.due`` 5 minutes later, attempt 2 is claimed and completes.
* ``again``: as ``retry``, but the first recovery loses its own lease and is recovered again (epoch 3).
* ``fail``: attempt 1 completes `Failed`; its retry runs attempt 2, which completes.
* ``relaunch``: attempt 1 is claimed but never handed to its executor; its lost lease relaunches it
  as the same attempt at epoch 2, spending no retry.

The storage actor is stopped just before or just after the commit of one batch, for every batch of
the sequence (counted in a dry run first), then a fresh runtime on the store (the crashed host's
leases forgotten with it) drives every Work to its end from what the store says. The invariants,
checked after the crash, after the reopen's every round and at the end, are read from the database
itself (`loom.testing.raw`, one snapshot per check):

* nothing lost: every acknowledged Event is stored once;
* no attempt runs twice under live authority: at most one live execution per Work, attempt numbers
  1..N with no gap, every new lease of an attempt at a higher epoch than any before it, and a lease
  replaced by a recovery can commit nothing (its completion is refused at once);
* no retry spent twice: a Work's ``failures`` equals its failed attempts until it succeeds, there is
  exactly one ``retry:<work>:<attempt>`` timer per failed attempt and none for any other, each fires
  at most once and has at most one ``core.retry.due`` Event, and attempt N+1 exists only after that
  Event; a relaunch spends no retry and starts no attempt;
* every Work ends completed, by exactly the path its story allows.

Wrong implementations these tests catch (the first four were each put in and seen to fail here):

* `recover_claim_in_tx` keeping the old epoch (a recovered lease no higher than the one it replaced);
* `apply_failure_in_tx` arming no retry timer (a failed Work never runs again: the drive stalls, and
  the failed attempt has no timer);
* recovery at ``now > expires_at`` only (expiry not exclusive: the drive, which moves the clock to
  the exact expiry, stalls);
* a relaunch that starts attempt N+1 or counts a failure;
* a retry timer fired twice, or its ``core.retry.due`` accepted twice, after a crash between the
  firing and its application; a stale lease that still commits after a recovery.

The host-driven runtime (``actors=()``) makes the batch sequence deterministic: every batch is one
the host submitted. One variant runs the real actors with the `FakeExecutor` (batch counts vary a
little there, so a crash point past the end of a run simply does not fire).

Every test runs on a SQLite file and on a PostgreSQL database (a fresh copy of a migrated template
per crash point, where SQLite copies a file). A run on PostgreSQL takes a few times as long (a server
round trip per statement, a database per run), so there the crashes are fewer, and chosen: the host
sequence crashes at the first batch of each kind it commits, a kind being the procedure and the
notices it committed (accept, route, claim, a failure arming its retry, a success, a stale lease
refused, recover, adopt, not adoptable, a timer firing, and the scans and reads that change nothing:
sixteen points at each boundary instead of all seventy-three), and the real actors at eight points
spread over the dry run instead of forty. On both backends, one more run of the real actors crashes
right after the first commit that leaves an attempt claimed, which must have marked it handed to
its executor (the runtime launches it at once), so the reopen recovers it through the executor and
never relaunches it blindly. The procedures and the invariants are the same code on both backends; what PostgreSQL
adds (its transactions, a crashed connection abandoned mid-batch, a reopen on the same server)
every one of those points goes through.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from loom import (
    Completed,
    Config,
    EventIn,
    ExecutionState,
    Failed,
    Lease,
    Outcome,
    Recovery,
    RunRequest,
    Runtime,
    StaleAuthority,
    StorageClosed,
    Toolbelt,
    Watch,
    open_runtime,
)
from loom.kernel.executions import BindingRef, claim_in_tx, claim_request
from loom.notices import Committed, Lagged
from loom.plugins.handlers import work_id_for_key
from loom.store import FaultHook, SQLiteStore, Store, as_store
from loom.testing import T0_MS, FakeExecutor, ManualClock, RecoverAnswer, raw
from loom.testing.faults import AFTER_COMMIT, BEFORE_COMMIT, Boundary, CrashAt, CrashPoint
from loom.testing.internals import storage_of

FreshStore = Callable[[str], str]

SCOPE = "acme"
LEASE = 1_000
MINUTE = 60_000
STORIES = ("adopt", "retry", "again", "fail", "relaunch")
ACTOR_STORIES = ("adopt", "retry", "detached", "fail")
"""With the real actors: ``detached`` is attempt 1 found finished by `recover` (its result commits
under the recovered lease); ``again`` and ``relaunch`` need a host that forgets on purpose."""
WORKS = {work_id_for_key(SCOPE, story): story for story in (*STORIES, *ACTOR_STORIES)}
ATTEMPTS = {"adopt": 1, "relaunch": 1, "detached": 1, "retry": 2, "again": 2, "fail": 2}
"""How many attempts each story takes, crash or no crash."""
RECOVERED = frozenset({"adopt", "relaunch", "detached"})
"""Stories that end under a recovered lease (epoch 2 or higher) and spend no retry."""
FAKE = BindingRef(name="fake", executor="fake")
MAX_ROUNDS = 200
LIVE = ("running", "stopping", "parked", "recovering")


def config() -> Config:
    route = {"name": "r", "types": ["r.*"], "create_work": True, "binding": "fake"}
    return Config.from_dict(
        {"scopes": {SCOPE: {"bindings": {"fake": {"executor": "fake"}}, "routes": [route]}}}
    )


def start(story: str) -> EventIn:
    return EventIn(source="t", delivery_id=f"{story}-0", type="r.start", scope=SCOPE, key=story)


class Stalled(AssertionError):
    pass


@attrs.define
class Ledger:
    """What the host was told, across crashes: the test's memory, which a crash does not take."""

    acked: set[str] = attrs.Factory(set)
    """Delivery ids of acknowledged Events."""
    grants: dict[str, list[Lease]] = attrs.Factory(dict)
    """By Work: every lease the host was handed (claims and recoveries), in the order it got them."""
    completed: dict[str, tuple[int, int]] = attrs.Factory(dict)
    """By Work: the (attempt, epoch) of an acknowledged successful completion."""
    stale_refused: int = 0
    """Replaced leases whose completion was refused right after their replacement."""
    relaunched: set[str] = attrs.Factory(set)
    """Works whose attempt the fake saw launched again (not adopted) at a higher epoch."""

    def grant(self, lease: Lease) -> None:
        earlier = [g for g in self.grants.get(lease.work_id, []) if g.attempt == lease.attempt]
        assert all(g.epoch < lease.epoch for g in earlier), (
            f"work {WORKS[lease.work_id]}: attempt {lease.attempt} leased at epoch {lease.epoch} after "
            f"epochs {[g.epoch for g in earlier]}: a new lease must be at a higher epoch"
        )
        assert all(g.token != lease.token for g in earlier), "a recovery reused an old token"
        self.grants.setdefault(lease.work_id, []).append(lease)


def contains_only_crash(exc: BaseException) -> bool:
    """The runtime stopped with `CrashPoint`; anything else in the group is callers told `StorageClosed`,
    cancelled on the way down, or an actor whose commit notices ended with the storage actor."""
    if not isinstance(exc, BaseExceptionGroup):
        return isinstance(exc, CrashPoint)
    crash, rest = exc.split(CrashPoint)
    if crash is None:
        return False
    if rest is not None:
        _, unexpected = rest.split((StorageClosed, trio.Cancelled, trio.EndOfChannel))
        if unexpected is not None:
            raise unexpected
    return True


# -- the host ------------------------------------------------------------------------------------------


@attrs.frozen
class Seen:
    """One Work as the host reads it from the store: enough to choose its next step."""

    id: str
    state: str
    retry: str | None
    held: bool
    attempts: int
    pending: int
    execution: raw.Row | None
    """Its live attempt, if any."""


def read_works(path: str, stories: tuple[str, ...]) -> list[Seen]:
    """The Works of ``stories`` as the store has them now (read directly, in one snapshot)."""
    with raw.snapshot(path) as conn:
        seen = []
        for work_id in sorted(w for w, story in WORKS.items() if story in stories):
            (work,) = rows(conn, "SELECT * FROM works WHERE id = ?", work_id) or [None]
            if work is None:
                continue
            pending = conn.value(
                "SELECT count(*) FROM work_inputs WHERE work_id = ? AND state = 'pending'", (work_id,)
            )
            live = rows(conn, f"SELECT * FROM executions WHERE work_id = ? AND state IN {LIVE}", work_id)
            seen.append(
                Seen(
                    id=work_id,
                    state=work["state"],
                    retry=work["retry"],
                    held=bool(work["held"]),
                    attempts=work["attempts"],
                    pending=pending,
                    execution=live[0] if live else None,
                )
            )
        return seen


class Host:
    """One host process on a runtime without background actors: it routes, fires and recovers with
    `Runtime.poll`, claims, completes, adopts and declares not adoptable itself. The leases it holds
    die with it; what it decides depends on the store and its story only, so a fresh host on the
    reopened file picks up wherever the crashed one stopped."""

    def __init__(self, rt: Runtime, path: str, clock: ManualClock, ledger: Ledger) -> None:
        self.rt = rt
        self.path = path
        self.clock = clock
        self.ledger = ledger
        self.held: dict[str, Lease] = {}
        """By execution id: the lease this host holds for it."""

    async def drive(self) -> None:
        for story in STORIES:
            event = await self.rt.publish(start(story))
            self.ledger.acked.add(event.delivery_id)
        quiet, poll = 0, True
        for _ in range(MAX_ROUNDS):
            if poll:  # routes what was published, fires what is due, claims what expired
                report = await self.rt.poll()
                assert report.failures == ()
                for recovery in report.recoveries:
                    await self.recovered(recovery)
            works = read_works(self.path, STORIES)
            if len(works) == len(STORIES) and all(w.state == "completed" for w in works):
                return
            acted = False
            for work in works:
                acted = await self.step(work) or acted
            check_store(self.path, self.ledger, STORIES)
            poll = not acted
            if acted or self.advance():
                quiet = 0
            else:
                quiet += 1
                if quiet > 2:
                    raise Stalled(f"nothing moves: {[(WORKS[w.id], w.state, w.retry) for w in works]}")
        raise Stalled(f"not done after {MAX_ROUNDS} rounds")

    async def recovered(self, recovery: Recovery) -> None:
        lease = recovery.lease
        story = WORKS[lease.work_id]
        # the relaunch's own commit marks it handed (it is launched at once): a later loss of it
        # (a crash after that commit) is recovered through the executor
        assert recovery.relaunch == (story == "relaunch" and lease.epoch == 2), (
            f"work {story}: relaunch={recovery.relaunch} at epoch {lease.epoch} (only an attempt never"
            " handed is relaunched)"
        )
        if recovery.relaunch:
            (work,) = raw.query(
                self.path, "SELECT attempts, failures, retry FROM works WHERE id = ?", (lease.work_id,)
            )
            left = (work["attempts"], work["failures"], work["retry"])
            assert left == (lease.attempt, 0, None), (
                f"work {story}: the relaunch left (attempts, failures, retry) = {left}: "
                "a relaunch is the same attempt and spends no retry"
            )
        replaced = [
            g for g in self.ledger.grants.get(lease.work_id, []) if g.execution_id == lease.execution_id
        ]
        self.ledger.grant(lease)
        if replaced:
            # the lease this recovery replaced has lost its authority at the recovery's commit
            with pytest.raises(StaleAuthority):
                await self.rt.complete(replaced[-1], Completed())
            self.ledger.stale_refused += 1
        self.held[lease.execution_id] = lease

    async def step(self, work: Seen) -> bool:
        """Take the Work's next step, if the host can; whether it did anything."""
        story = WORKS[work.id]
        execution = work.execution
        if work.state == "completed":
            return False
        if execution is None:
            if work.retry is not None or work.held or not work.pending:
                return False  # in backoff: its retry timer decides
            self.ledger.grant(await self.claim(work, handed=not (story == "relaunch" and work.attempts == 0)))
            return True
        lease = self.held.get(execution["id"])
        if lease is None or lease.epoch != execution["epoch"]:
            return False  # a lease this host does not hold: it expires, then recovery takes it
        attempt, epoch = execution["attempt"], execution["epoch"]
        if execution["state"] == "running":
            if (attempt, epoch) == (1, 1) and story != "fail":
                del self.held[lease.execution_id]  # the host loses it (its process is gone)
                return False
            outcome = Failed(error="boom") if story == "fail" and attempt == 1 else Completed()
            done = await self.rt.complete(lease, outcome)
            del self.held[lease.execution_id]
            if done.state is ExecutionState.COMPLETED:
                self.ledger.completed[work.id] = (done.attempt, done.epoch)
            return True
        assert execution["state"] == "recovering", f"work {story}: {execution['state']}"
        if story == "again" and (attempt, epoch) == (1, 2):
            del self.held[lease.execution_id]  # the recoverer dies too: its recovery lease runs out
            return False
        if story in ("retry", "again") and attempt == 1:
            await self.rt.not_adoptable(lease, "the process table was lost")
            del self.held[lease.execution_id]
            return True
        self.held[lease.execution_id] = await self.rt.adopt(lease)
        return True

    async def claim(self, work: Seen, *, handed: bool) -> Lease:
        if handed:
            lease = await self.rt.claim(work.id, owner="host", lease_ms=LEASE)
        else:
            # a claim whose segment was never handed to its executor (a host claim is handed at once):
            # what a runner that lost its lease before launching leaves behind
            request = claim_request(
                self.rt.config,
                await self.rt.work(work.id),
                owner="host",
                token=secrets.token_urlsafe(24),
                lease_ms=LEASE,
                binding=FAKE,
            )
            lease = await storage_of(self.rt).submit(claim_in_tx, request)
        self.held[lease.execution_id] = lease
        return lease

    def advance(self) -> bool:
        return advance(self.path, self.clock)


def advance(path: str, clock: ManualClock) -> bool:
    """Move the clock to the next lease expiry or timer, exactly (expiry is exclusive: that instant
    must do); whether it moved."""
    with raw.snapshot(path) as conn:
        expiry = conn.value(
            "SELECT min(expires_at_ms) FROM executions WHERE state IN ('running', 'recovering')"
        )
        timer = conn.value("SELECT min(fire_at_ms) FROM timers WHERE state = 'armed'")
    target = min((t for t in (expiry, timer) if t is not None), default=0)
    if target <= clock.now_ms():
        return False
    clock.set(target)
    return True


# -- the store's invariants -------------------------------------------------------------------------------


def rows(conn: raw.Snapshot, sql: str, *args: object) -> list[raw.Row]:
    return conn.query(sql, args)


def check_store(path: str, ledger: Ledger, stories: tuple[str, ...], *, final: bool = False) -> None:
    """The invariants above, read from the store itself in one snapshot."""
    with raw.snapshot(path) as conn:
        for delivery_id in ledger.acked:
            found = rows(conn, "SELECT id FROM events WHERE source = 't' AND delivery_id = ?", delivery_id)
            assert len(found) == 1, f"acknowledged Event {delivery_id} is stored {len(found)} times"
        for work_id, story in WORKS.items():
            if story not in stories:
                continue
            (work,) = rows(conn, "SELECT * FROM works WHERE id = ?", work_id) or [None]
            if work is None:
                assert not final, f"work {story} was never created"
                continue
            check_work(conn, story, work, ledger, final=final)


def check_work(conn: raw.Snapshot, story: str, work: raw.Row, ledger: Ledger, *, final: bool) -> None:
    executions = rows(conn, "SELECT * FROM executions WHERE work_id = ? ORDER BY attempt", work["id"])
    attempts = [e["attempt"] for e in executions]
    assert attempts == list(range(1, work["attempts"] + 1)), f"work {story}: attempts {attempts}"
    live = [e for e in executions if e["state"] in LIVE]
    assert len(live) <= 1, f"work {story}: two live attempts {[(e['attempt'], e['state']) for e in live]}"
    if live:
        assert live[0]["attempt"] == work["attempts"], f"work {story}: an old attempt is live"
    failed = [e["attempt"] for e in executions if e["state"] == "failed"]
    succeeded = [e for e in executions if e["state"] == "completed"]
    if not succeeded:
        assert work["failures"] == len(failed), (
            f"work {story}: failures {work['failures']}, but {len(failed)} attempts failed {failed}"
        )
    retry_timers = rows(conn, "SELECT * FROM timers WHERE id LIKE ?", f"retry:{work['id']}:%")
    assert sorted(t["id"] for t in retry_timers) == [f"retry:{work['id']}:{a}" for a in failed], (
        f"work {story}: retry timers {[t['id'] for t in retry_timers]} for failed attempts {failed}"
    )
    due_events = rows(conn, "SELECT * FROM events WHERE type = 'core.retry.due' AND work_id = ?", work["id"])
    fired = []
    for timer in retry_timers:
        firings = rows(conn, "SELECT * FROM timer_firings WHERE timer_id = ?", timer["id"])
        assert len(firings) <= 1, f"work {story}: retry timer {timer['id']} fired {len(firings)} times"
        attempt = int(timer["id"].rsplit(":", 1)[1])
        dues = [e for e in due_events if e["delivery_id"] == f"retry.due/{work['id']}/{attempt}"]
        assert len(dues) == len(firings), f"work {story}: {len(dues)} core.retry.due Events for {timer['id']}"
        if firings:
            fired.append(attempt)
    assert len(due_events) == len(fired), f"work {story}: core.retry.due Events without a firing"
    for e in executions[1:]:
        assert e["attempt"] - 1 in fired, (
            f"work {story}: attempt {e['attempt']} started before its retry was due"
        )
    if story in RECOVERED:
        assert (failed, work["failures"], work["retry"]) == ([], 0, None), (
            f"work {story}: a recovery that adopts or relaunches spent a retry"
        )
        assert work["attempts"] <= 1, f"work {story}: a recovery started attempt {work['attempts']}"
    if not final:
        return
    assert work["state"] == "completed", f"work {story} ended {work['state']}"
    assert [e["attempt"] for e in succeeded] == [work["attempts"]], f"work {story}: {attempts}"
    done = succeeded[0]
    assert work["attempts"] == ATTEMPTS[story], f"work {story} took {work['attempts']} attempts"
    assert failed == list(range(1, ATTEMPTS[story])), f"work {story}: failed attempts {failed}"
    if story in RECOVERED:
        assert done["epoch"] >= 2, f"work {story} completed at epoch {done['epoch']}, not after a recovery"
    if story == "again":
        assert executions[0]["epoch"] >= 3, "the recovery that lost its lease was not recovered again"
    if work["id"] in ledger.completed:
        assert ledger.completed[work["id"]] == (done["attempt"], done["epoch"])


# -- the runs -------------------------------------------------------------------------------------------


def store_at(path: str) -> Store | str:
    """The store at ``path``: a PostgreSQL URL as it is, a SQLite file without an fsync per commit
    (a crash point needs none to be a crash)."""
    return path if as_store(path).dialect.shared else SQLiteStore(path=path, synchronous="NORMAL")


@asynccontextmanager
async def host_runtime(
    path: str, clock: ManualClock, fault: FaultHook | None = None
) -> AsyncIterator[Runtime]:
    async with open_runtime(
        store_at(path),
        clock=clock,
        config=config(),
        plugins=[FakeExecutor()],
        load_entry_points=False,
        actors=(),
        fault=fault,
        lease_ms=LEASE,
    ) as rt:
        yield rt


Kind = tuple[str, tuple[str, ...]]
"""What a batch did: the procedure it ran and the kinds of notice it committed (``complete_in_tx``
with ``WorkChanged`` and ``TimerArmed`` is a failure arming its retry; with none, a stale lease
refused)."""


class Batches:
    """A fault hook that counts committed batches; once it `watch`es a host-driven runtime, it also
    tells each batch's `Kind` (the host submits one request at a time and waits for it, so a batch
    holds the request submitted last)."""

    def __init__(self) -> None:
        self.batches = 0
        self._procedures: dict[int, str] = {}
        self._submitted = ""
        self._notices: Watch | None = None

    def watch(self, rt: Runtime) -> None:
        storage = storage_of(rt)
        submit = storage.submit

        async def recording(proc: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            self._submitted = proc.__name__
            return await submit(proc, *args, **kwargs)

        storage.submit = recording  # type: ignore[method-assign]
        self._notices = rt.watch()

    def __call__(self, point: str, batch_no: int) -> None:
        if point == "after_commit":
            self.batches = batch_no
            self._procedures[batch_no] = self._submitted

    async def kinds(self) -> dict[int, Kind]:
        """The kind of every batch committed so far, by batch number (their notices are all waiting:
        a batch's notices are offered before its callers hear back)."""
        assert self._notices is not None, "not watching"
        kinds: dict[int, Kind] = {}
        changed: set[str] = set()
        while len(kinds) < self.batches:
            notice = await self._notices.__anext__()
            assert not isinstance(notice, Lagged)
            if isinstance(notice, Committed):
                kinds[notice.batch] = (self._procedures[notice.batch], tuple(sorted(changed)))
                changed = set()
            else:
                changed.add(type(notice).__name__)
        return kinds


def first_of_each(kinds: dict[int, Kind]) -> list[int]:
    """The first batch of each kind a run committed."""
    first: dict[Kind, int] = {}
    for batch_no, kind in sorted(kinds.items()):
        first.setdefault(kind, batch_no)
    return sorted(first.values())


async def refuse_stale(rt: Runtime, ledger: Ledger) -> None:
    """Every lease the hosts were ever handed is stale once every Work is done: none commits anything."""
    for leases in ledger.grants.values():
        for lease in leases:
            with pytest.raises(StaleAuthority):
                await rt.complete(lease, Failed(error="stale"))


async def host_run(path: str, fault: FaultHook | None) -> tuple[Ledger, dict[int, Kind] | None]:
    """Drive the five Works on a fresh store, crashing where ``fault`` says; then reopen and drive to
    the end. Returns the ledger and, when it did not crash, the kind of each batch the drive
    committed, by batch number (1 to the drive's last)."""
    clock = ManualClock(start_ms=T0_MS)
    ledger = Ledger()
    counter = Batches()
    batches: dict[int, Kind] | None = None

    def hook(point: str, batch_no: int) -> None:
        counter(point, batch_no)
        if fault is not None:
            fault(point, batch_no)

    try:
        async with host_runtime(path, clock, hook) as rt:
            counter.watch(rt)
            await Host(rt, path, clock, ledger).drive()
            assert storage_of(rt).stats.requests == counter.batches, "a batch held two requests"
            batches = await counter.kinds()
            await refuse_stale(rt, ledger)
    except BaseException as exc:
        if not contains_only_crash(exc):
            raise
        check_store(path, ledger, STORIES)
        async with host_runtime(path, clock) as rt:
            await Host(rt, path, clock, ledger).drive()
            await refuse_stale(rt, ledger)
    check_store(path, ledger, STORIES, final=True)
    return ledger, batches


async def test_the_host_driven_sequence_ends_well_without_a_crash(durable_store: str) -> None:
    """The dry run: each story takes its path (the checks would fail on any other) and every replaced
    lease was refused right after its replacement."""
    ledger, batches = await host_run(durable_store, None)
    assert batches is not None
    assert len(batches) > 40
    # recoveries: adopt 1, retry 1, again 2, relaunch 1: each refused its replaced lease
    assert ledger.stale_refused == 5
    epochs = {WORKS[w]: [(g.attempt, g.epoch) for g in leases] for w, leases in ledger.grants.items()}
    assert epochs == {
        "adopt": [(1, 1), (1, 2)],
        "retry": [(1, 1), (1, 2), (2, 1)],
        "again": [(1, 1), (1, 2), (1, 3), (2, 1)],
        "fail": [(1, 1), (2, 1)],
        "relaunch": [(1, 1), (1, 2)],
    }


@pytest.mark.parametrize("boundary", [BEFORE_COMMIT, AFTER_COMMIT])
async def test_a_crash_at_every_batch_of_recovery_and_retry_loses_nothing_and_spends_no_retry_twice(
    durable_backend: str, fresh_store: FreshStore, boundary: Boundary
) -> None:
    """On a SQLite file at every batch of the dry run; on PostgreSQL at the first batch of each kind
    (see the module's docstring)."""
    _, batches = await host_run(fresh_store("dry"), None)
    assert batches is not None
    points = sorted(batches) if durable_backend == "file" else first_of_each(batches)
    assert len(points) >= 12, f"the dry run committed only {set(batches.values())}"
    for n in points:
        fault = CrashAt(boundary, n)
        path = fresh_store(f"crash-{n}")  # each run starts from an empty store
        try:
            _, uncrashed = await host_run(path, fault)
        except AssertionError as exc:
            raise AssertionError(f"crash at {boundary} of batch {n}: {exc}") from exc
        assert fault.fired, f"batch {n} of {len(batches)} never ran"
        assert uncrashed is None


# -- the real actors ----------------------------------------------------------------------------------------

STALL_SECONDS = 20.0
"""A real-time bound on waiting for the runtime to settle: a failure, never a synchronisation."""


class StoryExecutor(FakeExecutor):
    """The fake, answering `recover` by each Work's story and attempt: ``retry`` cannot verify its
    first attempt, ``detached`` finds its first attempt already finished, anything else is adopted
    (a fresh one per process: what a crashed process ran is gone with it)."""

    async def recover(self, request: RunRequest, toolbelt: Toolbelt, metadata: Mapping[str, Any]) -> Outcome:
        story = WORKS[request.work_id]
        answer: RecoverAnswer | Outcome = RecoverAnswer.ADOPT
        if request.attempt == 1 and story == "retry":
            answer = RecoverAnswer.NOT_ADOPTABLE
        elif request.attempt == 1 and story == "detached":
            answer = Completed()
        self.recover_answers[request.work_id] = answer
        return await super().recover(request, toolbelt, metadata)


class ActorHost:
    """Publishes, then lets the router, timer and recovery actors run the Works through the fake: it
    finishes launches, leaves each story's first attempt to lose its lease, and moves the clock."""

    def __init__(
        self, rt: Runtime, fake: FakeExecutor, path: str, clock: ManualClock, ledger: Ledger
    ) -> None:
        self.rt = rt
        self.fake = fake
        self.path = path
        self.clock = clock
        self.ledger = ledger

    async def drive(self) -> None:
        for story in ACTOR_STORIES:
            event = await self.rt.publish(start(story))
            self.ledger.acked.add(event.delivery_id)
        quiet = 0
        for _ in range(MAX_ROUNDS):
            await self.settle()
            works = read_works(self.path, ACTOR_STORIES)
            check_store(self.path, self.ledger, ACTOR_STORIES)
            if len(works) == len(ACTOR_STORIES) and all(w.state == "completed" for w in works):
                return
            acted = False
            for launch in self.fake.launches:
                if launch.done.is_set() or launch.cancelled:
                    continue
                story, attempt = WORKS[launch.request.work_id], launch.request.attempt
                if not launch.recovered and launch.lease.epoch > 1:
                    self.ledger.relaunched.add(launch.request.work_id)
                if attempt == 1 and not launch.recovered and story != "fail":
                    continue  # left to lose its lease (a relaunch of it too): recovery takes it
                outcome = Failed(error="boom") if story == "fail" and attempt == 1 else Completed()
                self.fake.finish(launch.request.work_id, outcome)
                acted = True
            if acted or advance(self.path, self.clock):
                quiet = 0
            else:
                quiet += 1
                if quiet > 2:
                    raise Stalled(f"nothing moves: {[(WORKS[w.id], w.state, w.retry) for w in works]}")
        raise Stalled(f"not done after {MAX_ROUNDS} rounds")

    async def settle(self) -> None:
        """Until the actors are idle and every attempt this runtime leases has reached the fake (a
        launch is outside the actors' count once it starts)."""
        with trio.move_on_after(STALL_SECONDS) as guard:
            async with self.rt.watch() as notices:
                while True:
                    await self.rt.wait_idle()
                    if self.launched():
                        return
                    async with trio.open_nursery() as nursery:

                        async def on_commit() -> None:
                            await notices.__anext__()
                            nursery.cancel_scope.cancel()

                        async def on_launch() -> None:
                            await self.fake.next_launch()
                            nursery.cancel_scope.cancel()

                        nursery.start_soon(on_commit)
                        nursery.start_soon(on_launch)
        if guard.cancelled_caught:
            raise Stalled("the runtime did not settle")

    def launched(self) -> bool:
        owner = self.rt._p.owner
        live = raw.query(self.path, f"SELECT * FROM executions WHERE owner = ? AND state IN {LIVE}", (owner,))
        handed = {(launch.request.execution_id, launch.lease.epoch) for launch in self.fake.launches}
        return all(e["state"] == "running" and (e["id"], e["epoch"]) in handed for e in live)


@asynccontextmanager
async def actor_runtime(
    path: str, clock: ManualClock, fault: FaultHook | None, owner: str
) -> AsyncIterator[tuple[Runtime, FakeExecutor]]:
    fake = StoryExecutor()
    async with open_runtime(
        store_at(path),
        clock=clock,
        config=config(),
        plugins=[fake],
        load_entry_points=False,
        fault=fault,
        lease_ms=LEASE,
        owner=owner,
    ) as rt:
        yield rt, fake


async def actor_run(path: str, fault: FaultHook | None) -> tuple[Ledger, int | None]:
    """As `host_run`, with the real actors."""
    clock = ManualClock(start_ms=T0_MS)
    ledger = Ledger()
    counter = Batches()
    batches: int | None = None

    def hook(point: str, batch_no: int) -> None:
        counter(point, batch_no)
        if fault is not None:
            fault(point, batch_no)

    try:
        async with actor_runtime(path, clock, hook, "node-1") as (rt, fake):
            await ActorHost(rt, fake, path, clock, ledger).drive()
            batches = counter.batches
    except BaseException as exc:
        if not contains_only_crash(exc):
            raise
        check_store(path, ledger, ACTOR_STORIES)
        async with actor_runtime(path, clock, None, "node-2") as (rt, fake):
            await ActorHost(rt, fake, path, clock, ledger).drive()
    check_store(path, ledger, ACTOR_STORIES, final=True)
    return ledger, batches


@attrs.define
class CrashAfterClaim:
    """Crash right after the first commit that leaves an attempt claimed by the runtime (what a
    process killed between a claim and its launch leaves behind), noting which of the attempts it
    claimed that commit left unmarked."""

    path: str
    fired: bool = False
    unmarked: list[str] = attrs.Factory(list)

    def __call__(self, point: str, batch_no: int) -> None:
        if self.fired or point != AFTER_COMMIT:
            return
        claimed = "SELECT id, handed_at_ms FROM executions WHERE state = 'running' AND executor IS NOT NULL"
        rows = raw.query(self.path, claimed)
        if rows:
            self.fired = True
            self.unmarked = [row["id"] for row in rows if row["handed_at_ms"] is None]
            raise CrashPoint(f"crash point: an attempt claimed, after batch {batch_no}")


async def test_a_crash_with_the_real_actors_recovers_every_attempt_through_the_fake(
    durable_backend: str, fresh_store: FreshStore
) -> None:
    """The router, timer and recovery actors with the `FakeExecutor`: crashed before or after a commit
    (on a SQLite file about forty batches spread over a dry run's count, on PostgreSQL eight,
    alternating the boundary), reopened by a process with a fresh fake, every Work still ends by its
    story's path with the invariants above. A claim's commit marks its attempt handed to its executor
    (the runtime launches it at once): a crash right after that commit (one run crashes there on
    purpose) leaves it to the executor's `recover`, never relaunched blindly beside what it may have
    started. Catches: a claim committed without the mark (the handed mark a commit of its own)."""
    _, batches = await actor_run(fresh_store("dry"), None)
    assert batches is not None
    assert batches > 20
    # the actors batch requests as they come, so a run may take far fewer batches than the dry run
    # (a third fewer seen under load): the points cover the dry run's first half, which runs reach
    last = batches // 2
    spread = 40 if durable_backend == "file" else 8
    points = range(1, last + 1, max(1, last // spread))
    fired = 0
    for i, n in enumerate(points):
        fault = CrashAt(BEFORE_COMMIT if i % 2 else AFTER_COMMIT, n)
        path = fresh_store(f"crash-{n}")
        try:
            ledger, _ = await actor_run(path, fault)
        except AssertionError as exc:
            raise AssertionError(f"crash at {fault.boundary} of batch {n}: {exc}") from exc
        fired += fault.fired
        assert not ledger.relaunched, f"crash at {fault.boundary} of batch {n}: an attempt was relaunched"
    # a crash point past a shorter run's end does not fire; most must
    assert fired >= len(points) * 3 // 4, f"only {fired} of {len(points)} crash points fired"

    path = fresh_store("crash-after-claim")
    after_claim = CrashAfterClaim(path)
    ledger, _ = await actor_run(path, after_claim)
    assert after_claim.fired, "no commit left an attempt claimed"
    assert not after_claim.unmarked, f"claims committed without the handed mark: {after_claim.unmarked}"
    assert not ledger.relaunched, "an attempt its claim marked handed was relaunched blindly"
