//! Models: what a turn asks for its next step. Owns the `Model` trait and the conversation
//! shapes it is called with; implementations stream text deltas and tool calls. A model never
//! writes the journal and never runs tools: the turn loop does both.

pub mod openai;
pub mod openai_options;
pub mod scripted;

use std::pin::Pin;

use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use openai::{OpenAiConfig, OpenAiModel};
pub use openai_options::{OpenAiOptions, OpenAiOptionsCode, OpenAiOptionsError};
pub use scripted::ScriptedModel;

/// A tool call a model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique within the step (models mint them; harness keeps them).
    pub id: String,
    pub name: String,
    /// The arguments, a JSON value (normally an object); `{}` when `arguments_error` is set.
    pub arguments: Value,
    /// Why the arguments the model wrote could not be used (for instance, they were not JSON),
    /// with an excerpt of what it wrote. Such a call never runs: the turn answers it with this
    /// text as an error result, so the model can correct itself in its next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_error: Option<String>,
}

impl ToolCall {
    /// A call with usable arguments.
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
            arguments_error: None,
        }
    }
}

/// A tool as offered to a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema for the arguments.
    pub parameters: Value,
}

/// One message of the conversation, as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    System {
        text: String,
    },
    User {
        text: String,
    },
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        call_id: String,
        name: String,
        content: String,
    },
}

/// What a turn asks a model for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelRequest {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
}

/// Why a model stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The reply is complete.
    Stop,
    /// The model wants the tool calls it emitted run.
    ToolCalls,
    /// The model hit its output limit.
    Length,
    /// Anything else the provider said.
    Other(String),
}

/// One streamed event of a model step. A step is a run of `TextDelta`s, `ReasoningDelta`s and
/// `ToolCall`s (and a `Usage` when the provider reports one) ending in exactly one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelEvent {
    TextDelta(String),
    /// Visible reasoning the provider streams beside the answer: previewed, never journaled
    /// and never sent back to the model.
    ReasoningDelta(String),
    ToolCall(ToolCall),
    /// The tokens the step used, when the provider reports them (before `Finished`).
    Usage(TokenUsage),
    Finished(FinishReason),
}

/// A model step's token counts as its provider reported them; a count it did not give is
/// `None`, never guessed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

/// A model failure. `code()` is stable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    #[error("model timed out after {0} ms")]
    Timeout(u64),
    #[error("model endpoint answered HTTP {status}: {message}")]
    Http { status: u16, message: String },
    #[error("model transport failed: {0}")]
    Transport(String),
    #[error("model stream was not understood: {0}")]
    Protocol(String),
    /// The provider answered, and what it said was an error (inside the event stream, or as a
    /// JSON error body where a stream was expected): its own message, not a malformed stream.
    #[error("the model provider reported an error: {0}")]
    Provider(String),
    #[error("scripted failure: {0}")]
    Scripted(String),
    #[error("model configuration is invalid: {0}")]
    Config(String),
}

impl ModelError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ModelError::Timeout(_) => "timeout",
            ModelError::Http { .. } => "http",
            ModelError::Transport(_) => "transport",
            ModelError::Protocol(_) => "protocol",
            ModelError::Provider(_) => "provider",
            ModelError::Scripted(_) => "scripted",
            ModelError::Config(_) => "config",
        }
    }
}

/// A stream of model events.
pub type ModelStream = Pin<Box<dyn Stream<Item = Result<ModelEvent, ModelError>> + Send>>;

/// A model a turn can call. Dropping the stream cancels the step.
#[async_trait::async_trait]
pub trait Model: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &str;

    /// Starts one step of the conversation.
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError>;
}
