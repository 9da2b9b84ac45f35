"""Requests an adversarial sweep of the API found answered wrongly: each is refused naming what is
wrong, or answered as docs/http-api.md says, and a refusal changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_kit import JSON, api, order, refusal

import loom
from loom import Config, ConfigError, TimerSpec, WaitSpec, WorkState, open_runtime


async def test_a_key_ending_as_a_results_path_is_looked_up_as_a_key(tmp_path: Path) -> None:
    """Catches `GET /work/by-key/{key}` taken by `/work/{id}/result` (and `/attempts/{n}/logs`) for a
    key that ends so: it answered 404 naming the id `by-key/kk`."""
    async with api(tmp_path) as a:
        for key in ("kk/result", "kk/attempts/1/logs"):
            assert (await a.client.post("/events", json=order(key, key=key))).status_code == 201
            await a.rt.wait_idle()
            found = await a.client.get(f"/work/by-key/{key}")
            assert found.status_code == 200, found.text
            assert key in found.json()["work"]["keys"]


async def test_a_completion_with_an_unknown_outcome_names_the_outcome(tmp_path: Path) -> None:
    """Catches the other fields judged against an outcome that is none (it blamed ``error``)."""
    async with api(tmp_path) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201
        await a.rt.wait_idle()
        lease = await a.rt.claim((await a.rt.work_for_key("order/1")).id, owner="host")
        complete = f"/executions/{lease.execution_id}/complete"
        for body in ({"outcome": "Failed", "error": "x"}, {"outcome": "", "value": 1}):
            answer = await a.unchanged(
                a.client.post(complete, json=body, headers={"Authorization": f"Bearer {lease.token}"})
            )
            assert (
                "outcome must be one of completed, handoff, failed"
                in refusal(answer, 400, "invalid_request", "outcome")["message"]
            )


async def test_a_retry_of_a_waiting_work_is_a_conflict(tmp_path: Path) -> None:
    """Catches a retry answered 200 that starts nothing: its request queued behind the wait as
    context, and more retries piled up."""
    async with api(tmp_path) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201
        await a.rt.wait_idle()
        work = await a.rt.work_for_key("order/1")
        lease = await a.rt.claim(work.id, owner="host")
        await a.rt.wait(lease, WaitSpec(types=("approval.*",)))
        assert (await a.rt.work(work.id)).state is WorkState.WAITING
        answer = await a.unchanged(a.client.post(f"/work/{work.id}/retry", json={"reason": "try"}))
        assert "is waiting on wait" in refusal(answer, 409, "conflict")["message"]


async def test_a_refused_line_of_a_json_lines_batch_is_named_by_its_line(tmp_path: Path) -> None:
    """Catches a refusal counting items (blank lines skipped) where the docs promise line numbers."""
    async with api(tmp_path) as a:
        body = (
            b'{"source": "shop", "delivery_id": "a", "type": "order.placed", "scope": "shop"}\n\nnull\n[]\n'
        )
        answer = await a.client.post(
            "/events", content=body, headers={"Content-Type": "application/x-ndjson"}
        )
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [r["status"] for r in results] == [201, 400, 400]
        assert results[1]["error"]["message"].startswith("line 3")
        assert results[2]["error"]["message"].startswith("line 4")


async def test_a_replay_names_a_bad_reason_before_it_looks_at_the_event(tmp_path: Path) -> None:
    """Catches a malformed field answered as a conflict over another field (`409` naming event_id)."""
    async with api(tmp_path) as a:
        for n in (1, 2):
            assert (await a.client.post("/events", json=order(n))).status_code == 201
        await a.rt.wait_idle()
        work = await a.rt.work_for_key("order/1")
        other = await a.rt.event_by_delivery("shop", "o-2")
        answer = await a.unchanged(
            a.client.post(f"/work/{work.id}/replay", json={"event_id": other.id, "reason": "a\u0000b"})
        )
        refusal(answer, 400, "invalid_request", "reason")


async def test_a_timer_cancel_at_a_revision_not_yet_written_says_so(tmp_path: Path) -> None:
    async with open_runtime(tmp_path / "t.db", load_entry_points=False, actors=()) as rt:
        timer = await rt.arm(
            TimerSpec(id="t", fire_at_ms=rt.clock.now_ms() + 60_000, source="s", type="t.x", scope="s")
        )
        with pytest.raises(loom.Conflict, match=f"revision {timer.revision + 1} is not yet written"):
            await rt.cancel_timer("t", revision=timer.revision + 1)


async def test_a_route_naming_an_undeclared_work_kind_is_refused_at_the_open(tmp_path: Path) -> None:
    """Catches a mistyped kind that made its Work run under the default policy in silence (the open,
    `loom serve` and `loom config check` accepted it)."""
    config = Config.from_toml('[[scopes.shop.routes]]\nname = "r"\ncreate_work = true\nwork_kind = "jbo"\n')
    with pytest.raises(ConfigError, match=r"work_kind: unknown work kind 'jbo' \(known: schedule\)"):
        async with open_runtime(tmp_path / "k.db", config=config, load_entry_points=False):
            pass


async def test_a_refused_emit_or_publish_names_the_field_at_fault(tmp_path: Path) -> None:
    """Catches refusals whose ``field`` was null although one field was at fault: an unknown cited
    cause, an emit into another scope, a key owned by another Work than the one named."""
    async with api(tmp_path) as a:
        for n in (1, 2):
            assert (await a.client.post("/events", json=order(n))).status_code == 201
        await a.rt.wait_idle()
        work = await a.rt.work_for_key("order/1")
        lease = await a.rt.claim(work.id, owner="host")
        emit = f"/executions/{lease.execution_id}/emit"
        bearer = {"Authorization": f"Bearer {lease.token}"}
        derived = {"source": "job", "delivery_id": "x", "type": "job.ran", "scope": "shop"}
        for body, field in (
            ({**derived, "cause_id": "ev_nope"}, "cause_id"),
            ({**derived, "scope": "other"}, "scope"),
        ):
            refusal(
                await a.unchanged(a.client.post(emit, json=body, headers=bearer)),
                400,
                "invalid_request",
                field,
            )
        owned = order(3, key="order/2", work_id=work.id)
        refusal(await a.unchanged(a.client.post("/events", json=owned)), 400, "invalid_request", "key")


async def test_a_number_of_thousands_of_digits_is_refused_in_loom_s_words(tmp_path: Path) -> None:
    """Catches Python's own advice (`sys.set_int_max_str_digits`) answered to a client."""
    async with api(tmp_path) as a:
        body = b'{"source": "s", "delivery_id": "d", "type": "t.x", "scope": "shop", "payload": {"n": '
        answer = await a.unchanged(a.client.post("/events", content=body + b"1" * 5000 + b"}}", headers=JSON))
        message = refusal(answer, 400, "invalid_request")["message"]
        assert message == "the body holds a number of more than 4300 digits"


async def test_a_shell_commands_final_failure_holds_its_work_and_belongs_to_a_failure(tmp_path: Path) -> None:
    """Catches ``retryable`` dropped on its way from the toolbelt (the Work would back off and retry),
    and taken on an outcome that is no failure."""
    async with api(tmp_path) as a:
        assert (await a.client.post("/events", json=order(1))).status_code == 201
        await a.rt.wait_idle()
        lease = await a.rt.claim((await a.rt.work_for_key("order/1")).id, owner="host")
        complete = f"/executions/{lease.execution_id}/complete"
        bearer = {"Authorization": f"Bearer {lease.token}"}
        wrong = {"outcome": "completed", "retryable": False}
        refusal(
            await a.unchanged(a.client.post(complete, json=wrong, headers=bearer)),
            400,
            "invalid_request",
            "retryable",
        )
        final = {"outcome": "failed", "error": "no such order", "retryable": False}
        assert (await a.client.post(complete, json=final, headers=bearer)).status_code == 200
        work = await a.rt.work(lease.work_id)
        assert (work.held, work.retry) == (True, loom.RetryState.EXHAUSTED)


async def test_a_page_of_events_ends_once_its_payloads_reach_the_page_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches a page that holds `limit` Events whatever their size (1,000 of 1 MiB: about 1 GB in
    the server's memory), one whose cursor skips or repeats an Event, and chunked reads that lose
    the order."""
    from loom.service import _handlers

    monkeypatch.setattr(_handlers, "PAGE_BYTES", 1000, raising=False)
    monkeypatch.setattr(_handlers, "EVENTS_CHUNK", 2, raising=False)
    async with api(tmp_path, actors=False) as a:
        for n in range(7):
            body = order(n, payload={"blob": "x" * 390})  # about 400 bytes of payload each
            assert (await a.client.post("/events", json=body)).status_code == 201
        seen: list[int] = []
        pages: list[int] = []
        after = 0
        while True:
            answer = await a.client.get("/events", params={"after": str(after), "limit": "100"})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            pages.append(len(body["events"]))
            seen += [event["seq"] for event in body["events"]]
            if body["next_after"] is None:
                break
            assert body["next_after"] == seen[-1]
            after = body["next_after"]
        assert pages == [3, 3, 1], "a page ends at the Event that takes it to 1,000 bytes"
        assert seen == sorted(seen)
        assert len(set(seen)) == 7
        small = await a.client.get("/events", params={"limit": "2"})
        assert [len(small.json()["events"]), small.json()["next_after"]] == [2, seen[1]]
