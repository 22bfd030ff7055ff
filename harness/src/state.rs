//! A session's in-memory state, and the fold that rebuilds it from the journal. Owned by the
//! session actor alone; the fold is the only way state is derived from durable records, on
//! restore and after every append, so a restored session and a live one agree. What it holds
//! is bounded by configuration, not by the session's age: the conversation is a window of the
//! newest turns ([`Window`]), dispositions are the recent ones (older ones are read from the
//! journal), and effects are not held at all (the journal indexes them by cause).
//! A snapshot (see `snapshot`) is this state minus the recent dispositions.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use department::Recorded;
use serde::{Deserialize, Serialize};
use sessionstore::{JournalRecord, Millis, RecordKind};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::events::{Cause, GateKind, HarnessEvent};
use crate::history::{self, TurnEnd, TurnTranscript};
use crate::model::{ChatMessage, ToolCall};
use crate::recent::RecentDispositions;

/// How much of the conversation a session keeps in memory: its newest turns, at most `turns`
/// of them and about `bytes` of text. The last turn is always kept, whatever its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Window {
    pub turns: usize,
    pub bytes: usize,
}

/// How a gate was resolved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Resolution {
    pub action: String,
    pub text: Option<String>,
}

/// A gate the journal holds open.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct OpenGate {
    pub kind: GateKind,
    pub turn_id: String,
    pub opened_at_ms: Millis,
    pub timeout_ms: u64,
    /// The turn waiting for the answer: live only, never in a snapshot.
    #[serde(skip)]
    pub waiter: Option<oneshot::Sender<Resolution>>,
}

/// A user message waiting for its turn.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct PendingInput {
    pub event_id: String,
    pub text: String,
    pub cause: Option<Cause>,
}

/// What the journal says about a turn that has started and not ended.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct OpenTurn {
    pub turn_id: String,
    pub steps: u32,
    /// The tool calls of the last assistant step.
    pub last_calls: Vec<ToolCall>,
    /// Calls of the last step that have a result.
    pub results: HashSet<String>,
    /// Gates opened in this turn, by call id → gate id.
    pub gates: HashMap<String, Uuid>,
    /// Gates resolved in this turn, by gate id.
    pub resolutions: HashMap<Uuid, Resolution>,
}

/// Everything a session knows, derived from its journal.
#[derive(Debug)]
pub(crate) struct SessionState {
    pub started: bool,
    pub compatibility: Option<String>,
    /// The newest turns, within `window`.
    pub turns: VecDeque<TurnTranscript>,
    /// The text `turns` holds, about (see [`turn_bytes`]).
    pub turn_bytes: usize,
    pub window: Window,
    /// The dispositions of the newest commands folded (older ones are read from the journal).
    pub recent: RecentDispositions,
    pub open_gates: BTreeMap<Uuid, OpenGate>,
    pub inputs: VecDeque<PendingInput>,
    /// The turn in flight according to the journal.
    pub open_turn: Option<OpenTurn>,
}

impl SessionState {
    /// The state of an empty journal.
    pub fn new(window: Window) -> SessionState {
        SessionState {
            started: false,
            compatibility: None,
            turns: VecDeque::new(),
            turn_bytes: 0,
            window,
            recent: RecentDispositions::default(),
            open_gates: BTreeMap::new(),
            inputs: VecDeque::new(),
            open_turn: None,
        }
    }

    /// Folds one journal record in.
    pub fn fold(&mut self, record: &JournalRecord) -> Result<(), String> {
        match &record.kind {
            RecordKind::Fence | RecordKind::Control { .. } => {}
            RecordKind::Application {
                identity, outcome, ..
            } => {
                self.recent.insert(
                    identity.runtime_command,
                    Recorded::applied(*outcome, record.seq),
                );
            }
            RecordKind::Closure { identity, .. } => {
                self.recent.insert(
                    identity.runtime_command,
                    Recorded {
                        disposition: sessionstore::Disposition::NotApplied,
                        seq: record.seq,
                    },
                );
            }
            RecordKind::Event {
                event, public_body, ..
            } => {
                let ev = HarnessEvent::decode(public_body)
                    .map_err(|e| format!("record {}: {e}", record.seq))?;
                self.fold_event(event.as_str(), ev, record.written_at_ms, record.seq)?;
            }
        }
        Ok(())
    }

    /// Folds one decoded event.
    pub fn fold_event(
        &mut self,
        event_id: &str,
        ev: HarnessEvent,
        written_at_ms: Millis,
        seq: u64,
    ) -> Result<(), String> {
        match ev {
            HarnessEvent::SessionStarted {
                runtime_compatibility_id,
                ..
            } => {
                self.started = true;
                self.compatibility = Some(runtime_compatibility_id);
            }
            HarnessEvent::UserMessage { text, cause } => self.inputs.push_back(PendingInput {
                event_id: event_id.to_owned(),
                text,
                cause: Some(cause),
            }),
            HarnessEvent::TurnStarted {
                turn_id,
                input_event,
                ..
            } => {
                let pos = self
                    .inputs
                    .iter()
                    .position(|i| i.event_id == input_event)
                    .ok_or_else(|| {
                        format!("record {seq}: turn {turn_id} answers unknown input {input_event}")
                    })?;
                let input = self.inputs.remove(pos).unwrap_or_else(|| PendingInput {
                    event_id: input_event.clone(),
                    text: String::new(),
                    cause: None,
                });
                self.turn_bytes += input.text.len();
                self.turns.push_back(TurnTranscript {
                    turn_id: turn_id.clone(),
                    user: input.text,
                    messages: Vec::new(),
                    end: None,
                });
                self.trim();
                self.open_turn = Some(OpenTurn {
                    turn_id,
                    ..OpenTurn::default()
                });
            }
            HarnessEvent::AssistantMessage {
                turn_id,
                step,
                text,
                tool_calls,
            } => {
                let turn = self.current(&turn_id, seq)?;
                turn.steps = step;
                turn.last_calls = tool_calls.clone();
                turn.results.clear();
                self.push_message(ChatMessage::Assistant { text, tool_calls });
            }
            HarnessEvent::ToolResult {
                turn_id,
                call_id,
                name,
                content,
                ..
            } => {
                self.current(&turn_id, seq)?.results.insert(call_id.clone());
                self.push_message(ChatMessage::Tool {
                    call_id,
                    name,
                    content,
                });
            }
            HarnessEvent::GateOpened {
                turn_id,
                gate_id,
                kind,
                call_id,
                timeout_ms,
                ..
            } => {
                let gate = Uuid::try_parse(&gate_id)
                    .map_err(|_| format!("record {seq}: gate id {gate_id} is not a UUID"))?;
                self.current(&turn_id, seq)?.gates.insert(call_id, gate);
                self.open_gates.insert(
                    gate,
                    OpenGate {
                        kind,
                        turn_id,
                        opened_at_ms: written_at_ms,
                        timeout_ms,
                        waiter: None,
                    },
                );
            }
            HarnessEvent::GateResolved {
                gate_id,
                action,
                text,
                ..
            } => {
                let gate = Uuid::try_parse(&gate_id)
                    .map_err(|_| format!("record {seq}: gate id {gate_id} is not a UUID"))?;
                if let Some(open) = self.open_gates.remove(&gate)
                    && let Some(turn) = self.open_turn.as_mut()
                    && turn.turn_id == open.turn_id
                {
                    turn.resolutions.insert(gate, Resolution { action, text });
                }
            }
            HarnessEvent::TurnDone { turn_id } => self.end_turn(&turn_id, TurnEnd::Done),
            HarnessEvent::TurnFailed { turn_id, error } => {
                self.end_turn(&turn_id, TurnEnd::Failed { code: error.code });
            }
            HarnessEvent::TurnInterrupted {
                turn_id, reason, ..
            } => self.end_turn(&turn_id, TurnEnd::Interrupted { reason }),
        }
        Ok(())
    }

    fn end_turn(&mut self, turn_id: &str, end: TurnEnd) {
        self.open_turn = None;
        if let Some(t) = self.turns.back_mut()
            && t.turn_id == turn_id
        {
            t.end = Some(end);
        }
        self.trim();
    }

    /// Forgets the oldest turns past the window (never the last one).
    pub fn trim(&mut self) {
        while self.turns.len() > 1
            && (self.turns.len() > self.window.turns || self.turn_bytes > self.window.bytes)
        {
            if let Some(old) = self.turns.pop_front() {
                self.turn_bytes = self.turn_bytes.saturating_sub(turn_bytes(&old));
            }
        }
    }

    fn current(&mut self, turn_id: &str, seq: u64) -> Result<&mut OpenTurn, String> {
        match self.open_turn.as_mut() {
            Some(t) if t.turn_id == turn_id => Ok(t),
            _ => Err(format!(
                "record {seq}: event of turn {turn_id}, which is not in flight"
            )),
        }
    }

    fn push_message(&mut self, m: ChatMessage) {
        if let Some(t) = self.turns.back_mut() {
            self.turn_bytes += message_bytes(&m);
            t.messages.push(m);
        }
    }

    /// The conversation as a model sees it, made well-formed (see `history`);
    /// `pending` names a queued input whose turn is running but has not been journaled yet
    /// (its `turn_started` rides on the first step).
    pub fn conversation_with(
        &self,
        system: Option<&str>,
        pending: Option<&str>,
    ) -> Vec<ChatMessage> {
        let pending = pending.and_then(|event| {
            self.inputs
                .iter()
                .find(|i| i.event_id == event)
                .map(|i| i.text.as_str())
        });
        // A pending input is a turn too: the model sees at most `window.turns` of them.
        let skip = match pending {
            Some(_) => (self.turns.len() + 1).saturating_sub(self.window.turns),
            None => 0,
        };
        history::conversation(system, self.turns.range(skip..), pending)
    }

    /// Whole-session idle: no turn, no open gate, nothing queued.
    pub fn is_idle(&self, turn_running: bool) -> bool {
        !turn_running
            && self.open_turn.is_none()
            && self.open_gates.is_empty()
            && self.inputs.is_empty()
    }
}

/// About how much text a turn holds (its user message, replies, tool calls and results).
pub(crate) fn turn_bytes(t: &TurnTranscript) -> usize {
    t.user.len() + t.messages.iter().map(message_bytes).sum::<usize>()
}

fn message_bytes(m: &ChatMessage) -> usize {
    match m {
        ChatMessage::System { text } | ChatMessage::User { text } => text.len(),
        ChatMessage::Assistant { text, tool_calls } => {
            text.len()
                + tool_calls
                    .iter()
                    .map(|c| {
                        c.id.len()
                            + c.name.len()
                            + c.arguments.to_string().len()
                            + c.arguments_error.as_ref().map_or(0, String::len)
                    })
                    .sum::<usize>()
        }
        ChatMessage::Tool {
            call_id,
            name,
            content,
        } => call_id.len() + name.len() + content.len(),
    }
}
