//! The fleet's rows: a Host's one heartbeat (its advertisement, which also carries every
//! residency lease and registration of its generation, and the collection of long-expired
//! advertisements, in one transaction), the reconciler's leadership lease, placement assignments written under a
//! current leadership, and the reads placement and the views need (load per Host, sessions with
//! work and no live residency). Owns the rules of these rows; the statements are written once
//! for both backends over [`SqlTx`]. Never touches a command, a cursor or the journal, and
//! never extends a lease that lapsed or that another holder took.

use std::time::Duration;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;
use crate::machine;
use crate::model::*;
use crate::sql::{
    Conn, Dialect, LEASE_EXPIRY, Row, SqlTx, TARGET_COLS, decode_target, flag, int, ms, text,
};

/// A Host's heartbeat: its advertisement (whose `ttl` is also how long every residency and
/// registration it holds stays alive from now), the admission weight it has charged, and how
/// long another Host's advertisement may stay expired before it is collected.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HostHeartbeat {
    pub advertisement: HostAdvertisement,
    pub weight_used: u32,
    pub retention: Duration,
}

/// A residency lease a heartbeat renewed.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct RenewedResidency {
    pub tenant: TenantId,
    pub session: SessionId,
    pub epoch: ResidencyEpoch,
}

/// What one heartbeat did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HeartbeatReport {
    /// The advertisement as stored (its `expires_at_ms` is also every carried lease's expiry).
    pub target: HostTarget,
    /// `None` when this beat carried on an unbroken run of beats of this generation (each
    /// before the previous one's expiry): every lease this Host and generation held at the
    /// previous beat is still its own, now to the target's expiry, and nothing was read to say
    /// so. `Some` when the beat began a new run (the generation's first beat, or one after the
    /// previous beat's expiry): the leases still live and carried from now, read once; a lease
    /// this Host believes it holds and that is missing here is lost.
    pub renewed: Option<Vec<RenewedResidency>>,
    /// Other Hosts' advertisements collected (expired for longer than the retention).
    pub collected: u64,
}

/// The last heartbeat's columns of a Host's row (migration 0009).
#[derive(Clone, Copy, Debug)]
struct Beat {
    generation: u64,
    at: Millis,
    expires_at: Millis,
    since: Millis,
}

/// A request for the fleet reconciler's leadership (acquire, or renew when already held).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct LeadershipRequest {
    /// Which leadership (one per independent reconciler group).
    pub name: String,
    /// A token unique to the candidate process.
    pub holder: String,
    pub ttl: Duration,
}

/// A held leadership: the right to act until it expires; its epoch fences a deposed leader.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Leadership {
    pub name: String,
    pub epoch: u64,
    pub holder: String,
    pub expires_at_ms: Millis,
}

/// An assignment of a session to a Host, written by the current leader.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PlacementRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub host: HostId,
    pub host_generation: u64,
    pub leadership: Leadership,
    /// How long the assignment stands if the Host never acts on it.
    pub ttl: Duration,
}

/// A placement assignment as stored.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PlacementRecord {
    pub tenant: TenantId,
    pub session: SessionId,
    pub host: HostId,
    pub host_generation: u64,
    pub leader_epoch: u64,
    pub assigned_at_ms: Millis,
    pub expires_at_ms: Millis,
}

/// How loaded one Host is, from the live leases it holds and the live assignments it has not
/// acted on yet.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct HostLoad {
    pub host: Option<HostId>,
    /// Live residency leases held.
    pub sessions: u32,
    /// The tenants of those leases (sorted, distinct).
    pub tenants: Vec<TenantId>,
    /// Live assignments not yet acted on.
    pub placing: u32,
}

/// A session with admitted work not yet ended and no live residency nor live assignment.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Orphan {
    pub tenant: TenantId,
    pub session: SessionId,
    /// One of its commands not yet ended (what the assignment's wake-up hint names).
    pub command: CommandId,
}

pub(crate) const MAX_LEADERSHIP_NAME: usize = 256;

/// States of a command that is not ended (the literal list the partial index names).
const OPEN: &str = "('pending','claimed','applying')";

const PLACEMENT_COLS: &str = "tenant_id, session_id, host_id, host_generation, leader_epoch, \
     assigned_at, expires_at";

fn decode_placement(r: &Row) -> StoreResult<PlacementRecord> {
    Ok(PlacementRecord {
        tenant: r.id(0, TenantId::new)?,
        session: r.id(1, SessionId::new)?,
        host: r.id(2, HostId::new)?,
        host_generation: r.u64(3)?,
        leader_epoch: r.u64(4)?,
        assigned_at_ms: r.i64(5)?,
        expires_at_ms: r.i64(6)?,
    })
}

fn decode_leadership(r: &Row) -> StoreResult<(u64, Option<String>, Option<Millis>)> {
    Ok((r.u64(0)?, r.opt_text(1)?, r.opt_i64(2)?))
}

fn decode_key(r: &Row) -> StoreResult<(TenantId, SessionId)> {
    Ok((r.id(0, TenantId::new)?, r.id(1, SessionId::new)?))
}

impl<C: Conn> SqlTx<C> {
    /// One heartbeat, inside the caller's write transaction. It writes the Host's own row
    /// only: the leases and registrations of its generation read their expiry from it (see
    /// [`LEASE_EXPIRY`]), so a beat costs the same at 10 sessions and at 100,000. When the beat
    /// ends a run (a new generation, or a beat after the run's expiry) it first writes the
    /// run's expiry into the rows the run carried, so those rows read as they did.
    pub(crate) async fn heartbeat(
        &mut self,
        hb: &HostHeartbeat,
        ttl_ms: i64,
        retention_ms: i64,
        now: Millis,
    ) -> StoreResult<HeartbeatReport> {
        let a = &hb.advertisement;
        let existing = self
            .one(
                &format!(
                    "SELECT {TARGET_COLS}, beat_generation, beat_at, beat_expires_at, beat_since \
                     FROM host_targets WHERE host_id = $1 FOR_UPDATE"
                ),
                vec![text(a.host.as_str())],
                "host_target",
                |r| {
                    Ok((
                        decode_target(r)?,
                        Beat {
                            generation: r.u64(10)?,
                            at: r.i64(11)?,
                            expires_at: r.i64(12)?,
                            since: r.i64(13)?,
                        },
                    ))
                },
            )
            .await?;
        if let Some((existing, _)) = &existing {
            machine::fence("host_target.generation", existing.generation, a.generation)?;
        }
        let last = existing.map(|(_, beat)| beat);
        let unbroken = last.is_some_and(|b| b.generation == a.generation && b.expires_at > now);
        if let Some(run) = last.filter(|b| !unbroken && b.generation > 0) {
            self.end_run(&a.host, run).await?;
        }
        let since = match last {
            Some(b) if unbroken => b.since,
            _ => now,
        };
        let expires = now.saturating_add(ttl_ms);
        let target = HostTarget {
            host: a.host.clone(),
            endpoint: a.endpoint.clone(),
            placement: a.placement,
            isolation_class: a.isolation_class.clone(),
            capacity: a.capacity,
            accepting: a.accepting,
            generation: a.generation,
            observed_at_ms: now,
            expires_at_ms: expires,
            weight_used: hb.weight_used,
        };
        self.exec(
            &format!(
                "INSERT INTO host_targets ({TARGET_COLS}, beat_generation, beat_at, \
                 beat_expires_at, beat_since) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$7,$8,$9,$11) \
                 ON CONFLICT (host_id) DO UPDATE SET endpoint = excluded.endpoint, \
                 placement = excluded.placement, isolation_class = excluded.isolation_class, \
                 capacity = excluded.capacity, accepting = excluded.accepting, \
                 generation = excluded.generation, observed_at = excluded.observed_at, \
                 expires_at = excluded.expires_at, weight_used = excluded.weight_used, \
                 beat_generation = excluded.beat_generation, beat_at = excluded.beat_at, \
                 beat_expires_at = excluded.beat_expires_at, beat_since = excluded.beat_since"
            ),
            vec![
                text(target.host.as_str()),
                text(target.endpoint.clone()),
                text(target.placement.as_str()),
                text(target.isolation_class.clone()),
                int(u64::from(target.capacity)),
                flag(target.accepting),
                int(target.generation),
                ms(now),
                ms(expires),
                int(u64::from(target.weight_used)),
                ms(since),
            ],
        )
        .await?;
        // Only a new run reads the leases it carries: those live on their own now. A lapsed
        // one is lost for good, and one another holder took names another host or generation.
        let renewed = if unbroken {
            None
        } else {
            Some(
                self.rows(
                    "SELECT tenant_id, session_id, epoch FROM residency_leases \
                     WHERE host_id = $1 AND host_generation = $2 AND holder IS NOT NULL \
                     AND expires_at > $3",
                    vec![text(a.host.as_str()), int(a.generation), ms(now)],
                    "residency_lease",
                )
                .await?
                .iter()
                .map(|r| {
                    Ok(RenewedResidency {
                        tenant: r.id(0, TenantId::new)?,
                        session: r.id(1, SessionId::new)?,
                        epoch: ResidencyEpoch(r.u64(2)?),
                    })
                })
                .collect::<StoreResult<Vec<_>>>()?,
            )
        };
        // Never waits for a row another transaction holds (on PostgreSQL a stalled Host may
        // hold its own row): a row skipped now is collected by a later heartbeat.
        let collect = match self.conn.dialect() {
            Dialect::Postgres => {
                "DELETE FROM host_targets WHERE host_id IN (SELECT host_id FROM host_targets \
                 WHERE host_id <> $1 AND expires_at < $2 FOR UPDATE SKIP LOCKED)"
            }
            Dialect::Sqlite => "DELETE FROM host_targets WHERE host_id <> $1 AND expires_at < $2",
        };
        let collected = self
            .exec(
                collect,
                vec![text(a.host.as_str()), ms(now.saturating_sub(retention_ms))],
            )
            .await?;
        Ok(HeartbeatReport {
            target,
            renewed,
            collected,
        })
    }

    /// Writes an ended run's expiry into the leases and registrations it carried (those of
    /// its generation whose own expiry reached into it), so they read the same once the
    /// Host's row describes another run. Rare: once per restart or lapse of a Host.
    async fn end_run(&mut self, host: &HostId, run: Beat) -> StoreResult<()> {
        self.exec(
            "UPDATE residency_leases SET expires_at = $3 WHERE host_id = $1 \
             AND host_generation = $2 AND holder IS NOT NULL AND expires_at > $4 \
             AND expires_at < $3",
            vec![
                text(host.as_str()),
                int(run.generation),
                ms(run.expires_at),
                ms(run.since),
            ],
        )
        .await?;
        self.exec(
            "UPDATE host_registrations SET \
             observed_at = CASE WHEN observed_at < $3 THEN $3 ELSE observed_at END, \
             expires_at = CASE WHEN expires_at < $4 THEN $4 ELSE expires_at END \
             WHERE host_id = $1 AND host_generation = $2 \
             AND residency IN ('attaching','resident','releasing')",
            vec![
                text(host.as_str()),
                int(run.generation),
                ms(run.at),
                ms(run.expires_at),
            ],
        )
        .await?;
        Ok(())
    }

    /// The highest generation this Host id ever held anywhere in the store (its advertisement,
    /// or a lease or registration an older incarnation left), 0 when none.
    pub(crate) async fn generation_floor(&mut self, host: &HostId) -> StoreResult<u64> {
        let rows = self
            .rows(
                "SELECT COALESCE(MAX(g), 0) FROM ( \
                 SELECT generation AS g FROM host_targets WHERE host_id = $1 \
                 UNION ALL SELECT host_generation FROM residency_leases \
                 WHERE host_id = $1 AND host_generation IS NOT NULL \
                 UNION ALL SELECT host_generation FROM host_registrations WHERE host_id = $1 \
                 UNION ALL SELECT host_generation FROM placements WHERE host_id = $1) AS gens",
                vec![text(host.as_str())],
                "host_target",
            )
            .await?;
        match rows.first() {
            Some(r) => r.u64(0),
            None => Ok(0),
        }
    }

    pub(crate) async fn leadership(
        &mut self,
        name: &str,
    ) -> StoreResult<Option<(u64, Option<String>, Option<Millis>)>> {
        self.one(
            "SELECT epoch, holder, expires_at FROM fleet_leaders WHERE name = $1 FOR_UPDATE",
            vec![text(name)],
            "fleet_leader",
            decode_leadership,
        )
        .await
    }

    pub(crate) async fn put_leadership(
        &mut self,
        name: &str,
        epoch: u64,
        holder: Option<&str>,
        expires_at: Option<Millis>,
    ) -> StoreResult<()> {
        self.exec(
            "INSERT INTO fleet_leaders (name, epoch, holder, expires_at) VALUES ($1,$2,$3,$4) \
             ON CONFLICT (name) DO UPDATE SET epoch = excluded.epoch, holder = excluded.holder, \
             expires_at = excluded.expires_at",
            vec![
                text(name),
                int(epoch),
                crate::sql::opt_text(holder.map(str::to_owned)),
                crate::sql::opt_ms(expires_at),
            ],
        )
        .await?;
        Ok(())
    }

    /// Requires `l` to be the current, live leadership at `now`.
    pub(crate) async fn require_leadership(
        &mut self,
        l: &Leadership,
        now: Millis,
    ) -> StoreResult<()> {
        match self.leadership(&l.name).await? {
            None => Err(StoreError::not_found("fleet_leader", l.name.clone())),
            Some((epoch, _, _)) if epoch != l.epoch => Err(StoreError::Epoch {
                field: "fleet_leader.epoch",
                mark: epoch,
                offered: l.epoch,
            }),
            Some((_, holder, expires)) => {
                if holder.as_deref() != Some(l.holder.as_str()) {
                    return Err(StoreError::ClaimLost {
                        field: "fleet_leader",
                        reason: "the leadership was released",
                    });
                }
                if expires.is_none_or(|e| e <= now) {
                    return Err(StoreError::ClaimLost {
                        field: "fleet_leader",
                        reason: "the leadership expired",
                    });
                }
                Ok(())
            }
        }
    }

    pub(crate) async fn put_placement(&mut self, p: &PlacementRecord) -> StoreResult<()> {
        self.exec(
            &format!(
                "INSERT INTO placements ({PLACEMENT_COLS}) VALUES ($1,$2,$3,$4,$5,$6,$7) \
                 ON CONFLICT (tenant_id, session_id) DO UPDATE SET host_id = excluded.host_id, \
                 host_generation = excluded.host_generation, leader_epoch = excluded.leader_epoch, \
                 assigned_at = excluded.assigned_at, expires_at = excluded.expires_at"
            ),
            vec![
                text(p.tenant.as_str()),
                text(p.session.as_str()),
                text(p.host.as_str()),
                int(p.host_generation),
                int(p.leader_epoch),
                ms(p.assigned_at_ms),
                ms(p.expires_at_ms),
            ],
        )
        .await?;
        Ok(())
    }

    /// Deletes the session's assignment to `host` (any other Host's stays).
    pub(crate) async fn delete_placement(
        &mut self,
        t: &TenantId,
        s: &SessionId,
        host: &HostId,
    ) -> StoreResult<u64> {
        self.exec(
            "DELETE FROM placements WHERE tenant_id = $1 AND session_id = $2 AND host_id = $3",
            vec![text(t.as_str()), text(s.as_str()), text(host.as_str())],
        )
        .await
    }

    pub(crate) async fn placements_for(
        &mut self,
        host: &HostId,
        generation: u64,
        now: Millis,
    ) -> StoreResult<Vec<PlacementRecord>> {
        self.many(
            &format!(
                "SELECT {PLACEMENT_COLS} FROM placements WHERE host_id = $1 \
                 AND host_generation = $2 AND expires_at > $3 ORDER BY assigned_at"
            ),
            vec![text(host.as_str()), int(generation), ms(now)],
            "placement",
            decode_placement,
        )
        .await
    }

    /// Sessions whose live lease this Host and generation hold and that have a command not
    /// yet ended. Read from the open commands (a partial index), so an idle Host's pass costs
    /// nothing per resident session.
    pub(crate) async fn sessions_with_work(
        &mut self,
        host: &HostId,
        generation: u64,
        now: Millis,
    ) -> StoreResult<Vec<(TenantId, SessionId)>> {
        self.many(
            &format!(
                "SELECT c.tenant_id, c.session_id FROM (SELECT DISTINCT tenant_id, session_id \
                 FROM commands WHERE state IN {OPEN}) c WHERE EXISTS (SELECT 1 \
                 FROM residency_leases l WHERE l.tenant_id = c.tenant_id \
                 AND l.session_id = c.session_id AND l.host_id = $1 \
                 AND l.host_generation = $2 AND l.holder IS NOT NULL AND {LEASE_EXPIRY} > $3)"
            ),
            vec![text(host.as_str()), int(generation), ms(now)],
            "residency_lease",
            decode_key,
        )
        .await
    }

    /// Sessions with a command not yet ended, no live residency lease and no live assignment,
    /// oldest admission first.
    pub(crate) async fn orphans(&mut self, now: Millis, limit: usize) -> StoreResult<Vec<Orphan>> {
        let rows = self
            .many(
                &format!(
                    "SELECT c.tenant_id, c.session_id, MIN(c.command_id) FROM commands c \
                     WHERE c.state IN {OPEN} \
                     AND NOT EXISTS (SELECT 1 FROM residency_leases l \
                     WHERE l.tenant_id = c.tenant_id AND l.session_id = c.session_id \
                     AND l.holder IS NOT NULL AND {LEASE_EXPIRY} > $1) \
                     AND NOT EXISTS (SELECT 1 FROM placements p \
                     WHERE p.tenant_id = c.tenant_id AND p.session_id = c.session_id \
                     AND p.expires_at > $1) \
                     GROUP BY c.tenant_id, c.session_id ORDER BY MIN(c.admitted_at) LIMIT {limit}"
                ),
                vec![ms(now)],
                "command",
                |r| {
                    Ok(Orphan {
                        tenant: r.id(0, TenantId::new)?,
                        session: r.id(1, SessionId::new)?,
                        command: r.id(2, CommandId::new)?,
                    })
                },
            )
            .await?;
        Ok(rows)
    }

    /// Live leases per Host and tenant, and live assignments per Host.
    pub(crate) async fn loads(&mut self, now: Millis) -> StoreResult<Vec<HostLoad>> {
        let held = self
            .rows(
                &format!(
                    "SELECT l.host_id, l.tenant_id, COUNT(*) FROM residency_leases l \
                     WHERE l.holder IS NOT NULL AND {LEASE_EXPIRY} > $1 \
                     AND l.host_id IS NOT NULL \
                     GROUP BY l.host_id, l.tenant_id ORDER BY l.host_id, l.tenant_id"
                ),
                vec![ms(now)],
                "residency_lease",
            )
            .await?;
        let placing = self
            .rows(
                "SELECT host_id, COUNT(*) FROM placements WHERE expires_at > $1 \
                 GROUP BY host_id ORDER BY host_id",
                vec![ms(now)],
                "placement",
            )
            .await?;
        let mut loads: Vec<HostLoad> = Vec::new();
        fn entry<'a>(loads: &'a mut Vec<HostLoad>, host: &HostId) -> &'a mut HostLoad {
            let i = match loads.iter().position(|l| l.host.as_ref() == Some(host)) {
                Some(i) => i,
                None => {
                    loads.push(HostLoad {
                        host: Some(host.clone()),
                        ..HostLoad::default()
                    });
                    loads.len() - 1
                }
            };
            &mut loads[i]
        }
        for r in &held {
            let host = r.id(0, HostId::new)?;
            let tenant = r.id(1, TenantId::new)?;
            let n = u32::try_from(r.u64(2)?).unwrap_or(u32::MAX);
            let l = entry(&mut loads, &host);
            l.sessions = l.sessions.saturating_add(n);
            l.tenants.push(tenant);
        }
        for r in &placing {
            let host = r.id(0, HostId::new)?;
            let n = u32::try_from(r.u64(1)?).unwrap_or(u32::MAX);
            entry(&mut loads, &host).placing = n;
        }
        Ok(loads)
    }
}

/// Acquires or renews a leadership at `now` (the rule, over the row read under lock).
pub(crate) fn acquire_leadership(
    current: Option<(u64, Option<String>, Option<Millis>)>,
    req: &LeadershipRequest,
    ttl_ms: i64,
    now: Millis,
) -> StoreResult<Leadership> {
    let granted = |epoch: u64| Leadership {
        name: req.name.clone(),
        epoch,
        holder: req.holder.clone(),
        expires_at_ms: now.saturating_add(ttl_ms),
    };
    match current {
        None => Ok(granted(1)),
        Some((epoch, Some(holder), Some(expires))) if expires > now => {
            if holder == req.holder {
                Ok(granted(epoch))
            } else {
                Err(StoreError::ClaimHeld {
                    field: "fleet_leader",
                    epoch,
                    expires_at_ms: expires,
                })
            }
        }
        Some((epoch, _, _)) => Ok(granted(epoch.saturating_add(1))),
    }
}
