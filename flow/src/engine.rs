//! The flow engine's front: a loaded workspace with its verified run graph, what a selection
//! of it starts (the plan), a dry run of that plan (Load and Init without processes), and
//! `up`, which hands the plan to the supervisor task and returns a handle once everything is
//! running.
//!
//! This module owns selection, planning and Load (ports, log files, environments), for an
//! `up` and for services a change adds to a running flow (it is the supervisor's
//! [`Planner`]), and binds the running flow's control socket. It must
//! never spawn or signal a process itself: the supervisor does, and only for a plan this
//! module validated.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::control::ControlSocket;
use crate::environment::{EnvContext, EnvOverride};
use crate::error::{FlowError, GraphError};
use crate::events::{EventSink, FlowEvent, Step};
use crate::graph::{DependencyGraph, Stage, StageGraph};
use crate::logs::LogWriter;
use crate::manifest::Workspace;
use crate::options::FlowOptions;
use crate::ports::{self, PortMap};
use crate::procfs::{self, Ownership};
use crate::restart::RestartSpec;
use crate::state::{self, StatePaths, WorkspaceLock};
use crate::supervisor::{self, Command, Excluded, Extension, Planner, Setup, SlotSpec, Supervisor};
pub use crate::supervisor::{FlowEnd, FlowEndReason, ServiceStatus};
use crate::teardown::TeardownReport;

pub use crate::environment::env_key;

/// Which services an `up` starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// The services to start, each with its run-stage closure (a service two of them need is
    /// started once); empty is every service of the workspace.
    pub targets: Vec<String>,
    /// Start the one target's dependencies but not the target itself (it is recorded with
    /// its reserved addresses and environment, to be run by hand).
    pub only_deps: bool,
    /// Start the one target without its dependencies: they are expected to be served from
    /// elsewhere, on their fixed ports.
    pub stand_alone: bool,
}

impl Selection {
    /// Every service of the workspace.
    pub fn all() -> Selection {
        Selection::default()
    }

    /// One service and its closure.
    pub fn service(name: &str) -> Selection {
        Selection {
            targets: vec![name.to_owned()],
            ..Selection::default()
        }
    }

    /// The service this run is named for, when there is exactly one target.
    pub fn origin(&self) -> Option<&str> {
        match self.targets.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }
}

/// A loaded workspace with its verified run graph, ready to bring up.
#[derive(Debug, Clone)]
pub struct Flow {
    workspace: Arc<Workspace>,
    graph: DependencyGraph,
    options: FlowOptions,
    paths: StatePaths,
    overrides: Vec<EnvOverride>,
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

impl From<GraphError> for UpFailure {
    fn from(error: GraphError) -> Self {
        FlowError::Graph(error).into()
    }
}

/// One service of a plan, as Load and Init leave it: what would be run, where, with what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedService {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub endpoints: Vec<(String, SocketAddr)>,
    pub env: Vec<(String, String)>,
    /// A one-shot job (some consumer waits for it to exit 0).
    pub job: bool,
    /// The `--only-deps` target: planned, never started.
    pub excluded: bool,
    pub restart: RestartSpec,
    /// `producer (kind)` for every run-stage edge it waits on.
    pub waits_for: Vec<String>,
}

/// What an `up` of a selection would do, computed without starting anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DryRun {
    /// Start layers: every service of a layer starts once the earlier layers it needs are up.
    pub layers: Vec<Vec<String>>,
    pub services: Vec<PlannedService>,
    /// (service, text): how the flow was put together, where that is not obvious.
    pub notices: Vec<(String, String)>,
}

/// The plan of one selection, with every address it knows.
struct Loaded {
    plan: StageGraph,
    ports: PortMap,
    excluded: Option<String>,
    /// The chosen ports to keep for the next run (written by `up`, never by a dry run).
    record: ports::PortRecord,
    /// Endpoints that had to leave the port earlier runs gave them.
    moves: Vec<ports::PortMove>,
}

impl Flow {
    /// Loads and validates the workspace at `root` and verifies its run-stage graph (a cycle
    /// in the build stage does not stop a run; `graph` reports it).
    pub fn load(root: &Path, options: FlowOptions) -> Result<Flow, FlowError> {
        let workspace = Workspace::load(root)?;
        Flow::from_workspace(workspace, options)
    }

    pub fn from_workspace(workspace: Workspace, options: FlowOptions) -> Result<Flow, FlowError> {
        options.validate()?;
        let graph = DependencyGraph::from_workspace_for(&workspace, &[Stage::Run])?;
        let paths = StatePaths::for_workspace(&workspace.root);
        Ok(Flow {
            workspace: Arc::new(workspace),
            graph,
            options,
            paths,
            overrides: Vec::new(),
        })
    }

    /// Adds `--set` overrides; each must name a service of the workspace.
    pub fn with_overrides(mut self, overrides: Vec<EnvOverride>) -> Result<Flow, FlowError> {
        for o in &overrides {
            if self.workspace.service(&o.service).is_none() {
                return Err(FlowError::InvalidOverride {
                    spec: format!("{}:{}=...", o.service, o.key),
                    reason: format!("`{}` is not a service of this workspace", o.service),
                });
            }
        }
        self.overrides = overrides;
        Ok(self)
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
        let run = self.graph.stage(Stage::Run);
        if selection.only_deps && selection.stand_alone {
            return Err(FlowError::InvalidSelection(
                "--only-deps and --stand-alone exclude each other".into(),
            ));
        }
        if (selection.only_deps || selection.stand_alone) && selection.origin().is_none() {
            return Err(FlowError::InvalidSelection(
                "--only-deps and --stand-alone carve one service out of its own graph: name exactly one".into(),
            ));
        }
        if selection.targets.is_empty() {
            return Ok(run.clone());
        }
        let targets: Vec<&str> = selection.targets.iter().map(String::as_str).collect();
        let closure = run.restrict_to(&targets)?;
        Ok(if selection.only_deps {
            closure.without(&targets)
        } else if selection.stand_alone {
            closure.only(&targets)?
        } else {
            closure
        })
    }

    /// Load: the plan and every address it needs. The `--only-deps` target gets its own
    /// addresses reserved; a stand-alone target gets its producers' fixed ports, and is
    /// refused if it references an address nothing would allocate.
    fn load_plan(&self, selection: &Selection) -> Result<Loaded, FlowError> {
        let plan = self.plan(selection)?;
        let excluded = if selection.only_deps {
            selection.origin().map(str::to_owned)
        } else {
            None
        };
        let mut allocated: Vec<String> = plan.nodes().to_vec();
        allocated.extend(excluded.iter().cloned());
        let recorded = ports::PortRecord::read(&self.paths.ports_file);
        let ports::Allocation {
            mut ports,
            record,
            moves,
        } = ports::allocate(&self.workspace, &allocated, &recorded)?;
        if selection.stand_alone
            && let Some(target) = selection.origin()
        {
            let producers: Vec<String> = self
                .graph
                .run_needs(target)
                .map(|e| e.producer.clone())
                .collect();
            for (service, endpoint, port) in ports::fixed(&self.workspace, &producers).iter() {
                ports.insert(service, endpoint, port);
            }
            let manifest = self
                .workspace
                .service(target)
                .ok_or_else(|| GraphError::UnknownService(target.to_owned()))?;
            let context = self.env_context(&ports);
            if let Some((key, producer, endpoint)) = context.unresolved(manifest).first() {
                return Err(FlowError::InvalidSelection(format!(
                    "`{target}` refers to {producer}/{endpoint} in `{key}`, whose port is chosen per run; with --stand-alone nothing allocates it: give that endpoint a fixed `port:` or start `{producer}` too"
                )));
            }
        }
        Ok(Loaded {
            plan,
            ports,
            excluded,
            record,
            moves,
        })
    }

    fn env_context<'a>(&'a self, ports: &'a PortMap) -> EnvContext<'a> {
        EnvContext {
            flow_name: &self.workspace.name,
            workspace: &self.workspace,
            graph: &self.graph,
            ports,
            overrides: &self.overrides,
        }
    }

    fn endpoints_of(&self, service: &str, ports: &PortMap) -> Vec<(String, SocketAddr)> {
        self.workspace
            .service(service)
            .map(|m| {
                m.endpoints
                    .iter()
                    .filter_map(|e| ports.addr(service, &e.name).map(|a| (e.name.clone(), a)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Load and Init for `selection` without starting anything: the start layers, and per
    /// service its command, addresses and environment.
    pub fn dry_run(&self, selection: &Selection) -> Result<DryRun, FlowError> {
        let loaded = self.load_plan(selection)?;
        let context = self.env_context(&loaded.ports);
        let mut services = Vec::new();
        let names = loaded
            .plan
            .nodes()
            .iter()
            .map(|n| (n, false))
            .chain(loaded.excluded.iter().map(|n| (n, true)));
        for (name, excluded) in names {
            let manifest = self
                .workspace
                .service(name)
                .ok_or_else(|| GraphError::UnknownService(name.clone()))?;
            services.push(PlannedService {
                name: name.clone(),
                program: resolve_program(&manifest.command, &manifest.cwd),
                args: manifest.args.clone(),
                cwd: manifest.cwd.clone(),
                endpoints: self.endpoints_of(name, &loaded.ports),
                env: context.resolve(manifest),
                job: self.workspace.is_job(name),
                excluded,
                restart: manifest.restart,
                waits_for: loaded
                    .plan
                    .prerequisites(name)
                    .map(|e| format!("{} ({})", e.producer, e.kind))
                    .collect(),
            });
        }
        let mut notices = self.graph.notices_for(loaded.plan.nodes());
        notices.extend(
            loaded
                .moves
                .iter()
                .map(|m| (m.service.clone(), m.describe())),
        );
        Ok(DryRun {
            layers: loaded.plan.layers()?,
            services,
            notices,
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
            return Err(FlowError::EmptySelection(match selection.origin() {
                Some(t) => format!("`{t}` has no run-time dependencies to start"),
                None => "the workspace declares no services".into(),
            })
            .into());
        }
        let lock = acquire_workspace(&self.paths)?;

        // Load: ports for every selected endpoint, environments, log files, our identity.
        let loaded = self.load_plan(&selection)?;
        let supervisor =
            procfs::identity(std::process::id() as i32).map_err(|e| FlowError::State {
                path: self.paths.state_file.clone(),
                reason: format!("cannot read this process's start identity: {e}"),
            })?;
        for (service, text) in self.graph.notices_for(loaded.plan.nodes()) {
            tracing::info!(%service, "{text}");
            events.emit(FlowEvent::Notice { service, text });
        }
        for moved in &loaded.moves {
            let text = moved.describe();
            tracing::warn!(service = %moved.service, "{text}");
            events.emit(FlowEvent::Warning {
                service: moved.service.clone(),
                text,
            });
        }
        loaded
            .record
            .write(&self.paths.ports_file)
            .map_err(|e| FlowError::State {
                path: self.paths.ports_file.clone(),
                reason: format!("cannot record the chosen ports: {e}"),
            })?;
        let context = self.env_context(&loaded.ports);
        let mut environments = HashMap::new();
        let mut slots = Vec::new();
        for name in loaded.plan.nodes() {
            let slot = self.slot_spec(name, &loaded.ports, &context)?;
            events.emit(FlowEvent::Step {
                service: name.clone(),
                step: Step::Load,
                detail: slot
                    .endpoints
                    .iter()
                    .map(|(n, a)| format!("{n}={a}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            });
            environments.insert(name.clone(), slot.env.clone());
            slots.push(slot);
        }
        let excluded = match &loaded.excluded {
            Some(name) => {
                let manifest = self
                    .workspace
                    .service(name)
                    .ok_or_else(|| GraphError::UnknownService(name.clone()))?;
                let env = context.resolve(manifest);
                environments.insert(name.clone(), env.clone());
                Some(Excluded {
                    name: name.clone(),
                    manifest: manifest.clone(),
                    endpoints: self.endpoints_of(name, &loaded.ports),
                    env,
                })
            }
            None => None,
        };

        // Under the lock, so a socket file left there is a dead `up`'s. Without it the flow
        // still runs; only changes from another shell are refused.
        let mut control = match ControlSocket::bind(&self.paths) {
            Ok(socket) => Some(socket),
            Err(e) => {
                tracing::warn!(error = %e, "no control socket");
                events.emit(FlowEvent::Warning {
                    service: self.workspace.name.clone(),
                    text: format!(
                        "{e}; `hostd flow restart`, `stop` and `up <service>` from another shell will refuse"
                    ),
                });
                None
            }
        };
        let (command_tx, command_rx) = mpsc::channel(16);
        if let Some(socket) = &mut control {
            socket.serve(command_tx.downgrade());
        }
        let (ready_tx, ready_rx) = oneshot::channel();
        let engine = Supervisor::new(Setup {
            flow_name: self.workspace.name.clone(),
            graph: loaded.plan,
            options: self.options.clone(),
            paths: self.paths.clone(),
            ports: loaded.ports.clone(),
            events,
            slots,
            excluded,
            supervisor,
            started_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
            ready: ready_tx,
            lock,
            planner: Box::new(self.clone()),
        });
        let task = tokio::spawn(async move {
            let end = engine.run(cancel, command_rx).await;
            drop(control);
            end
        });
        match ready_rx.await {
            Ok(()) => Ok(RunningFlow {
                commands: command_tx,
                task,
                ports: loaded.ports,
                environments,
            }),
            Err(_) => {
                drop(command_tx);
                let end = supervisor::join_end(task).await;
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

    /// Load and Init of one service: its log (started afresh), its addresses, its
    /// environment and its program.
    fn slot_spec(
        &self,
        name: &str,
        ports: &PortMap,
        context: &EnvContext<'_>,
    ) -> Result<SlotSpec, FlowError> {
        let manifest = self
            .workspace
            .service(name)
            .ok_or_else(|| GraphError::UnknownService(name.to_owned()))?;
        Ok(SlotSpec {
            name: name.to_owned(),
            manifest: manifest.clone(),
            is_job: self.workspace.is_job(name),
            log: Arc::new(self.fresh_log(name)?),
            endpoints: self.endpoints_of(name, ports),
            env: context.resolve(manifest),
            program: resolve_program(&manifest.command, &manifest.cwd),
        })
    }

    /// Each `up` starts a service's log afresh.
    fn fresh_log(&self, service: &str) -> Result<LogWriter, FlowError> {
        let path = self.paths.log_file(service);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| FlowError::State {
                path: dir.to_path_buf(),
                reason: e.to_string(),
            })?;
        }
        std::fs::write(&path, b"").map_err(|e| FlowError::State {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        LogWriter::open(&path).map_err(|e| FlowError::State {
            path: path.clone(),
            reason: e.to_string(),
        })
    }
}

impl Planner for Flow {
    fn knows(&self, service: &str) -> bool {
        self.workspace.service(service).is_some()
    }

    fn closure(&self, targets: &[String]) -> Result<Vec<String>, FlowError> {
        let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
        Ok(self
            .graph
            .stage(Stage::Run)
            .restrict_to(&targets)?
            .nodes()
            .to_vec())
    }

    fn extend(
        &self,
        current: &StageGraph,
        ports: &PortMap,
        joining: &[String],
    ) -> Result<Extension, FlowError> {
        let mut members: Vec<&str> = current.nodes().iter().map(String::as_str).collect();
        members.extend(joining.iter().map(String::as_str));
        let graph = self.graph.stage(Stage::Run).only(&members)?;
        // A joining service whose addresses the flow already holds (the `--only-deps`
        // target, a stand-alone target's producer on its fixed port) keeps them.
        let needing: Vec<String> = joining
            .iter()
            .filter(|name| {
                self.workspace.service(name).is_some_and(|m| {
                    m.endpoints
                        .iter()
                        .any(|e| ports.port(name, &e.name).is_none())
                })
            })
            .cloned()
            .collect();
        let recorded = ports::PortRecord::read(&self.paths.ports_file);
        let held: BTreeSet<u16> = ports.iter().map(|(_, _, port)| port).collect();
        let allocation = ports::allocate_beside(&self.workspace, &needing, &recorded, &held)?;
        let mut merged = ports.clone();
        for (service, endpoint, port) in allocation.ports.iter() {
            merged.insert(service, endpoint, port);
        }
        allocation
            .record
            .write(&self.paths.ports_file)
            .map_err(|e| FlowError::State {
                path: self.paths.ports_file.clone(),
                reason: format!("cannot record the chosen ports: {e}"),
            })?;
        let context = self.env_context(&merged);
        let slots = joining
            .iter()
            .map(|name| self.slot_spec(name, &merged, &context))
            .collect::<Result<Vec<_>, _>>()?;
        let warnings = allocation
            .moves
            .iter()
            .map(|m| (m.service.clone(), m.describe()))
            .collect();
        Ok(Extension {
            graph,
            ports: merged,
            slots,
            warnings,
        })
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

/// The handle of a flow that is up.
#[derive(Debug)]
pub struct RunningFlow {
    commands: mpsc::Sender<Command>,
    task: JoinHandle<FlowEnd>,
    ports: PortMap,
    environments: HashMap<String, Vec<(String, String)>>,
}

impl RunningFlow {
    /// The loopback address of a selected service's endpoint.
    pub fn address(&self, service: &str, endpoint: &str) -> Option<SocketAddr> {
        self.ports.addr(service, endpoint)
    }

    /// The variables the flow started `service` with (for the `--only-deps` target: the ones
    /// it would be started with).
    pub fn environment(&self, service: &str) -> Option<&[(String, String)]> {
        self.environments.get(service).map(Vec::as_slice)
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
        supervisor::join_end(self.task).await
    }

    /// Waits until the flow ends on its own (a failure no policy absorbs) or its
    /// cancellation token fires; either way it has been torn down.
    pub async fn wait(self) -> FlowEnd {
        let RunningFlow { commands, task, .. } = self;
        let end = supervisor::join_end(task).await;
        drop(commands);
        end
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
