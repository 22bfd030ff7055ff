//! A resident session: what the Host holds for one session it applies commands for. Owns the
//! session's in-memory record (grant, runtime, state, task handles, and the per-session
//! figures the gauges read at scrape time); the residency owner (`residency`) owns the table
//! of them. Nothing here is durable: it is rebuilt by the next attach. Never reaches the table
//! or any other session.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use department::Runtime;
use sessionstore::{
    AgentId, CompatibilityId, ResidencyEpoch, ResidencyGrant, SessionBinding, SessionId, TenantId,
};
use tokio::sync::{Mutex, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::fanout::Relay;

/// The key of a session on this Host.
#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct SessionKey {
    pub tenant: TenantId,
    pub session: SessionId,
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.tenant, self.session)
    }
}

/// Where a resident session is in its life on this Host.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ResidentState {
    /// Applying commands.
    Resident,
    /// Being released (warm release, drain, or after a fault): admits nothing new.
    Releasing,
    /// Gone from this Host.
    Ended,
}

/// The consumer's controls, shared by the consumer task and everyone who halts or wakes it.
#[derive(Debug)]
pub(crate) struct ConsumerControl {
    pub hints: mpsc::Sender<()>,
    pub halted: AtomicBool,
    /// Held for the whole of a pass; a halt takes it to wait out the pass in flight.
    pub pass: Mutex<()>,
    /// Whether the session's command stream is blocked (read at scrape time).
    pub blocked: AtomicBool,
    /// Commands not yet consumed as of the last pass (read at scrape time).
    pub lag: AtomicI64,
}

impl ConsumerControl {
    /// A wake-up hint; never blocks (a full queue already guarantees a pass).
    pub fn wake(&self) {
        let _ = self.hints.try_send(());
    }

    /// How many wake-ups wait in the queue now.
    pub fn queued(&self) -> usize {
        self.hints.max_capacity() - self.hints.capacity()
    }

    /// Stops new passes and waits (at most `bound`) for the pass in flight. True when no pass
    /// is running any more.
    pub async fn halt(&self, bound: Duration) -> bool {
        self.halted.store(true, Ordering::SeqCst);
        tokio::time::timeout(bound, self.pass.lock()).await.is_ok()
    }

    /// Lets passes run again and asks for one.
    pub fn resume(&self) {
        self.halted.store(false, Ordering::SeqCst);
        self.wake();
    }
}

/// One resident session.
pub(crate) struct Resident {
    pub key: SessionKey,
    pub agent: AgentId,
    pub compatibility: CompatibilityId,
    pub binding: SessionBinding,
    pub grant: std::sync::Mutex<ResidencyGrant>,
    pub epoch: ResidencyEpoch,
    /// The attach generation that owns this residency's admission charge.
    pub generation: u64,
    pub runtime: Runtime,
    pub state: watch::Sender<ResidentState>,
    pub consumer: Arc<ConsumerControl>,
    /// Cancels every task of this residency.
    pub cancel: CancellationToken,
    pub tasks: TaskTracker,
    pub gates_open: AtomicUsize,
    /// Guards the single end of this residency (release, drain, fault or loss).
    pub ending: AtomicBool,
    /// Set by a warm release that gave the residency back (so a drain that waited for it
    /// can report the session released).
    pub warm_released: AtomicBool,
    /// Projected committed events, relayed to every subscriber of this session (a buffer only
    /// while someone watches).
    pub relay: Relay,
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident")
            .field("key", &self.key)
            .field("epoch", &self.epoch)
            .field("generation", &self.generation)
            .finish()
    }
}

impl Resident {
    pub fn state(&self) -> ResidentState {
        *self.state.borrow()
    }

    pub fn set_state(&self, s: ResidentState) {
        self.state.send_replace(s);
    }

    pub fn grant(&self) -> ResidencyGrant {
        match self.grant.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Records the lease's expiry as the Host's last heartbeat renewed it.
    pub fn set_lease_expiry(&self, expires_at_ms: i64) {
        match self.grant.lock() {
            Ok(mut g) => g.expires_at_ms = expires_at_ms,
            Err(p) => p.into_inner().expires_at_ms = expires_at_ms,
        }
    }

    /// Claims the right to end this residency; false when another path already ends it.
    pub fn begin_end(&self) -> bool {
        !self.ending.swap(true, Ordering::SeqCst)
    }

    /// Gives up a claim taken with [`Resident::begin_end`] without ending the residency (a
    /// warm release taken back): the session is an ordinary resident again, and whoever waits
    /// to end it (a drain) is woken to claim it.
    pub fn abandon_end_claim(&self) {
        self.ending.store(false, Ordering::SeqCst);
        self.set_state(ResidentState::Resident);
    }
}
