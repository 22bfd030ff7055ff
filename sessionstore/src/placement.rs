//! Placement policy over the fleet registry, as pure functions: which live, accepting Host a
//! session should go to ([`rank_hosts`], for a controller placing one session) and how a pass
//! of the fleet reconciler spreads orphaned sessions over the Hosts ([`plan`]). Both the
//! HostLink client and the reconciler use it, so the rules live once. It reads registry rows
//! and writes nothing.

use std::hash::{Hash, Hasher};

use crate::{HostId, HostLoad, HostTarget, Orphan, Placement, TenantId};

/// The isolation class under which a Host holds one tenant at a time.
pub const TENANT_EXCLUSIVE: &str = "tenant_exclusive";

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CommandId, SessionId};

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
}
