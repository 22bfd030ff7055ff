//! The fleet's operations on the store handle: a Host's heartbeat, its generation floor, the
//! reconciler's leadership and placement assignments, and the reads placement and the views
//! use. The rules live in `crate::fleet`; this is the edge (validation) and the dispatch to
//! the open backend.

use super::*;
use crate::fleet::{
    self, HeartbeatReport, HostHeartbeat, HostLoad, Leadership, LeadershipRequest, Orphan,
    PlacementRecord, PlacementRequest,
};
use crate::ops::Tx as _;

/// The most orphans one scan returns.
pub const MAX_ORPHANS_PER_SCAN: usize = 10_000;

impl Store {
    /// A Host's heartbeat, as one write transaction: publishes its advertisement and charged
    /// weight (a lower generation is refused with `epoch`), renews every live residency lease
    /// and refreshes every registration this Host and generation hold (to the advertisement's
    /// expiry), and collects other Hosts' advertisements expired for longer than the retention.
    /// Whatever the number of sessions, one durable write.
    pub async fn heartbeat(&self, hb: HostHeartbeat) -> StoreResult<HeartbeatReport> {
        let a = &hb.advertisement;
        check_epoch("generation", a.generation)?;
        check_endpoint(&a.endpoint)?;
        check_short_text("isolation_class", &a.isolation_class)?;
        let ttl = ttl_ms(
            "advertisement_ttl",
            a.ttl,
            MAX_REGISTRATION_TTL.min(MAX_LEASE_TTL),
        )?;
        let retention = ttl_ms(
            "retention",
            hb.retention,
            Duration::from_secs(7 * 24 * 3600),
        )?;
        write_op!(
            self,
            WriteKey::host(&hb.advertisement.host),
            [hb],
            |tx, now| tx.heartbeat(&hb, ttl, retention, now)
        )
    }

    /// The first generation a starting Host may take: one above any generation its id holds
    /// anywhere in the store, so a collected advertisement never lets an id reuse one.
    pub async fn next_host_generation(&self, host: &HostId) -> StoreResult<u64> {
        let host = host.clone();
        let floor = read_op!(self, |tx| tx.generation_floor(&host))?;
        Ok(floor.saturating_add(1))
    }

    /// Acquires the named leadership, or renews it for its holder (same epoch). Held live by
    /// another → `claim_held` with its epoch and expiry; an expired or released one is taken
    /// at the next epoch.
    pub async fn acquire_leadership(&self, req: LeadershipRequest) -> StoreResult<Leadership> {
        check_leadership_name(&req.name)?;
        check_holder(&req.holder)?;
        let ttl = ttl_ms("leader_ttl", req.ttl, MAX_LEASE_TTL)?;
        write_op!(
            self,
            leadership_key(&req.name),
            [req],
            |tx, now| async move {
                let current = tx.leadership(&req.name).await?;
                let granted = fleet::acquire_leadership(current.clone(), &req, ttl, now)?;
                tx.put_leadership(
                    &granted.name,
                    granted.epoch,
                    Some(&granted.holder),
                    Some(granted.expires_at_ms),
                )
                .await?;
                Ok(granted)
            }
        )
    }

    /// Releases a leadership its holder still holds (the epoch stays); anything else is left.
    pub async fn release_leadership(&self, l: &Leadership) -> StoreResult<()> {
        let l = l.clone();
        write_op!(self, leadership_key(&l.name), [l], |tx, _now| async move {
            match tx.leadership(&l.name).await? {
                Some((epoch, Some(holder), _)) if epoch == l.epoch && holder == l.holder => {
                    tx.put_leadership(&l.name, epoch, None, None).await
                }
                _ => Ok(()),
            }
        })
    }

    /// Assigns a session to a Host, under a leadership that must still be current and live
    /// (a deposed leader gets `epoch` or `claim_lost`). Refused with `claim_held` when the
    /// session holds a live residency lease by now. Announces a wake-up for the session.
    pub async fn assign_placement(
        &self,
        req: PlacementRequest,
        hint: CommandId,
    ) -> StoreResult<PlacementRecord> {
        check_epoch("host_generation", req.host_generation)?;
        let ttl = ttl_ms("placement_ttl", req.ttl, MAX_LEASE_TTL)?;
        let placed = write_op!(
            self,
            WriteKey::session(&req.tenant, &req.session),
            [req],
            |tx, now| async move {
                tx.require_leadership(&req.leadership, now).await?;
                require_session(tx, &req.tenant, &req.session).await?;
                if let Some(lease) = tx.lease(&req.tenant, &req.session).await?
                    && lease.is_live(now)
                {
                    return Err(StoreError::ClaimHeld {
                        field: "residency",
                        epoch: lease.epoch.0,
                        expires_at_ms: lease.expires_at_ms.unwrap_or(now),
                    });
                }
                let p = PlacementRecord {
                    tenant: req.tenant.clone(),
                    session: req.session.clone(),
                    host: req.host.clone(),
                    host_generation: req.host_generation,
                    leader_epoch: req.leadership.epoch,
                    assigned_at_ms: now,
                    expires_at_ms: now.saturating_add(ttl),
                };
                tx.put_placement(&p).await?;
                Ok(p)
            }
        )?;
        self.announce(Admission {
            tenant: placed.tenant.clone(),
            session: placed.session.clone(),
            command: hint,
        })
        .await;
        Ok(placed)
    }

    /// Drops a session's assignment to `host` (the Host acted on it, or could not).
    pub async fn clear_placement(
        &self,
        t: &TenantId,
        s: &SessionId,
        host: &HostId,
    ) -> StoreResult<bool> {
        let (t, s, host) = (t.clone(), s.clone(), host.clone());
        write_op!(self, WriteKey::session(&t, &s), [t, s, host], |tx, _now| {
            async move { Ok(tx.delete_placement(&t, &s, &host).await? > 0) }
        })
    }

    /// The live assignments of a Host's generation, oldest first.
    pub async fn placements_for(
        &self,
        host: &HostId,
        generation: u64,
    ) -> StoreResult<Vec<PlacementRecord>> {
        let now = self.now_ms().await?;
        let host = host.clone();
        read_op!(self, |tx| tx.placements_for(&host, generation, now))
    }

    /// The sessions whose live lease this Host's generation holds and that have a command not
    /// yet ended (what the Host's one reconcile loop wakes).
    pub async fn sessions_with_work(
        &self,
        host: &HostId,
        generation: u64,
    ) -> StoreResult<Vec<(TenantId, SessionId)>> {
        let now = self.now_ms().await?;
        let host = host.clone();
        read_op!(self, |tx| tx.sessions_with_work(&host, generation, now))
    }

    /// Sessions with a command not yet ended, no live residency and no live assignment, oldest
    /// admission first, at most `limit` (bounded by [`MAX_ORPHANS_PER_SCAN`]).
    pub async fn orphans(&self, limit: usize) -> StoreResult<Vec<Orphan>> {
        let limit = limit.clamp(1, MAX_ORPHANS_PER_SCAN);
        let now = self.now_ms().await?;
        read_op!(self, |tx| tx.orphans(now, limit))
    }

    /// Load per Host: live leases (and their tenants) and live assignments.
    pub async fn host_loads(&self) -> StoreResult<Vec<HostLoad>> {
        let now = self.now_ms().await?;
        read_op!(self, |tx| tx.loads(now))
    }

    async fn announce(&self, a: Admission) {
        match &self.inner.engine {
            Engine::Sqlite(e) => e.announce(a),
            Engine::Postgres(e) => e.announce(a).await,
        }
    }
}

fn leadership_key(name: &str) -> WriteKey {
    // Leaderships and Hosts never share a name space that matters: a shared lane only orders.
    WriteKey::host(&HostId::new(format!("leader:{name}")).unwrap_or_else(|_| {
        HostId::new("leader").unwrap_or_else(|_| unreachable!("a constant id is valid"))
    }))
}

fn check_leadership_name(name: &str) -> StoreResult<()> {
    if name.is_empty() || name.len() > fleet::MAX_LEADERSHIP_NAME {
        return Err(StoreError::invalid(
            "leadership_name",
            format!("must be 1 to {} bytes", fleet::MAX_LEADERSHIP_NAME),
        ));
    }
    Ok(())
}

async fn require_session<C: crate::sql::Conn>(
    tx: &mut crate::sql::SqlTx<C>,
    t: &TenantId,
    s: &SessionId,
) -> StoreResult<()> {
    use crate::ops::Tx as _;
    if tx.session(t, s).await?.is_none() {
        return Err(StoreError::not_found("session", format!("{t}/{s}")));
    }
    Ok(())
}
