//! The store's final state of the sessions a check covers, read once: each session's catalog
//! row, every command (in acceptance order), every journal record (every kind, in sequence
//! order) and its residency lease, with the store's clock at the read. Owns the reading and
//! the per-session indexes the rules look things up in; never writes the store and never
//! judges anything.

use std::collections::HashMap;

use serde_json::Value;
use sessionstore::{
    CommandId, CommandRecord, DispositionFrame, JournalRecord, Millis, RecordKind, ResidencyLease,
    RuntimeCommandId, SessionId, SessionRecord, Store, StoreError,
};

/// The page size of every read (the store's own bound).
const PAGE: usize = sessionstore::limits::MAX_PAGE;

/// One session as the store holds it.
#[derive(Clone, Debug)]
pub struct SessionView {
    pub record: SessionRecord,
    /// Every command, in acceptance order.
    pub commands: Vec<CommandRecord>,
    /// Every journal record of the session's runtime, in sequence order.
    pub journal: Vec<JournalRecord>,
    pub residency: Option<ResidencyLease>,
}

/// A public event of the journal as the checker reads it: its sequence, what caused it (the
/// private cause column) and its decoded body.
#[derive(Clone, Debug)]
pub struct PublicEventView<'a> {
    pub seq: u64,
    pub cause: Option<RuntimeCommandId>,
    pub body: Value,
    pub raw: &'a [u8],
}

impl PublicEventView<'_> {
    /// The body's `type`.
    pub fn kind(&self) -> &str {
        self.body.get("type").and_then(Value::as_str).unwrap_or("")
    }

    /// The body's text field for its type: `text` of a `user_message`, `content` of a
    /// `tool_result`.
    pub fn text(&self) -> Option<&str> {
        let field = match self.kind() {
            "tool_result" => "content",
            _ => "text",
        };
        self.body.get(field).and_then(Value::as_str)
    }
}

impl SessionView {
    pub fn id(&self) -> &SessionId {
        &self.record.session
    }

    /// The command with this public id.
    pub fn command(&self, id: &CommandId) -> Option<&CommandRecord> {
        self.commands.iter().find(|c| &c.command == id)
    }

    /// Every disposition frame (application or closure), by the runtime command it settles.
    pub fn dispositions(&self) -> HashMap<RuntimeCommandId, Vec<DispositionFrame>> {
        let mut out: HashMap<RuntimeCommandId, Vec<DispositionFrame>> = HashMap::new();
        for r in &self.journal {
            if let Some(f) = r.disposition_frame() {
                out.entry(f.identity.runtime_command).or_default().push(f);
            }
        }
        out
    }

    /// How many event and control records each runtime command caused (its effects).
    pub fn effects(&self) -> HashMap<RuntimeCommandId, usize> {
        let mut out = HashMap::new();
        for r in &self.journal {
            let cause = match &r.kind {
                RecordKind::Event { cause, .. } | RecordKind::Control { cause, .. } => *cause,
                _ => None,
            };
            if let Some(c) = cause {
                *out.entry(c).or_default() += 1;
            }
        }
        out
    }

    /// The public events, decoded (a body that is not JSON reads as `null`).
    pub fn public_events(&self) -> Vec<PublicEventView<'_>> {
        self.journal
            .iter()
            .filter_map(|r| match &r.kind {
                RecordKind::Event {
                    public_body, cause, ..
                } => Some(PublicEventView {
                    seq: r.seq,
                    cause: *cause,
                    body: serde_json::from_slice(public_body).unwrap_or(Value::Null),
                    raw: public_body,
                }),
                _ => None,
            })
            .collect()
    }
}

/// The sessions a check covers, read from one store.
#[derive(Clone, Debug)]
pub struct StoreView {
    /// The store's clock when the read began.
    pub read_at_ms: Millis,
    pub sessions: Vec<SessionView>,
}

impl StoreView {
    /// Reads every command, journal record and residency lease of `sessions`.
    pub async fn read(store: &Store, sessions: &[SessionRecord]) -> Result<StoreView, StoreError> {
        let read_at_ms = store.now_ms().await?;
        let mut out = Vec::with_capacity(sessions.len());
        for s in sessions {
            let record = store.session(&s.tenant, &s.session).await?;
            let mut commands: Vec<CommandRecord> = Vec::new();
            loop {
                let after = commands.last().map_or(0, |c| c.accepted_order);
                let page = store
                    .list_commands(&s.tenant, &s.session, after, PAGE)
                    .await?;
                let done = page.len() < PAGE;
                commands.extend(page);
                if done {
                    break;
                }
            }
            let rs = record.binding.runtime_session_id;
            let mut journal: Vec<JournalRecord> = Vec::new();
            loop {
                let after = journal.last().map_or(0, |r| r.seq);
                let page = store
                    .journal_runtime_page(&s.tenant, rs, after, PAGE)
                    .await?;
                let done = page.len() < PAGE;
                journal.extend(page);
                if done {
                    break;
                }
            }
            let residency = store.residency(&s.tenant, &s.session).await?;
            out.push(SessionView {
                record,
                commands,
                journal,
                residency,
            });
        }
        Ok(StoreView {
            read_at_ms,
            sessions: out,
        })
    }

    /// The view of `session`.
    pub fn session(&self, session: &SessionId) -> Option<&SessionView> {
        self.sessions.iter().find(|s| s.id() == session)
    }
}
