//! The runtime journal's vocabulary: its lease, the entries a writer appends and the records a
//! reader gets back. The journal is written only by the runtime that holds its journal lease;
//! the Host reads it (for evidence and public pages) and never writes it.

use wire_enum::wire_enum;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;
use crate::limits::{MAX_RECORD_VALUE_BYTES, MAX_REFERENCED_BODY_BYTES};
use crate::model::{CommandKind, CommandRecord, Disposition, ObjectRef};

/// A runtime's hold on its journal. Every append is fenced by `epoch` and compare-and-set on
/// the tip the writer tracks.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct JournalLease {
    pub tenant: TenantId,
    pub runtime_session: RuntimeSessionId,
    pub epoch: JournalEpoch,
    pub holder: String,
    /// The sequence number of the last record, including the opening fence this lease wrote.
    pub tip: u64,
    pub expires_at_ms: Millis,
}

/// The lease row as stored (a released lease has no holder; its epoch stays).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct JournalLeaseState {
    pub tenant: TenantId,
    pub runtime_session: RuntimeSessionId,
    pub epoch: JournalEpoch,
    pub holder: Option<String>,
    pub expires_at_ms: Option<Millis>,
    pub tip: u64,
}

wire_enum! {
    /// The outcome a runtime records when it accepts a command (the disposition half of a
    /// command application).
    pub enum ApplicationOutcome {
        Applied = "applied",
        NoOp = "no_op",
        Refused = "refused",
    }
    kind = "application_outcome";
    serde;
}

impl ApplicationOutcome {
    /// As a disposition.
    pub fn disposition(self) -> Disposition {
        match self {
            ApplicationOutcome::Applied => Disposition::Applied,
            ApplicationOutcome::NoOp => Disposition::NoOp,
            ApplicationOutcome::Refused => Disposition::Refused,
        }
    }
}

/// The identity of a command as the runtime saw it (the application prefix).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CommandIdentity {
    pub command: CommandId,
    pub runtime_command: RuntimeCommandId,
    pub kind: CommandKind,
}

impl CommandRecord {
    /// The identity the runtime records this command under (the application prefix).
    pub fn identity(&self) -> CommandIdentity {
        CommandIdentity {
            command: self.command.clone(),
            runtime_command: self.runtime_command,
            kind: self.kind,
        }
    }
}

/// One entry to append to the journal.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum JournalEntry {
    /// A public event (what a client may see), with an optional private body.
    Event {
        event: EventId,
        public_body: Vec<u8>,
        private_body: Option<Vec<u8>>,
        cause: Option<RuntimeCommandId>,
    },
    /// Runtime-internal control state (never public).
    Control {
        body: Vec<u8>,
        cause: Option<RuntimeCommandId>,
    },
    /// One record carrying both the application prefix and the disposition for an attempt.
    Application {
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
        outcome: ApplicationOutcome,
        /// Optional runtime detail (e.g. the refusal reason), private.
        detail: Option<Vec<u8>>,
    },
    /// A predecessor's attempt closed `not_applied` under a strictly later journal epoch.
    Closure {
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
    },
}

impl JournalEntry {
    pub(crate) fn check(&self) -> StoreResult<()> {
        let check_body = |field: &'static str, body: &[u8]| -> StoreResult<()> {
            if body.len() as u64 > MAX_REFERENCED_BODY_BYTES {
                return Err(StoreError::invalid(
                    field,
                    format!(
                        "is {} bytes; at most {MAX_REFERENCED_BODY_BYTES} allowed",
                        body.len()
                    ),
                ));
            }
            Ok(())
        };
        match self {
            JournalEntry::Event {
                public_body,
                private_body,
                ..
            } => {
                check_body("public_body", public_body)?;
                if let Some(p) = private_body {
                    check_body("private_body", p)?;
                }
            }
            JournalEntry::Control { body, .. } => {
                if body.len() > MAX_RECORD_VALUE_BYTES {
                    return Err(StoreError::invalid(
                        "control_body",
                        format!(
                            "is {} bytes; at most {MAX_RECORD_VALUE_BYTES} allowed",
                            body.len()
                        ),
                    ));
                }
            }
            JournalEntry::Application {
                detail,
                attempt_epoch,
                ..
            } => {
                if attempt_epoch.0 == 0 {
                    return Err(StoreError::invalid("attempt_journal_epoch", "must be >= 1"));
                }
                if let Some(d) = detail
                    && d.len() > MAX_RECORD_VALUE_BYTES
                {
                    return Err(StoreError::invalid("detail", "is too large"));
                }
            }
            JournalEntry::Closure { attempt_epoch, .. } => {
                if attempt_epoch.0 == 0 {
                    return Err(StoreError::invalid("attempt_journal_epoch", "must be >= 1"));
                }
            }
        }
        Ok(())
    }
}

/// A stored body: inline, or offloaded to a payload object (bodies over 64 KiB).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum StoredBody {
    Inline(Vec<u8>),
    Object(ObjectRef),
}

/// What a journal record is.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum RecordKind {
    /// The opening fence a lease acquisition writes at the tip.
    Fence,
    Event {
        event: EventId,
        public_body: Vec<u8>,
        private_body: Option<Vec<u8>>,
        cause: Option<RuntimeCommandId>,
    },
    Control {
        body: Vec<u8>,
        cause: Option<RuntimeCommandId>,
    },
    Application {
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
        outcome: ApplicationOutcome,
        detail: Option<Vec<u8>>,
    },
    Closure {
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
    },
}

/// A journal record as read back (a privileged runtime page holds every kind).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct JournalRecord {
    pub seq: u64,
    /// The journal epoch of the lease that wrote this record.
    pub epoch: JournalEpoch,
    pub written_at_ms: Millis,
    pub kind: RecordKind,
}

/// The disposition frame settlement reads as evidence: an application or a closure.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DispositionFrame {
    pub seq: u64,
    /// The epoch the frame was written under.
    pub written_epoch: JournalEpoch,
    pub identity: CommandIdentity,
    pub attempt: AttemptId,
    pub attempt_epoch: JournalEpoch,
    pub disposition: Disposition,
}

impl JournalRecord {
    /// The disposition frame this record is, if it is an application or a closure.
    pub fn disposition_frame(&self) -> Option<DispositionFrame> {
        match &self.kind {
            RecordKind::Application {
                identity,
                attempt,
                attempt_epoch,
                outcome,
                ..
            } => Some(DispositionFrame {
                seq: self.seq,
                written_epoch: self.epoch,
                identity: identity.clone(),
                attempt: *attempt,
                attempt_epoch: *attempt_epoch,
                disposition: outcome.disposition(),
            }),
            RecordKind::Closure {
                identity,
                attempt,
                attempt_epoch,
            } => Some(DispositionFrame {
                seq: self.seq,
                written_epoch: self.epoch,
                identity: identity.clone(),
                attempt: *attempt,
                attempt_epoch: *attempt_epoch,
                disposition: Disposition::NotApplied,
            }),
            _ => None,
        }
    }
}

/// One public event.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PublicEvent {
    pub seq: u64,
    pub event: EventId,
    pub body: Vec<u8>,
}

/// A page of public events. `tip` is pinned at the first page of a read: later pages never
/// show records appended after it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PublicPage {
    pub events: Vec<PublicEvent>,
    /// The journal tip this read is pinned to.
    pub tip: u64,
    /// Pass as `after` to read the next page; equal to `tip` when the read is complete.
    pub next_after: u64,
}

impl PublicPage {
    /// True when this page reached the pinned tip.
    pub fn is_complete(&self) -> bool {
        self.next_after >= self.tip
    }
}

/// One public event with its public offset: its ordinal among the public events of its
/// journal (1 for the first, no gaps). The journal is append-only, so a record's offset never
/// changes and every reader computes the same one.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OffsetEvent {
    pub offset: u64,
    pub seq: u64,
    pub event: EventId,
    pub body: Vec<u8>,
}

/// Public events by public offset, with the journal's public top (how many public events it
/// held when read; its offsets run 1..=top).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OffsetPage {
    pub events: Vec<OffsetEvent>,
    pub top: u64,
}

wire_enum! {
    /// The kind of a journal row, as its `kind` column spells it.
    pub(crate) enum RowKind {
        /// The mark a new journal epoch starts with.
        Fence = "fence",
        Event = "event",
        Control = "control",
        Application = "application",
        Closure = "closure",
    }
    kind = "journal";
}

pub(crate) fn record_kind_tag(kind: &JournalEntry) -> RowKind {
    match kind {
        JournalEntry::Event { .. } => RowKind::Event,
        JournalEntry::Control { .. } => RowKind::Control,
        JournalEntry::Application { .. } => RowKind::Application,
        JournalEntry::Closure { .. } => RowKind::Closure,
    }
}

/// A runtime's checkpoint of its journal's fold: what the runtime derived from the records up
/// to and including `seq`, in its own encoding (`format`, which the runtime versions). Not a
/// journal record: it takes no sequence number and is never public.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct JournalSnapshot {
    pub seq: u64,
    /// The journal epoch of the lease that wrote it.
    pub epoch: JournalEpoch,
    pub format: u32,
    pub body: Vec<u8>,
    pub written_at_ms: Millis,
}
