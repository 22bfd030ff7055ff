//! Run hosting: the Host side of HostLink's `run.*` family. Owns which runs this Host drives
//! (one attempt per run here, claimed synchronously before any await), the admission cap on
//! concurrent drivers (`resource_exhausted` past it; a refused launch frees what it claimed),
//! the boot gate (`run.start`/`run.resume` answer `unavailable` until the boot reconcile has
//! taken back every run recorded `running` that this Host held or whose lease expired), the
//! scan that takes over runs whose Host died and wakes parked runs once due, tenant scoping
//! (another tenant's run reads as unknown), and the per-run channel of step events.
//!
//! A run waiting on an ask or a sleep is parked: its driver hands it back to the store and
//! ends, so it holds no task, no slot and no memory here. The answer (recorded on any Host)
//! or the sleep's deadline makes it due; the answering Host, or the first scan that sees it
//! due, takes it over under epoch + 1. A run waiting for an operator (`needs_attention`) has
//! no driver either.
//!
//! A holder is `<host id>/<attempt id>`: each attempt has its own, so a late write of an old
//! attempt cannot pass for a new one (the store fences by token anyway). A drain stops every
//! driver crash-equivalently: nothing is written, the run stays `running` under the old
//! holder, and the next Host takes it back under epoch + 1. A Host's stop comes in two
//! halves: from its first instant no run is started, resumed or taken, and no driver begins a
//! new step ([`RunHost::begin_stop`]); a step in flight may finish until the drain grace, and
//! is stopped then (its handler stopped, nothing written for it) ([`RunHost::stop_by`]).
//!
//! A run is pinned when it starts: every release its program invokes is resolved in this
//! Host's workspace, published to the store when it is not there yet, and recorded with the
//! run; every driver of the run, on any Host, runs those releases from the store.
//!
//! The program format, validation, pinning and replay live in `workflow`; this module never
//! interprets a step.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sessionstore::{
    AnswerRecorded, CheckpointKind, ErrorCode, HostId, NewRun, RunId, RunState, RunStatus,
    StepEntryKind, Store, StoreError, Takeover, TakeoverRule, TenantId,
};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use workflow::{
    AgentTurns, DriveEnd, Driver, DriverOptions, Environment, Invoker, Releases, StartRefusal,
    StepEvent, StepEvents, check_answer, pin_new_run,
};

use crate::metrics::RunMetrics;
use hostlink::runs::{
    AnswerView, CheckpointView, ProblemView, RunAnswerRequest, RunAnswered, RunEvent,
    RunFailureView, RunList, RunListRequest, RunRefusal, RunReply, RunRequest, RunStartRequest,
    RunStarted, RunSummary, RunView, StepView, refusal_codes,
};
use hostlink_server::backend::{ExtensionReply, Refusal};
use timing::duration_text;

/// Run hosting options (`[runs]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunOptions {
    /// Whether this Host serves `run.*` and advertises `hostlink.run`.
    pub enabled: bool,
    /// The most runs this Host drives at once; past it `run.start` and `run.resume` are
    /// refused `resource_exhausted`. Parked runs (waiting on an ask, a sleep or an operator)
    /// have no driver and do not count.
    pub max_active: u32,
    /// A driver's hold on its run; renewed every quarter of it. A driver that cannot confirm
    /// it for five sixths of it stops its handler and itself. A run whose holder stopped
    /// renewing is taken over by a live Host once it expires.
    #[serde(with = "duration_text")]
    pub lease: Duration,
    /// How often this Host looks for runs whose holder is gone: its lease expired, or its
    /// Host's registration expired. A run therefore fails over within the registry expiry
    /// (or the lease, if shorter) plus this interval; the default matches the fleet
    /// reconciler's pass interval, so runs fail over with their Host's sessions.
    #[serde(with = "duration_text")]
    pub scan_interval: Duration,
    /// How often a driver sleeping in place (a sleep of at most `scan_interval` left; longer
    /// ones park) re-reads its run's status without a wake-up.
    #[serde(with = "duration_text")]
    pub poll: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            enabled: true,
            max_active: 8,
            lease: Duration::from_secs(15),
            scan_interval: Duration::from_secs(1),
            poll: Duration::from_millis(500),
        }
    }
}

impl RunOptions {
    /// Checks every bound.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_active == 0 || self.max_active > 100_000 {
            return Err("runs.max_active must be between 1 and 100000".into());
        }
        if self.lease < Duration::from_millis(300) || self.lease > Duration::from_secs(3600) {
            return Err("runs.lease must be between 300ms and 1h".into());
        }
        if self.scan_interval < Duration::from_millis(50) || self.scan_interval > self.lease * 4 {
            return Err("runs.scan_interval must be at least 50ms and at most 4 leases".into());
        }
        if self.poll < Duration::from_millis(10) || self.poll > Duration::from_secs(60) {
            return Err("runs.poll must be between 10ms and 60s".into());
        }
        Ok(())
    }
}

/// What a Host drives runs with.
pub struct RunHosting {
    pub store: Store,
    pub host_id: HostId,
    /// Where a new run's program is resolved (the workspace) and which agents it may name.
    pub env: Arc<dyn Environment>,
    /// Where the releases runs are pinned to come from.
    pub releases: Arc<dyn Releases>,
    pub invoker: Arc<dyn Invoker>,
    pub agents: Option<Arc<dyn AgentTurns>>,
    pub options: RunOptions,
    pub metrics: Option<RunMetrics>,
}

struct Active {
    wake: Arc<Notify>,
    stop: CancellationToken,
    halt: CancellationToken,
}

struct Inner {
    store: Store,
    host_id: HostId,
    env: Arc<dyn Environment>,
    releases: Arc<dyn Releases>,
    invoker: Arc<dyn Invoker>,
    agents: Option<Arc<dyn AgentTurns>>,
    options: RunOptions,
    metrics: Option<RunMetrics>,
    ready: AtomicBool,
    draining: AtomicBool,
    active: Mutex<HashMap<RunId, Active>>,
    /// Every step event of the runs this Host drives; a subscription keeps its run's.
    events: broadcast::Sender<RunEvent>,
    /// Cancelled at the stop's first instant: no new run, takeover or step.
    stop: CancellationToken,
    /// Cancelled at the stop's graceful deadline: steps in flight are stopped too.
    halt: CancellationToken,
    tracker: TaskTracker,
    /// A test seam: the boot reconcile waits this long first.
    reconcile_delay: Mutex<Duration>,
}

/// The most due runs one scan looks at; the rest wait for the next one.
const SCAN_PAGE: usize = 1000;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A run's place among this Host's drivers; freed when dropped.
struct Slot {
    inner: Weak<Inner>,
    run: RunId,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            lock(&inner.active).remove(&self.run);
            inner.gauge();
        }
    }
}

/// The run hosting of one Host.
#[derive(Clone)]
pub struct RunHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RunHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHost")
            .field("host_id", &self.inner.host_id)
            .finish()
    }
}

fn refused(code: &str, message: impl Into<String>) -> RunRefusal {
    RunRefusal {
        code: code.into(),
        message: message.into(),
        problems: Vec::new(),
    }
}

fn store_refusal(e: &StoreError) -> RunRefusal {
    let code = match e.code() {
        ErrorCode::NotFound => refusal_codes::NOT_FOUND,
        ErrorCode::Conflict | ErrorCode::ClaimHeld | ErrorCode::ClaimLost => {
            refusal_codes::CONFLICT
        }
        ErrorCode::State | ErrorCode::Terminal => refusal_codes::STATE,
        ErrorCode::Invalid => refusal_codes::INVALID,
        _ => refusal_codes::UNAVAILABLE,
    };
    refused(code, e.to_string())
}

fn raw(text: String) -> ExtensionReply {
    match RawValue::from_string(text) {
        Ok(r) => ExtensionReply::Done(Ok(r)),
        Err(e) => ExtensionReply::Done(Err(Refusal::Internal(e.to_string()))),
    }
}

fn reply<T: Serialize>(r: Result<T, RunRefusal>) -> ExtensionReply {
    match r {
        Ok(v) => raw(RunReply::ok(v)),
        Err(e) => raw(RunReply::refused(e)),
    }
}

struct Events {
    inner: Weak<Inner>,
}

impl StepEvents for Events {
    fn event(&self, e: StepEvent) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        if let (Some(m), Some(ms)) = (&inner.metrics, e.duration_ms) {
            m.step_seconds
                .with_label_values(&[e.kind.as_str()])
                .observe(ms as f64 / 1000.0);
        }
        let Ok(run) = RunId::new(e.run_id.clone()) else {
            return;
        };
        let _ = run;
        // No subscriber is not an error: events are live only.
        let _ = inner.events.send(RunEvent {
            run_id: e.run_id,
            epoch: e.epoch,
            step: e.step,
            kind: e.kind,
            phase: e.phase,
            outcome: e.outcome,
            duration_ms: e.duration_ms,
        });
    }
}

impl Inner {
    fn prefix(&self) -> String {
        format!("{}/", self.host_id)
    }

    fn holder(&self) -> String {
        format!("{}{}", self.prefix(), uuid::Uuid::now_v7().simple())
    }

    fn gauge(&self) {
        if let Some(m) = &self.metrics {
            m.driving.set(lock(&self.active).len() as i64);
        }
    }

    /// Claims the run's slot, synchronously: `conflict` if this Host drives it already,
    /// `resource_exhausted` at the cap. `recorded` says whether the run exists in the store
    /// (a resume, a takeover) or not yet (a start): only a recorded run is named in the
    /// refusal's hint, since only it can be resumed.
    fn claim(
        self: &Arc<Self>,
        run: &RunId,
        recorded: bool,
    ) -> Result<(Slot, Arc<Notify>), RunRefusal> {
        let mut active = lock(&self.active);
        // Checked under the lock the stop's wait reads the drivers from: a run claimed after
        // the stop began would escape it.
        if self.draining.load(Ordering::SeqCst) {
            return Err(refused(
                refusal_codes::NOT_ADMITTING,
                format!("this Host is draining; drive run {run} on another Host"),
            ));
        }
        if active.contains_key(run) {
            return Err(refused(
                refusal_codes::CONFLICT,
                format!("run {run} is driven by this Host already"),
            ));
        }
        if active.len() >= self.options.max_active as usize {
            let hint = if recorded {
                format!("retry later (hostd run resume {run})")
            } else {
                "nothing was recorded; start it again later, or on another Host".to_owned()
            };
            return Err(refused(
                refusal_codes::RESOURCE_EXHAUSTED,
                format!("this Host drives {} runs, its cap; {hint}", active.len()),
            ));
        }
        let wake = Arc::new(Notify::new());
        active.insert(
            run.clone(),
            Active {
                wake: wake.clone(),
                stop: self.stop.child_token(),
                halt: self.halt.child_token(),
            },
        );
        drop(active);
        self.gauge();
        Ok((
            Slot {
                inner: Arc::downgrade(self),
                run: run.clone(),
            },
            wake,
        ))
    }

    fn driver(self: &Arc<Self>) -> Driver {
        Driver {
            journal: Arc::new(self.store.clone()),
            env: self.env.clone(),
            releases: self.releases.clone(),
            invoker: self.invoker.clone(),
            agents: self.agents.clone(),
            events: Arc::new(Events {
                inner: Arc::downgrade(self),
            }),
            options: DriverOptions {
                lease: self.options.lease,
                poll: self.options.poll,
                // A parked sleep is woken by a scan, at most one interval late: only a
                // shorter one is slept in place.
                park: Some(self.options.scan_interval),
            },
        }
    }

    /// Drives a run this Host now holds, on a task that owns the slot.
    fn launch(self: &Arc<Self>, status: RunStatus, slot: Slot, wake: Arc<Notify>) {
        let (stop, halt) = lock(&self.active)
            .get(&status.run_id)
            .map(|a| (a.stop.clone(), a.halt.clone()))
            .unwrap_or_else(|| (self.stop.child_token(), self.halt.child_token()));
        let driver = self.driver();
        let inner = self.clone();
        self.tracker.spawn(async move {
            let _slot = slot;
            let run = status.run_id.clone();
            let tenant = status.tenant.clone();
            let epoch = status.epoch;
            let end = driver.drive_until(status, wake, stop, halt).await;
            let label = match &end {
                Ok(DriveEnd::Completed) => "completed",
                Ok(DriveEnd::Failed { .. }) => "failed",
                Ok(DriveEnd::NeedsAttention { .. }) => "needs_attention",
                Ok(DriveEnd::Parked { .. }) => "parked",
                Ok(DriveEnd::Cancelled) => "cancelled",
                Ok(DriveEnd::Fenced) => "fenced",
                Ok(DriveEnd::Stopped) => "stopped",
                Err(_) => "error",
            };
            if let Some(m) = &inner.metrics {
                m.ended.with_label_values(&[label]).inc();
            }
            if matches!(
                label,
                "completed" | "failed" | "needs_attention" | "cancelled"
            ) {
                let step = inner
                    .store
                    .run_status(None, &run)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|s| s.step)
                    .unwrap_or_default();
                let _ = inner.events.send(RunEvent {
                    run_id: run.to_string(),
                    epoch,
                    step,
                    kind: "run".into(),
                    phase: "finished".into(),
                    outcome: Some(label.into()),
                    duration_ms: None,
                });
            }
            match end {
                Ok(end) => tracing::info!(%tenant, %run, epoch, ?end, "run driver ended"),
                Err(e) => tracing::warn!(%tenant, %run, epoch, code = e.code(), error = %e,
                    "run driver stopped without a decision; the run stays running for a successor"),
            }
        });
    }

    /// Takes a run over under epoch + 1 and drives it.
    async fn take_and_launch(
        self: &Arc<Self>,
        status: &RunStatus,
        rule: TakeoverRule,
    ) -> Result<RunStatus, RunRefusal> {
        let (slot, wake) = self.claim(&status.run_id, true)?;
        let taken = self
            .store
            .take_run(Takeover {
                run_id: status.run_id.clone(),
                expected_epoch: status.epoch,
                holder: self.holder(),
                fencing_token: uuid::Uuid::now_v7().simple().to_string(),
                lease: self.options.lease,
                rule,
            })
            .await
            .map_err(|e| store_refusal(&e))?;
        self.launch(taken.clone(), slot, wake);
        Ok(taken)
    }

    /// Takes over every run due now: whose lease expired (a parked run: its answer came or
    /// its sleep is due), whose holder's Host registration expired (the fleet's verdict that
    /// it died), or, at boot, that this Host held. Stops at the admission cap; the rest are
    /// left for the next scan or another Host.
    async fn reconcile(self: &Arc<Self>, booting: bool) -> Result<usize, StoreError> {
        let now = self.store.now_ms().await?;
        let mut hosts: Vec<HostId> = self
            .store
            .targets(false)
            .await?
            .into_iter()
            .filter(|t| !t.is_live(now) && t.host != self.host_id)
            .map(|t| t.host)
            .collect();
        if booting {
            hosts.push(self.host_id.clone());
        }
        let due = self.store.runs_to_take(now, &hosts, SCAN_PAGE).await?;
        let prefix = self.prefix();
        let mut taken = 0;
        for s in due {
            if self.stop.is_cancelled() {
                break;
            }
            if lock(&self.active).contains_key(&s.run_id) {
                continue;
            }
            if self.store.run_program(&s.run_id).await?.is_none() {
                tracing::warn!(run = %s.run_id, tenant = %s.tenant,
                    "a running run has no recorded program; it is left as it is");
                continue;
            }
            let rule = if booting && s.holder.starts_with(&prefix) {
                TakeoverRule::HeldByOrExpired(prefix.clone())
            } else {
                TakeoverRule::LeaseExpired
            };
            match self.take_and_launch(&s, rule).await {
                Ok(t) => {
                    taken += 1;
                    tracing::info!(run = %t.run_id, tenant = %t.tenant, epoch = t.epoch, "took a run over");
                }
                Err(r) if r.code == refusal_codes::RESOURCE_EXHAUSTED => {
                    tracing::debug!(
                        "the admission cap is reached; due runs wait for the next scan"
                    );
                    break;
                }
                Err(r) => {
                    tracing::debug!(run = %s.run_id, code = %r.code, "a run was not taken over: {}", r.message)
                }
            }
        }
        Ok(taken)
    }
}

impl RunHost {
    /// Run hosting over `h`; call [`RunHost::boot`] to start the reconcile and the scan.
    pub fn new(h: RunHosting) -> RunHost {
        RunHost {
            inner: Arc::new(Inner {
                store: h.store,
                host_id: h.host_id,
                env: h.env,
                releases: h.releases,
                invoker: h.invoker,
                agents: h.agents,
                options: h.options,
                metrics: h.metrics,
                ready: AtomicBool::new(false),
                draining: AtomicBool::new(false),
                active: Mutex::new(HashMap::new()),
                events: broadcast::channel(1024).0,
                stop: CancellationToken::new(),
                halt: CancellationToken::new(),
                tracker: TaskTracker::new(),
                reconcile_delay: Mutex::new(Duration::ZERO),
            }),
        }
    }

    /// A test seam: the boot reconcile first waits `d`.
    pub fn delay_reconcile(&self, d: Duration) {
        *lock(&self.inner.reconcile_delay) = d;
    }

    /// True once the boot reconcile has returned.
    pub fn ready(&self) -> bool {
        self.inner.ready.load(Ordering::SeqCst)
    }

    /// How many runs this Host drives now.
    pub fn driving(&self) -> usize {
        lock(&self.inner.active).len()
    }

    /// Starts the boot reconcile (then opens the gate) and the lease-expiry scan.
    pub fn boot(&self) {
        let inner = self.inner.clone();
        self.inner.tracker.spawn(async move {
            let delay = *lock(&inner.reconcile_delay);
            if !delay.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = inner.stop.cancelled() => return,
                }
            }
            loop {
                match inner.reconcile(true).await {
                    Ok(n) => {
                        tracing::info!(taken = n, "run reconcile done; run.start is open");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "run reconcile failed; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(inner.options.scan_interval) => {}
                            _ = inner.stop.cancelled() => return,
                        }
                    }
                }
            }
            inner.ready.store(true, Ordering::SeqCst);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(inner.options.scan_interval) => {}
                    _ = inner.stop.cancelled() => return,
                }
                if let Err(e) = inner.reconcile(false).await {
                    tracing::debug!(error = %e, "run lease scan failed");
                }
            }
        });
    }

    /// The stop's first instant: `run.start` and `run.resume` are refused `not_admitting`
    /// from now on, no run is taken over, and no driver begins a new step (a sleeping or
    /// parked driver ends at once; the run stays running for a successor). A step in flight
    /// goes on. Idempotent; never waits.
    pub fn begin_stop(&self) {
        if !self.inner.draining.swap(true, Ordering::SeqCst) {
            tracing::info!(
                driving = self.driving(),
                "run hosting stops: nothing new is started"
            );
        }
        self.inner.stop.cancel();
    }

    /// Stops run hosting beside a drain: [`RunHost::begin_stop`], then steps in flight may
    /// finish (and record their results) until `graceful`; at `graceful` every driver still
    /// running is halted crash-equivalently (an invoke's handler is stopped, nothing is
    /// written for its step, the run stays running under this holder for the next Host), and
    /// the drivers are waited for until `cut`. A driver still running at `cut` is named and
    /// left (it writes nothing more for its step).
    pub async fn stop_by(&self, graceful: tokio::time::Instant, cut: tokio::time::Instant) {
        self.begin_stop();
        self.inner.tracker.close();
        if tokio::time::timeout_at(graceful, self.inner.tracker.wait())
            .await
            .is_ok()
        {
            return;
        }
        let halted = self.driven_runs();
        tracing::info!(runs = ?halted, "drain grace over: halting the run drivers still in a step");
        self.inner.halt.cancel();
        if tokio::time::timeout_at(cut, self.inner.tracker.wait())
            .await
            .is_err()
        {
            let held = self.driven_runs();
            tracing::warn!(runs = ?held, "some run drivers did not stop within the stop bound");
        }
    }

    /// The ids of the runs this Host drives now (for the stop's log lines).
    fn driven_runs(&self) -> Vec<String> {
        lock(&self.inner.active)
            .keys()
            .map(ToString::to_string)
            .collect()
    }

    /// Stops every driver crash-equivalently at once (nothing written for a step in flight)
    /// and waits for them, at most `within`.
    pub async fn shutdown(&self, within: Duration) {
        let now = tokio::time::Instant::now();
        self.stop_by(now, now + within).await;
    }

    /// The live step events of every run this Host drives, for a link of `tenant` that
    /// subscribes to `run`'s channel: `not_found` for another tenant's run, exactly as for an
    /// unknown one. The caller keeps the events whose `run_id` is `run`. Taken before the
    /// check, so nothing published after a successful check is missed.
    pub async fn events(
        &self,
        tenant: &TenantId,
        run: &RunId,
    ) -> Result<broadcast::Receiver<RunEvent>, RunRefusal> {
        let rx = self.inner.events.subscribe();
        self.scoped(tenant, run).await?;
        Ok(rx)
    }

    /// Serves one `run.*` method for the link's tenant; `NotFound` for any other method.
    pub async fn handle(
        &self,
        tenant: &TenantId,
        method: &str,
        data: Option<&RawValue>,
    ) -> ExtensionReply {
        let actor = hostlink::auth::actor_of(tenant, None);
        self.handle_as(tenant, &actor, method, data).await
    }

    /// [`RunHost::handle`] for a link that acts as `actor`: a start or an answer it makes is
    /// recorded as `actor`'s.
    pub async fn handle_as(
        &self,
        tenant: &TenantId,
        actor: &str,
        method: &str,
        data: Option<&RawValue>,
    ) -> ExtensionReply {
        use tracing::Instrument as _;
        let span = tracing::info_span!("run.rpc", %tenant, method);
        self.dispatch(tenant, actor, method, data)
            .instrument(span)
            .await
    }

    async fn dispatch(
        &self,
        tenant: &TenantId,
        actor: &str,
        method: &str,
        data: Option<&RawValue>,
    ) -> ExtensionReply {
        let bytes = data.map(|d| d.get().as_bytes()).unwrap_or(b"{}");
        match method {
            "run.start" => match RunStartRequest::decode(bytes) {
                Ok(req) => reply(self.start(tenant, actor, req).await),
                Err(_) => ExtensionReply::Done(Err(Refusal::BadRequest)),
            },
            "run.resume" => match RunRequest::decode(bytes) {
                Ok(req) => reply(self.resume(tenant, &req.run_id).await),
                Err(_) => ExtensionReply::Done(Err(Refusal::BadRequest)),
            },
            "run.answer" => match RunAnswerRequest::decode(bytes) {
                Ok(req) => reply(self.answer_as(tenant, req, actor).await),
                Err(_) => ExtensionReply::Done(Err(Refusal::BadRequest)),
            },
            "run.status" => match RunRequest::decode(bytes) {
                Ok(req) => reply(self.status(tenant, &req.run_id).await),
                Err(_) => ExtensionReply::Done(Err(Refusal::BadRequest)),
            },
            "run.list" | "run.ps" => match RunListRequest::decode(bytes) {
                Ok(req) => reply(self.list(tenant, &req).await),
                Err(_) => ExtensionReply::Done(Err(Refusal::BadRequest)),
            },
            "run.cancel" => match RunRequest::decode(bytes) {
                Ok(req) => reply(self.cancel(tenant, &req.run_id).await),
                Err(_) => ExtensionReply::Done(Err(Refusal::BadRequest)),
            },
            _ => ExtensionReply::NotFound,
        }
    }

    fn gate(&self, what: &str) -> Result<(), RunRefusal> {
        if self.inner.draining.load(Ordering::SeqCst) {
            return Err(refused(
                refusal_codes::NOT_ADMITTING,
                format!("this Host is draining; {what} on another Host"),
            ));
        }
        if !self.ready() {
            return Err(refused(
                refusal_codes::UNAVAILABLE,
                format!("this Host is still taking back its runs; retry {what} shortly"),
            ));
        }
        Ok(())
    }

    /// `run.start`.
    pub async fn start(
        &self,
        tenant: &TenantId,
        actor: &str,
        req: RunStartRequest,
    ) -> Result<RunStarted, RunRefusal> {
        self.gate("the start")?;
        let pins = match pin_new_run(
            &req.program,
            self.inner.env.as_ref(),
            self.inner.releases.as_ref(),
        )
        .await
        {
            Ok(pins) => pins,
            Err(StartRefusal::Problems(problems)) => {
                return Err(RunRefusal {
                    code: refusal_codes::INVALID.into(),
                    message: format!("the program has {} problem(s)", problems.len()),
                    problems: problems
                        .into_iter()
                        .map(|p| ProblemView {
                            code: p.code,
                            message: p.message,
                            step: p.step,
                            line: p.line,
                            column: p.column,
                        })
                        .collect(),
                });
            }
            Err(StartRefusal::Release(e)) => {
                let code = match e.code() {
                    "conflict" => refusal_codes::CONFLICT,
                    "unavailable" => refusal_codes::UNAVAILABLE,
                    _ => refusal_codes::INVALID,
                };
                return Err(refused(
                    code,
                    format!("the program's releases cannot be pinned: {e}; nothing was recorded"),
                ));
            }
        };
        // The run's steps continue this call's trace (its span's context when spans are
        // exported, else the caller's own), on this Host or whichever takes the run over.
        let trace =
            trace_context::span::for_callee(&tracing::Span::current(), req.trace().as_ref());
        let input = req
            .input
            .map(|r| r.get().to_owned())
            .unwrap_or_else(|| "{}".into());
        let run = RunId::new(format!("run-{}", uuid::Uuid::now_v7().simple()))
            .map_err(|e| refused(refusal_codes::INVALID, e.to_string()))?;
        let (slot, wake) = self.inner.claim(&run, false)?;
        let created = self
            .inner
            .store
            .create_run(NewRun {
                run_id: run.clone(),
                tenant: tenant.clone(),
                source: req.program,
                input,
                holder: self.inner.holder(),
                fencing_token: uuid::Uuid::now_v7().simple().to_string(),
                lease: self.inner.options.lease,
                idempotency_key: req.idempotency_key,
                pins,
                started_by: Some(actor.to_owned()),
                trace,
            })
            .await
            .map_err(|e| store_refusal(&e))?;
        let status = created.status;
        let started = RunStarted {
            run_id: status.run_id.to_string(),
            epoch: status.epoch,
            created: created.created,
        };
        if created.created {
            tracing::info!(%tenant, run = %status.run_id, epoch = status.epoch, "run started");
            self.inner.launch(status, slot, wake);
        }
        Ok(started)
    }

    async fn scoped(&self, tenant: &TenantId, run: &RunId) -> Result<RunStatus, RunRefusal> {
        self.inner
            .store
            .run_status(Some(tenant), run)
            .await
            .map_err(|e| store_refusal(&e))?
            .ok_or_else(|| refused(refusal_codes::NOT_FOUND, format!("no run {run}")))
    }

    /// `run.resume`: the recorded program is the source of truth.
    pub async fn resume(&self, tenant: &TenantId, run: &RunId) -> Result<RunStarted, RunRefusal> {
        // Read first: the hint of a refusal below names only a run that exists.
        let status = self.scoped(tenant, run).await?;
        self.gate(&format!("`hostd run resume {run}`"))?;
        let waiting = status.is_parked()
            && status.lease_expires_at_ms
                > self
                    .inner
                    .store
                    .now_ms()
                    .await
                    .map_err(|e| store_refusal(&e))?;
        match status.state {
            RunState::Running if waiting => {
                return Err(refused(
                    refusal_codes::CONFLICT,
                    format!(
                        "run {run} is parked at {}: its answer or its sleep's deadline wakes it",
                        status.step.as_deref().unwrap_or("a checkpoint")
                    ),
                ));
            }
            RunState::Running => {}
            RunState::NeedsAttention => {
                return Err(refused(
                    refusal_codes::STATE,
                    format!("run {run} waits for an operator: answer its attention point"),
                ));
            }
            s => {
                return Err(refused(
                    refusal_codes::STATE,
                    format!("run {run} is {s} and is never driven again"),
                ));
            }
        }
        if self
            .inner
            .store
            .run_program(run)
            .await
            .map_err(|e| store_refusal(&e))?
            .is_none()
        {
            return Err(refused(
                refusal_codes::PROGRAM_MISSING,
                format!("run {run} has no recorded program"),
            ));
        }
        let taken = self
            .inner
            .take_and_launch(&status, TakeoverRule::HeldByOrExpired(self.inner.prefix()))
            .await?;
        Ok(RunStarted {
            run_id: taken.run_id.to_string(),
            epoch: taken.epoch,
            created: false,
        })
    }

    /// `run.answer` by a caller known only by its tenant (see [`hostlink::auth::actor_of`]).
    pub async fn answer(
        &self,
        tenant: &TenantId,
        req: RunAnswerRequest,
    ) -> Result<RunAnswered, RunRefusal> {
        let actor = hostlink::auth::actor_of(tenant, None);
        self.answer_as(tenant, req, &actor).await
    }

    /// `run.answer`: an answer to one of `tenant`'s runs recorded as `answerer`'s (the link's
    /// actor, or an operator acting from the console).
    pub async fn answer_as(
        &self,
        tenant: &TenantId,
        req: RunAnswerRequest,
        answerer: &str,
    ) -> Result<RunAnswered, RunRefusal> {
        let status = self.scoped(tenant, &req.run_id).await?;
        if status.state.is_terminal() {
            return Err(refused(
                refusal_codes::STATE,
                format!(
                    "run {} is {} and takes no answers",
                    req.run_id, status.state
                ),
            ));
        }
        let store = &self.inner.store;
        let checkpoints = store
            .run_checkpoints(&req.run_id)
            .await
            .map_err(|e| store_refusal(&e))?;
        let not_open = || {
            refused(
                refusal_codes::NOT_FOUND,
                format!(
                    "run {} has no open checkpoint {}",
                    req.run_id, req.checkpoint
                ),
            )
        };
        let cp = checkpoints
            .into_iter()
            .find(|c| c.name == req.checkpoint)
            .ok_or_else(not_open)?;
        let value: serde_json::Value = serde_json::from_str(req.value.get())
            .map_err(|e| refused(refusal_codes::INVALID, e.to_string()))?;
        let program = store
            .run_program(&req.run_id)
            .await
            .map_err(|e| store_refusal(&e))?
            .ok_or_else(|| refused(refusal_codes::PROGRAM_MISSING, "no recorded program"))?;
        if let Err(violations) = check_answer(cp.kind, &program.source, &cp.name, &value) {
            return Err(refused(
                refusal_codes::INVALID,
                format!("the answer does not fit: {}", violations.join("; ")),
            ));
        }
        let recorded = store
            .answer_run(
                tenant,
                &req.run_id,
                &req.checkpoint,
                &value.to_string(),
                answerer,
            )
            .await
            .map_err(|e| store_refusal(&e))?;
        let driven = match lock(&self.inner.active).get(&req.run_id) {
            Some(a) => {
                a.wake.notify_one();
                true
            }
            None => false,
        };
        if !driven {
            // No driver waited for this answer: say here that it was answered (before a
            // takeover below, whose driver's events come after).
            let _ = self.inner.events.send(RunEvent {
                run_id: req.run_id.to_string(),
                epoch: status.epoch,
                step: req.checkpoint.clone(),
                kind: cp.kind.as_str().into(),
                phase: "answered".into(),
                outcome: None,
                duration_ms: None,
            });
        }
        let woken = (cp.kind == CheckpointKind::Attention
            && status.state == RunState::NeedsAttention)
            || (cp.kind == CheckpointKind::Ask && status.is_parked());
        if woken && self.ready() {
            // Due at once (an expired lease): take it over here if we can.
            if let Ok(Some(now)) = store.run_status(None, &req.run_id).await
                && let Err(r) = self
                    .inner
                    .take_and_launch(&now, TakeoverRule::LeaseExpired)
                    .await
            {
                tracing::debug!(code = %r.code, "an answered run was left for the scan: {}", r.message);
            }
        }
        let (fresh, answer) = match recorded {
            AnswerRecorded::Recorded(a) => (true, a),
            AnswerRecorded::Unchanged(a) => (false, a),
        };
        Ok(RunAnswered {
            run_id: req.run_id.to_string(),
            checkpoint: answer.checkpoint,
            recorded: fresh,
            answerer: answer.answerer,
        })
    }

    /// `run.status`: reads only.
    pub async fn status(&self, tenant: &TenantId, run: &RunId) -> Result<RunView, RunRefusal> {
        let status = self.scoped(tenant, run).await?;
        let store = &self.inner.store;
        let journal = store
            .run_journal(run)
            .await
            .map_err(|e| store_refusal(&e))?;
        let checkpoints = store
            .run_checkpoints(run)
            .await
            .map_err(|e| store_refusal(&e))?;
        let answers = store
            .run_answers(run)
            .await
            .map_err(|e| store_refusal(&e))?;
        let open = if status.state.is_terminal() {
            None
        } else {
            checkpoints.iter().rev().find(|c| match c.kind {
                CheckpointKind::Attention => !answers.iter().any(|a| a.checkpoint == c.name),
                _ => !journal
                    .iter()
                    .any(|e| e.step == c.name && e.kind == StepEntryKind::Result),
            })
        };
        Ok(RunView {
            run_id: status.run_id.to_string(),
            state: status.state.to_string(),
            holder: status.holder.clone(),
            epoch: status.epoch,
            step: status.step.clone(),
            created_at_ms: status.created_at_ms,
            updated_at_ms: status.updated_at_ms,
            failure: status.failure.as_ref().map(|f| RunFailureView {
                code: f.code.clone(),
                step: f.step.clone(),
                message: f.message.clone(),
            }),
            checkpoint: open.map(|c| CheckpointView {
                name: c.name.clone(),
                kind: c.kind.as_str().into(),
                question: c.question.clone(),
                schema: c
                    .schema
                    .as_deref()
                    .and_then(|s| serde_json::from_str(s).ok()),
                deadline_at_ms: c.deadline_at_ms,
            }),
            journal: journal
                .into_iter()
                .map(|e| StepView {
                    seq: e.seq,
                    step: e.step,
                    entry: e.kind.as_str().into(),
                    attempt: e.attempt,
                    outcome: e.outcome,
                    epoch: e.epoch,
                    recorded_at_ms: e.recorded_at_ms,
                    body: serde_json::from_str(&e.body).unwrap_or(serde_json::Value::Null),
                })
                .collect(),
            started_by: status.started_by.clone(),
            answers: answers
                .iter()
                .map(|a| AnswerView {
                    checkpoint: a.checkpoint.clone(),
                    answerer: a.answerer.clone(),
                    answered_at_ms: a.answered_at_ms,
                })
                .collect(),
        })
    }

    /// `run.list`: a page of the tenant's runs, oldest first, with the cursor of the next
    /// page when more follow. A cursor that is not one of the tenant's runs is `not_found`.
    pub async fn list(
        &self,
        tenant: &TenantId,
        request: &RunListRequest,
    ) -> Result<RunList, RunRefusal> {
        let page = self
            .inner
            .store
            .runs_page(
                std::slice::from_ref(tenant),
                request.after.as_ref(),
                request.page_limit() as usize,
                sessionstore::RunOrder::OldestFirst,
            )
            .await
            .map_err(|e| store_refusal(&e))?;
        Ok(RunList {
            next: page.next.map(|r| r.to_string()),
            runs: page
                .runs
                .into_iter()
                .map(|s| RunSummary {
                    run_id: s.run_id.to_string(),
                    state: s.state.to_string(),
                    step: s.step,
                    epoch: s.epoch,
                    created_at_ms: s.created_at_ms,
                })
                .collect(),
        })
    }

    /// `run.cancel`: the run ends `cancelled`; its driver is fenced out.
    pub async fn cancel(&self, tenant: &TenantId, run: &RunId) -> Result<RunView, RunRefusal> {
        self.inner
            .store
            .cancel_run(tenant, run)
            .await
            .map_err(|e| store_refusal(&e))?;
        if let Some(a) = lock(&self.inner.active).get(run) {
            a.wake.notify_one();
        }
        self.status(tenant, run).await
    }
}
