"""The configuration's ``[store]`` settings reach the store a runtime opens (docs/configuration.md,
"[store]"): a SQLite path opens at the configured ``synchronous`` level; a `SQLiteStore` passed as it
is keeps its own.

The level is read back from the storage actor's own connection (SQLite's ``PRAGMA synchronous``: 2 is
FULL, 1 is NORMAL), inside a procedure as every write runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import loom
from loom.store import SQLiteStore, Tx
from loom.testing.internals import storage_of

LEVELS = {"FULL": 2, "NORMAL": 1}


def level_in_tx(tx: Tx, now_ms: int) -> Any:
    return tx._conn.execute("PRAGMA synchronous").fetchone()[0]


@pytest.mark.parametrize("level", ["FULL", "NORMAL"])
async def test_a_path_opens_at_the_configured_synchronous_level(tmp_path: Path, level: str) -> None:
    """Catches a `[store] synchronous` that is checked and then ignored (the file opened at FULL
    whatever the configuration said: seen for NORMAL)."""
    config = loom.Config.from_toml(f'[store]\nsynchronous = "{level}"\n')
    async with loom.open_runtime(str(tmp_path / "loom.db"), config=config, actors=()) as rt:
        assert await storage_of(rt).submit(level_in_tx) == LEVELS[level]


async def test_a_store_object_keeps_its_own_level(tmp_path: Path) -> None:
    """Catches the configuration overriding a store the caller built with a level of its own."""
    config = loom.Config.from_toml('[store]\nsynchronous = "FULL"\n')
    store = SQLiteStore(path=str(tmp_path / "loom.db"), synchronous="NORMAL")
    async with loom.open_runtime(store, config=config, actors=()) as rt:
        assert await storage_of(rt).submit(level_in_tx) == LEVELS["NORMAL"]
