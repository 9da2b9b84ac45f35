"""What a loom that died left running (docs/plugins.md, the executor's optional ``lingering`` and
``end_lingering``): at its start the runtime asks each executor that can for the attempts whose
processes run unwatched, and has it stop those of its own store's attempts that have ended.

These tests drive the runtime's side with an executor that keeps no processes: it names the ids it
is told to, and records what it is asked to stop. `tests/test_shell_ended_attempts.py` has the shell
executor's own processes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import loom
from loom.testing import FakeExecutor, RecoverAnswer

CONFIG = loom.Config.from_dict({
    "scopes": {"ops": {
        "bindings": {"run": {"executor": "fake", "config": {"grace_s": 3}},
                     "other": {"executor": "other"}},
        "routes": [{"name": "jobs", "types": ["job.*"], "create_work": True, "binding": "run"},
                   {"name": "others", "types": ["other.*"], "create_work": True, "binding": "other"}],
    }},
})  # fmt: skip


class Lingering(FakeExecutor):
    """Names ``names`` as lingering (or raises ``fails``), and records each stop it is asked."""

    def __init__(
        self, name: str = "fake", names: Collection[Any] = (), fails: Exception | None = None
    ) -> None:
        super().__init__(name)
        self.names = names
        self.fails = fails
        self.ended: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    async def lingering(self) -> Collection[Any]:
        if self.fails is not None:
            raise self.fails
        return self.names

    async def end_lingering(
        self, execution_id: str, metadata: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        self.ended.append((execution_id, dict(metadata), dict(config)))


def job(n: int, kind: str = "job") -> loom.EventIn:
    return loom.EventIn(
        source="test", delivery_id=f"{kind}-{n}", type=f"{kind}.requested", scope="ops", key=f"{kind}/{n}"
    )


async def attempts(db: Path) -> dict[str, loom.Execution]:
    """Run three attempts and leave a fourth running, each pinning ``{"dir": "d"}``: by name, ``done``
    (completed), ``failed``, ``other`` (completed under the executor ``other``) and ``running`` (still
    running when its loom closed)."""
    fake, other = FakeExecutor(), FakeExecutor("other")
    fake.pin = other.pin = {"dir": "d"}
    plan = (("done", fake, job(1), loom.Completed()), ("failed", fake, job(2), loom.Failed(error="no")),
            ("other", other, job(1, "other"), loom.Completed()), ("running", fake, job(3), None))  # fmt: skip
    found: dict[str, loom.Execution] = {}
    async with loom.open_runtime(db, config=CONFIG, plugins=[fake, other]) as rt:
        for name, executor, event, outcome in plan:
            await rt.publish(event)
            await rt.wait_idle()
            work = await rt.work_for_key(event.key or "")
            if outcome is not None:
                executor.finish(work.id, outcome)
                await rt.wait_idle()
            (found[name],) = (await rt.history(work.id)).executions
    assert [found[n].state for n in found] == ["completed", "failed", "completed", "running"]
    return found


async def test_only_the_ended_attempts_of_its_own_store_and_executor_are_stopped(tmp_path: Path) -> None:
    """Catches an open that stops whatever its executor names: a running attempt (its recovery adopts
    it), another executor's attempt, an id this store does not know (another store's attempt), and
    one that asks an executor to stop an attempt it does not name. And a malformed id among them
    (not text, a NUL) is refused alone."""
    made = await attempts(tmp_path / "loom.db")
    names = [made[n].id for n in ("done", "failed", "other", "running")] + ["ex_unknown", 7, "a\0b"]
    fake = Lingering(names=names)
    fake.recover_answers[made["running"].work_id] = RecoverAnswer.ADOPT  # (it stays running, adopted)
    async with loom.open_runtime(
        tmp_path / "loom.db", config=CONFIG, plugins=[fake, FakeExecutor("other")]
    ) as rt:
        await rt.wait_idle()
        stopped = {execution_id: (metadata, config) for execution_id, metadata, config in fake.ended}
        assert set(stopped) == {made["done"].id, made["failed"].id}, (stopped, made)
        assert stopped[made["done"].id] == (
            {"dir": "d", "work": made["done"].work_id, "attempt": 1},
            {"grace_s": 3},
        )
        malformed = [d.message for d in await rt.diagnostics(kind="executor_failed")]
        assert len(malformed) == 2, malformed  # (one each)
        assert all("fake lingering" in message for message in malformed)
        assert all("execution_id" in message for message in malformed)


async def test_an_executor_failing_to_name_what_lingers_leaves_the_runtime_up(tmp_path: Path) -> None:
    """Catches a failure of the executor's ``lingering`` that stops the runtime at its open, or that is
    not recorded (the diagnostic names the executor and the hook)."""
    await attempts(tmp_path / "loom.db")
    fake = Lingering(fails=RuntimeError("proc is not mounted"))
    async with loom.open_runtime(
        tmp_path / "loom.db", config=CONFIG, plugins=[fake, FakeExecutor("other")]
    ) as rt:
        await rt.wait_idle()
        (diagnostic,) = await rt.diagnostics(kind="executor_failed")
        assert "fake lingering" in diagnostic.message
        assert "proc is not mounted" in diagnostic.message
        await rt.publish(job(9))
        await rt.wait_idle()
        assert [launch.request.work_id for launch in fake.launches] == [(await rt.work_for_key("job/9")).id]
