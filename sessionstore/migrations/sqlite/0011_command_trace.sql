-- Session store schema, version 11 (SQLite): a command's trace context.
--
-- A controller that admits a command under a W3C trace records the trace's `traceparent` (and
-- `tracestate`) with it, so whichever Host claims, attempts and settles the command (another
-- one after a failover) continues the same trace. Both are the header text, checked by the
-- store's reader; a `tracestate` never stands without its `traceparent`. Neither changes
-- once admitted and neither takes part in the idempotency of admission.
ALTER TABLE commands ADD COLUMN traceparent TEXT
    CHECK (traceparent IS NULL OR length(traceparent) = 55);
ALTER TABLE commands ADD COLUMN tracestate TEXT
    CHECK (tracestate IS NULL OR (traceparent IS NOT NULL AND length(tracestate) <= 512));
