-- Session store schema, version 6 (SQLite): public stream offsets.
--
-- A session channel's Centrifuge offset is the ordinal of a public event among the public
-- events of its journal (1 for the first, no gaps): a pure function of the append-only
-- journal, so every Host computes the same offset for the same record. Counting events up to
-- a sequence and skipping to the n-th event read this partial index alone (it holds public
-- events only, keyed like the journal), never the runtime's private records or the bodies.
CREATE INDEX journal_public_events
    ON journal_records (runtime_session_id, seq)
    WHERE kind = 'event';
