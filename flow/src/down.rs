//! `down` from any shell: stop exactly what a workspace's recorded flow started.
//!
//! When the `up` that started the flow still runs (it holds the workspace lock), `down` proves
//! that process's start identity and asks it to tear down (SIGTERM), then reports its
//! receipts. When it is gone, `down` takes the lock and tears the recorded process groups down
//! itself, in the recorded reverse layers, with the bounds the `up` recorded. A record is
//! dropped only once its group is proven gone; a group refused or still alive stays recorded
//! and is named with its way out (`hostd flow recover`). [`preview`] says what `down` would
//! do without signalling. This module must never signal a process whose recorded start
//! identity it cannot prove: such a group is refused and receipted `failed`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

use crate::error::FlowError;
use crate::options::FlowOptions;
use crate::procfs::{self, Ownership, StartIdentity};
use crate::state::{self, FlowState, StatePaths, WorkspaceLock};
use crate::teardown::{
    self, Signalled, StopTarget, TeardownBudget, TeardownOperation, TeardownReport,
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

/// The bounds `down` applies. Each one not given is taken from what the `up` recorded (its
/// own teardown bounds), else the default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DownOptions {
    pub teardown_layer_budget: Option<Duration>,
    pub kill_grace: Option<Duration>,
}

impl DownOptions {
    fn budget(&self, recorded: &FlowState) -> Result<TeardownBudget, FlowError> {
        let defaults = FlowOptions::default();
        let from_record = recorded.budget.map(|b| {
            (
                Duration::from_millis(b.teardown_layer_budget_ms),
                Duration::from_millis(b.kill_grace_ms),
            )
        });
        let budget = TeardownBudget {
            per_layer: self
                .teardown_layer_budget
                .or(from_record.map(|r| r.0))
                .unwrap_or(defaults.teardown_layer_budget),
            kill_grace: self
                .kill_grace
                .or(from_record.map(|r| r.1))
                .unwrap_or(defaults.kill_grace),
        };
        for (option, value) in [
            ("teardown_layer_budget", budget.per_layer),
            ("kill_grace", budget.kill_grace),
        ] {
            if value.is_zero() {
                return Err(FlowError::InvalidOption {
                    option,
                    reason: "must be longer than zero".into(),
                });
            }
        }
        Ok(budget)
    }
}

#[derive(Debug, Clone)]
pub struct DownReport {
    pub action: DownAction,
    pub teardown: TeardownReport,
    /// Services whose process group may still run (refused, or alive after SIGKILL): they
    /// stay recorded, so `status`, a later `down` or `hostd flow recover` can find them.
    pub retained: Vec<String>,
}

impl DownReport {
    /// Whether everything recorded is now proven stopped, each within its budget: any other
    /// receipt (`failed`, `timed-out`) is trouble the caller must surface.
    pub fn clean(&self) -> bool {
        self.teardown.all_stopped() && self.retained.is_empty()
    }
}

/// Stops the flow recorded in the workspace at `root`.
pub async fn down(root: &Path, options: &DownOptions) -> Result<DownReport, FlowError> {
    let paths = StatePaths::for_workspace(root);
    let Some(recorded) = state::read_state(&paths)? else {
        return Ok(DownReport {
            action: DownAction::NothingRecorded,
            teardown: TeardownReport::default(),
            retained: Vec::new(),
        });
    };
    let budget = options.budget(&recorded)?;

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
            // Its teardown takes at most one of its budgets (plus the kill grace) per layer.
            let layers = recorded.teardown_layers.len().max(1) as u32;
            let bound = (budget.per_layer + budget.kill_grace) * layers + Duration::from_secs(10);
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
            retained: Vec::new(),
        });
    };
    let layers = recorded_layers(&remaining);
    let report = teardown::teardown(TeardownOperation::Down, layers, budget, |r| {
        tracing::info!(service = %r.service, outcome = %r.outcome, detail = %r.detail, "teardown receipt");
    })
    .await;

    // A record is dropped only once its group is proven gone; anything else is kept.
    let mut kept = remaining.clone();
    kept.services.retain(|s| {
        let lingering = report.receipt(&s.name).is_some_and(|r| r.lingering);
        match &s.process {
            Some(identity) => lingering || !matches!(procfs::prove(identity), Ok(Ownership::Gone)),
            None => false,
        }
    });
    for service in &mut kept.services {
        if let Some(r) = report.receipt(&service.name) {
            service.state = r.outcome.to_string();
            service.detail = Some(format!("{}; {}", r.detail, recovery_hint(&service.name)));
        }
    }
    let retained: Vec<String> = kept.services.iter().map(|s| s.name.clone()).collect();
    if retained.is_empty() {
        state::remove_state(&paths)?;
    } else {
        kept.up = false;
        state::write_state(&paths, &kept)?;
    }
    let mut combined = asked.unwrap_or_default();
    if combined.operation.is_none() || !report.receipts.is_empty() {
        combined.operation = report.operation;
    }
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
        retained,
    })
}

/// How to get out when `down` cannot stop a group: preview it, then stop what was previewed.
pub fn recovery_hint(service: &str) -> String {
    format!(
        "review it with `hostd flow recover {service} --preview`, then stop exactly those processes with `hostd flow recover {service} --expect <preview file>`"
    )
}

/// The recorded groups as teardown targets, in the recorded layers (consumers first); a
/// recorded group no layer names goes in the first.
fn recorded_layers(recorded: &FlowState) -> Vec<Vec<Arc<dyn StopTarget>>> {
    let mut layers: Vec<Vec<Arc<dyn StopTarget>>> = Vec::new();
    let mut placed: Vec<&str> = Vec::new();
    let target = |name: &str, identity: &StartIdentity| -> Arc<dyn StopTarget> {
        Arc::new(RecordedGroup {
            name: name.to_owned(),
            identity: identity.clone(),
            proven: AtomicBool::new(false),
        })
    };
    for layer in &recorded.teardown_layers {
        let mut targets = Vec::new();
        for name in layer {
            if let Some(identity) = recorded.service(name).and_then(|s| s.process.as_ref()) {
                targets.push(target(name, identity));
                placed.push(name);
            }
        }
        layers.push(targets);
    }
    let unplaced: Vec<Arc<dyn StopTarget>> = recorded
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
    layers
}

/// What `down` would do to one recorded service, decided from `/proc` without signalling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewEntry {
    pub service: String,
    pub layer: usize,
    pub pgid: i32,
    /// `signal`: proven ours, its group would get SIGTERM (then SIGKILL); `already-gone`;
    /// `refuse`: its processes cannot be proven to be this flow's.
    pub verdict: &'static str,
    pub detail: String,
    /// The live members of its process group: (pid, command line).
    pub members: Vec<(i32, String)>,
}

/// What `down` would do, without doing it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownPreview {
    /// The `up` that started the flow, when it still runs: `down` would ask it to stop.
    pub supervisor_alive: Option<i32>,
    pub entries: Vec<PreviewEntry>,
}

/// Previews `down` for the workspace at `root`; `None` when nothing is recorded.
pub fn preview(root: &Path) -> Result<Option<DownPreview>, FlowError> {
    let paths = StatePaths::for_workspace(root);
    let Some(recorded) = state::read_state(&paths)? else {
        return Ok(None);
    };
    let supervisor_alive = match procfs::prove(&recorded.supervisor) {
        Ok(Ownership::Proven { .. }) => Some(recorded.supervisor.pid),
        _ => None,
    };
    let layer_of = |name: &str| {
        recorded
            .teardown_layers
            .iter()
            .position(|l| l.iter().any(|n| n == name))
            .unwrap_or(0)
    };
    let mut entries = Vec::new();
    for service in &recorded.services {
        let Some(identity) = &service.process else {
            continue;
        };
        let members = |pgid: i32| -> Vec<(i32, String)> {
            procfs::live_members(pgid)
                .unwrap_or_default()
                .into_iter()
                .map(|pid| (pid, procfs::cmdline(pid).unwrap_or_default()))
                .collect()
        };
        let (verdict, detail, members) = match procfs::prove(identity)
            .map_err(|e| state_error(&paths, e))?
        {
            Ownership::Gone => ("already-gone", "nothing of it runs".to_owned(), Vec::new()),
            Ownership::Proven { in_group: true } => (
                "signal",
                format!(
                    "leader pid {} is the recorded process: its group gets SIGTERM, then SIGKILL",
                    identity.pid
                ),
                members(identity.pgid),
            ),
            Ownership::Proven { in_group: false } => (
                "signal",
                format!(
                    "leader pid {} is the recorded process but left its group: only it gets signalled",
                    identity.pid
                ),
                vec![(
                    identity.pid,
                    procfs::cmdline(identity.pid).unwrap_or_default(),
                )],
            ),
            Ownership::Unproven { reason, .. } => (
                "refuse",
                format!("{reason}; {}", recovery_hint(&service.name)),
                members(identity.pgid),
            ),
        };
        entries.push(PreviewEntry {
            service: service.name.clone(),
            layer: layer_of(&service.name),
            pgid: identity.pgid,
            verdict,
            detail,
            members,
        });
    }
    entries.sort_by_key(|e| e.layer);
    Ok(Some(DownPreview {
        supervisor_alive,
        entries,
    }))
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
                        "refused: {reason}; {} process(es) remain in process group {} and cannot be proven to be this flow's; {}",
                        remaining.len(),
                        self.identity.pgid,
                        recovery_hint(&self.name)
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

    /// Gone means found empty twice in a row: a group something outside it keeps
    /// repopulating empties for an instant after each kill, and is not gone.
    fn gone(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut empty = 0;
            loop {
                if matches!(procfs::prove(&self.identity), Ok(Ownership::Gone)) {
                    empty += 1;
                    if empty >= 2 {
                        return;
                    }
                } else {
                    empty = 0;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    }
}
