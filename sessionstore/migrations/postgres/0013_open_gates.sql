-- Session store schema, version 13: the open gates, oldest first, without a scan.
--
-- An operator's view of the questions waiting for a human reads the open gates of every
-- listed tenant a page at a time, oldest first (the longest wait first). This partial index
-- holds only open gates, in that order, so the read walks it from its cursor on and the
-- resolved gates, which are nearly all of them on an old store, cost nothing.
CREATE INDEX gates_open_by_age ON gates (opened_at, tenant_id, session_id, gate_id)
    WHERE state = 'open';
