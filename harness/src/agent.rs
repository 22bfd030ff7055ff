//! An agent's configuration: its model, tools, system prompt and bounds. Immutable once built;
//! shared by every session of the agent.

use std::sync::Arc;
use std::time::Duration;

use crate::model::Model;
use crate::tool::ToolRegistry;

/// The default timeout of a permission gate (the call is denied when it passes).
pub const DEFAULT_PERMISSION_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The default timeout of an `ask_user` gate.
pub const DEFAULT_ASK_USER_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The default bound on model steps in one turn.
pub const DEFAULT_MAX_STEPS: u32 = 16;
/// The default journal lease TTL (renewed at a third of it).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);

/// The default number of journal records between two snapshots of a session's fold.
pub const DEFAULT_SNAPSHOT_EVERY: u64 = 1_000;
/// The default number of turns a session keeps in memory (and sends to its model).
pub const DEFAULT_CONVERSATION_TURNS: usize = 100;
/// The default bound on the text a session keeps in memory for its conversation.
pub const DEFAULT_CONVERSATION_BYTES: usize = 256 * 1024;

/// How an agent runs.
#[derive(Clone)]
pub struct AgentConfig {
    pub model: Arc<dyn crate::model::Model>,
    pub tools: ToolRegistry,
    pub system_prompt: Option<String>,
    pub max_steps: u32,
    pub permission_timeout: Duration,
    pub ask_user_timeout: Duration,
    pub lease_ttl: Duration,
    /// A session checkpoints its fold (a journal snapshot) once this many records were
    /// appended since the last one, and at a graceful release; a restore reads the newest
    /// snapshot and folds only the records after it.
    pub snapshot_every: u64,
    /// The conversation a session keeps in memory is its newest turns, at most this many...
    pub conversation_turns: usize,
    /// ...and at most about this many bytes of text (the turn in flight is always kept whole).
    /// The model is sent exactly this window (see `history`); older turns stay in the journal.
    pub conversation_bytes: usize,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("model", &self.model.name())
            .field("tools", &self.tools)
            .field("max_steps", &self.max_steps)
            .finish()
    }
}

/// Why an agent configuration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid agent configuration: {field} {reason}")]
pub struct AgentConfigError {
    pub field: &'static str,
    pub reason: &'static str,
}

impl AgentConfig {
    /// An agent with `model` and `tools` and default bounds.
    pub fn new(model: Arc<dyn Model>, tools: ToolRegistry) -> AgentConfig {
        AgentConfig {
            model,
            tools,
            system_prompt: None,
            max_steps: DEFAULT_MAX_STEPS,
            permission_timeout: DEFAULT_PERMISSION_TIMEOUT,
            ask_user_timeout: DEFAULT_ASK_USER_TIMEOUT,
            lease_ttl: DEFAULT_LEASE_TTL,
            snapshot_every: DEFAULT_SNAPSHOT_EVERY,
            conversation_turns: DEFAULT_CONVERSATION_TURNS,
            conversation_bytes: DEFAULT_CONVERSATION_BYTES,
        }
    }

    /// Checks every bound.
    pub fn validate(&self) -> Result<(), AgentConfigError> {
        let bad = |field, reason| Err(AgentConfigError { field, reason });
        if self.max_steps == 0 || self.max_steps > 256 {
            return bad("max_steps", "must be between 1 and 256");
        }
        if self.permission_timeout.is_zero() {
            return bad("permission_timeout", "must be positive");
        }
        if self.ask_user_timeout.is_zero() {
            return bad("ask_user_timeout", "must be positive");
        }
        if self.lease_ttl < Duration::from_millis(300) || self.lease_ttl > Duration::from_secs(3600)
        {
            return bad("lease_ttl", "must be between 300 ms and 1 h");
        }
        Self::check_session_bounds(
            self.snapshot_every,
            self.conversation_turns,
            self.conversation_bytes,
        )
    }

    /// Checks the bounds on what a session keeps: the snapshot cadence and the conversation
    /// window (what [`AgentConfig::validate`] checks of them, for a caller that reads them
    /// before it builds an agent).
    pub fn check_session_bounds(
        snapshot_every: u64,
        conversation_turns: usize,
        conversation_bytes: usize,
    ) -> Result<(), AgentConfigError> {
        let bad = |field, reason| Err(AgentConfigError { field, reason });
        if !(16..=1_000_000).contains(&snapshot_every) {
            return bad("snapshot_every", "must be between 16 and 1000000 records");
        }
        if !(1..=100_000).contains(&conversation_turns) {
            return bad("conversation_turns", "must be between 1 and 100000");
        }
        if !(4 * 1024..=64 * 1024 * 1024).contains(&conversation_bytes) {
            return bad("conversation_bytes", "must be between 4 KiB and 64 MiB");
        }
        Ok(())
    }
}
