"""The later migrations (12 on), in order: `_schema.MIGRATIONS` ends with them (see its docstring for
the portable subset of SQL they are written in)."""

from __future__ import annotations

from collections.abc import Mapping

LATER: tuple[str | Mapping[str, str], ...] = (
    # 12: retention and compaction. What compaction removes leaves a compact tombstone of its identity
    # (an Event's delivery identity and sequence, a Work's id, a timer's id and last revision), kept for
    # the dedup window; an attempt records when its executor forgot its logs. The indexes let compaction
    # find what ended in the order it ended, and let a removal find every row that refers to what it
    # removes (a foreign key's check is an indexed probe, not a scan).
    """
    CREATE TABLE event_tombstones (
        seq            INTEGER PRIMARY KEY,
        source         TEXT NOT NULL,
        delivery_id    TEXT NOT NULL,
        accepted_at_ms INTEGER NOT NULL,
        UNIQUE (source, delivery_id)
    );
    CREATE TABLE removed_works (
        id            TEXT PRIMARY KEY,
        removed_at_ms INTEGER NOT NULL
    );
    CREATE INDEX removed_works_at ON removed_works (removed_at_ms);
    CREATE TABLE removed_timers (
        id            TEXT PRIMARY KEY,
        revision      INTEGER NOT NULL,
        removed_at_ms INTEGER NOT NULL
    );
    CREATE INDEX removed_timers_at ON removed_timers (removed_at_ms);
    ALTER TABLE executions ADD COLUMN logs_removed_at_ms INTEGER;
    CREATE INDEX works_ended ON works (updated_at_ms, id) WHERE state IN ('completed', 'cancelled', 'failed');
    CREATE INDEX works_parent ON works (parent_id) WHERE parent_id IS NOT NULL;
    CREATE INDEX works_predecessor ON works (predecessor_id) WHERE predecessor_id IS NOT NULL;
    CREATE INDEX executions_ended ON executions (ended_at_ms, id) WHERE ended_at_ms IS NOT NULL;
    CREATE INDEX executions_trigger ON executions (trigger_id) WHERE trigger_id IS NOT NULL;
    CREATE INDEX executions_authority ON executions (authority_id)
        WHERE authority_id IS NOT NULL AND state IN ('running', 'stopping', 'parked', 'recovering');
    CREATE INDEX work_inputs_event ON work_inputs (event_id);
    CREATE INDEX intents_event ON intents (event_id);
    CREATE INDEX intents_work ON intents (work_id);
    CREATE INDEX intents_execution ON intents (execution_id);
    CREATE INDEX waits_execution ON waits (execution_id);
    CREATE INDEX waits_untaken ON waits (bridge_event_id) WHERE state = 'woken' AND taken_at_ms IS NULL;
    CREATE INDEX wait_keys_wait ON wait_keys (wait_id);
    CREATE INDEX timers_parent ON timers (parent_id) WHERE parent_id IS NOT NULL;
    CREATE INDEX timers_work ON timers (work_id) WHERE work_id IS NOT NULL AND state = 'armed';
    CREATE INDEX timers_ended ON timers (updated_at_ms, id) WHERE state != 'armed';
    CREATE INDEX replaced_checkpoints_replay ON replaced_checkpoints (replay_id);
    CREATE INDEX causal_buckets_minute ON causal_buckets (minute);
    """,
    # 13: a Work's diagnostics (why it cannot start, its failed attempts) are read by their subject,
    # newest first
    """
    CREATE INDEX diagnostics_subject ON diagnostics (subject, id);
    """,
    # 14: the web console's reads. Works by last change, newest first, all of them or those in one state
    # (the scope rides in both indexes, so a page filtered by scope is read from the index alone; the
    # second also counts Works by state, as works_state did); recurring timers (schedules) by id.
    """
    CREATE INDEX works_changed ON works (updated_at_ms, id, scope);
    CREATE INDEX works_state_changed ON works (state, updated_at_ms, id, scope);
    DROP INDEX works_state;
    CREATE INDEX timers_recurring ON timers (id) WHERE recurrence IS NOT NULL OR interval_ms IS NOT NULL;
    """,
    # 15: less index upkeep per accepted and routed Event. A Work's checkpoints are read in commit order
    # only, and only for a Work (an unmatched or dropped Event's has none); keyed Events are read by
    # key and sequence (a subscription's scope is checked on the rows).
    """
    DROP INDEX checkpoints_work;
    DROP INDEX checkpoints_work_commit;
    CREATE INDEX checkpoints_work_commit ON checkpoints (work_id, commit_seq) WHERE work_id IS NOT NULL;
    DROP INDEX events_key;
    """,
    # 16: a root Event (published, not derived) is its own causal root: it is found by its id, and only
    # derived Events are indexed by their root (one index in a random order fewer per published Event).
    """
    DROP INDEX events_root;
    CREATE INDEX events_root ON events (root_id, seq) WHERE root_id != id;
    """,
    # 17: a routing checkpoint is keyed by its Event's sequence (one to one with the Event, and in the
    # order Events are accepted), not by the Event's id, whose index takes writes in a random order; it
    # refers to its Event by that sequence. SQLite cannot change a table's key in place: the table is
    # copied.
    {
        "sqlite": """
    CREATE TABLE checkpoints_by_seq (
        seq              INTEGER PRIMARY KEY REFERENCES events (seq),
        event_id         TEXT NOT NULL,
        status           TEXT NOT NULL,
        work_id          TEXT REFERENCES works (id),
        route            TEXT,
        route_scope      TEXT,
        policy           TEXT,
        effective_policy TEXT,
        fallback_reason  TEXT,
        reason           TEXT,
        generation       INTEGER,
        at_ms            INTEGER NOT NULL,
        commit_seq       INTEGER
    );
    INSERT INTO checkpoints_by_seq (seq, event_id, status, work_id, route, route_scope, policy,
        effective_policy, fallback_reason, reason, generation, at_ms, commit_seq)
        SELECT seq, event_id, status, work_id, route, route_scope, policy, effective_policy,
        fallback_reason, reason, generation, at_ms, commit_seq FROM checkpoints;
    DROP TABLE checkpoints;
    ALTER TABLE checkpoints_by_seq RENAME TO checkpoints;
    CREATE UNIQUE INDEX checkpoints_commit ON checkpoints (commit_seq);
    CREATE INDEX checkpoints_work_commit ON checkpoints (work_id, commit_seq) WHERE work_id IS NOT NULL;
    """,
        "postgresql": """
    ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_event_id_fkey;
    ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_pkey;
    ALTER TABLE checkpoints DROP CONSTRAINT checkpoints_seq_key;
    ALTER TABLE checkpoints ADD PRIMARY KEY (seq);
    ALTER TABLE checkpoints ADD FOREIGN KEY (seq) REFERENCES events (seq);
    """,
    },
    # 18: the due index carries each timer's revision, so that a due query (`Runtime.due`: id, revision
    # and due time) reads the index alone; it read each due timer's row as well, one page of the table
    # per timer where the due timers are spread among many.
    """
    DROP INDEX timers_due;
    CREATE INDEX timers_due ON timers (fire_at_ms, id, revision) WHERE state = 'armed';
    """,
    # 19: timers due at one instant fire in the order they were armed: each arming takes the next number
    # (``armed_seq``, one above the highest: its own index answers that), and the due index orders by it
    # after the due time. Timers armed before keep 0, and their id order among themselves.
    """
    ALTER TABLE timers ADD COLUMN armed_seq INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX timers_armed_seq ON timers (armed_seq);
    DROP INDEX timers_due;
    CREATE INDEX timers_due ON timers (fire_at_ms, armed_seq, id, revision) WHERE state = 'armed';
    """,
)
