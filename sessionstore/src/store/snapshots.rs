//! Journal snapshots and the point reads that let a runtime keep only recent dispositions in
//! memory, on the store handle: the edge (validation) and the dispatch to the open backend.
//! The SQL lives in `crate::snapshots`.

use super::*;

impl Store {
    /// Stores a snapshot of the fold of the journal through `seq` (at most the lease's tip),
    /// fenced like an append: refused (`epoch`, `claim_lost`) unless `lease` still holds the
    /// journal. True when it became the newest; false when one at or after `seq` is stored.
    pub async fn journal_put_snapshot(
        &self,
        lease: &JournalLease,
        seq: u64,
        format: u32,
        body: Vec<u8>,
    ) -> StoreResult<bool> {
        if format == 0 {
            return Err(StoreError::invalid("snapshot.format", "must be >= 1"));
        }
        if body.len() > MAX_SNAPSHOT_BYTES {
            return Err(StoreError::invalid(
                "snapshot.body",
                format!(
                    "is {} bytes; at most {MAX_SNAPSHOT_BYTES} allowed",
                    body.len()
                ),
            ));
        }
        let lease = lease.clone();
        let body = Arc::new(body);
        write_op!(
            self,
            WriteKey::journal(lease.runtime_session),
            [lease, body],
            |tx, now| tx.put_snapshot(&lease, seq, format, &body, now)
        )
    }

    /// The newest snapshot of a runtime session's journal (none for another tenant's). A body
    /// that fails its digest is `integrity`.
    pub async fn journal_snapshot(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
    ) -> StoreResult<Option<JournalSnapshot>> {
        let t = t.clone();
        read_op!(self, |tx| tx.snapshot(&t, rs))
    }

    /// The disposition frame the journal holds for a runtime command (an application or a
    /// closure; at most one), read through the journal's index of dispositions by command.
    pub async fn journal_command_disposition(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<Option<DispositionFrame>> {
        let t = t.clone();
        let records = read_op!(self, |tx| ops::journal_dispositions(tx, &t, rs, rc))?;
        Ok(records.iter().find_map(JournalRecord::disposition_frame))
    }

    /// Whether the journal holds any record caused by a runtime command (an effect), read
    /// through the journal's index of records by cause. False for another tenant's journal.
    pub async fn journal_has_effect(
        &self,
        t: &TenantId,
        rs: RuntimeSessionId,
        rc: RuntimeCommandId,
    ) -> StoreResult<bool> {
        let t = t.clone();
        read_op!(self, |tx| ops::journal_has_effect(tx, &t, rs, rc))
    }
}
