//! The residency owner: the one owner of this Host's table of resident sessions and of
//! everything that must stay consistent with it — the admission ledger, the per-session attach
//! locks, the Host's generation and lifecycle flags (started, draining, live), the route
//! invalidations, and the task tracker every residency's work runs under. It also owns the
//! single abnormal end of a residency (lost lease or runtime fault).
//!
//! Every other part reaches it through methods, never its fields: a session's tasks (consumer,
//! gate publisher, relay, warm release, upkeep) through the narrow per-session [`SessionCtx`],
//! and the composition (`service`) and the drain (`release`) through the methods below. This
//! module imports none of those parts: they import it. It never launches a runtime or starts a
//! session's tasks (that is the attach's job, in `service`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sessionstore::{
    ErrorCode, HostAdvertisement, RegistrationUpdate, ResidencyEpoch, ResidencyGrant,
    ResidencyState, SessionId, Store, StoreError, TenantId,
};
use timing::Backoff;
use tokio::sync::{OwnedMutexGuard, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Admission;
use crate::error::HostError;
use crate::failpoints;
use crate::metrics::{GaugeSample, GaugeSource, Metrics};
use crate::options::Config;
use crate::readiness::Readiness;
use crate::resident::{Resident, ResidentState, SessionKey};

/// How many route invalidations may queue before a slow listener misses some (it then drops
/// every route, which is safe).
const INVALIDATION_BUFFER: usize = 1024;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Why a residency ends abnormally.
#[derive(Clone, Debug)]
pub(crate) enum EndReason {
    /// The residency lease was lost: write nothing more under it.
    Lost(String),
    /// The runtime faulted or is unsound: abandon it, tombstone, release.
    Fault(String),
    /// No heartbeat renewed the lease in time: it may lapse before the store is heard from
    /// again, so stop now, while it is still ours; then tombstone and release (retried until
    /// the store answers, and refused by it if a successor took the session meanwhile).
    Unrenewed(String),
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Lost(r) => write!(f, "residency lost: {r}"),
            EndReason::Fault(r) => write!(f, "runtime fault: {r}"),
            EndReason::Unrenewed(r) => write!(f, "residency given up unrenewed: {r}"),
        }
    }
}

/// Per-session locks that serialize attach (and a drain waiting for an attach) on one session.
/// An entry lives only while someone holds or waits for it, so the map never outgrows the
/// sessions being attached or drained at this instant.
#[derive(Default)]
struct SessionLocks {
    map: Mutex<HashMap<SessionKey, Arc<tokio::sync::Mutex<()>>>>,
}

/// A held per-session lock; dropping it removes the entry when nobody else waits on it.
pub(crate) struct SessionGuard<'a> {
    locks: &'a SessionLocks,
    key: SessionKey,
    entry: Arc<tokio::sync::Mutex<()>>,
    held: Option<OwnedMutexGuard<()>>,
}

impl SessionLocks {
    fn entry(&self, key: &SessionKey) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.map).entry(key.clone()).or_default().clone()
    }

    /// Waits for the session's lock, at most `bound` when one is given. The guard is returned
    /// either way; `held()` says whether the lock was taken.
    async fn acquire(&self, key: &SessionKey, bound: Option<Duration>) -> SessionGuard<'_> {
        let entry = self.entry(key);
        let wait = entry.clone().lock_owned();
        let held = match bound {
            None => Some(wait.await),
            Some(b) => tokio::time::timeout(b, wait).await.ok(),
        };
        SessionGuard {
            locks: self,
            key: key.clone(),
            entry,
            held,
        }
    }

    fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

#[cfg(test)]
impl SessionGuard<'_> {
    /// True when the lock was taken (false when a bounded wait ran out).
    pub fn held(&self) -> bool {
        self.held.is_some()
    }
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.held.take();
        let mut map = lock(&self.locks.map);
        // Two handles left: the map's and ours. Anyone else waiting holds a third.
        if map
            .get(&self.key)
            .is_some_and(|cur| Arc::ptr_eq(cur, &self.entry))
            && Arc::strong_count(&self.entry) == 2
        {
            map.remove(&self.key);
        }
    }
}

/// What this Host holds per session right now, counted from the structures themselves. Each
/// count returns to zero once no session is resident, attaching or watched: nothing keyed by
/// a session outlives its residency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Entries in the table of residents.
    pub residents: usize,
    /// Per-session attach locks (only those held or waited for).
    pub attach_locks: usize,
    /// Admission charges (resident and attaching sessions).
    pub admission_charges: usize,
    /// Live-feed buffers (only sessions someone watches).
    pub relay_buffers: usize,
}

/// The residency owner. Cheap to share (`Arc`); its fields are private to this module.
pub(crate) struct Residency {
    config: Config,
    store: Store,
    metrics: Metrics,
    generation: AtomicU64,
    started: AtomicBool,
    disposed: AtomicBool,
    draining: AtomicBool,
    /// Set by the one caller that runs the drain (others wait for its report).
    drain_claimed: AtomicBool,
    live: AtomicBool,
    residents: Mutex<HashMap<SessionKey, Arc<Resident>>>,
    admission: Mutex<Admission>,
    locks: SessionLocks,
    attach_counter: AtomicU64,
    invalidations: broadcast::Sender<(TenantId, SessionId)>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    readiness: Readiness,
}

impl Residency {
    /// A new owner with nothing resident; its metrics' gauges are computed from it.
    pub fn new(config: Config, store: Store, metrics: Metrics) -> Arc<Residency> {
        let admission = Admission::new(config.capacity, config.isolation_class);
        let (invalidations, _) = broadcast::channel(INVALIDATION_BUFFER);
        let readiness = Readiness::new(config.store_unreachable_bound);
        let me = Arc::new(Residency {
            config,
            store,
            metrics,
            generation: AtomicU64::new(0),
            started: AtomicBool::new(false),
            disposed: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            drain_claimed: AtomicBool::new(false),
            live: AtomicBool::new(true),
            residents: Mutex::new(HashMap::new()),
            admission: Mutex::new(admission),
            locks: SessionLocks::default(),
            attach_counter: AtomicU64::new(0),
            invalidations,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            readiness,
        });
        let source: Arc<dyn GaugeSource> = me.clone();
        me.metrics.sample_from(Arc::downgrade(&source));
        me
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What `/readyz` answers from.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    // ---------------------------------------------------------------- lifecycle

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub fn started(&self) -> bool {
        self.started.load(Ordering::SeqCst)
    }

    /// True once a stop has begun: the Host can neither start again nor take a session.
    pub fn disposed(&self) -> bool {
        self.disposed.load(Ordering::SeqCst)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub fn live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    /// Marks the Host started under `generation` and opens admission.
    pub fn mark_started(&self, generation: u64) {
        self.generation.store(generation, Ordering::SeqCst);
        lock(&self.admission).set_accepting(true);
        self.started.store(true, Ordering::SeqCst);
    }

    /// Begins the drain: admission off (and `/readyz` draining) at once. False when a drain
    /// had already begun. Running the drain is claimed apart ([`Residency::claim_drain`]), so
    /// a stop can stop admitting at its first instant and drain a little later.
    pub fn begin_drain(&self) -> bool {
        if self.draining.swap(true, Ordering::SeqCst) {
            return false;
        }
        lock(&self.admission).set_accepting(false);
        true
    }

    /// Claims running the drain: true for the first caller only.
    pub fn claim_drain(&self) -> bool {
        !self.drain_claimed.swap(true, Ordering::SeqCst)
    }

    /// Stops every task, closes the store last and turns `/healthz` false, all within
    /// `bound`: the tasks get half of it, the store the rest. Returns the steps that did not
    /// finish in time as (step, reason); the stop goes on without them.
    pub async fn stop(&self, bound: Duration) -> Vec<(&'static str, String)> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut failures = Vec::new();
        self.disposed.store(true, Ordering::SeqCst);
        self.shutdown.cancel();
        self.tasks.close();
        if tokio::time::timeout(bound / 2, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                tasks = self.tasks.len(),
                "some Host tasks did not stop within their share of the stop bound"
            );
        }
        let close = async {
            failpoints::hit(self.config.host_id.as_str(), failpoints::steps::CLOSE_STORE).await;
            self.store.close().await;
        };
        if tokio::time::timeout_at(deadline, close).await.is_err() {
            failures.push((
                "close_store",
                format!("the store did not close within {bound:?}"),
            ));
        }
        self.live.store(false, Ordering::SeqCst);
        failures
    }

    /// Cancelled when the Host stops.
    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Spawns Host-wide work under the tracker the stop waits for.
    pub fn spawn<F>(&self, work: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(work);
    }

    /// The admission weight charged now (published with each heartbeat).
    pub fn weight_consumed(&self) -> u32 {
        lock(&self.admission).consumed()
    }

    pub fn advertisement(&self, accepting: bool) -> HostAdvertisement {
        HostAdvertisement {
            host: self.config.host_id.clone(),
            endpoint: self.config.internal_endpoint.clone(),
            placement: self.config.placement,
            isolation_class: self.config.isolation_class.as_str().to_owned(),
            capacity: self.config.capacity,
            accepting,
            generation: self.generation(),
            ttl: self.config.registry_expiry,
        }
    }

    /// This Host's registration of a session at `epoch`. It accepts commands only while
    /// resident and not draining.
    pub fn registration(
        &self,
        key: &SessionKey,
        epoch: ResidencyEpoch,
        residency: ResidencyState,
    ) -> RegistrationUpdate {
        RegistrationUpdate {
            tenant: key.tenant.clone(),
            session: key.session.clone(),
            host: self.config.host_id.clone(),
            host_generation: self.generation(),
            endpoint: self.config.internal_endpoint.clone(),
            residency,
            accepting: residency == ResidencyState::Resident && !self.draining(),
            lease_epoch: epoch,
            ttl: self.config.registry_expiry,
        }
    }

    pub fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.invalidations.subscribe()
    }

    /// Asks every link to drop its route to `key` (tail lost, refused or released).
    pub fn invalidate_routes(&self, key: &SessionKey) {
        let _ = self
            .invalidations
            .send((key.tenant.clone(), key.session.clone()));
    }

    // ---------------------------------------------------------------- the table

    pub fn resident(&self, key: &SessionKey) -> Option<Arc<Resident>> {
        lock(&self.residents).get(key).cloned()
    }

    pub fn residents(&self) -> Vec<Arc<Resident>> {
        lock(&self.residents).values().cloned().collect()
    }

    pub fn keys(&self) -> Vec<SessionKey> {
        lock(&self.residents).keys().cloned().collect()
    }

    /// Serializes attach on one session (and lets a drain wait, bounded, for one in flight).
    pub async fn lock_session(
        &self,
        key: &SessionKey,
        bound: Option<Duration>,
    ) -> SessionGuard<'_> {
        self.locks.acquire(key, bound).await
    }

    /// How many per-session locks exist now (only those held or waited for).
    pub fn session_locks(&self) -> usize {
        self.locks.len()
    }

    /// What this Host holds per session now.
    pub fn footprint(&self) -> Footprint {
        let (residents, relay_buffers) = {
            let table = lock(&self.residents);
            let watched = table.values().filter(|r| r.relay.allocated()).count();
            (table.len(), watched)
        };
        Footprint {
            residents,
            attach_locks: self.locks.len(),
            admission_charges: lock(&self.admission).charged().count(),
            relay_buffers,
        }
    }

    /// Charges `weight` for `key` to a fresh attach generation, which is returned.
    pub fn admit(&self, key: &SessionKey, weight: u32) -> Result<u64, HostError> {
        let generation = self.attach_counter.fetch_add(1, Ordering::SeqCst) + 1;
        lock(&self.admission).admit(key, generation, weight)?;
        Ok(generation)
    }

    /// Returns an attach generation's charge (only while it still owns it).
    pub fn credit(&self, key: &SessionKey, generation: u64) {
        lock(&self.admission).credit(key, generation);
    }

    /// Records a residency in the table.
    pub fn insert(&self, resident: Arc<Resident>) {
        lock(&self.residents).insert(resident.key.clone(), resident);
    }

    /// Drops a residency's record and credits its charge (only its own generation's), in one
    /// step as the gauges see it.
    pub fn forget(&self, r: &Arc<Resident>) {
        r.set_state(ResidentState::Ended);
        let mut residents = lock(&self.residents);
        if residents.get(&r.key).is_some_and(|cur| Arc::ptr_eq(cur, r)) {
            residents.remove(&r.key);
        }
        lock(&self.admission).credit(&r.key, r.generation);
    }

    /// The per-session context a residency's tasks work through.
    pub fn session(self: &Arc<Self>, resident: Arc<Resident>) -> SessionCtx {
        SessionCtx {
            host: self.clone(),
            resident,
        }
    }

    // ---------------------------------------------------------------- abnormal end

    /// Ends a residency abnormally, on a task of its own.
    pub fn end_later(self: &Arc<Self>, r: Arc<Resident>, reason: EndReason) {
        let me = self.clone();
        self.tasks.spawn(async move { me.end(r, reason).await });
    }

    /// Lost residency or a runtime fault: stop the work, abandon the runtime, and (only when
    /// the grant is still ours) tombstone and release; credit capacity.
    async fn end(&self, r: Arc<Resident>, reason: EndReason) {
        if !r.begin_end() {
            return;
        }
        let lost = matches!(reason, EndReason::Lost(_));
        tracing::error!(tenant = %r.key.tenant, session = %r.key.session, epoch = r.epoch.0, reason = %reason, "ending residency");
        r.set_state(ResidentState::Releasing);
        self.invalidate_routes(&r.key);
        r.consumer.halt(self.config.idle_boundary).await;
        r.cancel.cancel();
        if let Err(e) = r.runtime.stop().await {
            tracing::error!(error = %e, "abandoning the runtime failed");
        }
        if lost {
            self.forget(&r);
            return;
        }
        // Tombstone, then release. A store that is away or refuses writes (a full disk) is
        // retried until it takes them: this Host's heartbeat renews every lease it still
        // holds, so a lease left unreleased would keep the session here, unattachable, for as
        // long as the Host lives. The session is forgotten at the first failure; a new attach
        // of it meets `epoch_mismatch` until the release goes through.
        let forgotten = AtomicBool::new(false);
        let forget = || {
            if !forgotten.swap(true, Ordering::SeqCst) {
                self.forget(&r);
            }
        };
        let tombstoned = self
            .retry_unavailable(
                "tombstoning the registration",
                || async {
                    self.store
                        .tombstone_registration(&r.key.tenant, &r.key.session, r.epoch)
                        .await
                        .map(|_| ())
                },
                &forget,
            )
            .await;
        // Not ours any more (or not there): nothing left to give back at this step.
        if let Err(e) = tombstoned {
            tracing::warn!(error = %e, "tombstoning the registration failed");
        }
        if !self.shutdown.is_cancelled() {
            let released = self
                .retry_unavailable(
                    "releasing the residency lease",
                    || async { self.store.release_residency(&r.grant()).await },
                    &forget,
                )
                .await;
            if let Err(e) = released {
                tracing::warn!(error = %e, "releasing the residency lease failed");
            }
        }
        forget();
    }

    /// Gives back a lease a release could not (the store was away or refused the write), on a
    /// task of its own, retried as [`Self::end`] does: this Host's heartbeat renews every lease
    /// its generation holds, so one left behind would pin the session here for good.
    pub fn release_later(self: &Arc<Self>, grant: ResidencyGrant) {
        let me = self.clone();
        self.tasks.spawn(async move {
            let released = me
                .retry_unavailable(
                    "releasing the residency lease",
                    || me.store.release_residency(&grant),
                    || {},
                )
                .await;
            match released {
                Ok(()) => tracing::info!(tenant = %grant.tenant, session = %grant.session, "the residency lease was released on a retry"),
                Err(e) => tracing::warn!(tenant = %grant.tenant, session = %grant.session, error = %e, "releasing the residency lease failed"),
            }
        });
    }

    /// Runs a store write until it goes through, retrying while the store is away or refuses
    /// writes (backing off from 100 ms to one heartbeat), until the Host stops. Any other
    /// refusal is returned at once. `on_retry` runs before each wait.
    async fn retry_unavailable<F, Fut>(
        &self,
        what: &'static str,
        mut write: F,
        on_retry: impl Fn(),
    ) -> Result<(), sessionstore::StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), sessionstore::StoreError>>,
    {
        let mut retries =
            Backoff::new(Duration::from_millis(100), self.config.registry_heartbeat).retries();
        loop {
            match write().await {
                Err(e) if e.code() == ErrorCode::Unavailable => {
                    let wait = retries.next_wait();
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "{what} failed; retrying");
                    on_retry();
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Err(e),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                done => return done,
            }
        }
    }
}

impl GaugeSource for Residency {
    fn sample(&self) -> GaugeSample {
        // Read before the table's locks: readiness takes only its own.
        let readiness = self.readiness().report(self.started(), self.draining());
        let mut not_ready = [false; crate::readiness::REASON_CODES.len()];
        for (holds, code) in not_ready.iter_mut().zip(crate::readiness::REASON_CODES) {
            *holds = readiness.reasons.iter().any(|r| r.code == code);
        }
        let residents = lock(&self.residents);
        let admission = lock(&self.admission);
        let mut s = GaugeSample {
            weight_consumed: i64::from(admission.consumed()),
            weight_capacity: i64::from(self.config.capacity),
            // A charge with no residency in the table is an attach in flight.
            attaching: admission
                .charged()
                .filter(|k| !residents.contains_key(*k))
                .count() as i64,
            ready: readiness.ready,
            not_ready,
            ..GaugeSample::default()
        };
        for r in residents.values() {
            match r.state() {
                ResidentState::Resident => s.resident += 1,
                ResidentState::Releasing => s.releasing += 1,
                ResidentState::Ended => continue,
            }
            if r.gates_open.load(Ordering::SeqCst) > 0 {
                s.gate_waiting += 1;
            }
            if r.consumer.blocked.load(Ordering::SeqCst) {
                s.command_blocked += 1;
            }
            s.command_lag += r.consumer.lag.load(Ordering::SeqCst);
            s.queue_depth += r.consumer.queued() as i64;
        }
        s
    }
}

/// What one residency's tasks may do to the Host: read the store and the options, wake their
/// own consumer, record their figures, drop their routes, give their residency back, or ask
/// for its abnormal end. Nothing else of the owner is reachable from here.
#[derive(Clone)]
pub(crate) struct SessionCtx {
    host: Arc<Residency>,
    resident: Arc<Resident>,
}

impl SessionCtx {
    pub fn resident(&self) -> &Arc<Resident> {
        &self.resident
    }

    pub fn store(&self) -> &Store {
        &self.host.store
    }

    pub fn config(&self) -> &Config {
        &self.host.config
    }

    pub fn metrics(&self) -> &Metrics {
        &self.host.metrics
    }

    /// True once the Host has begun to drain.
    pub fn draining(&self) -> bool {
        self.host.draining()
    }

    /// The Host generation this residency runs under.
    pub fn host_generation(&self) -> u64 {
        self.host.generation()
    }

    /// This Host's registration of the session in `residency`.
    pub fn registration(&self, residency: ResidencyState) -> RegistrationUpdate {
        self.host
            .registration(&self.resident.key, self.resident.epoch, residency)
    }

    /// Drops every link's route to this session.
    pub fn invalidate_routes(&self) {
        self.host.invalidate_routes(&self.resident.key);
    }

    /// Ends this residency abnormally, on a task of its own.
    pub fn end_later(&self, reason: EndReason) {
        self.host.end_later(self.resident.clone(), reason);
    }

    /// The session's runtime latched a persistence fault (`/readyz` reports it).
    pub fn persistence_fault(&self, reason: &str) {
        self.host
            .readiness
            .persistence_fault(self.resident.key.session.to_string(), reason.to_owned());
    }

    /// Gives back what a released residency held: tombstone, stop its tasks, release the
    /// lease, credit capacity, forget it. Failures are returned as (step, reason).
    pub async fn give_back(&self) -> Vec<(&'static str, String)> {
        let r = &self.resident;
        let store = &self.host.store;
        let mut failures = Vec::new();
        if let Err(e) = store
            .tombstone_registration(&r.key.tenant, &r.key.session, r.epoch)
            .await
        {
            failures.push(("tombstone", e.to_string()));
        }
        r.cancel.cancel();
        self.invalidate_routes();
        let released = if failpoints::fails(
            self.host.config.host_id.as_str(),
            failpoints::steps::RELEASE_LEASE,
        ) {
            Err(StoreError::Unavailable {
                reason: "failpoint: the lease release fails".into(),
                transient: true,
            })
        } else {
            store.release_residency(&r.grant()).await
        };
        if let Err(e) = released {
            if e.code() == ErrorCode::Unavailable {
                self.host.release_later(r.grant());
            }
            failures.push(("release_lease", e.to_string()));
        }
        self.host.forget(r);
        failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> SessionKey {
        SessionKey {
            tenant: TenantId::new("t").unwrap(),
            session: SessionId::new(s).unwrap(),
        }
    }

    /// A runtime that runs nothing: enough for a record in the table.
    struct Inert {
        idle: tokio::sync::watch::Sender<bool>,
        committed: broadcast::Sender<Arc<department::CommittedEvent>>,
        previews: broadcast::Sender<department::Preview>,
    }

    #[async_trait::async_trait]
    impl department::CommandApplier for Inert {
        async fn apply(
            &self,
            _: department::RuntimeCommand,
        ) -> Result<department::Recorded, department::RuntimeError> {
            Err(department::RuntimeError::Stopped)
        }
    }

    impl department::JournalEpochReporter for Inert {
        fn journal_epoch(&self) -> sessionstore::JournalEpoch {
            sessionstore::JournalEpoch(1)
        }
    }

    impl department::IdleWatch for Inert {
        fn idle(&self) -> tokio::sync::watch::Receiver<bool> {
            self.idle.subscribe()
        }
    }

    impl department::Liveness for Inert {
        fn alive(&self) -> tokio::sync::watch::Receiver<bool> {
            self.idle.subscribe()
        }
    }

    #[async_trait::async_trait]
    impl department::GracefulRelease for Inert {
        async fn release(&self) -> Result<(), department::RuntimeError> {
            Ok(())
        }
    }

    impl department::EventSource for Inert {
        fn committed(&self) -> broadcast::Receiver<Arc<department::CommittedEvent>> {
            self.committed.subscribe()
        }
        fn previews(&self) -> broadcast::Receiver<department::Preview> {
            self.previews.subscribe()
        }
    }

    /// A record of `key`'s residency at `epoch`, charged to attach `generation`.
    fn resident(host: &Residency, key: &SessionKey, epoch: u64, generation: u64) -> Arc<Resident> {
        let inert = Arc::new(Inert {
            idle: tokio::sync::watch::channel(true).0,
            committed: broadcast::channel(1).0,
            previews: broadcast::channel(1).0,
        });
        let runtime = department::Runtime {
            runtime_session: sessionstore::RuntimeSessionId::mint(),
            applier: inert.clone(),
            epoch: inert.clone(),
            idle: inert.clone(),
            liveness: inert.clone(),
            release: inert.clone(),
            events: inert,
            closer: None,
            faults: None,
        };
        Arc::new(Resident {
            key: key.clone(),
            agent: sessionstore::AgentId::new("assistant").unwrap(),
            compatibility: sessionstore::CompatibilityId::new("build-1").unwrap(),
            binding: sessionstore::SessionBinding {
                runtime_session_id: runtime.runtime_session,
                storage_binding_id: sessionstore::local_binding(),
                binding_version: 1,
            },
            grant: Mutex::new(ResidencyGrant {
                tenant: key.tenant.clone(),
                session: key.session.clone(),
                epoch: ResidencyEpoch(epoch),
                holder: format!("h/1/{epoch}"),
                host: host.config().host_id.clone(),
                host_generation: 1,
                expires_at_ms: 0,
            }),
            epoch: ResidencyEpoch(epoch),
            generation,
            runtime,
            state: tokio::sync::watch::channel(ResidentState::Resident).0,
            consumer: Arc::new(crate::resident::ConsumerControl {
                hints: tokio::sync::mpsc::channel(1).0,
                halted: AtomicBool::new(false),
                pass: tokio::sync::Mutex::new(()),
                blocked: AtomicBool::new(false),
                lag: std::sync::atomic::AtomicI64::new(0),
            }),
            cancel: host.shutdown().child_token(),
            tasks: TaskTracker::new(),
            gates_open: std::sync::atomic::AtomicUsize::new(0),
            ending: AtomicBool::new(false),
            warm_released: AtomicBool::new(false),
            relay: crate::fanout::Relay::default(),
        })
    }

    #[tokio::test]
    async fn a_late_end_of_an_overtaken_residency_touches_only_its_own_record_charge_and_tasks() {
        let ts = sessionstore::testing::TestStore::open(sessionstore::testing::TestBackend::Sqlite)
            .await
            .unwrap();
        let config = crate::options::Options {
            host_id: Some(sessionstore::HostId::new("h").unwrap()),
            internal_endpoint: Some("ws://127.0.0.1:7400".into()),
            ..crate::options::Options::default()
        }
        .validate()
        .unwrap();
        let host = Residency::new(config, ts.store.clone(), Metrics::new().unwrap());
        host.mark_started(1);
        let k = key("s");
        let old = resident(&host, &k, 1, host.admit(&k, 1).unwrap());
        host.insert(old.clone());
        // A successor residency of the same session on this Host: charged to its own
        // attach generation, and its record takes the table's place.
        let new = resident(&host, &k, 2, host.admit(&k, 1).unwrap());
        host.insert(new.clone());
        // The overtaken residency ends late (a fault): it stops what is its own, nothing else.
        host.end(old.clone(), EndReason::Fault("late".into())).await;
        assert!(
            old.cancel.is_cancelled(),
            "the late end cancels its own tasks"
        );
        assert_eq!(old.state(), ResidentState::Ended);
        assert!(!new.cancel.is_cancelled(), "the successor's tasks run on");
        assert!(
            host.resident(&k).is_some_and(|r| Arc::ptr_eq(&r, &new)),
            "the successor's record stays in the table"
        );
        assert_eq!(host.weight_consumed(), 1, "the successor's charge stays");
        assert_eq!(host.footprint().admission_charges, 1);
        // The successor's own end removes it.
        host.forget(&new);
        assert!(host.resident(&k).is_none());
        assert_eq!(host.weight_consumed(), 0);
    }

    #[tokio::test]
    async fn a_session_lock_is_forgotten_once_nobody_holds_or_waits_for_it() {
        let locks = SessionLocks::default();
        for i in 0..100 {
            let g = locks.acquire(&key(&format!("s{i}")), None).await;
            assert!(g.held());
        }
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn a_session_lock_stays_while_another_attach_waits_for_it() {
        let locks = Arc::new(SessionLocks::default());
        let first = locks.acquire(&key("s"), None).await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let g = locks.acquire(&key("s"), None).await;
                g.held()
            })
        };
        tokio::task::yield_now().await;
        drop(first);
        assert!(waiter.await.unwrap());
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_bounded_wait_for_a_held_lock_gives_up_and_leaves_the_holder_its_entry() {
        let locks = SessionLocks::default();
        let first = locks.acquire(&key("s"), None).await;
        let late = locks
            .acquire(&key("s"), Some(Duration::from_millis(10)))
            .await;
        assert!(!late.held());
        drop(late);
        assert_eq!(locks.len(), 1);
        drop(first);
        assert_eq!(locks.len(), 0);
    }
}
