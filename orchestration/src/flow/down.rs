//! `down` from any shell: stop exactly what a workspace's recorded flow started.
//!
//! When the `up` that started the flow still runs (it holds the workspace lock), `down` proves
//! that process's start identity and asks it to tear down (SIGTERM), then reports its
//! receipts. When it is gone, `down` takes the lock and tears the recorded process groups down
//! itself, in the recorded reverse layers. This module must never signal a process whose
//! recorded start identity it cannot prove: such a group is refused and receipted `failed`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

use crate::flow::error::FlowError;
use crate::flow::options::FlowOptions;
use crate::flow::procfs::{self, Ownership, StartIdentity};
use crate::flow::state::{self, StatePaths, WorkspaceLock};
use crate::flow::teardown::{
    self, Signalled, StopOutcome, StopTarget, TeardownBudget, TeardownReport,
};

/// Who did the stopping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownAction {
    /// No flow is recorded for this workspace.
    NothingRecorded,
    /// The running `up` (this pid) was asked to tear down, and did.
    AskedSupervisor { pid: i32 },
    /// The `up` was gone; `down` stopped the recorded groups itself.
    StoppedDirectly,
}

#[derive(Debug, Clone)]
pub struct DownReport {
    pub action: DownAction,
    pub teardown: TeardownReport,
}

impl DownReport {
    /// Whether every recorded service is now proven stopped.
    pub fn clean(&self) -> bool {
        self.teardown
            .receipts
            .iter()
            .all(|r| r.outcome != StopOutcome::Failed)
    }
}

/// Stops the flow recorded in the workspace at `root`.
pub async fn down(root: &Path, options: &FlowOptions) -> Result<DownReport, FlowError> {
    options.validate()?;
    let paths = StatePaths::for_workspace(root);
    let Some(recorded) = state::read_state(&paths)? else {
        return Ok(DownReport {
            action: DownAction::NothingRecorded,
            teardown: TeardownReport::default(),
        });
    };

    let mut action = DownAction::StoppedDirectly;
    let mut asked: Option<TeardownReport> = None;
    let lock = match WorkspaceLock::try_acquire(&paths)? {
        Some(lock) => lock,
        None => {
            let pid = recorded.supervisor.pid;
            match procfs::prove(&recorded.supervisor).map_err(|e| state_error(&paths, e))? {
                Ownership::Proven { .. } => {}
                _ => {
                    return Err(FlowError::State {
                        path: paths.lock_file.clone(),
                        reason: format!(
                            "the workspace is locked, but the recorded supervisor (pid {pid}) cannot be proven to be the holder; refusing to signal anything"
                        ),
                    });
                }
            }
            tracing::info!(pid, "asking the running `hostd flow up` to tear down");
            match kill(Pid::from_raw(pid), Signal::SIGTERM) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => {
                    return Err(FlowError::State {
                        path: paths.state_file.clone(),
                        reason: format!(
                            "cannot signal the running `hostd flow up` (pid {pid}): {e}"
                        ),
                    });
                }
            }
            // Its teardown takes at most one budget (plus the kill grace) per layer.
            let layers = recorded.teardown_layers.len().max(1) as u32;
            let bound = (options.teardown_layer_budget + options.kill_grace) * layers
                + Duration::from_secs(10);
            let deadline = Instant::now() + bound;
            let lock = loop {
                if let Some(lock) = WorkspaceLock::try_acquire(&paths)? {
                    break lock;
                }
                if Instant::now() >= deadline {
                    return Err(FlowError::State {
                        path: paths.lock_file.clone(),
                        reason: format!(
                            "the running `hostd flow up` (pid {pid}) did not finish its teardown within {}",
                            humantime::format_duration(bound)
                        ),
                    });
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            action = DownAction::AskedSupervisor { pid };
            asked = state::read_receipts(&paths)?;
            lock
        }
    };

    // Whatever is still recorded (everything, if the supervisor was gone; survivors of its
    // own teardown otherwise) is stopped here, under the lock.
    let Some(remaining) = state::read_state(&paths)? else {
        drop(lock);
        return Ok(DownReport {
            action,
            teardown: asked.unwrap_or_default(),
        });
    };
    let mut layers: Vec<Vec<Arc<dyn StopTarget>>> = Vec::new();
    let mut placed: Vec<&str> = Vec::new();
    let target = |name: &str, identity: &StartIdentity| -> Arc<dyn StopTarget> {
        Arc::new(RecordedGroup {
            name: name.to_owned(),
            identity: identity.clone(),
            proven: AtomicBool::new(false),
        })
    };
    for layer in &remaining.teardown_layers {
        let mut targets = Vec::new();
        for name in layer {
            if let Some(identity) = remaining.service(name).and_then(|s| s.process.as_ref()) {
                targets.push(target(name, identity));
                placed.push(name);
            }
        }
        layers.push(targets);
    }
    let unplaced: Vec<Arc<dyn StopTarget>> = remaining
        .services
        .iter()
        .filter(|s| !placed.contains(&s.name.as_str()))
        .filter_map(|s| s.process.as_ref().map(|p| target(&s.name, p)))
        .collect();
    if !unplaced.is_empty() {
        if layers.is_empty() {
            layers.push(Vec::new());
        }
        layers[0].extend(unplaced);
    }
    layers.retain(|l| !l.is_empty());

    let budget = TeardownBudget {
        per_layer: options.teardown_layer_budget,
        kill_grace: options.kill_grace,
    };
    let report = teardown::teardown(layers, budget, |r| {
        tracing::info!(service = %r.service, outcome = %r.outcome, detail = %r.detail, "teardown receipt");
    })
    .await;

    let refused = report
        .receipts
        .iter()
        .any(|r| r.outcome == StopOutcome::Failed);
    if refused {
        // Keep the record of what could not be proven, so it stays visible in `status`.
        let mut kept = remaining.clone();
        kept.services.retain(|s| {
            report
                .receipt(&s.name)
                .is_some_and(|r| r.outcome == StopOutcome::Failed)
        });
        state::write_state(&paths, &kept)?;
    } else {
        state::remove_state(&paths)?;
    }
    let mut combined = asked.unwrap_or_default();
    combined.layers = combined.layers.max(report.layers);
    combined
        .receipts
        .retain(|r| report.receipt(&r.service).is_none());
    combined.receipts.extend(report.receipts);
    state::write_receipts(&paths, &combined)?;
    drop(lock);
    Ok(DownReport {
        action,
        teardown: combined,
    })
}

fn state_error(paths: &StatePaths, e: std::io::Error) -> FlowError {
    FlowError::State {
        path: paths.state_file.clone(),
        reason: e.to_string(),
    }
}

/// A process group recorded by another process, signalled only after proof.
struct RecordedGroup {
    name: String,
    identity: StartIdentity,
    /// Once proven, the group number stays ours for as long as the group has a member: the
    /// kernel never reuses a process group id that is still in use.
    proven: AtomicBool,
}

impl StopTarget for RecordedGroup {
    fn name(&self) -> &str {
        &self.name
    }

    fn signal(&self, signal: Signal) -> Result<Signalled, String> {
        let pgid = Pid::from_raw(self.identity.pgid);
        let ownership =
            procfs::prove(&self.identity).map_err(|e| format!("cannot read /proc: {e}"))?;
        let result = match ownership {
            Ownership::Gone => return Ok(Signalled::NothingLeft("was already gone".into())),
            Ownership::Proven { in_group: true } => killpg(pgid, signal),
            Ownership::Proven { in_group: false } => kill(Pid::from_raw(self.identity.pid), signal),
            Ownership::Unproven { reason, remaining } => {
                if self.proven.load(Ordering::SeqCst) {
                    killpg(pgid, signal)
                } else {
                    return Err(format!(
                        "refused: {reason}; {} process(es) remain in process group {} and cannot be proven to be this flow's",
                        remaining.len(),
                        self.identity.pgid
                    ));
                }
            }
        };
        self.proven.store(true, Ordering::SeqCst);
        match result {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(Signalled::Sent),
            Err(e) => Err(format!("cannot send {}: {e}", signal.as_str())),
        }
    }

    fn gone(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                if matches!(procfs::prove(&self.identity), Ok(Ownership::Gone)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
