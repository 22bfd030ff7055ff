//! Drain requests on the store handle: the edge (validation) and the dispatch to the open
//! backend. The SQL lives in `crate::drains`.

use super::*;
use crate::drains::DrainRecord;

impl Store {
    /// Records that `requested_by` asked the Host incarnation (`host`, `generation`) to drain.
    /// The first request of an incarnation stands: a later one records nothing and gets the
    /// first back.
    pub async fn record_drain(
        &self,
        host: &HostId,
        generation: u64,
        requested_by: &str,
    ) -> StoreResult<DrainRecord> {
        check_epoch("generation", generation)?;
        check_opaque_id("requested_by", requested_by)?;
        let (host, by) = (host.clone(), requested_by.to_owned());
        write_op!(self, WriteKey::host(&host), [host, by], |tx, now| tx
            .record_drain(&host, generation, &by, now))
    }

    /// The drain request recorded for one Host incarnation, if any.
    pub async fn drain_request(
        &self,
        host: &HostId,
        generation: u64,
    ) -> StoreResult<Option<DrainRecord>> {
        let host = host.clone();
        read_op!(self, |tx| tx.drain_request(&host, generation))
    }

    /// Drain requests, the newest first: one Host id's (every incarnation), or every Host's
    /// (`None`); at most [`MAX_PAGE`].
    pub async fn drain_requests(&self, host: Option<&HostId>) -> StoreResult<Vec<DrainRecord>> {
        let host = host.cloned();
        read_op!(self, |tx| tx.drain_requests(host.as_ref(), MAX_PAGE))
    }
}
