//! The runtime capabilities a Host consumes, each a small separate trait, and the [`Runtime`]
//! bundle a launch returns. A runtime owns its journal and its journal lease; the Host never
//! writes the journal and reads evidence only from the store.

use std::sync::Arc;
use std::time::Duration;

use sessionstore::wire::CommandBodyV1;
use sessionstore::{
    ApplicationOutcome, AttemptId, CommandIdentity, CommandRecord, Disposition, EventId,
    JournalEpoch, RuntimeSessionId, SessionId, StoreError, TenantId,
};
use tokio::sync::{broadcast, watch};

/// A command dispatched to a runtime under one attempt identity. The body is already decoded
/// and verified (a referenced body was dereferenced and checked by the Host).
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeCommand {
    pub tenant: TenantId,
    pub session: SessionId,
    pub identity: CommandIdentity,
    pub attempt: AttemptId,
    /// The journal epoch the Host read from this runtime when it began the attempt.
    pub journal_epoch: JournalEpoch,
    pub body: CommandBodyV1,
    /// Who asked (a recorded assertion, not authorization evidence).
    pub principal: Option<String>,
    /// Controller metadata (JSON object text), kept byte for byte.
    pub metadata: Option<String>,
    /// The trace this dispatch belongs to (the Host's span for it, else the admission's): the
    /// runtime's turn continues it.
    pub trace: Option<sessionstore::TraceContext>,
}

impl RuntimeCommand {
    /// The command `rec` as dispatched under `attempt`, begun at `journal_epoch`, with its
    /// already decoded `body`; principal and metadata are carried from the inbox record.
    pub fn for_attempt(
        rec: &CommandRecord,
        attempt: AttemptId,
        journal_epoch: JournalEpoch,
        body: CommandBodyV1,
    ) -> RuntimeCommand {
        RuntimeCommand {
            tenant: rec.tenant.clone(),
            session: rec.session.clone(),
            identity: rec.identity(),
            attempt,
            journal_epoch,
            body,
            principal: rec.principal.clone(),
            trace: rec.trace.clone(),
            metadata: rec.metadata.clone(),
        }
    }
}

/// A disposition the runtime durably recorded, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub disposition: Disposition,
    /// The journal sequence of the record carrying it.
    pub seq: u64,
}

impl Recorded {
    /// An application outcome recorded at `seq`.
    pub fn applied(outcome: ApplicationOutcome, seq: u64) -> Recorded {
        Recorded {
            disposition: outcome.disposition(),
            seq,
        }
    }
}

/// A persistence fault: the runtime could not write its journal and refuses everything now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistenceFault {
    pub reason: String,
}

/// Why a runtime could not do what it was asked (nothing durable was written for it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// A persistence fault is latched: every command is refused from now on.
    #[error("persistence_fault: {0}")]
    Faulted(String),
    /// The runtime was released or abandoned.
    #[error("stopped: the runtime is no longer running")]
    Stopped,
    /// The journal lease was taken by a successor.
    #[error("lease_lost: the journal lease was taken over")]
    LeaseLost,
    /// The attempt's journal epoch is not this runtime's.
    #[error("epoch: the attempt names journal epoch {attempt}, this runtime holds {held}")]
    Epoch { attempt: u64, held: u64 },
    /// The command names another tenant or session than the one this runtime runs.
    #[error("wrong_session: the command is not for this runtime's session")]
    WrongSession,
    /// A graceful release was asked of a session that is not whole-session idle.
    #[error("not_idle: the session has a turn, a gate or queued work")]
    NotIdle,
    /// A closure was refused (the journal holds an effect of that command).
    #[error("closure_refused: {0}")]
    ClosureRefused(String),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

impl RuntimeError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RuntimeError::Faulted(_) => "persistence_fault",
            RuntimeError::Stopped => "stopped",
            RuntimeError::LeaseLost => "lease_lost",
            RuntimeError::Epoch { .. } => "epoch",
            RuntimeError::WrongSession => "wrong_session",
            RuntimeError::NotIdle => "not_idle",
            RuntimeError::ClosureRefused(_) => "closure_refused",
            RuntimeError::Store(_) => "store",
        }
    }
}

/// Applies a command under its attempt identity and returns the disposition it durably
/// recorded (one journal append carrying the application prefix and the disposition). A
/// duplicate delivery returns the recorded disposition and does nothing else.
#[async_trait::async_trait]
pub trait CommandApplier: Send + Sync {
    async fn apply(&self, command: RuntimeCommand) -> Result<Recorded, RuntimeError>;
}

/// Closes a predecessor's attempt `not_applied` under this runtime's strictly later journal
/// epoch. When the journal already holds that command's disposition, returns it instead.
#[async_trait::async_trait]
pub trait AttemptCloser: Send + Sync {
    async fn close_attempt(
        &self,
        identity: CommandIdentity,
        attempt: AttemptId,
        attempt_epoch: JournalEpoch,
    ) -> Result<Recorded, RuntimeError>;
}

/// Reports the journal epoch this runtime writes under.
pub trait JournalEpochReporter: Send + Sync {
    fn journal_epoch(&self) -> JournalEpoch;
}

/// Persistence-fault reporting and crash-equivalent abandonment.
#[async_trait::async_trait]
pub trait PersistenceFaults: Send + Sync {
    /// `Some` once a fault has latched.
    fn faults(&self) -> watch::Receiver<Option<PersistenceFault>>;
    /// Stops the runtime as a crash would: writes nothing to the journal (no interruption,
    /// no gate resolution), then releases the journal lease so a successor restores sooner.
    async fn abandon(&self) -> Result<(), RuntimeError>;
}

/// Whole-session idle: no turn in flight, no open gate, nothing queued.
pub trait IdleWatch: Send + Sync {
    fn idle(&self) -> watch::Receiver<bool>;
}

/// Waits until `watch` reads idle, up to `bound`. True when idle was reached.
pub async fn wait_idle(watch: &dyn IdleWatch, bound: Duration) -> bool {
    let mut rx = watch.idle();
    tokio::time::timeout(bound, async {
        loop {
            if *rx.borrow_and_update() {
                return true;
            }
            if rx.changed().await.is_err() {
                return *rx.borrow();
            }
        }
    })
    .await
    .unwrap_or(false)
}

/// Liveness: true while the runtime runs; false once it stopped for any reason.
pub trait Liveness: Send + Sync {
    fn alive(&self) -> watch::Receiver<bool>;
}

/// Graceful release: only a whole-session idle runtime releases (else `NotIdle`).
#[async_trait::async_trait]
pub trait GracefulRelease: Send + Sync {
    async fn release(&self) -> Result<(), RuntimeError>;
}

/// A committed (durable) public event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedEvent {
    pub seq: u64,
    pub event: EventId,
    /// The public body, as journaled.
    pub body: Arc<[u8]>,
}

/// A live, non-durable preview of a turn in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preview {
    /// The turn's own id (a runtime content identity, not a private session id).
    pub turn: String,
    /// The text: a delta of answer or reasoning text, or a tool step's preview (its audit
    /// summary, or its name when it has none, on start; at most [`TOOL_PREVIEW_BYTES`] of its
    /// result on finish).
    pub delta: String,
    pub kind: PreviewKind,
}

/// The most result text a tool step preview carries.
pub const TOOL_PREVIEW_BYTES: usize = 2048;

/// What a preview shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreviewKind {
    /// The model's visible answer text.
    Text,
    /// Visible model reasoning (never opaque or redacted provider state).
    Reasoning,
    /// A tool call began (`call_id` is the key a viewer joins the committed step on).
    ToolStarted { call_id: String, name: String },
    /// A tool call finished.
    ToolFinished {
        call_id: String,
        name: String,
        is_error: bool,
    },
}

/// `text` cut to at most `max` bytes on a character boundary.
pub fn truncate_preview(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut at = max;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    &text[..at]
}

/// Committed events (durable; hints for publishers) and previews (ephemeral).
pub trait EventSource: Send + Sync {
    /// Each event is shared (`Arc`): the buffer holds a pointer per slot, not the event.
    fn committed(&self) -> broadcast::Receiver<Arc<CommittedEvent>>;
    fn previews(&self) -> broadcast::Receiver<Preview>;
}

/// A launched runtime: the capabilities a Host consumes. The two recovery capabilities are
/// optional in the type and required by the durable profile.
#[derive(Clone)]
pub struct Runtime {
    /// The runtime session id it actually runs under.
    pub runtime_session: RuntimeSessionId,
    pub applier: Arc<dyn CommandApplier>,
    pub epoch: Arc<dyn JournalEpochReporter>,
    pub idle: Arc<dyn IdleWatch>,
    pub liveness: Arc<dyn Liveness>,
    pub release: Arc<dyn GracefulRelease>,
    pub events: Arc<dyn EventSource>,
    pub closer: Option<Arc<dyn AttemptCloser>>,
    pub faults: Option<Arc<dyn PersistenceFaults>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("runtime_session", &self.runtime_session)
            .field("closer", &self.closer.is_some())
            .field("faults", &self.faults.is_some())
            .finish()
    }
}

impl Runtime {
    /// Stops the runtime: crash-equivalently when it can be abandoned, else gracefully.
    pub async fn stop(&self) -> Result<(), RuntimeError> {
        match &self.faults {
            Some(f) => f.abandon().await,
            None => self.release.release().await,
        }
    }
}
