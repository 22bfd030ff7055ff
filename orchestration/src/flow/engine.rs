//! The flow engine: drives each selected service through Load → Init → Start → readiness →
//! Running as the start policy allows, supervises exits against restart policies, records
//! every process group in the state file, and tears everything down in reverse layers when
//! asked, interrupted, or failed.
//!
//! The engine is one task that owns all per-service state; callers hold a [`RunningFlow`]
//! handle. It must never signal a process it did not spawn in this flow, and it must never
//! leave a started process behind when it ends, however it ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::flow::error::FlowError;
use crate::flow::events::{EventSink, FlowEvent, Step};
use crate::flow::graph::{DependencyGraph, StageGraph};
use crate::flow::logs::{FLOW_STREAM, LogWriter};
use crate::flow::manifest::{EnvSegment, ServiceManifest, Workspace};
use crate::flow::options::FlowOptions;
use crate::flow::policy::{Action, Standing, StartPolicy};
use crate::flow::ports::{self, PortMap};
use crate::flow::process::{ExitInfo, ServiceProcess, SpawnSpec};
use crate::flow::procfs::{self, Ownership, StartIdentity};
use crate::flow::readiness::{Backoff, Predicate, ReadinessFailure, ReadinessGate};
use crate::flow::restart::{RestartDecision, RestartTracker};
use crate::flow::state::{
    self, EndpointRecord, FlowState, ServiceRecord, StatePaths, WorkspaceLock,
};
use crate::flow::teardown::{self, Signalled, StopTarget, TeardownBudget, TeardownReport};

/// Which services an `up` starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// One service and its run-stage closure; `None` is every service of the workspace.
    pub target: Option<String>,
    /// Start the target's dependencies but not the target itself.
    pub only_deps: bool,
}

/// A loaded workspace with its verified graph, ready to bring up.
#[derive(Debug, Clone)]
pub struct Flow {
    workspace: Arc<Workspace>,
    graph: DependencyGraph,
    options: FlowOptions,
    paths: StatePaths,
}

/// Why a flow ended.
#[derive(Debug, Clone)]
pub enum FlowEndReason {
    /// Its handle asked it to stop (or was dropped).
    Shutdown,
    /// Its cancellation token fired (Ctrl-C, SIGTERM, `hostd flow down`).
    Cancelled,
    /// A service failed in a way no policy could absorb.
    Failed(FlowError),
}

/// How a flow ended, with the receipts of its teardown.
#[derive(Debug, Clone)]
pub struct FlowEnd {
    pub reason: FlowEndReason,
    pub teardown: TeardownReport,
}

/// An `up` that did not reach "up": why, and the teardown of what it had started.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{error}")]
pub struct UpFailure {
    pub error: FlowError,
    pub teardown: TeardownReport,
}

impl From<FlowError> for UpFailure {
    fn from(error: FlowError) -> Self {
        UpFailure {
            error,
            teardown: TeardownReport::default(),
        }
    }
}

/// One service as a status view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceStatus {
    pub name: String,
    pub state: String,
    pub pid: Option<i32>,
    pub endpoints: Vec<(String, SocketAddr)>,
    pub restarts: u32,
    pub detail: Option<String>,
}

impl Flow {
    /// Loads and validates the workspace at `root` and verifies both stage graphs.
    pub fn load(root: &Path, options: FlowOptions) -> Result<Flow, FlowError> {
        let workspace = Workspace::load(root)?;
        Flow::from_workspace(workspace, options)
    }

    pub fn from_workspace(workspace: Workspace, options: FlowOptions) -> Result<Flow, FlowError> {
        options.validate()?;
        let graph = DependencyGraph::from_workspace(&workspace)?;
        let paths = StatePaths::for_workspace(&workspace.root);
        Ok(Flow {
            workspace: Arc::new(workspace),
            graph,
            options,
            paths,
        })
    }

    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    pub fn graph(&self) -> &DependencyGraph {
        &self.graph
    }

    pub fn options(&self) -> &FlowOptions {
        &self.options
    }

    pub fn paths(&self) -> &StatePaths {
        &self.paths
    }

    /// The run-stage graph of the services `selection` starts.
    pub fn plan(&self, selection: &Selection) -> Result<StageGraph, FlowError> {
        let run = self.graph.stage(crate::flow::graph::Stage::Run);
        let Some(target) = &selection.target else {
            return Ok(run.clone());
        };
        let closure = run.restrict_to(&[target.as_str()])?;
        Ok(if selection.only_deps {
            closure.without(&[target.as_str()])
        } else {
            closure
        })
    }

    /// Brings `selection` up: returns once every selected service is running (or, for a
    /// one-shot job, completed), or fails after tearing down whatever it had started. The
    /// flow then keeps supervising until its handle stops it or `cancel` fires.
    pub async fn up(
        &self,
        selection: Selection,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Result<RunningFlow, UpFailure> {
        let plan = self.plan(&selection)?;
        if plan.nodes().is_empty() {
            return Err(FlowError::EmptySelection(match &selection.target {
                Some(t) => format!("`{t}` has no run-time dependencies to start"),
                None => "the workspace declares no services".into(),
            })
            .into());
        }
        let lock = acquire_workspace(&self.paths)?;

        // Load: ports for every selected endpoint, log files, supervisor identity.
        let ports = ports::allocate(&self.workspace, plan.nodes())?;
        let supervisor =
            procfs::identity(std::process::id() as i32).map_err(|e| FlowError::State {
                path: self.paths.state_file.clone(),
                reason: format!("cannot read this process's start identity: {e}"),
            })?;
        let mut slots = Vec::new();
        for name in plan.nodes() {
            let Some(manifest) = self.workspace.service(name) else {
                return Err(
                    FlowError::Graph(crate::flow::error::GraphError::UnknownService(name.clone()))
                        .into(),
                );
            };
            let path = self.paths.log_file(name);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| FlowError::State {
                    path: dir.to_path_buf(),
                    reason: e.to_string(),
                })?;
            }
            // Each `up` starts its logs afresh.
            std::fs::write(&path, b"").map_err(|e| FlowError::State {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let log = LogWriter::open(&path).map_err(|e| FlowError::State {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let endpoints = manifest
                .endpoints
                .iter()
                .filter_map(|e| ports.addr(name, &e.name).map(|a| (e.name.clone(), a)))
                .collect::<Vec<_>>();
            events.emit(FlowEvent::Step {
                service: name.clone(),
                step: Step::Load,
                detail: endpoints
                    .iter()
                    .map(|(n, a)| format!("{n}={a}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            });
            slots.push(Slot {
                name: name.clone(),
                manifest: manifest.clone(),
                is_job: self.workspace.is_job(name),
                phase: Phase::Pending,
                generation: 0,
                process: None,
                tracker: RestartTracker::new(manifest.restart),
                detail: None,
                log: Arc::new(log),
                endpoints,
                tasks: Vec::new(),
            });
        }

        let (internal_tx, internal_rx) = mpsc::channel(1024);
        let (command_tx, command_rx) = mpsc::channel(16);
        let (ready_tx, ready_rx) = oneshot::channel();
        let index = slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let engine = Engine {
            flow_name: self.workspace.name.clone(),
            graph: plan,
            options: self.options.clone(),
            paths: self.paths.clone(),
            ports: ports.clone(),
            events,
            slots,
            index,
            internal_tx,
            supervisor,
            started_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            started: Instant::now(),
            ready: Some(ready_tx),
            fatal: None,
            stopping: Arc::new(AtomicBool::new(false)),
            _lock: lock,
        };
        let task = tokio::spawn(engine.run(cancel, command_rx, internal_rx));
        match ready_rx.await {
            Ok(()) => Ok(RunningFlow {
                commands: command_tx,
                task,
                ports,
            }),
            Err(_) => {
                drop(command_tx);
                let end = join_end(task).await;
                let error = match end.reason {
                    FlowEndReason::Failed(e) => e,
                    FlowEndReason::Cancelled | FlowEndReason::Shutdown => FlowError::Interrupted,
                };
                Err(UpFailure {
                    error,
                    teardown: end.teardown,
                })
            }
        }
    }
}

/// Takes the workspace lock, and refuses when another `up` holds it or a crashed one left
/// live process groups behind.
fn acquire_workspace(paths: &StatePaths) -> Result<WorkspaceLock, FlowError> {
    let Some(lock) = WorkspaceLock::try_acquire(paths)? else {
        let pid = state::read_state(paths)
            .ok()
            .flatten()
            .map(|s| s.supervisor.pid)
            .unwrap_or(0);
        return Err(FlowError::AlreadyUp { pid });
    };
    if let Some(previous) = state::read_state(paths)? {
        let alive = previous
            .services
            .iter()
            .filter_map(|s| s.process.as_ref())
            .filter(|p| !matches!(procfs::prove(p), Ok(Ownership::Gone)))
            .count();
        if alive > 0 {
            return Err(FlowError::LeftoverState {
                path: paths.state_file.clone(),
                count: alive,
            });
        }
        state::remove_state(paths)?;
    }
    Ok(lock)
}

async fn join_end(task: JoinHandle<FlowEnd>) -> FlowEnd {
    task.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "the flow engine task ended abnormally");
        FlowEnd {
            reason: FlowEndReason::Failed(FlowError::EngineGone),
            teardown: TeardownReport::default(),
        }
    })
}

/// The handle of a flow that is up.
#[derive(Debug)]
pub struct RunningFlow {
    commands: mpsc::Sender<Command>,
    task: JoinHandle<FlowEnd>,
    ports: PortMap,
}

#[derive(Debug)]
enum Command {
    Status(oneshot::Sender<Vec<ServiceStatus>>),
    Shutdown,
}

impl RunningFlow {
    /// The loopback address of a selected service's endpoint.
    pub fn address(&self, service: &str, endpoint: &str) -> Option<SocketAddr> {
        self.ports.addr(service, endpoint)
    }

    /// Every service's current standing.
    pub async fn status(&self) -> Result<Vec<ServiceStatus>, FlowError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Status(tx))
            .await
            .map_err(|_| FlowError::EngineGone)?;
        rx.await.map_err(|_| FlowError::EngineGone)
    }

    /// Tears the flow down in reverse layers and returns the receipts.
    pub async fn shutdown(self) -> FlowEnd {
        let _ = self.commands.send(Command::Shutdown).await;
        join_end(self.task).await
    }

    /// Waits until the flow ends on its own (a failure no policy absorbs) or its
    /// cancellation token fires; either way it has been torn down.
    pub async fn wait(self) -> FlowEnd {
        let RunningFlow { commands, task, .. } = self;
        let end = join_end(task).await;
        drop(commands);
        end
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Pending,
    /// Spawned; waiting for readiness (or, for a job, for its exit).
    Starting,
    Running,
    Completed,
    /// A service (not a job) that exited on its own and is not restarted.
    Exited(ExitInfo),
    Restarting,
    Failed(String),
    Stopping,
    Stopped,
}

impl Phase {
    fn as_str(&self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Completed => "completed",
            Phase::Exited(_) => "exited",
            Phase::Restarting => "restarting",
            Phase::Failed(_) => "failed",
            Phase::Stopping => "stopping",
            Phase::Stopped => "stopped",
        }
    }
}

struct Slot {
    name: String,
    manifest: ServiceManifest,
    is_job: bool,
    phase: Phase,
    generation: u64,
    process: Option<Arc<ServiceProcess>>,
    tracker: RestartTracker,
    detail: Option<String>,
    log: Arc<LogWriter>,
    endpoints: Vec<(String, SocketAddr)>,
    tasks: Vec<JoinHandle<()>>,
}

impl Slot {
    fn standing(&self) -> Standing {
        match &self.phase {
            Phase::Pending => Standing::Pending,
            Phase::Starting | Phase::Restarting | Phase::Stopping => Standing::Starting,
            Phase::Running => Standing::Healthy,
            // A service without endpoints is satisfied by having started and not failed.
            Phase::Exited(exit) if exit.success() && self.manifest.endpoints.is_empty() => {
                Standing::Healthy
            }
            Phase::Exited(exit) => Standing::Failed(format!("exited with {exit}")),
            Phase::Completed => Standing::Completed,
            Phase::Failed(why) => Standing::Failed(why.clone()),
            Phase::Stopped => Standing::Failed("was stopped".into()),
        }
    }

    fn status(&self) -> ServiceStatus {
        ServiceStatus {
            name: self.name.clone(),
            state: self.phase.as_str().to_owned(),
            pid: self
                .process
                .as_ref()
                .filter(|p| p.exited().is_none())
                .map(|p| p.pid()),
            endpoints: self.endpoints.clone(),
            restarts: self.tracker.total(),
            detail: self.detail.clone(),
        }
    }
}

#[derive(Debug)]
enum Internal {
    Exited {
        slot: usize,
        generation: u64,
        exit: ExitInfo,
    },
    Readiness {
        slot: usize,
        generation: u64,
        result: Result<(), ReadinessFailure>,
    },
    RestartDue {
        slot: usize,
        generation: u64,
    },
}

struct Engine {
    flow_name: String,
    graph: StageGraph,
    options: FlowOptions,
    paths: StatePaths,
    ports: PortMap,
    events: EventSink,
    slots: Vec<Slot>,
    index: HashMap<String, usize>,
    internal_tx: mpsc::Sender<Internal>,
    supervisor: StartIdentity,
    started_at: String,
    started: Instant,
    ready: Option<oneshot::Sender<()>>,
    fatal: Option<FlowError>,
    /// Set when teardown begins: exit watchers then leave reaping to the teardown.
    stopping: Arc<AtomicBool>,
    _lock: WorkspaceLock,
}

impl Engine {
    async fn run(
        mut self,
        cancel: CancellationToken,
        mut commands: mpsc::Receiver<Command>,
        mut internal: mpsc::Receiver<Internal>,
    ) -> FlowEnd {
        self.persist();
        self.advance();
        loop {
            if let Some(error) = self.fatal.take() {
                return self.finish(FlowEndReason::Failed(error)).await;
            }
            tokio::select! {
                _ = cancel.cancelled() => return self.finish(FlowEndReason::Cancelled).await,
                command = commands.recv() => match command {
                    Some(Command::Status(reply)) => {
                        let _ = reply.send(self.slots.iter().map(Slot::status).collect());
                    }
                    Some(Command::Shutdown) | None => return self.finish(FlowEndReason::Shutdown).await,
                },
                Some(message) = internal.recv() => {
                    self.handle(message);
                    self.advance();
                    self.persist();
                }
            }
        }
    }

    fn fail(&mut self, error: FlowError) {
        if self.fatal.is_none() {
            self.fatal = Some(error);
        }
    }

    /// Asks the start policy what is due and does it; reports "up" once everything is.
    fn advance(&mut self) {
        if self.fatal.is_some() {
            return;
        }
        let actions = {
            let standings = self.standings();
            StartPolicy::new(&self.graph)
                .next(|n| standings.get(n).cloned().unwrap_or(Standing::Pending))
        };
        for action in actions {
            match action {
                Action::Start(name) => {
                    if let Some(&i) = self.index.get(&name) {
                        self.start(i);
                    }
                }
                Action::Block { service, reason } => {
                    if let Some(&i) = self.index.get(&service) {
                        self.slots[i].phase = Phase::Failed(reason.clone());
                    }
                    self.events.emit(FlowEvent::Failed {
                        service: service.clone(),
                        reason: reason.clone(),
                    });
                    self.fail(FlowError::DependencyFailed { service, reason });
                    return;
                }
            }
        }
        let standings = self.standings();
        if self.fatal.is_none()
            && self.ready.is_some()
            && StartPolicy::new(&self.graph)
                .is_up(|n| standings.get(n).cloned().unwrap_or(Standing::Pending))
        {
            self.events.emit(FlowEvent::Up {
                services: self.slots.len(),
                elapsed: self.started.elapsed(),
            });
            if let Some(ready) = self.ready.take() {
                let _ = ready.send(());
            }
        }
    }

    fn standings(&self) -> HashMap<String, Standing> {
        self.slots
            .iter()
            .map(|s| (s.name.clone(), s.standing()))
            .collect()
    }

    /// Init (resolve the environment) and Start (spawn) one service.
    fn start(&mut self, i: usize) {
        let env = self.environment(i);
        let slot = &mut self.slots[i];
        slot.generation += 1;
        let generation = slot.generation;
        self.events.emit(FlowEvent::Step {
            service: slot.name.clone(),
            step: Step::Init,
            detail: format!("{} variables", env.len()),
        });
        let program = resolve_program(&slot.manifest.command, &slot.manifest.cwd);
        let spec = SpawnSpec {
            service: slot.name.clone(),
            program,
            args: slot.manifest.args.clone(),
            env,
            cwd: slot.manifest.cwd.clone(),
            tail_lines: self.options.crash_tail_lines,
            max_line_bytes: self.options.max_line_bytes,
        };
        let process = match ServiceProcess::spawn(&spec, slot.log.clone(), &self.events) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                slot.phase = Phase::Failed(e.to_string());
                self.events.emit(FlowEvent::Failed {
                    service: slot.name.clone(),
                    reason: e.to_string(),
                });
                self.fail(e);
                return;
            }
        };
        self.events.emit(FlowEvent::Spawned {
            service: slot.name.clone(),
            pid: process.pid(),
        });
        self.events.emit(FlowEvent::Step {
            service: slot.name.clone(),
            step: Step::Start,
            detail: format!("pid {}", process.pid()),
        });
        slot.phase = Phase::Starting;
        slot.detail = None;
        slot.process = Some(process.clone());

        // Exit watcher: settles what the leader leaves behind, unless teardown owns that.
        let tx = self.internal_tx.clone();
        let stopping = self.stopping.clone();
        let grace = self.options.kill_grace;
        let watched = process.clone();
        slot.tasks.push(tokio::spawn(async move {
            let exit = watched.wait_exit().await;
            if !stopping.load(Ordering::SeqCst) {
                watched.settle(grace).await;
            }
            let _ = tx
                .send(Internal::Exited {
                    slot: i,
                    generation,
                    exit,
                })
                .await;
        }));

        if !slot.is_job {
            let gate =
                ReadinessGate::for_service(&slot.manifest, &self.ports, process.exit_watch());
            let deadline = Instant::now() + self.options.readiness_timeout;
            let backoff = Backoff {
                initial: self.options.readiness_backoff_initial,
                max: self.options.readiness_backoff_max,
            };
            let probe_timeout = self.options.probe_timeout;
            let events = self.events.clone();
            let tx = self.internal_tx.clone();
            let began = Instant::now();
            let total = self.options.readiness_timeout;
            slot.tasks.push(tokio::spawn(async move {
                let result = gate
                    .wait(deadline, backoff, probe_timeout, |failure| {
                        events.emit(FlowEvent::Waiting {
                            service: failure.service.clone(),
                            failure: failure.clone(),
                            elapsed: began.elapsed(),
                            deadline: total,
                        });
                    })
                    .await;
                let _ = tx
                    .send(Internal::Readiness {
                        slot: i,
                        generation,
                        result,
                    })
                    .await;
            }));
        }
    }

    /// The variables a service is started with: its own addresses, its producers'
    /// addresses for every edge that reaches them, then its declared `env` with references
    /// resolved (declared values win).
    fn environment(&self, i: usize) -> Vec<(String, String)> {
        let slot = &self.slots[i];
        let mut env = vec![
            ("FLOW_NAME".to_owned(), self.flow_name.clone()),
            ("FLOW_SERVICE".to_owned(), slot.name.clone()),
        ];
        for (endpoint, addr) in &slot.endpoints {
            let key = env_key(endpoint);
            env.push((format!("FLOW_ENDPOINT_{key}_ADDR"), addr.to_string()));
            env.push((format!("FLOW_ENDPOINT_{key}_PORT"), addr.port().to_string()));
        }
        if let [(_, addr)] = slot.endpoints.as_slice() {
            env.push(("PORT".to_owned(), addr.port().to_string()));
        }
        for edge in self.graph.prerequisites(&slot.name) {
            if !edge.kind.reaches_endpoints() {
                continue;
            }
            let Some(&p) = self.index.get(&edge.producer) else {
                continue;
            };
            for (endpoint, addr) in &self.slots[p].endpoints {
                if edge.endpoints.is_empty() || edge.endpoints.contains(endpoint) {
                    env.push((
                        format!(
                            "FLOW_DEP_{}_{}_ADDR",
                            env_key(&edge.producer),
                            env_key(endpoint)
                        ),
                        addr.to_string(),
                    ));
                }
            }
        }
        for (key, value) in &slot.manifest.env {
            let mut text = String::new();
            for segment in &value.segments {
                match segment {
                    EnvSegment::Text(t) => text.push_str(t),
                    EnvSegment::EndpointRef { service, endpoint } => {
                        match self.ports.addr(service, endpoint) {
                            Some(addr) => text.push_str(&addr.to_string()),
                            None => tracing::warn!(
                                consumer = %slot.name,
                                producer = %service,
                                endpoint = %endpoint,
                                "an endpoint reference has no address in this flow"
                            ),
                        }
                    }
                }
            }
            env.push((key.clone(), text));
        }
        env
    }

    fn handle(&mut self, message: Internal) {
        match message {
            Internal::Exited {
                slot,
                generation,
                exit,
            } => self.on_exit(slot, generation, exit),
            Internal::Readiness {
                slot,
                generation,
                result,
            } => self.on_readiness(slot, generation, result),
            Internal::RestartDue { slot, generation } => {
                let s = &self.slots[slot];
                if s.generation == generation && s.phase == Phase::Restarting {
                    self.start(slot);
                }
            }
        }
    }

    fn on_readiness(&mut self, i: usize, generation: u64, result: Result<(), ReadinessFailure>) {
        let slot = &mut self.slots[i];
        if slot.generation != generation || slot.phase != Phase::Starting {
            return;
        }
        match result {
            Ok(()) => {
                slot.phase = Phase::Running;
                let detail = slot
                    .endpoints
                    .iter()
                    .map(|(n, a)| format!("{n}={a}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                slot.log.write(FLOW_STREAM, "ready");
                self.events.emit(FlowEvent::Step {
                    service: slot.name.clone(),
                    step: Step::Running,
                    detail,
                });
            }
            // The exit itself is on its way and decides (restart or fail).
            Err(f) if f.predicate == Predicate::Runner => {}
            Err(failure) => {
                slot.phase = Phase::Failed(failure.to_string());
                slot.detail = Some(failure.to_string());
                self.events.emit(FlowEvent::Failed {
                    service: slot.name.clone(),
                    reason: failure.to_string(),
                });
                self.fail(FlowError::NotReady { failure });
            }
        }
    }

    fn on_exit(&mut self, i: usize, generation: u64, exit: ExitInfo) {
        let slot = &mut self.slots[i];
        if slot.generation != generation || matches!(slot.phase, Phase::Stopping | Phase::Stopped) {
            return;
        }
        let was = slot.phase.clone();
        self.events.emit(FlowEvent::Exited {
            service: slot.name.clone(),
            exit: exit.to_string(),
        });
        if slot.is_job && exit.success() {
            slot.phase = Phase::Completed;
            slot.detail = Some(format!("exited with {exit}"));
            self.events.emit(FlowEvent::Step {
                service: slot.name.clone(),
                step: Step::Completed,
                detail: format!("exited with {exit}"),
            });
            return;
        }
        let last_lines = slot.process.as_ref().map(|p| p.tail()).unwrap_or_default();
        match slot.tracker.decide(&exit, Instant::now()) {
            RestartDecision::Restart { delay, attempt } => {
                slot.phase = Phase::Restarting;
                slot.detail = Some(format!(
                    "exited with {exit}; restart #{attempt} in {delay:?}"
                ));
                slot.log.write(
                    FLOW_STREAM,
                    &format!(
                        "restart #{attempt} in {}",
                        humantime::format_duration(delay)
                    ),
                );
                self.events.emit(FlowEvent::Restarting {
                    service: slot.name.clone(),
                    attempt,
                    delay,
                });
                let tx = self.internal_tx.clone();
                slot.tasks.push(tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = tx
                        .send(Internal::RestartDue {
                            slot: i,
                            generation,
                        })
                        .await;
                }));
            }
            RestartDecision::Finished if slot.is_job => {
                // Unreachable in practice (a successful job completed above).
                slot.phase = Phase::Completed;
            }
            RestartDecision::Finished => {
                slot.phase = Phase::Exited(exit);
                slot.detail = Some(format!("exited with {exit}"));
                if was == Phase::Starting && !slot.manifest.endpoints.is_empty() {
                    let failure = ReadinessFailure {
                        service: slot.name.clone(),
                        endpoint: None,
                        predicate: Predicate::Runner,
                        last_error: format!("the process exited with {exit} before it was ready"),
                    };
                    self.events.emit(FlowEvent::Failed {
                        service: slot.name.clone(),
                        reason: failure.to_string(),
                    });
                    self.fail(FlowError::NotReady { failure });
                }
            }
            decision @ (RestartDecision::Forbidden | RestartDecision::BudgetExhausted { .. }) => {
                let reason = match decision {
                    RestartDecision::BudgetExhausted { restarts, window } => format!(
                        "exhausted its restart budget ({restarts} restarts within {})",
                        humantime::format_duration(window)
                    ),
                    _ => format!(
                        "its restart policy `{}` does not restart it",
                        slot.tracker.spec().policy.as_str()
                    ),
                };
                let what = if slot.is_job {
                    "exited with"
                } else {
                    "crashed with"
                };
                slot.phase = Phase::Failed(format!("{what} {exit}"));
                slot.detail = Some(format!("{what} {exit}; {reason}"));
                self.events.emit(FlowEvent::Failed {
                    service: slot.name.clone(),
                    reason: format!("{what} {exit}; {reason}"),
                });
                if !slot.is_job {
                    let service = slot.name.clone();
                    self.fail(FlowError::ServiceCrashed {
                        service,
                        exit: exit.to_string(),
                        reason,
                        last_lines,
                    });
                }
                // A failed job fails its consumers through the start policy.
            }
        }
    }

    /// The services this flow started a process for.
    fn participants(&self) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| s.process.is_some())
            .map(|s| s.name.clone())
            .collect()
    }

    /// Writes the state file `hostd flow down` and `status` read.
    fn persist(&self) {
        let participants = self.participants();
        let state = FlowState {
            version: state::STATE_VERSION,
            flow: self.flow_name.clone(),
            supervisor: self.supervisor.clone(),
            started_at: self.started_at.clone(),
            teardown_layers: self.graph.teardown_layers(&participants),
            services: self
                .slots
                .iter()
                .map(|s| ServiceRecord {
                    name: s.name.clone(),
                    state: s.phase.as_str().to_owned(),
                    process: s.process.as_ref().map(|p| p.identity().clone()),
                    endpoints: s
                        .endpoints
                        .iter()
                        .map(|(n, a)| EndpointRecord {
                            name: n.clone(),
                            api: s
                                .manifest
                                .endpoint(n)
                                .map(|e| e.api.as_str())
                                .unwrap_or("tcp")
                                .to_owned(),
                            address: a.to_string(),
                        })
                        .collect(),
                    restarts: s.tracker.total(),
                    detail: s.detail.clone(),
                })
                .collect(),
        };
        if let Err(e) = state::write_state(&self.paths, &state) {
            tracing::warn!(error = %e, "cannot record the flow state; `hostd flow down` from another shell will not see it");
        }
    }

    /// Tears down every service this flow started, in reverse layers, and records receipts.
    async fn finish(mut self, reason: FlowEndReason) -> FlowEnd {
        self.stopping.store(true, Ordering::SeqCst);
        for slot in &mut self.slots {
            for task in slot.tasks.drain(..) {
                task.abort();
            }
            if slot.process.is_some() {
                slot.phase = Phase::Stopping;
            }
        }
        self.persist();
        let participants = self.participants();
        let layers = self.graph.teardown_layers(&participants);
        self.events.emit(FlowEvent::TeardownStarted {
            layers: layers.len(),
        });
        let targets: Vec<Vec<Arc<dyn StopTarget>>> = layers
            .iter()
            .map(|layer| {
                layer
                    .iter()
                    .filter_map(|name| self.index.get(name))
                    .filter_map(|&i| {
                        let slot = &self.slots[i];
                        slot.process.as_ref().map(|p| {
                            Arc::new(OwnedGroup {
                                name: slot.name.clone(),
                                process: p.clone(),
                            }) as Arc<dyn StopTarget>
                        })
                    })
                    .collect()
            })
            .collect();
        let budget = TeardownBudget {
            per_layer: self.options.teardown_layer_budget,
            kill_grace: self.options.kill_grace,
        };
        let events = self.events.clone();
        let report = teardown::teardown(targets, budget, |receipt| {
            events.emit(FlowEvent::Stopped(receipt.clone()));
        })
        .await;

        let mut survivors = false;
        for slot in &mut self.slots {
            if let Some(p) = &slot.process {
                if p.group_alive() {
                    survivors = true;
                } else {
                    p.reap_if_exited();
                    slot.phase = Phase::Stopped;
                }
            }
            if let Some(r) = report.receipt(&slot.name) {
                slot.detail = Some(format!("{}: {}", r.outcome, r.detail));
            }
        }
        if let Err(e) = state::write_receipts(&self.paths, &report) {
            tracing::warn!(error = %e, "cannot record the teardown receipts");
        }
        if survivors {
            // Keep the record so `hostd flow down` can try again.
            self.persist();
        } else if let Err(e) = state::remove_state(&self.paths) {
            tracing::warn!(error = %e, "cannot remove the flow state file");
        }
        // Dropping `ready` without sending tells a waiting `up` that it failed.
        self.ready = None;
        FlowEnd {
            reason,
            teardown: report,
        }
    }
}

/// A process group this flow spawned, as a teardown target.
struct OwnedGroup {
    name: String,
    process: Arc<ServiceProcess>,
}

impl StopTarget for OwnedGroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn signal(&self, signal: Signal) -> Result<Signalled, String> {
        if !self.process.group_alive() {
            let exit = self.process.reap_if_exited();
            return Ok(Signalled::NothingLeft(match exit {
                Some(exit) => format!("had already exited with {exit}"),
                None => "had already exited".into(),
            }));
        }
        self.process.signal_group(signal).map(|()| Signalled::Sent)
    }

    fn gone(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.process.wait_exit().await;
            loop {
                if !self.process.group_alive() {
                    self.process.reap_if_exited();
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    }
}

/// A relative command with a `/` is relative to the service's working directory; a bare
/// name is looked up on `PATH`.
fn resolve_program(command: &str, cwd: &Path) -> PathBuf {
    let path = PathBuf::from(command);
    if path.is_relative() && command.contains('/') {
        cwd.join(path)
    } else {
        path
    }
}

/// `my-api` → `MY_API`.
pub fn env_key(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}
