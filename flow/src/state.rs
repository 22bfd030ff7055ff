//! The workspace's state folder (`.hostd/flow/`): the state file recording what a running
//! `up` started (its own identity, each service's process group with its start identity,
//! endpoints, restarts and teardown layers), the lock one `up` holds for its lifetime, the
//! per-service logs, the last teardown's receipts and where the running `up`'s control socket
//! lives.
//!
//! This module owns the files and their format. It must never signal anything; `down` and
//! the engine read and write through it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::FlowError;
use crate::procfs::StartIdentity;
use crate::teardown::TeardownReport;

/// The format version of the state file; a file of another version is refused.
pub const STATE_VERSION: u32 = 1;

/// Where a workspace keeps its flow state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePaths {
    pub dir: PathBuf,
    pub state_file: PathBuf,
    pub lock_file: PathBuf,
    pub logs_dir: PathBuf,
    pub receipts_file: PathBuf,
    /// The ports chosen for endpoints without a fixed one, kept from one `up` to the next.
    pub ports_file: PathBuf,
    /// The unix socket the running `up` answers change requests on (see `control`).
    pub control_socket: PathBuf,
}

impl StatePaths {
    pub fn for_workspace(root: &Path) -> StatePaths {
        let dir = root.join(".hostd").join("flow");
        StatePaths {
            state_file: dir.join("state.json"),
            lock_file: dir.join("lock"),
            logs_dir: dir.join("logs"),
            receipts_file: dir.join("last-teardown.json"),
            ports_file: dir.join("ports.json"),
            control_socket: dir.join("control.sock"),
            dir,
        }
    }

    pub fn log_file(&self, service: &str) -> PathBuf {
        self.logs_dir.join(format!("{service}.log"))
    }

    fn error(&self, path: &Path, e: impl std::fmt::Display) -> FlowError {
        FlowError::State {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    }
}

/// What a running (or crashed) `up` recorded.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FlowState {
    pub version: u32,
    pub flow: String,
    /// The `up` process that supervises the services.
    pub supervisor: StartIdentity,
    pub started_at: String,
    /// Consumers first; `down` stops services in this order when the supervisor is gone.
    pub teardown_layers: Vec<Vec<String>>,
    pub services: Vec<ServiceRecord>,
    /// The teardown bounds the `up` runs with, so `down` waits for it (or acts for it) with
    /// the same ones; absent in files written before they were recorded.
    #[serde(default)]
    pub budget: Option<RecordedBudget>,
    /// Whether every selected service reached running (or completed).
    #[serde(default)]
    pub up: bool,
}

/// Teardown bounds, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordedBudget {
    pub teardown_layer_budget_ms: u64,
    pub kill_grace_ms: u64,
}

impl FlowState {
    pub fn service(&self, name: &str) -> Option<&ServiceRecord> {
        self.services.iter().find(|s| s.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServiceRecord {
    pub name: String,
    /// `pending`, `starting`, `running`, `completed`, `exited`, `restarting`, `failed`,
    /// `stopping`, `stopped`, or `excluded` (the target of `up --only-deps`, never started).
    pub state: String,
    /// The current (or last) process group this flow started for the service.
    pub process: Option<StartIdentity>,
    pub endpoints: Vec<EndpointRecord>,
    pub restarts: u32,
    pub detail: Option<String>,
    /// The variables the flow starts (or, for an `excluded` service, would start) it with:
    /// what `hostd flow env` prints.
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EndpointRecord {
    pub name: String,
    pub api: String,
    pub address: String,
    /// The declared health path (http) or gRPC service (grpc), so `status` can probe like
    /// readiness does.
    #[serde(default)]
    pub health: Option<String>,
    #[serde(default)]
    pub tls: bool,
}

/// Writes `bytes` at `path` through a temporary file beside it and a rename, so a reader sees
/// the old content or the new, never a part.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
    }
    fs::rename(&tmp, path)
}

fn read_json<T: serde::de::DeserializeOwned>(
    paths: &StatePaths,
    path: &Path,
) -> Result<Option<T>, FlowError> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| paths.error(path, format!("unreadable: {e}"))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(paths.error(path, e)),
    }
}

pub fn write_state(paths: &StatePaths, state: &FlowState) -> Result<(), FlowError> {
    fs::create_dir_all(&paths.dir).map_err(|e| paths.error(&paths.dir, e))?;
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| paths.error(&paths.state_file, e))?;
    write_atomic(&paths.state_file, &bytes).map_err(|e| paths.error(&paths.state_file, e))
}

pub fn read_state(paths: &StatePaths) -> Result<Option<FlowState>, FlowError> {
    let state: Option<FlowState> = read_json(paths, &paths.state_file)?;
    if let Some(s) = &state
        && s.version != STATE_VERSION
    {
        return Err(paths.error(
            &paths.state_file,
            format!("format version {} is not {STATE_VERSION}", s.version),
        ));
    }
    Ok(state)
}

pub fn remove_state(paths: &StatePaths) -> Result<(), FlowError> {
    match fs::remove_file(&paths.state_file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(paths.error(&paths.state_file, e)),
    }
}

pub fn write_receipts(paths: &StatePaths, report: &TeardownReport) -> Result<(), FlowError> {
    fs::create_dir_all(&paths.dir).map_err(|e| paths.error(&paths.dir, e))?;
    let bytes =
        serde_json::to_vec_pretty(report).map_err(|e| paths.error(&paths.receipts_file, e))?;
    write_atomic(&paths.receipts_file, &bytes).map_err(|e| paths.error(&paths.receipts_file, e))
}

pub fn read_receipts(paths: &StatePaths) -> Result<Option<TeardownReport>, FlowError> {
    read_json(paths, &paths.receipts_file)
}

/// The exclusive lock one `up` (or a `down` acting for a dead `up`) holds on a workspace. The
/// kernel releases it when the holder dies, however it dies.
#[derive(Debug)]
pub struct WorkspaceLock {
    _lock: Flock<File>,
}

impl WorkspaceLock {
    /// Takes the lock without waiting; `Ok(None)` when another process holds it.
    pub fn try_acquire(paths: &StatePaths) -> Result<Option<WorkspaceLock>, FlowError> {
        fs::create_dir_all(&paths.dir).map_err(|e| paths.error(&paths.dir, e))?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&paths.lock_file)
            .map_err(|e| paths.error(&paths.lock_file, e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(WorkspaceLock { _lock: lock })),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(paths.error(&paths.lock_file, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_is_exclusive_while_held_and_free_after_drop() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::for_workspace(dir.path());
        let first = WorkspaceLock::try_acquire(&paths).unwrap();
        assert!(first.is_some());
        assert!(WorkspaceLock::try_acquire(&paths).unwrap().is_none());
        drop(first);
        assert!(WorkspaceLock::try_acquire(&paths).unwrap().is_some());
    }

    #[test]
    fn a_state_file_of_another_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let paths = StatePaths::for_workspace(dir.path());
        let state = FlowState {
            version: STATE_VERSION + 1,
            flow: "x".into(),
            supervisor: StartIdentity {
                pid: 1,
                pgid: 1,
                start_time: 1,
                boot_id: "b".into(),
            },
            started_at: "now".into(),
            teardown_layers: vec![],
            services: vec![],
            budget: None,
            up: false,
        };
        write_state(&paths, &state).unwrap();
        let err = read_state(&paths).unwrap_err();
        assert_eq!(err.code(), "flow.state");
    }
}
