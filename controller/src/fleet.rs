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

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use sessionstore::{
    ErrorCode, HostId, HostLoad, HostTarget, Leadership, LeadershipRequest, Orphan, Placement,
    PlacementRequest, Store, StoreError, TenantId,
};
use tokio_util::sync::CancellationToken;

/// The isolation class under which a Host holds one tenant at a time.
pub const TENANT_EXCLUSIVE: &str = "tenant_exclusive";

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

/// A Host's standing as placement sees it.
#[derive(Clone, Debug)]
struct Candidate {
    target: HostTarget,
    /// Sessions held or being placed there.
    load: u32,
    /// Admission weight left (weight charged or sessions held, whichever is more).
    free: u32,
    tenants: Vec<TenantId>,
    this_pass: usize,
}

/// Ranks the live, accepting Hosts for a session of `tenant`, best first: most free weight,
/// then fewest sessions, then a per-session hash (never the id order, so no Host wins every
/// tie). A tenant-exclusive Host holding another tenant, or a full one, is left out. Dedicated
/// Hosts are included (one takes only its fixed session and refuses the others).
pub fn rank_hosts(
    targets: &[HostTarget],
    loads: &[HostLoad],
    tenant: &TenantId,
    session: &str,
    now_ms: i64,
) -> Vec<HostTarget> {
    let mut c = candidates(targets, loads, now_ms, true);
    c.retain(|c| admits(c, tenant));
    sort(&mut c, session);
    c.into_iter().map(|c| c.target).collect()
}

fn candidates(
    targets: &[HostTarget],
    loads: &[HostLoad],
    now_ms: i64,
    dedicated_too: bool,
) -> Vec<Candidate> {
    targets
        .iter()
        .filter(|t| {
            t.accepting && t.is_live(now_ms) && (dedicated_too || t.placement == Placement::Pooled)
        })
        .map(|t| {
            let load = loads.iter().find(|l| l.host.as_ref() == Some(&t.host));
            let sessions = load.map_or(0, |l| l.sessions);
            let placing = load.map_or(0, |l| l.placing);
            let used = t.weight_used.max(sessions).saturating_add(placing);
            Candidate {
                target: t.clone(),
                load: sessions.saturating_add(placing),
                free: t.capacity.saturating_sub(used),
                tenants: load.map(|l| l.tenants.clone()).unwrap_or_default(),
                this_pass: 0,
            }
        })
        .collect()
}

fn admits(c: &Candidate, tenant: &TenantId) -> bool {
    c.free > 0
        && (c.target.isolation_class != TENANT_EXCLUSIVE || c.tenants.iter().all(|t| t == tenant))
}

fn tie_break(session: &str, host: &HostId) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    session.hash(&mut h);
    host.as_str().hash(&mut h);
    h.finish()
}

fn sort(c: &mut [Candidate], session: &str) {
    c.sort_by(|a, b| {
        b.free
            .cmp(&a.free)
            .then(a.load.cmp(&b.load))
            .then(tie_break(session, &a.target.host).cmp(&tie_break(session, &b.target.host)))
    });
}

/// Chooses a pooled Host for each orphan, in order, updating the standing as it goes (one
/// session is charged one unit of weight until its Host's next heartbeat says more), and never
/// more than `per_host` per Host nor `per_pass` in all. Dedicated Hosts are left out: the
/// store does not say which session one is fixed to.
pub fn plan(
    targets: &[HostTarget],
    loads: &[HostLoad],
    orphans: &[Orphan],
    now_ms: i64,
    per_pass: usize,
    per_host: usize,
) -> Vec<(Orphan, HostTarget)> {
    let mut pool = candidates(targets, loads, now_ms, false);
    let mut out = Vec::new();
    for o in orphans {
        if out.len() >= per_pass {
            break;
        }
        let mut fit: Vec<usize> = (0..pool.len())
            .filter(|&i| pool[i].this_pass < per_host && admits(&pool[i], &o.tenant))
            .collect();
        fit.sort_by(|&a, &b| {
            let (a, b) = (&pool[a], &pool[b]);
            b.free.cmp(&a.free).then(a.load.cmp(&b.load)).then(
                tie_break(o.session.as_str(), &a.target.host)
                    .cmp(&tie_break(o.session.as_str(), &b.target.host)),
            )
        });
        let Some(&i) = fit.first() else { continue };
        let c = &mut pool[i];
        c.free -= 1;
        c.load = c.load.saturating_add(1);
        c.this_pass += 1;
        if !c.tenants.contains(&o.tenant) {
            c.tenants.push(o.tenant.clone());
        }
        out.push((o.clone(), c.target.clone()));
    }
    out
}

/// One reconcile pass under `leadership`: scan, plan, assign. An assignment refused because the
/// session became resident meanwhile is skipped; one refused because the leadership is no
/// longer current ends the pass with that error.
pub async fn reconcile_once(
    store: &Store,
    leadership: &Leadership,
    options: &ReconcilerOptions,
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
    for (o, target) in planned {
        let span = tracing::info_span!("place", tenant = %o.tenant, session = %o.session, host = %target.host, leader_epoch = leadership.epoch);
        let _enter = span.enter();
        let req = PlacementRequest {
            tenant: o.tenant.clone(),
            session: o.session.clone(),
            host: target.host.clone(),
            host_generation: target.generation,
            leadership: leadership.clone(),
            ttl: options.assignment_ttl,
        };
        match store.assign_placement(req, o.command.clone()).await {
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
        let result = reconcile_once(&self.store, &leadership, &self.options).await;
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
    use sessionstore::{CommandId, SessionId};

    fn target(name: &str, capacity: u32, class: &str) -> HostTarget {
        HostTarget {
            host: HostId::new(name).unwrap(),
            endpoint: format!("ws://{name}:1"),
            placement: Placement::Pooled,
            isolation_class: class.into(),
            capacity,
            accepting: true,
            generation: 1,
            observed_at_ms: 0,
            expires_at_ms: 10_000,
            weight_used: 0,
        }
    }

    fn orphan(tenant: &str, i: usize) -> Orphan {
        Orphan {
            tenant: TenantId::new(tenant).unwrap(),
            session: SessionId::new(format!("s{i}")).unwrap(),
            command: CommandId::new("c").unwrap(),
        }
    }

    fn count(plan: &[(Orphan, HostTarget)], host: &str) -> usize {
        plan.iter().filter(|(_, t)| t.host.as_str() == host).count()
    }

    #[test]
    fn thirty_orphans_spread_over_three_hosts_with_none_above_twelve() {
        let targets = [
            target("a", 64, "shared"),
            target("b", 64, "shared"),
            target("c", 64, "shared"),
        ];
        let orphans: Vec<Orphan> = (0..30).map(|i| orphan("t", i)).collect();
        let p = plan(&targets, &[], &orphans, 0, 100, 100);
        assert_eq!(p.len(), 30);
        for h in ["a", "b", "c"] {
            assert_eq!(count(&p, h), 10, "{h}");
        }
    }

    #[test]
    fn the_emptiest_host_is_chosen_first_whatever_its_id() {
        let mut a = target("a", 10, "shared");
        a.weight_used = 8;
        let targets = [a, target("z", 10, "shared")];
        let p = plan(&targets, &[], &[orphan("t", 0)], 0, 10, 10);
        assert_eq!(p[0].1.host.as_str(), "z");
    }

    #[test]
    fn draining_expired_full_and_dedicated_hosts_are_never_chosen() {
        let mut draining = target("draining", 10, "shared");
        draining.accepting = false;
        let mut expired = target("expired", 10, "shared");
        expired.expires_at_ms = 5;
        let mut full = target("full", 2, "shared");
        full.weight_used = 2;
        let mut dedicated = target("dedicated", 1, "shared");
        dedicated.placement = Placement::Dedicated;
        let targets = [draining, expired, full, dedicated];
        assert!(plan(&targets, &[], &[orphan("t", 0)], 10, 10, 10).is_empty());
    }

    #[test]
    fn a_tenant_exclusive_host_takes_only_the_tenant_it_holds() {
        let targets = [target("x", 10, TENANT_EXCLUSIVE)];
        let loads = [HostLoad {
            host: Some(HostId::new("x").unwrap()),
            sessions: 1,
            tenants: vec![TenantId::new("acme").unwrap()],
            placing: 0,
        }];
        let p = plan(
            &targets,
            &loads,
            &[orphan("other", 0), orphan("acme", 1)],
            0,
            10,
            10,
        );
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0.tenant.as_str(), "acme");
        // Within one pass, the first tenant placed on an empty exclusive Host claims it.
        let p = plan(
            &[target("y", 10, TENANT_EXCLUSIVE)],
            &[],
            &[orphan("one", 0), orphan("two", 1)],
            0,
            10,
            10,
        );
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn pacing_bounds_each_host_and_the_pass() {
        let targets = [target("a", 100, "shared"), target("b", 100, "shared")];
        let orphans: Vec<Orphan> = (0..50).map(|i| orphan("t", i)).collect();
        let p = plan(&targets, &[], &orphans, 0, 100, 7);
        assert_eq!(p.len(), 14);
        let p = plan(&targets, &[], &orphans, 0, 9, 100);
        assert_eq!(p.len(), 9);
    }

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
