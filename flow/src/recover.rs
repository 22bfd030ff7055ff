//! The way out when `down` refuses a recorded process group: its recorded leader is gone but
//! processes remain in the group, so nothing proves they are the flow's. [`preview`] lists
//! exactly those processes (pid, start time, command line) with the evidence that ties them
//! to the flow, for a person to review; [`recover`] then stops exactly the previewed
//! processes, and only if the group is still exactly what was previewed, and forgets the
//! record once the group is empty.
//!
//! This module owns that two-step recovery. It must never signal a process that was not in
//! the reviewed preview, never signal by name or marker, and never forget a record while any
//! member of its group runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::FlowError;
use crate::procfs::{self, Ownership, StartIdentity};
use crate::state::{self, StatePaths, WorkspaceLock};
use crate::teardown::{
    self, Signalled, StopTarget, TeardownBudget, TeardownOperation, TeardownReport,
};

/// The format version of a preview file; another version is refused.
pub const PREVIEW_VERSION: u32 = 1;

/// One process of a retained group, as the preview saw it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreviewedProcess {
    pub pid: i32,
    /// Clock ticks since boot (field 22 of `/proc/<pid>/stat`): with the pid and the boot, the
    /// process's identity.
    pub start_time: u64,
    pub command: String,
}

/// What a recovery would stop, and why those processes are taken to be the flow's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecoveryPreview {
    pub version: u32,
    /// The workspace folder, as given.
    pub workspace: PathBuf,
    pub service: String,
    /// The recorded leader the group was created for.
    pub recorded: StartIdentity,
    pub processes: Vec<PreviewedProcess>,
    pub evidence: Vec<String>,
}

impl RecoveryPreview {
    pub fn write(&self, path: &Path) -> Result<(), FlowError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| FlowError::State {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        std::fs::write(path, bytes).map_err(|e| FlowError::State {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    pub fn read(path: &Path) -> Result<RecoveryPreview, FlowError> {
        let refuse = |reason: String| FlowError::State {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| refuse(e.to_string()))?;
        let preview: RecoveryPreview = serde_json::from_slice(&bytes)
            .map_err(|e| refuse(format!("not a recovery preview: {e}")))?;
        if preview.version != PREVIEW_VERSION {
            return Err(refuse(format!(
                "preview format version {} is not {PREVIEW_VERSION}",
                preview.version
            )));
        }
        Ok(preview)
    }
}

/// How a recovery ended.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    pub teardown: TeardownReport,
    /// Whether the group is now empty and its record was removed.
    pub forgotten: bool,
}

/// Where `hostd flow recover` keeps a preview unless told otherwise.
pub fn default_preview_path(paths: &StatePaths, service: &str) -> PathBuf {
    paths.dir.join(format!("recover-{service}.json"))
}

fn not_recoverable(service: &str, reason: impl Into<String>) -> FlowError {
    FlowError::NotRecoverable {
        service: service.to_owned(),
        reason: reason.into(),
    }
}

/// The recorded identity of `service` in the workspace at `root`.
fn recorded_identity(paths: &StatePaths, service: &str) -> Result<StartIdentity, FlowError> {
    let not_recorded = || FlowError::NotRecorded {
        service: service.to_owned(),
        path: paths.state_file.clone(),
    };
    let recorded = state::read_state(paths)?.ok_or_else(not_recorded)?;
    recorded
        .service(service)
        .and_then(|s| s.process.clone())
        .ok_or_else(not_recorded)
}

/// The live members of the recorded group with their identities; refuses when the group is
/// not a retained one (its leader still runs, or nothing of it does) or holds a process that
/// started before the recorded leader (which the flow cannot have started).
fn retained_members(
    service: &str,
    recorded: &StartIdentity,
) -> Result<Vec<PreviewedProcess>, FlowError> {
    let io = |e: std::io::Error| not_recoverable(service, format!("cannot read /proc: {e}"));
    match procfs::prove(recorded).map_err(io)? {
        Ownership::Gone => {
            return Err(not_recoverable(
                service,
                "nothing of it runs any more: `hostd flow down` forgets it",
            ));
        }
        Ownership::Proven { .. } => {
            return Err(not_recoverable(
                service,
                format!(
                    "its recorded leader (pid {}) still runs and is proven: `hostd flow down` stops it",
                    recorded.pid
                ),
            ));
        }
        Ownership::Unproven { .. } => {}
    }
    let mut processes = Vec::new();
    for member in procfs::group_members(recorded.pgid).map_err(io)? {
        if member.is_zombie() {
            continue;
        }
        if member.start_time < recorded.start_time {
            return Err(not_recoverable(
                service,
                format!(
                    "pid {} in process group {} started before the recorded leader did: this is not the group the flow created",
                    member.pid, recorded.pgid
                ),
            ));
        }
        processes.push(PreviewedProcess {
            pid: member.pid,
            start_time: member.start_time,
            command: procfs::cmdline(member.pid).unwrap_or_default(),
        });
    }
    processes.sort_by_key(|p| p.pid);
    Ok(processes)
}

/// Lists what recovering `service` would stop, and why those processes are the flow's.
pub fn preview(root: &Path, service: &str) -> Result<RecoveryPreview, FlowError> {
    let paths = StatePaths::for_workspace(root);
    let recorded = recorded_identity(&paths, service)?;
    let processes = retained_members(service, &recorded)?;
    let evidence = vec![
        format!(
            "process group {} was created by this flow for `{service}`: its leader was pid {} started at tick {} on boot {}",
            recorded.pgid, recorded.pid, recorded.start_time, recorded.boot_id
        ),
        "the machine has not rebooted since, and every process listed started no earlier than that leader".into(),
        "a process group number is not reused while any member of the group remains; it can be only if the group emptied once, which these processes' commands let you judge".into(),
    ];
    Ok(RecoveryPreview {
        version: PREVIEW_VERSION,
        workspace: root.to_path_buf(),
        service: service.to_owned(),
        recorded,
        processes,
        evidence,
    })
}

/// Stops exactly the processes of a reviewed preview: SIGTERM, then SIGKILL when `budget`
/// runs out. Refused, with nothing signalled, when the record or the group changed since the
/// preview. The record is forgotten once the group is empty.
pub async fn recover(
    root: &Path,
    expected: &RecoveryPreview,
    budget: TeardownBudget,
) -> Result<RecoveryReport, FlowError> {
    let service = expected.service.as_str();
    let same_workspace = match (root.canonicalize(), expected.workspace.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => root == expected.workspace,
    };
    if !same_workspace {
        return Err(not_recoverable(
            service,
            format!(
                "the preview is of the workspace {}, not {}",
                expected.workspace.display(),
                root.display()
            ),
        ));
    }
    let paths = StatePaths::for_workspace(root);
    let Some(lock) = WorkspaceLock::try_acquire(&paths)? else {
        return Err(not_recoverable(
            service,
            "a `hostd flow up` runs in this workspace; stop it with `hostd flow down` first",
        ));
    };
    let recorded = recorded_identity(&paths, service)?;
    if recorded != expected.recorded {
        return Err(FlowError::GroupChanged {
            service: service.to_owned(),
            reason: "the recorded process group is not the one previewed".into(),
        });
    }
    let now = retained_members(service, &recorded)?;
    let seen: BTreeSet<(i32, u64)> = now.iter().map(|p| (p.pid, p.start_time)).collect();
    let previewed: BTreeSet<(i32, u64)> = expected
        .processes
        .iter()
        .map(|p| (p.pid, p.start_time))
        .collect();
    if seen != previewed {
        let joined: Vec<String> = seen
            .difference(&previewed)
            .map(|(pid, _)| pid.to_string())
            .collect();
        let left: Vec<String> = previewed
            .difference(&seen)
            .map(|(pid, _)| pid.to_string())
            .collect();
        return Err(FlowError::GroupChanged {
            service: service.to_owned(),
            reason: format!(
                "joined: [{}], gone: [{}]",
                joined.join(", "),
                left.join(", ")
            ),
        });
    }
    let target: Arc<dyn StopTarget> = Arc::new(PreviewedProcesses {
        name: service.to_owned(),
        pgid: recorded.pgid,
        processes: expected.processes.clone(),
    });
    let report = teardown::teardown(
        TeardownOperation::Recover,
        vec![vec![target]],
        budget,
        |_| {},
    )
    .await;
    let empty = procfs::live_members(recorded.pgid)
        .map(|m| m.is_empty())
        .unwrap_or(false);
    if empty {
        forget(&paths, service)?;
    }
    state::write_receipts(&paths, &report)?;
    drop(lock);
    Ok(RecoveryReport {
        teardown: report,
        forgotten: empty,
    })
}

/// Removes `service`'s record; removes the state file when no recorded process is left.
fn forget(paths: &StatePaths, service: &str) -> Result<(), FlowError> {
    let Some(mut recorded) = state::read_state(paths)? else {
        return Ok(());
    };
    recorded.services.retain(|s| s.name != service);
    if recorded.services.iter().any(|s| s.process.is_some()) {
        state::write_state(paths, &recorded)
    } else {
        state::remove_state(paths)
    }
}

/// The previewed processes, each signalled only while it is still the previewed process.
struct PreviewedProcesses {
    name: String,
    pgid: i32,
    processes: Vec<PreviewedProcess>,
}

impl PreviewedProcesses {
    /// The previewed processes that still run as themselves (same pid, same start time, same
    /// group).
    fn still_running(&self) -> Vec<i32> {
        self.processes
            .iter()
            .filter(|p| {
                matches!(procfs::stat(p.pid), Ok(Some(s))
                    if s.start_time == p.start_time && s.pgrp == self.pgid && !s.is_zombie())
            })
            .map(|p| p.pid)
            .collect()
    }
}

impl StopTarget for PreviewedProcesses {
    fn name(&self) -> &str {
        &self.name
    }

    fn signal(&self, signal: Signal) -> Result<Signalled, String> {
        let running = self.still_running();
        if running.is_empty() {
            return Ok(Signalled::NothingLeft(
                "none of the previewed processes runs any more".into(),
            ));
        }
        for pid in running {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => return Err(format!("cannot send {} to pid {pid}: {e}", signal.as_str())),
            }
        }
        Ok(Signalled::Sent)
    }

    fn gone(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            while !self.still_running().is_empty() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
