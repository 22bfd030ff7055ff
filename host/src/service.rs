//! Composition and the running Host. `Composition::build` validates the options, opens the
//! store (migrations), builds the department from a registrar and checks its recovery
//! declarations, and returns a [`Service`] with nothing running. The service starts the Host
//! (advertisement, heartbeat, admission hints) and attaches sessions in the order SEMANTICS.md
//! gives, serialized per session and unwound on failure; an attach launches the runtime and
//! starts the session's tasks (consumer, gate publisher, relay, upkeep, warm release), each
//! given only its [`SessionCtx`]. The table of residents and everything kept consistent with it
//! belong to the residency owner (`residency`); the drain and the warm release live in
//! `release`.

use std::sync::Arc;
use std::time::Instant;

use department::{
    Department, LaunchMode, LaunchRequest, Registration, RuntimeProfile, launch_verified,
};
use sessionstore::{
    AgentId, CompatibilityId, ErrorCode, Placement, RecordKind, ResidencyEpoch, ResidencyRequest,
    ResidencyState, SessionId, SessionProjection, StorageBindingId, Store, StoreError,
    StoreOptions, TenantId,
};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use uuid::Uuid;

use crate::attach::AttachRequest;
use crate::error::HostError;
use crate::failpoints;
use crate::metrics::Metrics;
use crate::options::{Config, Options, OptionsError};
use crate::readiness::{Fence, ReadinessReport};
use crate::release::{DrainOnce, DrainReport};
use crate::residency::{Footprint, Residency, SessionCtx};
use crate::resident::{ConsumerControl, Resident, ResidentState, SessionKey};
use hostlink_server::FeedItem;

/// Journal records read per page while deciding create versus restore.
const CONVERSATION_PROBE_PAGE: usize = 16;

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

/// A composed Host. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

struct Inner {
    host: Arc<Residency>,
    department: Department,
    version: String,
    local_bindings: Vec<StorageBindingId>,
    drain: DrainOnce,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("host", &self.inner.host.config().host_id)
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
        metrics.count_store(store.clone())?;
        Ok(Service {
            inner: Arc::new(Inner {
                host: Residency::new(config, store, metrics),
                department,
                version: self.version,
                local_bindings,
                drain: DrainOnce::default(),
            }),
        })
    }
}

impl Service {
    fn host(&self) -> &Arc<Residency> {
        &self.inner.host
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        self.host().config()
    }

    /// The store this Host uses.
    pub fn store(&self) -> &Store {
        self.host().store()
    }

    /// The Host's metrics.
    pub fn metrics(&self) -> &Metrics {
        self.host().metrics()
    }

    /// The department this Host serves.
    pub fn department(&self) -> &Department {
        &self.inner.department
    }

    /// The build string.
    pub fn version(&self) -> &str {
        &self.inner.version
    }

    /// This process's Host generation (0 before start).
    pub fn generation(&self) -> u64 {
        self.host().generation()
    }

    /// `/readyz`: true only when the Host can do its work — started, not draining, not
    /// fenced, its store answering within the bound and no persistence fault held.
    pub fn ready(&self) -> bool {
        self.readiness().ready
    }

    /// Whether the Host is ready, and every reason it is not.
    pub fn readiness(&self) -> ReadinessReport {
        let host = self.host();
        host.readiness().report(host.started(), host.draining())
    }

    /// Announces (once) that a newer generation took this Host's id: the process should
    /// stop serving and exit non-zero.
    pub fn fences(&self) -> watch::Receiver<Option<Fence>> {
        self.host().readiness().fences()
    }

    /// `/healthz`: the process should keep running (true until stop completes).
    pub fn live(&self) -> bool {
        self.host().live()
    }

    /// True once a drain has begun.
    pub fn draining(&self) -> bool {
        self.host().draining()
    }

    /// Sessions a route should be dropped for (tail lost, refused or released).
    pub fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.host().route_invalidations()
    }

    /// Publishes the advertisement synchronously (a refused first publication fails start),
    /// then keeps it alive with a heartbeat.
    pub async fn start(&self) -> Result<(), HostError> {
        let host = self.host();
        if host.disposed() {
            return Err(HostError::Disposed);
        }
        if host.started() {
            return Ok(());
        }
        // One above any generation this id ever held, so a collected advertisement can never
        // let a restart reuse one.
        let generation = host
            .store()
            .next_host_generation(&host.config().host_id)
            .await?;
        let mut first = host.advertisement(true);
        first.generation = generation;
        // Leases this advertisement renews expire at the store's clock when it runs plus the
        // registry expiry: never before this instant plus the expiry.
        let first_sent = tokio::time::Instant::now();
        host.store()
            .heartbeat(sessionstore::HostHeartbeat {
                advertisement: first,
                weight_used: 0,
                retention: host.config().registry_retention,
            })
            .await
            .map_err(|e| {
                HostError::internal(format!("the first advertisement was refused: {e}"))
            })?;
        host.mark_started(generation);
        host.spawn(crate::upkeep::heartbeat(host.clone(), first_sent));
        let me = self.inner.clone();
        host.spawn(async move { me.admission_hints().await });
        let me = self.clone();
        let attach: crate::reconcile::Attach = Box::new(move |req| {
            let me = me.clone();
            Box::pin(async move { me.attach(req).await.map(|a| a.attached) })
        });
        host.spawn(crate::reconcile::reconcile(host.clone(), attach));
        let me = self.inner.clone();
        host.spawn(async move { me.probe_store().await });
        tracing::info!(host = %host.config().host_id, generation, "host started");
        Ok(())
    }

    /// Makes a session resident (idempotent for a resident session).
    pub async fn attach(&self, req: AttachRequest) -> Result<Attached, HostError> {
        let span = tracing::info_span!("attach", tenant = %req.tenant, session = %req.session);
        let (tenant, session) = (req.tenant.clone(), req.session.clone());
        // The attach runs on a task of its own, so it always reaches its end or unwinds: a
        // caller that stops waiting (a dropped link, a timeout, a cancelled step) must not
        // leave the residency lease taken with nothing resident to use it.
        let inner = self.inner.clone();
        let result =
            match tokio::spawn(async move { inner.attach(req).await }.instrument(span)).await {
                Ok(result) => result,
                Err(e) => Err(HostError::internal(format!("the attach task ended: {e}"))),
            };
        if let Err(e) = &result {
            log_refusal(&tenant, &session, e);
        }
        result
    }

    /// A wake-up hint for a resident session's consumer (a HostLink delivery).
    pub fn deliver(&self, tenant: &TenantId, session: &SessionId) -> Result<(), HostError> {
        match self.host().resident(&key(tenant, session)) {
            Some(r) if r.state() == ResidentState::Resident => {
                r.consumer.wake();
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
        self.host()
            .resident(&key(tenant, session))
            .map(|r| (r.epoch, r.state()))
    }

    /// Whether a session resident here has a command that cannot progress on this Host now
    /// (`None` when it is not resident here).
    pub fn command_blocked(&self, tenant: &TenantId, session: &SessionId) -> Option<bool> {
        self.host()
            .resident(&key(tenant, session))
            .map(|r| r.consumer.blocked.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// The sessions resident now.
    pub fn residents(&self) -> Vec<SessionKey> {
        self.host().keys()
    }

    /// How many per-session attach locks exist now (only those held or waited for).
    pub fn session_locks(&self) -> usize {
        self.host().session_locks()
    }

    /// What this Host holds per session now (every count is zero with nothing resident,
    /// attaching or watched).
    pub fn footprint(&self) -> Footprint {
        self.host().footprint()
    }

    /// The live feed of a resident session (projected committed events and previews, in
    /// order), with its runtime build.
    pub fn live_feed(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Option<(CompatibilityId, broadcast::Receiver<FeedItem>)> {
        let r = self.host().resident(&key(tenant, session))?;
        Some((r.compatibility.clone(), r.relay.subscribe()))
    }

    /// The live feed of a resident session.
    pub fn subscribe(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Option<broadcast::Receiver<FeedItem>> {
        self.live_feed(tenant, session).map(|(_, rx)| rx)
    }

    /// Stops admitting from this instant, without draining yet: `/readyz` answers 503
    /// `draining`, attaches and binds are refused `not_admitting`. [`Service::drain`] (which
    /// does this too) gives the sessions back. Idempotent.
    pub fn stop_admitting(&self) {
        if self.host().begin_drain() {
            tracing::info!(
                host_generation = self.generation(),
                "draining: admitting nothing from now on"
            );
        }
    }

    /// Records in the store that `requested_by` asked this incarnation to drain (the first
    /// request of an incarnation stands; see [`sessionstore::Store::record_drain`]) and returns
    /// the request that stands. A store that refuses or fails is logged and answered with
    /// `None`: who asked is kept where it can be, and a drain never waits on it.
    pub async fn record_drain_request(
        &self,
        requested_by: &str,
    ) -> Option<sessionstore::DrainRecord> {
        let host = &self.config().host_id;
        let generation = self.generation();
        match self
            .store()
            .record_drain(host, generation, requested_by)
            .await
        {
            Ok(r) => {
                tracing::info!(
                    host_generation = generation,
                    requested_by = %r.requested_by,
                    "drain requested"
                );
                Some(r)
            }
            Err(e) => {
                tracing::warn!(
                    host_generation = generation,
                    requested_by,
                    error = %e,
                    code = e.code().as_str(),
                    "who asked for the drain could not be recorded"
                );
                None
            }
        }
    }

    /// Drains the whole Host (what SIGTERM does): admission off at once, advertisement
    /// withdrawn, every resident session released within the grace. Calling it again returns
    /// the first drain's report once it finishes.
    pub async fn drain(&self) -> DrainReport {
        crate::release::drain(self.host(), &self.inner.drain).await
    }

    /// Drains, then stops everything and closes the store last. `/healthz` turns false when
    /// this returns. The stop after the drain is bounded by half an idle boundary, so the
    /// whole of it ends within `drain_grace + 2 × idle_boundary`.
    pub async fn stop(&self) -> DrainReport {
        let bound = crate::release::stop_tail(self.host().config().idle_boundary);
        self.stop_within(bound).await
    }

    /// Drains, then stops within `bound`; a step that did not finish in time (`close_store`)
    /// is added to the drain's report.
    pub async fn stop_within(&self, bound: std::time::Duration) -> DrainReport {
        let mut report = self.drain().await;
        for (step, reason) in self.host().stop(bound).await {
            tracing::warn!(step, reason = %reason, host_generation = report.generation, "stop step failed");
            report.failures.push(crate::release::DrainFailure {
                session: None,
                step,
                reason,
            });
        }
        report
    }
}

/// Logs a refused attach: placement races a controller resolves by placing again at DEBUG,
/// refusals an operator may have to act on (this Host cannot run the session) at WARN, and
/// internal failures at ERROR.
fn log_refusal(tenant: &TenantId, session: &SessionId, e: &HostError) {
    let code = e.code().unwrap_or("internal");
    match e {
        HostError::EpochMismatch { .. }
        | HostError::Releasing
        | HostError::NoCapacity { .. }
        | HostError::NotAdmitting(_) => {
            tracing::debug!(%tenant, %session, step = "attach", code, reason = %e, "attach refused")
        }
        HostError::Internal { .. } | HostError::Unwound { .. } => {
            let at = e.step().unwrap_or("attach");
            tracing::error!(%tenant, %session, step = "attach", at, code, reason = %e, "attach failed")
        }
        HostError::RuntimeUnavailable(_)
        | HostError::RuntimeMismatch { .. }
        | HostError::Invalid(_)
        | HostError::NotStarted
        | HostError::Disposed => {
            tracing::warn!(%tenant, %session, step = "attach", code, reason = %e, "attach refused")
        }
    }
}

fn key(tenant: &TenantId, session: &SessionId) -> SessionKey {
    SessionKey {
        tenant: tenant.clone(),
        session: session.clone(),
    }
}

/// Starts a residency's tasks, each with only the session's context.
fn start_tasks(ctx: SessionCtx, hints: mpsc::Receiver<()>) {
    let tasks = ctx.resident().tasks.clone();
    tasks.spawn(crate::consumer::run(ctx.clone(), hints));
    tasks.spawn(crate::publisher::run(ctx.clone()));
    tasks.spawn(crate::feed::relay(ctx.clone()));
    tasks.spawn(crate::upkeep::supervise(ctx.clone()));
    if ctx.config().placement == Placement::Pooled {
        tasks.spawn(crate::release::warm_watch(ctx));
    }
    tasks.close();
}

impl Inner {
    /// Probes the store four times per unreachable bound, for `/readyz`: a read of this
    /// Host's own advertisement (which also reveals a newer generation of its id: a fence),
    /// and, while a persistence fault is held, a write (the advertisement again) to learn
    /// whether the store takes writes once more. Each probe is cut off at the bound.
    async fn probe_store(self: Arc<Self>) {
        let host = &self.host;
        let readiness = host.readiness();
        let bound = readiness.bound();
        let every = bound / 4;
        let own_id = host.config().host_id.clone();
        loop {
            tokio::select! {
                _ = host.shutdown().cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let own = host.generation();
            match tokio::time::timeout(bound, host.store().target(&own_id)).await {
                Ok(Ok(found)) => {
                    if let Some(t) = found
                        && t.generation > own
                    {
                        let fence = Fence {
                            own_generation: own,
                            newer_generation: t.generation,
                        };
                        tracing::error!(host = %own_id, %fence, "this Host is fenced");
                        readiness.fenced(fence);
                        readiness.store_answered(false);
                        continue;
                    }
                    let wrote = if readiness.holds_fault() {
                        let ad = host.advertisement(!host.draining());
                        matches!(
                            tokio::time::timeout(bound, host.store().advertise(ad)).await,
                            Ok(Ok(_))
                        )
                    } else {
                        false
                    };
                    readiness.store_answered(wrote);
                }
                Ok(Err(e)) => readiness.store_failed(e.to_string()),
                Err(_) => readiness.store_failed(format!("no answer within {bound:?}")),
            }
        }
    }

    /// Wakes a resident session's consumer when the store announces an admission for it
    /// (PostgreSQL `LISTEN/NOTIFY`, SQLite's in-process notifier). A hint only: the
    /// reconcile interval covers a lost one.
    async fn admission_hints(self: Arc<Self>) {
        let mut admissions = self.host.store().admissions();
        loop {
            let a = tokio::select! {
                _ = self.host.shutdown().cancelled() => return,
                a = admissions.recv() => a,
            };
            match a {
                Ok(a) => {
                    let key = SessionKey {
                        tenant: a.tenant,
                        session: a.session,
                    };
                    if let Some(r) = self.host.resident(&key)
                        && r.state() == ResidentState::Resident
                    {
                        r.consumer.wake();
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Hints were lost: wake everyone once.
                    for r in self.host.residents() {
                        r.consumer.wake();
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    fn observation(&self, r: &Resident, reg: &sessionstore::HostRegistration) -> Observation {
        Observation {
            tenant: r.key.tenant.clone(),
            session: r.key.session.clone(),
            host: self.host.config().host_id.clone(),
            host_generation: self.host.generation(),
            agent: r.agent.clone(),
            compatibility: r.compatibility.clone(),
            placement: self.host.config().placement,
            internal_endpoint: self.host.config().internal_endpoint.clone(),
            residency: reg.residency,
            accepting: reg.accepting,
            lease_epoch: r.epoch,
            observed_at_ms: reg.observed_at_ms,
            expires_at_ms: reg.expires_at_ms,
        }
    }

    /// Attach, in the order SEMANTICS.md gives, serialized per session.
    async fn attach(&self, req: AttachRequest) -> Result<Attached, HostError> {
        let started = Instant::now();
        let host = &self.host;
        if host.disposed() {
            return Err(HostError::Disposed);
        }
        if !host.started() {
            return Err(HostError::NotStarted);
        }
        // 1. Validate.
        if let Some(fixed) = &host.config().fixed_session
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
        if req
            .compatibility
            .as_ref()
            .is_some_and(|c| c != &compatibility)
        {
            return Err(HostError::RuntimeMismatch {
                runtime_compatibility_id: compatibility.to_string(),
            });
        }
        let key = key(&req.tenant, &req.session);
        // From the instant a drain begins nothing is admitted, not even a re-attach of a
        // session still resident: it is about to be given back.
        if host.draining() {
            return Err(HostError::NotAdmitting("this Host is draining".into()));
        }
        let _serial = host.lock_session(&key, None).await;
        if host.draining() {
            return Err(HostError::NotAdmitting("this Host is draining".into()));
        }
        if let Some(r) = host.resident(&key) {
            return match r.state() {
                ResidentState::Resident => {
                    if r.agent != req.agent
                        || req
                            .compatibility
                            .as_ref()
                            .is_some_and(|c| c != &r.compatibility)
                    {
                        return Err(HostError::RuntimeMismatch {
                            runtime_compatibility_id: r.compatibility.to_string(),
                        });
                    }
                    let reg = host
                        .store()
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
        // 2. Admit against capacity, charged to this attach's generation.
        let weight = target.capabilities().admission_weight.max(1);
        if host.config().placement == Placement::Pooled && !target.capabilities().supports_pooled {
            return Err(HostError::RuntimeUnavailable(
                "this agent cannot share a pooled Host".into(),
            ));
        }
        let generation = host.admit(&key, weight)?;
        // Returned unless the attach succeeds: on a refusal, and on a panic that unwinds it.
        let mut charge = Charge {
            host,
            key: &key,
            generation,
            armed: true,
        };
        let result = self
            .attach_admitted(&req, key.clone(), generation, target)
            .await;
        if let Ok(a) = &result {
            charge.armed = false;
            host.metrics()
                .attach_seconds
                .with_label_values(&[a.launched.as_str()])
                .observe(started.elapsed().as_secs_f64());
        }
        drop(charge);
        result
    }

    async fn attach_admitted(
        &self,
        req: &AttachRequest,
        key: SessionKey,
        generation: u64,
        target: Arc<dyn department::LaunchTarget>,
    ) -> Result<Attached, HostError> {
        let store = self.host.store().clone();
        // 3. The residency lease: a new, strictly higher epoch.
        let holder = format!(
            "{}/{}/{}",
            self.host.config().host_id,
            self.host.generation(),
            Uuid::now_v7()
        );
        let grant = match store
            .acquire_residency(ResidencyRequest {
                tenant: key.tenant.clone(),
                session: key.session.clone(),
                holder: holder.clone(),
                host: self.host.config().host_id.clone(),
                host_generation: self.host.generation(),
                ttl: self.host.config().registry_expiry,
            })
            .await
        {
            Ok(g) => g,
            Err(StoreError::ClaimHeld { epoch, .. }) => {
                return Err(HostError::EpochMismatch {
                    current_lease_epoch: Some(epoch),
                });
            }
            Err(StoreError::NotFound { .. }) => {
                return Err(HostError::RuntimeUnavailable("no such session".into()));
            }
            Err(e) => return Err(HostError::from(e).at("lease")),
        };
        let epoch = grant.epoch;
        // From here on, whatever ends this attach short (a refusal, a panic) gives back what
        // it took.
        let mut unwind = Unwind {
            store: store.clone(),
            grant: Some(grant.clone()),
            runtime: None,
            registered: false,
            unreleased: Vec::new(),
        };
        failpoints::hit(
            self.host.config().host_id.as_str(),
            failpoints::steps::ATTACH_AFTER_LEASE,
        )
        .await;
        let result: Result<Attached, HostError> = async {
            // 4. One fencing write before the runtime is launched; the `attaching`
            // registration goes out alongside it (concurrent writes share one commit on
            // SQLite's group-commit writer).
            let (fenced, registered) = tokio::join!(
                store.fence_gate_mark(&key.tenant, &key.session, epoch),
                store.put_registration(self.host.registration(
                    &key,
                    epoch,
                    ResidencyState::Attaching
                )),
            );
            fenced.map_err(|e| {
                if e.code() == ErrorCode::Epoch {
                    // The newer holder's mark when the store names it; never this Host's
                    // own epoch in its place.
                    HostError::EpochMismatch {
                        current_lease_epoch: e.mark(),
                    }
                } else {
                    HostError::from(e).at("fence")
                }
            })?;
            registered.map_err(|e| HostError::from(e).at("register"))?;
            unwind.registered = true;
            // 5. Hydrate: the binding, and create versus restore from the journal.
            let session = store
                .session(&key.tenant, &key.session)
                .await
                .map_err(|e| HostError::from(e).at("hydrate"))?;
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
                // The operator's wiring, not the runtime: this Host could dispatch but
                // never settle from evidence it cannot read, so it refuses before any
                // dispatch and says where to look.
                return Err(HostError::RuntimeUnavailable(format!(
                    "evidence_unroutable: no journal store on this Host serves the session's storage binding {}",
                    session.binding.storage_binding_id
                )));
            }
            let has_conversation = self
                .has_conversation(&key.tenant, session.binding.runtime_session_id)
                .await
                .map_err(|e| e.at("hydrate"))?;
            // Only a create may start a conversation: an explicit restore of a session whose
            // journal holds none is how a wrong storage binding or a lost journal shows, so it
            // is refused rather than quietly begun anew.
            if req.mode == LaunchMode::Restore && !has_conversation {
                return Err(HostError::RuntimeUnavailable(format!(
                    "restore_without_state: the journal of runtime session {} holds no conversation to restore; attach with mode create to start one",
                    session.binding.runtime_session_id
                )));
            }
            let mode = if has_conversation {
                LaunchMode::Restore
            } else {
                LaunchMode::Create
            };
            // 6. Launch under the binding's runtime session id (verified), in a span of its
            // own: a restore's cost (snapshot plus tail) is what an operator looks for.
            let launch_span = tracing::info_span!(
                "residency.launch",
                otel.name = if mode == LaunchMode::Restore { "residency.restore" } else { "residency.create" },
                tenant = %key.tenant,
                session = %key.session,
                epoch = epoch.0,
                otel.status_code = tracing::field::Empty,
                otel.status_description = tracing::field::Empty,
            );
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
            .instrument(launch_span.clone())
            .await
            .map_err(|e| {
                launch_span.record("otel.status_code", "ERROR");
                launch_span.record("otel.status_description", "launch_failed");
                HostError::internal(format!("launch ({mode:?}) failed: {e}")).at("launch")
            })?;
            unwind.runtime = Some(runtime.clone());
            // What this runtime cannot do is an operator's to know now, not at the first
            // stranded attempt or the first journal fault.
            if runtime.closer.is_none() {
                tracing::warn!(tenant = %key.tenant, session = %key.session, code = "attempt_closer_unavailable", "the runtime cannot close a predecessor's attempt: a stranded attempt will hold this session's stream until an operator closes it");
            }
            if runtime.faults.is_none() {
                tracing::error!(tenant = %key.tenant, session = %key.session, code = "persistence_faults_unavailable", "the runtime reports no persistence faults: it stays resident unsupervised and cannot be abandoned by a drain");
            }
            // 7. Register resident, then start the session's tasks.
            let (hints_tx, hints_rx) = mpsc::channel(self.host.config().command_queue_size);
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
                }),
                cancel: self.host.shutdown().child_token(),
                tasks: TaskTracker::new(),
                gates_open: std::sync::atomic::AtomicUsize::new(0),
                ending: std::sync::atomic::AtomicBool::new(false),
                warm_released: std::sync::atomic::AtomicBool::new(false),
                relay: crate::fanout::Relay::default(),
            });
            let (reg, projected) = tokio::join!(
                store.put_registration(self.host.registration(
                    &key,
                    epoch,
                    ResidencyState::Resident
                )),
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
            let reg = reg.map_err(|e| HostError::from(e).at("register"))?;
            projected.map_err(|e| HostError::from(e).at("register"))?;
            self.host.insert(resident.clone());
            start_tasks(self.host.session(resident.clone()), hints_rx);
            resident.consumer.wake();
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
            Ok(a) => {
                unwind.disarm();
                Ok(a)
            }
            Err(e) => {
                let unreleased = unwind.run().await;
                if !unreleased.is_empty() {
                    tracing::error!(error = %e, unreleased = ?unreleased, "attach failed and could not give everything back");
                }
                Err(e.with_unreleased(unreleased))
            }
        }
    }

    /// A conversation exists when the journal holds any public event. The first record of a
    /// created conversation is its `session_started` event, so a small page nearly always
    /// answers (a page sized to the whole journal was a large, growing buffer per restore).
    async fn has_conversation(
        &self,
        tenant: &TenantId,
        rs: sessionstore::RuntimeSessionId,
    ) -> Result<bool, HostError> {
        let mut after = 0;
        loop {
            let page = self
                .host
                .store()
                .journal_runtime_page(tenant, rs, after, CONVERSATION_PROBE_PAGE)
                .await
                .map_err(|e| HostError::internal(format!("reading the journal failed: {e}")))?;
            if page
                .iter()
                .any(|r| matches!(r.kind, RecordKind::Event { .. }))
            {
                return Ok(true);
            }
            match page.last() {
                Some(last) if page.len() == CONVERSATION_PROBE_PAGE => after = last.seq,
                _ => return Ok(false),
            }
        }
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
    /// The attach succeeded: nothing is to be given back.
    fn disarm(&mut self) {
        self.grant = None;
        self.runtime = None;
    }

    /// Undoes in reverse order; returns what could not be given back.
    async fn undo(&mut self) {
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
    }

    /// Undoes on a detached task (so a cancelled caller cannot cut it short); returns what
    /// could not be given back.
    async fn run(mut self) -> Vec<String> {
        let handle = tokio::spawn(async move {
            self.undo().await;
            std::mem::take(&mut self.unreleased)
        });
        handle
            .await
            .unwrap_or_else(|e| vec![format!("unwind task: {e}")])
    }
}

impl Drop for Unwind {
    /// An attach that unwinds by a panic (neither succeeded nor failed) still gives back what
    /// it took: otherwise the heartbeat would renew a residency lease nothing resident uses,
    /// and the session would be placed nowhere, for ever.
    fn drop(&mut self) {
        if self.grant.is_none() && self.runtime.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut rest = Unwind {
            store: self.store.clone(),
            grant: self.grant.take(),
            runtime: self.runtime.take(),
            registered: self.registered,
            unreleased: Vec::new(),
        };
        runtime.spawn(async move {
            rest.undo().await;
            if !rest.unreleased.is_empty() {
                tracing::error!(unreleased = ?rest.unreleased, "an attach that panicked could not give everything back");
            }
        });
    }
}

/// An attach's admission charge, returned when the attach does not succeed (refused, or
/// unwound by a panic).
struct Charge<'a> {
    host: &'a Residency,
    key: &'a SessionKey,
    generation: u64,
    armed: bool,
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.host.credit(self.key, self.generation);
        }
    }
}
