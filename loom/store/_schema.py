"""Schema and ordered migrations.

The version lives in the ``loom_schema`` table. Migrations are applied in order at
open, each in its own transaction with the version bump. A database written by a
newer loom is refused before anything is written.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: acceptance, causal bounds, KV, diagnostics
    """
    CREATE TABLE events (
        seq            INTEGER PRIMARY KEY AUTOINCREMENT,
        id             TEXT NOT NULL UNIQUE,
        source         TEXT NOT NULL,
        delivery_id    TEXT NOT NULL,
        type           TEXT NOT NULL,
        scope          TEXT NOT NULL,
        key            TEXT,
        work_id        TEXT,
        execution_id   TEXT,
        payload        TEXT NOT NULL,
        parent_id      TEXT,
        cause_id       TEXT,
        root_id        TEXT NOT NULL,
        depth          INTEGER NOT NULL CHECK (depth >= 0),
        accepted_at_ms INTEGER NOT NULL,
        UNIQUE (source, delivery_id)
    );
    CREATE INDEX events_root ON events (root_id, seq);
    CREATE INDEX events_key ON events (scope, key, seq) WHERE key IS NOT NULL;
    CREATE TABLE causal_roots (
        root_id    TEXT PRIMARY KEY,
        max_depth  INTEGER NOT NULL,
        per_minute INTEGER NOT NULL
    );
    CREATE TABLE causal_buckets (
        root_id TEXT NOT NULL,
        minute  INTEGER NOT NULL,
        count   INTEGER NOT NULL CHECK (count >= 0),
        PRIMARY KEY (root_id, minute)
    );
    CREATE TABLE kv (
        namespace     TEXT NOT NULL,
        key           TEXT NOT NULL,
        value         TEXT NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        PRIMARY KEY (namespace, key)
    );
    CREATE TABLE diagnostics (
        id      INTEGER PRIMARY KEY AUTOINCREMENT,
        kind    TEXT NOT NULL,
        subject TEXT NOT NULL,
        message TEXT NOT NULL,
        detail  TEXT NOT NULL,
        at_ms   INTEGER NOT NULL
    );
    CREATE INDEX diagnostics_kind ON diagnostics (kind, id);
    """,
)

SCHEMA_VERSION = len(MIGRATIONS)
