//! A turn: the model streams a step (text deltas go out as live previews; the committed step is
//! journaled), the tools it asks for run (a permission gate first for a tool that needs
//! approval; `ask_user` is a gate whose answer is the result), and the loop repeats until the
//! model stops. Every turn ends with exactly one terminal event: done, failed or interrupted.
//! No call is left without a result: an interrupted turn journals one for each call of its
//! step that has none (with its `turn_interrupted`, in one append), and a call whose arguments
//! the model wrote badly is answered with the problem, running nothing.
//! A turn never writes the journal itself: it asks the session actor, which refuses once the
//! session is abandoned or faulted, so a stopped turn writes nothing more.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use department::{Preview, PreviewKind};
use futures::StreamExt;
use sessionstore::{Millis, RuntimeCommandId};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::agent::AgentConfig;
use crate::events::{Cause, GateKind, HarnessEvent, TurnError, summarize_arguments};
use crate::inbox::{Msg, Shared, StopReason, TurnMsg};
use crate::model::{FinishReason, ModelEvent, ModelRequest, ToolCall};
use crate::state::{OpenGate, OpenTurn, Resolution};
use crate::tool::ASK_USER;

/// What a turn starts with.
pub(crate) enum TurnPlan {
    /// A new turn answering a queued input.
    Fresh {
        input_event: String,
        cause: Option<Cause>,
    },
    /// A turn the journal holds in flight, resumed after a restore.
    Resume { steps: u32, point: ResumePoint },
}

/// Where a restored turn picks up.
#[derive(Debug)]
pub(crate) enum ResumePoint {
    /// Ask the model for the next step.
    Model,
    /// The last step asked for nothing more: write `turn_done`.
    Finish,
    /// The last step's calls from `start` on still need results; the first is in `entry`.
    Calls {
        calls: Vec<ToolCall>,
        start: usize,
        entry: CallEntry,
    },
    /// A call's outcome cannot be known and it is not safe to run again: end the turn
    /// interrupted rather than guess. `calls` are the step's calls without a result, the one
    /// in doubt first; each is answered saying so.
    Interrupt { calls: Vec<ToolCall> },
}

/// How a call is entered.
#[derive(Debug, Clone)]
pub(crate) enum CallEntry {
    /// From the start (open a gate if the tool needs one, then run).
    Fresh,
    /// Parked at a gate restored open: wait for its answer (at most `remaining_ms`).
    AwaitGate { gate: Uuid, remaining_ms: u64 },
    /// The gate was resolved before the restore; act on the resolution.
    Resolved(Resolution),
}

/// What a turn task holds.
pub(crate) struct TurnCtx {
    pub turn_id: String,
    pub agent: Arc<AgentConfig>,
    pub tx: mpsc::Sender<Box<Msg>>,
    pub shared: Arc<Shared>,
    pub cancel: CancellationToken,
    pub reason: Arc<std::sync::Mutex<Option<StopReason>>>,
}

/// Where the first call still waiting for a result stands (the later ones have not started).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CallPhase {
    /// Not started.
    Waiting,
    /// Parked at its gate: a permission gate, or the question of `ask_user`.
    AtGate { ask: bool },
    /// The tool is running.
    Running,
    /// Found running by a restore: whether it took effect is not known.
    InDoubt,
}

enum Stop {
    /// Cancelled from outside (interrupt or abandonment).
    Cancelled,
    /// The actor refused a write (fault, abandonment): write nothing more.
    Refused,
}

struct Run<'a> {
    ctx: &'a TurnCtx,
    /// A gate of this turn that is open right now.
    open_gate: Option<Uuid>,
    /// Events held back to ride on the turn's next append (a fresh turn's `turn_started`
    /// goes out with its first committed step, so a simple reply is one journal write).
    prefix: Vec<HarnessEvent>,
    /// The current step's calls without a journaled result, in order: an interrupted turn
    /// answers each of them, so no call is left unanswered in the conversation.
    waiting: Vec<ToolCall>,
    /// Where `waiting[0]` stands.
    phase: CallPhase,
    /// The model step whose calls are running (tools see it in their `CallContext`).
    step: u32,
}

/// Decides where a turn the journal holds in flight resumes.
pub(crate) fn resume_point(
    open: &OpenTurn,
    gates: &BTreeMap<Uuid, OpenGate>,
    agent: &AgentConfig,
    now: Millis,
) -> ResumePoint {
    if open.last_calls.is_empty() {
        return if open.steps == 0 {
            ResumePoint::Model
        } else {
            ResumePoint::Finish
        };
    }
    let Some(start) = open
        .last_calls
        .iter()
        .position(|c| !open.results.contains(&c.id))
    else {
        return ResumePoint::Model;
    };
    let call = &open.last_calls[start];
    let entry = match open.gates.get(&call.id) {
        Some(gate) => match open.resolutions.get(gate) {
            None => {
                let remaining_ms = gates.get(gate).map_or(0, |g| {
                    let elapsed = u64::try_from(now.saturating_sub(g.opened_at_ms)).unwrap_or(0);
                    g.timeout_ms.saturating_sub(elapsed)
                });
                CallEntry::AwaitGate {
                    gate: *gate,
                    remaining_ms,
                }
            }
            Some(res) => {
                // The answer is durable; whether the tool ran after it is not known. An
                // answer to ask_user is itself the result; a denial runs nothing; an approval
                // re-runs only a replay-safe tool.
                let approved_effect = call.name != ASK_USER
                    && res.action == "approve"
                    && !agent.tools.get(&call.name).is_some_and(|t| t.replay_safe());
                if approved_effect {
                    return ResumePoint::Interrupt {
                        calls: open.last_calls[start..].to_vec(),
                    };
                }
                CallEntry::Resolved(res.clone())
            }
        },
        None => {
            let gated = call.name == ASK_USER
                || agent
                    .tools
                    .get(&call.name)
                    .is_some_and(|t| t.needs_approval());
            let safe = agent.tools.get(&call.name).is_none_or(|t| t.replay_safe())
                || call.arguments_error.is_some();
            if gated || safe {
                // A gated call whose gate never opened never ran; a replay-safe one may run
                // again; one with unusable arguments never runs at all.
                CallEntry::Fresh
            } else {
                return ResumePoint::Interrupt {
                    calls: open.last_calls[start..].to_vec(),
                };
            }
        }
    };
    ResumePoint::Calls {
        calls: open.last_calls.clone(),
        start,
        entry,
    }
}

/// Runs a turn to its terminal event (or silently stops), then tells the actor.
pub(crate) async fn run(ctx: TurnCtx, plan: TurnPlan) {
    let mut run = Run {
        ctx: &ctx,
        open_gate: None,
        prefix: Vec::new(),
        waiting: Vec::new(),
        phase: CallPhase::Waiting,
        step: 0,
    };
    let result = run.drive(plan).await;
    if let Err(Stop::Cancelled) = result {
        let reason = ctx.reason.lock().ok().and_then(|r| r.clone());
        if let Some(StopReason::Interrupt(cause, rc)) = reason {
            run.write_interrupted(Some(cause), Some(rc), "interrupt")
                .await;
        }
    }
    let _ = ctx
        .tx
        .send(Msg::turn(TurnMsg::Finished {
            turn_id: ctx.turn_id.clone(),
        }))
        .await;
}

impl Run<'_> {
    async fn drive(&mut self, plan: TurnPlan) -> Result<(), Stop> {
        let mut step = match plan {
            TurnPlan::Fresh { input_event, cause } => {
                self.prefix.push(HarnessEvent::TurnStarted {
                    turn_id: self.ctx.turn_id.clone(),
                    input_event,
                    cause,
                });
                0
            }
            TurnPlan::Resume { steps, point } => match point {
                ResumePoint::Model => steps,
                ResumePoint::Finish => {
                    return self.finish().await;
                }
                ResumePoint::Interrupt { calls } => {
                    self.waiting = calls;
                    self.phase = CallPhase::InDoubt;
                    self.write_interrupted(None, None, "restore").await;
                    return Ok(());
                }
                ResumePoint::Calls {
                    calls,
                    start,
                    entry,
                } => {
                    self.waiting = calls[start..].to_vec();
                    self.phase = CallPhase::Waiting;
                    let mut entry = Some(entry);
                    self.step = steps;
                    for call in &calls[start..] {
                        let e = entry.take().unwrap_or(CallEntry::Fresh);
                        self.run_call(call, e).await?;
                    }
                    steps
                }
            },
        };
        loop {
            if step >= self.ctx.agent.max_steps {
                return self
                    .fail(
                        "step_limit",
                        format!(
                            "the turn took more than {} model steps",
                            self.ctx.agent.max_steps
                        ),
                    )
                    .await;
            }
            step += 1;
            let (text, calls) = match self.model_step().await? {
                Ok(v) => v,
                Err(e) => return self.fail(e.code(), e.to_string()).await,
            };
            let done = calls.is_empty();
            let mut events = vec![(
                HarnessEvent::AssistantMessage {
                    turn_id: self.ctx.turn_id.clone(),
                    step,
                    text,
                    tool_calls: calls.clone(),
                },
                None,
            )];
            if done {
                // The last step and the turn's end are one append.
                events.push((
                    HarnessEvent::TurnDone {
                        turn_id: self.ctx.turn_id.clone(),
                    },
                    None,
                ));
            }
            self.append(events).await?;
            if done {
                return Ok(());
            }
            self.waiting = calls.clone();
            self.phase = CallPhase::Waiting;
            self.step = step;
            for call in &calls {
                self.run_call(call, CallEntry::Fresh).await?;
            }
        }
    }

    async fn finish(&mut self) -> Result<(), Stop> {
        self.append(vec![(
            HarnessEvent::TurnDone {
                turn_id: self.ctx.turn_id.clone(),
            },
            None,
        )])
        .await
    }

    async fn fail(&mut self, code: &str, message: String) -> Result<(), Stop> {
        self.append(vec![(
            HarnessEvent::TurnFailed {
                turn_id: self.ctx.turn_id.clone(),
                error: TurnError {
                    code: code.to_owned(),
                    message,
                },
            },
            None,
        )])
        .await
    }

    /// Writes the gate cancellation (if one is open) and `turn_interrupted`, best effort: a
    /// refused write means the session stopped and nothing may be written.
    async fn write_interrupted(
        &mut self,
        cause: Option<Cause>,
        rc: Option<RuntimeCommandId>,
        reason: &str,
    ) {
        let mut events = Vec::new();
        if let Some(gate) = self.open_gate.take() {
            events.push((
                HarnessEvent::GateResolved {
                    gate_id: gate.to_string(),
                    action: "cancelled".into(),
                    text: None,
                    cause: cause.clone(),
                },
                rc,
            ));
        }
        let restarted = reason == "restore";
        for (i, call) in std::mem::take(&mut self.waiting).into_iter().enumerate() {
            let phase = if i == 0 {
                self.phase
            } else {
                CallPhase::Waiting
            };
            events.push((
                HarnessEvent::ToolResult {
                    turn_id: self.ctx.turn_id.clone(),
                    content: unfinished_call_text(phase, restarted),
                    call_id: call.id,
                    name: call.name,
                    is_error: true,
                },
                rc,
            ));
        }
        events.push((
            HarnessEvent::TurnInterrupted {
                turn_id: self.ctx.turn_id.clone(),
                reason: reason.to_owned(),
                cause,
            },
            rc,
        ));
        let _ = self.append_unchecked(events).await;
    }

    async fn append_unchecked(
        &mut self,
        mut events: Vec<(HarnessEvent, Option<RuntimeCommandId>)>,
    ) -> Result<(), Stop> {
        if !self.prefix.is_empty() {
            let mut all: Vec<_> = self.prefix.drain(..).map(|e| (e, None)).collect();
            all.append(&mut events);
            events = all;
        }
        let (reply, rx) = oneshot::channel();
        self.ctx
            .tx
            .send(Msg::turn(TurnMsg::Append {
                turn_id: self.ctx.turn_id.clone(),
                events,
                reply,
            }))
            .await
            .map_err(|_| Stop::Refused)?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            _ => Err(Stop::Refused),
        }
    }

    async fn append(
        &mut self,
        events: Vec<(HarnessEvent, Option<RuntimeCommandId>)>,
    ) -> Result<(), Stop> {
        if self.ctx.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        self.append_unchecked(events).await
    }

    async fn conversation(&self) -> Result<Vec<crate::model::ChatMessage>, Stop> {
        let (reply, rx) = oneshot::channel();
        self.ctx
            .tx
            .send(Msg::turn(TurnMsg::Conversation {
                pending_input: self.prefix.iter().find_map(|e| match e {
                    HarnessEvent::TurnStarted { input_event, .. } => Some(input_event.clone()),
                    _ => None,
                }),
                reply,
            }))
            .await
            .map_err(|_| Stop::Refused)?;
        rx.await.map_err(|_| Stop::Refused)
    }

    /// One model step in a `model.call` span of its own (its error status is the model
    /// error's code).
    async fn model_step(
        &self,
    ) -> Result<Result<(String, Vec<ToolCall>), crate::model::ModelError>, Stop> {
        let span = tracing::info_span!(
            "model.call",
            model = %self.ctx.agent.model.name(),
            step = self.step,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let result = tracing::Instrument::instrument(self.model_step_inner(), span.clone()).await;
        if let Ok(Err(e)) = &result {
            span.record("otel.status_code", "ERROR");
            span.record("otel.status_description", e.code());
        }
        result
    }

    /// One model step: streams deltas as previews, collects text and tool calls.
    async fn model_step_inner(
        &self,
    ) -> Result<Result<(String, Vec<ToolCall>), crate::model::ModelError>, Stop> {
        let request = ModelRequest {
            messages: self.conversation().await?,
            tools: self.ctx.agent.tools.specs(),
        };
        let cancel = &self.ctx.cancel;
        let started = tokio::select! {
            r = self.ctx.agent.model.stream(request) => r,
            _ = cancel.cancelled() => return Err(Stop::Cancelled),
        };
        let mut stream = match started {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = cancel.cancelled() => return Err(Stop::Cancelled),
            };
            match next {
                Some(Ok(ModelEvent::TextDelta(d))) => {
                    self.preview(d.clone(), PreviewKind::Text);
                    text.push_str(&d);
                }
                Some(Ok(ModelEvent::ReasoningDelta(d))) => {
                    self.preview(d, PreviewKind::Reasoning);
                }
                Some(Ok(ModelEvent::ToolCall(c))) => calls.push(c),
                Some(Ok(ModelEvent::Usage(u))) => {
                    // On the `model.call` span this step runs in.
                    let span = tracing::Span::current();
                    if let Some(n) = u.input_tokens {
                        span.record("gen_ai.usage.input_tokens", n);
                    }
                    if let Some(n) = u.output_tokens {
                        span.record("gen_ai.usage.output_tokens", n);
                    }
                }
                Some(Ok(ModelEvent::Finished(reason))) => {
                    if reason == FinishReason::Length && calls.is_empty() && text.is_empty() {
                        return Ok(Err(crate::model::ModelError::Protocol(
                            "the model stopped at its length limit without output".into(),
                        )));
                    }
                    return Ok(Ok((text, calls)));
                }
                Some(Err(e)) => return Ok(Err(e)),
                None => {
                    return Ok(Err(crate::model::ModelError::Protocol(
                        "the model stream ended without finishing".into(),
                    )));
                }
            }
        }
    }

    /// Offers a live preview to whoever relays them (dropped when nobody listens).
    fn preview(&self, delta: String, kind: PreviewKind) {
        self.ctx.shared.previews.send(Preview {
            turn: self.ctx.turn_id.clone(),
            delta,
            kind,
        });
    }

    async fn result(
        &mut self,
        call: &ToolCall,
        content: String,
        is_error: bool,
    ) -> Result<(), Stop> {
        // The step's preview goes out before its commit, which supersedes it moments later.
        let shown = if content.is_empty() {
            call.name.clone()
        } else {
            department::truncate_preview(&content, department::TOOL_PREVIEW_BYTES).to_owned()
        };
        self.preview(
            shown,
            PreviewKind::ToolFinished {
                call_id: call.id.clone(),
                name: call.name.clone(),
                is_error,
            },
        );
        self.append(vec![(
            HarnessEvent::ToolResult {
                turn_id: self.ctx.turn_id.clone(),
                call_id: call.id.clone(),
                name: call.name.clone(),
                content,
                is_error,
            },
            None,
        )])
        .await?;
        if let Some(at) = self.waiting.iter().position(|c| c.id == call.id) {
            self.waiting.remove(at);
        }
        self.phase = CallPhase::Waiting;
        Ok(())
    }

    async fn run_call(&mut self, call: &ToolCall, entry: CallEntry) -> Result<(), Stop> {
        let agent = self.ctx.agent.clone();
        let is_ask = call.name == ASK_USER;
        let tool = agent.tools.get(&call.name);
        if !is_ask && tool.is_none() {
            return self
                .result(call, format!("unknown tool {:?}", call.name), true)
                .await;
        }
        if let Some(problem) = &call.arguments_error {
            // Nothing runs and no gate opens; the model reads why in its next step.
            return self.result(call, problem.clone(), true).await;
        }
        let gated = is_ask || tool.as_ref().is_some_and(|t| t.needs_approval());
        let resolution = if gated {
            Some(match entry {
                CallEntry::Resolved(r) => r,
                CallEntry::AwaitGate { gate, remaining_ms } => {
                    self.await_restored_gate(gate, remaining_ms).await?
                }
                CallEntry::Fresh => self.open_and_await_gate(call, is_ask).await?,
            })
        } else {
            None
        };
        if is_ask {
            let res = resolution.unwrap_or(Resolution {
                action: "timeout".into(),
                text: None,
            });
            return match (res.action.as_str(), res.text) {
                ("answer", Some(text)) => self.result(call, text, false).await,
                ("timeout", _) => {
                    self.result(call, "The user did not answer in time.".into(), true)
                        .await
                }
                (other, _) => {
                    self.result(call, format!("The question was closed ({other})."), true)
                        .await
                }
            };
        }
        if let Some(res) = resolution
            && res.action != "approve"
        {
            let why = if res.action == "timeout" {
                "The request for approval timed out; the tool did not run."
            } else {
                "The user denied the tool call; it did not run."
            };
            return self.result(call, why.into(), true).await;
        }
        let Some(tool) = tool else {
            return Ok(());
        };
        self.phase = CallPhase::Running;
        // A tool's start shows its own audit summary, never its raw arguments.
        self.preview(
            tool.audit_summary(&call.arguments)
                .unwrap_or_else(|| call.name.clone()),
            PreviewKind::ToolStarted {
                call_id: call.id.clone(),
                name: call.name.clone(),
            },
        );
        let cancel = &self.ctx.cancel;
        let context = crate::tool::CallContext {
            turn_id: self.ctx.turn_id.clone(),
            step: self.step,
            call_id: call.id.clone(),
        };
        let span = tracing::info_span!(
            "tool.call",
            tool = %call.name,
            call_id = %call.id,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let outcome = tokio::select! {
            r = tracing::Instrument::instrument(
                tool.call_in(&context, call.arguments.clone()),
                span.clone(),
            ) => r,
            _ = cancel.cancelled() => return Err(Stop::Cancelled),
        };
        match &outcome {
            Ok(_) => span.record("outcome", "ok"),
            Err(_) => {
                span.record("otel.status_code", "ERROR");
                span.record("otel.status_description", "tool_error");
                span.record("outcome", "error")
            }
        };
        match outcome {
            Ok(content) => self.result(call, content, false).await,
            Err(e) => self.result(call, e.0, true).await,
        }
    }

    async fn open_and_await_gate(
        &mut self,
        call: &ToolCall,
        is_ask: bool,
    ) -> Result<Resolution, Stop> {
        let (kind, timeout, prompt) = if is_ask {
            let question = call
                .arguments
                .get("question")
                .and_then(|q| q.as_str())
                .unwrap_or("(the agent asked a question without text)")
                .to_owned();
            (GateKind::AskUser, self.ctx.agent.ask_user_timeout, question)
        } else {
            (
                GateKind::Permission,
                self.ctx.agent.permission_timeout,
                format!(
                    "Allow {} with {}?",
                    call.name,
                    summarize_arguments(&call.arguments)
                ),
            )
        };
        let gate = Uuid::now_v7();
        let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let event = HarnessEvent::GateOpened {
            turn_id: self.ctx.turn_id.clone(),
            gate_id: gate.to_string(),
            kind,
            call_id: call.id.clone(),
            prompt,
            actions: kind.actions().iter().map(|a| (*a).to_owned()).collect(),
            timeout_ms,
        };
        if self.ctx.cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        let (reply, rx) = oneshot::channel();
        self.ctx
            .tx
            .send(Msg::turn(TurnMsg::OpenGate {
                turn_id: self.ctx.turn_id.clone(),
                event,
                reply,
            }))
            .await
            .map_err(|_| Stop::Refused)?;
        let waiter = match rx.await {
            Ok(Ok(w)) => w,
            _ => return Err(Stop::Refused),
        };
        self.open_gate = Some(gate);
        self.phase = CallPhase::AtGate { ask: is_ask };
        let r = self.wait_gate(gate, waiter, timeout).await;
        if r.is_ok() {
            self.open_gate = None;
        }
        r
    }

    async fn await_restored_gate(
        &mut self,
        gate: Uuid,
        remaining_ms: u64,
    ) -> Result<Resolution, Stop> {
        let (reply, rx) = oneshot::channel();
        self.ctx
            .tx
            .send(Msg::turn(TurnMsg::AwaitGate { gate, reply }))
            .await
            .map_err(|_| Stop::Refused)?;
        let Some(waiter) = rx.await.map_err(|_| Stop::Refused)? else {
            // Resolved meanwhile by a timeout or an answer the fold already took: treat as
            // closed without an answer.
            return Ok(Resolution {
                action: "cancelled".into(),
                text: None,
            });
        };
        self.open_gate = Some(gate);
        self.phase = CallPhase::AtGate {
            ask: self.waiting.first().is_some_and(|c| c.name == ASK_USER),
        };
        let r = self
            .wait_gate(gate, waiter, Duration::from_millis(remaining_ms))
            .await;
        if r.is_ok() {
            self.open_gate = None;
        }
        r
    }

    /// Waits for an answer; at the timeout asks the actor to resolve the gate `timeout` (an
    /// answer that lands first wins) and takes whatever resolution comes.
    async fn wait_gate(
        &self,
        gate: Uuid,
        mut waiter: oneshot::Receiver<Resolution>,
        timeout: Duration,
    ) -> Result<Resolution, Stop> {
        let cancel = &self.ctx.cancel;
        tokio::select! {
            r = &mut waiter => return r.map_err(|_| Stop::Refused),
            _ = tokio::time::sleep(timeout) => {}
            _ = cancel.cancelled() => return Err(Stop::Cancelled),
        }
        self.ctx
            .tx
            .send(Msg::turn(TurnMsg::GateTimeout { gate }))
            .await
            .map_err(|_| Stop::Refused)?;
        tokio::select! {
            r = waiter => r.map_err(|_| Stop::Refused),
            _ = cancel.cancelled() => Err(Stop::Cancelled),
        }
    }
}

/// The result journaled for a call an interrupted turn leaves without one.
fn unfinished_call_text(phase: CallPhase, restarted: bool) -> String {
    let stopped = if restarted {
        "the session restarted"
    } else {
        "the user interrupted the turn"
    };
    match phase {
        CallPhase::Waiting => format!("Not run: {stopped} before this call started."),
        CallPhase::AtGate { ask: false } => {
            format!("Not run: {stopped} while this call waited for approval.")
        }
        CallPhase::AtGate { ask: true } => {
            format!("Not answered: {stopped} while the question waited for the user.")
        }
        CallPhase::Running => format!(
            "Stopped: {stopped} while this call was running; it may have partly taken effect."
        ),
        CallPhase::InDoubt => format!(
            "Outcome unknown: {stopped} while this call was running, and it was not run again; \
             it may or may not have taken effect."
        ),
    }
}
