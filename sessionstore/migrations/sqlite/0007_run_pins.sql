-- Session store schema, version 7 (SQLite): the releases a run is pinned to.
-- One row per (run, runnable identity): the digest of the package every driver of the run
-- invokes for that runnable (`workspace/name@version`, `sha256:<64 hex>`). Written with the
-- run in the transaction that records it, or once under the driver's fence at the first
-- takeover of a run recorded before this version. Create-only: never updated or deleted while
-- the run lives, so a replay on any Host runs the same bytes as the first attempt.

CREATE TABLE run_pins (
    run_id    TEXT    NOT NULL,
    identity  TEXT    NOT NULL CHECK (length(identity) BETWEEN 1 AND 400),
    digest    TEXT    NOT NULL CHECK (length(digest) = 71),
    epoch     INTEGER NOT NULL CHECK (epoch >= 1),
    pinned_at INTEGER NOT NULL,
    PRIMARY KEY (run_id, identity)
);
