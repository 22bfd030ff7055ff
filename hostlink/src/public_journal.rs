//! The public projection of journal bodies: no private id reaches a client. Owns the one
//! function both the live tail and durable journal pages use: every runtime session id (in any
//! string, at any depth) becomes the public session id, and `cause.command_id` becomes the
//! public command id the client admitted — or is removed, with an emptied `cause`, for a
//! command with no public id. Member order and every other byte are kept: a body with nothing
//! to rewrite is returned byte for byte.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use sessionstore::{
    JournalRecord, RecordKind, RuntimeSessionId, SessionBinding, SessionId, Store, StoreError,
    TenantId,
};

/// The mapping of a session's runtime command ids to the public ids clients admitted, taken
/// from the journal's own application and closure records.
#[derive(Debug, Default, Clone)]
pub struct CommandMap {
    runtime_to_public: HashMap<String, String>,
    public: HashSet<String>,
}

impl CommandMap {
    /// Learns the identity carried by a record, if any.
    pub fn learn(&mut self, record: &JournalRecord) {
        let identity = match &record.kind {
            RecordKind::Application { identity, .. } | RecordKind::Closure { identity, .. } => {
                identity
            }
            _ => return,
        };
        self.runtime_to_public.insert(
            identity.runtime_command.to_string(),
            identity.command.to_string(),
        );
        self.public.insert(identity.command.to_string());
    }

    /// Learns a mapping directly (the live path knows it from the command it applied).
    pub fn insert(&mut self, runtime: &str, public: &str) {
        self.runtime_to_public
            .insert(runtime.to_owned(), public.to_owned());
        self.public.insert(public.to_owned());
    }
}

/// Why a body could not be projected (it fails closed: never relayed as is).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the body could not be projected: {0}")]
pub struct ProjectionError(pub String);

fn rewrite_strings(v: &mut Value, from: &str, to: &str, changed: &mut bool) {
    match v {
        Value::String(s) if s.contains(from) => {
            *s = s.replace(from, to);
            *changed = true;
        }
        Value::Array(items) => {
            for i in items {
                rewrite_strings(i, from, to, changed);
            }
        }
        Value::Object(map) => {
            for (_, val) in map.iter_mut() {
                rewrite_strings(val, from, to, changed);
            }
        }
        _ => {}
    }
}

fn rewrite_causes(v: &mut Value, map: &CommandMap, changed: &mut bool) {
    match v {
        Value::Array(items) => {
            for i in items {
                rewrite_causes(i, map, changed);
            }
        }
        Value::Object(obj) => {
            let mut drop_cause = false;
            if let Some(Value::Object(cause)) = obj.get_mut("cause") {
                if let Some(Value::String(id)) = cause.get("command_id").cloned() {
                    if let Some(public) = map.runtime_to_public.get(&id) {
                        cause.insert("command_id".into(), Value::String(public.clone()));
                        *changed = true;
                    } else if !map.public.contains(&id) {
                        // A machine-originated (or unknown) cause has no public identity.
                        cause.shift_remove("command_id");
                        *changed = true;
                    }
                }
                drop_cause = cause.is_empty();
            }
            if drop_cause {
                obj.shift_remove("cause");
                *changed = true;
            }
            for (_, val) in obj.iter_mut() {
                rewrite_causes(val, map, changed);
            }
        }
        _ => {}
    }
}

/// Projects one public body.
pub fn project(
    body: &[u8],
    runtime_session: RuntimeSessionId,
    public_session: &SessionId,
    map: &CommandMap,
) -> Result<Vec<u8>, ProjectionError> {
    let rs = runtime_session.to_string();
    let text = std::str::from_utf8(body).map_err(|_| ProjectionError("not UTF-8".into()))?;
    let mentions_session = text.contains(&rs);
    let has_cause = text.contains("\"cause\"");
    if !mentions_session && !has_cause {
        return Ok(body.to_vec());
    }
    let mut value: Value =
        serde_json::from_str(text).map_err(|e| ProjectionError(format!("not JSON: {e}")))?;
    let mut changed = false;
    if has_cause {
        rewrite_causes(&mut value, map, &mut changed);
    }
    if mentions_session {
        rewrite_strings(&mut value, &rs, public_session.as_str(), &mut changed);
    }
    if !changed {
        return Ok(body.to_vec());
    }
    serde_json::to_vec(&value).map_err(|e| ProjectionError(e.to_string()))
}

/// A public event as a client sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicEventView {
    pub seq: u64,
    pub event_id: String,
    pub body: Vec<u8>,
}

/// A page of the durable public journal, projected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicJournalPage {
    pub events: Vec<PublicEventView>,
    /// The tip this read is pinned to (covered through).
    pub tip: u64,
    pub next_after: u64,
}

/// A session's journal as a client may read it: the same projection as the live tail.
#[derive(Debug, Clone)]
pub struct PublicJournal {
    store: Store,
    tenant: TenantId,
    session: SessionId,
    binding: SessionBinding,
    map: CommandMap,
    scanned: u64,
}

impl PublicJournal {
    /// A reader of one session's journal.
    pub fn new(
        store: Store,
        tenant: TenantId,
        session: SessionId,
        binding: SessionBinding,
    ) -> Self {
        PublicJournal {
            store,
            tenant,
            session,
            binding,
            map: CommandMap::default(),
            scanned: 0,
        }
    }

    /// Learns command identities from the journal up to `upto`.
    pub async fn learn_to(&mut self, upto: u64) -> Result<(), StoreError> {
        while self.scanned < upto {
            let page = self
                .store
                .journal_runtime_page(
                    &self.tenant,
                    self.binding.runtime_session_id,
                    self.scanned,
                    1000,
                )
                .await?;
            if page.is_empty() {
                break;
            }
            for r in &page {
                self.map.learn(r);
                self.scanned = r.seq;
            }
        }
        Ok(())
    }

    /// Projects one body with what is known so far.
    pub fn project(&self, body: &[u8]) -> Result<Vec<u8>, ProjectionError> {
        project(
            body,
            self.binding.runtime_session_id,
            &self.session,
            &self.map,
        )
    }

    /// Reads a page of public events (pinned to the tip of the first page), projected.
    pub async fn page(
        &mut self,
        after: u64,
        pinned_tip: Option<u64>,
        limit: usize,
    ) -> Result<PublicJournalPage, PublicJournalError> {
        let page = self
            .store
            .journal_public_page(
                &self.tenant,
                self.binding.runtime_session_id,
                after,
                pinned_tip,
                limit,
            )
            .await?;
        self.learn_to(page.tip).await?;
        let mut events = Vec::with_capacity(page.events.len());
        for e in page.events {
            events.push(PublicEventView {
                seq: e.seq,
                event_id: e.event.to_string(),
                body: self.project(&e.body)?,
            });
        }
        Ok(PublicJournalPage {
            events,
            tip: page.tip,
            next_after: page.next_after,
        })
    }
}

/// A public event with its stream offset, projected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetEventView {
    pub offset: u64,
    pub seq: u64,
    pub event_id: String,
    pub body: Vec<u8>,
}

/// Public events by offset, projected, with the stream's top at the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetEventsPage {
    pub events: Vec<OffsetEventView>,
    pub top: u64,
}

impl PublicJournal {
    /// The public events after offset `after` (at most `limit`; 0 reads only the top),
    /// projected exactly as the live tail projects them.
    pub async fn by_offset(
        &mut self,
        after: u64,
        limit: usize,
    ) -> Result<OffsetEventsPage, PublicJournalError> {
        let page = self
            .store
            .journal_by_offset(&self.tenant, self.binding.runtime_session_id, after, limit)
            .await?;
        if let Some(last) = page.events.last() {
            self.learn_to(last.seq).await?;
        }
        let mut events = Vec::with_capacity(page.events.len());
        for e in page.events {
            events.push(OffsetEventView {
                offset: e.offset,
                seq: e.seq,
                event_id: e.event.to_string(),
                body: self.project(&e.body)?,
            });
        }
        Ok(OffsetEventsPage {
            events,
            top: page.top,
        })
    }

    /// The stream offset of the public event at journal sequence `seq` (how many public
    /// events the journal holds through it).
    pub async fn offset_at(&self, seq: u64) -> Result<u64, StoreError> {
        self.store
            .journal_public_offset(&self.tenant, self.binding.runtime_session_id, seq)
            .await
    }

    /// The epoch of this session's public stream (see [`stream_epoch`]).
    pub fn epoch(&self) -> String {
        stream_epoch(self.binding.runtime_session_id)
    }
}

/// The epoch of a session's public stream: it names the journal the offsets count in, so it
/// changes only if that journal were replaced (it never is: the binding of a session to its
/// journal is immutable and the journal is append-only). Derived from the runtime session id
/// by a digest, so every Host computes the same epoch and no private id reaches a client.
pub fn stream_epoch(runtime_session: RuntimeSessionId) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"hostlink.stream.v1\0")
        .chain_update(runtime_session.to_string().as_bytes())
        .finalize();
    hex::encode(&digest[..8])
}

/// A failed public journal read.
#[derive(Debug, thiserror::Error)]
pub enum PublicJournalError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Projection(#[from] ProjectionError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> (RuntimeSessionId, SessionId) {
        (
            RuntimeSessionId::mint(),
            SessionId::new("public-s").unwrap(),
        )
    }

    #[test]
    fn a_stream_epoch_is_stable_per_journal_and_reveals_no_private_id() {
        let (rs, _) = ids();
        let epoch = stream_epoch(rs);
        assert_eq!(epoch, stream_epoch(rs));
        assert_eq!(epoch.len(), 16);
        assert_ne!(epoch, stream_epoch(RuntimeSessionId::mint()));
        assert!(!rs.to_string().contains(&epoch));
    }

    #[test]
    fn a_body_without_private_ids_is_returned_byte_for_byte() {
        let (rs, s) = ids();
        let body = br#"{"type":"x", "text":"caf\u00e9"}"#;
        assert_eq!(
            project(body, rs, &s, &CommandMap::default()).unwrap(),
            body.to_vec()
        );
    }

    #[test]
    fn runtime_session_ids_become_public_everywhere_keeping_member_order() {
        let (rs, s) = ids();
        let body = format!(
            r#"{{"type":"failed","session_id":"{rs}","nested":{{"msg":"session {rs} died"}},"z":1}}"#
        );
        let out = project(body.as_bytes(), rs, &s, &CommandMap::default()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"type":"failed","session_id":"public-s","nested":{"msg":"session public-s died"},"z":1}"#
        );
    }

    #[test]
    fn a_cause_names_the_public_command_or_is_removed() {
        let (rs, s) = ids();
        let mut map = CommandMap::default();
        map.insert("11111111-1111-7111-8111-111111111111", "cmd-public");
        let body = br#"{"a":1,"cause":{"command_id":"11111111-1111-7111-8111-111111111111"}}"#;
        assert_eq!(
            project(body, rs, &s, &map).unwrap(),
            br#"{"a":1,"cause":{"command_id":"cmd-public"}}"#.to_vec()
        );
        let machine =
            br#"{"a":1,"cause":{"command_id":"22222222-2222-7222-8222-222222222222"},"b":2}"#;
        assert_eq!(
            project(machine, rs, &s, &map).unwrap(),
            br#"{"a":1,"b":2}"#.to_vec()
        );
        let already = br#"{"cause":{"command_id":"cmd-public"}}"#;
        assert_eq!(project(already, rs, &s, &map).unwrap(), already.to_vec());
    }

    #[test]
    fn an_undecodable_body_fails_closed() {
        let (rs, s) = ids();
        let body = format!("{{\"session_id\":\"{rs}\"");
        assert!(project(body.as_bytes(), rs, &s, &CommandMap::default()).is_err());
    }
}
