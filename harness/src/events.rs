//! The harness journal vocabulary: the public events a session writes, as JSON bodies. Owns
//! their encoding and decoding. Public bodies carry public ids only (the session's and the
//! commands' public ids); the runtime session id and runtime command ids live in private
//! fields (the record's `cause` column), never in a body.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use wire_enum::wire_enum;

use crate::model::ToolCall;

/// What caused an event: the public id of the command a controller admitted, and who the
/// controller says asked (`principal`, on every kind) with its metadata (on create and input):
/// recorded assertions, not authorization evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cause {
    pub command_id: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub principal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub metadata: Option<Value>,
}

impl Cause {
    /// A cause naming only the command.
    pub fn command(command_id: impl Into<String>) -> Cause {
        Cause {
            command_id: command_id.into(),
            principal: None,
            metadata: None,
        }
    }
}

wire_enum! {
    /// A gate's kind.
    pub enum GateKind {
        /// A tool that needs approval asks before it runs: `approve` or `deny`.
        Permission = "permission",
        /// A tool asks the human a question: `answer` with text.
        AskUser = "ask_user",
    }
    kind = "gate_kind";
    serde;
}

impl GateKind {
    /// The actions this kind of gate offers.
    pub fn actions(self) -> &'static [&'static str] {
        match self {
            GateKind::Permission => &["approve", "deny"],
            GateKind::AskUser => &["answer"],
        }
    }
}

/// How a turn ended, when it failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnError {
    pub code: String,
    pub message: String,
}

/// One public harness event (the journal's public body).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum HarnessEvent {
    SessionStarted {
        session_id: String,
        agent_id: String,
        runtime_compatibility_id: String,
    },
    UserMessage {
        text: String,
        cause: Cause,
    },
    TurnStarted {
        turn_id: String,
        /// The event id of the user message this turn answers.
        input_event: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        cause: Option<Cause>,
    },
    AssistantMessage {
        turn_id: String,
        step: u32,
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    ToolResult {
        turn_id: String,
        call_id: String,
        name: String,
        content: String,
        is_error: bool,
    },
    GateOpened {
        turn_id: String,
        gate_id: String,
        kind: GateKind,
        call_id: String,
        prompt: String,
        actions: Vec<String>,
        timeout_ms: u64,
    },
    GateResolved {
        gate_id: String,
        action: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        text: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        cause: Option<Cause>,
    },
    TurnDone {
        turn_id: String,
    },
    TurnFailed {
        turn_id: String,
        error: TurnError,
    },
    TurnInterrupted {
        turn_id: String,
        reason: String,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        cause: Option<Cause>,
    },
}

impl HarnessEvent {
    /// The JSON body.
    pub fn encode(&self) -> Vec<u8> {
        // Serializing these plain types cannot fail; an empty body would fail decoding loudly.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Decodes a public body written by this harness.
    pub fn decode(bytes: &[u8]) -> Result<HarnessEvent, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("undecodable harness event: {e}"))
    }

    /// The wire `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            HarnessEvent::SessionStarted { .. } => "session_started",
            HarnessEvent::UserMessage { .. } => "user_message",
            HarnessEvent::TurnStarted { .. } => "turn_started",
            HarnessEvent::AssistantMessage { .. } => "assistant_message",
            HarnessEvent::ToolResult { .. } => "tool_result",
            HarnessEvent::GateOpened { .. } => "gate_opened",
            HarnessEvent::GateResolved { .. } => "gate_resolved",
            HarnessEvent::TurnDone { .. } => "turn_done",
            HarnessEvent::TurnFailed { .. } => "turn_failed",
            HarnessEvent::TurnInterrupted { .. } => "turn_interrupted",
        }
    }

    /// True for the three terminal events of a turn.
    pub fn is_turn_terminal(&self) -> bool {
        matches!(
            self,
            HarnessEvent::TurnDone { .. }
                | HarnessEvent::TurnFailed { .. }
                | HarnessEvent::TurnInterrupted { .. }
        )
    }
}

/// Summarises tool arguments for a gate prompt (bounded).
pub fn summarize_arguments(args: &Value) -> String {
    let mut s = args.to_string();
    if s.len() > 512 {
        let mut cut = 509;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    s
}
