//! Waiting for something to become true, the one way every suite does it: poll a probe until
//! it answers `Ok`, up to [`WAIT`], and on timeout fail naming what was awaited and the last
//! thing the probe saw. Never sleeps longer than one poll interval past success.

use std::time::{Duration, Instant};

/// How long any one wait in the suites may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);
/// How often a probe is asked again.
pub const POLL: Duration = Duration::from_millis(20);

/// Asks `probe` until it answers `Ok(value)`, up to [`WAIT`]; `Err` carries what it saw, for
/// the failure message.
pub async fn eventually<T>(what: &str, mut probe: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let seen = match probe().await {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}; last seen: {seen}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for suites without a Tokio runtime (process-level tests on threads).
pub fn eventually_blocking<T>(what: &str, mut probe: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        let seen = match probe() {
            Ok(v) => return v,
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for {what}; last seen: {seen}");
        }
        std::thread::sleep(POLL);
    }
}

/// True as an `Ok(())`, false as an `Err` with `seen`.
pub fn check(ok: bool, seen: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(seen()) }
}
