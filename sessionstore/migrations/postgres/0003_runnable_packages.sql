-- Session store schema, version 3 (PostgreSQL): published runnable packages.
-- One row per release (workspace, name, version); a release is immutable. `digest` is the
-- package's own digest (over its files); `sha256` is over the stored bytes and is checked on
-- every read.

CREATE TABLE runnable_packages (
    workspace    TEXT   NOT NULL CHECK (length(workspace) BETWEEN 1 AND 128),
    name         TEXT   NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    version      TEXT   NOT NULL CHECK (length(version) BETWEEN 1 AND 128),
    digest       TEXT   NOT NULL CHECK (length(digest) = 71),
    size         BIGINT NOT NULL CHECK (size >= 0),
    sha256       TEXT   NOT NULL CHECK (length(sha256) = 64),
    bytes        BYTEA  NOT NULL,
    published_at BIGINT NOT NULL,
    PRIMARY KEY (workspace, name, version)
);
