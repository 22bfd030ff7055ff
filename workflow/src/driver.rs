//! The run driver: durability by replay. A driver holds one run under its fence (epoch and
//! fencing token), reads the recorded program (never a file) against the releases the run is
//! pinned to (never whatever a workspace holds now), walks the steps from the top taking
//! recorded results, and executes the first step without one. Every result is
//! journaled under the fence before the next step begins; a write refused for the fence stops
//! the driver at once (no further handler, timer or turn, no terminal write).
//!
//! Uncertainty: an invocation of a `read_only` or `idempotent` runnable that was interrupted
//! is simply invoked again with the same intent and effect ids. An `effectful` one journals a
//! `began` entry before its handler starts; finding a `began` without an ending (a crash
//! mid-invoke) or ending uncertain (crashed, timed out, …) parks the run `needs_attention`
//! behind an attention point `<step>.attempt-<n>` that an operator answers with
//! `{"action": "retry"}` or `{"action": "skip", "output": …}` — never a silent re-run.
//!
//! Supervision: a failed attempt (certain `failed`; for replay-safe runnables also an
//! uncertain one) is journaled as a `failure` entry, so the budget survives restarts; within
//! `restarts` (counted over the trailing `window`, if any) the step runs again in place.
//!
//! Pinning: a run's releases were pinned when it started, so its ids (`intent_id`,
//! `effect_id`) and the bytes it runs are the same on every attempt and every Host. A run
//! recorded before pinning existed is pinned once, at its first drive by a build that pins:
//! resolved from this driver's environment (the workspace, strictly), and recorded under the
//! fence. A pinned release that is gone from the store, or whose bytes changed, fails the run
//! at the step that invokes it (`release_missing`, `release_changed`); a store or disk that
//! fails for now stops the driver without a decision (the run stays running for a successor).
//!
//! Holding: the lease is renewed every quarter of it. A driver that cannot confirm its lease
//! for five sixths of it (renewals failing or hanging: the store unreachable) stops its
//! handler and itself without writing, a sixth of the lease before a successor may take the
//! run over; a drain that runs out of time halts in-flight invokes the same way. Either way
//! the step stays open and a successor's attempt is the next attempt.
//!
//! This module must never create an answer: it only consumes those the store recorded.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sessionstore::{
    CheckpointKind, ErrorCode, NewCheckpoint, NewStepEntry, ParkUntil, RunEnd, RunFailure,
    RunFence, RunId, RunState, RunStatus, StepEntry, StepEntryKind, StoreError,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::pinning::{self, PinnedEnvironment};
use crate::program::{self, Environment, Program, Step, StepKind, Supervise};
use crate::seam::{
    AgentTurn, AgentTurns, InvokeCall, Invoker, ReleaseError, Releases, RunJournal, StepEvent,
    StepEvents,
};
use runnable::OutcomeClass;

/// Stable codes a failed run carries.
pub mod failure_codes {
    /// The recorded program no longer validates here (a runnable gone, an agent unknown).
    pub const PROGRAM_INVALID: &str = "program_invalid";
    /// A running run whose program record is missing.
    pub const PROGRAM_MISSING: &str = "program_missing";
    /// A template read something that is not there.
    pub const TEMPLATE: &str = "template";
    /// The rendered input breaks the runnable's input schema (the handler never started).
    pub const INPUT_INVALID: &str = "input_invalid";
    /// The runnable refused before its handler started.
    pub const INVOKE_REFUSED: &str = "invoke_refused";
    /// The handler said it failed, past the restart budget.
    pub const STEP_FAILED: &str = "step_failed";
    /// A replay-safe step's outcomes stayed uncertain past the restart budget.
    pub const STEP_UNCERTAIN: &str = "step_uncertain";
    /// An agent turn failed past the restart budget.
    pub const AGENT_FAILED: &str = "agent_failed";
    /// This driver cannot run agent turns.
    pub const AGENT_UNAVAILABLE: &str = "agent_unavailable";
    /// A recorded answer does not fit its schema (it was recorded around the validation).
    pub const ANSWER_INVALID: &str = "answer_invalid";
    /// A release the run is pinned to is not in the store any more.
    pub const RELEASE_MISSING: &str = "release_missing";
    /// A release the run is pinned to is in the store with other bytes.
    pub const RELEASE_CHANGED: &str = "release_changed";
}

/// How a drive ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriveEnd {
    Completed,
    Failed {
        code: String,
        step: String,
    },
    /// Parked for an operator at an attention point.
    NeedsAttention {
        step: String,
        checkpoint: String,
    },
    /// The run was cancelled under the driver.
    Cancelled,
    /// Handed back to the store at an ask or a sleep ([`DriverOptions::park`]): no attempt
    /// holds the run; the answer, or the sleep's deadline, makes it due for a takeover.
    Parked {
        step: String,
    },
    /// Another attempt holds the run now; this driver stopped without writing.
    Fenced,
    /// Asked to stop (a drain): nothing was written; the run stays running for a successor.
    Stopped,
}

/// A driver's failure to reach a decision (the run stays running for a successor).
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("integrity: {0}")]
    Integrity(String),
    /// A pinned release cannot be had for now (the store or the disk failed).
    #[error("release: {0}")]
    Release(ReleaseError),
    /// No renewal of the run's lease was confirmed for `unconfirmed_ms`: the driver stopped
    /// its handler and itself before a successor could take the run over.
    #[error(
        "the run's lease was not confirmed for {unconfirmed_ms} ms; stopped before it could lapse"
    )]
    LeaseUnconfirmed { unconfirmed_ms: u64 },
}

impl DriveError {
    pub fn code(&self) -> &'static str {
        match self {
            DriveError::Store(e) => e.code().as_str(),
            DriveError::Integrity(_) => "integrity",
            DriveError::Release(e) => e.code(),
            DriveError::LeaseUnconfirmed { .. } => "lease_unconfirmed",
        }
    }
}

/// The bounds of a driver.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// The holder's lease; renewed every quarter of it while the driver lives.
    pub lease: Duration,
    /// How often a waiting driver re-reads its answers and status without a wake-up.
    pub poll: Duration,
    /// Whether a run waits without a driver: `Some(d)` hands it back to the store at an ask,
    /// and at a sleep with more than `d` left, and the drive ends [`DriveEnd::Parked`] (a
    /// Host's scan takes it again once due). `None`: the driver waits in place, for a caller
    /// that has no scan to wake the run.
    pub park: Option<Duration>,
}

impl DriverOptions {
    /// How often the lease is renewed: a quarter of it.
    pub fn renew_every(&self) -> Duration {
        self.lease / 4
    }

    /// How long the lease may go unconfirmed before the driver stops its handler: five sixths
    /// of it, so the stop (SIGTERM, a grace, SIGKILL) has the last sixth before the lease can
    /// lapse.
    pub fn confirm_within(&self) -> Duration {
        self.lease * 5 / 6
    }
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            lease: Duration::from_secs(15),
            poll: Duration::from_millis(500),
            park: None,
        }
    }
}

/// Drives runs against one store, one environment, one source of pinned releases, one
/// invoker.
#[derive(Clone)]
pub struct Driver {
    pub journal: Arc<dyn RunJournal>,
    /// The agents a program may name, and where a run recorded before pinning is resolved.
    pub env: Arc<dyn Environment>,
    pub releases: Arc<dyn Releases>,
    pub invoker: Arc<dyn Invoker>,
    pub agents: Option<Arc<dyn AgentTurns>>,
    pub events: Arc<dyn StepEvents>,
    pub options: DriverOptions,
}

/// The attention point of attempt `attempt` of `step`.
pub fn attention_point(step: &str, attempt: u64) -> String {
    format!("{step}.attempt-{attempt}")
}

/// What an operator may answer at an attention point.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    Retry,
    Skip(Value),
}

/// Reads an operator's answer at an attention point.
pub fn parse_resolution(value: &Value) -> Result<Resolution, String> {
    let bad = || {
        "an attention point takes {\"action\": \"retry\"} or {\"action\": \"skip\", \"output\": <value>}"
            .to_owned()
    };
    let m = value.as_object().ok_or_else(bad)?;
    match (m.get("action").and_then(Value::as_str), m.len()) {
        (Some("retry"), 1) => Ok(Resolution::Retry),
        (Some("skip"), 2) => Ok(Resolution::Skip(m.get("output").cloned().ok_or_else(bad)?)),
        _ => Err(bad()),
    }
}

/// The ids every execution of `step` of `run` carries.
pub fn step_ids(run: &RunId, step: &str, identity: &str, digest: &str) -> (String, String) {
    let intent = format!("run-{run}-{step}");
    let effect = runnable::effect_id(&intent, identity, digest);
    (intent, effect)
}

enum Flow {
    /// The step has its result; go on.
    Next(Value),
    /// The drive is over.
    End(DriveEnd),
}

struct Drive<'a> {
    d: &'a Driver,
    status: RunStatus,
    fence: RunFence,
    input: Value,
    outputs: HashMap<String, Value>,
    entries: Vec<StepEntry>,
    wake: Arc<Notify>,
    /// Cancelled when the lease renewal is refused (another attempt took the run).
    fenced: CancellationToken,
    /// Cancelled when the lease went unconfirmed for [`DriverOptions::confirm_within`].
    unconfirmed: CancellationToken,
    /// Cancelled: begin no new step (a sleep or a parked wait ends the drive too).
    stop: CancellationToken,
    /// Cancelled: stop the step in flight too (an invoke's handler is stopped, an agent turn
    /// left), writing nothing for it.
    halt: CancellationToken,
}

fn is_fenced(e: &StoreError) -> bool {
    e.code() == ErrorCode::ClaimLost
}

impl Driver {
    /// Drives `status` (held by this caller: its fence is the one this driver writes under)
    /// until it completes, fails, parks for an operator, is cancelled, is fenced out or
    /// `stop` is cancelled. `wake` hurries a parked driver when an answer is recorded.
    pub async fn drive(
        &self,
        status: RunStatus,
        wake: Arc<Notify>,
        stop: CancellationToken,
    ) -> Result<DriveEnd, DriveError> {
        self.drive_until(status, wake, stop, CancellationToken::new())
            .await
    }

    /// As [`Driver::drive`], and when `halt` is cancelled the step in flight is stopped too:
    /// an invoke is cancelled (the invoker stops its handler's group) and waited for, an agent
    /// turn is left, and the drive ends [`DriveEnd::Stopped`] with nothing written for that
    /// step. `stop` alone lets a step in flight finish and record its result.
    pub async fn drive_until(
        &self,
        status: RunStatus,
        wake: Arc<Notify>,
        stop: CancellationToken,
        halt: CancellationToken,
    ) -> Result<DriveEnd, DriveError> {
        // The drive continues the trace the run was started in (recorded with the run), so
        // its steps share one trace on whichever Host drives them.
        let span = tracing::info_span!(
            "run.drive",
            tenant = %status.tenant,
            run = %status.run_id,
            epoch = status.epoch,
        );
        trace_context::span::continue_if(&span, status.trace.as_ref());
        self.drive_inner(status, wake, stop, halt)
            .instrument(span)
            .await
    }

    async fn drive_inner(
        &self,
        status: RunStatus,
        wake: Arc<Notify>,
        stop: CancellationToken,
        halt: CancellationToken,
    ) -> Result<DriveEnd, DriveError> {
        let fence = status.fence();
        let fenced = CancellationToken::new();
        let unconfirmed = CancellationToken::new();
        let renewal = tokio::spawn(
            Renewal {
                journal: self.journal.clone(),
                fence: fence.clone(),
                options: self.options.clone(),
                fenced: fenced.clone(),
                unconfirmed: unconfirmed.clone(),
            }
            .run(),
        );
        let _abort = AbortOnDrop(renewal);
        let input = serde_json::from_str(&status.input)
            .map_err(|e| DriveError::Integrity(format!("the run's input is not JSON: {e}")))?;
        let mut drive = Drive {
            d: self,
            fence,
            input,
            outputs: HashMap::new(),
            entries: Vec::new(),
            wake,
            fenced,
            unconfirmed,
            stop,
            halt,
            status,
        };
        match drive.run().await {
            Ok(end) => {
                if end == DriveEnd::Fenced {
                    tracing::warn!("a write under this driver's fence was refused; it stops");
                }
                Ok(end)
            }
            Err(DriveError::Store(e)) if is_fenced(&e) => drive.explain_fence().await,
            Err(e) => Err(e),
        }
    }
}

/// Keeps a driver's lease: renews it every [`DriverOptions::renew_every`]; cancels `fenced`
/// when a renewal is refused for the fence, and `unconfirmed` when no renewal was confirmed
/// for [`DriverOptions::confirm_within`] (a renewal that hangs counts as unconfirmed).
struct Renewal {
    journal: Arc<dyn RunJournal>,
    fence: RunFence,
    options: DriverOptions,
    fenced: CancellationToken,
    unconfirmed: CancellationToken,
}

impl Renewal {
    async fn run(self) {
        // The lease was granted (taken or created) just before the drive began.
        let mut confirmed = tokio::time::Instant::now();
        loop {
            let lapse = confirmed + self.options.confirm_within();
            let renewing = async {
                tokio::time::sleep(self.options.renew_every()).await;
                // A confirmation holds from when it was asked for: the store's new expiry is
                // at least this instant plus the lease.
                let asked = tokio::time::Instant::now();
                (
                    asked,
                    self.journal.renew(&self.fence, self.options.lease).await,
                )
            };
            tokio::select! {
                _ = tokio::time::sleep_until(lapse) => {
                    tracing::warn!(
                        unconfirmed_ms = confirmed.elapsed().as_millis() as u64,
                        "the run's lease could not be confirmed; stopping before it can lapse"
                    );
                    self.unconfirmed.cancel();
                    return;
                }
                (asked, renewed) = renewing => match renewed {
                    Ok(_) => confirmed = asked,
                    Err(e) if is_fenced(&e) => {
                        tracing::warn!(error = %e, "run lease renewal refused: fenced out");
                        self.fenced.cancel();
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "run lease renewal failed"),
                },
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Drive<'_> {
    fn event(&self, step: &Step, phase: &str, outcome: Option<&str>, started: Option<Instant>) {
        self.d.events.event(StepEvent {
            run_id: self.status.run_id.to_string(),
            epoch: self.status.epoch,
            step: step.name.clone(),
            kind: step.kind.as_str().to_owned(),
            phase: phase.to_owned(),
            outcome: outcome.map(str::to_owned),
            duration_ms: started.map(|s| s.elapsed().as_millis() as u64),
        });
    }

    /// `Err` once the lease went unconfirmed: nothing more may start under it.
    fn confirmed(&self) -> Result<(), DriveError> {
        if self.unconfirmed.is_cancelled() {
            return Err(DriveError::LeaseUnconfirmed {
                unconfirmed_ms: self.d.options.confirm_within().as_millis() as u64,
            });
        }
        Ok(())
    }

    /// A refused write: cancelled runs say so, anything else is a takeover.
    async fn explain_fence(&self) -> Result<DriveEnd, DriveError> {
        let now = self.d.journal.status(&self.status.run_id).await?;
        tracing::warn!(
            run = %self.status.run_id,
            epoch = self.status.epoch,
            "fenced: a write under this driver's fencing token was refused; the driver stops"
        );
        Ok(match now {
            Some(s) if s.state == RunState::Cancelled => DriveEnd::Cancelled,
            _ => DriveEnd::Fenced,
        })
    }

    async fn fail(&self, step: &str, code: &str, message: String) -> Result<DriveEnd, DriveError> {
        tracing::info!(step, code, %message, "run failed");
        self.d
            .journal
            .end(
                &self.fence,
                RunEnd::Failed(RunFailure {
                    code: code.to_owned(),
                    step: step.to_owned(),
                    message,
                }),
            )
            .await?;
        Ok(DriveEnd::Failed {
            code: code.to_owned(),
            step: step.to_owned(),
        })
    }

    async fn run(&mut self) -> Result<DriveEnd, DriveError> {
        let run_id = self.status.run_id.clone();
        let Some(recorded) = self.d.journal.program(&run_id).await? else {
            return Err(DriveError::Integrity(format!(
                "run {run_id} has no recorded program"
            )));
        };
        let program: Program = match self.pinned_program(&recorded.source).await? {
            Ok(p) => p,
            Err(end) => return Ok(end),
        };
        self.entries = self.d.journal.journal(&run_id).await?;
        for step in &program.steps {
            if self.stop.is_cancelled() {
                return Ok(DriveEnd::Stopped);
            }
            if self.fenced.is_cancelled() {
                return Ok(DriveEnd::Fenced);
            }
            self.confirmed()?;
            let recorded = self
                .entries
                .iter()
                .find(|e| e.step == step.name && e.kind == StepEntryKind::Result)
                .map(|e| e.body.clone());
            if let Some(body) = recorded {
                let output = result_output(&body)?;
                self.outputs.insert(step.name.clone(), output);
                self.event(step, "replayed", None, None);
                continue;
            }
            let started = Instant::now();
            self.event(step, "started", None, None);
            let span = step_span(&self.status, step);
            let flow = self.step(step).instrument(span.clone()).await;
            let flow = match flow {
                Ok(flow) => flow,
                Err(e) => {
                    span_failed(&span, e.code());
                    return Err(e);
                }
            };
            match flow {
                Flow::Next(output) => {
                    span.record("outcome", "finished");
                    self.event(step, "finished", None, Some(started));
                    self.outputs.insert(step.name.clone(), output);
                }
                Flow::End(end) => {
                    let phase = match &end {
                        DriveEnd::Failed { code, .. } => {
                            span_failed(&span, code);
                            "failed"
                        }
                        DriveEnd::NeedsAttention { .. } => "attention",
                        DriveEnd::Parked { .. } => "parked",
                        DriveEnd::Fenced => "fenced",
                        DriveEnd::Stopped => "stopped",
                        DriveEnd::Cancelled => "cancelled",
                        DriveEnd::Completed => "completed",
                    };
                    span.record("outcome", phase);
                    let phase = match phase {
                        "failed" | "attention" => phase,
                        _ => "parked",
                    };
                    self.event(step, phase, None, Some(started));
                    return Ok(end);
                }
            }
        }
        self.d.journal.end(&self.fence, RunEnd::Completed).await?;
        Ok(DriveEnd::Completed)
    }

    /// Runs one step to its flow (inside the step's span).
    async fn step(&mut self, step: &Step) -> Result<Flow, DriveError> {
        match &step.kind {
            StepKind::Invoke { .. } => self.invoke(step).await,
            StepKind::Ask { question, schema } => self.ask(step, question, &schema.to_json()).await,
            StepKind::Sleep { duration } => self.sleep(step, *duration).await,
            StepKind::Agent { agent, prompt } => self.agent(step, agent, prompt).await,
        }
    }

    /// Fails the run for a program that does not validate: at the first problem's step.
    async fn invalid(
        &self,
        problems: &[program::Problem],
        against: &str,
    ) -> Result<DriveEnd, DriveError> {
        let first = problems.first().map(|p| p.to_string()).unwrap_or_default();
        let step = problems
            .first()
            .and_then(|p| p.step.clone())
            .unwrap_or_else(|| "program".into());
        self.fail(
            &step,
            failure_codes::PROGRAM_INVALID,
            format!("the recorded program does not validate {against}: {first}"),
        )
        .await
    }

    /// The recorded program read against the releases the run is pinned to; a run recorded
    /// before pinning is pinned first. `Err(end)` when the run ended here.
    async fn pinned_program(
        &mut self,
        source: &str,
    ) -> Result<Result<Program, DriveEnd>, DriveError> {
        let run_id = self.status.run_id.clone();
        let mut pins = self.d.journal.pins(&run_id).await?;
        if pins.is_empty() {
            // Recorded before pinning (or invokes nothing): resolved here, once, and pinned.
            let program = match program::parse(source, self.d.env.as_ref()) {
                Ok(p) => p,
                Err(problems) => return self.invalid(&problems, "here").await.map(Err),
            };
            let resolved = pinning::invoked(&program);
            if resolved.is_empty() {
                return Ok(Ok(program));
            }
            let offered = match self.d.releases.pin(&resolved).await {
                Ok(p) => p,
                Err(e) if e.is_transient() => return Err(DriveError::Release(e)),
                Err(e) => {
                    let step = program
                        .steps
                        .iter()
                        .find(|s| matches!(s.kind, StepKind::Invoke { .. }))
                        .map(|s| s.name.clone())
                        .unwrap_or_else(|| "program".into());
                    return self
                        .fail(
                            &step,
                            failure_codes::PROGRAM_INVALID,
                            format!("the run was recorded before pinning and its releases cannot be pinned here: [{}] {e}", e.code()),
                        )
                        .await
                        .map(Err);
                }
            };
            pins = self.d.journal.pin(&self.fence, offered).await?;
            tracing::info!(pins = pins.len(), "pinned a run recorded before pinning");
        }
        let mut pinned = Vec::with_capacity(pins.len());
        for pin in &pins {
            match self.d.releases.pinned(pin).await {
                Ok(info) => pinned.push(info),
                Err(e) if e.is_transient() => return Err(DriveError::Release(e)),
                Err(e) => {
                    let code = match e {
                        ReleaseError::Missing(_) => failure_codes::RELEASE_MISSING,
                        _ => failure_codes::RELEASE_CHANGED,
                    };
                    // The first step that invokes it is the step that cannot run.
                    let step = program::invoke_references(source)
                        .into_iter()
                        .find(|(_, r)| pinning::resolve_pinned(&pins, r).is_some_and(|p| p == pin))
                        .map(|(s, _)| s)
                        .unwrap_or_else(|| "program".into());
                    return self
                        .fail(
                            &step,
                            code,
                            format!(
                                "the run is pinned to {} at {}, which cannot be run: {e}",
                                pin.identity, pin.digest
                            ),
                        )
                        .await
                        .map(Err);
                }
            }
        }
        let env = PinnedEnvironment::new(pinned, self.d.env.as_ref());
        match program::parse(source, &env) {
            Ok(p) => Ok(Ok(p)),
            Err(problems) => self
                .invalid(&problems, "against its pinned releases here")
                .await
                .map(Err),
        }
    }

    async fn record(
        &mut self,
        step: &Step,
        kind: StepEntryKind,
        attempt: u64,
        outcome: Option<&str>,
        body: Value,
        consumes: Option<String>,
    ) -> Result<(), DriveError> {
        let entry = self
            .d
            .journal
            .append(
                &self.fence,
                NewStepEntry {
                    step: step.name.clone(),
                    kind,
                    attempt,
                    outcome: outcome.map(str::to_owned),
                    body: body.to_string(),
                    started_at_ms: None,
                    consumes,
                },
            )
            .await?;
        self.entries.push(entry);
        Ok(())
    }

    async fn result(
        &mut self,
        step: &Step,
        outcome: &str,
        output: Value,
        consumes: Option<String>,
    ) -> Result<Flow, DriveError> {
        self.record(
            step,
            StepEntryKind::Result,
            0,
            Some(outcome),
            json!({ "output": output }),
            consumes,
        )
        .await?;
        Ok(Flow::Next(output))
    }

    /// Counts the failed attempts of `step` against its budget; true when one more run is
    /// allowed.
    async fn may_rerun(&self, step: &Step) -> Result<bool, DriveError> {
        let Some(Supervise { restarts, window }) = step.supervise else {
            return Ok(false);
        };
        let since = match window {
            Some(w) => Some(
                self.d
                    .journal
                    .now_ms()
                    .await?
                    .saturating_sub(w.as_millis() as i64),
            ),
            None => None,
        };
        let failures = self
            .entries
            .iter()
            .filter(|e| e.step == step.name && e.kind == StepEntryKind::Failure)
            .filter(|e| since.is_none_or(|s| e.recorded_at_ms >= s))
            .count() as u64;
        Ok(failures <= u64::from(restarts))
    }

    fn attempts(&self, step: &Step, kind: StepEntryKind) -> HashSet<u64> {
        self.entries
            .iter()
            .filter(|e| e.step == step.name && e.kind == kind)
            .map(|e| e.attempt)
            .collect()
    }

    async fn invoke(&mut self, step: &Step) -> Result<Flow, DriveError> {
        let StepKind::Invoke {
            reference,
            runnable,
            input,
        } = &step.kind
        else {
            return Err(DriveError::Integrity("not an invoke step".into()));
        };
        let rendered = match program::render(input, &self.input, &self.outputs) {
            Ok(v) => v,
            Err(e) => {
                return self
                    .fail(&step.name, failure_codes::TEMPLATE, e.to_string())
                    .await
                    .map(Flow::End);
            }
        };
        let violations = runnable.input.validate(&rendered);
        if !violations.is_empty() {
            let list: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
            return self
                .fail(
                    &step.name,
                    failure_codes::INPUT_INVALID,
                    format!(
                        "the rendered input breaks the input schema: {}",
                        list.join("; ")
                    ),
                )
                .await
                .map(Flow::End);
        }
        let (intent_id, effect_id) = step_ids(
            &self.status.run_id,
            &step.name,
            &runnable.identity,
            &runnable.digest,
        );
        let replay_safe = runnable.effect.replay_safe();
        loop {
            let began = self.attempts(step, StepEntryKind::Began);
            let failed = self.attempts(step, StepEntryKind::Failure);
            let mut consumes = None;
            if !replay_safe
                && let Some(last) = began.iter().max().copied()
                && !failed.contains(&last)
            {
                // Attempt `last` began and never ended certain: only an operator decides.
                let point = attention_point(&step.name, last);
                let answers = self.d.journal.answers(&self.status.run_id).await?;
                let answer = answers.into_iter().find(|a| a.checkpoint == point);
                match answer {
                    None => return self.attention(step, &point).await.map(Flow::End),
                    Some(a) => {
                        let value: Value = serde_json::from_str(&a.value).map_err(|e| {
                            DriveError::Integrity(format!("answer to {point} is not JSON: {e}"))
                        })?;
                        match parse_resolution(&value) {
                            Ok(Resolution::Skip(output)) => {
                                return self.result(step, "skipped", output, Some(point)).await;
                            }
                            Ok(Resolution::Retry) => consumes = Some(point),
                            Err(why) => {
                                return self
                                    .fail(&step.name, failure_codes::ANSWER_INVALID, why)
                                    .await
                                    .map(Flow::End);
                            }
                        }
                    }
                }
            }
            let attempt = began
                .iter()
                .chain(failed.iter())
                .max()
                .copied()
                .unwrap_or(0)
                + 1;
            tracing::Span::current().record("attempt", attempt);
            if !replay_safe {
                self.record(
                    step,
                    StepEntryKind::Began,
                    attempt,
                    None,
                    json!({ "intent_id": intent_id, "effect_id": effect_id }),
                    consumes,
                )
                .await?;
            }
            let cancel = CancellationToken::new();
            let call = InvokeCall {
                reference: reference.clone(),
                identity: runnable.identity.clone(),
                digest: runnable.digest.clone(),
                input: rendered.clone(),
                intent_id: intent_id.clone(),
                effect_id: effect_id.clone(),
                cancel: cancel.clone(),
            };
            // Whatever stops the invocation, it is awaited to its end: the handler's group is
            // gone before the driver returns, and nothing is recorded for it.
            let invoking = self.d.invoker.invoke(call);
            tokio::pin!(invoking);
            let stopped = tokio::select! {
                done = &mut invoking => Ok(done),
                _ = self.fenced.cancelled() => Err(None),
                _ = self.unconfirmed.cancelled() => Err(Some("the lease went unconfirmed")),
                _ = self.halt.cancelled() => Err(Some("the drain ran out of time")),
            };
            let done = match stopped {
                Ok(done) => done,
                Err(why) => {
                    cancel.cancel();
                    let _ = invoking.await;
                    tracing::warn!(step = %step.name, attempt, why = why.unwrap_or("fenced out"),
                        "halted mid-invoke: stopped the handler; nothing recorded, the step stays open");
                    if self.fenced.is_cancelled() {
                        return Ok(Flow::End(DriveEnd::Fenced));
                    }
                    self.confirmed()?;
                    return Ok(Flow::End(DriveEnd::Stopped));
                }
            };
            let done = match done {
                Ok(d) => d,
                Err(why) => {
                    return self
                        .fail(&step.name, failure_codes::INVOKE_REFUSED, why)
                        .await
                        .map(Flow::End);
                }
            };
            match done.outcome {
                OutcomeClass::Succeeded => {
                    return self
                        .result(step, "succeeded", done.output.unwrap_or(Value::Null), None)
                        .await;
                }
                class if !class.is_certain() && !replay_safe => {
                    let point = attention_point(&step.name, attempt);
                    tracing::warn!(step = %step.name, outcome = %class, "effectful step ended uncertain; parked for an operator");
                    return self.attention(step, &point).await.map(Flow::End);
                }
                class => {
                    self.record(
                        step,
                        StepEntryKind::Failure,
                        attempt,
                        Some(class.as_str()),
                        json!({ "detail": done.detail }),
                        None,
                    )
                    .await?;
                    if self.may_rerun(step).await? {
                        continue;
                    }
                    let code = if class == OutcomeClass::Failed {
                        failure_codes::STEP_FAILED
                    } else {
                        failure_codes::STEP_UNCERTAIN
                    };
                    return self
                        .fail(&step.name, code, format!("{class}: {}", done.detail))
                        .await
                        .map(Flow::End);
                }
            }
        }
    }

    async fn attention(&mut self, step: &Step, point: &str) -> Result<DriveEnd, DriveError> {
        self.d
            .journal
            .arm(
                &self.fence,
                NewCheckpoint {
                    name: point.to_owned(),
                    kind: CheckpointKind::Attention,
                    question: Some(format!(
                        "step `{}`: whether the effect happened is unknown; answer retry or skip",
                        step.name
                    )),
                    schema: None,
                    sleep: None,
                },
            )
            .await?;
        self.d
            .journal
            .end(
                &self.fence,
                RunEnd::NeedsAttention {
                    step: step.name.clone(),
                },
            )
            .await?;
        Ok(DriveEnd::NeedsAttention {
            step: step.name.clone(),
            checkpoint: point.to_owned(),
        })
    }

    /// Waits for a wake-up, the poll interval, a fence or a stop; `Some` ends the drive.
    async fn pause(&self, at_most: Duration) -> Result<Option<DriveEnd>, DriveError> {
        tokio::select! {
            _ = self.wake.notified() => {}
            _ = tokio::time::sleep(at_most) => {}
            _ = self.fenced.cancelled() => return Ok(Some(DriveEnd::Fenced)),
            _ = self.stop.cancelled() => return Ok(Some(DriveEnd::Stopped)),
        }
        let now = self.d.journal.status(&self.status.run_id).await?;
        Ok(match now {
            Some(s) if s.state == RunState::Cancelled => Some(DriveEnd::Cancelled),
            Some(s) if s.fencing_token == self.fence.token && s.state == RunState::Running => None,
            _ => Some(DriveEnd::Fenced),
        })
    }

    async fn ask(
        &mut self,
        step: &Step,
        question: &str,
        schema: &Value,
    ) -> Result<Flow, DriveError> {
        let question = match program::render(
            &Value::String(question.to_owned()),
            &self.input,
            &self.outputs,
        ) {
            Ok(Value::String(q)) => q,
            Ok(other) => other.to_string(),
            Err(e) => {
                return self
                    .fail(&step.name, failure_codes::TEMPLATE, e.to_string())
                    .await
                    .map(Flow::End);
            }
        };
        self.d
            .journal
            .arm(
                &self.fence,
                NewCheckpoint {
                    name: step.name.clone(),
                    kind: CheckpointKind::Ask,
                    question: Some(question),
                    schema: Some(schema.to_string()),
                    sleep: None,
                },
            )
            .await?;
        let mut parked = false;
        loop {
            let answers = self.d.journal.answers(&self.status.run_id).await?;
            if let Some(a) = answers.into_iter().find(|a| a.checkpoint == step.name) {
                if parked {
                    self.event(step, "answered", None, None);
                }
                let value: Value = serde_json::from_str(&a.value).map_err(|e| {
                    DriveError::Integrity(format!("answer to {} is not JSON: {e}", step.name))
                })?;
                if let StepKind::Ask { schema, .. } = &step.kind
                    && !schema.validate(&value).is_empty()
                {
                    return self
                        .fail(
                            &step.name,
                            failure_codes::ANSWER_INVALID,
                            "the recorded answer does not fit the schema".into(),
                        )
                        .await
                        .map(Flow::End);
                }
                return self
                    .result(step, "answered", value, Some(step.name.clone()))
                    .await;
            }
            if self.d.options.park.is_some() {
                let until = ParkUntil::Answered(step.name.clone());
                if self.d.journal.park(&self.fence, until).await? {
                    tracing::debug!(step = %step.name, "parked at an ask; no driver waits");
                    return Ok(Flow::End(DriveEnd::Parked {
                        step: step.name.clone(),
                    }));
                }
                // Answered between the read and the park: read it again.
                continue;
            }
            if !parked {
                parked = true;
                self.event(step, "parked", None, None);
            }
            if let Some(end) = self.pause(self.d.options.poll).await? {
                return Ok(Flow::End(end));
            }
        }
    }

    async fn sleep(&mut self, step: &Step, duration: Duration) -> Result<Flow, DriveError> {
        if !duration.is_zero() {
            let armed = self
                .d
                .journal
                .arm(
                    &self.fence,
                    NewCheckpoint {
                        name: step.name.clone(),
                        kind: CheckpointKind::Sleep,
                        question: None,
                        schema: None,
                        sleep: Some(duration),
                    },
                )
                .await?;
            let deadline = armed.deadline_at_ms.ok_or_else(|| {
                DriveError::Integrity(format!("sleep {} has no deadline", step.name))
            })?;
            let now = self.d.journal.now_ms().await?;
            let mut left = Duration::from_millis(deadline.saturating_sub(now).max(0) as u64);
            if let Some(after) = self.d.options.park
                && left > after
            {
                self.d
                    .journal
                    .park(&self.fence, ParkUntil::Due(deadline))
                    .await?;
                tracing::debug!(step = %step.name, ?left, "parked at a sleep; no driver waits");
                return Ok(Flow::End(DriveEnd::Parked {
                    step: step.name.clone(),
                }));
            }
            while !left.is_zero() {
                let slice = left.min(self.d.options.poll);
                let begun = Instant::now();
                tokio::select! {
                    _ = tokio::time::sleep(slice) => {}
                    _ = self.fenced.cancelled() => return Ok(Flow::End(DriveEnd::Fenced)),
                    _ = self.stop.cancelled() => return Ok(Flow::End(DriveEnd::Stopped)),
                }
                left = left.saturating_sub(begun.elapsed());
            }
        }
        self.result(step, "slept", Value::Null, None).await
    }

    async fn agent(&mut self, step: &Step, agent: &str, prompt: &str) -> Result<Flow, DriveError> {
        let Some(agents) = self.d.agents.clone() else {
            return self
                .fail(
                    &step.name,
                    failure_codes::AGENT_UNAVAILABLE,
                    "this driver runs no agent turns".into(),
                )
                .await
                .map(Flow::End);
        };
        let prompt = match program::render(
            &Value::String(prompt.to_owned()),
            &self.input,
            &self.outputs,
        ) {
            Ok(Value::String(p)) => p,
            Ok(other) => other.to_string(),
            Err(e) => {
                return self
                    .fail(&step.name, failure_codes::TEMPLATE, e.to_string())
                    .await
                    .map(Flow::End);
            }
        };
        loop {
            let failed = self.attempts(step, StepEntryKind::Failure);
            let attempt = failed.iter().max().copied().unwrap_or(0) + 1;
            let turn = AgentTurn {
                tenant: self.status.tenant.to_string(),
                run_id: self.status.run_id.to_string(),
                step: step.name.clone(),
                agent: agent.to_owned(),
                prompt: prompt.clone(),
                attempt,
                idempotency_key: format!("run-{}-{}-{attempt}", self.status.run_id, step.name),
            };
            let outcome = tokio::select! {
                r = agents.turn(turn) => r,
                _ = self.fenced.cancelled() => return Ok(Flow::End(DriveEnd::Fenced)),
                _ = self.halt.cancelled() => return Ok(Flow::End(DriveEnd::Stopped)),
            };
            match outcome {
                Ok(reply) => {
                    return self
                        .result(step, "replied", Value::String(reply), None)
                        .await;
                }
                Err(why) => {
                    self.record(
                        step,
                        StepEntryKind::Failure,
                        attempt,
                        Some("failed"),
                        json!({ "detail": why }),
                        None,
                    )
                    .await?;
                    if self.may_rerun(step).await? {
                        continue;
                    }
                    return self
                        .fail(&step.name, failure_codes::AGENT_FAILED, why)
                        .await
                        .map(Flow::End);
                }
            }
        }
    }
}

/// The span of one step's execution on this drive: a child of the drive (and so of the
/// run's trace). `attempt` is the invoke attempt it made last; `outcome` how the step left.
fn step_span(status: &RunStatus, step: &Step) -> tracing::Span {
    tracing::info_span!(
        "run.step",
        tenant = %status.tenant,
        run = %status.run_id,
        step = %step.name,
        kind = step.kind.as_str(),
        epoch = status.epoch,
        attempt = tracing::field::Empty,
        outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    )
}

/// Marks a step's span failed with a stable code (its OpenTelemetry status).
fn span_failed(span: &tracing::Span, code: &str) {
    span.record("outcome", "failed");
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", code);
}

fn result_output(body: &str) -> Result<Value, DriveError> {
    let v: Value = serde_json::from_str(body)
        .map_err(|e| DriveError::Integrity(format!("a journaled result is not JSON: {e}")))?;
    Ok(v.get("output").cloned().unwrap_or(Value::Null))
}
