//! Who asked a Host to drain, in SQL for both backends: one row per Host incarnation (host id,
//! generation), written by the first request and never changed (a drain is idempotent: a
//! repeated request joins the first, so the first asker is the one kept). Never decides
//! whether a Host drains; the Host does, and records who asked before it starts.

use crate::clock::Millis;
use crate::error::StoreResult;
use crate::ids::HostId;
use crate::sql::{Conn, Row, SqlTx, int, ms, text};

/// A drain request as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainRecord {
    pub host: HostId,
    pub generation: u64,
    /// The actor who asked (an operator's principal, a link's, or the signal that asked).
    pub requested_by: String,
    pub requested_at_ms: Millis,
}

const DRAIN_COLS: &str = "host_id, host_generation, requested_by, requested_at";

fn decode_drain(r: &Row) -> StoreResult<DrainRecord> {
    Ok(DrainRecord {
        host: r.id(0, HostId::new)?,
        generation: r.u64(1)?,
        requested_by: r.text(2)?,
        requested_at_ms: r.i64(3)?,
    })
}

impl<C: Conn> SqlTx<C> {
    /// Records that `requested_by` asked this incarnation to drain, unless a request is
    /// recorded already; either way the request that stands.
    pub(crate) async fn record_drain(
        &mut self,
        host: &HostId,
        generation: u64,
        requested_by: &str,
        now: Millis,
    ) -> StoreResult<DrainRecord> {
        self.exec(
            "INSERT INTO host_drains (host_id, host_generation, requested_by, requested_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            vec![
                text(host.as_str()),
                int(generation),
                text(requested_by),
                ms(now),
            ],
        )
        .await?;
        self.drain_request(host, generation).await?.ok_or_else(|| {
            crate::error::StoreError::integrity("host_drains", "a recorded drain left no row")
        })
    }

    /// The drain request recorded for one incarnation, if any.
    pub(crate) async fn drain_request(
        &mut self,
        host: &HostId,
        generation: u64,
    ) -> StoreResult<Option<DrainRecord>> {
        self.one(
            &format!(
                "SELECT {DRAIN_COLS} FROM host_drains WHERE host_id = $1 AND host_generation = $2"
            ),
            vec![text(host.as_str()), int(generation)],
            "host_drains",
            decode_drain,
        )
        .await
    }

    /// Drain requests, the newest first: one Host id's (every incarnation), or every Host's;
    /// at most `limit`.
    pub(crate) async fn drain_requests(
        &mut self,
        host: Option<&HostId>,
        limit: usize,
    ) -> StoreResult<Vec<DrainRecord>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        match host {
            Some(h) => {
                self.many(
                    &format!(
                        "SELECT {DRAIN_COLS} FROM host_drains WHERE host_id = $1 \
                         ORDER BY host_generation DESC LIMIT {limit}"
                    ),
                    vec![text(h.as_str())],
                    "host_drains",
                    decode_drain,
                )
                .await
            }
            None => {
                self.many(
                    &format!(
                        "SELECT {DRAIN_COLS} FROM host_drains \
                         ORDER BY requested_at DESC, host_id, host_generation DESC LIMIT {limit}"
                    ),
                    Vec::new(),
                    "host_drains",
                    decode_drain,
                )
                .await
            }
        }
    }
}
