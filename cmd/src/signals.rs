//! The signals `hostd` honours, in one place: the stop signals (SIGINT and SIGTERM), waited
//! for by name (a long-running command stops gracefully at the first and may give up at the
//! second), and SIGHUP, at which `hostd serve` reads its tenant credentials again. Never
//! installs a handler for any other signal.

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

/// SIGHUP, listened for from the moment this is made.
pub struct Hangups(Signal);

impl Hangups {
    pub fn listen() -> Result<Hangups> {
        Ok(Hangups(
            signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?,
        ))
    }

    /// Waits for the next SIGHUP; `false` once none can come.
    pub async fn next(&mut self) -> bool {
        self.0.recv().await.is_some()
    }
}
