//! Restart policies and their budget: whether a service that exited is started again, after
//! how long, and when it has used up the restarts its window allows.
//!
//! This module owns the decision only, as a pure function of the exits it is told about and
//! the clock it is handed. It must never spawn, signal or sleep.

use std::collections::VecDeque;
use std::time::Duration;

use timing::Backoff;
use tokio::time::Instant;
use wire_enum::wire_enum;

use crate::process::ExitInfo;

wire_enum! {
    /// When a service that exited is started again.
    pub enum RestartPolicy {
        /// Never: an exit is final (a failing exit fails the flow).
        No = "no",
        /// Only after an exit that was not a success (non-zero status or a signal).
        OnFailure = "on-failure",
        /// After any exit.
        Always = "always",
    }
    kind = "restart_policy";
    serde;
}

/// A service's `restart:` block. Every bound has a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartSpec {
    pub policy: RestartPolicy,
    /// How many restarts `window` may hold; one more exit gives up.
    pub max_restarts: u32,
    /// The sliding window the budget counts restarts in.
    pub window: Duration,
    /// The delay before the first restart; each further restart inside the window doubles it.
    pub backoff: Duration,
    /// The longest delay the doubling may reach.
    pub max_backoff: Duration,
}

impl RestartSpec {
    /// The delays before the restarts of one window: `backoff` before the first, doubled
    /// before each further one, never more than `max_backoff`, never jittered.
    pub fn delays(&self) -> Backoff {
        Backoff::new(self.backoff, self.max_backoff)
    }
}

/// The default policy is `on-failure` for a service; the workspace settles `no` for a
/// one-shot job whose manifest names no policy (see `Workspace::load`).
impl Default for RestartSpec {
    fn default() -> Self {
        RestartSpec {
            policy: RestartPolicy::OnFailure,
            max_restarts: 3,
            window: Duration::from_secs(60),
            backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// What to do about one exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestartDecision {
    /// Start the service again after `delay`; this is restart number `attempt` in the window.
    Restart { delay: Duration, attempt: u32 },
    /// The exit was a success and the policy does not restart it: the service is done.
    Finished,
    /// The exit was a failure and the policy forbids a restart.
    Forbidden,
    /// The window already holds `max_restarts` restarts.
    BudgetExhausted { restarts: u32, window: Duration },
}

/// Counts one service's restarts inside the sliding window.
#[derive(Debug, Clone)]
pub struct RestartTracker {
    spec: RestartSpec,
    recent: VecDeque<Instant>,
    total: u32,
}

impl RestartTracker {
    pub fn new(spec: RestartSpec) -> Self {
        RestartTracker {
            spec,
            recent: VecDeque::new(),
            total: 0,
        }
    }

    /// All restarts granted since the flow started.
    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn spec(&self) -> &RestartSpec {
        &self.spec
    }

    /// Decides about an exit observed at `now`, and records the restart it grants.
    pub fn decide(&mut self, exit: &ExitInfo, now: Instant) -> RestartDecision {
        self.decide_outcome(exit.success(), now)
    }

    /// Decides about a start that failed before any process ran (the command could not be
    /// spawned, or its port was taken): a failure like any other.
    pub fn decide_start_failure(&mut self, now: Instant) -> RestartDecision {
        self.decide_outcome(false, now)
    }

    fn decide_outcome(&mut self, success: bool, now: Instant) -> RestartDecision {
        let wants_restart = match self.spec.policy {
            RestartPolicy::No => false,
            RestartPolicy::OnFailure => !success,
            RestartPolicy::Always => true,
        };
        if !wants_restart {
            return if success {
                RestartDecision::Finished
            } else {
                RestartDecision::Forbidden
            };
        }
        while let Some(oldest) = self.recent.front() {
            if now.duration_since(*oldest) >= self.spec.window {
                self.recent.pop_front();
            } else {
                break;
            }
        }
        let in_window = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        if in_window >= self.spec.max_restarts {
            return RestartDecision::BudgetExhausted {
                restarts: in_window,
                window: self.spec.window,
            };
        }
        let delay = self.spec.delays().step(in_window);
        self.recent.push_back(now);
        self.total += 1;
        RestartDecision::Restart {
            delay,
            attempt: in_window + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure() -> ExitInfo {
        ExitInfo {
            code: Some(1),
            signal: None,
        }
    }

    fn success() -> ExitInfo {
        ExitInfo {
            code: Some(0),
            signal: None,
        }
    }

    fn spec(policy: RestartPolicy) -> RestartSpec {
        RestartSpec {
            policy,
            max_restarts: 2,
            window: Duration::from_secs(10),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(150),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn policy_no_never_restarts_and_tells_success_from_failure() {
        let mut t = RestartTracker::new(spec(RestartPolicy::No));
        assert_eq!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Forbidden
        );
        assert_eq!(
            t.decide(&success(), Instant::now()),
            RestartDecision::Finished
        );
    }

    #[tokio::test(start_paused = true)]
    async fn on_failure_restarts_failures_only() {
        let mut t = RestartTracker::new(spec(RestartPolicy::OnFailure));
        assert_eq!(
            t.decide(&success(), Instant::now()),
            RestartDecision::Finished
        );
        assert!(matches!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Restart { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn always_restarts_a_clean_exit_too() {
        let mut t = RestartTracker::new(spec(RestartPolicy::Always));
        assert!(matches!(
            t.decide(&success(), Instant::now()),
            RestartDecision::Restart { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_budget_is_exhausted_inside_the_window_and_backoff_doubles_up_to_its_cap() {
        let mut t = RestartTracker::new(spec(RestartPolicy::OnFailure));
        assert_eq!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Restart {
                delay: Duration::from_millis(100),
                attempt: 1
            }
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Restart {
                delay: Duration::from_millis(150),
                attempt: 2
            }
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::BudgetExhausted {
                restarts: 2,
                window: Duration::from_secs(10)
            }
        );
        assert_eq!(t.total(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_delays_double_from_half_a_second_to_thirty_seconds_and_stay_there() {
        let mut t = RestartTracker::new(RestartSpec {
            max_restarts: 10,
            ..RestartSpec::default()
        });
        let mut delays = Vec::new();
        while let RestartDecision::Restart { delay, .. } = t.decide(&failure(), Instant::now()) {
            delays.push(delay.as_millis());
        }
        assert_eq!(
            delays,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn restarts_older_than_the_window_no_longer_count() {
        let mut t = RestartTracker::new(spec(RestartPolicy::OnFailure));
        assert!(matches!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Restart { .. }
        ));
        assert!(matches!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Restart { .. }
        ));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::Restart {
                delay: Duration::from_millis(100),
                attempt: 1
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_budget_gives_up_on_the_first_failure() {
        let mut s = spec(RestartPolicy::Always);
        s.max_restarts = 0;
        let mut t = RestartTracker::new(s);
        assert!(matches!(
            t.decide(&failure(), Instant::now()),
            RestartDecision::BudgetExhausted { restarts: 0, .. }
        ));
    }
}
