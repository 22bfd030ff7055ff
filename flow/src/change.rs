//! The vocabulary of changing one running flow from another shell: what can be asked of the
//! `up` that owns it (restart services, add services, withdraw services) and the receipt it
//! answers with.
//!
//! This module owns those data types only. It must never act on a flow: the supervisor
//! applies a change, and the control socket carries it.

use serde::{Deserialize, Serialize};

use crate::teardown::TeardownReport;

/// One change asked of a running flow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum ChangeRequest {
    /// Stop each service (its whole process group, within the teardown budget) and start it
    /// again with the same environment and ports; its dependents keep running.
    Restart { services: Vec<String> },
    /// Start each service, and whatever of its run-time closure does not run yet, in
    /// dependency order; services already running are left as they are.
    Add { services: Vec<String> },
    /// Withdraw each service from the flow. A service running services depend on is refused
    /// unless `with_dependents`, which stops those dependents first (consumers first).
    Stop {
        services: Vec<String>,
        #[serde(default)]
        with_dependents: bool,
    },
}

impl ChangeRequest {
    /// The name of the operation, as receipts and the CLI say it.
    pub fn operation(&self) -> &'static str {
        match self {
            ChangeRequest::Restart { .. } => "restart",
            ChangeRequest::Add { .. } => "add",
            ChangeRequest::Stop { .. } => "stop",
        }
    }

    /// The services the request names, in the order given.
    pub fn services(&self) -> &[String] {
        match self {
            ChangeRequest::Restart { services }
            | ChangeRequest::Add { services }
            | ChangeRequest::Stop { services, .. } => services,
        }
    }
}

/// A service a change started, as it stood once it was ready (or, for a job, completed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedService {
    pub name: String,
    pub state: String,
    pub pid: Option<i32>,
    /// (endpoint, address).
    pub endpoints: Vec<(String, String)>,
}

/// The answer to an applied change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeReport {
    /// `restart`, `add` or `stop`.
    pub operation: String,
    /// The `up` process that applied it.
    pub supervisor_pid: i32,
    /// What was stopped, consumers first, with a receipt per service.
    pub stopped: TeardownReport,
    /// What was started, in start order, each ready.
    pub started: Vec<StartedService>,
    /// Named services that already ran (or were already stopped) and were left alone.
    pub unchanged: Vec<String>,
    pub elapsed_ms: u64,
}

impl ChangeReport {
    /// Whether every stop it made ended `stopped`.
    pub fn clean(&self) -> bool {
        self.stopped.all_stopped()
    }
}
