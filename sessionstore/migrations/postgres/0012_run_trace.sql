-- Session store schema, version 12 (PostgreSQL): a run's trace context.
--
-- A run started under a W3C trace keeps that trace for its whole life: the start records the
-- context its steps continue (the `run.start` call's span), so every step, on whichever Host
-- drives it (another one after a takeover), lands in the same trace. Both are the header text,
-- checked by the store's reader; a `tracestate` never stands without its `traceparent`. Written
-- once at the start, never changed. NULL for a run started without a trace, or before this
-- version.
ALTER TABLE run_status ADD COLUMN traceparent TEXT
    CHECK (traceparent IS NULL OR length(traceparent) = 55);
ALTER TABLE run_status ADD COLUMN tracestate TEXT
    CHECK (tracestate IS NULL OR length(tracestate) <= 512);
ALTER TABLE run_status ADD CONSTRAINT run_status_tracestate_with_traceparent
    CHECK (tracestate IS NULL OR traceparent IS NOT NULL);
