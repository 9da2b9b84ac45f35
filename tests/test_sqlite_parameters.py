"""How loom's SQLite connections bind a ``None`` parameter: through an adapter loom registers, which
binds NULL as the sqlite3 module does without one, at less cost (`loom.store._sqlite`). sqlite3's
adapters are the process's, so each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

BINDS = """
import sqlite3
{before}
import loom.store
conn = sqlite3.connect(":memory:")
conn.execute("CREATE TABLE t (v TEXT)")
conn.execute("INSERT INTO t VALUES (?)", (None,))
registered = sqlite3.adapters.get((type(None), sqlite3.PrepareProtocol))
print(registered.__module__ if registered is not None else None, conn.execute("SELECT v IS NULL, v FROM t").fetchone())
"""


def run(before: str = "") -> str:
    done = subprocess.run(
        [sys.executable, "-c", BINDS.format(before=before)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_a_none_parameter_binds_null_through_looms_adapter() -> None:
    """Catches: no adapter registered (every ``None`` parameter takes the module's slow path, about 0.2 us
    each, ten or more per accepted Event) and an adapter that binds anything but NULL."""
    assert run() == "loom.store._sqlite (1, None)"


def test_an_adapter_registered_before_loom_is_kept() -> None:
    """A program that registered its own adapter for ``None`` keeps it: loom's would change what that
    program's statements bind. Catches loom's adapter registered over it."""
    mine = 'sqlite3.register_adapter(type(None), lambda v: "none")'
    assert run(mine) == "__main__ (0, 'none')"
