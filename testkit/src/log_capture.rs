//! The Host's own log, read back by a test: a global subscriber writing every line (DEBUG and
//! up, no colours) into memory, installed once per test binary. Tests of one binary share it,
//! so a test picks its lines by something only it logs (a session id, a step and a count).

use std::io::Write;
use std::sync::{Mutex, Once};

static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber once for the whole binary.
pub fn capture() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(|| Capture)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
    });
}

/// The captured lines that mention `needle`.
pub fn lines_with(needle: &str) -> Vec<String> {
    String::from_utf8_lossy(&LOG.lock().unwrap_or_else(|p| p.into_inner()))
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}
