"""A batch that keeps losing to other nodes runs one request at a time (docs/backends.md): on a shared
database two nodes' big batches can deadlock run after run under load. Each request alone, with its
own retries, gets through; one that still cannot fails alone, and the others' commits stand.

The other node is played by a storage actor whose batch runs lose (`Conflict`) by a rule of the
test's: a lost run is rolled back whole, as PostgreSQL's deadlock victim is, so SQLite shows the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

import loom
from loom.store._actor import StorageActor
from loom.store._batch import Conflict, Request
from loom.testing.internals import storage_of


def losing(monkeypatch: pytest.MonkeyPatch, loses: Callable[[list[Request]], bool]) -> None:
    """Every run of a batch for which ``loses`` holds is lost to "another node"."""
    execute = StorageActor._execute

    def run(self: StorageActor, batch: list[Request], *args: Any) -> Any:
        if loses(batch):
            raise Conflict(RuntimeError("deadlock detected (played by the test)"))
        return execute(self, batch, *args)

    monkeypatch.setattr(StorageActor, "_execute", run)


def delivery(request: Request) -> str | None:
    event = request.args[0] if request.args else None
    return getattr(event, "delivery_id", None)


def event(n: int) -> loom.EventIn:
    return loom.EventIn(source="t", delivery_id=f"d-{n}", type="t.x", scope="s")


async def publish_together(rt: loom.Runtime, count: int) -> dict[int, object]:
    """Publish ``count`` Events from as many tasks at once (one batch); each one's answer or error."""
    answers: dict[int, object] = {}

    async def one(n: int) -> None:
        try:
            answers[n] = await rt.publish(event(n))
        except loom.StorageError as exc:
            answers[n] = exc

    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(one, n)
    return answers


async def test_a_batch_that_loses_every_run_commits_one_request_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Catches a batch that fails whole once its retries are spent (seen on PostgreSQL under load: a
    node's router got the StorageError, and the node stopped)."""
    losing(monkeypatch, lambda batch: len(batch) > 1)
    async with loom.open_runtime(":memory:", actors=()) as rt:
        answers = await publish_together(rt, 5)
        assert all(isinstance(answer, loom.Event) for answer in answers.values()), answers
        assert len(await rt.events()) == 5
        assert storage_of(rt).stats.split_batches == 1


async def test_a_request_that_loses_alone_fails_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches one request's failure that fails (or rolls back) the others run beside it."""
    losing(monkeypatch, lambda batch: len(batch) > 1 or delivery(batch[0]) == "d-3")
    async with loom.open_runtime(":memory:", actors=()) as rt:
        answers = await publish_together(rt, 5)
        failed = {n for n, answer in answers.items() if not isinstance(answer, loom.Event)}
        assert failed == {3}
        assert "this request was not committed: deadlock detected" in str(answers[3])
        assert sorted(e.delivery_id for e in await rt.events()) == ["d-0", "d-1", "d-2", "d-4"]
