-- Session store schema, version 10 (SQLite): who asked.
--
-- A command's actor is its `principal` (recorded since version 1; a gate's answer is a
-- `gate_response` command, so its answerer is that command's principal) and a run answer's is
-- `run_answers.answerer` (since version 4). This version adds the two that were not kept:
--   run_status.started_by: the actor who started the run; NULL for a run recorded before this
--     version (shown as unknown, never guessed);
--   host_drains: who asked a Host's incarnation (host id, generation) to drain, and when. The
--     first request of an incarnation is the one kept: a drain is idempotent, a repeat joins
--     the first.

ALTER TABLE run_status ADD COLUMN started_by TEXT
    CHECK (started_by IS NULL OR length(started_by) BETWEEN 1 AND 256);

CREATE TABLE host_drains (
    host_id         TEXT    NOT NULL CHECK (length(host_id) BETWEEN 1 AND 256),
    host_generation INTEGER NOT NULL CHECK (host_generation >= 1),
    requested_by    TEXT    NOT NULL CHECK (length(requested_by) BETWEEN 1 AND 256),
    requested_at    INTEGER NOT NULL,
    PRIMARY KEY (host_id, host_generation)
);
