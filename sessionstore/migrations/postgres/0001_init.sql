-- Session store schema, version 1 (PostgreSQL).
-- Times are milliseconds since the Unix epoch. Epochs, generations and revisions are >= 1
-- where present. The database refuses invalid states through CHECK constraints.

CREATE TABLE sessions (
    tenant_id          TEXT    NOT NULL CHECK (length(tenant_id) BETWEEN 1 AND 256),
    session_id         TEXT    NOT NULL CHECK (length(session_id) BETWEEN 1 AND 256),
    agent_id           TEXT    NOT NULL CHECK (length(agent_id) BETWEEN 1 AND 256),
    compatibility_id   TEXT    NOT NULL CHECK (length(compatibility_id) BETWEEN 1 AND 256),
    runtime_session_id TEXT    NOT NULL UNIQUE,
    storage_binding_id TEXT    NOT NULL,
    binding_version    BIGINT NOT NULL CHECK (binding_version >= 1),
    created_at         BIGINT NOT NULL,
    last_active_at     BIGINT NOT NULL,
    residency_state    TEXT    NOT NULL DEFAULT 'none'
        CHECK (residency_state IN ('none','attaching','resident','releasing','released')),
    last_journal_seq   BIGINT NOT NULL DEFAULT 0 CHECK (last_journal_seq >= 0),
    checkpoint_seq     BIGINT NOT NULL DEFAULT 0 CHECK (checkpoint_seq >= 0),
    gate_mark          BIGINT NOT NULL DEFAULT 0 CHECK (gate_mark >= 0),
    next_order         BIGINT NOT NULL DEFAULT 1 CHECK (next_order >= 1),
    PRIMARY KEY (tenant_id, session_id)
);

CREATE TABLE residency_leases (
    tenant_id       TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    epoch           BIGINT NOT NULL CHECK (epoch >= 1),
    holder          TEXT,
    host_id         TEXT,
    host_generation BIGINT CHECK (host_generation IS NULL OR host_generation >= 1),
    expires_at      BIGINT,
    CHECK ((holder IS NULL) = (expires_at IS NULL)),
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id)
);

CREATE TABLE host_registrations (
    tenant_id       TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    host_id         TEXT    NOT NULL,
    host_generation BIGINT NOT NULL CHECK (host_generation >= 1),
    endpoint        TEXT    NOT NULL,
    residency       TEXT    NOT NULL
        CHECK (residency IN ('attaching','resident','releasing','released')),
    accepting       BIGINT NOT NULL CHECK (accepting IN (0, 1)),
    lease_epoch     BIGINT NOT NULL CHECK (lease_epoch >= 1),
    observed_at     BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id)
);

CREATE TABLE host_targets (
    host_id         TEXT    NOT NULL PRIMARY KEY,
    endpoint        TEXT    NOT NULL,
    placement       TEXT    NOT NULL CHECK (placement IN ('pooled','dedicated')),
    isolation_class TEXT    NOT NULL,
    capacity        BIGINT NOT NULL CHECK (capacity >= 0),
    accepting       BIGINT NOT NULL CHECK (accepting IN (0, 1)),
    generation      BIGINT NOT NULL CHECK (generation >= 1),
    observed_at     BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL
);

CREATE TABLE commands (
    tenant_id               TEXT    NOT NULL,
    session_id              TEXT    NOT NULL,
    command_id              TEXT    NOT NULL CHECK (length(command_id) BETWEEN 1 AND 256),
    accepted_order          BIGINT NOT NULL CHECK (accepted_order >= 1),
    kind                    TEXT    NOT NULL
        CHECK (kind IN ('create','restore','input','interrupt','gate_response')),
    body                    BYTEA,
    object_id               TEXT,
    body_digest             TEXT    NOT NULL CHECK (length(body_digest) = 64),
    body_size               BIGINT NOT NULL CHECK (body_size >= 0),
    principal               TEXT,
    metadata                TEXT,
    runtime_command_id      TEXT    NOT NULL UNIQUE,
    admitted_at             BIGINT NOT NULL,
    apply_deadline          BIGINT NOT NULL,
    state                   TEXT    NOT NULL
        CHECK (state IN ('pending','claimed','applying','applied','rejected')),
    revision                BIGINT NOT NULL CHECK (revision >= 1),
    epoch_mark              BIGINT NOT NULL DEFAULT 0 CHECK (epoch_mark >= 0),
    claim_epoch             BIGINT,
    claim_token             TEXT,
    claim_expires_at        BIGINT,
    attempt_id              TEXT,
    attempt_journal_epoch   BIGINT,
    attempt_residency_epoch BIGINT,
    attempt_at              BIGINT,
    outcome                 TEXT
        CHECK (outcome IS NULL OR outcome IN ('applied','no_op','refused','not_applied','rejected')),
    reason                  TEXT,
    evidence_seq            BIGINT,
    settled_at              BIGINT,
    PRIMARY KEY (tenant_id, session_id, command_id),
    UNIQUE (tenant_id, session_id, accepted_order),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id),
    CHECK ((body IS NULL) <> (object_id IS NULL)),
    CHECK ((claim_epoch IS NULL) = (claim_token IS NULL) AND (claim_epoch IS NULL) = (claim_expires_at IS NULL)),
    CHECK ((attempt_id IS NULL) = (attempt_journal_epoch IS NULL)
           AND (attempt_id IS NULL) = (attempt_residency_epoch IS NULL)
           AND (attempt_id IS NULL) = (attempt_at IS NULL)),
    CHECK (state <> 'pending' OR (claim_epoch IS NULL AND attempt_id IS NULL AND outcome IS NULL)),
    CHECK (state <> 'claimed' OR (claim_epoch IS NOT NULL AND attempt_id IS NULL AND outcome IS NULL)),
    CHECK (state <> 'applying' OR (attempt_id IS NOT NULL AND outcome IS NULL)),
    CHECK (state <> 'applied' OR (attempt_id IS NOT NULL AND outcome IN ('applied','no_op') AND evidence_seq IS NOT NULL)),
    CHECK (state <> 'rejected' OR (
        (attempt_id IS NOT NULL AND outcome IN ('refused','not_applied') AND evidence_seq IS NOT NULL)
        OR (attempt_id IS NULL AND outcome = 'rejected')))
);

CREATE TABLE cursors (
    tenant_id      TEXT    NOT NULL,
    session_id     TEXT    NOT NULL,
    consumed_order BIGINT NOT NULL CHECK (consumed_order >= 0),
    epoch          BIGINT NOT NULL CHECK (epoch >= 1),
    PRIMARY KEY (tenant_id, session_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id)
);

CREATE TABLE gates (
    tenant_id       TEXT    NOT NULL,
    session_id      TEXT    NOT NULL,
    gate_id         TEXT    NOT NULL,
    opened_event_id TEXT    NOT NULL,
    opened_seq      BIGINT NOT NULL CHECK (opened_seq >= 1),
    kind            TEXT    NOT NULL,
    prompt_summary  TEXT    NOT NULL,
    deadline        BIGINT NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('open','resolved')),
    opened_at       BIGINT NOT NULL,
    resolved_seq    BIGINT,
    resolved_at     BIGINT,
    CHECK ((state = 'resolved') = (resolved_seq IS NOT NULL)),
    PRIMARY KEY (tenant_id, session_id, gate_id),
    FOREIGN KEY (tenant_id, session_id) REFERENCES sessions (tenant_id, session_id)
);

CREATE TABLE payload_objects (
    object_id  TEXT    NOT NULL PRIMARY KEY,
    tenant_id  TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    media_type TEXT    NOT NULL,
    size       BIGINT NOT NULL CHECK (size >= 0),
    sha256     TEXT    NOT NULL CHECK (length(sha256) = 64),
    bytes      BYTEA    NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE journal_leases (
    runtime_session_id TEXT    NOT NULL PRIMARY KEY,
    tenant_id          TEXT    NOT NULL,
    epoch              BIGINT NOT NULL CHECK (epoch >= 1),
    holder             TEXT,
    expires_at         BIGINT,
    tip                BIGINT NOT NULL CHECK (tip >= 0)
);

CREATE TABLE journal_records (
    runtime_session_id      TEXT    NOT NULL,
    seq                     BIGINT NOT NULL CHECK (seq >= 1),
    kind                    TEXT    NOT NULL
        CHECK (kind IN ('fence','event','control','application','closure')),
    journal_epoch           BIGINT NOT NULL CHECK (journal_epoch >= 1),
    written_at              BIGINT NOT NULL,
    event_id                TEXT,
    public_body             BYTEA,
    public_object_id        TEXT,
    private_body            BYTEA,
    private_object_id       TEXT,
    cause_runtime_command   TEXT,
    command_id              TEXT,
    runtime_command_id      TEXT,
    command_kind            TEXT,
    attempt_id              TEXT,
    attempt_journal_epoch   BIGINT,
    outcome                 TEXT
        CHECK (outcome IS NULL OR outcome IN ('applied','no_op','refused','not_applied')),
    detail                  BYTEA,
    PRIMARY KEY (runtime_session_id, seq),
    CHECK (kind <> 'event' OR event_id IS NOT NULL),
    CHECK (kind NOT IN ('application','closure') OR (runtime_command_id IS NOT NULL
        AND attempt_id IS NOT NULL AND attempt_journal_epoch IS NOT NULL AND outcome IS NOT NULL)),
    CHECK (kind <> 'closure' OR (outcome = 'not_applied' AND attempt_journal_epoch < journal_epoch)),
    CHECK (kind <> 'application' OR (outcome <> 'not_applied' AND attempt_journal_epoch = journal_epoch))
);

CREATE UNIQUE INDEX journal_one_disposition_per_command
    ON journal_records (runtime_session_id, runtime_command_id)
    WHERE kind IN ('application','closure');

CREATE INDEX journal_effects_by_cause
    ON journal_records (runtime_session_id, cause_runtime_command)
    WHERE cause_runtime_command IS NOT NULL;
