"""Batch ingestion: ``POST /events`` with an array or JSON lines accepts the Events in order with one
commit, and answers each on its own (docs/http-api.md "Events")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from service_kit import JSON, api, order, refusal

import loom


async def test_a_batch_is_answered_item_by_item_in_order(tmp_path: Path) -> None:
    """Catches a batch refused whole for one bad item, a duplicate inside the batch stored twice, a
    stateful refusal (an unknown explicit Work) that aborts the others, and results out of order."""
    async with api(tmp_path) as a:
        batch = [order(1), order(2, type="Bad type"), order(1), order(3, work_id="wk_missing"), order(4)]
        response = await a.client.post("/events", json=batch)
        assert response.status_code == 200, response.text
        answer = response.json()
        statuses = [r["status"] for r in answer["results"]]
        assert statuses == [201, 400, 200, 400, 201]
        first, bad, again, unknown, last = answer["results"]
        assert bad["error"]["field"] == "type"
        assert unknown["error"]["field"] == "work_id"
        assert again["event"]["id"] == first["event"]["id"]
        assert again["event"]["duplicate"] is True
        assert (answer["accepted"], answer["duplicates"], answer["refused"]) == (2, 1, 2)
        assert [e.delivery_id for e in await a.rt.events()] == ["o-1", "o-4"]
        assert last["event"]["seq"] > first["event"]["seq"]


async def test_a_batch_is_accepted_in_the_order_it_was_sent(tmp_path: Path) -> None:
    """Catches items published concurrently (each its own request to the storage actor), whose
    sequence order would not be the order sent: per-Work effects follow acceptance order."""
    async with api(tmp_path) as a:
        batch = [order(n, key="order/same") for n in range(60)]
        response = await a.client.post("/events", json=batch)
        seqs = [r["event"]["seq"] for r in response.json()["results"]]
        assert seqs == sorted(seqs)
        assert len(set(seqs)) == 60


async def test_json_lines_are_a_batch_and_a_broken_line_is_refused_alone(tmp_path: Path) -> None:
    async with api(tmp_path) as a:
        body = json.dumps(order(1)) + "\n{not json\n\n" + json.dumps(order(2)) + "\n"
        response = await a.client.post(
            "/events", content=body, headers={"Content-Type": "application/x-ndjson"}
        )
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["status"] for r in results] == [201, 400, 201]
        assert results[1]["error"]["message"].startswith("line 2: ")
        # JSON lines are a batch body of POST /events only
        other = await a.client.post(
            "/debug/clock", content="{}", headers={"Content-Type": "application/x-ndjson"}
        )
        refusal(other, 415, "unsupported_media_type", "Content-Type")


async def test_a_single_event_larger_than_the_body_limit_is_still_refused(tmp_path: Path) -> None:
    """Catches the batch body limit (larger) letting one oversized Event through."""
    async with api(tmp_path) as a:
        big = order(1, payload={"x": "y" * (3 * 1024 * 1024)})
        response = await a.unchanged(a.client.post("/events", content=json.dumps(big), headers=JSON))
        refusal(response, 413, "too_large")


async def test_publish_many_answers_each_event_and_refuses_bad_arguments(tmp_path: Path) -> None:
    async with loom.open_runtime(str(tmp_path / "r.db"), actors=()) as rt:
        good = loom.EventIn(source="s", delivery_id="d1", type="a.b", scope="x")
        bad = loom.EventIn(source="s", delivery_id="", type="a.b", scope="x")
        answers = await rt.publish_many([good, bad, good])
        assert isinstance(answers[0], loom.Event)
        assert not answers[0].duplicate
        assert isinstance(answers[1], loom.InvalidRequest)
        assert answers[1].field == "event.delivery_id"
        assert isinstance(answers[2], loom.Event)
        assert answers[2].duplicate
        assert answers[2].id == answers[0].id
        with pytest.raises(loom.InvalidRequest, match="events"):
            await rt.publish_many([good] * 1001)
        with pytest.raises(loom.InvalidRequest, match=r"events\[1\]"):
            await rt.publish_many([good, "x"])  # type: ignore[list-item]
        assert [e.delivery_id for e in await rt.events()] == ["d1"]
