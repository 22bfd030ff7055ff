//! Counters of the work a store sends to its database: write operations, the statements they
//! issue, the statements and transactions that actually reach the database server. Owns only
//! the counters; never decides anything from them. Benchmarks read them to report statements
//! per command; they cost one relaxed atomic add per event.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a store's counters since it was opened.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct StoreStats {
    /// Write operations called.
    pub writes: u64,
    /// Statements the operations issued, each counted once whether or not it was sent in a
    /// batch with others: the cost of the operations as written.
    pub statements: u64,
    /// Statements sent to the database: a batch of many operations' statements counts once,
    /// and every `BEGIN`, `COMMIT`, `ROLLBACK`, savepoint and notification counts. On
    /// PostgreSQL each is one round trip.
    pub server_statements: u64,
    /// Transactions committed.
    pub commits: u64,
    /// Writes a merged statement presumed that the state machine did not make, undone (or
    /// rolled back). Zero unless a statement restates a check more loosely than the machine,
    /// or settlement's evidence lives in another journal while this store's own holds a
    /// matching frame.
    pub presumptions_undone: u64,
    /// Changes the machine made that a merged statement's checks had refused, written by a
    /// further statement (PostgreSQL). Zero unless a statement restates a check more strictly
    /// than the machine, or a row moved under a concurrent writer.
    pub presumptions_missed: u64,
}

impl StoreStats {
    /// The counts accrued between `earlier` and `self`.
    pub fn since(&self, earlier: &StoreStats) -> StoreStats {
        StoreStats {
            writes: self.writes.saturating_sub(earlier.writes),
            statements: self.statements.saturating_sub(earlier.statements),
            server_statements: self
                .server_statements
                .saturating_sub(earlier.server_statements),
            commits: self.commits.saturating_sub(earlier.commits),
            presumptions_undone: self
                .presumptions_undone
                .saturating_sub(earlier.presumptions_undone),
            presumptions_missed: self
                .presumptions_missed
                .saturating_sub(earlier.presumptions_missed),
        }
    }
}

/// The live counters, shared by a store's engine and its connections.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    writes: AtomicU64,
    statements: AtomicU64,
    server_statements: AtomicU64,
    commits: AtomicU64,
    undone: AtomicU64,
    missed: AtomicU64,
}

impl Counters {
    pub(crate) fn write(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn statement(&self) {
        self.statements.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn server_statements(&self, n: u64) {
        self.server_statements.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }

    /// A presumed write undone (`true`), or a change the presumption missed (`false`).
    pub(crate) fn presumption(&self, undone: bool) {
        let c = if undone { &self.undone } else { &self.missed };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        StoreStats {
            writes: self.writes.load(Ordering::Relaxed),
            statements: self.statements.load(Ordering::Relaxed),
            server_statements: self.server_statements.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            presumptions_undone: self.undone.load(Ordering::Relaxed),
            presumptions_missed: self.missed.load(Ordering::Relaxed),
        }
    }
}
