//! Tools: what a turn can run on a model's behalf. Owns the `Tool` trait, the registry an agent
//! is configured with, and the built-in tools. `ask_user` is built in and special: the runtime
//! turns it into a gate and the human's answer is its result; it is never `call`ed.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::model::ToolSpec;

/// The reserved name of the built-in question tool.
pub const ASK_USER: &str = "ask_user";

/// A tool failure (reported to the model as an error result, never a crash).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

/// Where a call comes from. Stable across a restore: a call re-run after a restore carries the
/// same context as its first run, so a tool can derive an idempotency key from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallContext {
    /// The turn's id (unique across sessions).
    pub turn_id: String,
    /// The model step (1-based) that asked for the call.
    pub step: u32,
    /// The call's id, as the model minted it.
    pub call_id: String,
}

/// A tool the model may call.
#[async_trait::async_trait]
pub trait Tool: Send + Sync {
    /// Name, description and argument schema, as offered to the model.
    fn spec(&self) -> ToolSpec;

    /// True when a human must approve each call before it runs (a permission gate).
    fn needs_approval(&self) -> bool {
        false
    }

    /// What a live preview may show when a call starts: a redacted summary the tool writes
    /// itself, never its raw arguments. `None` (the default) shows only the tool's name.
    fn audit_summary(&self, _arguments: &Value) -> Option<String> {
        None
    }

    /// True when running the same call twice is harmless, so a restore may re-run a call whose
    /// outcome was lost. A tool with effects must leave this false.
    fn replay_safe(&self) -> bool {
        false
    }

    /// Runs the call.
    async fn call(&self, arguments: Value) -> Result<String, ToolError>;

    /// Runs the call knowing where it comes from. The turn loop calls this; the default
    /// ignores the context.
    async fn call_in(&self, context: &CallContext, arguments: Value) -> Result<String, ToolError> {
        let _ = context;
        self.call(arguments).await
    }
}

/// The tools an agent has, by name. `ask_user` is always present.
#[derive(Clone)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

/// Why a registry could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("duplicate tool {0}")]
    Duplicate(String),
    #[error("{ASK_USER} is built in and cannot be registered")]
    Reserved,
    #[error("a tool name must be 1-64 characters of [A-Za-z0-9_-]: {0:?}")]
    BadName(String),
}

impl ToolRegistry {
    /// A registry with `tools` plus the built-in `ask_user`.
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> Result<ToolRegistry, RegistryError> {
        let mut map = BTreeMap::new();
        for t in tools {
            let name = t.spec().name;
            if name == ASK_USER {
                return Err(RegistryError::Reserved);
            }
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(RegistryError::BadName(name));
            }
            if map.insert(name.clone(), t).is_some() {
                return Err(RegistryError::Duplicate(name));
            }
        }
        Ok(ToolRegistry { tools: map })
    }

    /// The tool named `name` (not `ask_user`).
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.tools.get(name).cloned()
    }

    /// Every tool's spec, `ask_user` first.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut out = vec![ask_user_spec()];
        out.extend(self.tools.values().map(|t| t.spec()));
        out
    }
}

/// The spec of the built-in `ask_user` tool.
pub fn ask_user_spec() -> ToolSpec {
    ToolSpec {
        name: ASK_USER.into(),
        description: "Ask the human a question and wait for their answer.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
            "additionalProperties": false
        }),
    }
}

/// A tool that returns its `text` argument. Useful in demos and tests; with `needs_approval`
/// it stands for any tool with effects.
#[derive(Clone, Debug)]
pub struct EchoTool {
    name: String,
    needs_approval: bool,
}

impl EchoTool {
    /// An echo tool named `name`.
    pub fn new(name: impl Into<String>, needs_approval: bool) -> EchoTool {
        EchoTool {
            name: name.into(),
            needs_approval,
        }
    }
}

#[async_trait::async_trait]
impl Tool for EchoTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.clone(),
            description: if self.needs_approval {
                "Echo the text back (asks for approval first).".into()
            } else {
                "Echo the text back.".into()
            },
            parameters: json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": false
            }),
        }
    }

    fn needs_approval(&self) -> bool {
        self.needs_approval
    }

    fn audit_summary(&self, arguments: &Value) -> Option<String> {
        let chars = arguments
            .get("text")
            .and_then(Value::as_str)
            .map_or(0, |t| t.chars().count());
        Some(format!("echo {chars} characters"))
    }

    fn replay_safe(&self) -> bool {
        !self.needs_approval
    }

    async fn call(&self, arguments: Value) -> Result<String, ToolError> {
        match arguments.get("text").and_then(Value::as_str) {
            Some(t) => Ok(t.to_owned()),
            None => Err(ToolError("missing string argument `text`".into())),
        }
    }
}
