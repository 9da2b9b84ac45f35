"""Kill drills against ``loom serve`` (docs/operations.md; nothing acknowledged is lost,
nothing fires or wakes twice): a real server process on a SQLite file with ``--test-clock``, loaded over HTTP and killed
with SIGKILL at seeded random moments, then restarted.

Afterwards: every acknowledged Event is stored exactly once; every due timer fired exactly once; every
wait was woken exactly once and continued by one attempt; a 48-hour durable sleep armed before a kill
wakes once when the clock passes it after the restart; an hourly cron schedule fires each occurrence
across the crashes without starting one twice. The waiters run as shell attempts that park themselves
through the HTTP toolbelt with their bearer token, so the drill crosses every layer.

Nothing here sleeps to synchronise: conditions are polled on the server's read endpoints under a
deadline.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from service_kit import Server, start_server, until

from loom.plugins.schedule import ScheduleSpec, schedule_timer

SEED = int(os.environ.get("LOOM_DRILL_SEED", "20260101"))
CYCLES = 4
LOADERS = 16
MINUTE = 60_000
HOUR = 60 * MINUTE
STEP = Path(__file__).parent / "drills" / "shell_step.py"

CONFIG = f"""
[work_kinds.waiter]
retry_attempts = 10
retry_backoff_ms = [1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000]

[scopes.drill.bindings.sh]
executor = "shell"
config = {{ command = ["{sys.executable}", "{STEP}"], grace_s = 1 }}

[[scopes.drill.routes]]
name = "waiters"
types = ["drill.start", "drill.wake"]
create_work = true
work_kind = "waiter"
binding = "sh"

[[scopes.drill.routes]]
name = "cron"
types = ["drill.cron"]
handler = "schedule"
binding = "sh"

[[scopes.drill.routes]]
name = "log"
types = ["drill.*"]
policy = "drop"
reason = "load and ticks are recorded, not acted on"
"""


@attrs.define
class Drill:
    tmp: Path
    rng: random.Random
    acked: set[str] = attrs.Factory(set)
    timers: set[str] = attrs.Factory(set)
    waiters: list[str] = attrs.Factory(list)
    starts: int = 0
    server: Server | None = None

    @property
    def db(self) -> Path:
        return self.tmp / "drill.db"

    async def start(self) -> httpx.AsyncClient:
        config = self.tmp / "loom.toml"
        config.write_text(CONFIG)
        env = {"TMPDIR": str(self.tmp / "shell")}
        (self.tmp / "shell").mkdir(exist_ok=True)
        self.server = await trio.to_thread.run_sync(lambda: start_server(self.db, config=config, env=env))
        self.starts += 1
        return httpx.AsyncClient(base_url=self.server.url, timeout=30)

    def cleanup(self) -> None:
        """A failed drill leaves no server behind."""
        if self.server is not None and self.server.proc.poll() is None:
            self.server.kill()

    async def kill(self) -> None:
        assert self.server is not None
        await trio.to_thread.run_sync(self.server.kill)

    async def load_until_killed(self, client: httpx.AsyncClient, cycle: int) -> None:
        """Concurrent clients publish Events until a random number were acknowledged, then SIGKILL."""
        kill_after = self.rng.randint(40, 160)
        enough = trio.Event()
        count = 0

        async def loader(n: int) -> None:
            nonlocal count
            for i in range(100_000):
                delivery = f"c{cycle}-l{n}-{i}"
                body = {"source": "load", "delivery_id": delivery, "type": "drill.event", "scope": "drill"}
                try:
                    response = await client.post("/events", json=body)
                except httpx.TransportError:
                    return  # killed mid-request: not acknowledged
                assert response.status_code == 201, response.text
                self.acked.add(delivery)
                count += 1
                if count >= kill_after:
                    enough.set()

        async with trio.open_nursery() as nursery:
            for n in range(LOADERS):
                nursery.start_soon(loader, n)
            await enough.wait()
            await self.kill()
            nursery.cancel_scope.cancel()


async def all_waiting(client: httpx.AsyncClient, keys: list[str]) -> bool:
    for key in keys:
        response = await client.get(f"/work/by-key/{key}")
        if response.status_code != 200 or response.json()["work"]["state"] != "waiting":
            return False
    return True


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any], *ok: int) -> dict[str, Any]:
    response = await client.post(path, json=body)
    assert response.status_code in (ok or (200, 201)), (path, response.status_code, response.text)
    return response.json()  # type: ignore[no-any-return]


async def get(client: httpx.AsyncClient, path: str, **params: Any) -> Any:
    response = await client.get(path, params=params)
    assert response.status_code == 200, (path, response.text)
    return response.json()


async def all_pages(client: httpx.AsyncClient, path: str, key: str, **params: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after: Any = None
    while True:
        page = await get(
            client, path, limit=1000, **params, **({"after": after} if after is not None else {})
        )
        out += page[key]
        if page["next_after"] is None:
            return out
        after = page["next_after"]


# a request cut off by the kill leaves httpx's body generator unfinished; that is the kill, not a leak
HTTPX_CUT_OFF = (
    "ignore:Async generator 'httpx._content:ResourceWarning",
    "ignore:Exception ignored in. <async_generator object ByteStream:pytest.PytestUnraisableExceptionWarning",
)


@pytest.mark.filterwarnings(*HTTPX_CUT_OFF)
async def test_sigkill_at_random_moments_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    drill = Drill(tmp=tmp_path, rng=random.Random(SEED))
    try:
        await run_drill(drill)
    finally:
        drill.cleanup()


async def run_drill(drill: Drill) -> None:
    client = await drill.start()
    async with client:
        now = (await get(client, "/debug/clock"))["now_ms"]
        for i in range(8):
            timer = {"id": f"tick-{i}", "fire_at_ms": now + (i + 1) * 20 * MINUTE, "source": "drill",
                     "type": "drill.tick", "scope": "drill"}  # fmt: skip
            await post(client, "/timers", timer, 201)
            drill.timers.add(timer["id"])
        sleep = {"id": "sleep-48h", "fire_at_ms": now + 48 * HOUR, "source": "drill", "type": "drill.slept",
                 "scope": "drill"}  # fmt: skip
        await post(client, "/timers", sleep, 201)
        cron = schedule_timer(
            ScheduleSpec(schedule_id="hourly", cron="0 * * * *"),
            now_ms=now,
            source="drill",
            type="drill.cron",
            scope="drill",
        )
        await post(client, "/timers", attrs.asdict(cron), 201)
        await drill.load_until_killed(client, 0)

    for cycle in range(1, CYCLES + 1):
        client = await drill.start()
        async with client:
            # redelivering what was acknowledged before the kill is recognised, never stored again
            for delivery in drill.rng.sample(sorted(drill.acked), 5):
                body = {"source": "load", "delivery_id": delivery, "type": "drill.event", "scope": "drill"}
                assert (await post(client, "/events", body, 200))["duplicate"] is True
            # the waiters started last cycle get their wake; new ones start
            for key in drill.waiters:
                wake = {"source": "drill", "delivery_id": f"wake-{key}", "type": "drill.wake", "scope": "drill",
                        "key": key}  # fmt: skip
                await post(client, "/events", wake)
            fresh = [f"w/{cycle}-{n}" for n in range(3)]
            for key in fresh:
                start = {"source": "drill", "delivery_id": f"start-{key}", "type": "drill.start", "scope": "drill",
                         "key": key}  # fmt: skip
                await post(client, "/events", start)
                drill.waiters.append(key)
            # they park on their waits (through the toolbelt) before the kill; the wake comes after it
            await until(
                partial(all_waiting, client, fresh), f"the waiters of cycle {cycle} to wait", seconds=30
            )
            # time passes: timers come due, leases the kill left behind expire and are recovered
            await post(client, "/debug/clock", {"advance_ms": HOUR + drill.rng.randint(0, 10) * MINUTE})
            await drill.load_until_killed(client, cycle)

    client = await drill.start()
    async with client:
        for key in drill.waiters:
            wake = {"source": "drill", "delivery_id": f"wake-{key}", "type": "drill.wake", "scope": "drill",
                    "key": key}  # fmt: skip
            await post(client, "/events", wake)
        before = (await get(client, "/debug/clock"))["now_ms"]
        assert before < now + 48 * HOUR, "the sleep must still be pending when the last kill happens"
        await post(client, "/debug/clock", {"advance_ms": 49 * HOUR})

        async def settled() -> bool:
            armed = await all_pages(client, "/timers", "timers", state="armed")
            if {t["id"] for t in armed} != {cron.id}:
                # a retry after a failure the kill caused: time passes until it is due
                due = min(t["fire_at_ms"] for t in armed if t["id"] != cron.id)
                if due > (await get(client, "/debug/clock"))["now_ms"]:
                    await post(client, "/debug/clock", {"now_ms": due})
                return False
            done = await all_pages(client, "/work", "work", scope="drill", state="completed")
            return {k for w in done for k in w["keys"]} >= set(drill.waiters)

        try:
            await until(settled, "every timer to fire and every waiter to complete", seconds=40)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{await report(client, drill)}") from None
        await check(client, drill, cron.id)
    assert drill.server is not None
    assert drill.server.stop() == 0


async def report(client: httpx.AsyncClient, drill: Drill) -> str:
    """What was left unsettled, for a failure message."""
    lines = [f"seed {SEED}"]
    lines += [
        f"armed timer {t['id']} at {t['fire_at_ms']}"
        for t in await all_pages(client, "/timers", "timers", state="armed")
    ]
    for key in drill.waiters:
        view = await get(client, f"/work/by-key/{key}")
        work = view["work"]
        if work["state"] != "completed":
            attempts = [
                (x["attempt"], x["state"], (x["outcome"] or {}).get("error"))
                for x in view["history"]["executions"]
            ]
            lines.append(
                f"{key}: {work['state']} held={work['hold_reason']} retry={work['retry']} waits="
                f"{[w['state'] for w in view['waits']]} attempts={attempts}"
            )
    diagnostics = (await get(client, "/diagnostics"))["diagnostics"]
    lines += [f"diagnostic {d['kind']} {d['subject']}: {d['message'][:200]}" for d in diagnostics[-10:]]
    assert drill.server is not None
    lines.append(drill.server.log.read_text()[-3000:])
    return "\n".join(lines)


async def check(client: httpx.AsyncClient, drill: Drill, cron_id: str) -> None:
    events = await all_pages(client, "/events", "events")
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs)
    assert len(seqs) == len(set(seqs))

    # every acknowledged Event is there, exactly once
    loads = [e["delivery_id"] for e in events if e["type"] == "drill.event"]
    assert len(loads) == len(set(loads)), "an Event was stored twice"
    missing = drill.acked - set(loads)
    assert not missing, f"{len(missing)} acknowledged Events were lost, e.g. {sorted(missing)[:3]}"
    assert len(drill.acked) >= CYCLES * 40

    # every due timer fired exactly once, the 48-hour sleep included
    for timer_id in (*sorted(drill.timers), "sleep-48h"):
        shown = await get(client, f"/timers/{timer_id}")
        assert shown["timer"]["state"] == "fired", shown
        assert [f["result"] for f in shown["firings"]] == ["accepted"], shown
    ticks = [e["delivery_id"] for e in events if e["type"] in ("drill.tick", "drill.slept")]
    assert sorted(ticks) == sorted((*drill.timers, "sleep-48h"))

    # every wait (each registered before a kill, its wake sent after it) was woken exactly once, and
    # one attempt continued from it
    bridges = [e for e in events if e["type"] == "core.wait.woken"]
    assert len(bridges) == len(drill.waiters)
    for key in drill.waiters:
        view = await get(client, f"/work/by-key/{key}")
        assert view["work"]["state"] == "completed", view["work"]
        waits = view["waits"]
        assert len(waits) == 1, (key, waits)
        wait = waits[0]
        assert wait["state"] == "woken", wait
        assert [b["id"] for b in bridges if b["payload"]["wait"] == wait["id"]] == [wait["bridge_event_id"]]
        continued = [x for x in view["history"]["executions"] if x["authority_id"] == wait["bridge_event_id"]]
        assert len(continued) == 1, (key, view["history"]["executions"])

    # the hourly schedule fired each occurrence once across the crashes, and started each once
    occurrences = [e for e in events if e["type"] == "drill.cron"]
    assert len(occurrences) >= CYCLES
    assert len({e["delivery_id"] for e in occurrences}) == len(occurrences)
    schedule = await get(client, "/work/by-key/schedule/hourly")
    triggers = [x["trigger_id"] for x in schedule["history"]["executions"] if x["trigger_id"]]
    assert len(triggers) == len(set(triggers)), "an occurrence started twice"
    assert {e["id"] for e in occurrences} >= set(triggers)
    assert (await get(client, f"/timers/{cron_id}"))["timer"]["state"] == "armed"


# -- starts under SIGKILL (docs/recovery.md, "A kill during a start") --------------------------------------

STARTS_CONFIG = """
[scopes.starts]
capacity = 8

[scopes.starts.bindings.once]
executor = "shell"
config = { command = ["sh", "-c", "echo \\"$LOOM_WORK_ID $LOOM_EXECUTION_ID\\" >> \\"$LEDGER\\""], grace_s = 1 }

[[scopes.starts.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
binding = "once"
"""


@pytest.mark.filterwarnings(*HTTPX_CUT_OFF)
async def test_sigkill_while_attempts_start_runs_each_command_once_and_recovers_at_restart(
    tmp_path: Path,
) -> None:
    """``loom serve`` under HTTP load, each Event starting a shell command, SIGKILLed at seeded random
    moments (many attempts are starting at any moment: claimed, spawning, running, ending). After each
    restart, with the test clock never moved (so no lease ever expires), every attempt the kill left is
    recovered; at the end every acknowledged Event's command ran exactly once and its Work completed.
    Catches a command run twice (spawned and not recorded, then retried), a Work lost, and a restart that
    waits for the dead process's leases to expire."""
    rng = random.Random(SEED)
    ledger, shell = tmp_path / "ledger", tmp_path / "shell"
    shell.mkdir()
    config = tmp_path / "loom.toml"
    config.write_text(STARTS_CONFIG)
    env = {"TMPDIR": str(shell), "LEDGER": str(ledger)}
    db = tmp_path / "starts.db"
    acked: set[str] = set()
    server: Server | None = None
    try:
        for cycle in range(CYCLES + 1):
            server = await trio.to_thread.run_sync(lambda: start_server(db, config=config, env=env))
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                # the clock never moves: what the kill left is recovered by the restart, not a lease later
                try:
                    await until(
                        partial(all_completed, client, set(acked)),
                        f"the attempts of cycle {cycle - 1} to be recovered",
                        seconds=60,
                    )
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{await unfinished(client, server)}") from None
                if cycle == CYCLES:
                    break
                await load_jobs_until_killed(client, server, cycle, rng, acked)
        assert server is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            works = await all_pages(client, "/work", "work", scope="starts")
            events = await all_pages(client, "/events", "events")
        assert server.stop() == 0
    finally:
        if server is not None and server.proc.poll() is None:
            server.kill()
    jobs = [e["delivery_id"] for e in events if e["type"] == "job.run"]
    assert len(jobs) == len(set(jobs)), "an Event was stored twice"
    assert acked <= set(jobs), f"acknowledged Events were lost: {sorted(acked - set(jobs))[:3]}"
    assert all(w["state"] == "completed" for w in works), [w for w in works if w["state"] != "completed"][:3]
    runs = [line.split()[0] for line in ledger.read_text().splitlines()]
    twice = {work: n for work, n in Counter(runs).items() if n > 1}
    assert not twice, f"commands ran more than once: {twice}"
    assert sorted(runs) == sorted(w["id"] for w in works), "a Work completed without its command running"
    assert len(acked) >= CYCLES * 20


async def unfinished(client: httpx.AsyncClient, server: Server) -> str:
    """The Works not completed, with their attempts, for a failure message."""
    lines = [f"seed {SEED}"]
    for work in await all_pages(client, "/work", "work", scope="starts"):
        if work["state"] != "completed":
            view = await get(client, f"/work/{work['id']}")
            attempts = [(x["attempt"], x["state"], x["epoch"], (x["outcome"] or {}).get("error"), x["metadata"])
                        for x in view["history"]["executions"]]  # fmt: skip
            lines.append(f"{work['keys']}: {work['state']} held={work['hold_reason']} {attempts}")
    lines += [
        f"{d['kind']} {d['subject']}: {d['message'][:200]}"
        for d in (await get(client, "/diagnostics"))["diagnostics"][-10:]
    ]
    lines.append(server.log.read_text()[-3000:])
    return "\n".join(lines[:40])


async def all_completed(client: httpx.AsyncClient, keys: set[str]) -> bool:
    """Every Work of the drill completed, for every acknowledged Event and every Event stored without
    its answer reaching the client (sent just before a kill): those are recovered at the restart too."""
    works = await all_pages(client, "/work", "work", scope="starts")
    events = await all_pages(client, "/events", "events")
    stored = {e["delivery_id"] for e in events if e["type"] == "job.run"}  # a job's key is its delivery id
    done = {k for w in works if w["state"] == "completed" for k in w["keys"]}
    return all(w["state"] == "completed" for w in works) and done >= keys | stored


async def load_jobs_until_killed(
    client: httpx.AsyncClient, server: Server, cycle: int, rng: random.Random, acked: set[str]
) -> None:
    """Concurrent clients send Events that each start a command, until a random number were
    acknowledged; then SIGKILL, with attempts starting all the while."""
    kill_after = rng.randint(20, 60)
    enough = trio.Event()
    count = 0

    async def loader(n: int) -> None:
        nonlocal count
        for i in range(100_000):
            key = f"job/{cycle}-{n}-{i}"
            body = {"source": "load", "delivery_id": key, "type": "job.run", "scope": "starts", "key": key}
            try:
                response = await client.post("/events", json=body)
            except httpx.TransportError:
                return  # killed mid-request: not acknowledged
            assert response.status_code == 201, response.text
            acked.add(key)
            count += 1
            if count >= kill_after:
                enough.set()

    async with trio.open_nursery() as nursery:
        for n in range(LOADERS // 2):
            nursery.start_soon(loader, n)
        await enough.wait()
        await trio.to_thread.run_sync(server.kill)
        nursery.cancel_scope.cancel()
