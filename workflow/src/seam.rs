//! The seams a run driver works through: the store (only the writes a driver may make — it
//! can never create an answer), where the releases a run is pinned to come from, the
//! runnables it invokes, the agents it asks and where its step events go. Hosts and tests plug
//! their own in; [`sessionstore::Store`] is the store, [`crate::releases::StoreReleases`] the
//! releases and invoker of a Host.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sessionstore::{
    Checkpoint, Millis, NewCheckpoint, NewStepEntry, ParkUntil, RunAnswer, RunEnd, RunFence, RunId,
    RunPin, RunProgram, RunStatus, StepEntry, StoreResult,
};
use tokio_util::sync::CancellationToken;

use runnable::OutcomeClass;

use crate::program::{Environment, RunnableInfo};

/// The run records a driver reads and the writes it makes, each under its fence.
#[async_trait]
pub trait RunJournal: Send + Sync {
    async fn status(&self, run: &RunId) -> StoreResult<Option<RunStatus>>;
    async fn program(&self, run: &RunId) -> StoreResult<Option<RunProgram>>;
    /// The releases the run is pinned to (none: recorded before pinning, or invokes nothing).
    async fn pins(&self, run: &RunId) -> StoreResult<Vec<RunPin>>;
    /// Pins a run recorded before pinning, under the fence; the first pinning stands.
    async fn pin(&self, fence: &RunFence, pins: Vec<RunPin>) -> StoreResult<Vec<RunPin>>;
    async fn journal(&self, run: &RunId) -> StoreResult<Vec<StepEntry>>;
    async fn checkpoints(&self, run: &RunId) -> StoreResult<Vec<Checkpoint>>;
    async fn answers(&self, run: &RunId) -> StoreResult<Vec<RunAnswer>>;
    async fn append(&self, fence: &RunFence, entry: NewStepEntry) -> StoreResult<StepEntry>;
    async fn arm(&self, fence: &RunFence, checkpoint: NewCheckpoint) -> StoreResult<Checkpoint>;
    async fn end(&self, fence: &RunFence, how: RunEnd) -> StoreResult<RunStatus>;
    async fn renew(&self, fence: &RunFence, lease: Duration) -> StoreResult<Millis>;
    /// Hands the run back to the store until `until` comes; `false` when the ask it would
    /// wait for is answered already (nothing written).
    async fn park(&self, fence: &RunFence, until: ParkUntil) -> StoreResult<bool>;
    /// The store's time (timers are measured against it).
    async fn now_ms(&self) -> StoreResult<Millis>;
}

#[async_trait]
impl RunJournal for sessionstore::Store {
    async fn status(&self, run: &RunId) -> StoreResult<Option<RunStatus>> {
        self.run_status(None, run).await
    }
    async fn program(&self, run: &RunId) -> StoreResult<Option<RunProgram>> {
        self.run_program(run).await
    }
    async fn pins(&self, run: &RunId) -> StoreResult<Vec<RunPin>> {
        self.run_pins(run).await
    }
    async fn pin(&self, fence: &RunFence, pins: Vec<RunPin>) -> StoreResult<Vec<RunPin>> {
        self.pin_run(fence, pins).await
    }
    async fn journal(&self, run: &RunId) -> StoreResult<Vec<StepEntry>> {
        self.run_journal(run).await
    }
    async fn checkpoints(&self, run: &RunId) -> StoreResult<Vec<Checkpoint>> {
        self.run_checkpoints(run).await
    }
    async fn answers(&self, run: &RunId) -> StoreResult<Vec<RunAnswer>> {
        self.run_answers(run).await
    }
    async fn append(&self, fence: &RunFence, entry: NewStepEntry) -> StoreResult<StepEntry> {
        self.append_run_step(fence, entry).await
    }
    async fn arm(&self, fence: &RunFence, checkpoint: NewCheckpoint) -> StoreResult<Checkpoint> {
        self.arm_run_checkpoint(fence, checkpoint).await
    }
    async fn end(&self, fence: &RunFence, how: RunEnd) -> StoreResult<RunStatus> {
        self.end_run(fence, how).await
    }
    async fn renew(&self, fence: &RunFence, lease: Duration) -> StoreResult<Millis> {
        self.renew_run(fence, lease).await
    }
    async fn park(&self, fence: &RunFence, until: ParkUntil) -> StoreResult<bool> {
        self.park_run(fence, until).await
    }
    async fn now_ms(&self) -> StoreResult<Millis> {
        sessionstore::Store::now_ms(self).await
    }
}

/// Why a release could not be pinned, or a pinned one not be had. Each kind has a stable
/// [`ReleaseError::code`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// The pinned release is not in the store (never published there, or removed).
    #[error("{0}")]
    Missing(String),
    /// The stored release is not the pinned one: another digest, or bytes that do not match.
    #[error("{0}")]
    Changed(String),
    /// The store holds another release under the same identity (a version is immutable).
    #[error("{0}")]
    Conflict(String),
    /// It cannot be pinned from here: no workspace, a declaration that does not load, a build
    /// that is refused.
    #[error("{0}")]
    Refused(String),
    /// The store or the disk failed; a later attempt may succeed.
    #[error("{0}")]
    Unavailable(String),
}

impl ReleaseError {
    pub fn code(&self) -> &'static str {
        match self {
            ReleaseError::Missing(_) => "release_missing",
            ReleaseError::Changed(_) => "release_changed",
            ReleaseError::Conflict(_) => "conflict",
            ReleaseError::Refused(_) => "invalid",
            ReleaseError::Unavailable(_) => "unavailable",
        }
    }

    /// Whether a later attempt may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ReleaseError::Unavailable(_))
    }
}

/// Where the releases runs are pinned to come from.
#[async_trait]
pub trait Releases: Send + Sync {
    /// Pins each resolved runnable (one pin per identity) to a release every driver of the run
    /// can reach, building and publishing it when that is needed.
    async fn pin(&self, resolved: &[RunnableInfo]) -> Result<Vec<RunPin>, ReleaseError>;
    /// A pinned release's contract (identity, digest, effect, input schema), read from that
    /// release itself, never from whatever a workspace holds now.
    async fn pinned(&self, pin: &RunPin) -> Result<RunnableInfo, ReleaseError>;
}

/// Releases exactly as an environment resolves them, for environments whose runnables never
/// change (tests, benchmarks): a pin is the identity and digest the environment gave, and a
/// pinned release is what the environment says of that identity.
pub struct AsResolved(pub Arc<dyn Environment>);

#[async_trait]
impl Releases for AsResolved {
    async fn pin(&self, resolved: &[RunnableInfo]) -> Result<Vec<RunPin>, ReleaseError> {
        let mut pins: Vec<RunPin> = resolved
            .iter()
            .map(|r| RunPin {
                identity: r.identity.clone(),
                digest: r.digest.clone(),
            })
            .collect();
        pins.sort();
        pins.dedup_by(|a, b| a.identity == b.identity);
        Ok(pins)
    }

    async fn pinned(&self, pin: &RunPin) -> Result<RunnableInfo, ReleaseError> {
        self.0
            .runnable(&pin.identity)
            .map_err(|e| ReleaseError::Missing(format!("{}: {e:?}", pin.identity)))
    }
}

/// One invocation a step asks for: the pinned release (identity and digest) with the step's
/// ids. `intent_id` and `effect_id` derive from the run, the step and the pinned release, so
/// every re-execution of the step, on any Host, hands the handler the same ids.
#[derive(Debug, Clone)]
pub struct InvokeCall {
    pub reference: String,
    pub identity: String,
    /// The pinned digest: the invoker runs exactly these bytes.
    pub digest: String,
    pub input: Value,
    pub intent_id: String,
    pub effect_id: String,
    pub cancel: CancellationToken,
}

/// What an invocation ended with.
#[derive(Debug, Clone)]
pub struct InvokeDone {
    pub outcome: OutcomeClass,
    pub output: Option<Value>,
    /// One sentence on what was observed.
    pub detail: String,
}

/// Runs pinned releases for a driver. `Err` is a refusal before any handler started.
#[async_trait]
pub trait Invoker: Send + Sync {
    async fn invoke(&self, call: InvokeCall) -> Result<InvokeDone, String>;
}

/// One agent turn an `agent:` step asks for.
#[derive(Debug, Clone)]
pub struct AgentTurn {
    pub tenant: String,
    pub run_id: String,
    pub step: String,
    pub agent: String,
    pub prompt: String,
    pub attempt: u64,
    /// Derived from the run, the step and the attempt: the same on every replay.
    pub idempotency_key: String,
}

/// Runs agent turns for a driver: the reply text, or why the turn failed.
#[async_trait]
pub trait AgentTurns: Send + Sync {
    async fn turn(&self, turn: AgentTurn) -> Result<String, String>;
}

/// What happened to a step, as published on the run's channel.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepEvent {
    pub run_id: String,
    pub epoch: u64,
    pub step: String,
    /// invoke, ask, sleep or agent.
    pub kind: String,
    /// started, finished, replayed, parked (an ask waits for its answer, or the driver
    /// stopped), answered (the parked ask took its answer), failed, attention.
    pub phase: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// Where a driver's step events go (a Host's run channel and metrics; nowhere in tests).
pub trait StepEvents: Send + Sync {
    fn event(&self, event: StepEvent);
}

/// Drops every event.
pub struct NoEvents;

impl StepEvents for NoEvents {
    fn event(&self, _: StepEvent) {}
}
