"""A ``shell`` binding's config is checked when the configuration is loaded (docs/configuration.md,
``[scopes."<path>".bindings.<name>]``): a bad key refuses the configuration with a `ConfigError`
naming it, wherever a configuration is loaded against the runtime's executors (an embedded open, a
reload, ``loom config check``, ``loom serve``'s start and SIGHUP), by the same checks each launch makes
(the executor's optional ``validate_config``, docs/plugins.md "Executors")."""

from __future__ import annotations

import signal
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from service_kit import start_server, until
from test_shell_executor import Toolbelt, request
from typer.testing import CliRunner

import loom
from loom.plugins.shell import ShellExecutor, read_config
from loom.service.cli import app
from loom.service.serve import serve

TEMPLATE = """
[scopes.ops.bindings.sh]
executor = "%s"
config = %s

[[scopes.ops.routes]]
name = "jobs"
types = ["job.*"]
create_work = true
binding = "sh"
"""
GOOD = '{ command = ["true"] }'
NON_EMPTY = 'must be a non-empty list of strings, e.g. ["make", "test"]'
KEYS = "command, env, cwd, grace_s, ack_timeout_s, on_close"
NUL = "must not hold a NUL character"
UNKNOWN = f"unknown config key 'bogus'; expected some of: {KEYS}"

BAD = [
    ('{ command = "true" }', "command", NON_EMPTY),
    ("{ command = [] }", "command", NON_EMPTY),
    ('{ command = ["true", ""] }', "command", NON_EMPTY),
    ('{ env = { A = "1" } }', "command", NON_EMPTY),
    ('{ command = ["true"], bogus = 1 }', None, UNKNOWN),
    ('{ command = ["true"], env = { A = 1 } }', "env", "must be a table of names to strings"),
    ('{ command = ["true"], env = { "A=B" = "1" } }', "env", "must be a table of names to strings"),
    ('{ command = ["true"], grace_s = -1 }', "grace_s", "must be seconds from 0 to 86400"),
    ('{ command = ["true"], ack_timeout_s = true }', "ack_timeout_s", "must be seconds from 0 to 86400"),
    ('{ command = ["true"], cwd = "" }', "cwd", "must be a directory path"),
    ('{ command = ["true"], on_close = "kill" }', "on_close", 'must be "leave" or "stop"'),
    ('{ command = ["tr\\u0000ue"] }', "command[0]", NUL),
    ('{ command = ["sh", "-c", "\\u0000"] }', "command[2]", NUL),
    ('{ command = ["true"], env = { A = "x\\u0000" } }', "env.A", NUL),
    ('{ command = ["true"], env = { "A\\u0000" = "x" } }', "env", NUL),
    ('{ command = ["true"], cwd = "/tmp\\u0000" }', "cwd", NUL),
]
IDS = [f"{key}-{i}" for i, (_, key, _) in enumerate(BAD)]
GOOD_CONFIGS = [
    GOOD,
    '{ command = ["make", "release"], env = { CI = "1" }, cwd = "/srv/app", grace_s = 10 }',
    '{ command = ["true"], ack_timeout_s = 0, grace_s = 86400.0, on_close = "stop", env = {} }',
]


def toml(config: str, executor: str = "shell") -> str:
    return TEMPLATE % (executor, config)


def config_of(config: str) -> dict[str, Any]:
    """The binding's config as plain data, as a launch gets it."""
    data: dict[str, Any] = tomllib.loads(toml(config))["scopes"]["ops"]["bindings"]["sh"]["config"]
    return data


def refusal(key: str | None, reason: str, *, file: str = "loom.toml") -> str:
    where = "scopes.ops.bindings.sh.config" + (f".{key}" if key else "")
    return f"{file}: {where}: {reason}"


@pytest.mark.parametrize(("config", "key", "reason"), BAD, ids=IDS)
async def test_a_runtime_refuses_a_bad_shell_binding_config_naming_the_key(
    config: str, key: str | None, reason: str
) -> None:
    """Catches a configuration that loads (every attempt then failing at its launch, retry after
    retry), and a refusal that does not name the key."""
    loaded = loom.Config.from_toml(toml(config), file="loom.toml")
    with pytest.raises(loom.ConfigError) as refused:
        async with loom.open_runtime(":memory:", config=loaded, actors=()):
            pass
    assert str(refused.value) == refusal(key, reason)
    assert refused.value.key == "scopes.ops.bindings.sh.config" + (f".{key}" if key else "")


@pytest.mark.parametrize("config", GOOD_CONFIGS)
async def test_a_good_shell_binding_config_loads(config: str) -> None:
    """Catches a check that refuses what a launch takes (0 seconds, the longest grace, every key)."""
    loaded = loom.Config.from_toml(toml(config), file="loom.toml")
    async with loom.open_runtime(":memory:", config=loaded, actors=()) as rt:
        assert rt.config.scopes["ops"].bindings["sh"].executor == "shell"


async def test_a_shell_executor_under_another_name_checks_its_bindings(tmp_path: Path) -> None:
    """Catches a check tied to the name ``shell`` rather than to the executor."""
    loaded = loom.Config.from_toml(toml('{ command = "make" }', executor="build"), file="loom.toml")
    with pytest.raises(loom.ConfigError, match=r"scopes\.ops\.bindings\.sh\.config\.command: must be"):
        async with loom.open_runtime(
            ":memory:", config=loaded, actors=(), plugins=[ShellExecutor("build", state_dir=tmp_path)]
        ):
            pass


@pytest.mark.parametrize(("config", "key", "reason"), BAD, ids=IDS)
async def test_the_launch_refuses_what_the_load_refuses_in_the_same_words(
    tmp_path: Path, config: str, key: str | None, reason: str
) -> None:
    """The two checks are one: catches a load-time check that refuses what a launch takes (or the
    other way round), and a launch that raises (``ValueError: embedded null byte``) instead of failing
    the attempt."""
    data = config_of(config)
    executor = ShellExecutor(state_dir=tmp_path / "state")
    with pytest.raises(loom.ConfigError) as at_load:
        executor.validate_config(data)
    assert (at_load.value.key, at_load.value.reason) == (key, reason)
    req = request(data)
    outcome = await executor.launch(req, Toolbelt(req))
    assert isinstance(outcome, loom.Failed)
    assert outcome.error == f"shell executor: {f'config.{key} ' if key else ''}{reason}"
    assert not await trio.Path(tmp_path / "state").exists(), (
        "nothing is prepared for a config that cannot run"
    )


@pytest.mark.parametrize("config", GOOD_CONFIGS)
def test_what_the_load_takes_the_launch_takes(config: str) -> None:
    """Catches the two checks drifting apart on a config that runs."""
    data = config_of(config)
    ShellExecutor().validate_config(data)
    assert read_config(data).command == tuple(data["command"])


async def test_a_reload_refuses_a_bad_shell_binding_config_and_keeps_the_one_in_force() -> None:
    """Catches a reload (``rt.reload``, as SIGHUP does) that puts a bad binding config in force."""
    good = loom.Config.from_toml(toml(GOOD), file="loom.toml")
    async with loom.open_runtime(":memory:", config=good, actors=()) as rt:
        in_force = rt.config
        bad = loom.Config.from_toml(toml("{ command = [] }"), file="loom.toml")
        with pytest.raises(loom.ConfigError, match=r"scopes\.ops\.bindings\.sh\.config\.command: must be"):
            rt.reload(bad)
        assert rt.config is in_force
        assert rt.config.scopes["ops"].bindings["sh"].config["command"] == ["true"]


def test_loom_config_check_refuses_a_bad_shell_binding_config(tmp_path: Path) -> None:
    """Catches ``loom config check`` printing "nothing to report" (exit status 0) for a configuration
    whose every attempt fails at its launch."""
    bad = tmp_path / "loom.toml"
    bad.write_text(toml('{ command = ["true"], bogus = 1 }'))
    result = CliRunner().invoke(app, ["config", "check", "--config", str(bad)], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert result.stderr == f"loom: {refusal(None, UNKNOWN, file=str(bad))}\n"
    assert "nothing to report" not in result.stdout
    bad.write_text(toml(GOOD))
    fixed = CliRunner().invoke(app, ["config", "check", "--config", str(bad)], catch_exceptions=False)
    assert fixed.exit_code == 0, fixed.output
    assert fixed.stdout.splitlines()[-1] == "nothing to report"


async def test_loom_serve_refuses_to_start_on_a_bad_shell_binding_config(tmp_path: Path) -> None:
    """Catches a server that starts (and fails every attempt) on a configuration it cannot run; it is
    refused before anything is opened: no store file is made."""
    config = tmp_path / "loom.toml"
    config.write_text(toml('{ command = ["true"], grace_s = -1 }'))
    with trio.fail_after(30), pytest.raises(loom.ConfigError) as refused:
        await serve(tmp_path / "x.db", config, "127.0.0.1:0", log_level="warning")
    assert str(refused.value) == refusal("grace_s", "must be seconds from 0 to 86400", file=str(config))
    assert not await trio.Path(tmp_path / "x.db").exists()


async def test_sighup_refuses_a_bad_shell_binding_config_and_keeps_the_one_in_force(tmp_path: Path) -> None:
    """Catches a SIGHUP reload that puts in force a binding config every launch refuses."""
    config = tmp_path / "loom.toml"
    config.write_text(toml(GOOD))
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path / "hup.db", config=config))
    log = trio.Path(server.log)

    async def logged(fragment: str) -> bool:
        return fragment in await log.read_text()

    try:
        async with httpx.AsyncClient(base_url=server.url) as client:  # (its SIGHUP handler is in place)
            assert (await client.get("/healthz")).status_code == 200
        config.write_text(toml('{ command = ["true"], env = { A = 1 } }'))
        server.proc.send_signal(signal.SIGHUP)
        await until(lambda: logged("was not reloaded, the configuration in force stays"), "the refusal")
        assert server.proc.poll() is None, "a refused file does not stop the server"
    finally:
        await trio.to_thread.run_sync(server.stop)
    text = await log.read_text()
    (line,) = [line for line in text.splitlines() if "was not reloaded" in line]
    assert line.endswith(refusal("env", "must be a table of names to strings", file=str(config)))
    assert "SIGHUP: reloaded" not in text


class Checked:
    """A plugin's executor whose ``validate_config`` answers as it is told."""

    capabilities = frozenset[str]()

    def __init__(self, name: str, error: Exception | None) -> None:
        self.name = name
        self.error = error
        self.seen: list[dict[str, Any]] = []

    def validate_config(self, config: Any) -> None:
        self.seen.append(dict(config))
        if self.error is not None:
            raise self.error

    async def launch(self, request: loom.RunRequest, toolbelt: Any) -> loom.Outcome:
        return loom.Completed()

    async def inject(self, execution_id: str, event: loom.Event) -> None:
        raise loom.NotAccepting("no")

    async def interrupt(self, execution_id: str) -> None:
        pass

    @loom.hookimpl
    def loom_executors(self) -> dict[str, Any]:
        return {self.name: self}


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (loom.ConfigError("no such function", key="function"), "config.function: no such function"),
        (loom.InvalidRequest("no such function", field="function"), "config.function: no such function"),
        (KeyError("function"), "config: executor 'job' could not check it: KeyError: 'function'"),
    ],
)
async def test_a_plugin_executor_checks_its_bindings_config_with_validate_config(
    error: Exception, said: str
) -> None:
    """Catches a plugin's ``validate_config`` that is never asked, one whose refusal loses its key, and
    one that raises something else escaping as that error instead of a `ConfigError`."""
    text = toml('{ function = "charge" }', executor="job")
    executor = Checked("job", error)
    with pytest.raises(loom.ConfigError) as refused:
        async with loom.open_runtime(
            ":memory:", config=loom.Config.from_toml(text), actors=(), plugins=[executor]
        ):
            pass
    assert str(refused.value) == f"<string>: scopes.ops.bindings.sh.{said}"
    assert executor.seen == [{"function": "charge"}]
    accepting = Checked("job", None)
    async with loom.open_runtime(
        ":memory:", config=loom.Config.from_toml(text), actors=(), plugins=[accepting]
    ):
        assert accepting.seen == [{"function": "charge"}]
