//! Failpoints at named steps of command application and drain, for crash tests (feature
//! `testing`). A test arms a step with an action; the Host calls [`hit`] at that step. Without
//! the feature every call is a no-op that compiles away. Never armed in production builds.

/// The named steps.
pub mod steps {
    pub const AFTER_CLAIM: &str = "after_claim";
    pub const AFTER_BEGIN_ATTEMPT: &str = "after_begin_attempt";
    pub const AFTER_DISPATCH_BEFORE_SETTLE: &str = "after_dispatch_before_settle";
    pub const AFTER_SETTLE_BEFORE_CURSOR: &str = "after_settle_before_cursor";
    pub const MID_DRAIN: &str = "mid_drain";
    /// The live tail's read of the command mapping (armed with [`super::Action::Fail`]).
    pub const MAPPING_READ: &str = "mapping_read";
    /// The live tail's publication of a projected record (armed with [`super::Action::Fail`]:
    /// the publication is refused, as a body that cannot be relayed is).
    pub const PUBLISH: &str = "publish";
    /// A release's giving back of the residency lease (armed with [`super::Action::Fail`]: the
    /// store answers as if it were away).
    pub const RELEASE_LEASE: &str = "release_lease";
    /// The end of a gate publisher's pass, its projection writes done (armed with
    /// [`super::Action::Delay`]: committed events pile up unread meanwhile).
    pub const GATE_PASS: &str = "gate_pass";
    /// An attach, once its residency lease is granted and before anything else is written.
    pub const ATTACH_AFTER_LEASE: &str = "attach_after_lease";
    /// The stop's close of the store (armed with [`super::Action::Delay`]: a close that
    /// overruns the stop's bound).
    pub const CLOSE_STORE: &str = "close_store";
    /// Every step, for tests that iterate.
    pub const ALL: [&str; 5] = [
        AFTER_CLAIM,
        AFTER_BEGIN_ATTEMPT,
        AFTER_DISPATCH_BEFORE_SETTLE,
        AFTER_SETTLE_BEFORE_CURSOR,
        MID_DRAIN,
    ];
}

/// What an armed step does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Action {
    /// Park the task forever (the test then drops the Host without cleanup).
    Pause,
    /// Abort the whole process, as `kill -9` would (for child-process tests).
    Abort,
    /// Make the step report a failure this many times (for steps that ask [`fails`]).
    Fail(u32),
    /// Hold the task at the step this long, then go on (to widen a window a test aims at).
    Delay(std::time::Duration),
    /// Panic the task at the step, as a defect would (its unwinding is what the test checks).
    Panic,
}

#[cfg(feature = "testing")]
mod imp {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use super::Action;

    fn table() -> &'static Mutex<HashMap<String, (Action, usize)>> {
        static T: OnceLock<Mutex<HashMap<String, (Action, usize)>>> = OnceLock::new();
        T.get_or_init(|| Mutex::new(HashMap::new()))
    }

    /// Arms `step` (or `"<host id>:<step>"`) with `action`; it fires once per arming.
    pub fn arm(step: &str, action: Action) {
        if let Ok(mut t) = table().lock() {
            t.insert(step.to_owned(), (action, 0));
        }
    }

    /// Disarms every step.
    pub fn clear() {
        if let Ok(mut t) = table().lock() {
            t.clear();
        }
    }

    /// How many times `step` (as armed) fired since it was armed.
    pub fn hits(step: &str) -> usize {
        table()
            .lock()
            .ok()
            .and_then(|t| t.get(step).map(|e| e.1))
            .unwrap_or(0)
    }

    /// Arms steps named in `HOST_FAILPOINTS` (`step=pause|abort`, comma-separated).
    pub fn arm_from_env() {
        let Ok(spec) = std::env::var("HOST_FAILPOINTS") else {
            return;
        };
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            if let Some((step, action)) = part.split_once('=') {
                let action = match action {
                    "abort" => Action::Abort,
                    "fail" => Action::Fail(1),
                    _ => Action::Pause,
                };
                arm(step, action);
            }
        }
    }

    pub fn fails(scope: &str, step: &str) -> bool {
        let Ok(mut t) = table().lock() else {
            return false;
        };
        let scoped = format!("{scope}:{step}");
        let key = if t.contains_key(&scoped) {
            scoped
        } else {
            step.to_owned()
        };
        match t.get_mut(&key) {
            Some((Action::Fail(times), n)) if *n < *times as usize => {
                *n += 1;
                true
            }
            _ => false,
        }
    }

    pub async fn hit(scope: &str, step: &str) {
        let action = {
            let Ok(mut t) = table().lock() else { return };
            let scoped = format!("{scope}:{step}");
            let key = if t.contains_key(&scoped) {
                scoped
            } else {
                step.to_owned()
            };
            match t.get_mut(&key) {
                Some((a, n)) if *n == 0 && !matches!(a, Action::Fail(_)) => {
                    *n += 1;
                    Some(*a)
                }
                _ => None,
            }
        };
        match action {
            None | Some(Action::Fail(_)) => {}
            Some(Action::Abort) => {
                tracing::error!(step, "failpoint: aborting the process");
                std::process::abort();
            }
            Some(Action::Pause) => {
                tracing::warn!(step, "failpoint: pausing this task forever");
                std::future::pending::<()>().await;
            }
            Some(Action::Panic) => {
                tracing::error!(step, "failpoint: panicking this task");
                panic!("failpoint {step}: a deliberate panic");
            }
            Some(Action::Delay(d)) => {
                tracing::warn!(
                    step,
                    delay_ms = d.as_millis() as u64,
                    "failpoint: holding this task"
                );
                tokio::time::sleep(d).await;
            }
        }
    }
}

#[cfg(feature = "testing")]
pub use imp::{arm, arm_from_env, clear, hits};

/// Whether the step `step` of Host `scope` should fail now (armed with [`Action::Fail`]; each
/// call uses up one failure). Always false without the `testing` feature.
#[cfg(feature = "testing")]
pub fn fails(scope: &str, step: &str) -> bool {
    imp::fails(scope, step)
}

/// Whether a step should fail now (never, without the `testing` feature).
#[cfg(not(feature = "testing"))]
pub fn fails(_scope: &str, _step: &str) -> bool {
    false
}

/// Called at a named step by the Host `scope` (its host id). A step armed as
/// `"<host id>:<step>"` fires only for that Host; one armed as `"<step>"` for any.
#[cfg(feature = "testing")]
pub async fn hit(scope: &str, step: &str) {
    imp::hit(scope, step).await;
}

/// Called at a named step (no-op without the `testing` feature).
#[cfg(not(feature = "testing"))]
pub async fn hit(_scope: &str, _step: &str) {}
