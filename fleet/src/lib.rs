//! The fleet reconciler: re-places sessions no Host holds. One reconciler of a fleet acts at a
//! time, under a leadership lease in the store whose epoch fences a deposed leader (its
//! assignments are refused). A pass finds the sessions with admitted work not yet ended, no live
//! residency and no live assignment, and assigns each to a live, accepting Host chosen by
//! free admission weight and isolation class, spreading them, at most a bounded number per Host
//! and per pass so a Host's death does not stampede the survivors. The Host named acts on its
//! assignment (it attaches the session itself), so the reconciler needs no credential.
//!
//! It writes only leadership and assignment rows; it never touches a command, a lease or a
//! registration. `hostd serve` runs one per process of a fleet, `hostd controller` runs one
//! alone, and [`reconcile_once`] is the same pass for a Factory's own loop.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::time::Duration;

use sessionstore::placement::plan;
use sessionstore::{
    ErrorCode, HostId, HostLoad, Leadership, LeadershipRequest, PlacementRequest, Store,
    StoreError, TenantId,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// Why the reconciler could not work.
#[derive(Debug, thiserror::Error)]
pub enum ReconcilerError {
    #[error("invalid option {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl ReconcilerError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ReconcilerError::Invalid { .. } => "invalid",
            ReconcilerError::Store(e) => e.code().as_str(),
        }
    }
}

/// How the reconciler paces itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcilerOptions {
    /// The leadership's name: reconcilers sharing it elect one leader.
    pub name: String,
    /// How often a pass runs (and the leadership is renewed).
    pub interval: Duration,
    /// How long a leadership lives unrenewed (at least 2 intervals).
    pub leader_ttl: Duration,
    /// The most sessions one pass assigns.
    pub placements_per_pass: usize,
    /// The most sessions one pass assigns to one Host.
    pub placements_per_host: usize,
    /// How long an assignment stands if its Host never acts on it.
    pub assignment_ttl: Duration,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        ReconcilerOptions {
            name: "fleet".into(),
            interval: Duration::from_secs(1),
            leader_ttl: Duration::from_secs(5),
            placements_per_pass: 64,
            placements_per_host: 16,
            assignment_ttl: Duration::from_secs(10),
        }
    }
}

impl ReconcilerOptions {
    /// The pass interval that keeps up with a fleet whose advertisements and residency leases
    /// live `registry_expiry` unrenewed: a tenth of it, between 100 ms and the default 1 s.
    /// A session orphaned by a dead Host then waits at most a tenth of the expiry, after its
    /// lease lapses, for the pass that re-places it.
    pub fn interval_for(registry_expiry: Duration) -> Duration {
        (registry_expiry / 10).clamp(Duration::from_millis(100), Self::default().interval)
    }

    /// The leadership TTL for the same fleet: no longer than the registry expiry (capped at
    /// the default 5 s) and at least two intervals. When the leader dies with the Host whose
    /// sessions it must re-place, another reconciler leads by the time those sessions' leases
    /// lapse, so the leader's death adds nothing to the failover.
    pub fn leader_ttl_for(registry_expiry: Duration, interval: Duration) -> Duration {
        registry_expiry
            .min(Self::default().leader_ttl)
            .max(interval * 2)
    }

    /// Refuses options the reconciler cannot honour.
    pub fn validate(&self) -> Result<(), ReconcilerError> {
        let invalid = |field, reason: &str| {
            Err(ReconcilerError::Invalid {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.name.is_empty() || self.name.len() > 256 {
            return invalid("name", "must be 1 to 256 bytes");
        }
        let hour = Duration::from_secs(3600);
        for (field, d) in [
            ("interval", self.interval),
            ("leader_ttl", self.leader_ttl),
            ("assignment_ttl", self.assignment_ttl),
        ] {
            if d.is_zero() || d > hour {
                return invalid(field, "must be positive and at most 1 hour");
            }
        }
        if self.leader_ttl < self.interval * 2 {
            return invalid("leader_ttl", "must cover at least 2 intervals");
        }
        if self.assignment_ttl < self.interval * 2 {
            return invalid("assignment_ttl", "must cover at least 2 intervals");
        }
        for (field, n) in [
            ("placements_per_pass", self.placements_per_pass),
            ("placements_per_host", self.placements_per_host),
        ] {
            if n == 0 || n > 10_000 {
                return invalid(field, "must be between 1 and 10000");
            }
        }
        Ok(())
    }
}

/// One assignment a pass made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assigned {
    pub tenant: TenantId,
    pub session: sessionstore::SessionId,
    pub host: HostId,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PassReport {
    /// The leadership epoch the pass acted under (`None`: another reconciler leads).
    pub leader_epoch: Option<u64>,
    /// Sessions found with work and no live residency.
    pub orphans: usize,
    pub assigned: Vec<Assigned>,
    /// Orphans left for a later pass (no room, pacing, or a lost race).
    pub deferred: usize,
}

/// One reconcile pass under `leadership`, ending by half the leadership's TTL from now (what
/// is left then is deferred to the next pass). See [`reconcile_until`].
pub async fn reconcile_once(
    store: &Store,
    leadership: &Leadership,
    options: &ReconcilerOptions,
) -> Result<PassReport, ReconcilerError> {
    let deadline = tokio::time::Instant::now() + options.leader_ttl / 2;
    reconcile_until(store, leadership, options, deadline).await
}

/// One reconcile pass under `leadership`: scan, plan, assign, assigning nothing once
/// `deadline` has passed (the rest is deferred to the next pass, which renews the leadership
/// first). A long pass (a slow store, a busy machine, many placements) so never outlives the
/// leadership it acts under and hands the fleet to another reconciler. An assignment refused
/// because the session became resident meanwhile is skipped; one refused because the
/// leadership is no longer current ends the pass with that error.
pub async fn reconcile_until(
    store: &Store,
    leadership: &Leadership,
    options: &ReconcilerOptions,
    deadline: tokio::time::Instant,
) -> Result<PassReport, ReconcilerError> {
    let scan_limit = options.placements_per_pass.saturating_mul(4);
    let orphans = store.orphans(scan_limit).await?;
    let mut report = PassReport {
        leader_epoch: Some(leadership.epoch),
        orphans: orphans.len(),
        ..PassReport::default()
    };
    if orphans.is_empty() {
        return Ok(report);
    }
    let now = store.now_ms().await?;
    let targets = store.targets(true).await?;
    let loads = store.host_loads().await?;
    let planned = plan(
        &targets,
        &loads,
        &orphans,
        now,
        options.placements_per_pass,
        options.placements_per_host,
    );
    report.deferred = orphans.len() - planned.len();
    let planned_count = planned.len();
    for (done, (o, target)) in planned.into_iter().enumerate() {
        if tokio::time::Instant::now() >= deadline {
            report.deferred += planned_count - done;
            tracing::debug!(
                deferred = planned_count - done,
                "the pass reached half the leadership's TTL; the rest waits for the next pass"
            );
            break;
        }
        let span = tracing::info_span!("place", tenant = %o.tenant, session = %o.session, host = %target.host, leader_epoch = leadership.epoch);
        let req = PlacementRequest {
            tenant: o.tenant.clone(),
            session: o.session.clone(),
            host: target.host.clone(),
            host_generation: target.generation,
            leadership: leadership.clone(),
            ttl: options.assignment_ttl,
        };
        // The span is entered only around code that does not await: a guard held across an
        // await leaves the span entered on a worker thread other tasks then run on, and the
        // tracing registry panics when it later sees the span closed twice.
        let placed = store
            .assign_placement(req, o.command.clone())
            .instrument(span.clone())
            .await;
        let _enter = span.enter();
        match placed {
            Ok(_) => {
                tracing::info!("assigned an orphaned session");
                report.assigned.push(Assigned {
                    tenant: o.tenant,
                    session: o.session,
                    host: target.host,
                });
            }
            Err(e)
                if matches!(
                    e.code(),
                    ErrorCode::ClaimHeld | ErrorCode::NotFound | ErrorCode::Conflict
                ) =>
            {
                tracing::debug!(error = %e, "the session needs no assignment now");
                report.deferred += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(report)
}

/// A reconciler: campaigns for the leadership every interval and, while it leads, runs a pass.
pub struct Reconciler {
    store: Store,
    options: ReconcilerOptions,
    holder: String,
    held: Option<Leadership>,
}

impl Reconciler {
    /// A reconciler identified by `who` (a Host id, or a controller name) plus a fresh token.
    pub fn new(
        store: Store,
        options: ReconcilerOptions,
        who: &str,
    ) -> Result<Reconciler, ReconcilerError> {
        options.validate()?;
        let holder = format!("{who}/{}", uuid::Uuid::now_v7());
        Ok(Reconciler {
            store,
            options,
            holder,
            held: None,
        })
    }

    /// The leadership held now, if any.
    pub fn leadership(&self) -> Option<&Leadership> {
        self.held.as_ref()
    }

    /// Campaigns (acquire or renew), then runs a pass when leading.
    pub async fn pass(&mut self) -> Result<PassReport, ReconcilerError> {
        // The leadership is renewed (or won) by the campaign below: the pass may act until
        // half its TTL from before the campaign began.
        let deadline = tokio::time::Instant::now() + self.options.leader_ttl / 2;
        let campaign = self
            .store
            .acquire_leadership(LeadershipRequest {
                name: self.options.name.clone(),
                holder: self.holder.clone(),
                ttl: self.options.leader_ttl,
            })
            .await;
        let leadership = match campaign {
            Ok(l) => {
                if self.held.as_ref().is_none_or(|h| h.epoch != l.epoch) {
                    tracing::info!(epoch = l.epoch, holder = %self.holder, "leading the fleet reconciler");
                }
                self.held = Some(l.clone());
                l
            }
            Err(e) if e.code() == ErrorCode::ClaimHeld => {
                self.held = None;
                return Ok(PassReport::default());
            }
            Err(e) => {
                self.held = None;
                return Err(e.into());
            }
        };
        let result = reconcile_until(&self.store, &leadership, &self.options, deadline).await;
        if let Err(ReconcilerError::Store(e)) = &result
            && matches!(e.code(), ErrorCode::Epoch | ErrorCode::ClaimLost)
        {
            self.held = None;
        }
        result
    }

    /// Runs passes every interval until `shutdown`, then gives the leadership back.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.options.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            match self.pass().await {
                Ok(r) if !r.assigned.is_empty() || r.deferred > 0 => {
                    tracing::info!(
                        assigned = r.assigned.len(),
                        deferred = r.deferred,
                        orphans = r.orphans,
                        "fleet reconcile pass"
                    );
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "fleet reconcile pass failed"),
            }
        }
        if let Some(l) = self.held.take()
            && let Err(e) = self.store.release_leadership(&l).await
        {
            tracing::warn!(error = %e, "releasing the fleet leadership failed");
        }
    }
}

/// How many sessions each Host holds or is being given (for views).
pub fn sessions_by_host(loads: &[HostLoad]) -> HashMap<HostId, (u32, u32)> {
    loads
        .iter()
        .filter_map(|l| l.host.clone().map(|h| (h, (l.sessions, l.placing))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_refuse_a_leadership_shorter_than_two_intervals() {
        let o = ReconcilerOptions {
            leader_ttl: Duration::from_millis(1500),
            ..ReconcilerOptions::default()
        };
        assert!(matches!(
            o.validate(),
            Err(ReconcilerError::Invalid {
                field: "leader_ttl",
                ..
            })
        ));
        assert!(ReconcilerOptions::default().validate().is_ok());
    }
}
