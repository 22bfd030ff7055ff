//! Journal snapshots in SQL, for both backends: the newest snapshot of a runtime session's
//! fold, one row per runtime session. A write is fenced like an append (the writer must hold
//! the journal lease at its epoch, read under the lease row's lock, so a deposed holder's
//! snapshot is refused) and never replaces a newer snapshot; a read verifies the body against
//! its digest, so a damaged row reads as `integrity`, never as another state.

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;
use crate::journal::{JournalLease, JournalSnapshot};
use crate::limits::MAX_SNAPSHOT_BYTES;
use crate::model::sha256_hex;
use crate::ops::{check_writer, journal_key, own_journal};
use crate::sql::{Conn, Param, Row, SqlTx, int, ms, text};

const SNAPSHOT_COLS: &str = "seq, journal_epoch, format, sha256, body, written_at";

fn decode_snapshot(r: &Row) -> StoreResult<(JournalSnapshot, String)> {
    let format = u32::try_from(r.u64(2)?)
        .map_err(|_| StoreError::integrity("journal_snapshot", "format out of range"))?;
    let body = r
        .opt_blob(4)?
        .ok_or_else(|| StoreError::integrity("journal_snapshot", "no body"))?;
    Ok((
        JournalSnapshot {
            seq: r.u64(0)?,
            epoch: JournalEpoch(r.u64(1)?),
            format,
            body,
            written_at_ms: r.i64(5)?,
        },
        r.text(3)?,
    ))
}

impl<C: Conn> SqlTx<C> {
    /// Stores a snapshot of the fold through `seq`, inside the caller's write transaction.
    /// True when it became the newest; false when a snapshot at or after `seq` is stored.
    pub(crate) async fn put_snapshot(
        &mut self,
        lease: &JournalLease,
        seq: u64,
        format: u32,
        body: &[u8],
        now: Millis,
    ) -> StoreResult<bool> {
        let rs = lease.runtime_session;
        let state = own_journal(self, &lease.tenant, rs)
            .await?
            .ok_or_else(|| StoreError::not_found("journal", journal_key(rs)))?;
        check_writer(&state, lease)?;
        if seq == 0 || seq > state.tip {
            return Err(StoreError::invalid(
                "snapshot.seq",
                format!(
                    "is {seq}; must be between 1 and the journal tip {}",
                    state.tip
                ),
            ));
        }
        let written = self
            .exec(
                &format!(
                    "INSERT INTO journal_snapshots (runtime_session_id, {SNAPSHOT_COLS}) \
                     VALUES ($1,$2,$3,$4,$5,$6,$7) \
                     ON CONFLICT (runtime_session_id) DO UPDATE SET seq = excluded.seq, \
                     journal_epoch = excluded.journal_epoch, format = excluded.format, \
                     sha256 = excluded.sha256, body = excluded.body, written_at = excluded.written_at \
                     WHERE journal_snapshots.seq < excluded.seq"
                ),
                vec![
                    text(rs.to_text()),
                    int(seq),
                    int(lease.epoch.0),
                    int(u64::from(format)),
                    text(sha256_hex(body)),
                    Param::Blob(Some(body.to_vec())),
                    ms(now),
                ],
            )
            .await?;
        Ok(written > 0)
    }

    /// The newest snapshot of `rs` (none for another tenant's journal).
    pub(crate) async fn snapshot(
        &mut self,
        t: &TenantId,
        rs: RuntimeSessionId,
    ) -> StoreResult<Option<JournalSnapshot>> {
        if own_journal(self, t, rs).await?.is_none() {
            return Ok(None);
        }
        let found = self
            .one(
                &format!(
                    "SELECT {SNAPSHOT_COLS} FROM journal_snapshots WHERE runtime_session_id = $1"
                ),
                vec![text(rs.to_text())],
                "journal_snapshot",
                decode_snapshot,
            )
            .await?;
        let Some((snapshot, digest)) = found else {
            return Ok(None);
        };
        if snapshot.body.len() > MAX_SNAPSHOT_BYTES || sha256_hex(&snapshot.body) != digest {
            return Err(StoreError::integrity(
                "journal_snapshot",
                format!(
                    "the snapshot through record {} fails its digest",
                    snapshot.seq
                ),
            ));
        }
        Ok(Some(snapshot))
    }
}
