//! Time. Owns the clock abstraction the store (SQLite backend) and its callers read wall time
//! through, so tests can move time by hand. PostgreSQL decides races with its own
//! `clock_timestamp()` instead; this clock never overrides the database there. What tests may
//! do there is shift the database's time forward by a fixed amount ([`ClockShift`]): every
//! Host sharing one shift still reads one clock, so the database still decides every race.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// A source of wall-clock time in milliseconds.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> Millis;
}

/// The process's system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<AtomicI64>,
}

impl ManualClock {
    /// A manual clock starting at `start_ms`.
    pub fn new(start_ms: Millis) -> Self {
        Self {
            now: Arc::new(AtomicI64::new(start_ms)),
        }
    }

    /// A manual clock starting at the system time now.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_ms())
    }

    /// Moves time forward by `ms`.
    pub fn advance_ms(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the time.
    pub fn set_ms(&self, ms: Millis) {
        self.now.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now.load(Ordering::SeqCst)
    }
}

/// A shared clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// A fixed amount added to the database's own time on PostgreSQL (zero unless a test moves
/// it). Cloning shares the same shift, so every store opened from one set of options sees the
/// same time. It only ever grows: the store's time never goes back.
#[derive(Debug, Clone, Default)]
pub struct ClockShift {
    ms: Arc<AtomicI64>,
}

impl ClockShift {
    /// Moves the shifted time forward by `ms` (a negative amount is ignored).
    pub fn advance_ms(&self, ms: i64) {
        self.ms.fetch_add(ms.max(0), Ordering::SeqCst);
    }

    /// The current shift, in milliseconds.
    pub fn ms(&self) -> Millis {
        self.ms.load(Ordering::SeqCst)
    }

    /// `now` (the database's time) shifted.
    pub fn apply(&self, now: Millis) -> Millis {
        now.saturating_add(self.ms())
    }
}
