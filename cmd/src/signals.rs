//! The stop signals `hostd` honours (SIGINT and SIGTERM), in one place: waiting for the next
//! one, by name. A long-running command stops gracefully at the first and may give up at the
//! second. Never installs a handler for any other signal.

use anyhow::{Context, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM, listened for from the moment this is made.
pub struct StopSignals {
    int: Signal,
    term: Signal,
}

impl StopSignals {
    pub fn listen() -> Result<StopSignals> {
        Ok(StopSignals {
            int: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            term: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
        })
    }

    /// Waits for the next stop signal; returns its name.
    pub async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}
