//! A proxy's counters: connections accepted, dropped, held, cut and open, upstream dials that
//! failed, and the bytes delivered each way. Owns the atomics the proxy's tasks bump and the
//! snapshot a test reads; never decides anything.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a proxy has done so far (a snapshot; see [`super::ProxyHandle::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted from clients (every one, whatever happened to it next).
    pub accepted: u64,
    /// Connections ended at accept by [`super::AcceptFault::Drop`].
    pub dropped: u64,
    /// Connections held silent at accept by [`super::AcceptFault::BlackHole`].
    pub held: u64,
    /// Open connections ended by [`super::ProxyHandle::cut_all`].
    pub cut: u64,
    /// Connections whose upstream could not be dialled (the client was reset).
    pub upstream_failed: u64,
    /// Connections open now (held ones included).
    pub open: u64,
    /// Bytes delivered from clients to the upstream.
    pub bytes_up: u64,
    /// Bytes delivered from the upstream to clients.
    pub bytes_down: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub accepted: AtomicU64,
    pub dropped: AtomicU64,
    pub held: AtomicU64,
    pub cut: AtomicU64,
    pub upstream_failed: AtomicU64,
    pub open: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
}

impl Counters {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> ProxyStats {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProxyStats {
            accepted: read(&self.accepted),
            dropped: read(&self.dropped),
            held: read(&self.held),
            cut: read(&self.cut),
            upstream_failed: read(&self.upstream_failed),
            open: read(&self.open),
            bytes_up: read(&self.bytes_up),
            bytes_down: read(&self.bytes_down),
        }
    }
}

/// Counts one open connection for as long as it lives.
pub(super) struct OpenGuard<'a>(&'a AtomicU64);

impl<'a> OpenGuard<'a> {
    pub fn new(open: &'a AtomicU64) -> OpenGuard<'a> {
        open.fetch_add(1, Ordering::Relaxed);
        OpenGuard(open)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
