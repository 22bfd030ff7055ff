//! The status of a workspace's recorded flow as seen from any shell: what the state file
//! says, checked against what `/proc` says now, and, for a service recorded running, one
//! fresh round of its readiness predicates.
//!
//! This module owns that read-only view. It must never signal anything or change the state
//! folder.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::FlowError;
use crate::procfs::{self, Ownership};
use crate::readiness::{Probe, ReadinessGate, Requirement};
use crate::state::{self, EndpointRecord, ServiceRecord, StatePaths};

/// One recorded service, with its liveness proven now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedService {
    pub name: String,
    /// As recorded, corrected by what is true now: `gone` when the record says it runs but
    /// nothing of it does; `leader-exited` when its leader is gone but members of its process
    /// group still run; `not-ready` when it is recorded running but fails a predicate now.
    pub state: String,
    /// The pid, when the recorded process is proven alive now.
    pub pid: Option<i32>,
    pub endpoints: Vec<(String, String)>,
    pub restarts: u32,
    pub detail: Option<String>,
    /// Live members of its process group when its leader is gone.
    pub leftover: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowStatus {
    pub flow: String,
    pub supervisor_pid: i32,
    /// Whether the `up` that recorded this state still runs.
    pub supervisor_alive: bool,
    /// Whether every selected service reached running (or completed).
    pub up: bool,
    pub started_at: String,
    pub services: Vec<RecordedService>,
}

/// The recorded flow of the workspace at `root`, if any. A service recorded running is
/// probed once, each probe bounded by `probe_timeout`.
pub async fn status(root: &Path, probe_timeout: Duration) -> Result<Option<FlowStatus>, FlowError> {
    let Some((mut status, records)) = read(root)? else {
        return Ok(None);
    };
    for (view, record) in status.services.iter_mut().zip(&records) {
        if view.state == "running"
            && view.pid.is_some()
            && let Some(identity) = &record.process
            && let Err(failure) = probe_once(record, identity.pgid, probe_timeout).await
        {
            view.state = "not-ready".into();
            view.detail = Some(failure);
        }
    }
    Ok(Some(status))
}

/// The recorded flow of the workspace at `root`, if any, with each process's ownership proven
/// from `/proc` but no endpoint probed (callers that only need recorded addresses, such as a
/// runnable's dependency environment).
pub fn recorded(root: &Path) -> Result<Option<FlowStatus>, FlowError> {
    Ok(read(root)?.map(|(status, _)| status))
}

fn read(root: &Path) -> Result<Option<(FlowStatus, Vec<ServiceRecord>)>, FlowError> {
    let paths = StatePaths::for_workspace(root);
    let Some(recorded) = state::read_state(&paths)? else {
        return Ok(None);
    };
    let supervisor_alive = matches!(
        procfs::prove(&recorded.supervisor),
        Ok(Ownership::Proven { .. })
    );
    let services = recorded.services.iter().map(service_now).collect();
    Ok(Some((
        FlowStatus {
            flow: recorded.flow,
            supervisor_pid: recorded.supervisor.pid,
            supervisor_alive,
            up: recorded.up,
            started_at: recorded.started_at,
            services,
        },
        recorded.services,
    )))
}

fn service_now(s: &ServiceRecord) -> RecordedService {
    let mut view = RecordedService {
        name: s.name.clone(),
        state: s.state.clone(),
        pid: None,
        endpoints: s
            .endpoints
            .iter()
            .map(|e| (e.name.clone(), e.address.clone()))
            .collect(),
        restarts: s.restarts,
        detail: s.detail.clone(),
        leftover: Vec::new(),
    };
    let Some(identity) = &s.process else {
        return view;
    };
    let running_state = matches!(s.state.as_str(), "starting" | "running" | "stopping");
    match procfs::prove(identity) {
        Ok(Ownership::Proven { .. }) => view.pid = Some(identity.pid),
        Ok(Ownership::Unproven { reason, remaining }) => {
            view.state = "leader-exited".into();
            view.detail = Some(format!(
                "{reason}; {} process(es) still run in its process group {}",
                remaining.len(),
                identity.pgid
            ));
            view.leftover = remaining;
        }
        Ok(Ownership::Gone) if running_state => view.state = "gone".into(),
        Ok(Ownership::Gone) => {}
        Err(e) => view.detail = Some(format!("cannot read /proc: {e}")),
    }
    view
}

/// One round of the service's endpoint predicates, as readiness would run them.
async fn probe_once(s: &ServiceRecord, pgid: i32, probe_timeout: Duration) -> Result<(), String> {
    let endpoints = s
        .endpoints
        .iter()
        .filter_map(|e| {
            Some(Requirement {
                endpoint: Some(e.name.clone()),
                probe: probe_for(e)?,
            })
        })
        .collect();
    let (_alive, exit) = watch::channel(None);
    let gate = ReadinessGate {
        service: s.name.clone(),
        endpoints,
        exit,
        owner_group: Some(pgid),
    };
    gate.check_once(probe_timeout)
        .await
        .map_err(|f| f.to_string())
}

fn probe_for(e: &EndpointRecord) -> Option<Probe> {
    let addr: SocketAddr = e.address.parse().ok()?;
    Some(match (e.api.as_str(), &e.health) {
        ("grpc", service) => Probe::Grpc {
            addr,
            tls: e.tls,
            service: service.clone(),
        },
        ("http", Some(path)) => Probe::Http {
            addr,
            path: path.clone(),
            tls: e.tls,
        },
        _ => Probe::Tcp(addr),
    })
}
