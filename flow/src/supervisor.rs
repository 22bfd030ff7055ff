//! The supervisor task of one `up`: drives each selected service through Init → Start →
//! readiness (or, for a one-shot job, its exit) → Running as the start policy allows, decides
//! about exits and failed starts against restart policies, records every process group in the
//! state file the moment it exists, and tears everything down in reverse layers when asked,
//! interrupted, or failed.
//!
//! The task owns all per-service state and reports how the flow ended ([`FlowEnd`]) and how
//! each service stands ([`ServiceStatus`]); the engine module builds it and hands callers a
//! handle. Changes asked over the control socket (restart, add, withdraw services) are applied
//! here too, by the `changes` submodule, so one task stays the only owner of the running
//! services. It must never signal a process it did not spawn in this flow, must never leave a
//! started process unrecorded while anything waits on it, and must never leave a started
//! process behind when it ends, however it ends.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::change::{ChangeReport, ChangeRequest};
use crate::error::FlowError;
use crate::events::{EventSink, FlowEvent, Step};
use crate::graph::StageGraph;
use crate::logs::{FLOW_STREAM, LogWriter};
use crate::manifest::ServiceManifest;
use crate::options::FlowOptions;
use crate::policy::{Action, Standing, StartPolicy};
use crate::ports::{self, PortMap};
use crate::predicate::{Predicate, ReadinessFailure};
use crate::process::{ExitInfo, ServiceProcess, SpawnSpec};
use crate::procfs::StartIdentity;
use crate::readiness::{ProbePacing, ReadinessGate};
use crate::restart::{RestartDecision, RestartTracker};
use crate::sockets;
use crate::state::{
    self, EndpointRecord, FlowState, RecordedBudget, ServiceRecord, StatePaths, WorkspaceLock,
};
use crate::teardown::{
    self, Signalled, StopTarget, TeardownBudget, TeardownOperation, TeardownReport,
};

mod changes;

pub(crate) use changes::{Extension, Planner};

/// Why a flow ended.
#[derive(Debug, Clone)]
pub enum FlowEndReason {
    /// Its handle asked it to stop (or was dropped).
    Shutdown,
    /// Its cancellation token fired (Ctrl-C, SIGTERM, SIGHUP, `hostd flow down`).
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

#[derive(Debug)]
pub(crate) enum Command {
    Status(oneshot::Sender<Vec<ServiceStatus>>),
    Shutdown,
    /// A change asked over the control socket; answered once applied (for a restart or an
    /// add: once what it started is ready).
    Change {
        request: ChangeRequest,
        reply: oneshot::Sender<Result<ChangeReport, FlowError>>,
    },
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

/// One selected service, as the supervisor is given it.
pub(crate) struct SlotSpec {
    pub name: String,
    pub manifest: ServiceManifest,
    pub is_job: bool,
    pub log: Arc<LogWriter>,
    pub endpoints: Vec<(String, SocketAddr)>,
    /// What it is started with (see `environment`).
    pub env: Vec<(String, String)>,
    /// The program, resolved against its working directory.
    pub program: std::path::PathBuf,
}

struct Slot {
    spec: SlotSpec,
    phase: Phase,
    generation: u64,
    process: Option<Arc<ServiceProcess>>,
    tracker: RestartTracker,
    detail: Option<String>,
    tasks: Vec<JoinHandle<()>>,
}

impl Slot {
    fn new(spec: SlotSpec) -> Slot {
        Slot {
            tracker: RestartTracker::new(spec.manifest.restart),
            spec,
            phase: Phase::Pending,
            generation: 0,
            process: None,
            detail: None,
            tasks: Vec::new(),
        }
    }

    fn standing(&self) -> Standing {
        match &self.phase {
            Phase::Pending => Standing::Pending,
            Phase::Starting | Phase::Restarting | Phase::Stopping => Standing::Starting,
            Phase::Running => Standing::Healthy,
            // A service without endpoints is satisfied by having started and not failed.
            Phase::Exited(exit) if exit.success() && self.spec.manifest.endpoints.is_empty() => {
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
            name: self.spec.name.clone(),
            state: self.phase.as_str().to_owned(),
            pid: self
                .process
                .as_ref()
                .filter(|p| p.exited().is_none())
                .map(|p| p.pid()),
            endpoints: self.spec.endpoints.clone(),
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

/// The `--only-deps` target: never started, but recorded with its reserved addresses and the
/// environment it would be started with, so the user can run it themselves.
pub(crate) struct Excluded {
    pub name: String,
    pub manifest: ServiceManifest,
    pub endpoints: Vec<(String, SocketAddr)>,
    pub env: Vec<(String, String)>,
}

/// Everything the supervisor is started with.
pub(crate) struct Setup {
    pub flow_name: String,
    pub graph: StageGraph,
    pub options: FlowOptions,
    pub paths: StatePaths,
    pub ports: PortMap,
    pub events: EventSink,
    pub slots: Vec<SlotSpec>,
    pub excluded: Option<Excluded>,
    pub supervisor: StartIdentity,
    pub started_at: String,
    pub ready: oneshot::Sender<()>,
    pub lock: WorkspaceLock,
    /// Load for services a change adds to the running flow.
    pub planner: Box<dyn Planner>,
}

pub(crate) struct Supervisor {
    flow_name: String,
    graph: StageGraph,
    options: FlowOptions,
    paths: StatePaths,
    ports: PortMap,
    events: EventSink,
    slots: Vec<Slot>,
    index: HashMap<String, usize>,
    excluded: Option<Excluded>,
    internal_tx: mpsc::Sender<Internal>,
    internal_rx: Option<mpsc::Receiver<Internal>>,
    supervisor: StartIdentity,
    started_at: String,
    started: Instant,
    ready: Option<oneshot::Sender<()>>,
    up: bool,
    fatal: Option<FlowError>,
    /// Set when teardown begins: exit watchers then leave reaping to the teardown.
    stopping: Arc<AtomicBool>,
    planner: Box<dyn Planner>,
    /// Changes waiting for what they started to be ready.
    awaiting: Vec<changes::Awaiting>,
    _lock: WorkspaceLock,
}

impl Supervisor {
    pub(crate) fn new(setup: Setup) -> Supervisor {
        let (internal_tx, internal_rx) = mpsc::channel(1024);
        let index = setup
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let slots = setup.slots.into_iter().map(Slot::new).collect();
        Supervisor {
            flow_name: setup.flow_name,
            graph: setup.graph,
            options: setup.options,
            paths: setup.paths,
            ports: setup.ports,
            events: setup.events,
            slots,
            index,
            excluded: setup.excluded,
            internal_tx,
            internal_rx: Some(internal_rx),
            supervisor: setup.supervisor,
            started_at: setup.started_at,
            started: Instant::now(),
            ready: Some(setup.ready),
            up: false,
            fatal: None,
            stopping: Arc::new(AtomicBool::new(false)),
            planner: setup.planner,
            awaiting: Vec::new(),
            _lock: setup.lock,
        }
    }

    pub(crate) async fn run(
        mut self,
        cancel: CancellationToken,
        mut commands: mpsc::Receiver<Command>,
    ) -> FlowEnd {
        let Some(mut internal) = self.internal_rx.take() else {
            return self
                .finish(FlowEndReason::Failed(FlowError::EngineGone))
                .await;
        };
        self.persist();
        self.advance();
        self.persist();
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
                    Some(Command::Change { request, reply }) => {
                        self.change(request, reply).await;
                        self.advance();
                        self.persist();
                        self.answer_awaiting();
                    }
                    Some(Command::Shutdown) | None => return self.finish(FlowEndReason::Shutdown).await,
                },
                Some(message) = internal.recv() => {
                    self.handle(message);
                    self.advance();
                    self.persist();
                    self.answer_awaiting();
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
            if self.fatal.is_some() {
                return;
            }
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
            self.up = true;
            // Recorded before the caller hears it: whoever reads the state after `up`
            // returned sees the flow up.
            self.persist();
            if let Some(ready) = self.ready.take() {
                let _ = ready.send(());
            }
        }
    }

    fn standings(&self) -> HashMap<String, Standing> {
        self.slots
            .iter()
            .map(|s| (s.spec.name.clone(), s.standing()))
            .collect()
    }

    /// Init (the environment is resolved at Load) and Start one service: re-check its ports,
    /// spawn it, record its process group, then watch its exit and its readiness.
    fn start(&mut self, i: usize) {
        let generation = {
            let slot = &mut self.slots[i];
            slot.generation += 1;
            self.events.emit(FlowEvent::Step {
                service: slot.spec.name.clone(),
                step: Step::Init,
                detail: format!("{} variables", slot.spec.env.len()),
            });
            slot.generation
        };
        // A port free at Load may have been taken since (during a long job, say): starting a
        // service over a squatter would make the squatter look like it.
        let taken = self.slots[i]
            .spec
            .endpoints
            .iter()
            .find_map(|(endpoint, addr)| {
                ports::check_free(addr.port())
                    .err()
                    .map(|reason| (endpoint.clone(), addr.port(), reason))
            });
        if let Some((endpoint, port, reason)) = taken {
            let error = FlowError::PortUnavailable {
                service: self.slots[i].spec.name.clone(),
                endpoint,
                port,
                reason,
            };
            return self.start_failed(i, generation, error);
        }
        let spawned = {
            let slot = &self.slots[i];
            let spec = SpawnSpec {
                service: slot.spec.name.clone(),
                program: slot.spec.program.clone(),
                args: slot.spec.manifest.args.clone(),
                env: slot.spec.env.clone(),
                cwd: slot.spec.manifest.cwd.clone(),
                tail_lines: self.options.crash_tail_lines,
                max_line_bytes: self.options.max_line_bytes,
            };
            ServiceProcess::spawn(&spec, slot.spec.log.clone(), &self.events)
        };
        let process = match spawned {
            Ok(p) => Arc::new(p),
            Err(e) => return self.start_failed(i, generation, e),
        };
        {
            let slot = &mut self.slots[i];
            slot.phase = Phase::Starting;
            slot.detail = None;
            slot.process = Some(process.clone());
        }
        // Recorded before anything waits on it (and before anyone is told it exists): a crash
        // of this `up` from here on leaves a group `hostd flow down` can find.
        self.persist();
        self.events.emit(FlowEvent::Spawned {
            service: self.slots[i].spec.name.clone(),
            pid: process.pid(),
        });
        self.events.emit(FlowEvent::Step {
            service: self.slots[i].spec.name.clone(),
            step: Step::Start,
            detail: format!("pid {}", process.pid()),
        });

        // Exit watcher: settles what the leader leaves behind, unless teardown owns that.
        let tx = self.internal_tx.clone();
        let stopping = self.stopping.clone();
        let grace = self.options.kill_grace;
        let watched = process.clone();
        let exit_watcher = tokio::spawn(async move {
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
        });
        let waiter = if self.slots[i].spec.is_job {
            self.watch_job(i, generation, &process)
        } else {
            self.watch_readiness(i, generation, &process)
        };
        self.slots[i].tasks.extend([exit_watcher, waiter]);
    }

    /// A start that failed before a process ran: the restart policy decides, as for a crash.
    fn start_failed(&mut self, i: usize, generation: u64, error: FlowError) {
        let reason = error.to_string();
        let slot = &mut self.slots[i];
        slot.spec.log.write(FLOW_STREAM, &reason);
        match slot.tracker.decide_start_failure(Instant::now()) {
            RestartDecision::Restart { delay, attempt } => {
                slot.phase = Phase::Restarting;
                slot.detail = Some(format!("{reason}; restart #{attempt} in {delay:?}"));
                self.events.emit(FlowEvent::Warning {
                    service: slot.spec.name.clone(),
                    text: reason,
                });
                self.events.emit(FlowEvent::Restarting {
                    service: slot.spec.name.clone(),
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
            decision => {
                let note = match decision {
                    RestartDecision::BudgetExhausted { restarts, window } => format!(
                        "; it exhausted its restart budget ({restarts} restarts within {})",
                        humantime::format_duration(window)
                    ),
                    _ => String::new(),
                };
                slot.phase = Phase::Failed(format!("{reason}{note}"));
                slot.detail = Some(format!("{reason}{note}"));
                self.events.emit(FlowEvent::Failed {
                    service: slot.spec.name.clone(),
                    reason: format!("{reason}{note}"),
                });
                self.fail(error);
            }
        }
    }

    /// The readiness gate of one start of a service, reporting to the supervisor.
    fn watch_readiness(
        &self,
        i: usize,
        generation: u64,
        process: &Arc<ServiceProcess>,
    ) -> JoinHandle<()> {
        let gate = ReadinessGate::for_service(
            &self.slots[i].spec.manifest,
            &self.ports,
            process.exit_watch(),
            Some(process.pgid()),
        );
        let deadline = Instant::now() + self.options.readiness_timeout;
        let pacing = ProbePacing {
            initial: self.options.readiness_backoff_initial,
            max: self.options.readiness_backoff_max,
        };
        let probe_timeout = self.options.probe_timeout;
        let events = self.events.clone();
        let tx = self.internal_tx.clone();
        let total = self.options.readiness_timeout;
        tokio::spawn(async move {
            let began = Instant::now();
            let result = gate
                .wait(deadline, pacing, probe_timeout, |failure| {
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
        })
    }

    /// A one-shot job is not probed: its exit decides. This watch only bounds the wait by
    /// the readiness deadline and says, while it lasts, what the flow is waiting for.
    fn watch_job(
        &self,
        i: usize,
        generation: u64,
        process: &Arc<ServiceProcess>,
    ) -> JoinHandle<()> {
        let service = self.slots[i].spec.name.clone();
        let pid = process.pid();
        let mut exit = process.exit_watch();
        let total = self.options.readiness_timeout;
        let deadline = Instant::now() + total;
        let events = self.events.clone();
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            let failure = |last_error: String| ReadinessFailure {
                service: service.clone(),
                endpoint: None,
                predicate: Predicate::Completion,
                last_error,
            };
            loop {
                if exit.borrow().is_some() {
                    return;
                }
                let now = Instant::now();
                if now >= deadline {
                    let result = Err(failure(format!(
                        "still running (pid {pid}) when its {} deadline passed",
                        humantime::format_duration(total)
                    )));
                    let _ = tx
                        .send(Internal::Readiness {
                            slot: i,
                            generation,
                            result,
                        })
                        .await;
                    return;
                }
                let pause = Duration::from_secs(1).min(deadline - now);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    changed = exit.changed() => if changed.is_err() { return },
                }
                if exit.borrow().is_none() {
                    events.emit(FlowEvent::Waiting {
                        service: service.clone(),
                        failure: failure(format!("still running (pid {pid})")),
                        elapsed: began.elapsed(),
                        deadline: total,
                    });
                }
            }
        })
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
                    .spec
                    .endpoints
                    .iter()
                    .map(|(n, a)| format!("{n}={a}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                slot.spec.log.write(FLOW_STREAM, "ready");
                self.events.emit(FlowEvent::Step {
                    service: slot.spec.name.clone(),
                    step: Step::Running,
                    detail,
                });
                if let Some(process) = &slot.process
                    && !slot.spec.endpoints.is_empty()
                {
                    let check = warn_off_loopback(
                        slot.spec.name.clone(),
                        slot.spec.endpoints.clone(),
                        process.pgid(),
                        slot.spec.log.clone(),
                        self.events.clone(),
                    );
                    slot.tasks.push(tokio::spawn(check));
                }
            }
            // The exit itself is on its way and decides (restart or fail).
            Err(f) if f.predicate == Predicate::Runner => {}
            Err(failure) => {
                slot.phase = Phase::Failed(failure.to_string());
                slot.detail = Some(failure.to_string());
                self.events.emit(FlowEvent::Failed {
                    service: slot.spec.name.clone(),
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
            service: slot.spec.name.clone(),
            exit: exit.to_string(),
        });
        if slot.spec.is_job && exit.success() {
            slot.phase = Phase::Completed;
            slot.detail = Some(format!("exited with {exit}"));
            self.events.emit(FlowEvent::Step {
                service: slot.spec.name.clone(),
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
                slot.spec.log.write(
                    FLOW_STREAM,
                    &format!(
                        "restart #{attempt} in {}",
                        humantime::format_duration(delay)
                    ),
                );
                self.events.emit(FlowEvent::Restarting {
                    service: slot.spec.name.clone(),
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
            RestartDecision::Finished if slot.spec.is_job => {
                // Unreachable in practice (a successful job completed above).
                slot.phase = Phase::Completed;
            }
            RestartDecision::Finished => {
                slot.phase = Phase::Exited(exit);
                slot.detail = Some(format!("exited with {exit}"));
                if was == Phase::Starting && !slot.spec.manifest.endpoints.is_empty() {
                    let failure = ReadinessFailure {
                        service: slot.spec.name.clone(),
                        endpoint: None,
                        predicate: Predicate::Runner,
                        last_error: format!("the process exited with {exit} before it was ready"),
                    };
                    self.events.emit(FlowEvent::Failed {
                        service: slot.spec.name.clone(),
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
                let what = if slot.spec.is_job {
                    "exited with"
                } else {
                    "crashed with"
                };
                slot.phase = Phase::Failed(format!("{what} {exit}"));
                slot.detail = Some(format!("{what} {exit}; {reason}"));
                self.events.emit(FlowEvent::Failed {
                    service: slot.spec.name.clone(),
                    reason: format!("{what} {exit}; {reason}"),
                });
                let service = slot.spec.name.clone();
                let is_job = slot.spec.is_job;
                // A failed job can never complete: the flow fails with it, whether or not a
                // consumer of it was selected.
                self.fail(if is_job {
                    FlowError::JobFailed {
                        service,
                        exit: exit.to_string(),
                        reason,
                        last_lines,
                    }
                } else {
                    FlowError::ServiceCrashed {
                        service,
                        exit: exit.to_string(),
                        reason,
                        last_lines,
                    }
                });
            }
        }
    }

    /// The services this flow started a process for.
    fn participants(&self) -> Vec<String> {
        self.slots
            .iter()
            .filter(|s| s.process.is_some())
            .map(|s| s.spec.name.clone())
            .collect()
    }

    fn endpoint_records(
        manifest: &ServiceManifest,
        endpoints: &[(String, SocketAddr)],
    ) -> Vec<EndpointRecord> {
        endpoints
            .iter()
            .map(|(n, a)| {
                let declared = manifest.endpoint(n);
                EndpointRecord {
                    name: n.clone(),
                    api: declared.map(|e| e.api.as_str()).unwrap_or("tcp").to_owned(),
                    address: a.to_string(),
                    health: declared.and_then(|e| e.health.clone()),
                    tls: declared.is_some_and(|e| e.tls),
                }
            })
            .collect()
    }

    /// Writes the state file `hostd flow down`, `status` and `env` read.
    fn persist(&self) {
        let participants = self.participants();
        let mut services: Vec<ServiceRecord> = self
            .slots
            .iter()
            .map(|s| ServiceRecord {
                name: s.spec.name.clone(),
                state: s.phase.as_str().to_owned(),
                process: s.process.as_ref().map(|p| p.identity().clone()),
                endpoints: Self::endpoint_records(&s.spec.manifest, &s.spec.endpoints),
                restarts: s.tracker.total(),
                detail: s.detail.clone(),
                env: s.spec.env.clone(),
            })
            .collect();
        if let Some(x) = &self.excluded {
            services.push(ServiceRecord {
                name: x.name.clone(),
                state: "excluded".into(),
                process: None,
                endpoints: Self::endpoint_records(&x.manifest, &x.endpoints),
                restarts: 0,
                detail: Some(
                    "not started (--only-deps): run it yourself with `hostd flow env`".into(),
                ),
                env: x.env.clone(),
            });
        }
        let state = FlowState {
            version: state::STATE_VERSION,
            flow: self.flow_name.clone(),
            supervisor: self.supervisor.clone(),
            started_at: self.started_at.clone(),
            teardown_layers: self.graph.teardown_layers(&participants),
            services,
            budget: Some(RecordedBudget {
                teardown_layer_budget_ms: millis(self.options.teardown_layer_budget),
                kill_grace_ms: millis(self.options.kill_grace),
            }),
            up: self.up,
        };
        if let Err(e) = state::write_state(&self.paths, &state) {
            tracing::warn!(error = %e, "cannot record the flow state; `hostd flow down` from another shell will not see it");
        }
    }

    /// Tears down every service this flow started, in reverse layers, and records receipts.
    async fn finish(mut self, reason: FlowEndReason) -> FlowEnd {
        self.stopping.store(true, Ordering::SeqCst);
        self.abandon_awaiting(&reason);
        for slot in &mut self.slots {
            for task in slot.tasks.drain(..) {
                task.abort();
            }
            if slot.process.is_some() {
                slot.phase = Phase::Stopping;
            }
        }
        self.up = false;
        self.persist();
        let participants = self.participants();
        let layers = self.graph.teardown_layers(&participants);
        self.events.emit(FlowEvent::TeardownStarted {
            layers: layers.len(),
        });
        let targets = self.owned_groups(&layers);
        let budget = TeardownBudget {
            per_layer: self.options.teardown_layer_budget,
            kill_grace: self.options.kill_grace,
        };
        let operation = match &reason {
            FlowEndReason::Shutdown => TeardownOperation::Shutdown,
            FlowEndReason::Cancelled => TeardownOperation::Interrupt,
            FlowEndReason::Failed(_) => TeardownOperation::Failure,
        };
        let events = self.events.clone();
        let report = teardown::teardown(operation, targets, budget, |receipt| {
            events.emit(FlowEvent::Stopped(receipt.clone()));
        })
        .await;

        let mut survivors = false;
        for slot in &mut self.slots {
            let lingering = report.receipt(&slot.spec.name).is_some_and(|r| r.lingering);
            if let Some(p) = &slot.process {
                if lingering || p.group_alive() {
                    survivors = true;
                } else {
                    p.reap_if_exited();
                    slot.phase = Phase::Stopped;
                }
            }
            if let Some(r) = report.receipt(&slot.spec.name) {
                slot.detail = Some(format!("{}: {}", r.outcome, r.detail));
            }
        }
        if let Err(e) = state::write_receipts(&self.paths, &report) {
            tracing::warn!(error = %e, "cannot record the teardown receipts");
        }
        if survivors {
            // Keep the record so `hostd flow down` (or `recover`) can try again.
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Once a service runs: warns when one of its own processes listens on an endpoint's port
/// beyond loopback (the wildcard or an outside address), which makes a development service
/// reachable from the network.
async fn warn_off_loopback(
    service: String,
    endpoints: Vec<(String, SocketAddr)>,
    pgid: i32,
    log: Arc<LogWriter>,
    events: EventSink,
) {
    for (endpoint, addr) in endpoints {
        let outside = sockets::group_listeners_off_loopback(addr.port(), pgid);
        if let Some(first) = outside.first() {
            let text = format!(
                "{endpoint} listens on {first}, beyond loopback: other machines can reach it; bind {addr} instead"
            );
            log.write(FLOW_STREAM, &text);
            events.emit(FlowEvent::Warning {
                service: service.clone(),
                text,
            });
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

pub(crate) fn join_end(task: JoinHandle<FlowEnd>) -> BoxFuture<'static, FlowEnd> {
    Box::pin(async move {
        task.await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the flow engine task ended abnormally");
            FlowEnd {
                reason: FlowEndReason::Failed(FlowError::EngineGone),
                teardown: TeardownReport::default(),
            }
        })
    })
}
