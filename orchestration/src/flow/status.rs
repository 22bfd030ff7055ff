//! The status of a workspace's recorded flow as seen from any shell: what the state file
//! says, checked against what `/proc` says now.
//!
//! This module owns that read-only view. It must never signal anything or change the state
//! folder.

use std::path::Path;

use crate::flow::error::FlowError;
use crate::flow::procfs::{self, Ownership};
use crate::flow::state::{self, StatePaths};

/// One recorded service, with its liveness proven now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedService {
    pub name: String,
    /// As recorded; `gone` when the record says it runs but its process no longer does.
    pub state: String,
    /// The pid, when the recorded process is proven alive now.
    pub pid: Option<i32>,
    pub endpoints: Vec<(String, String)>,
    pub restarts: u32,
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowStatus {
    pub flow: String,
    pub supervisor_pid: i32,
    /// Whether the `up` that recorded this state still runs.
    pub supervisor_alive: bool,
    pub started_at: String,
    pub services: Vec<RecordedService>,
}

/// The recorded flow of the workspace at `root`, if any.
pub fn status(root: &Path) -> Result<Option<FlowStatus>, FlowError> {
    let paths = StatePaths::for_workspace(root);
    let Some(recorded) = state::read_state(&paths)? else {
        return Ok(None);
    };
    let proven = |identity: &procfs::StartIdentity| {
        matches!(procfs::prove(identity), Ok(Ownership::Proven { .. }))
    };
    let supervisor_alive = proven(&recorded.supervisor);
    let services = recorded
        .services
        .iter()
        .map(|s| {
            let alive = s.process.as_ref().is_some_and(proven);
            let running_state = matches!(s.state.as_str(), "starting" | "running" | "stopping");
            RecordedService {
                name: s.name.clone(),
                state: if running_state && !alive {
                    "gone".into()
                } else {
                    s.state.clone()
                },
                pid: if alive {
                    s.process.as_ref().map(|p| p.pid)
                } else {
                    None
                },
                endpoints: s
                    .endpoints
                    .iter()
                    .map(|e| (e.name.clone(), e.address.clone()))
                    .collect(),
                restarts: s.restarts,
                detail: s.detail.clone(),
            }
        })
        .collect();
    Ok(Some(FlowStatus {
        flow: recorded.flow,
        supervisor_pid: recorded.supervisor.pid,
        supervisor_alive,
        started_at: recorded.started_at,
        services,
    }))
}
