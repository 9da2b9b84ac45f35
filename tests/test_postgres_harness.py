"""The ``loom_postgres`` fixture without a PostgreSQL server: under ``CI=true`` the tests that need
one fail, naming the cause; elsewhere they skip.

CI exists to run every backend: a run that silently skipped the PostgreSQL tests would pass with
half the suite unrun. Catches a fixture that always skips (the CI run fails with no error), one that
always fails (a developer without PostgreSQL cannot run the suite), and a fail that hides its cause.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loom.testing import postgres

pytest_plugins = ["pytester"]

NEEDS_POSTGRES = """
def test_needs_postgres(loom_postgres):
    pass
"""


@pytest.fixture
def no_server(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.Pytester:
    """An inner test session that can find no PostgreSQL anywhere: no server URL, an empty
    ``LOOM_POSTGRES_BIN``, no Debian install and no ``initdb`` on ``PATH``."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.delenv(postgres.ENV_URL, raising=False)
    monkeypatch.setenv(postgres.ENV_BIN, str(empty))
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(postgres, "DEBIAN_DIR", empty)
    assert postgres.find_bin_dir() is None
    pytester.makepyfile(NEEDS_POSTGRES)
    return pytester


def test_without_a_server_a_ci_run_fails_naming_the_cause(
    no_server: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches a fixture that skips whatever the environment says: the CI run would pass with every
    PostgreSQL test unrun."""
    monkeypatch.setenv("CI", "true")
    result = no_server.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*CI needs a PostgreSQL server and none could be started: no PostgreSQL server binaries*"]
    )


@pytest.mark.parametrize("ci", [None, "false"])
def test_without_a_server_a_run_outside_ci_skips(
    no_server: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    """Catches a fixture that fails whenever there is no server, and one that takes any ``CI`` value
    (even ``false``) for a CI run."""
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    result = no_server.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no PostgreSQL server: no PostgreSQL server binaries*"])
