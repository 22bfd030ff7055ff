//! `ScriptedModel`: a deterministic model for tests and demos.
//!
//! It keeps no state between calls: each step is computed from the request alone, so the same
//! conversation always yields the same events (a step re-run after a restore matches the first).
//!
//! # Grammar
//!
//! Only the **last `User` message** and the messages after it are read.
//!
//! 1. No `User` message at all: reply `Hello.`, finish `Stop`.
//! 2. A `Tool` message follows the last user message: reply `Tool <name> returned: <content>`
//!    about the **last** such tool message, finish `Stop`.
//! 3. Otherwise the user text decides. Its first whitespace-separated word is the command and
//!    `<rest>` is what follows it, leading whitespace removed:
//!    - `/tool <name> <json-args>`: one tool call (id `call-1`, `<name>`, the parsed args; no args
//!      means `{}`), finish `ToolCalls`. A missing name or invalid JSON yields a `Protocol` error.
//!    - `/ask <question>`: one tool call `ask_user` (id `call-1`) with args
//!      `{"question": "<question>"}`, finish `ToolCalls`.
//!    - `/fail <message>`: deltas `Working`, `...`, then the error `Scripted(<message>)`.
//!    - `/slow <ms> <text>`: `<text>` in word deltas, sleeping `<ms>` (tokio time) between
//!      deltas, finish `Stop`. A `<ms>` that is not a whole number yields a `Protocol` error.
//!    - anything else: `You said: <text>` (the whole user text) in word deltas, finish `Stop`.
//!
//! Replies are streamed as word deltas: each delta is one word with the whitespace after it (any
//! leading whitespace goes with the first word), so the deltas concatenate to the exact text.
//! Errors are yielded as stream items; `stream()` itself never fails.
//!
//! The per-delta delay ([`ScriptedModel::with_delta_delay`], default zero) is slept between
//! consecutive text deltas of every reply except `/slow`, which uses its own `<ms>`.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};

use super::{
    ChatMessage, FinishReason, Model, ModelError, ModelEvent, ModelRequest, ModelStream, ToolCall,
};

/// The id of the (only) tool call a scripted step emits.
pub const SCRIPTED_CALL_ID: &str = "call-1";

/// The tool `/ask` calls.
pub const ASK_USER_TOOL: &str = "ask_user";

/// A deterministic model driven by the conversation; see the module docs for its grammar.
#[derive(Clone, Debug, Default)]
pub struct ScriptedModel {
    delta_delay: Duration,
}

impl ScriptedModel {
    /// A scripted model without delays.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sleeps `delay` (tokio time) between consecutive text deltas; `/slow` uses its own delay.
    pub fn with_delta_delay(mut self, delay: Duration) -> Self {
        self.delta_delay = delay;
        self
    }

    /// The configured per-delta delay.
    pub fn delta_delay(&self) -> Duration {
        self.delta_delay
    }

    /// The events of one step, each with the delay to wait before it is yielded.
    fn plan(&self, request: &ModelRequest) -> Vec<(Duration, Result<ModelEvent, ModelError>)> {
        let Some(user_at) = request
            .messages
            .iter()
            .rposition(|m| matches!(m, ChatMessage::User { .. }))
        else {
            return self.reply("Hello.", self.delta_delay);
        };

        let last_tool = request.messages[user_at + 1..]
            .iter()
            .rev()
            .find_map(|m| match m {
                ChatMessage::Tool { name, content, .. } => Some((name, content)),
                _ => None,
            });
        if let Some((name, content)) = last_tool {
            return self.reply(
                &format!("Tool {name} returned: {content}"),
                self.delta_delay,
            );
        }

        let ChatMessage::User { text } = &request.messages[user_at] else {
            return self.reply("Hello.", self.delta_delay);
        };
        let (command, rest) = split_command(text);
        match command {
            "/tool" => {
                let (name, args) = split_command(rest);
                if name.is_empty() {
                    return failure("/tool needs a tool name");
                }
                let args = args.trim();
                let arguments = if args.is_empty() {
                    Ok(json!({}))
                } else {
                    serde_json::from_str::<Value>(args)
                };
                match arguments {
                    Ok(arguments) => tool_call(name, arguments),
                    Err(err) => failure(&format!("/tool arguments are not valid JSON: {err}")),
                }
            }
            "/ask" => tool_call(ASK_USER_TOOL, json!({ "question": rest })),
            "/think" => {
                // Visible reasoning in word deltas, then a short answer.
                let mut events: Vec<_> = word_chunks(rest)
                    .into_iter()
                    .map(|w| {
                        (
                            Duration::ZERO,
                            Ok(ModelEvent::ReasoningDelta(w.to_string())),
                        )
                    })
                    .collect();
                events.extend(self.reply("Thought it through.", self.delta_delay));
                events
            }
            "/fail" => vec![
                (Duration::ZERO, Ok(ModelEvent::TextDelta("Working".into()))),
                (self.delta_delay, Ok(ModelEvent::TextDelta("...".into()))),
                (Duration::ZERO, Err(ModelError::Scripted(rest.to_string()))),
            ],
            "/slow" => {
                let (ms, slow_text) = split_command(rest);
                match ms.parse::<u64>() {
                    Ok(ms) => self.reply(slow_text, Duration::from_millis(ms)),
                    Err(_) => failure(&format!(
                        "/slow needs a delay in whole milliseconds, got {ms:?}"
                    )),
                }
            }
            _ => self.reply(&format!("You said: {text}"), self.delta_delay),
        }
    }

    /// A text reply in word deltas, `delay` between consecutive deltas, then `Stop`.
    fn reply(
        &self,
        text: &str,
        delay: Duration,
    ) -> Vec<(Duration, Result<ModelEvent, ModelError>)> {
        let mut events: Vec<_> = word_chunks(text)
            .into_iter()
            .enumerate()
            .map(|(i, word)| {
                let wait = if i == 0 { Duration::ZERO } else { delay };
                (wait, Ok(ModelEvent::TextDelta(word.to_string())))
            })
            .collect();
        events.push((Duration::ZERO, Ok(ModelEvent::Finished(FinishReason::Stop))));
        events
    }
}

fn tool_call(name: &str, arguments: Value) -> Vec<(Duration, Result<ModelEvent, ModelError>)> {
    vec![
        (
            Duration::ZERO,
            Ok(ModelEvent::ToolCall(ToolCall::new(
                SCRIPTED_CALL_ID,
                name,
                arguments,
            ))),
        ),
        (
            Duration::ZERO,
            Ok(ModelEvent::Finished(FinishReason::ToolCalls)),
        ),
    ]
}

fn failure(message: &str) -> Vec<(Duration, Result<ModelEvent, ModelError>)> {
    vec![(
        Duration::ZERO,
        Err(ModelError::Protocol(message.to_string())),
    )]
}

/// Splits off the first whitespace-separated word; the rest has its leading whitespace removed.
fn split_command(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(at) => (&text[..at], text[at..].trim_start()),
        None => (text, ""),
    }
}

/// Splits `text` into words, each with the whitespace that follows it; leading whitespace stays
/// with the first word. The pieces concatenate to `text`.
pub(crate) fn word_chunks(text: &str) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut seen_word = false;
    let mut prev_space = false;
    for (at, ch) in text.char_indices() {
        let space = ch.is_whitespace();
        if !space && prev_space && seen_word {
            chunks.push(&text[start..at]);
            start = at;
        }
        if !space {
            seen_word = true;
        }
        prev_space = space;
    }
    if start < text.len() {
        chunks.push(&text[start..]);
    }
    chunks
}

#[async_trait::async_trait]
impl Model for ScriptedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let events = self.plan(&request);
        let stream = futures::stream::iter(events).then(|(wait, event)| async move {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            event
        });
        Ok(Box::pin(stream))
    }
}
