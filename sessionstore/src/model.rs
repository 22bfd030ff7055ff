//! The store's records and requests: plain data, shared by both backends. Owns the wire
//! spelling of every enum kept in a row; never performs I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use wire_enum::wire_enum;

use crate::clock::Millis;
use crate::error::{StoreError, StoreResult};
use crate::ids::*;

wire_enum! {
    /// The five command kinds a controller may admit.
    pub enum CommandKind {
        Create = "create",
        Restore = "restore",
        Input = "input",
        Interrupt = "interrupt",
        GateResponse = "gate_response",
    }
    kind = "command_kind";
    from_str(StoreError);
    serde;
}

wire_enum! {
    /// Where a command is in its state machine.
    pub enum CommandState {
        Pending = "pending",
        Claimed = "claimed",
        Applying = "applying",
        Applied = "applied",
        Rejected = "rejected",
    }
    kind = "command_state";
    from_str(StoreError);
    serde;
}

impl CommandState {
    /// Applied and rejected are terminal.
    pub fn is_terminal(self) -> bool {
        matches!(self, CommandState::Applied | CommandState::Rejected)
    }
}

wire_enum! {
    /// How a command ended. `applied` and `no_op` end in state `applied`; the others in `rejected`.
    pub enum Outcome {
        Applied = "applied",
        NoOp = "no_op",
        Refused = "refused",
        NotApplied = "not_applied",
        Rejected = "rejected",
    }
    kind = "outcome";
    from_str(StoreError);
    serde;
}

wire_enum! {
    /// What the runtime recorded for an attempt (the disposition in its journal).
    pub enum Disposition {
        Applied = "applied",
        NoOp = "no_op",
        Refused = "refused",
        NotApplied = "not_applied",
    }
    kind = "disposition";
    from_str(StoreError);
    serde;
}

impl Disposition {
    /// The command outcome this disposition settles to.
    pub fn outcome(self) -> Outcome {
        match self {
            Disposition::Applied => Outcome::Applied,
            Disposition::NoOp => Outcome::NoOp,
            Disposition::Refused => Outcome::Refused,
            Disposition::NotApplied => Outcome::NotApplied,
        }
    }

    /// The terminal state this disposition settles to.
    pub fn terminal_state(self) -> CommandState {
        match self {
            Disposition::Applied | Disposition::NoOp => CommandState::Applied,
            Disposition::Refused | Disposition::NotApplied => CommandState::Rejected,
        }
    }
}

wire_enum! {
    /// A session's residency as the Host projects it into the catalog.
    pub enum ResidencyState {
        None = "none",
        Attaching = "attaching",
        Resident = "resident",
        Releasing = "releasing",
        Released = "released",
    }
    kind = "residency_state";
    from_str(StoreError);
    serde;
}

wire_enum! {
    /// How a Host places sessions.
    pub enum Placement {
        Pooled = "pooled",
        Dedicated = "dedicated",
    }
    kind = "placement";
    from_str(StoreError);
    serde;
}

wire_enum! {
    /// A projected gate's state.
    pub enum GateState {
        Open = "open",
        Resolved = "resolved",
    }
    kind = "gate_state";
    from_str(StoreError);
    serde;
}

/// The immutable binding of a session to its runtime's journal.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SessionBinding {
    pub runtime_session_id: RuntimeSessionId,
    pub storage_binding_id: StorageBindingId,
    pub binding_version: u64,
}

/// A session to put in the catalog.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NewSession {
    pub tenant: TenantId,
    pub session: SessionId,
    pub agent: AgentId,
    pub compatibility: CompatibilityId,
    pub binding: SessionBinding,
}

/// A catalog row.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SessionRecord {
    pub tenant: TenantId,
    pub session: SessionId,
    pub agent: AgentId,
    pub compatibility: CompatibilityId,
    pub binding: SessionBinding,
    pub created_at_ms: Millis,
    pub last_active_ms: Millis,
    pub residency_state: ResidencyState,
    pub last_journal_seq: u64,
    pub checkpoint_seq: u64,
    /// The residency epoch high-water that fences gate-projection and projection writes.
    pub gate_mark: ResidencyEpoch,
}

/// The Host-owned part of a catalog row, written under the gate mark's fence.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SessionProjection {
    pub residency_state: ResidencyState,
    pub last_journal_seq: u64,
    pub checkpoint_seq: u64,
}

/// A request for a session's residency lease.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResidencyRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    /// An opaque token unique to this residency attempt (the holder).
    pub holder: String,
    pub host: HostId,
    pub host_generation: u64,
    pub ttl: Duration,
}

/// A granted residency: proof of the right to write for a session until it expires.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResidencyGrant {
    pub tenant: TenantId,
    pub session: SessionId,
    pub epoch: ResidencyEpoch,
    pub holder: String,
    pub host: HostId,
    pub host_generation: u64,
    pub expires_at_ms: Millis,
}

/// A residency lease row as stored (a released lease has no holder; its epoch stays).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResidencyLease {
    pub tenant: TenantId,
    pub session: SessionId,
    pub epoch: ResidencyEpoch,
    pub holder: Option<String>,
    pub host: Option<HostId>,
    pub host_generation: Option<u64>,
    pub expires_at_ms: Option<Millis>,
}

impl ResidencyLease {
    /// Held by someone and not expired at `now`.
    pub fn is_live(&self, now: Millis) -> bool {
        self.holder.is_some() && self.expires_at_ms.is_some_and(|e| e > now)
    }
}

/// The route a controller dials for a session.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HostRegistration {
    pub tenant: TenantId,
    pub session: SessionId,
    pub host: HostId,
    pub host_generation: u64,
    pub endpoint: String,
    pub residency: ResidencyState,
    pub accepting: bool,
    pub lease_epoch: ResidencyEpoch,
    pub observed_at_ms: Millis,
    pub expires_at_ms: Millis,
}

/// A registration to publish; the store stamps observed/expires from its clock.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RegistrationUpdate {
    pub tenant: TenantId,
    pub session: SessionId,
    pub host: HostId,
    pub host_generation: u64,
    pub endpoint: String,
    pub residency: ResidencyState,
    pub accepting: bool,
    pub lease_epoch: ResidencyEpoch,
    pub ttl: Duration,
}

/// A Host's advertisement in the registry.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HostTarget {
    pub host: HostId,
    pub endpoint: String,
    pub placement: Placement,
    pub isolation_class: String,
    pub capacity: u32,
    pub accepting: bool,
    pub generation: u64,
    pub observed_at_ms: Millis,
    pub expires_at_ms: Millis,
    /// The admission weight the Host had charged at its last heartbeat.
    pub weight_used: u32,
}

impl HostTarget {
    /// Accepting and its heartbeat promise has not run out at `now`.
    pub fn is_live(&self, now: Millis) -> bool {
        self.expires_at_ms > now
    }
}

/// An advertisement (or heartbeat) to publish; the store stamps observed/expires.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HostAdvertisement {
    pub host: HostId,
    pub endpoint: String,
    pub placement: Placement,
    pub isolation_class: String,
    pub capacity: u32,
    pub accepting: bool,
    pub generation: u64,
    pub ttl: Duration,
}

/// A reference to a payload object: its id, exact size and SHA-256 (lower-case hex).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ObjectRef {
    pub object_id: ObjectId,
    pub size: u64,
    pub sha256: String,
}

/// A command body: inline up to 64 KiB, otherwise a verified payload object reference.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum CommandBody {
    Inline(Vec<u8>),
    Object(ObjectRef),
}

/// A command to admit.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NewCommand {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
    pub kind: CommandKind,
    pub body: CommandBody,
    pub principal: Option<String>,
    /// JSON text, kept byte for byte.
    pub metadata: Option<String>,
    /// The apply deadline, from admission.
    pub apply_within: Duration,
    /// The W3C trace the admission belongs to: the Host that applies the command continues
    /// it. Not part of the command's identity (a retried admission is the same command).
    pub trace: Option<trace_context::TraceContext>,
}

/// A claim on a command by one residency.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Claim {
    pub epoch: ResidencyEpoch,
    pub token: uuid::Uuid,
    pub expires_at_ms: Millis,
}

/// The one dispatch attempt of a command; immutable once recorded.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Attempt {
    pub id: AttemptId,
    pub journal_epoch: JournalEpoch,
    pub residency_epoch: ResidencyEpoch,
    pub begun_at_ms: Millis,
}

/// An inbox row.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct CommandRecord {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
    pub kind: CommandKind,
    pub body: CommandBody,
    /// SHA-256 of the body bytes, lower-case hex.
    pub body_digest: String,
    pub body_size: u64,
    pub principal: Option<String>,
    pub metadata: Option<String>,
    pub runtime_command: RuntimeCommandId,
    pub accepted_order: u64,
    pub admitted_at_ms: Millis,
    pub apply_deadline_ms: Millis,
    /// The trace the command was admitted under (see [`NewCommand::trace`]).
    pub trace: Option<trace_context::TraceContext>,
    pub state: CommandState,
    pub revision: u64,
    /// The highest residency epoch that has written this record.
    pub epoch_mark: ResidencyEpoch,
    pub claim: Option<Claim>,
    pub attempt: Option<Attempt>,
    pub outcome: Option<Outcome>,
    pub reason: Option<String>,
    pub evidence_seq: Option<u64>,
    pub settled_at_ms: Option<Millis>,
}

/// Claim a command under a residency grant.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClaimRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
    pub epoch: ResidencyEpoch,
    /// Unique per claim; the same token replayed returns the claim unchanged.
    pub token: uuid::Uuid,
    pub ttl: Duration,
    pub expected_revision: u64,
}

/// Reject a command before any attempt exists.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RejectRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
    pub epoch: ResidencyEpoch,
    pub reason: String,
    pub expected_revision: u64,
}

/// Record the one attempt of a claimed command.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct AttemptRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
    pub epoch: ResidencyEpoch,
    pub claim_token: uuid::Uuid,
    pub attempt: AttemptId,
    pub journal_epoch: JournalEpoch,
    pub expected_revision: u64,
}

/// Settle an applying command from the runtime's evidence. The caller supplies no outcome.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SettleRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub command: CommandId,
    pub epoch: ResidencyEpoch,
    pub expected_revision: u64,
}

/// A session's consumption cursor.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Cursor {
    pub consumed_order: u64,
    pub epoch: ResidencyEpoch,
}

/// A gate to project as open.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OpenGate {
    pub gate: GateId,
    pub opened_event: EventId,
    pub opened_seq: u64,
    pub kind: String,
    pub prompt_summary: String,
    pub deadline_ms: Millis,
}

/// A projected gate.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GateRecord {
    pub tenant: TenantId,
    pub session: SessionId,
    pub gate: GateId,
    pub opened_event: EventId,
    pub opened_seq: u64,
    pub kind: String,
    pub prompt_summary: String,
    pub deadline_ms: Millis,
    pub state: GateState,
    pub opened_at_ms: Millis,
    pub resolved_seq: Option<u64>,
    pub resolved_at_ms: Option<Millis>,
}

/// A payload object to store.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NewObject {
    pub tenant: TenantId,
    pub session: SessionId,
    pub kind: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// A payload object read back (verified against its size and digest).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StoredObject {
    pub reference: ObjectRef,
    pub tenant: TenantId,
    pub session: SessionId,
    pub kind: String,
    pub media_type: String,
    pub bytes: Vec<u8>,
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn check_sha256_hex(field: &'static str, value: &str) -> StoreResult<()> {
    if value.len() != 64
        || !value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(StoreError::invalid(
            field,
            "must be 64 lower-case hex characters",
        ));
    }
    Ok(())
}

pub(crate) fn check_short_text(field: &'static str, value: &str) -> StoreResult<()> {
    if value.len() > crate::limits::MAX_SHORT_TEXT_BYTES {
        return Err(StoreError::invalid(
            field,
            format!(
                "is {} bytes; at most {} allowed",
                value.len(),
                crate::limits::MAX_SHORT_TEXT_BYTES
            ),
        ));
    }
    Ok(())
}
