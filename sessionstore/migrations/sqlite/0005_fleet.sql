-- Session store schema, version 5 (SQLite): the fleet.
--
-- A Host's one heartbeat renews every residency lease and registration it holds (found by
-- host id and generation through the two indexes below) and publishes the admission weight it
-- has charged, so placement can spread by free weight. The fleet's reconciler elects one
-- acting leader through `fleet_leaders` (an epoch that only grows fences a deposed leader) and
-- hands a session to a Host through `placements`, written only under a current leadership.
-- `commands_open` lets the reconciler find sessions with work not yet ended without reading
-- ended commands.

ALTER TABLE host_targets ADD COLUMN weight_used INTEGER NOT NULL DEFAULT 0
    CHECK (weight_used >= 0);

CREATE INDEX residency_leases_by_host
    ON residency_leases (host_id, host_generation) WHERE holder IS NOT NULL;

CREATE INDEX host_registrations_by_host
    ON host_registrations (host_id, host_generation);

CREATE INDEX commands_open
    ON commands (tenant_id, session_id) WHERE state IN ('pending','claimed','applying');

CREATE TABLE fleet_leaders (
    name       TEXT    NOT NULL PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 256),
    epoch      INTEGER NOT NULL CHECK (epoch >= 1),
    holder     TEXT,
    expires_at INTEGER,
    CHECK ((holder IS NULL) = (expires_at IS NULL))
);

CREATE TABLE placements (
    tenant_id       TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    host_id         TEXT    NOT NULL CHECK (length(host_id) BETWEEN 1 AND 256),
    host_generation INTEGER NOT NULL CHECK (host_generation >= 1),
    leader_epoch    INTEGER NOT NULL CHECK (leader_epoch >= 1),
    assigned_at     INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id)
);

CREATE INDEX placements_by_host ON placements (host_id, host_generation);
