//! Whether this Host can do its work now, and if not, why: the one source `/readyz` answers
//! from. Owns the store probe's findings (the store unreachable past a bound, this Host's id
//! taken by a newer generation), whether the heartbeat renewed the leases in time, and the
//! persistence faults sessions latched; the lifecycle flags (started, draining) stay the
//! residency owner's and are passed in. Never decides to
//! stop anything itself: a fence is announced on a watch channel for the process to act on.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

/// Every code a [`NotReady`] reason carries, in a fixed order (`/metrics` exports one
/// `host_not_ready` series per code).
pub const REASON_CODES: [&str; 5] = [
    "starting",
    "draining",
    "fenced",
    "store_unreachable",
    "persistence_fault",
];

/// One reason the Host is not ready, with a stable code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NotReady {
    /// `starting`, `draining`, `fenced`, `store_unreachable` or `persistence_fault`.
    pub code: &'static str,
    /// A short sentence for an operator.
    pub detail: String,
}

/// What `/readyz` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadinessReport {
    pub ready: bool,
    pub reasons: Vec<NotReady>,
}

impl ReadinessReport {
    /// The text form: `ready`, or `not ready: <code> (<detail>); …`.
    pub fn text(&self) -> String {
        if self.ready {
            return "ready\n".to_owned();
        }
        let reasons: Vec<String> = self
            .reasons
            .iter()
            .map(|r| format!("{} ({})", r.code, r.detail))
            .collect();
        format!("not ready: {}\n", reasons.join("; "))
    }
}

/// This Host's id was taken by a newer generation: it must not serve on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub own_generation: u64,
    pub newer_generation: u64,
}

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "another Host registered this host id at generation {} (this one is generation {})",
            self.newer_generation, self.own_generation
        )
    }
}

struct Probed {
    /// The last time the store answered the probe.
    last_ok: Instant,
    /// The last probe failure, while failures continue.
    failing: Option<String>,
}

struct Fault {
    at: Instant,
    /// Who failed to write, as the start of a sentence ("session s-1 latched a fault").
    what: String,
    reason: String,
}

/// The Host's readiness findings.
pub(crate) struct Readiness {
    bound: Duration,
    probed: Mutex<Probed>,
    /// Since when, and why, no heartbeat has renewed this Host's leases in time (every
    /// residency was given up); cleared by the next heartbeat that goes through.
    unrenewed: Mutex<Option<(Instant, String)>>,
    fault: Mutex<Option<Fault>>,
    fence: watch::Sender<Option<Fence>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Readiness {
    /// Findings for a Host whose store may be unreachable for at most `bound` before it is
    /// reported.
    pub(crate) fn new(bound: Duration) -> Readiness {
        Readiness {
            bound,
            probed: Mutex::new(Probed {
                last_ok: Instant::now(),
                failing: None,
            }),
            unrenewed: Mutex::new(None),
            fault: Mutex::new(None),
            fence: watch::channel(None).0,
        }
    }

    /// How long the store may be unreachable before `/readyz` says so.
    pub(crate) fn bound(&self) -> Duration {
        self.bound
    }

    /// The store answered the probe. A latched fault older than the bound is cleared when
    /// `wrote` (the probe's write went through): the store takes writes again.
    pub(crate) fn store_answered(&self, wrote: bool) {
        let mut p = lock(&self.probed);
        p.last_ok = Instant::now();
        p.failing = None;
        drop(p);
        if wrote {
            let mut f = lock(&self.fault);
            if f.as_ref().is_some_and(|f| f.at.elapsed() >= self.bound) {
                *f = None;
            }
        }
    }

    /// The store did not answer the probe.
    pub(crate) fn store_failed(&self, reason: String) {
        lock(&self.probed).failing = Some(reason);
    }

    /// No heartbeat renewed the leases in time: every residency was given up. Reported as
    /// `store_unreachable` at once, whatever the probe's bound, until
    /// [`Readiness::leases_renewed`].
    pub(crate) fn leases_unrenewed(&self, why: String) {
        let mut u = lock(&self.unrenewed);
        if u.is_none() {
            *u = Some((Instant::now(), why));
        }
    }

    /// A heartbeat went through: the leases are renewed again.
    pub(crate) fn leases_renewed(&self) {
        *lock(&self.unrenewed) = None;
    }

    /// A session latched a persistence fault.
    pub(crate) fn persistence_fault(&self, session: String, reason: String) {
        *lock(&self.fault) = Some(Fault {
            at: Instant::now(),
            what: format!("session {session} latched a fault"),
            reason,
        });
    }

    /// The Host's own heartbeat write failed on a definite store fault (a full disk, a file
    /// I/O error): the store answers reads but takes no writes, so nothing can be admitted or
    /// applied here. Reported like a latched fault, and cleared the same way. Each failure
    /// renews it, so it holds until a write goes through after the last one.
    pub(crate) fn host_write_failed(&self, reason: String) {
        *lock(&self.fault) = Some(Fault {
            at: Instant::now(),
            what: "the Host's heartbeat write failed".to_owned(),
            reason,
        });
    }

    /// True while a latched fault is held (the probe then also tries a write).
    pub(crate) fn holds_fault(&self) -> bool {
        lock(&self.fault).is_some()
    }

    /// This Host is fenced by a newer generation of its own id (announced once).
    pub(crate) fn fenced(&self, fence: Fence) {
        self.fence.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(fence);
                true
            } else {
                false
            }
        });
    }

    /// Watches for a fence.
    pub(crate) fn fences(&self) -> watch::Receiver<Option<Fence>> {
        self.fence.subscribe()
    }

    /// The report, given the lifecycle flags the residency owner holds.
    pub(crate) fn report(&self, started: bool, draining: bool) -> ReadinessReport {
        let mut reasons = Vec::new();
        if !started {
            reasons.push(NotReady {
                code: "starting",
                detail: "the Host has not started".into(),
            });
        }
        if draining {
            reasons.push(NotReady {
                code: "draining",
                detail: "the Host is draining and admits nothing".into(),
            });
        }
        if let Some(f) = self.fence.borrow().as_ref() {
            reasons.push(NotReady {
                code: "fenced",
                detail: f.to_string(),
            });
        }
        if let Some((since, why)) = lock(&self.unrenewed).as_ref() {
            reasons.push(NotReady {
                code: "store_unreachable",
                detail: format!(
                    "no heartbeat renewed this Host's leases in time ({why}); every residency was given up {} ms ago",
                    since.elapsed().as_millis()
                ),
            });
        } else {
            let p = lock(&self.probed);
            let silent = p.last_ok.elapsed();
            if let Some(why) = &p.failing
                && silent > self.bound
            {
                reasons.push(NotReady {
                    code: "store_unreachable",
                    detail: format!("no answer for {} ms: {why}", silent.as_millis()),
                });
            }
        }
        if let Some(f) = lock(&self.fault).as_ref() {
            reasons.push(NotReady {
                code: "persistence_fault",
                detail: format!("{}: {}", f.what, f.reason),
            });
        }
        ReadinessReport {
            ready: reasons.is_empty(),
            reasons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_host_with_an_answering_store_is_ready() {
        let r = Readiness::new(Duration::from_secs(5));
        r.store_answered(false);
        let report = r.report(true, false);
        assert!(report.ready);
        assert_eq!(report.text(), "ready\n");
    }

    #[test]
    fn leases_given_up_unrenewed_report_store_unreachable_at_once_until_a_renewal() {
        // A probe bound far longer than the test: only the heartbeat's finding can say it.
        let r = Readiness::new(Duration::from_secs(3600));
        r.store_answered(false);
        r.leases_unrenewed("no heartbeat answered".into());
        let report = r.report(true, false);
        assert!(!report.ready);
        assert_eq!(report.reasons[0].code, "store_unreachable");
        assert!(report.reasons[0].detail.contains("no heartbeat answered"));
        r.leases_renewed();
        assert!(r.report(true, false).ready);
    }

    #[test]
    fn draining_starting_and_fenced_each_give_a_reason() {
        let r = Readiness::new(Duration::from_secs(5));
        r.fenced(Fence {
            own_generation: 3,
            newer_generation: 4,
        });
        let report = r.report(false, true);
        let codes: Vec<_> = report.reasons.iter().map(|r| r.code).collect();
        assert_eq!(codes, ["starting", "draining", "fenced"]);
        assert!(
            report.text().starts_with("not ready: starting"),
            "{}",
            report.text()
        );
    }

    #[test]
    fn an_unreachable_store_is_reported_only_past_the_bound() {
        let r = Readiness::new(Duration::from_millis(30));
        r.store_failed("connection refused".into());
        assert!(r.report(true, false).ready, "within the bound");
        std::thread::sleep(Duration::from_millis(40));
        let report = r.report(true, false);
        assert!(!report.ready);
        assert_eq!(report.reasons[0].code, "store_unreachable");
        r.store_answered(false);
        assert!(r.report(true, false).ready);
    }

    #[test]
    fn a_latched_fault_holds_until_a_write_goes_through_after_the_bound() {
        let r = Readiness::new(Duration::from_millis(20));
        r.persistence_fault("s1".into(), "disk full".into());
        assert_eq!(r.report(true, false).reasons[0].code, "persistence_fault");
        r.store_answered(true);
        assert!(!r.report(true, false).ready, "held for the bound");
        std::thread::sleep(Duration::from_millis(30));
        r.store_answered(false);
        assert!(!r.report(true, false).ready, "a read does not clear it");
        r.store_answered(true);
        assert!(r.report(true, false).ready);
    }

    #[test]
    fn a_failed_heartbeat_write_is_a_persistence_fault_held_until_a_write_goes_through() {
        let r = Readiness::new(Duration::from_millis(20));
        r.host_write_failed("sqlite: database or disk is full".into());
        let report = r.report(true, false);
        assert_eq!(report.reasons[0].code, "persistence_fault");
        assert!(report.reasons[0].detail.contains("heartbeat"), "{report:?}");
        std::thread::sleep(Duration::from_millis(30));
        r.store_answered(false);
        assert!(!r.report(true, false).ready, "a read does not clear it");
        r.store_answered(true);
        assert!(r.report(true, false).ready);
    }
}
