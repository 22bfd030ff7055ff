//! The link registry: every live link, the authenticated ones with their bindings, and the
//! routing table from a session to the links bound to it. Owns the bounds on links and
//! bindings (per link, per tenant, `max_tenant_links` with least-recently-used eviction of a
//! link holding no bindings) and route invalidation. Never performs I/O and never awaits: a
//! lock is held only for a table update.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use sessionstore::{SessionId, TenantId};
use tokio::sync::Notify;

use super::closer::Closer;
use crate::backend::LinkId;
use hostlink::codes::Disconnect;

/// An authenticated link's entry.
struct AdmittedLink {
    tenant: TenantId,
    closer: Arc<Closer>,
    /// Sessions bound (committed).
    bindings: HashSet<SessionId>,
    /// Binds in flight (counted against the bounds until committed or released).
    reserved: usize,
    /// The registry clock at the link's last command.
    last_used: u64,
    /// Bindings dropped by the registry that the link has not yet cleaned up.
    invalidated: HashSet<SessionId>,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct Tables {
    live: HashMap<LinkId, Arc<Closer>>,
    admitted: HashMap<LinkId, AdmittedLink>,
    tenant_bindings: HashMap<TenantId, usize>,
    routes: HashMap<(TenantId, SessionId), HashSet<LinkId>>,
    clock: u64,
    closing: Option<Disconnect>,
}

/// Why a bind was not reserved.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum BindingLimit {
    PerLink,
    PerTenant,
}

/// The registry shared by every link of one HostLink service.
pub(crate) struct Registry {
    tables: Mutex<Tables>,
    max_bindings_per_link: usize,
    max_bindings_per_tenant: usize,
    max_tenant_links: usize,
}

impl Registry {
    pub(crate) fn new(
        max_bindings_per_link: usize,
        max_bindings_per_tenant: usize,
        max_tenant_links: usize,
    ) -> Registry {
        Registry {
            tables: Mutex::new(Tables::default()),
            max_bindings_per_link,
            max_bindings_per_tenant,
            max_tenant_links,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        // A panic while holding this lock cannot leave a table half-updated in a way later
        // calls would misread (each update is a few inserts); keep serving.
        self.tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a live link (handshaking or authenticated). Returns the close reason when
    /// the service is already closing: the link must close at once.
    pub(crate) fn register_live(&self, link: LinkId, closer: Arc<Closer>) -> Option<Disconnect> {
        let mut t = self.lock();
        if let Some(d) = t.closing {
            return Some(d);
        }
        t.live.insert(link, closer);
        None
    }

    /// Admits an authenticated link. At `max_tenant_links` the least-recently-used link with
    /// no bindings (and no bind in flight) is evicted; its closer is returned so the caller
    /// closes it outside the lock. `Err` when every admitted link holds bindings.
    pub(crate) fn admit(
        &self,
        link: LinkId,
        tenant: TenantId,
        closer: Arc<Closer>,
        wake: Arc<Notify>,
    ) -> Result<Option<Arc<Closer>>, ()> {
        let mut t = self.lock();
        let mut evicted = None;
        if t.admitted.len() >= self.max_tenant_links {
            let victim = t
                .admitted
                .iter()
                .filter(|(_, a)| a.bindings.is_empty() && a.reserved == 0)
                .min_by_key(|(_, a)| a.last_used)
                .map(|(id, _)| *id);
            let victim = victim.ok_or(())?;
            if let Some(a) = t.admitted.remove(&victim) {
                evicted = Some(a.closer);
            }
        }
        t.clock += 1;
        let last_used = t.clock;
        t.admitted.insert(
            link,
            AdmittedLink {
                tenant,
                closer,
                bindings: HashSet::new(),
                reserved: 0,
                last_used,
                invalidated: HashSet::new(),
                wake,
            },
        );
        Ok(evicted)
    }

    /// Marks a link as just used (for least-recently-used eviction).
    pub(crate) fn touch(&self, link: LinkId) {
        let mut t = self.lock();
        t.clock += 1;
        let now = t.clock;
        if let Some(a) = t.admitted.get_mut(&link) {
            a.last_used = now;
        }
    }

    /// Reserves room for a new binding of `session` on `link`.
    pub(crate) fn reserve_binding(&self, link: LinkId) -> Result<(), BindingLimit> {
        let mut t = self.lock();
        let Some(a) = t.admitted.get(&link) else {
            return Err(BindingLimit::PerLink);
        };
        if a.bindings.len() + a.reserved >= self.max_bindings_per_link {
            return Err(BindingLimit::PerLink);
        }
        let tenant = a.tenant.clone();
        let held = t.tenant_bindings.get(&tenant).copied().unwrap_or(0);
        if held >= self.max_bindings_per_tenant {
            return Err(BindingLimit::PerTenant);
        }
        t.tenant_bindings.insert(tenant, held + 1);
        if let Some(a) = t.admitted.get_mut(&link) {
            a.reserved += 1;
        }
        Ok(())
    }

    fn uncount_tenant(t: &mut Tables, tenant: &TenantId) {
        if let Some(n) = t.tenant_bindings.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                t.tenant_bindings.remove(tenant);
            }
        }
    }

    /// Gives back a reservation whose bind failed.
    pub(crate) fn release_reservation(&self, link: LinkId, tenant: &TenantId) {
        let mut t = self.lock();
        if let Some(a) = t.admitted.get_mut(&link) {
            a.reserved = a.reserved.saturating_sub(1);
        }
        Self::uncount_tenant(&mut t, tenant);
    }

    /// Turns a reservation into a binding. False when the link is gone (the count is given
    /// back).
    pub(crate) fn commit_binding(
        &self,
        link: LinkId,
        tenant: &TenantId,
        session: &SessionId,
    ) -> bool {
        let mut t = self.lock();
        let Some(a) = t.admitted.get_mut(&link) else {
            Self::uncount_tenant(&mut t, tenant);
            return false;
        };
        a.reserved = a.reserved.saturating_sub(1);
        a.bindings.insert(session.clone());
        a.invalidated.remove(session);
        t.routes
            .entry((tenant.clone(), session.clone()))
            .or_default()
            .insert(link);
        true
    }

    fn unroute(t: &mut Tables, link: LinkId, tenant: &TenantId, session: &SessionId) {
        let key = (tenant.clone(), session.clone());
        if let Some(links) = t.routes.get_mut(&key) {
            links.remove(&link);
            if links.is_empty() {
                t.routes.remove(&key);
            }
        }
    }

    /// Drops one binding the link itself gave up (unbind).
    pub(crate) fn drop_binding(&self, link: LinkId, tenant: &TenantId, session: &SessionId) {
        let mut t = self.lock();
        let removed = t
            .admitted
            .get_mut(&link)
            .is_some_and(|a| a.bindings.remove(session));
        if removed {
            Self::uncount_tenant(&mut t, tenant);
            Self::unroute(&mut t, link, tenant, session);
        }
    }

    /// Whether `session` is bound on `link` (not invalidated).
    pub(crate) fn is_bound(&self, link: LinkId, session: &SessionId) -> bool {
        self.lock()
            .admitted
            .get(&link)
            .is_some_and(|a| a.bindings.contains(session))
    }

    fn invalidate_locked(t: &mut Tables, link: LinkId, session: &SessionId) {
        let Some(a) = t.admitted.get_mut(&link) else {
            return;
        };
        if !a.bindings.remove(session) {
            return;
        }
        a.invalidated.insert(session.clone());
        let tenant = a.tenant.clone();
        a.wake.notify_one();
        Self::uncount_tenant(t, &tenant);
        Self::unroute(t, link, &tenant, session);
    }

    /// A session's tail ended: every binding for it is dropped now; each link cleans up its
    /// subscription when woken.
    pub(crate) fn invalidate_session(&self, tenant: &TenantId, session: &SessionId) {
        let mut t = self.lock();
        let links: Vec<LinkId> = t
            .routes
            .get(&(tenant.clone(), session.clone()))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for link in links {
            Self::invalidate_locked(&mut t, link, session);
        }
    }

    /// One link's feed for a session ended: drop that binding.
    pub(crate) fn invalidate_link_session(&self, link: LinkId, session: &SessionId) {
        let mut t = self.lock();
        Self::invalidate_locked(&mut t, link, session);
    }

    /// Invalidations were missed (the notification channel lagged): drop every binding.
    pub(crate) fn invalidate_everything(&self) {
        let mut t = self.lock();
        let all: Vec<(LinkId, SessionId)> = t
            .admitted
            .iter()
            .flat_map(|(id, a)| a.bindings.iter().map(move |s| (*id, s.clone())))
            .collect();
        for (link, session) in all {
            Self::invalidate_locked(&mut t, link, &session);
        }
    }

    /// Takes the bindings the registry dropped for `link` since the last call.
    pub(crate) fn take_invalidated(&self, link: LinkId) -> Vec<SessionId> {
        let mut t = self.lock();
        t.admitted
            .get_mut(&link)
            .map(|a| a.invalidated.drain().collect())
            .unwrap_or_default()
    }

    /// Forgets a link that ended, with its bindings.
    pub(crate) fn remove_link(&self, link: LinkId) {
        let mut t = self.lock();
        t.live.remove(&link);
        if let Some(a) = t.admitted.remove(&link) {
            for session in &a.bindings {
                Self::uncount_tenant(&mut t, &a.tenant);
                Self::unroute(&mut t, link, &a.tenant, session);
            }
            for _ in 0..a.reserved {
                Self::uncount_tenant(&mut t, &a.tenant);
            }
        }
    }

    /// Refuses new links from now on and returns every live link's closer.
    pub(crate) fn start_closing(&self, disconnect: Disconnect) -> Vec<Arc<Closer>> {
        let mut t = self.lock();
        t.closing.get_or_insert(disconnect);
        t.live.values().cloned().collect()
    }

    /// The close reason, once closing.
    pub(crate) fn closing(&self) -> Option<Disconnect> {
        self.lock().closing
    }

    /// How many links are live (handshaking or authenticated).
    pub(crate) fn live_links(&self) -> usize {
        self.lock().live.len()
    }

    /// How many bindings a tenant holds.
    pub(crate) fn tenant_bindings(&self, tenant: &TenantId) -> usize {
        self.lock()
            .tenant_bindings
            .get(tenant)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }
    fn s(v: &str) -> SessionId {
        SessionId::new(v).unwrap()
    }

    fn admit(r: &Registry, tenant: &str) -> (LinkId, Arc<Closer>, Result<Option<Arc<Closer>>, ()>) {
        let id = LinkId::mint();
        let closer = Arc::new(Closer::new());
        let res = r.admit(id, t(tenant), closer.clone(), Arc::new(Notify::new()));
        (id, closer, res)
    }

    #[test]
    fn the_least_recently_used_idle_link_is_evicted_at_the_bound() {
        let r = Registry::new(10, 10, 2);
        let (a, a_closer, _) = admit(&r, "t1");
        let (b, b_closer, _) = admit(&r, "t2");
        r.reserve_binding(a).unwrap();
        assert!(r.commit_binding(a, &t("t1"), &s("s")));
        r.touch(b);
        let (_, _, res) = admit(&r, "t3");
        let evicted = res.unwrap().expect("an idle link is evicted");
        assert!(Arc::ptr_eq(&evicted, &b_closer));
        assert!(!a_closer.is_closed());
        // a holds a binding, b was evicted: the next admission evicts the newest idle one.
        let (_, _, res) = admit(&r, "t4");
        assert!(res.unwrap().is_some());
        r.drop_binding(a, &t("t1"), &s("s"));
        assert_eq!(r.tenant_bindings(&t("t1")), 0);
    }

    #[test]
    fn admission_is_refused_when_every_link_holds_bindings() {
        let r = Registry::new(10, 10, 1);
        let (a, _, _) = admit(&r, "t1");
        r.reserve_binding(a).unwrap();
        let (_, _, res) = admit(&r, "t2");
        assert!(res.is_err(), "a bind in flight also protects the link");
    }

    #[test]
    fn bindings_are_bounded_per_link_and_per_tenant() {
        let r = Registry::new(2, 3, 10);
        let (a, _, _) = admit(&r, "t");
        let (b, _, _) = admit(&r, "t");
        for i in 0..2 {
            r.reserve_binding(a).unwrap();
            assert!(r.commit_binding(a, &t("t"), &s(&format!("a{i}"))));
        }
        assert_eq!(r.reserve_binding(a), Err(BindingLimit::PerLink));
        r.reserve_binding(b).unwrap();
        assert_eq!(r.reserve_binding(b), Err(BindingLimit::PerTenant));
        r.release_reservation(b, &t("t"));
        r.remove_link(a);
        assert_eq!(r.tenant_bindings(&t("t")), 0);
        r.reserve_binding(b).unwrap();
    }

    #[test]
    fn invalidating_a_session_drops_it_on_every_link_and_wakes_them() {
        let r = Registry::new(10, 10, 10);
        let (a, _, _) = admit(&r, "t");
        let (b, _, _) = admit(&r, "t");
        for link in [a, b] {
            r.reserve_binding(link).unwrap();
            assert!(r.commit_binding(link, &t("t"), &s("x")));
        }
        r.invalidate_session(&t("t"), &s("x"));
        assert!(!r.is_bound(a, &s("x")));
        assert_eq!(r.take_invalidated(a), vec![s("x")]);
        assert_eq!(r.take_invalidated(b), vec![s("x")]);
        assert!(r.take_invalidated(b).is_empty());
        assert_eq!(r.tenant_bindings(&t("t")), 0);
    }
}
