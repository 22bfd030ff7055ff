-- Session store schema, version 2 (PostgreSQL): lookups of a command by its id must go through
-- the primary key (tenant_id, session_id, command_id).
--
-- The unique index on (tenant_id, session_id, accepted_order) shares the key's first two
-- columns. Without statistics that tell how many commands a session holds, the planner
-- estimates both indexes at one row for a lookup by command id and may pick the order index,
-- which then reads every command of the session to find one. The order index becomes partial
-- on a predicate every row satisfies (accepted_order >= 1 is checked), so acceptance order
-- stays unique per session exactly as before, but the index only serves queries that state
-- the predicate: the store's reads in acceptance order do; lookups by id never do.

ALTER TABLE commands DROP CONSTRAINT commands_tenant_id_session_id_accepted_order_key;

CREATE UNIQUE INDEX commands_in_acceptance_order
    ON commands (tenant_id, session_id, accepted_order)
    WHERE accepted_order > 0;
