-- Session store schema, version 4 (SQLite): workflow runs.
-- run_programs: the exact source a run started from, written once (create-only).
-- run_status: one row per run, changed only by compare-and-set over (state, holder, epoch,
--   fencing_token); every driver write carries the token it was given and is refused once a
--   takeover minted another. `lease_expires_at` is renewed by the live driver.
-- run_journal: the step journal; at most one row per (run, step, kind, attempt), so a step has
--   at most one result (kind 'result', attempt 0).
-- run_checkpoints: asks, sleeps and operator attention points, armed once (a sleep's deadline
--   is absolute and survives restarts).
-- run_answers: at most one answer per checkpoint, recorded first, consumed once.

CREATE TABLE run_programs (
    run_id     TEXT    NOT NULL PRIMARY KEY,
    tenant_id  TEXT    NOT NULL,
    source     TEXT    NOT NULL,
    sha256     TEXT    NOT NULL CHECK (length(sha256) = 64),
    created_at INTEGER NOT NULL
);

CREATE TABLE run_status (
    run_id           TEXT    NOT NULL PRIMARY KEY,
    tenant_id        TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('running', 'needs_attention', 'completed', 'failed', 'cancelled')),
    holder           TEXT    NOT NULL,
    epoch            INTEGER NOT NULL CHECK (epoch >= 1),
    fencing_token    TEXT    NOT NULL,
    lease_expires_at INTEGER NOT NULL,
    idempotency_key  TEXT,
    input            TEXT    NOT NULL,
    step             TEXT,
    failure_code     TEXT,
    failure_step     TEXT,
    failure_message  TEXT,
    revision         INTEGER NOT NULL CHECK (revision >= 1),
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX run_status_by_tenant ON run_status (tenant_id, created_at, run_id);
CREATE INDEX run_status_by_state ON run_status (state, lease_expires_at);

CREATE TABLE run_journal (
    run_id      TEXT    NOT NULL,
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    step        TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('began', 'result', 'failure')),
    attempt     INTEGER NOT NULL CHECK (attempt >= 0),
    outcome     TEXT,
    body        TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    started_at  INTEGER,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, step, kind, attempt)
);

CREATE TABLE run_checkpoints (
    run_id      TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    kind        TEXT    NOT NULL CHECK (kind IN ('ask', 'sleep', 'attention')),
    question    TEXT,
    schema      TEXT,
    deadline_at INTEGER,
    armed_at    INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    PRIMARY KEY (run_id, name)
);

CREATE TABLE run_answers (
    run_id         TEXT    NOT NULL,
    checkpoint     TEXT    NOT NULL,
    value          TEXT    NOT NULL,
    answerer       TEXT    NOT NULL,
    answered_at    INTEGER NOT NULL,
    consumed_at    INTEGER,
    consumed_epoch INTEGER,
    PRIMARY KEY (run_id, checkpoint)
);
