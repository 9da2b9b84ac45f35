"""``loom send --batch``: each line is accepted or refused on its own, as ``POST /events`` answers a
batch (docs/http-api.md "Batches": a refused item changes nothing; the others are accepted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_kit import start_server
from test_cli import FakeServer, loom_cli, paris_time

__all__ = ["paris_time"]  # local time is Paris, and now a little after 09:04 UTC, for every test here


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer() as fake:
        yield fake


ACCEPTED = {"status": 201, "event": {"id": "ev_1", "seq": 1, "source": "s", "delivery_id": "a"}}


def test_a_line_that_is_not_json_is_refused_alone(server: FakeServer) -> None:
    """Catches ``send --batch`` refusing the whole file ("--batch line 2 is not JSON", nothing sent)
    when one line is not JSON: the good lines are sent, the bad one is refused by its line number,
    every line's outcome is printed, and the command exits 1."""
    server.answers["POST", "/events"] = (200, {"results": [ACCEPTED], "accepted": 1, "duplicates": 0,
                                               "refused": 0})  # fmt: skip
    lines = '{"type": "x.y", "delivery_id": "a"}\n{"type": "x.y", \n'
    result = loom_cli("send", "--batch", "-", "--url", server.url, input=lines)
    assert server.requests == [("POST", "/events", [{"type": "x.y", "delivery_id": "a"}])]
    assert result.exit_code == 1, result.output
    shown = result.stdout.splitlines()
    assert len(shown) == 2, result.stdout
    assert shown[0].startswith("1: accepted: event ev_1 seq 1")
    assert shown[1].startswith("2: refused: line 2 is not valid JSON: ")


def test_a_batch_of_only_bad_lines_sends_nothing_and_says_why(server: FakeServer) -> None:
    """Catches a batch whose every line is refused sending an empty batch (which the server refuses
    whole) or exiting 0; also a line naming a member twice sent with its last value."""
    lines = '[[[\n\n{"type": "x.y", "delivery_id": "d-1", "delivery_id": "d-2"}\n'
    result = loom_cli("send", "--batch", "-", "--url", server.url, "--json", input=lines)
    assert server.requests == []
    assert result.exit_code == 1, result.output
    answer = json.loads(result.stdout)
    assert (answer["accepted"], answer["duplicates"], answer["refused"]) == (0, 0, 2)
    first, second = answer["results"]
    assert first["status"] == 400
    assert first["error"]["message"].startswith("line 1 is not valid JSON")
    assert second["error"]["message"].startswith("line 3: the member 'delivery_id' appears more than once")


def test_the_server_accepts_the_good_lines_of_a_batch(tmp_path: Path) -> None:
    """Catches, against a real ``loom serve``, the valid first line of a batch not being accepted
    because the second line is not JSON."""
    server = start_server(tmp_path / "loom.db")
    try:
        batch = tmp_path / "batch.jsonl"
        good = {"source": "shop", "delivery_id": "o-1", "type": "order.placed", "scope": "shop"}
        batch.write_text(
            json.dumps(good) + "\nnot json\n" + json.dumps({**good, "delivery_id": "o-2"}) + "\n"
        )
        result = loom_cli("send", "--batch", str(batch), "--url", server.url)
        assert result.exit_code == 1, result.output
        shown = result.stdout.splitlines()
        assert [line.split(":", 2)[1].strip() for line in shown] == ["accepted", "refused", "accepted"]
        assert "line 2 is not valid JSON" in shown[1]
        listed = loom_cli("events", "list", "--json", "--url", server.url)
        assert listed.exit_code == 0, listed.output
        assert [e["delivery_id"] for e in json.loads(listed.stdout)["events"]] == ["o-1", "o-2"]
    finally:
        assert server.stop() == 0
