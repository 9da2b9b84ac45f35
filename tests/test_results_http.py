"""The API's results (docs/http-api.md, "Results"): where ``POST /events`` routed an Event, a Work's outcome
with a bounded long-poll (``GET /work/{id}/result?wait=``), and an attempt's logs
(``GET /work/{id}/attempts/{n}/logs``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from service_kit import api, order, refusal

import loom
from loom.plugins.shell import ShellExecutor
from loom.store._reader import Reader

SHELL = loom.Config.from_toml("""
[scopes.ops.bindings.sh]
executor = "shell"
config = { command = ["sh", "-c", "echo built it; echo 'warning: slow disk' >&2"] }

[[scopes.ops.routes]]
name = "builds"
types = ["build.*"]
create_work = true
binding = "sh"

[[scopes.shop.routes]]
name = "orders"
types = ["order.*"]
create_work = true
""")


async def test_post_events_says_which_route_took_the_event(tmp_path: Path) -> None:
    """Catches an answer that cannot tell a routed Event from one nothing will act on."""
    async with api(tmp_path) as a:
        routed = (await a.client.post("/events?wait=10", json=order(1))).json()
        assert routed["routing"]["status"] == "routed"
        assert routed["routing"]["route"] == "orders"
        assert routed["routing"]["work_id"] == (await a.rt.work_for_key("order/1")).id
        stray = (await a.client.post("/events?wait=10", json=order(2, type="refund.asked"))).json()
        assert stray["routing"] == {"status": "unmatched", "route": None, "route_scope": None, "work_id": None,
                                    "reason": stray["routing"]["reason"]}  # fmt: skip
        refusal(await a.client.post("/events?wait=61", json=order(3)), 400, "invalid_request", "wait")


@pytest.mark.parametrize("wait", ["-1", "61", "nan", "inf", "1e309", "x"])
async def test_a_refused_wait_publishes_nothing(tmp_path: Path, wait: str) -> None:
    """A bad ``?wait=`` is a 400 that stores nothing, one Event or a batch: a client that sends the same
    delivery again after the 400 gets a fresh acceptance (201), not a duplicate of an Event it was told
    was refused. Catches reading ``wait`` only after the Event was published."""
    async with api(tmp_path) as a:
        refusal(await a.client.post(f"/events?wait={wait}", json=order(1)), 400, "invalid_request", "wait")
        batch = [order(2), order(3)]
        refusal(await a.client.post(f"/events?wait={wait}", json=batch), 400, "invalid_request", "wait")
        assert await a.rt.events() == []
        assert (await a.client.post("/events", json=order(1))).status_code == 201


@pytest.mark.parametrize("work", ["%00", "a%0Ab", "a%7Fb"])
async def test_watch_refuses_a_malformed_work_id(tmp_path: Path, work: str) -> None:
    """``GET /watch?work=`` with a control character in the id is a 400 naming ``work``, as every other
    route answers a malformed id. Catches the filter taken as it came (a stream that never matches)."""
    async with api(tmp_path) as a:
        refusal(await a.client.get(f"/watch?work={work}"), 400, "invalid_request", "work")


async def test_post_events_answers_what_its_acceptance_commit_routed_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One Event per request: where it went is what its acceptance commit wrote, answered without a
    read (a read is a thread hop on the store's one reader connection, and two per request bounded the
    endpoint at a sixth of its rate: bench/http.py); a duplicate's checkpoint, from an earlier commit, is
    read. Catches an answer read back from the store whatever the commit knew (the reads are counted),
    and one that differs from what a read answers."""
    reads: list[str] = []
    checkpoint, event = Reader.checkpoint, Reader.event

    async def read_checkpoint(reader: Reader, event_id: str) -> loom.Checkpoint | None:
        reads.append(event_id)
        return await checkpoint(reader, event_id)

    async def read_event(reader: Reader, event_id: str) -> loom.Event | None:
        reads.append(event_id)
        return await event(reader, event_id)

    monkeypatch.setattr(Reader, "checkpoint", read_checkpoint)
    monkeypatch.setattr(Reader, "event", read_event)
    async with api(tmp_path) as a:
        routed = (await a.client.post("/events", json=order(1))).json()
        stray = (await a.client.post("/events", json=order(2, type="refund.asked"))).json()
        assert routed["routing"]["status"] == "routed"
        assert routed["routing"]["work_id"] == (await a.rt.work_for_key("order/1")).id
        assert stray["routing"]["status"] == "unmatched"
        assert reads == [], "the acceptance commit's own routing was read back"
        for answer in (routed, stray):
            read = await a.rt.checkpoint(answer["id"])
            assert read is not None
            assert answer["routing"] == {
                "status": read.status.value,
                "route": read.route,
                "route_scope": read.route_scope,
                "work_id": read.work_id,
                "reason": read.reason,
            }
        reads.clear()
        again = await a.client.post("/events", json=order(1))
        assert again.status_code == 200
        assert again.json()["routing"] == routed["routing"]
        assert reads == [routed["id"]], "a duplicate's checkpoint is read, once"


async def test_a_result_long_poll_answers_when_the_work_completes(tmp_path: Path) -> None:
    """Catches a long-poll that answers before the outcome is settled, or never wakes."""
    async with api(tmp_path) as a:
        await a.client.post("/events?wait=10", json=order(1))
        work = await a.rt.work_for_key("order/1")
        lease = await a.rt.claim(work.id, owner="host")
        got: list[dict[str, object]] = []

        async def poll() -> None:
            got.append((await a.client.get(f"/work/{work.id}/result?wait=60")).json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.testing.wait_all_tasks_blocked()
            assert not got
            await a.rt.complete(lease, loom.Completed(value={"shipped": True}))
        assert got[0]["state"] == "completed"
        assert got[0]["value"] == {"shipped": True}
        now = (await a.client.get(f"/work/{work.id}/result")).json()
        assert now == got[0]
        refusal(await a.client.get("/work/nope/result"), 404, "not_found")


async def test_a_long_poll_ends_when_the_server_stops(tmp_path: Path) -> None:
    """Catches a stop that waits for every long-poll in flight (up to a minute)."""
    stopping = trio.Event()
    async with api(tmp_path, stopping=stopping) as a:
        # a long-poll for an unknown Work is refused as one, not an internal error (a nursery's group)
        refusal(await a.client.get("/work/wk_.../result?wait=5"), 404, "not_found")
        await a.client.post("/events?wait=10", json=order(1))
        work = await a.rt.work_for_key("order/1")
        got: list[dict[str, object]] = []

        async def poll() -> None:
            got.append((await a.client.get(f"/work/{work.id}/result?wait=60")).json())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            await trio.testing.wait_all_tasks_blocked()
            stopping.set()
        assert got[0]["state"] == "ready"
        assert got[0]["settled"] is False


async def test_an_attempts_logs_are_read_through_its_executor(tmp_path: Path) -> None:
    """Catches logs that cannot be reached once an attempt ended, and a logs route that answers for an
    executor that keeps none."""
    shell = ShellExecutor(state_dir=tmp_path / "shell")
    async with api(tmp_path, config=SHELL, plugins=(shell,)) as a:
        body = {"source": "ci", "delivery_id": "b-1", "type": "build.run", "scope": "ops", "key": "build/1"}
        work_id = (await a.client.post("/events?wait=10", json=body)).json()["routing"]["work_id"]
        assert (await a.client.get(f"/work/{work_id}/result?wait=30")).json()["state"] == "completed"
        logs = (await a.client.get(f"/work/{work_id}/attempts/1/logs")).json()
        assert logs["logs"] == {"stdout": "built it\n", "stderr": "warning: slow disk\n"}
        assert logs["executor"] == "shell"
        assert logs["attempt"] == 1
        only = (await a.client.get(f"/work/{work_id}/attempts/1/logs?stream=stderr&tail=5")).json()
        assert only["logs"] == {"stderr": "...disk\n"}
        refusal(await a.client.get(f"/work/{work_id}/attempts/2/logs"), 404, "not_found")
        refusal(await a.client.get(f"/work/{work_id}/attempts/0/logs"), 400, "invalid_request", "attempt")
        await a.client.post("/events?wait=10", json=order(1))
        work = await a.rt.work_for_key("order/1")
        lease = await a.rt.claim(work.id, owner="host")  # a host's attempt: no executor keeps its logs
        await a.rt.complete(lease, loom.Completed())
        answer = refusal(await a.client.get(f"/work/{work.id}/attempts/1/logs"), 404, "not_found")
        assert "keeps no logs" in str(answer["message"])
