//! What a store is opened with: the URL, each backend's settings and their bounds, and the
//! storage bindings whose journal is the store's own. Owns the defaults and the refusal of a
//! setting out of its bounds (by the setting's name), before anything is opened; never opens
//! anything itself.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{ClockShift, SharedClock, SystemClock};
use crate::error::{StoreError, StoreResult};
use crate::ids::StorageBindingId;
use crate::limits::{DEFAULT_REFERENCED_BODY_CAP, check_referenced_body_cap};

/// SQLite's `synchronous` setting.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Synchronous {
    /// Every commit is fsynced before it is acknowledged (the default).
    #[default]
    Full,
    /// Commits are fsynced at WAL checkpoints: a power loss may lose the most recent commits
    /// (never corrupts the file). An explicit opt-in.
    Normal,
}

/// Options for opening a store.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// `sqlite://<path>` (or a plain path) or `postgres://...`.
    pub url: String,
    /// SQLite durability.
    pub synchronous: Synchronous,
    /// How long a SQLite write waits for another process's write lock.
    pub busy_timeout: Duration,
    /// SQLite reader connections.
    pub sqlite_readers: usize,
    /// The page cache of SQLite's writer connection, in KiB (`PRAGMA cache_size`). It keeps
    /// the pages writes touch; it fills as the database grows and never holds more than this.
    /// 64 KiB to 1 GiB; default 2 MiB (SQLite's own default).
    pub sqlite_writer_cache_kib: u32,
    /// The page cache of each SQLite reader connection, in KiB. A reader's cache is emptied
    /// whenever another connection has committed since its last read, so under a stream of
    /// writes a large one buys little but still fills between commits (a restore reads a whole
    /// journal). With the writer's, SQLite holds at most
    /// `sqlite_writer_cache_kib + sqlite_readers × sqlite_reader_cache_kib` of page cache in
    /// this process. 64 KiB to 1 GiB; default 256 KiB.
    pub sqlite_reader_cache_kib: u32,
    /// The most write operations one transaction groups together (SQLite's writer, and each
    /// PostgreSQL write lane).
    pub max_write_batch: usize,
    /// PostgreSQL pool size (reads, and writes re-run alone).
    pub pg_max_connections: u32,
    /// PostgreSQL write lanes: each holds one connection of its own (beyond the pool) and
    /// commits the writes queued on it as one transaction, sending a group's writes of one kind
    /// as one statement. Fewer lanes make bigger groups (less database CPU per write); more
    /// keep more commits in flight. Default 2, 1 to 64.
    pub pg_write_lanes: usize,
    /// PostgreSQL schema to use (created if missing); `None` uses the connection's default.
    pub pg_schema: Option<String>,
    /// The `application_name` every PostgreSQL connection of this store reports (in
    /// `pg_stat_activity`), so an operator can count a Host's connections; `None` leaves the
    /// URL's (or the driver's) name. At most 63 bytes (PostgreSQL's limit).
    pub pg_application_name: Option<String>,
    /// How long a PostgreSQL connection of this store may sit idle inside a transaction before
    /// the server ends it (and so releases its row locks): a frozen Host then stalls the rest
    /// of the fleet for at most this long. 100 ms to 1 hour; default 5 s (the store's own
    /// transactions are never idle for more than a round trip).
    pub pg_idle_transaction_timeout: Duration,
    /// How long a PostgreSQL read or write waits for a pooled connection (while the server is
    /// away, the pool keeps trying to connect for this long) before it fails as a transient
    /// `unavailable`. Callers that retry transient errors (the journal append, residency
    /// renewal, the command consumer) then retry on their own schedule instead of each waiting
    /// out the whole outage here. 100 ms to 5 minutes; default 10 s.
    pub pg_acquire_timeout: Duration,
    /// How often (PostgreSQL) the store checks which of its tables of at least 10 pages were
    /// never analysed or changed by more than 50 rows and a tenth since the database last
    /// analysed them (autovacuum's default rule), and analyses those, so query plans follow
    /// the tables' growth even where autovacuum is off. 100 ms to 1 hour.
    pub pg_statistics_interval: Duration,
    /// The largest referenced body accepted (at most 16 MiB).
    pub referenced_body_cap: u64,
    /// Storage bindings whose journal is this store's own journal.
    pub local_storage_bindings: Vec<StorageBindingId>,
    /// The clock the SQLite backend decides expiries with (PostgreSQL uses its own clock).
    pub clock: SharedClock,
    /// Added to the database's time on PostgreSQL: zero (the default) except in tests that
    /// move the store's time without waiting for it (see `ClockShift`).
    pub pg_clock_shift: ClockShift,
}

/// The storage binding id sessions created against the embedded journal use by default.
pub const LOCAL_STORAGE_BINDING: &str = "local";

impl StoreOptions {
    /// The default [`StoreOptions::sqlite_writer_cache_kib`] (SQLite's own default).
    pub const DEFAULT_SQLITE_WRITER_CACHE_KIB: u32 = 2048;
    /// The default [`StoreOptions::sqlite_reader_cache_kib`].
    pub const DEFAULT_SQLITE_READER_CACHE_KIB: u32 = 256;

    /// Defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
            sqlite_readers: 4,
            sqlite_writer_cache_kib: Self::DEFAULT_SQLITE_WRITER_CACHE_KIB,
            sqlite_reader_cache_kib: Self::DEFAULT_SQLITE_READER_CACHE_KIB,
            max_write_batch: 256,
            pg_max_connections: 16,
            pg_write_lanes: 2,
            pg_schema: None,
            pg_application_name: None,
            pg_idle_transaction_timeout: Duration::from_secs(5),
            pg_acquire_timeout: Duration::from_secs(10),
            pg_statistics_interval: Duration::from_secs(10),
            referenced_body_cap: DEFAULT_REFERENCED_BODY_CAP,
            local_storage_bindings: vec![local_binding()],
            clock: Arc::new(SystemClock),
            pg_clock_shift: ClockShift::default(),
        }
    }

    pub(crate) fn validate(&self) -> StoreResult<()> {
        // A referenced body is one too large to be inline, so a cap at or below the inline
        // limit would refuse every body that needs a reference.
        check_referenced_body_cap(self.referenced_body_cap)?;
        if let Some(name) = &self.pg_application_name
            && (name.len() > 63 || name.chars().any(char::is_control))
        {
            return Err(StoreError::invalid(
                "pg_application_name",
                "must be at most 63 bytes with no control characters",
            ));
        }
        if self.sqlite_readers == 0 || self.sqlite_readers > 64 {
            return Err(StoreError::invalid(
                "sqlite_readers",
                "must be between 1 and 64",
            ));
        }
        for (field, kib) in [
            ("sqlite_writer_cache_kib", self.sqlite_writer_cache_kib),
            ("sqlite_reader_cache_kib", self.sqlite_reader_cache_kib),
        ] {
            if !(64..=1024 * 1024).contains(&kib) {
                return Err(StoreError::invalid(
                    field,
                    "must be between 64 KiB and 1 GiB",
                ));
            }
        }
        if self.max_write_batch == 0 || self.max_write_batch > 4096 {
            return Err(StoreError::invalid(
                "max_write_batch",
                "must be between 1 and 4096",
            ));
        }
        if self.pg_max_connections == 0 || self.pg_max_connections > 512 {
            return Err(StoreError::invalid(
                "pg_max_connections",
                "must be between 1 and 512",
            ));
        }
        if self.pg_idle_transaction_timeout < Duration::from_millis(100)
            || self.pg_idle_transaction_timeout > Duration::from_secs(3600)
        {
            return Err(StoreError::invalid(
                "pg_idle_transaction_timeout",
                "must be between 100 ms and 1 hour",
            ));
        }
        if self.pg_acquire_timeout < Duration::from_millis(100)
            || self.pg_acquire_timeout > Duration::from_secs(300)
        {
            return Err(StoreError::invalid(
                "pg_acquire_timeout",
                "must be between 100 ms and 5 minutes",
            ));
        }
        if self.pg_write_lanes == 0 || self.pg_write_lanes > 64 {
            return Err(StoreError::invalid(
                "pg_write_lanes",
                "must be between 1 and 64",
            ));
        }
        if self.pg_statistics_interval < Duration::from_millis(100)
            || self.pg_statistics_interval > Duration::from_secs(3600)
        {
            return Err(StoreError::invalid(
                "pg_statistics_interval",
                "must be between 100 ms and 1 hour",
            ));
        }
        if self.busy_timeout > Duration::from_secs(600) {
            return Err(StoreError::invalid(
                "busy_timeout",
                "must be at most 10 minutes",
            ));
        }
        if let Some(schema) = &self.pg_schema
            && (schema.is_empty()
                || schema.len() > 63
                || !schema
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                || schema.as_bytes()[0].is_ascii_digit())
        {
            return Err(StoreError::invalid(
                "pg_schema",
                "must be 1-63 characters of [a-z0-9_], not starting with a digit",
            ));
        }
        Ok(())
    }
}

/// The default local storage binding id.
pub fn local_binding() -> StorageBindingId {
    StorageBindingId::from_literal(LOCAL_STORAGE_BINDING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_acquire_timeout_outside_100_ms_to_5_minutes_is_refused_by_name() {
        let mut o = StoreOptions::new("sqlite://x");
        for (t, ok) in [
            (Duration::from_millis(99), false),
            (Duration::from_millis(100), true),
            (Duration::from_secs(300), true),
            (Duration::from_secs(301), false),
        ] {
            o.pg_acquire_timeout = t;
            match o.validate() {
                Ok(()) => assert!(ok, "{t:?} was accepted"),
                Err(e) => {
                    assert!(!ok, "{t:?} was refused: {e}");
                    assert!(e.to_string().contains("pg_acquire_timeout"), "{e}");
                }
            }
        }
    }
}
