//! The typed refusals of the flow subsystem, each with a stable machine-readable code.
//!
//! This module owns the vocabulary of failure only: it must never decide policy (whether to
//! retry, restart or tear down) and callers must never branch on the human text.

use std::path::PathBuf;

use crate::predicate::ReadinessFailure;

/// One refusal of a workspace's declarations, naming the file, the service (when the problem
/// belongs to one) and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}{problem}", file.display(), service.as_ref().map(|s| format!("service `{s}`: ")).unwrap_or_default())]
pub struct ManifestError {
    pub file: PathBuf,
    pub service: Option<String>,
    pub problem: Box<ManifestProblem>,
}

impl ManifestError {
    pub fn code(&self) -> &'static str {
        self.problem.code()
    }
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestProblem {
    #[error("cannot read the file: {0}")]
    Unreadable(String),
    #[error("not valid YAML: {0}")]
    Syntax(String),
    #[error("unknown key `{key}` in {context} (allowed: {allowed})")]
    UnknownKey {
        key: String,
        context: String,
        allowed: String,
    },
    #[error("missing required key `{key}` in {context}")]
    MissingKey { key: String, context: String },
    #[error("`{key}`: {reason}")]
    InvalidValue { key: String, reason: String },
    #[error("the service is declared more than once ({where_})")]
    DuplicateService { where_: String },
    #[error("endpoint `{endpoint}` is declared more than once")]
    DuplicateEndpoint { endpoint: String },
    #[error("depends on `{producer}` more than once")]
    DuplicateDependency { producer: String },
    #[error("depends on itself")]
    SelfDependency,
    #[error("depends on `{producer}`, which is not a service of this workspace")]
    DanglingDependency { producer: String },
    #[error(
        "a `completion` dependency on `{producer}` may not name endpoints: it waits for the job to exit 0, it never calls it"
    )]
    CompletionWithEndpoints { producer: String },
    #[error(
        "a `runtime` dependency on `{producer}`, which declares no endpoints, would wait forever; declare `kind: completion` for a job"
    )]
    RuntimeWithoutEndpoints { producer: String },
    #[error("refers to endpoint `{endpoint}` of `{producer}`, which `{producer}` does not declare")]
    UndeclaredEndpoint { producer: String, endpoint: String },
    #[error(
        "malformed endpoint reference `{reference}` in env `{key}`: expected ${{endpoint:<service>/<endpoint>}}"
    )]
    MalformedReference { key: String, reference: String },
    #[error("port {port} is fixed by both `{first}` and `{second}`")]
    DuplicatePort {
        port: u16,
        first: String,
        second: String,
    },
    #[error(
        "`{producer}` is waited on as a one-shot job (completion, by `{job_consumer}`) and as a running service (by `{service_consumer}`); it cannot be both"
    )]
    JobAndService {
        producer: String,
        job_consumer: String,
        service_consumer: String,
    },
    #[error(
        "restart policy `always` would re-run the one-shot job forever; use `on-failure` or `no`"
    )]
    AlwaysRestartedJob,
}

impl ManifestProblem {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unreadable(_) => "flow.manifest.unreadable",
            Self::Syntax(_) => "flow.manifest.syntax",
            Self::UnknownKey { .. } => "flow.manifest.unknown_key",
            Self::MissingKey { .. } => "flow.manifest.missing_key",
            Self::InvalidValue { .. } => "flow.manifest.invalid_value",
            Self::DuplicateService { .. } => "flow.manifest.duplicate_service",
            Self::DuplicateEndpoint { .. } => "flow.manifest.duplicate_endpoint",
            Self::DuplicateDependency { .. } => "flow.manifest.duplicate_dependency",
            Self::SelfDependency => "flow.manifest.self_dependency",
            Self::DanglingDependency { .. } => "flow.manifest.dangling_dependency",
            Self::CompletionWithEndpoints { .. } => "flow.manifest.completion_with_endpoints",
            Self::RuntimeWithoutEndpoints { .. } => "flow.manifest.runtime_without_endpoints",
            Self::UndeclaredEndpoint { .. } => "flow.manifest.undeclared_endpoint",
            Self::MalformedReference { .. } => "flow.manifest.malformed_reference",
            Self::DuplicatePort { .. } => "flow.manifest.duplicate_port",
            Self::JobAndService { .. } => "flow.manifest.job_and_service",
            Self::AlwaysRestartedJob => "flow.manifest.always_restarted_job",
        }
    }
}

/// A refusal of the dependency graph itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GraphError {
    #[error("{stage} dependencies have a cycle: {}", path.join(" -> "))]
    Cycle { stage: String, path: Vec<String> },
    #[error("unknown stage `{0}` (expected build or run)")]
    UnknownStage(String),
    #[error("unknown phase `{0}` (expected build, run, test or deploy)")]
    UnknownPhase(String),
    #[error("`{0}` is not a service of this graph")]
    UnknownService(String),
}

impl GraphError {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Cycle { .. } => "flow.graph.cycle",
            Self::UnknownStage(_) => "flow.graph.unknown_stage",
            Self::UnknownPhase(_) => "flow.graph.unknown_phase",
            Self::UnknownService(_) => "flow.graph.unknown_service",
        }
    }
}

/// Everything else a flow can refuse or fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FlowError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error("invalid option `{option}`: {reason}")]
    InvalidOption {
        option: &'static str,
        reason: String,
    },
    #[error("port {port} for {service}/{endpoint} is not free: {reason}")]
    PortUnavailable {
        service: String,
        endpoint: String,
        port: u16,
        reason: String,
    },
    #[error("cannot allocate a loopback port for {service}/{endpoint}: {reason}")]
    PortAllocation {
        service: String,
        endpoint: String,
        reason: String,
    },
    #[error("{service}: lifecycle failed: cannot start {command}: {reason}")]
    Spawn {
        service: String,
        command: String,
        reason: String,
    },
    #[error("`{}` is not ready: {failure}", failure.service)]
    NotReady { failure: ReadinessFailure },
    #[error("`{service}` cannot start: {reason}")]
    DependencyFailed { service: String, reason: String },
    #[error("`{service}` exited with {exit} and {reason}{}", tail_text(last_lines))]
    ServiceCrashed {
        service: String,
        exit: String,
        reason: String,
        last_lines: Vec<String>,
    },
    #[error(
        "one-shot job `{service}` exited with {exit} and {reason}{}",
        tail_text(last_lines)
    )]
    JobFailed {
        service: String,
        exit: String,
        reason: String,
        last_lines: Vec<String>,
    },
    #[error("invalid selection: {0}")]
    InvalidSelection(String),
    #[error("invalid override `{spec}`: {reason}")]
    InvalidOverride { spec: String, reason: String },
    #[error("no service `{service}` is recorded in {}", path.display())]
    NotRecorded { service: String, path: PathBuf },
    #[error("`{service}` cannot be recovered: {reason}")]
    NotRecoverable { service: String, reason: String },
    #[error(
        "process group of `{service}` changed since the preview ({reason}); nothing was signalled: preview it again"
    )]
    GroupChanged { service: String, reason: String },
    #[error("interrupted before the flow was up")]
    Interrupted,
    #[error("the workspace state folder {}: {reason}", path.display())]
    State { path: PathBuf, reason: String },
    #[error("another `hostd flow up` (pid {pid}) already runs this workspace")]
    AlreadyUp { pid: i32 },
    #[error(
        "a previous flow left {count} running process group(s) recorded in {}; run `hostd flow down` first (and `hostd flow recover <service> --preview` for a group `down` refuses)",
        path.display()
    )]
    LeftoverState { path: PathBuf, count: usize },
    #[error("nothing to start: {0}")]
    EmptySelection(String),
    #[error("the flow engine stopped unexpectedly")]
    EngineGone,
    #[error("no `hostd flow up` runs in {}: {detail}", workspace.display())]
    NotRunning { workspace: PathBuf, detail: String },
    #[error("`{service}` is not running in this flow: {hint}")]
    NotInFlow { service: String, hint: String },
    #[error(
        "{} needed by running service(s) {}: stop those first, or pass --with-dependents to stop them too (consumers first)",
        names(services, "is", "are"),
        dependents.join(", ")
    )]
    HasDependents {
        services: Vec<String>,
        dependents: Vec<String>,
    },
    #[error("the flow is still starting; change it once `hostd flow up` has said it is up")]
    StillStarting,
    #[error("`{service}` was not started: {reason}")]
    NotStarted { service: String, reason: String },
    #[error("`{service}` could not be stopped, so it was not started again: {detail}")]
    StopFailed { service: String, detail: String },
    #[error("the control socket {}: {reason}", path.display())]
    Control { path: PathBuf, reason: String },
    /// A refusal the running `up` answered with, carried over the control socket with its
    /// code.
    #[error("{message}")]
    Answered { code: String, message: String },
}

/// `` `a` is `` or `` `a`, `b` are ``.
fn names(services: &[String], one: &str, many: &str) -> String {
    let quoted: Vec<String> = services.iter().map(|s| format!("`{s}`")).collect();
    let verb = if quoted.len() == 1 { one } else { many };
    format!("{} {verb}", quoted.join(", "))
}

fn tail_text(lines: &[String]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let mut out = String::from("; its last output lines:");
    for line in lines {
        out.push_str("\n    ");
        out.push_str(line);
    }
    out
}

impl FlowError {
    pub fn code(&self) -> &str {
        match self {
            Self::Manifest(e) => e.code(),
            Self::Graph(e) => e.code(),
            Self::InvalidOption { .. } => "flow.invalid_option",
            Self::PortUnavailable { .. } => "flow.port_unavailable",
            Self::PortAllocation { .. } => "flow.port_allocation",
            Self::Spawn { .. } => "flow.spawn",
            Self::NotReady { .. } => "flow.not_ready",
            Self::DependencyFailed { .. } => "flow.dependency_failed",
            Self::ServiceCrashed { .. } => "flow.service_crashed",
            Self::JobFailed { .. } => "flow.job_failed",
            Self::InvalidSelection(_) => "flow.invalid_selection",
            Self::InvalidOverride { .. } => "flow.invalid_override",
            Self::NotRecorded { .. } => "flow.not_recorded",
            Self::NotRecoverable { .. } => "flow.recover.not_recoverable",
            Self::GroupChanged { .. } => "flow.recover.group_changed",
            Self::Interrupted => "flow.interrupted",
            Self::State { .. } => "flow.state",
            Self::AlreadyUp { .. } => "flow.already_up",
            Self::LeftoverState { .. } => "flow.leftover_state",
            Self::EmptySelection(_) => "flow.empty_selection",
            Self::EngineGone => "flow.engine_gone",
            Self::NotRunning { .. } => "flow.not_running",
            Self::NotInFlow { .. } => "flow.control.not_in_flow",
            Self::HasDependents { .. } => "flow.control.has_dependents",
            Self::StillStarting => "flow.control.starting",
            Self::NotStarted { .. } => "flow.control.not_started",
            Self::StopFailed { .. } => "flow.control.stop_failed",
            Self::Control { .. } => "flow.control.protocol",
            Self::Answered { code, .. } => code,
        }
    }
}
