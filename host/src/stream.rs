//! Durable reads of a session's public stream, for HostLink recovery and history. Owns the
//! turn of journal pages read by public offset into the very publications the live tail
//! relays (the same projection, the same record, the same offset), and a bounded cache of each
//! session's learned command identities so a read learns only what was appended since the
//! last one. Never writes, never reads another tenant's journal, and never needs the session
//! to be resident here: offsets are counted in the journal, so any Host serves the same
//! stream.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use serde_json::value::RawValue;
use sessionstore::{ErrorCode, EventId, SessionId, Store, StoreError, TenantId};

use hostlink::public_journal::{PublicJournal, PublicJournalError};
use hostlink::records::EnduringPublication;
use hostlink_server::{StreamPage, StreamPublication};

/// How many sessions' learned command identities a reader keeps by default.
pub const DEFAULT_READER_SESSIONS: usize = 256;

/// Why a stream read failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamReadError {
    /// The tenant has no such session.
    #[error("no such session")]
    Unknown,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("a journaled public record cannot be published: {0}")]
    Record(String),
}

impl From<PublicJournalError> for StreamReadError {
    fn from(e: PublicJournalError) -> Self {
        match e {
            PublicJournalError::Store(e) => StreamReadError::Store(e),
            PublicJournalError::Projection(e) => StreamReadError::Record(e.to_string()),
        }
    }
}

type Key = (TenantId, SessionId);

/// Reads sessions' public streams from the store.
pub struct StreamReader {
    store: Store,
    capacity: usize,
    journals: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<PublicJournal>>>>,
}

impl StreamReader {
    /// A reader keeping at most `capacity` sessions' learned identities (at least one).
    pub fn new(store: Store, capacity: usize) -> StreamReader {
        StreamReader {
            store,
            capacity: capacity.max(1),
            journals: Mutex::new(HashMap::new()),
        }
    }

    async fn journal(
        &self,
        tenant: &TenantId,
        session: &SessionId,
    ) -> Result<Arc<tokio::sync::Mutex<PublicJournal>>, StreamReadError> {
        let key = (tenant.clone(), session.clone());
        if let Some(j) = lock(&self.journals).get(&key) {
            return Ok(j.clone());
        }
        let record = match self.store.session(tenant, session).await {
            Ok(r) => r,
            Err(e) if e.code() == ErrorCode::NotFound => return Err(StreamReadError::Unknown),
            Err(e) => return Err(e.into()),
        };
        let journal = Arc::new(tokio::sync::Mutex::new(PublicJournal::new(
            self.store.clone(),
            tenant.clone(),
            session.clone(),
            record.binding,
        )));
        let mut journals = lock(&self.journals);
        if journals.len() >= self.capacity
            && let Some(evicted) = journals.keys().next().cloned()
        {
            journals.remove(&evicted);
        }
        Ok(journals.entry(key).or_insert(journal).clone())
    }

    /// The public records of `session` after offset `after` (at most `limit`; 0 reads only the
    /// position), as the live tail publishes them.
    pub async fn read(
        &self,
        tenant: &TenantId,
        session: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<StreamPage, StreamReadError> {
        let journal = self.journal(tenant, session).await?;
        let mut journal = journal.lock().await;
        let page = journal.by_offset(after, limit).await?;
        let mut records = Vec::with_capacity(page.events.len());
        for e in page.events {
            let record = publication(tenant, session, e.seq, e.event_id, e.body)?;
            records.push(Arc::new(StreamPublication {
                offset: e.offset,
                record,
            }));
        }
        Ok(StreamPage {
            epoch: journal.epoch(),
            top: page.top,
            records,
        })
    }
}

fn publication(
    tenant: &TenantId,
    session: &SessionId,
    seq: u64,
    event_id: String,
    body: Vec<u8>,
) -> Result<EnduringPublication, StreamReadError> {
    let bad = |what: String| StreamReadError::Record(format!("record {seq}: {what}"));
    let event = EventId::new(event_id).map_err(|e| bad(e.to_string()))?;
    let journal_seq = NonZeroU64::new(seq).ok_or_else(|| bad("sequence 0".into()))?;
    let text = String::from_utf8(body).map_err(|e| bad(e.to_string()))?;
    let raw = RawValue::from_string(text).map_err(|e| bad(e.to_string()))?;
    EnduringPublication::new(
        tenant.clone(),
        session.clone(),
        event,
        journal_seq,
        seq,
        raw,
    )
    .map_err(|e| bad(e.to_string()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
