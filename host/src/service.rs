//! Composition and the running Host. `Composition::build` validates the options, opens the
//! store (migrations), builds the department from a registrar and checks its recovery
//! declarations, and returns a [`Service`] with nothing running. The service's core owns the
//! table of resident sessions (the residency manager): attach in the order SEMANTICS.md gives,
//! serialized per session and unwound on failure; the heartbeats; the fault supervision; and
//! the single end of every residency. The drain and the warm release live in `release`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use department::{
    Department, LaunchMode, LaunchRequest, Registration, RuntimeProfile, launch_verified,
};
use sessionstore::{
    AgentId, CompatibilityId, ErrorCode, HostAdvertisement, Placement, RecordKind,
    RegistrationUpdate, ResidencyEpoch, ResidencyRequest, ResidencyState, SessionId,
    SessionProjection, StorageBindingId, Store, StoreError, StoreOptions, TenantId,
};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use crate::admission::Admission;
use crate::error::HostError;
use crate::metrics::Metrics;
use crate::options::{Config, Options, OptionsError};
use crate::resident::{ConsumerControl, Resident, ResidentState, SessionKey};

/// Produces the department's registrations, once, at composition. It is given the store so a
/// target can journal into it.
#[async_trait::async_trait]
pub trait Registrar: Send + Sync {
    async fn register(&self, store: &Store) -> Result<Vec<Registration>, String>;
}

/// What a Host is built from.
pub struct Composition {
    pub options: Options,
    /// The store to open (its `local_storage_bindings` say which bindings its own journal
    /// serves).
    pub store: StoreOptions,
    pub registrar: Box<dyn Registrar>,
    pub profile: RuntimeProfile,
    /// The build this Host reports in its HostLink connect reply.
    pub version: String,
}

/// Why a composition was refused.
#[derive(Debug, thiserror::Error)]
pub enum CompositionError {
    #[error("options: {0}")]
    Options(#[from] OptionsError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("registrar: {0}")]
    Registrar(String),
    #[error("department: {0}")]
    Department(#[from] department::DepartmentError),
    #[error("metrics: {0}")]
    Metrics(#[from] crate::metrics::MetricsError),
}

impl CompositionError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CompositionError::Options(e) => e.code.as_str(),
            CompositionError::Store(e) => e.code().as_str(),
            CompositionError::Registrar(_) => "registrar",
            CompositionError::Department(e) => e.code(),
            CompositionError::Metrics(_) => "metrics",
        }
    }
}

/// An attach request (what `hostlink.attach` carries, minus the transport's checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub agent: AgentId,
    pub compatibility: CompatibilityId,
    /// Informational: create versus restore is decided from the journal, never from this.
    pub mode: LaunchMode,
    pub actor: Option<String>,
    pub trace: Option<String>,
}

/// A registry observation: where a session is resident, as a controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub tenant: TenantId,
    pub session: SessionId,
    pub host: sessionstore::HostId,
    pub host_generation: u64,
    pub agent: AgentId,
    pub compatibility: CompatibilityId,
    pub placement: Placement,
    pub internal_endpoint: String,
    pub residency: ResidencyState,
    pub accepting: bool,
    pub lease_epoch: ResidencyEpoch,
    pub observed_at_ms: i64,
    pub expires_at_ms: i64,
}

/// What an attach reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub observation: Observation,
    pub journal_epoch: sessionstore::JournalEpoch,
    /// False when the session was already resident and this call took nothing.
    pub attached: bool,
    /// How the runtime was launched (decided from the journal).
    pub launched: LaunchMode,
}

/// Why a residency ends abnormally.
#[derive(Clone, Debug)]
pub(crate) enum EndReason {
    /// The residency lease was lost: write nothing more under it.
    Lost(String),
    /// The runtime faulted or is unsound: abandon it, tombstone, release.
    Fault(String),
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::Lost(r) => write!(f, "residency lost: {r}"),
            EndReason::Fault(r) => write!(f, "runtime fault: {r}"),
        }
    }
}

/// The running Host's shared state.
pub(crate) struct Core {
    pub config: Config,
    pub store: Store,
    pub department: Department,
    pub metrics: Metrics,
    pub version: String,
    pub local_bindings: Vec<StorageBindingId>,
    pub generation: AtomicU64,
    pub residents: Mutex<HashMap<SessionKey, Arc<Resident>>>,
    locks: Mutex<HashMap<SessionKey, Arc<tokio::sync::Mutex<()>>>>,
    pub admission: Mutex<Admission>,
    pub started: AtomicBool,
    pub draining: AtomicBool,
    pub live: AtomicBool,
    pub shutdown: CancellationToken,
    pub tasks: TaskTracker,
    attach_counter: AtomicU64,
    pub invalidations: broadcast::Sender<(TenantId, SessionId)>,
    pub drain_report: Mutex<Option<crate::release::DrainReport>>,
    pub drain_done: watch::Sender<bool>,
}

/// A composed Host. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("host", &self.core.config.host_id)
            .finish()
    }
}

impl Composition {
    /// Validates, opens the store, builds the department; nothing runs yet.
    pub async fn build(self) -> Result<Service, CompositionError> {
        let config = self.options.validate()?;
        let local_bindings = self.store.local_storage_bindings.clone();
        let store = Store::open(self.store).await?;
        let registrations = self
            .registrar
            .register(&store)
            .await
            .map_err(CompositionError::Registrar)?;
        let department = Department::new(registrations)?;
        department.check_profile(self.profile)?;
        let metrics = Metrics::new()?;
        metrics.weight_capacity.set(i64::from(config.capacity));
        let admission = Admission::new(config.capacity, config.isolation_class);
        let (invalidations, _) = broadcast::channel(1024);
        let (drain_done, _) = watch::channel(false);
        Ok(Service {
            core: Arc::new(Core {
                config,
                store,
                department,
                metrics,
                version: self.version,
                local_bindings,
                generation: AtomicU64::new(0),
                residents: Mutex::new(HashMap::new()),
                locks: Mutex::new(HashMap::new()),
                admission: Mutex::new(admission),
                started: AtomicBool::new(false),
                draining: AtomicBool::new(false),
                live: AtomicBool::new(true),
                shutdown: CancellationToken::new(),
                tasks: TaskTracker::new(),
                attach_counter: AtomicU64::new(0),
                invalidations,
                drain_report: Mutex::new(None),
                drain_done,
            }),
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Service {
    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// The store this Host uses.
    pub fn store(&self) -> &Store {
        &self.core.store
    }

    /// The Host's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.core.metrics
    }

    /// The department this Host serves.
    pub fn department(&self) -> &Department {
        &self.core.department
    }

    /// The build string.
    pub fn version(&self) -> &str {
        &self.core.version
    }

    /// This process's Host generation (0 before start).
    pub fn generation(&self) -> u64 {
        self.core.generation.load(Ordering::SeqCst)
    }

    /// `/readyz`: admitting (false from the instant a drain begins).
    pub fn ready(&self) -> bool {
        self.core.started.load(Ordering::SeqCst) && !self.core.draining.load(Ordering::SeqCst)
    }

    /// `/healthz`: the process should keep running (true until stop completes).
    pub fn live(&self) -> bool {
        self.core.live.load(Ordering::SeqCst)
    }

    /// True once a drain has begun.
    pub fn draining(&self) -> bool {
        self.core.draining.load(Ordering::SeqCst)
    }

    /// Sessions a route should be dropped for (tail lost, refused or released).
    pub fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.core.invalidations.subscribe()
    }

    /// Publishes the advertisement synchronously (a refused first publication fails start),
    /// then keeps it alive with a heartbeat.
    pub async fn start(&self) -> Result<(), HostError> {
        let core = &self.core;
        if core.started.load(Ordering::SeqCst) {
            return Ok(());
        }
        let previous = core.store.target(&core.config.host_id).await?;
        let generation = previous.map_or(1, |t| t.generation + 1);
        core.generation.store(generation, Ordering::SeqCst);
        core.store
            .advertise(self.core.advertisement(true))
            .await
            .map_err(|e| {
                HostError::internal(format!("the first advertisement was refused: {e}"))
            })?;
        lock(&core.admission).set_accepting(true);
        core.started.store(true, Ordering::SeqCst);
        let me = self.core.clone();
        core.tasks.spawn(async move { me.advertise_loop().await });
        let me = self.core.clone();
        core.tasks.spawn(async move { me.admission_hints().await });
        tracing::info!(host = %core.config.host_id, generation, "host started");
        Ok(())
    }

    /// Makes a session resident (idempotent for a resident session).
    pub async fn attach(&self, req: AttachRequest) -> Result<Attached, HostError> {
        let span = tracing::info_span!("attach", tenant = %req.tenant, session = %req.session);
        self.core.clone().attach(req).instrument(span).await
    }

    /// A wake-up hint for a resident session's consumer (a HostLink delivery).
    pub fn deliver(&self, tenant: &TenantId, session: &SessionId) -> Result<(), HostError> {
        let key = SessionKey {
            tenant: tenant.clone(),
            session: session.clone(),
        };
        match self.core.resident(&key) {
            Some(r) if r.state() == ResidentState::Resident => {
                if r.consumer.wake() {
                    self.core.metrics.queue_depth.inc();
                }
                Ok(())
            }
            _ => Err(HostError::RuntimeUnavailable(
                "the session is not resident here".into(),
            )),
        }
    }

    /// A snapshot of a resident session: its epoch and state.
    pub fn residency(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Option<(ResidencyEpoch, ResidentState)> {
        let key = SessionKey {
            tenant: tenant.clone(),
            session: session.clone(),
        };
        self.core.resident(&key).map(|r| (r.epoch, r.state()))
    }

    /// The sessions resident now.
    pub fn residents(&self) -> Vec<SessionKey> {
        lock(&self.core.residents).keys().cloned().collect()
    }

    /// The live feed of a resident session (projected committed events and previews, in
    /// order), with its runtime build.
    pub fn live_feed(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Option<(
        CompatibilityId,
        broadcast::Receiver<crate::link::backend::FeedItem>,
    )> {
        let key = SessionKey {
            tenant: tenant.clone(),
            session: session.clone(),
        };
        let r = self.core.resident(&key)?;
        Some((r.compatibility.clone(), r.relay.subscribe()))
    }

    /// The live feed of a resident session.
    pub fn subscribe(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Option<broadcast::Receiver<crate::link::backend::FeedItem>> {
        self.live_feed(tenant, session).map(|(_, rx)| rx)
    }
}

impl Core {
    pub(crate) fn resident(&self, key: &SessionKey) -> Option<Arc<Resident>> {
        lock(&self.residents).get(key).cloned()
    }

    pub(crate) fn session_lock_for_drain(&self, key: &SessionKey) -> Arc<tokio::sync::Mutex<()>> {
        self.session_lock(key)
    }

    fn session_lock(&self, key: &SessionKey) -> Arc<tokio::sync::Mutex<()>> {
        lock(&self.locks).entry(key.clone()).or_default().clone()
    }

    pub(crate) fn advertisement(&self, accepting: bool) -> HostAdvertisement {
        HostAdvertisement {
            host: self.config.host_id.clone(),
            endpoint: self.config.internal_endpoint.clone(),
            placement: self.config.placement,
            isolation_class: self.config.isolation_class.as_str().to_owned(),
            capacity: self.config.capacity,
            accepting,
            generation: self.generation.load(Ordering::SeqCst),
            ttl: self.config.registry_expiry,
        }
    }

    async fn advertise_loop(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.config.registry_heartbeat) => {}
            }
            let accepting = !self.draining.load(Ordering::SeqCst);
            if let Err(e) = self.store.advertise(self.advertisement(accepting)).await {
                tracing::warn!(error = %e, "advertisement heartbeat failed");
            }
        }
    }

    /// Wakes a resident session's consumer when the store announces an admission for it
    /// (PostgreSQL `LISTEN/NOTIFY`, SQLite's in-process notifier). A hint only: the
    /// reconcile interval covers a lost one.
    async fn admission_hints(self: Arc<Self>) {
        let mut admissions = self.store.admissions();
        loop {
            let a = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                a = admissions.recv() => a,
            };
            match a {
                Ok(a) => {
                    let key = SessionKey {
                        tenant: a.tenant,
                        session: a.session,
                    };
                    if let Some(r) = self.resident(&key)
                        && r.state() == ResidentState::Resident
                        && r.consumer.wake()
                    {
                        self.metrics.queue_depth.inc();
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Hints were lost: wake everyone once.
                    let all: Vec<_> = lock(&self.residents).values().cloned().collect();
                    for r in all {
                        if r.consumer.wake() {
                            self.metrics.queue_depth.inc();
                        }
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn update_session_gauges(&self) {
        let residents = lock(&self.residents);
        let mut resident = 0;
        let mut releasing = 0;
        for r in residents.values() {
            match r.state() {
                ResidentState::Resident => resident += 1,
                ResidentState::Releasing => releasing += 1,
                ResidentState::Ended => {}
            }
        }
        self.metrics
            .sessions
            .with_label_values(&["resident"])
            .set(resident);
        self.metrics
            .sessions
            .with_label_values(&["releasing"])
            .set(releasing);
        self.metrics
            .weight_consumed
            .set(i64::from(lock(&self.admission).consumed()));
    }

    fn observation(&self, r: &Resident, reg: &sessionstore::HostRegistration) -> Observation {
        Observation {
            tenant: r.key.tenant.clone(),
            session: r.key.session.clone(),
            host: self.config.host_id.clone(),
            host_generation: self.generation.load(Ordering::SeqCst),
            agent: r.agent.clone(),
            compatibility: r.compatibility.clone(),
            placement: self.config.placement,
            internal_endpoint: self.config.internal_endpoint.clone(),
            residency: reg.residency,
            accepting: reg.accepting,
            lease_epoch: r.epoch,
            observed_at_ms: reg.observed_at_ms,
            expires_at_ms: reg.expires_at_ms,
        }
    }

    fn registration(&self, r: &Resident, residency: ResidencyState) -> RegistrationUpdate {
        RegistrationUpdate {
            tenant: r.key.tenant.clone(),
            session: r.key.session.clone(),
            host: self.config.host_id.clone(),
            host_generation: self.generation.load(Ordering::SeqCst),
            endpoint: self.config.internal_endpoint.clone(),
            residency,
            accepting: residency == ResidencyState::Resident
                && !self.draining.load(Ordering::SeqCst),
            lease_epoch: r.epoch,
            ttl: self.config.registry_expiry,
        }
    }

    /// Attach, in the order SEMANTICS.md gives, serialized per session.
    async fn attach(self: Arc<Self>, req: AttachRequest) -> Result<Attached, HostError> {
        let started = Instant::now();
        if !self.started.load(Ordering::SeqCst) {
            return Err(HostError::NotAdmitting("this Host has not started".into()));
        }
        // 1. Validate.
        if let Some(fixed) = &self.config.fixed_session
            && fixed != &req.session
        {
            return Err(HostError::RuntimeUnavailable(
                "this dedicated Host serves another session".into(),
            ));
        }
        let target = self.department.target(&req.agent).ok_or_else(|| {
            HostError::RuntimeUnavailable(format!("agent {} is not served here", req.agent))
        })?;
        let compatibility = target.compatibility();
        if compatibility != req.compatibility {
            return Err(HostError::RuntimeMismatch {
                runtime_compatibility_id: compatibility.to_string(),
            });
        }
        let key = SessionKey {
            tenant: req.tenant.clone(),
            session: req.session.clone(),
        };
        let session_lock = self.session_lock(&key);
        let _serial = session_lock.lock().await;
        if let Some(r) = self.resident(&key) {
            return match r.state() {
                ResidentState::Resident => {
                    if r.agent != req.agent || r.compatibility != req.compatibility {
                        return Err(HostError::RuntimeMismatch {
                            runtime_compatibility_id: r.compatibility.to_string(),
                        });
                    }
                    let reg = self
                        .store
                        .registration(&key.tenant, &key.session)
                        .await?
                        .ok_or_else(|| {
                            HostError::internal("a resident session has no registration")
                        })?;
                    Ok(Attached {
                        observation: self.observation(&r, &reg),
                        journal_epoch: r.runtime.epoch.journal_epoch(),
                        attached: false,
                        launched: LaunchMode::Restore,
                    })
                }
                _ => Err(HostError::Releasing),
            };
        }
        if self.draining.load(Ordering::SeqCst) {
            return Err(HostError::NotAdmitting("this Host is draining".into()));
        }
        // 2. Admit against capacity, charged to this attach's generation.
        let generation = self.attach_counter.fetch_add(1, Ordering::SeqCst) + 1;
        let weight = target.capabilities().admission_weight.max(1);
        if self.config.placement == Placement::Pooled && !target.capabilities().supports_pooled {
            return Err(HostError::RuntimeUnavailable(
                "this agent cannot share a pooled Host".into(),
            ));
        }
        lock(&self.admission).admit(&key, generation, weight)?;
        self.metrics
            .sessions
            .with_label_values(&["attaching"])
            .inc();
        let result = self
            .clone()
            .attach_admitted(&req, key.clone(), generation, weight, target)
            .await;
        self.metrics
            .sessions
            .with_label_values(&["attaching"])
            .dec();
        if result.is_err() {
            lock(&self.admission).credit(&key, generation);
        }
        self.update_session_gauges();
        if let Ok(a) = &result {
            let mode = match a.launched {
                LaunchMode::Create => "create",
                LaunchMode::Restore => "restore",
            };
            self.metrics
                .attach_seconds
                .with_label_values(&[mode])
                .observe(started.elapsed().as_secs_f64());
        }
        result
    }

    async fn attach_admitted(
        self: Arc<Self>,
        req: &AttachRequest,
        key: SessionKey,
        generation: u64,
        weight: u32,
        target: Arc<dyn department::LaunchTarget>,
    ) -> Result<Attached, HostError> {
        let _ = weight;
        let store = self.store.clone();
        // 3. The residency lease: a new, strictly higher epoch.
        let holder = format!(
            "{}/{}/{}",
            self.config.host_id,
            self.generation.load(Ordering::SeqCst),
            Uuid::now_v7()
        );
        let grant = match store
            .acquire_residency(ResidencyRequest {
                tenant: key.tenant.clone(),
                session: key.session.clone(),
                holder: holder.clone(),
                host: self.config.host_id.clone(),
                host_generation: self.generation.load(Ordering::SeqCst),
                ttl: self.config.registry_expiry,
            })
            .await
        {
            Ok(g) => g,
            Err(StoreError::ClaimHeld { epoch, .. }) => {
                return Err(HostError::EpochMismatch {
                    current_lease_epoch: epoch,
                });
            }
            Err(StoreError::NotFound { .. }) => {
                return Err(HostError::RuntimeUnavailable("no such session".into()));
            }
            Err(e) => return Err(e.into()),
        };
        let epoch = grant.epoch;
        let mut unwind = Unwind {
            store: store.clone(),
            grant: Some(grant.clone()),
            runtime: None,
            registered: false,
            unreleased: Vec::new(),
        };
        let result: Result<Attached, HostError> = async {
            // 4. One fencing write before the runtime is launched; the `attaching`
            // registration goes out alongside it (concurrent writes share one commit on
            // SQLite's group-commit writer).
            let (fenced, registered) = tokio::join!(
                store.fence_gate_mark(&key.tenant, &key.session, epoch),
                store.put_registration(self.registration_for(
                    &key,
                    epoch,
                    ResidencyState::Attaching
                )),
            );
            fenced.map_err(|e| {
                if e.code() == ErrorCode::Epoch {
                    HostError::EpochMismatch {
                        current_lease_epoch: e.mark().unwrap_or(epoch.0),
                    }
                } else {
                    e.into()
                }
            })?;
            registered?;
            unwind.registered = true;
            // 5. Hydrate: the binding, and create versus restore from the journal.
            let session = store.session(&key.tenant, &key.session).await?;
            if session.agent != req.agent {
                return Err(HostError::RuntimeMismatch {
                    runtime_compatibility_id: target.compatibility().to_string(),
                });
            }
            if session.compatibility != target.compatibility() {
                return Err(HostError::RuntimeMismatch {
                    runtime_compatibility_id: target.compatibility().to_string(),
                });
            }
            if !self
                .local_bindings
                .contains(&session.binding.storage_binding_id)
            {
                return Err(HostError::RuntimeUnavailable(
                    "no journal store serves this session's binding".into(),
                ));
            }
            let mode = if self
                .has_conversation(&key.tenant, session.binding.runtime_session_id)
                .await?
            {
                LaunchMode::Restore
            } else {
                LaunchMode::Create
            };
            // 6. Launch under the binding's runtime session id (verified).
            let runtime = launch_verified(
                target.as_ref(),
                LaunchRequest {
                    tenant: key.tenant.clone(),
                    session: key.session.clone(),
                    agent: req.agent.clone(),
                    binding: session.binding.clone(),
                    mode,
                    holder: holder.clone(),
                },
            )
            .await
            .map_err(|e| HostError::internal(format!("launch ({mode:?}) failed: {e}")))?;
            unwind.runtime = Some(runtime.clone());
            // 7. Register resident, then start the session's tasks.
            let (hints_tx, hints_rx) = mpsc::channel(self.config.command_queue_size);
            let (state, _) = watch::channel(ResidentState::Resident);
            let resident = Arc::new(Resident {
                key: key.clone(),
                agent: req.agent.clone(),
                compatibility: target.compatibility(),
                binding: session.binding.clone(),
                grant: std::sync::Mutex::new(grant.clone()),
                epoch,
                generation,
                runtime: runtime.clone(),
                state,
                consumer: Arc::new(ConsumerControl {
                    hints: hints_tx,
                    halted: std::sync::atomic::AtomicBool::new(false),
                    pass: tokio::sync::Mutex::new(()),
                    blocked: std::sync::atomic::AtomicBool::new(false),
                    lag: std::sync::atomic::AtomicI64::new(0),
                    queued: std::sync::atomic::AtomicUsize::new(0),
                }),
                cancel: self.shutdown.child_token(),
                tasks: TaskTracker::new(),
                gates_open: std::sync::atomic::AtomicUsize::new(0),
                ending: std::sync::atomic::AtomicBool::new(false),
                relay: broadcast::channel(crate::feed::RELAY_BUFFER).0,
            });
            let (reg, projected) = tokio::join!(
                store.put_registration(self.registration(&resident, ResidencyState::Resident)),
                store.update_projection(
                    &key.tenant,
                    &key.session,
                    epoch,
                    SessionProjection {
                        residency_state: ResidencyState::Resident,
                        last_journal_seq: session.last_journal_seq,
                        checkpoint_seq: session.checkpoint_seq,
                    },
                ),
            );
            let reg = reg?;
            projected?;
            lock(&self.residents).insert(key.clone(), resident.clone());
            self.clone().start_tasks(resident.clone(), hints_rx);
            if resident.consumer.wake() {
                self.metrics.queue_depth.inc();
            }
            tracing::info!(epoch = epoch.0, mode = ?mode, "session attached");
            Ok(Attached {
                observation: self.observation(&resident, &reg),
                journal_epoch: runtime.epoch.journal_epoch(),
                attached: true,
                launched: mode,
            })
        }
        .await;
        match result {
            Ok(a) => Ok(a),
            Err(e) => {
                let unreleased = unwind.run().await;
                if unreleased.is_empty() {
                    Err(e)
                } else {
                    tracing::error!(error = %e, unreleased = ?unreleased, "attach failed and could not give everything back");
                    match e {
                        HostError::Internal { reason, .. } => {
                            Err(HostError::Internal { reason, unreleased })
                        }
                        other => Err(HostError::Internal {
                            reason: other.to_string(),
                            unreleased,
                        }),
                    }
                }
            }
        }
    }

    fn registration_for(
        &self,
        key: &SessionKey,
        epoch: ResidencyEpoch,
        residency: ResidencyState,
    ) -> RegistrationUpdate {
        RegistrationUpdate {
            tenant: key.tenant.clone(),
            session: key.session.clone(),
            host: self.config.host_id.clone(),
            host_generation: self.generation.load(Ordering::SeqCst),
            endpoint: self.config.internal_endpoint.clone(),
            residency,
            accepting: false,
            lease_epoch: epoch,
            ttl: self.config.registry_expiry,
        }
    }

    /// A conversation exists when the journal holds any public event.
    async fn has_conversation(
        &self,
        tenant: &TenantId,
        rs: sessionstore::RuntimeSessionId,
    ) -> Result<bool, HostError> {
        let mut after = 0;
        loop {
            let page = self
                .store
                .journal_runtime_page(tenant, rs, after, 1000)
                .await
                .map_err(|e| HostError::internal(format!("reading the journal failed: {e}")))?;
            if page
                .iter()
                .any(|r| matches!(r.kind, RecordKind::Event { .. }))
            {
                return Ok(true);
            }
            match page.last() {
                Some(last) if page.len() == 1000 => after = last.seq,
                _ => return Ok(false),
            }
        }
    }

    fn start_tasks(self: Arc<Self>, r: Arc<Resident>, hints: mpsc::Receiver<()>) {
        let tasks = r.tasks.clone();
        tasks.spawn(crate::consumer::run(self.clone(), r.clone(), hints));
        tasks.spawn(crate::publisher::run(self.clone(), r.clone()));
        tasks.spawn(crate::feed::relay(self.clone(), r.clone()));
        tasks.spawn(self.clone().renew_loop(r.clone()));
        tasks.spawn(self.clone().supervise(r.clone()));
        if self.config.placement == Placement::Pooled {
            tasks.spawn(crate::release::warm_watch(self.clone(), r.clone()));
        }
        tasks.close();
    }

    /// Renews the residency lease and refreshes the registration every heartbeat.
    async fn renew_loop(self: Arc<Self>, r: Arc<Resident>) {
        loop {
            tokio::select! {
                _ = r.cancel.cancelled() => return,
                _ = tokio::time::sleep(self.config.registry_heartbeat) => {}
            }
            let grant = r.grant();
            match self
                .store
                .renew_residency(&grant, self.config.registry_expiry)
                .await
            {
                Ok(g) => {
                    if let Ok(mut held) = r.grant.lock() {
                        *held = g;
                    }
                }
                Err(e)
                    if matches!(
                        e.code(),
                        ErrorCode::Epoch | ErrorCode::ClaimLost | ErrorCode::NotFound
                    ) =>
                {
                    self.end_residency_later(
                        r.clone(),
                        EndReason::Lost(format!("renewal refused: {e}")),
                    );
                    return;
                }
                Err(e) => {
                    let now = sessionstore::Clock::now_ms(&sessionstore::SystemClock);
                    if now >= grant.expires_at_ms {
                        self.end_residency_later(
                            r.clone(),
                            EndReason::Lost(format!(
                                "the lease expired while renewals failed: {e}"
                            )),
                        );
                        return;
                    }
                    tracing::warn!(error = %e, "residency renewal failed; retrying");
                    continue;
                }
            }
            if r.state() == ResidentState::Resident
                && let Err(e) = self
                    .store
                    .put_registration(self.registration(&r, ResidencyState::Resident))
                    .await
                && e.code() == ErrorCode::Epoch
            {
                self.end_residency_later(
                    r.clone(),
                    EndReason::Lost(format!("registration fenced: {e}")),
                );
                return;
            }
        }
    }

    /// Watches the runtime's persistence faults and liveness.
    async fn supervise(self: Arc<Self>, r: Arc<Resident>) {
        let mut alive = r.runtime.liveness.alive();
        let mut faults = r.runtime.faults.as_ref().map(|f| f.faults());
        loop {
            let fault = async {
                match faults.as_mut() {
                    Some(rx) => {
                        let _ = rx.wait_for(|f| f.is_some()).await;
                        rx.borrow().clone()
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = r.cancel.cancelled() => return,
                f = fault => {
                    let reason = f.map_or_else(|| "fault channel closed".to_owned(), |f| f.reason);
                    self.end_residency_later(r.clone(), EndReason::Fault(format!("persistence fault: {reason}")));
                    return;
                }
                changed = alive.changed() => {
                    if changed.is_err() || !*alive.borrow() {
                        if r.state() == ResidentState::Resident {
                            self.end_residency_later(r.clone(), EndReason::Fault("the runtime stopped".into()));
                        }
                        return;
                    }
                }
            }
        }
    }

    /// Ends a residency abnormally, on a task of its own.
    pub(crate) fn end_residency_later(self: Arc<Self>, r: Arc<Resident>, reason: EndReason) {
        let me = self.clone();
        self.tasks
            .spawn(async move { me.end_residency(r, reason).await });
    }

    /// Lost residency or a runtime fault: stop the work, abandon the runtime, and (only when
    /// the grant is still ours) tombstone and release; credit capacity.
    async fn end_residency(self: Arc<Self>, r: Arc<Resident>, reason: EndReason) {
        if !r.begin_end() {
            return;
        }
        let lost = matches!(reason, EndReason::Lost(_));
        tracing::error!(tenant = %r.key.tenant, session = %r.key.session, epoch = r.epoch.0, reason = %reason, "ending residency");
        r.set_state(ResidentState::Releasing);
        self.update_session_gauges();
        let _ = self
            .invalidations
            .send((r.key.tenant.clone(), r.key.session.clone()));
        r.consumer.halt(self.config.idle_boundary).await;
        r.cancel.cancel();
        if let Err(e) = r.runtime.stop().await {
            tracing::error!(error = %e, "abandoning the runtime failed");
        }
        if !lost {
            if let Err(e) = self
                .store
                .tombstone_registration(&r.key.tenant, &r.key.session, r.epoch)
                .await
            {
                tracing::warn!(error = %e, "tombstoning the registration failed");
            }
            if let Err(e) = self.store.release_residency(&r.grant()).await {
                tracing::warn!(error = %e, "releasing the residency lease failed");
            }
        }
        self.forget(&r);
    }

    /// Drops a residency's record and credits its charge (only its own generation's).
    pub(crate) fn forget(&self, r: &Arc<Resident>) {
        r.set_state(ResidentState::Ended);
        {
            let mut residents = lock(&self.residents);
            if residents.get(&r.key).is_some_and(|cur| Arc::ptr_eq(cur, r)) {
                residents.remove(&r.key);
            }
        }
        lock(&self.admission).credit(&r.key, r.generation);
        if r.consumer.blocked.swap(false, Ordering::SeqCst) {
            self.metrics.command_blocked.dec();
        }
        let lag = r.consumer.lag.swap(0, Ordering::SeqCst);
        self.metrics.command_lag.sub(lag);
        let queued = r.consumer.queued.swap(0, Ordering::SeqCst);
        self.metrics.queue_depth.sub(queued as i64);
        if r.gates_open.swap(0, Ordering::SeqCst) > 0 {
            self.metrics.gate_waiting.dec();
        }
        self.update_session_gauges();
    }
}

/// What an attach gives back when it fails part-way.
struct Unwind {
    store: Store,
    grant: Option<sessionstore::ResidencyGrant>,
    runtime: Option<department::Runtime>,
    registered: bool,
    unreleased: Vec<String>,
}

impl Unwind {
    /// Undoes in reverse order on a detached task (so a cancelled caller cannot cut it short);
    /// returns what could not be given back.
    async fn run(mut self) -> Vec<String> {
        let handle = tokio::spawn(async move {
            if let Some(rt) = self.runtime.take()
                && let Err(e) = rt.stop().await
            {
                self.unreleased.push(format!("runtime: {e}"));
            }
            if let Some(g) = self.grant.take() {
                if self.registered
                    && let Err(e) = self
                        .store
                        .tombstone_registration(&g.tenant, &g.session, g.epoch)
                        .await
                {
                    self.unreleased.push(format!("registration: {e}"));
                }
                if let Err(e) = self.store.release_residency(&g).await {
                    self.unreleased.push(format!("residency lease: {e}"));
                }
            }
            self.unreleased
        });
        handle
            .await
            .unwrap_or_else(|e| vec![format!("unwind task: {e}")])
    }
}
