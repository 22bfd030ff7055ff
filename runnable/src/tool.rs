//! Runnables offered to an agent as tools. A tool call goes through exactly the path `invoke`
//! takes (input validation, the same classifier, the same certainty), so an uncertain outcome
//! reaches the model as "unknown", never as success.
//!
//! - The tool is named by the runnable's name and takes its input schema as parameters (see
//!   [`crate::projection::tool_spec`]).
//! - An `effectful` runnable asks permission through the agent's permission gate before each
//!   call (unless the operator turned that off for this tool).
//! - The call's intent id comes from the turn, the model step and the call id, so a call the
//!   runtime re-runs after a restore gets the same `intent_id` and `effect_id`. The runtime
//!   re-runs a call whose outcome was lost only when the tool is replay-safe: `read_only` and
//!   `idempotent` runnables are; an `effectful` one is never started again.
//!
//! Being a tool grants nothing beyond invoking that one release. This module must never
//! resolve names itself: it is handed a [`Release`].

use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;

use crate::declaration::Effect;
use crate::error::RunnableError;
use crate::invoke::{Invocation, InvokeOptions, InvokeRequest, invoke};
use crate::outcome::OutcomeClass;
use crate::projection::tool_spec;
use crate::release::Release;
use harness::model::ToolSpec;
use harness::tool::{CallContext, Tool, ToolError};

/// A release offered as an agent tool.
#[derive(Debug, Clone)]
pub struct RunnableTool {
    release: Release,
    options: Arc<InvokeOptions>,
    approve_effects: bool,
}

/// Whether `name` fits the tool-name rule agents use (1-64 of `[A-Za-z0-9_-]`).
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl RunnableTool {
    /// Offers `release` as a tool. Effectful runnables ask permission.
    pub fn new(
        release: Release,
        options: Arc<InvokeOptions>,
    ) -> Result<RunnableTool, RunnableError> {
        let name = &release.identity().name;
        if !valid_tool_name(name) {
            return Err(RunnableError::NotATool {
                identity: release.identity().to_string(),
                reason: format!(
                    "a tool name must be 1-64 characters of letters, digits, `_` and `-`, and `{name}` is not"
                ),
            });
        }
        if name == harness::tool::ASK_USER {
            return Err(RunnableError::NotATool {
                identity: release.identity().to_string(),
                reason: format!("`{name}` is the built-in question tool"),
            });
        }
        Ok(RunnableTool {
            release,
            options,
            approve_effects: true,
        })
    }

    /// Whether an effectful runnable asks permission before each call (default true).
    pub fn with_effect_approval(mut self, ask: bool) -> RunnableTool {
        self.approve_effects = ask;
        self
    }

    pub fn release(&self) -> &Release {
        &self.release
    }

    /// Invokes with an explicit intent (the library path; `call_in` derives the intent).
    pub async fn invoke(
        &self,
        arguments: Value,
        intent_id: Option<String>,
    ) -> Result<Invocation, RunnableError> {
        invoke(
            &self.release,
            InvokeRequest {
                input: arguments,
                intent_id,
                effect_id: None,
            },
            &self.options,
            &CancellationToken::new(),
        )
        .await
    }
}

/// The intent id of a tool call: stable across a restore that re-runs it.
pub fn call_intent(context: &CallContext) -> String {
    let mut h = Sha256::new();
    h.update(b"hostd.tool-call/1\0");
    for part in [
        context.turn_id.as_str(),
        &context.step.to_string(),
        context.call_id.as_str(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("call-{}", &hex::encode(h.finalize())[..32])
}

/// What the model reads back: the output on success; otherwise a JSON error saying what
/// happened and whether the effect is known.
fn render(result: Result<Invocation, RunnableError>) -> Result<String, ToolError> {
    match result {
        Ok(inv) if inv.outcome == OutcomeClass::Succeeded => Ok(json!({
            "outcome": "succeeded",
            "output": inv.output,
        })
        .to_string()),
        Ok(inv) if inv.outcome == OutcomeClass::Failed => Err(ToolError(
            json!({
                "outcome": "failed",
                "certain": true,
                "error": inv.error,
            })
            .to_string(),
        )),
        Ok(inv) => Err(ToolError(
            json!({
                "outcome": inv.outcome.as_str(),
                "certain": false,
                "effect": "unknown",
                "detail": inv.detail,
                "effect_id": inv.effect_id,
            })
            .to_string(),
        )),
        Err(e) => Err(ToolError(
            json!({
                "refused": e.code(),
                "message": e.to_string(),
                "ran": false,
            })
            .to_string(),
        )),
    }
}

#[async_trait::async_trait]
impl Tool for RunnableTool {
    fn spec(&self) -> ToolSpec {
        tool_spec(self.release.declaration())
    }

    fn needs_approval(&self) -> bool {
        self.approve_effects && self.release.effect() == Effect::Effectful
    }

    fn replay_safe(&self) -> bool {
        self.release.effect().replay_safe()
    }

    async fn call(&self, arguments: Value) -> Result<String, ToolError> {
        render(self.invoke(arguments, None).await)
    }

    async fn call_in(&self, context: &CallContext, arguments: Value) -> Result<String, ToolError> {
        render(self.invoke(arguments, Some(call_intent(context))).await)
    }
}
