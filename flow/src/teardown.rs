//! Layered teardown: reverse topological layers, one at a time, each bounded by its own
//! budget (SIGTERM, then SIGKILL when the budget runs out), with one receipt per service.
//!
//! This module owns the order, the budget and the receipts. It must never decide what a
//! target may signal: a [`StopTarget`] proves its own ownership before every signal and
//! refuses when it cannot.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use nix::sys::signal::Signal;
use tokio::time::Instant;
use wire_enum::wire_enum;

wire_enum! {
    /// How one service's stop ended.
    pub enum StopOutcome {
        /// Exited within the layer's budget (or had already exited).
        Stopped = "stopped",
        /// Could not be signalled (including: ownership could not be proven).
        Failed = "failed",
        /// Still running when the budget ran out; it was sent SIGKILL.
        TimedOut = "timed-out",
    }
    kind = "stop_outcome";
    serde;
}

/// One service's line of a teardown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub service: String,
    pub layer: usize,
    pub duration_ms: u64,
    pub outcome: StopOutcome,
    pub detail: String,
    /// Something of the target still ran when its teardown gave up (after SIGKILL and the
    /// kill grace, or because a signal was refused): it must stay recorded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lingering: bool,
}

wire_enum! {
    /// What asked for a teardown.
    pub enum TeardownOperation {
        /// The running flow's handle asked it to stop (or `hostd flow down` asked its `up`).
        Shutdown = "shutdown",
        /// The flow was interrupted (Ctrl-C, SIGTERM, SIGHUP) before or after it was up.
        Interrupt = "interrupt",
        /// A service failed in a way no policy absorbs, so the flow stopped everything.
        Failure = "failure",
        /// `hostd flow down` stopped the recorded groups itself (the `up` was gone).
        Down = "down",
        /// `hostd flow recover` stopped the processes of one retained group.
        Recover = "recover",
        /// `hostd flow restart` stopped services of a running flow to start them again.
        Restart = "restart",
        /// `hostd flow stop` withdrew services (and, if asked, their dependents) from a
        /// running flow; the rest kept running.
        Withdraw = "stop",
    }
    kind = "teardown_operation";
    serde;
}

/// Every receipt of a teardown, ordered by layer then by the order services were given in.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TeardownReport {
    /// What asked for it; absent in receipts written before operations were recorded.
    #[serde(default)]
    pub operation: Option<TeardownOperation>,
    pub layers: usize,
    pub receipts: Vec<Receipt>,
}

impl TeardownReport {
    pub fn receipt(&self, service: &str) -> Option<&Receipt> {
        self.receipts.iter().find(|r| r.service == service)
    }

    /// Whether every service stopped cleanly.
    pub fn all_stopped(&self) -> bool {
        self.receipts
            .iter()
            .all(|r| r.outcome == StopOutcome::Stopped)
    }

    /// The receipts that are not `stopped`: each names a service that failed to stop or had
    /// to be forced (and so may still be running).
    pub fn troubles(&self) -> impl Iterator<Item = &Receipt> {
        self.receipts
            .iter()
            .filter(|r| r.outcome != StopOutcome::Stopped)
    }
}

/// What a signal attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signalled {
    Sent,
    /// Nothing of the target runs any more; the text says why.
    NothingLeft(String),
}

/// Something teardown can stop.
pub trait StopTarget: Send + Sync {
    fn name(&self) -> &str;
    /// Sends `signal` to everything the target owns, after proving it still owns it.
    fn signal(&self, signal: Signal) -> Result<Signalled, String>;
    /// Resolves once nothing the target owns runs any more.
    fn gone(&self) -> BoxFuture<'_, ()>;
}

/// The bounds of a teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TeardownBudget {
    /// From SIGTERM to SIGKILL, per layer.
    pub per_layer: Duration,
    /// How long to wait for a target to vanish after SIGKILL.
    pub kill_grace: Duration,
}

/// Stops `layers` in order; every target of one layer concurrently, and the next layer only
/// once the whole previous one has settled.
pub async fn teardown(
    operation: TeardownOperation,
    layers: Vec<Vec<Arc<dyn StopTarget>>>,
    budget: TeardownBudget,
    mut on_receipt: impl FnMut(&Receipt),
) -> TeardownReport {
    let mut report = TeardownReport {
        operation: Some(operation),
        layers: layers.len(),
        receipts: Vec::new(),
    };
    for (index, layer) in layers.into_iter().enumerate() {
        let deadline = Instant::now() + budget.per_layer;
        let receipts = join_all(
            layer
                .iter()
                .map(|t| stop_one(t.as_ref(), index, deadline, budget)),
        )
        .await;
        for r in receipts {
            on_receipt(&r);
            report.receipts.push(r);
        }
    }
    report
}

async fn stop_one(
    target: &dyn StopTarget,
    layer: usize,
    deadline: Instant,
    budget: TeardownBudget,
) -> Receipt {
    let started = Instant::now();
    let receipt = |outcome: StopOutcome, detail: String, lingering: bool| Receipt {
        service: target.name().to_owned(),
        layer,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        outcome,
        detail,
        lingering,
    };
    match target.signal(Signal::SIGTERM) {
        Err(reason) => return receipt(StopOutcome::Failed, reason, true),
        Ok(Signalled::NothingLeft(why)) => return receipt(StopOutcome::Stopped, why, false),
        Ok(Signalled::Sent) => {}
    }
    if tokio::time::timeout_at(deadline, target.gone())
        .await
        .is_ok()
    {
        return receipt(StopOutcome::Stopped, "exited after SIGTERM".into(), false);
    }
    let budget_text = humantime::format_duration(budget.per_layer);
    match target.signal(Signal::SIGKILL) {
        Err(reason) => receipt(
            StopOutcome::TimedOut,
            format!("still running {budget_text} after SIGTERM, and SIGKILL was refused: {reason}"),
            true,
        ),
        Ok(Signalled::NothingLeft(_)) => receipt(
            StopOutcome::TimedOut,
            format!("outlived the {budget_text} budget, exited just before SIGKILL"),
            false,
        ),
        Ok(Signalled::Sent) => {
            if tokio::time::timeout(budget.kill_grace, target.gone())
                .await
                .is_ok()
            {
                receipt(
                    StopOutcome::TimedOut,
                    format!("still running {budget_text} after SIGTERM; killed with SIGKILL"),
                    false,
                )
            } else {
                receipt(
                    StopOutcome::TimedOut,
                    format!(
                        "still running {budget_text} after SIGTERM and {} after SIGKILL",
                        humantime::format_duration(budget.kill_grace)
                    ),
                    true,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A target that exits `exit_after` after SIGTERM, or never (until SIGKILL).
    struct Fake {
        name: String,
        exit_after: Option<Duration>,
        log: Arc<Mutex<Vec<String>>>,
        gone_at: Mutex<Option<Instant>>,
    }

    impl Fake {
        fn target(
            name: &str,
            exit_after: Option<Duration>,
            log: &Arc<Mutex<Vec<String>>>,
        ) -> Arc<dyn StopTarget> {
            Arc::new(Fake {
                name: name.into(),
                exit_after,
                log: log.clone(),
                gone_at: Mutex::new(None),
            })
        }
    }

    impl StopTarget for Fake {
        fn name(&self) -> &str {
            &self.name
        }
        fn signal(&self, signal: Signal) -> Result<Signalled, String> {
            self.log
                .lock()
                .unwrap()
                .push(format!("{} {}", signal.as_str(), self.name));
            let mut gone = self.gone_at.lock().unwrap();
            match signal {
                Signal::SIGTERM => *gone = self.exit_after.map(|d| Instant::now() + d),
                _ => *gone = Some(Instant::now()),
            }
            Ok(Signalled::Sent)
        }
        fn gone(&self) -> BoxFuture<'_, ()> {
            Box::pin(async move {
                loop {
                    let at = *self.gone_at.lock().unwrap();
                    match at {
                        Some(at) => {
                            tokio::time::sleep_until(at).await;
                            if *self.gone_at.lock().unwrap() == Some(at) {
                                return;
                            }
                        }
                        None => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            })
        }
    }

    fn budget() -> TeardownBudget {
        TeardownBudget {
            per_layer: Duration::from_secs(15),
            kill_grace: Duration::from_secs(2),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn layers_run_in_order_and_each_waits_for_the_previous_to_settle() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let layers = vec![
            vec![
                Fake::target("web", Some(Duration::from_secs(1)), &log),
                Fake::target("worker", Some(Duration::from_secs(3)), &log),
            ],
            vec![Fake::target("db", Some(Duration::from_millis(10)), &log)],
        ];
        let start = Instant::now();
        let report = teardown(TeardownOperation::Shutdown, layers, budget(), |_| {}).await;
        assert_eq!(
            *log.lock().unwrap(),
            vec!["SIGTERM web", "SIGTERM worker", "SIGTERM db"],
            "db is signalled only after both of its consumers are gone"
        );
        assert!(report.all_stopped());
        assert_eq!(report.layers, 2);
        assert_eq!(report.receipt("db").unwrap().layer, 1);
        assert!(start.elapsed() >= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_is_per_layer_and_a_survivor_is_killed_and_receipted_timed_out() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let layers = vec![
            vec![Fake::target("stubborn", None, &log)],
            vec![Fake::target("db", Some(Duration::from_secs(14)), &log)],
        ];
        let report = teardown(TeardownOperation::Shutdown, layers, budget(), |_| {}).await;
        let stubborn = report.receipt("stubborn").unwrap();
        assert_eq!(stubborn.outcome, StopOutcome::TimedOut);
        assert_eq!(stubborn.duration_ms, 15_000);
        // The second layer gets a fresh 15 s, so 14 s is within its own budget.
        assert_eq!(report.receipt("db").unwrap().outcome, StopOutcome::Stopped);
        assert_eq!(
            *log.lock().unwrap(),
            vec!["SIGTERM stubborn", "SIGKILL stubborn", "SIGTERM db"]
        );
    }

    struct Refusing;
    impl StopTarget for Refusing {
        fn name(&self) -> &str {
            "foreign"
        }
        fn signal(&self, _: Signal) -> Result<Signalled, String> {
            Err("ownership cannot be proven".into())
        }
        fn gone(&self) -> BoxFuture<'_, ()> {
            Box::pin(futures::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_target_that_refuses_to_be_signalled_is_receipted_failed_without_waiting() {
        let report = teardown(
            TeardownOperation::Down,
            vec![vec![Arc::new(Refusing) as Arc<dyn StopTarget>]],
            budget(),
            |_| {},
        )
        .await;
        let r = report.receipt("foreign").unwrap();
        assert_eq!(r.outcome, StopOutcome::Failed);
        assert_eq!(r.duration_ms, 0);
        assert!(r.detail.contains("cannot be proven"));
    }
}
