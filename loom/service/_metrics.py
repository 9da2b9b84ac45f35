"""Prometheus metrics for ``loom serve``: counters from the runtime's commit notices (`Runtime.watch`),
and gauges read from the store at each scrape (`Runtime.gauges`: bounded indexed reads), so on
PostgreSQL with several nodes each node's counters are its own and every node's gauges agree.

Every counter comes from a notice the storage actor published after a commit: acceptances
(`EventAccepted`), routing checkpoints (`EventRouted`), firing ledger entries (`TimerFired`), wakes
(the one ``core.wait.woken`` bridge Event each wake accepts), retries (the ``core.retry.due`` and
``core.retry.requested`` Events), attempts started (`AttemptStarted`, with the latencies before them)
and ended (`AttemptEnded`, by outcome), recovered leases (`LeaseRecovered`), each batch's size and thread-hop time
(`Committed`), and what compaction removed (`Compacted`). A watcher that falls behind counts a lag
instead of guessing what it missed.

The size gauges (rows per table, the database's bytes and its free part) are read from the store
when ``/metrics`` is scraped, at most once every `SIZE_EVERY_S` (counting rows is not free).
"""

from __future__ import annotations

from collections.abc import Mapping

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..records.compaction import COUNTS
from ..records.core_events import RETRY_DUE, RETRY_REQUESTED, WAIT_WOKEN
from ..records.notices import (
    AttemptEnded,
    AttemptStarted,
    Committed,
    Compacted,
    EventAccepted,
    EventRouted,
    Lagged,
    LeaseRecovered,
    Notice,
    TimerFired,
)
from ..runtime import Runtime

CONTENT_TYPE = CONTENT_TYPE_LATEST
OUTCOMES = (
    "completed",
    "handoff",
    "failed",
    "waited",
    "parked",
    "cancelled",
    "interrupted",
    "timed_out",
    "not_adoptable",
)
"""How an attempt ends (`AttemptEnded.outcome`): each is served from the start, at 0."""
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
    3600.0,
)
WATCH_CAPACITY = 65_536
"""Commit batches the metrics watcher may fall behind before it counts a lag."""
SIZE_EVERY_S = 60.0
"""The size gauges are read from the store at most this often (monotonic seconds)."""


class Metrics:
    """The service's metrics, in a registry of its own (several services can share a process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.accepted = Counter(
            "loom_events_accepted", "Events durably accepted (new, not duplicates)", registry=r
        )
        self.routed = Counter(
            "loom_events_routed", "Routing checkpoints written, by status", ["status"], registry=r
        )
        self.fired = Counter(
            "loom_timers_fired", "Firings written to the timer ledger, by result", ["result"], registry=r
        )
        self.woken = Counter("loom_waits_woken", "Waits woken (one core.wait.woken bridge each)", registry=r)
        self.recovered = Counter(
            "loom_attempts_recovered",
            "Attempts whose lease expired, claimed again at a higher epoch",
            ["relaunch"],
            registry=r,
        )
        self.started = Counter(
            "loom_attempts_started",
            "Attempts started on this node (resumed: a parked attempt going on after its wait)",
            ["resumed"],
            registry=r,
        )
        self.ended = Counter(
            "loom_attempts_ended",
            "Attempts that ended (or parked on a wait) on this node, by outcome",
            ["outcome"],
            registry=r,
        )
        for outcome in OUTCOMES:
            self.ended.labels(outcome=outcome)
        for resumed in ("false", "true"):
            self.started.labels(resumed=resumed)
        self.retries = Counter(
            "loom_retries",
            "Retries: automatic (a failed attempt's backoff came due) or manual (an operator's retry)",
            ["kind"],
            registry=r,
        )
        for kind in ("automatic", "manual"):
            self.retries.labels(kind=kind)
        self.event_to_start = Histogram(
            "loom_event_to_start_seconds",
            "From the acceptance of the Event that triggers an attempt to the attempt's start (this node's starts)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ready_to_start = Histogram(
            "loom_ready_to_start_seconds",
            "From a Work joining the ready queue to its attempt's start: the wait for admission (this node's starts)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_requests = Histogram(
            "loom_storage_batch_requests",
            "Requests per committed storage batch (group commit)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.commit_seconds = Histogram(
            "loom_storage_commit_seconds",
            "Time of a committed batch's thread hop, from BEGIN to COMMIT",
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        self.fire_lateness = Histogram(
            "loom_timer_fire_lateness_seconds",
            "How late each timer firing committed after its due time (this node's firings)",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
            registry=r,
        )
        self.works = Gauge("loom_works", "Works in the store, by state", ["state"], registry=r)
        self.ready = Gauge(
            "loom_works_ready",
            "The ready queue: Works waiting for the admission pass to start them",
            registry=r,
        )
        self.unrouted = Gauge(
            "loom_events_unrouted",
            "Accepted Events not routed yet (among the last 100,000 accepted)",
            registry=r,
        )
        self.timers_armed = Gauge("loom_timers_armed", "Timers armed and not yet fired", registry=r)
        self.timers_overdue = Gauge(
            "loom_timers_overdue", "Armed timers whose due time has passed", registry=r
        )
        self.timer_overdue_seconds = Gauge(
            "loom_timer_overdue_seconds",
            "How far past its due time the earliest armed timer is (0: none is due)",
            registry=r,
        )
        self._due: list[int] = []
        self.compacted = Counter(
            "loom_compacted",
            "Rows compaction removed, by kind (logs: attempts whose logs were forgotten)",
            ["kind"],
            registry=r,
        )
        self.released = Counter(
            "loom_compaction_released_bytes", "Bytes compaction gave back to the file system", registry=r
        )
        self.rows = Gauge("loom_store_rows", "Rows per table of the store", ["table"], registry=r)
        self.size = Gauge(
            "loom_store_bytes",
            "The database's size (part=total) and the part that holds nothing (part=free)",
            ["part"],
            registry=r,
        )
        self._sized_at: float | None = None
        self.lagged = Counter(
            "loom_metrics_lagged",
            "Times the metrics watcher fell behind and missed notices (counts may be low)",
            registry=r,
        )

    def observe(self, notice: Notice) -> None:
        if isinstance(notice, EventAccepted):
            self.accepted.inc()
            if notice.event.type == WAIT_WOKEN:
                self.woken.inc()
            elif notice.event.type == RETRY_DUE:
                self.retries.labels(kind="automatic").inc()
            elif notice.event.type == RETRY_REQUESTED:
                self.retries.labels(kind="manual").inc()
        elif isinstance(notice, AttemptStarted):
            self.started.labels(resumed=str(notice.resumed).lower()).inc()
            if notice.trigger_accepted_at_ms is not None:
                self.event_to_start.observe(max(0, notice.at_ms - notice.trigger_accepted_at_ms) / 1000)
            ready = notice.ready_at_ms if notice.ready_at_ms is not None else notice.at_ms
            self.ready_to_start.observe(max(0, notice.at_ms - ready) / 1000)
        elif isinstance(notice, AttemptEnded):
            self.ended.labels(outcome=notice.outcome).inc()
        elif isinstance(notice, EventRouted):
            self.routed.labels(status=notice.status.value).inc()
        elif isinstance(notice, TimerFired):
            self.fired.labels(result=notice.result.value).inc()
            self._due.append(notice.fire_at_ms)
        elif isinstance(notice, LeaseRecovered):
            self.recovered.labels(relaunch=str(notice.relaunch).lower()).inc()
        elif isinstance(notice, Committed):
            for due in self._due:  # the firings of this batch committed at its time
                self.fire_lateness.observe(max(0, notice.at_ms - due) / 1000)
            self._due.clear()
            self.batch_requests.observe(notice.requests)
            self.commit_seconds.observe(notice.seconds)
        elif isinstance(notice, Compacted):
            for kind in COUNTS:
                if n := getattr(notice.report, kind):
                    self.compacted.labels(kind=kind).inc(n)
            self.released.inc(notice.report.released_bytes)
        elif isinstance(notice, Lagged):
            self.lagged.inc()

    async def read_sizes(self, rt: Runtime) -> None:
        """Read the size gauges from the store, unless they were read less than `SIZE_EVERY_S` ago."""
        now = trio.current_time()
        if self._sized_at is not None and now - self._sized_at < SIZE_EVERY_S:
            return
        self._sized_at = now
        size = await rt.store_size()
        for table, rows in size.rows.items():
            self.rows.labels(table=table).set(rows)
        self.size.labels(part="total").set(size.bytes)
        self.size.labels(part="free").set(size.free_bytes)

    async def run(
        self, rt: Runtime, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Count every notice from now until the runtime closes."""
        async with rt.watch(capacity=WATCH_CAPACITY) as notices:
            task_status.started()
            async for notice in notices:
                self.observe(notice)

    def set_gauges(self, figures: Mapping[str, int | None], now_ms: int) -> None:
        """The store's figures (`Runtime.gauges`), read for this scrape."""
        for name, value in figures.items():
            if name.startswith("works_") and value is not None:
                self.works.labels(state=name.removeprefix("works_")).set(value)
        self.ready.set(figures.get("ready") or 0)
        self.unrouted.set(figures.get("unrouted") or 0)
        self.timers_armed.set(figures.get("timers_armed") or 0)
        self.timers_overdue.set(figures.get("timers_overdue") or 0)
        earliest = figures.get("earliest_timer_ms")
        self.timer_overdue_seconds.set(0 if earliest is None else max(0, now_ms - earliest) / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
