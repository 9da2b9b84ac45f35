"""Schema and ordered migrations: one source of truth for every backend.

The version lives in the ``loom_schema`` table. Migrations are applied in order at
open, each in its own transaction with the version bump. A database written by a
newer loom is refused before anything is written.

Migrations are written in a portable subset of SQL that `render` turns into each backend's
DDL: the types ``INTEGER`` (64-bit: times in ms, sequences, counts, 0/1 flags), ``REAL``,
``TEXT`` (ids, states, JSON), ``INTEGER PRIMARY KEY AUTOINCREMENT`` for an allocated key,
``CREATE [UNIQUE] INDEX ... [WHERE ...]`` (partial indexes), ``ALTER TABLE ... ADD COLUMN``,
``DROP INDEX``, ``REFERENCES``, ``CHECK``, ``UNIQUE`` and ``DEFAULT``; identifiers that a backend
reserves are double-quoted (``"window"``). A step that cannot be said portably is a mapping
from dialect name to its own script.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._schema_later import LATER

Migration = str | Mapping[str, str]

MIGRATIONS: tuple[Migration, ...] = (
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
    # 2: Work, keys, routing checkpoints, inputs, executions, intents
    """
    CREATE TABLE works (
        id              TEXT PRIMARY KEY,
        scope           TEXT NOT NULL,
        kind            TEXT,
        state           TEXT NOT NULL,
        revision        INTEGER NOT NULL,
        held            INTEGER NOT NULL DEFAULT 0,
        hold_reason     TEXT,
        parent_id       TEXT REFERENCES works (id),
        predecessor_id  TEXT REFERENCES works (id),
        generation      INTEGER NOT NULL,
        attempts        INTEGER NOT NULL DEFAULT 0,
        started         INTEGER NOT NULL DEFAULT 0,
        release_once    INTEGER NOT NULL DEFAULT 0,
        created_at_ms   INTEGER NOT NULL,
        updated_at_ms   INTEGER NOT NULL
    );
    CREATE INDEX works_state ON works (state, scope);
    CREATE TABLE work_keys (
        key            TEXT PRIMARY KEY,
        work_id        TEXT NOT NULL REFERENCES works (id),
        attached_seq   INTEGER NOT NULL,
        attached_at_ms INTEGER NOT NULL
    );
    CREATE INDEX work_keys_work ON work_keys (work_id);
    CREATE TABLE checkpoints (
        event_id         TEXT PRIMARY KEY REFERENCES events (id),
        seq              INTEGER NOT NULL UNIQUE,
        status           TEXT NOT NULL,
        work_id          TEXT REFERENCES works (id),
        route            TEXT,
        route_scope      TEXT,
        policy           TEXT,
        effective_policy TEXT,
        fallback_reason  TEXT,
        reason           TEXT,
        generation       INTEGER,
        at_ms            INTEGER NOT NULL
    );
    CREATE INDEX checkpoints_work ON checkpoints (work_id, seq);
    CREATE TABLE work_inputs (
        work_id      TEXT NOT NULL REFERENCES works (id),
        event_id     TEXT NOT NULL REFERENCES events (id),
        seq          INTEGER NOT NULL,
        state        TEXT NOT NULL,
        execution_id TEXT,
        PRIMARY KEY (work_id, event_id)
    );
    CREATE INDEX work_inputs_pending ON work_inputs (work_id, state, seq);
    CREATE TABLE executions (
        id                 TEXT PRIMARY KEY,
        work_id            TEXT NOT NULL REFERENCES works (id),
        attempt            INTEGER NOT NULL,
        state              TEXT NOT NULL,
        epoch              INTEGER NOT NULL,
        token              TEXT,
        owner              TEXT,
        expires_at_ms      INTEGER,
        trigger_id         TEXT REFERENCES events (id),
        inputs             TEXT NOT NULL,
        binding            TEXT,
        executor           TEXT,
        capabilities       TEXT NOT NULL,
        generation         INTEGER NOT NULL,
        outcome            TEXT,
        interrupt_event_id TEXT,
        created_at_ms      INTEGER NOT NULL,
        ended_at_ms        INTEGER,
        UNIQUE (work_id, attempt)
    );
    CREATE UNIQUE INDEX executions_one_live ON executions (work_id) WHERE state IN ('running', 'stopping');
    CREATE TABLE intents (
        id           TEXT PRIMARY KEY,
        kind         TEXT NOT NULL,
        work_id      TEXT NOT NULL REFERENCES works (id),
        event_id     TEXT NOT NULL REFERENCES events (id),
        execution_id TEXT NOT NULL REFERENCES executions (id),
        epoch        INTEGER NOT NULL,
        status       TEXT NOT NULL,
        attempts     INTEGER NOT NULL DEFAULT 0,
        next_attempt_ms INTEGER,
        updated_at_ms INTEGER NOT NULL
    );
    CREATE INDEX intents_open ON intents (status, work_id);
    """,
    # 3: durable timers, the firing ledger, execution deadlines
    """
    CREATE TABLE timers (
        id            TEXT PRIMARY KEY,
        revision      INTEGER NOT NULL,
        state         TEXT NOT NULL,
        fire_at_ms    INTEGER NOT NULL,
        source        TEXT NOT NULL,
        type          TEXT NOT NULL,
        scope         TEXT NOT NULL,
        key           TEXT,
        work_id       TEXT,
        payload       TEXT NOT NULL,
        delivery_id   TEXT NOT NULL,
        interval_ms   INTEGER,
        recurrence    TEXT,
        spec          TEXT,
        parent_id     TEXT REFERENCES events (id),
        execution_id  TEXT,
        occurrences   INTEGER NOT NULL DEFAULT 0,
        reason        TEXT,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL
    );
    CREATE INDEX timers_due ON timers (fire_at_ms, id) WHERE state = 'armed';
    CREATE TABLE timer_firings (
        timer_id        TEXT NOT NULL,
        revision        INTEGER NOT NULL,
        fire_at_ms      INTEGER NOT NULL,
        result          TEXT NOT NULL,
        event_id        TEXT,
        next_fire_at_ms INTEGER,
        detail          TEXT,
        at_ms           INTEGER NOT NULL,
        PRIMARY KEY (timer_id, revision, fire_at_ms)
    );
    ALTER TABLE executions ADD COLUMN segment INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE executions ADD COLUMN budget_ms INTEGER;
    ALTER TABLE executions ADD COLUMN used_ms INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE executions ADD COLUMN segment_started_ms INTEGER;
    ALTER TABLE executions ADD COLUMN deadline_timer_id TEXT;
    CREATE INDEX events_key_seq ON events (key, seq) WHERE key IS NOT NULL;
    CREATE INDEX events_work_seq ON events (work_id, seq) WHERE work_id IS NOT NULL;
    """,
    # 4: error fallbacks on intents, timers by the execution that armed them, replayed checkpoints
    """
    ALTER TABLE intents ADD COLUMN error_fallback TEXT;
    CREATE INDEX timers_execution ON timers (execution_id) WHERE execution_id IS NOT NULL;
    CREATE TABLE replaced_checkpoints (
        event_id    TEXT NOT NULL REFERENCES events (id),
        replay_id   TEXT NOT NULL REFERENCES events (id),
        status      TEXT NOT NULL,
        work_id     TEXT,
        route       TEXT,
        reason      TEXT,
        at_ms       INTEGER NOT NULL,
        replaced_ms INTEGER NOT NULL,
        PRIMARY KEY (event_id, replay_id)
    );
    """,
    # 5: waits, parked attempts, watermarks and causal authority of continuations
    """
    DROP INDEX executions_one_live;
    CREATE UNIQUE INDEX executions_one_live ON executions (work_id)
        WHERE state IN ('running', 'stopping', 'parked');
    ALTER TABLE executions ADD COLUMN watermark INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE executions ADD COLUMN authority_id TEXT;
    CREATE TABLE waits (
        id                  TEXT PRIMARY KEY,
        work_id             TEXT NOT NULL REFERENCES works (id),
        execution_id        TEXT NOT NULL REFERENCES executions (id),
        attempt             INTEGER NOT NULL,
        epoch               INTEGER NOT NULL,
        state               TEXT NOT NULL,
        keys                TEXT NOT NULL,
        types               TEXT NOT NULL,
        after_seq           INTEGER NOT NULL,
        resume              INTEGER NOT NULL,
        timeout_at_ms       INTEGER,
        timeout_timer_id    TEXT,
        timeout_delivery_id TEXT,
        winner_event_id     TEXT,
        bridge_event_id     TEXT,
        reason              TEXT,
        created_at_ms       INTEGER NOT NULL,
        woken_at_ms         INTEGER,
        taken_at_ms         INTEGER,
        detail              TEXT NOT NULL DEFAULT '{}'
    );
    CREATE UNIQUE INDEX waits_one_open ON waits (execution_id) WHERE state IN ('active', 'blocked');
    CREATE INDEX waits_work ON waits (work_id, created_at_ms);
    CREATE TABLE wait_keys (
        key     TEXT NOT NULL,
        wait_id TEXT NOT NULL REFERENCES waits (id),
        PRIMARY KEY (key, wait_id)
    );
    """,
    # 6: lease recovery (handed segments, pinned executor metadata) and retry eligibility
    """
    DROP INDEX executions_one_live;
    CREATE UNIQUE INDEX executions_one_live ON executions (work_id)
        WHERE state IN ('running', 'stopping', 'parked', 'recovering');
    CREATE INDEX executions_expiry ON executions (expires_at_ms, id) WHERE state IN ('running', 'recovering');
    ALTER TABLE executions ADD COLUMN handed_at_ms INTEGER;
    ALTER TABLE executions ADD COLUMN metadata TEXT;
    ALTER TABLE executions ADD COLUMN retry_policy TEXT;
    ALTER TABLE executions ADD COLUMN binding_config TEXT;
    ALTER TABLE works ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE works ADD COLUMN retry TEXT;
    ALTER TABLE works ADD COLUMN retry_timer_id TEXT;
    """,
    # 7: budgets (ledgers per budget, subject and window; the budget a held Work waits on)
    """
    CREATE TABLE budget_ledgers (
        budget   TEXT NOT NULL,
        subject  TEXT NOT NULL,
        "window" TEXT NOT NULL,
        unit     TEXT NOT NULL,
        amount   REAL NOT NULL DEFAULT 0,
        warned   INTEGER NOT NULL DEFAULT 0,
        exceeded INTEGER NOT NULL DEFAULT 0,
        updated_at_ms INTEGER NOT NULL,
        PRIMARY KEY (budget, subject, "window")
    );
    ALTER TABLE works ADD COLUMN budget_hold TEXT;
    CREATE INDEX works_budget_hold ON works (budget_hold) WHERE budget_hold IS NOT NULL;
    """,
    # 8: dependency subscriptions (identity, dependent, source, checkpoint together) and the durable
    # cursor of the bounded reconcile pass
    """
    CREATE TABLE subscriptions (
        namespace      TEXT NOT NULL,
        id             TEXT NOT NULL,
        work_id        TEXT NOT NULL REFERENCES works (id),
        dependent_key  TEXT NOT NULL,
        wait_id        TEXT REFERENCES waits (id),
        source_key     TEXT NOT NULL,
        source_scope   TEXT NOT NULL,
        target_scope   TEXT NOT NULL,
        types          TEXT NOT NULL,
        after_seq      INTEGER NOT NULL,
        filter_name    TEXT,
        filter         TEXT,
        label          TEXT NOT NULL,
        state          TEXT NOT NULL,
        checkpoint_seq INTEGER NOT NULL,
        revision       INTEGER NOT NULL,
        authorized     INTEGER,
        reason         TEXT,
        created_at_ms  INTEGER NOT NULL,
        updated_at_ms  INTEGER NOT NULL,
        PRIMARY KEY (namespace, id)
    );
    CREATE INDEX subscriptions_source ON subscriptions (source_key, state);
    CREATE INDEX subscriptions_work ON subscriptions (work_id);
    CREATE INDEX subscriptions_wait ON subscriptions (wait_id) WHERE wait_id IS NOT NULL;
    INSERT INTO kv (namespace, key, value, updated_at_ms)
        VALUES ('core.subscriptions', 'reconcile_cursor', '{"id":"","namespace":""}', 0);
    """,
    # 9: checkpoints carry their commit order explicitly (a Work's history is read in it)
    {
        "sqlite": """
    ALTER TABLE checkpoints ADD COLUMN commit_seq INTEGER;
    UPDATE checkpoints SET commit_seq = rowid;
    CREATE UNIQUE INDEX checkpoints_commit ON checkpoints (commit_seq);
    CREATE INDEX checkpoints_work_commit ON checkpoints (work_id, commit_seq);
    """,
        "postgresql": """
    ALTER TABLE checkpoints ADD COLUMN commit_seq INTEGER;
    UPDATE checkpoints SET commit_seq = seq;
    CREATE UNIQUE INDEX checkpoints_commit ON checkpoints (commit_seq);
    CREATE INDEX checkpoints_work_commit ON checkpoints (work_id, commit_seq);
    """,
    },
    # 10: admission. A Work that could start an attempt is in the ready queue (``ready_seq``: its place in
    # readiness order); ``blocked`` says why the admission pass passed over it (a full capacity pool it
    # waits on, or nothing here can start it), and each attempt records the capacity pool it counts in.
    # Work ready before this version joins the queue in the order it last changed.
    """
    ALTER TABLE works ADD COLUMN ready_seq INTEGER;
    ALTER TABLE works ADD COLUMN ready_at_ms INTEGER;
    ALTER TABLE works ADD COLUMN blocked TEXT;
    ALTER TABLE executions ADD COLUMN pool TEXT;
    UPDATE works SET ready_seq = updated_at_ms, ready_at_ms = updated_at_ms
        WHERE state = 'ready' AND held = 0 AND retry IS NULL
        AND EXISTS (SELECT 1 FROM work_inputs i WHERE i.work_id = works.id AND i.state = 'pending')
        AND NOT EXISTS (SELECT 1 FROM executions x WHERE x.work_id = works.id
                        AND x.state IN ('running', 'stopping', 'recovering'));
    UPDATE executions SET pool = (SELECT w.scope FROM works w WHERE w.id = executions.work_id)
        WHERE state IN ('running', 'stopping', 'recovering');
    CREATE INDEX works_ready ON works (ready_seq) WHERE ready_seq IS NOT NULL;
    CREATE INDEX works_admit ON works (ready_seq, id) WHERE ready_seq IS NOT NULL AND blocked IS NULL;
    CREATE INDEX works_blocked ON works (blocked, ready_seq, id) WHERE blocked IS NOT NULL;
    CREATE INDEX executions_pool ON executions (pool)
        WHERE pool IS NOT NULL AND state IN ('running', 'stopping', 'recovering');
    INSERT INTO kv (namespace, key, value, updated_at_ms)
        VALUES ('core.routing', 'watermark', '{"seq":0}', 0);
    """,
    # 11: a timer's firing ledger carries its commit order explicitly (it is read in that order);
    # existing firings keep their insertion order
    {
        "sqlite": """
    ALTER TABLE timer_firings ADD COLUMN commit_seq INTEGER;
    UPDATE timer_firings SET commit_seq = rowid;
    CREATE UNIQUE INDEX timer_firings_commit ON timer_firings (timer_id, commit_seq);
    """,
        "postgresql": """
    ALTER TABLE timer_firings ADD COLUMN commit_seq INTEGER;
    UPDATE timer_firings SET commit_seq = ordered.n FROM (SELECT timer_id AS t, revision AS r,
        fire_at_ms AS f, row_number() OVER (PARTITION BY timer_id ORDER BY at_ms, revision, fire_at_ms) AS n
        FROM timer_firings) AS ordered
        WHERE timer_id = ordered.t AND revision = ordered.r AND fire_at_ms = ordered.f;
    CREATE UNIQUE INDEX timer_firings_commit ON timer_firings (timer_id, commit_seq);
    """,
    },
    *LATER,
)

SCHEMA_VERSION = len(MIGRATIONS)

_POSTGRES_TYPES = (
    (
        re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    # byte order, as SQLite compares text: cursors and listings page the same on both backends
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)


def render(migration: Migration, dialect: str) -> str:
    """The script of ``migration`` for ``dialect`` (``"sqlite"`` or ``"postgresql"``)."""
    script = migration if isinstance(migration, str) else migration[dialect]
    if dialect == "postgresql":
        for pattern, replacement in _POSTGRES_TYPES:
            script = pattern.sub(replacement, script)
    return script


def statements(script: str) -> list[str]:
    """The statements of a rendered script (loom's own DDL: no semicolon inside a literal)."""
    return [part.strip() for part in script.split(";") if part.strip()]
