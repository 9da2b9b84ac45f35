"""The examples that need more than running as they are (``test_embedding`` runs every
``examples/*.py``): the service configuration embedded with ``open_runtime``, and the third-party
plugin package installed and found through its entry point."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import trio

import loom
from loom.testing import T0_MS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


async def completed(rt: loom.Runtime, key: str) -> bool:
    try:
        return (await rt.work_for_key(key)).state is loom.WorkState.COMPLETED
    except loom.NotFound:
        return False  # not routed yet


async def test_the_example_config_runs_embedded_with_the_built_in_shell_executor() -> None:
    """Catches a shell executor that is not registered by default (the config was refused with
    ``unknown executor 'shell'``), or an example command that does not run."""
    config = loom.Config.load(EXAMPLES / "loom.toml")
    async with loom.open_runtime(":memory:", clock=loom.ManualClock(start_ms=T0_MS), config=config) as rt:
        accepted = await rt.publish(
            loom.EventIn(source="github", delivery_id="1", type="issue.opened", scope="acme", key="issue/1")
        )
        async with rt.watch() as notices:
            with trio.fail_after(30):
                while not await completed(rt, "issue/1"):
                    await notices.__anext__()
        work = await rt.work_for_key("issue/1")
        (execution,) = (await rt.history(work.id)).executions
    assert (work.kind, execution.executor, execution.trigger_id) == ("agent", "shell", accepted.id)


def test_the_plugin_package_is_found_through_its_entry_point(tmp_path: Path) -> None:
    """Installs ``examples/plugin_package`` (into a folder of its own) and runs its example, which
    fails unless loom loaded the plugin from the ``loom`` entry-point group by itself."""
    target, source = tmp_path / "site", tmp_path / "plugin_package"
    # built from a copy, so the build leaves nothing in the repository
    shutil.copytree(EXAMPLES / "plugin_package", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "plugin_package" / "example.py")],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ticket for grace (priority 1): drop priority 1 is below 2" in done.stdout
    assert "digest fired for Mon 2026-01-12T09:00Z" in done.stdout
    assert "next digest: Tue 2026-01-13T09:00Z" in done.stdout
