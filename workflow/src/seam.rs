//! The seams a run driver works through: the store (only the writes a driver may make — it
//! can never create an answer), the runnables it invokes, the agents it asks and where its
//! step events go. Hosts and tests plug their own in; [`sessionstore::Store`] is the store.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use sessionstore::{
    Checkpoint, Millis, NewCheckpoint, NewStepEntry, RunAnswer, RunEnd, RunFence, RunId,
    RunProgram, RunStatus, StepEntry, StoreResult,
};
use tokio_util::sync::CancellationToken;

use runnable::OutcomeClass;

/// The run records a driver reads and the writes it makes, each under its fence.
#[async_trait]
pub trait RunJournal: Send + Sync {
    async fn status(&self, run: &RunId) -> StoreResult<Option<RunStatus>>;
    async fn program(&self, run: &RunId) -> StoreResult<Option<RunProgram>>;
    async fn journal(&self, run: &RunId) -> StoreResult<Vec<StepEntry>>;
    async fn checkpoints(&self, run: &RunId) -> StoreResult<Vec<Checkpoint>>;
    async fn answers(&self, run: &RunId) -> StoreResult<Vec<RunAnswer>>;
    async fn append(&self, fence: &RunFence, entry: NewStepEntry) -> StoreResult<StepEntry>;
    async fn arm(&self, fence: &RunFence, checkpoint: NewCheckpoint) -> StoreResult<Checkpoint>;
    async fn end(&self, fence: &RunFence, how: RunEnd) -> StoreResult<RunStatus>;
    async fn renew(&self, fence: &RunFence, lease: Duration) -> StoreResult<Millis>;
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
    async fn now_ms(&self) -> StoreResult<Millis> {
        sessionstore::Store::now_ms(self).await
    }
}

/// One invocation a step asks for. `intent_id` and `effect_id` derive from the run and the
/// step, so every re-execution of the step hands the handler the same ids.
#[derive(Debug, Clone)]
pub struct InvokeCall {
    pub reference: String,
    pub identity: String,
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

/// Runs runnables for a driver. `Err` is a refusal before any handler started.
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
