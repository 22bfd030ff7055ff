-- Session store schema, version 2 (SQLite): nothing to change.
--
-- PostgreSQL's version 2 makes the unique index on (tenant_id, session_id, accepted_order)
-- partial so its planner cannot prefer it to the primary key for a lookup by command id.
-- SQLite's planner always prefers the index that matches more equality constraints (the
-- primary key, for a lookup by id), so its schema stays as version 1 made it. This version
-- exists so both backends count their schema versions alike.
SELECT 1;
