//! The public projection of journal bodies: no private id reaches a client. Owns the one
//! function both the live tail and durable journal pages use: every runtime session id (in any
//! string, at any depth) becomes the public session id, and `cause.command_id` becomes the
//! public command id the client admitted — or is removed, with an emptied `cause`, for a
//! command with no public id. Any other mention of a known runtime command id — in any string
//! or member name, at any depth, hyphenated in either case or as 32 bare hex digits — becomes
//! its public id too, whatever runtime wrote the body. Member order is kept; a body with
//! nothing to rewrite is returned byte for byte, and one whose only changes are renamed ids keeps
//! every other byte (spacing, escapes, number spelling), a removed cause included; only a body
//! whose keys or ids are spelled with escapes, or that repeats a member, is re-serialised.

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

/// The private ids of one session and their public names.
struct Private<'a> {
    runtime_session: uuid::Uuid,
    public_session: &'a str,
    map: &'a CommandMap,
}

impl Private<'_> {
    /// The public name of `text` when it spells one of this session's private ids (in any
    /// textual form of the UUID).
    fn public_of(&self, text: &str) -> Option<&str> {
        let id = uuid::Uuid::try_parse(text).ok()?;
        if id == self.runtime_session {
            return Some(self.public_session);
        }
        self.map
            .runtime_to_public
            .get(&id.hyphenated().to_string())
            .map(String::as_str)
    }

    /// Where `text` spells one of this session's private ids, with its public name, left to
    /// right and not overlapping. Every position is tried: an id glued to other characters
    /// (even hex digits) is still found. A 32-digit window inside a longer hex string is
    /// tried too; it can only match if it is that id (a digest equals one by chance with
    /// probability 2^-122).
    fn mentions(&self, text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
        let b = text.as_bytes();
        // run[i]: how many hex digits start at i.
        let mut run = vec![0usize; b.len() + 1];
        for i in (0..b.len()).rev() {
            run[i] = if b[i].is_ascii_hexdigit() {
                run[i + 1] + 1
            } else {
                0
            };
        }
        let hyphenated = |i: usize| {
            b.len() >= i + 36
                && run[i] >= 8
                && b[i + 8] == b'-'
                && run[i + 9] >= 4
                && b[i + 13] == b'-'
                && run[i + 14] >= 4
                && b[i + 18] == b'-'
                && run[i + 19] >= 4
                && b[i + 23] == b'-'
                && run[i + 24] >= 12
        };
        let mut found = Vec::new();
        let mut i = 0;
        while i < b.len() {
            let len = if hyphenated(i) {
                36
            } else if run[i] >= 32 {
                32
            } else {
                i += 1;
                continue;
            };
            // The window is ASCII hex and hyphens, so these are character boundaries.
            match self.public_of(&text[i..i + len]) {
                Some(public) => {
                    found.push((i..i + len, public));
                    i += len;
                }
                None => i += 1,
            }
        }
        found
    }

    /// `text` with every private id replaced; `None` when it names none.
    fn rewrite(&self, text: &str) -> Option<String> {
        let found = self.mentions(text);
        if found.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (span, public) in found {
            out.push_str(&text[last..span.start]);
            out.push_str(public);
            last = span.end;
        }
        out.push_str(&text[last..]);
        Some(out)
    }

    fn mentioned_in(&self, text: &str) -> bool {
        !self.mentions(text).is_empty()
    }

    /// Rewrites every string and member name of `v`, at any depth.
    fn rewrite_value(&self, v: &mut Value, changed: &mut bool) {
        match v {
            Value::String(s) => {
                if let Some(new) = self.rewrite(s) {
                    *s = new;
                    *changed = true;
                }
            }
            Value::Array(items) => {
                for i in items {
                    self.rewrite_value(i, changed);
                }
            }
            Value::Object(obj) => {
                if obj.keys().any(|k| self.mentioned_in(k)) {
                    let old = std::mem::take(obj);
                    for (k, val) in old {
                        let k = self.rewrite(&k).unwrap_or(k);
                        obj.insert(k, val);
                    }
                    *changed = true;
                }
                for (_, val) in obj.iter_mut() {
                    self.rewrite_value(val, changed);
                }
            }
            _ => {}
        }
    }
}

/// Projects one public body.
pub fn project(
    body: &[u8],
    runtime_session: RuntimeSessionId,
    public_session: &SessionId,
    map: &CommandMap,
) -> Result<Vec<u8>, ProjectionError> {
    let private = Private {
        runtime_session: runtime_session.uuid(),
        public_session: public_session.as_str(),
        map,
    };
    let text = std::str::from_utf8(body).map_err(|_| ProjectionError("not UTF-8".into()))?;
    let has_cause = text.contains("\"cause\"");
    // An escape could spell an id the raw text does not show: such a body is always parsed.
    let mentions = text.contains("\\u") || private.mentioned_in(text);
    if !mentions && !has_cause {
        return Ok(body.to_vec());
    }
    let mut value: Value =
        serde_json::from_str(text).map_err(|e| ProjectionError(format!("not JSON: {e}")))?;
    let mut changed = false;
    if has_cause {
        rewrite_causes(&mut value, map, &mut changed);
    }
    if mentions {
        private.rewrite_value(&mut value, &mut changed);
    }
    if !changed {
        return Ok(body.to_vec());
    }
    // Keep every other byte: cut removed causes out of the text, rename ids spelled literally
    // in it in place, and use that only if it reads back as the projection (an id spelled
    // with escapes, a key spelled with escapes, duplicate members or one inside a number fall
    // back to re-serialising).
    let cut = if has_cause {
        machine_cause_cuts(text, map).map(|cuts| crate::json_spans::cut(text, cuts))
    } else {
        Some(text.to_owned())
    };
    if let Some(cut) = cut {
        let renamed = private.rewrite(&cut).unwrap_or(cut);
        if serde_json::from_str::<Value>(&renamed).is_ok_and(|v| v == value) {
            return Ok(renamed.into_bytes());
        }
    }
    serde_json::to_vec(&value).map_err(|e| ProjectionError(e.to_string()))
}

/// The byte ranges to cut so every machine cause is gone as [`rewrite_causes`] removes it:
/// its `command_id` member, or the whole `cause` member when that was its only member.
/// `None` when the text cannot be scanned.
fn machine_cause_cuts(text: &str, map: &CommandMap) -> Option<Vec<std::ops::Range<usize>>> {
    use crate::json_spans::{Member, Node, member_removal, scan};
    fn is_key(text: &str, m: &Member, key: &str) -> bool {
        text.get(m.key.start + 1..m.key.end - 1) == Some(key)
    }
    fn walk(text: &str, node: &Node, map: &CommandMap, cuts: &mut Vec<std::ops::Range<usize>>) {
        match node {
            Node::Array { items, .. } => items.iter().for_each(|i| walk(text, i, map, cuts)),
            Node::Object { members, .. } => {
                let mut removed = None;
                if let Some(ci) = members.iter().position(|m| is_key(text, m, "cause"))
                    && let Node::Object { members: inner, .. } = &members[ci].value
                    && let Some(ii) = inner.iter().position(|m| is_key(text, m, "command_id"))
                    && let Node::String { span } = &inner[ii].value
                    && let Ok(id) = serde_json::from_str::<String>(&text[span.clone()])
                    && !map.runtime_to_public.contains_key(&id)
                    && !map.public.contains(&id)
                {
                    if inner.len() == 1 {
                        cuts.push(member_removal(members, ci));
                        removed = Some(ci);
                    } else {
                        cuts.push(member_removal(inner, ii));
                    }
                }
                for (i, m) in members.iter().enumerate() {
                    if removed != Some(i) {
                        walk(text, &m.value, map, cuts);
                    }
                }
            }
            Node::String { .. } | Node::Scalar { .. } => {}
        }
    }
    let root = scan(text)?;
    let mut cuts = Vec::new();
    walk(text, &root, map, &mut cuts);
    Some(cuts)
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

/// The readers of many sessions' public journals, kept warm: a reader that has learnt a
/// session's command mapping keeps it for the next page, so paging a long journal does not
/// rescan it from the start each time. At most `capacity` readers are kept; the least recently
/// used is dropped first. A cached reader serves only the tenant, session and binding it was
/// made for.
pub struct PublicJournals {
    capacity: usize,
    cache: std::sync::Mutex<JournalCache>,
}

#[derive(Default)]
struct JournalCache {
    tick: u64,
    hits: u64,
    readers: HashMap<(TenantId, SessionId), (u64, PublicJournal)>,
}

impl PublicJournals {
    /// How many readers are kept by default.
    pub const DEFAULT_CAPACITY: usize = 1024;

    /// A cache of at most `capacity` readers (at least one).
    pub fn new(capacity: usize) -> PublicJournals {
        PublicJournals {
            capacity: capacity.max(1),
            cache: std::sync::Mutex::new(JournalCache::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, JournalCache> {
        match self.cache.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Reads a page of `session`'s public events, projected, through a cached reader when
    /// one for this tenant, session and binding is kept.
    #[allow(clippy::too_many_arguments)]
    pub async fn page(
        &self,
        store: &Store,
        tenant: &TenantId,
        session: &SessionId,
        binding: &SessionBinding,
        after: u64,
        pinned_tip: Option<u64>,
        limit: usize,
    ) -> Result<PublicJournalPage, PublicJournalError> {
        let key = (tenant.clone(), session.clone());
        let cached = {
            let mut c = self.lock();
            match c.readers.remove(&key) {
                Some((_, reader)) if &reader.binding == binding => {
                    c.hits += 1;
                    Some(reader)
                }
                _ => None,
            }
        };
        let mut reader = cached.unwrap_or_else(|| {
            PublicJournal::new(
                store.clone(),
                tenant.clone(),
                session.clone(),
                binding.clone(),
            )
        });
        let page = reader.page(after, pinned_tip, limit).await;
        let mut c = self.lock();
        c.tick += 1;
        let tick = c.tick;
        c.readers.insert(key, (tick, reader));
        while c.readers.len() > self.capacity {
            let oldest = c
                .readers
                .iter()
                .min_by_key(|(_, (t, _))| *t)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    c.readers.remove(&k);
                }
                None => break,
            }
        }
        page
    }

    /// How many readers are kept now.
    pub fn len(&self) -> usize {
        self.lock().readers.len()
    }

    /// True when no reader is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many reads were served by a kept reader.
    pub fn hits(&self) -> u64 {
        self.lock().hits
    }
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
    use proptest::prelude::*;

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
    #[test]
    fn any_mention_of_a_runtime_command_id_becomes_public_in_any_form_and_place() {
        let (rs, s) = ids();
        let runtime = uuid::Uuid::now_v7();
        let gate = uuid::Uuid::now_v7();
        let mut map = CommandMap::default();
        map.insert(&runtime.hyphenated().to_string(), "cmd-7");
        let upper = runtime.hyphenated().to_string().to_uppercase();
        let simple = runtime.simple().to_string();
        let body = format!(
            r#"{{"ref":"{runtime}","note":"retry of {upper} (x{simple})","{runtime}":{{"gate":"{gate}"}},"list":["ab{runtime}"]}}"#
        );
        let out = String::from_utf8(project(body.as_bytes(), rs, &s, &map).unwrap()).unwrap();
        assert_eq!(
            out,
            format!(
                r#"{{"ref":"cmd-7","note":"retry of cmd-7 (xcmd-7)","cmd-7":{{"gate":"{gate}"}},"list":["abcmd-7"]}}"#
            )
        );
        // Spelled with escapes, it is still found.
        let hyphenated = runtime.hyphenated().to_string();
        let first = hyphenated.chars().next().unwrap();
        let escaped = format!(r#"{{"ref":"\u{:04x}{}"}}"#, first as u32, &hyphenated[1..]);
        let out = String::from_utf8(project(escaped.as_bytes(), rs, &s, &map).unwrap()).unwrap();
        assert_eq!(out, r#"{"ref":"cmd-7"}"#);
    }

    /// Forms a private or foreign UUID may be written in.
    fn forms(id: uuid::Uuid) -> [String; 4] {
        let h = id.hyphenated().to_string();
        let s = id.simple().to_string();
        [h.clone(), h.to_uppercase(), s.clone(), s.to_uppercase()]
    }

    /// A JSON value whose strings and member names are built from `pieces`.
    fn value_from(pieces: Vec<String>) -> impl Strategy<Value = Value> {
        let text = proptest::collection::vec(proptest::sample::select(pieces), 0..4)
            .prop_map(|parts| parts.concat());
        let leaf = prop_oneof![
            text.clone().prop_map(Value::String),
            any::<i64>().prop_map(Value::from),
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
        ];
        leaf.prop_recursive(4, 32, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::vec((text.clone(), inner), 0..4)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    fn replace_everywhere(v: &Value, pairs: &[(String, String)]) -> Value {
        let fix = |t: &str| {
            pairs.iter().fold(t.to_owned(), |acc, (from, to)| {
                acc.replace(from.as_str(), to)
            })
        };
        match v {
            Value::String(t) => Value::String(fix(t)),
            Value::Array(items) => {
                Value::Array(items.iter().map(|i| replace_everywhere(i, pairs)).collect())
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, val)| (fix(k), replace_everywhere(val, pairs)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    #[test]
    fn renaming_ids_and_removing_machine_causes_keep_every_other_byte() {
        let (rs, s) = ids();
        let runtime = uuid::Uuid::now_v7();
        let mut map = CommandMap::default();
        map.insert(&runtime.hyphenated().to_string(), "cmd-7");
        let body = format!(
            "{{ \"z\": 1.50,\n  \"t\": \"caf\\u00e9 {rs}\",\"cause\" : {{\"command_id\":\"{runtime}\"}} }}"
        );
        let out = String::from_utf8(project(body.as_bytes(), rs, &s, &map).unwrap()).unwrap();
        assert_eq!(
            out,
            "{ \"z\": 1.50,\n  \"t\": \"caf\\u00e9 public-s\",\"cause\" : {\"command_id\":\"cmd-7\"} }"
        );
        let machine = format!(
            "{{ \"z\": 1.50, \"cause\": {{\"command_id\":\"{}\"}} }}",
            uuid::Uuid::now_v7()
        );
        let out = String::from_utf8(project(machine.as_bytes(), rs, &s, &map).unwrap()).unwrap();
        // Removing a machine cause keeps every other byte too.
        assert_eq!(out, "{ \"z\": 1.50 }");
        let partial = format!(
            "{{\"cause\" : {{ \"kind\":\"timer\",\n \"command_id\":\"{}\" }}, \"n\": 1e3, \"t\":\"{rs}\"}}",
            uuid::Uuid::now_v7()
        );
        let out = String::from_utf8(project(partial.as_bytes(), rs, &s, &map).unwrap()).unwrap();
        assert_eq!(
            out,
            "{\"cause\" : { \"kind\":\"timer\" }, \"n\": 1e3, \"t\":\"public-s\"}"
        );
    }

    proptest! {
        #[test]
        fn no_private_id_survives_the_projection_and_nothing_else_changes(
            value in {
                let rs = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0001);
                let c1 = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0002);
                let c2 = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0003);
                let foreign = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0004);
                let mut pieces: Vec<String> = ["a", "Z", "0f", " ", "-", "é", "\\", "\"", "session ", "cause_"]
                    .iter()
                    .map(|p| (*p).to_owned())
                    .collect();
                for id in [rs, c1, c2, foreign] {
                    pieces.extend(forms(id));
                }
                value_from(pieces)
            },
        ) {
            let rs = RuntimeSessionId::from_uuid(uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0001)).unwrap();
            let c1 = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0002);
            let c2 = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0003);
            let foreign = uuid::Uuid::from_u64_pair(0x0190_0000_0000_7000, 0x8000_0000_0000_0004);
            let public = SessionId::new("public-s").unwrap();
            let mut map = CommandMap::default();
            map.insert(&c1.hyphenated().to_string(), "cmd-one");
            map.insert(&c2.hyphenated().to_string(), "cmd-two");
            let body = serde_json::to_vec(&value).unwrap();
            let out = project(&body, rs, &public, &map).unwrap();
            let projected: Value = serde_json::from_slice(&out).unwrap();
            // Exactly the private ids, in every form, are renamed; everything else is kept.
            let mut pairs = Vec::new();
            for (id, name) in [(rs.uuid(), "public-s"), (c1, "cmd-one"), (c2, "cmd-two")] {
                for f in forms(id) {
                    pairs.push((f, name.to_owned()));
                }
            }
            prop_assert_eq!(&projected, &replace_everywhere(&value, &pairs));
            let lower = String::from_utf8(out.clone()).unwrap().to_lowercase();
            for id in [rs.uuid(), c1, c2] {
                prop_assert!(!lower.contains(&id.hyphenated().to_string()));
                prop_assert!(!lower.contains(&id.simple().to_string()));
            }
            let text = String::from_utf8(body.clone()).unwrap();
            if forms(foreign).iter().any(|f| text.contains(f.as_str())) {
                prop_assert!(lower.contains(&foreign.simple().to_string()) || lower.contains(&foreign.hyphenated().to_string()));
            }
            if pairs.iter().all(|(f, _)| !text.contains(f.as_str())) {
                prop_assert_eq!(out, body);
            }
        }
    }
}
