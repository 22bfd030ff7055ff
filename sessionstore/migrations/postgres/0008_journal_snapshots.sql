-- Session store schema, version 8 (PostgreSQL): journal snapshots.
--
-- A runtime may checkpoint the fold of its journal: one row per runtime session, the newest
-- snapshot only (a write never replaces a newer one). A snapshot is not a journal record: it
-- takes no sequence number, so the tip, public offsets and history are those of the journal
-- alone. The body is the runtime's own versioned encoding (`format`), checked on read
-- against its SHA-256; a restore reads it and folds the records after `seq`.
CREATE TABLE journal_snapshots (
    runtime_session_id TEXT    NOT NULL PRIMARY KEY,
    seq                BIGINT NOT NULL CHECK (seq >= 1),
    journal_epoch      BIGINT NOT NULL CHECK (journal_epoch >= 1),
    format             BIGINT NOT NULL CHECK (format >= 1),
    sha256             TEXT    NOT NULL CHECK (length(sha256) = 64),
    body               BYTEA    NOT NULL,
    written_at         BIGINT NOT NULL
);
