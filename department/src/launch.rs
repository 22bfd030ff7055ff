//! Launch targets and the verified launch. Owns the rule that a runtime's declared capabilities
//! and identity are checked at launch: a runtime missing what its target declared, or running
//! under another runtime session id, is refused and released.

use sessionstore::{AgentId, CompatibilityId, SessionBinding, SessionId, StoreError, TenantId};
use wire_enum::wire_enum;

use crate::capabilities::Capabilities;
use crate::runtime::{Runtime, RuntimeError};

wire_enum! {
    /// Create a new conversation, or restore an existing one from its journal. The text is the
    /// `mode` label of the Host's attach metrics.
    pub enum LaunchMode {
        Create = "create",
        Restore = "restore",
    }
    kind = "launch_mode";
}

/// What to launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub agent: AgentId,
    /// The session's immutable binding: the runtime runs under its runtime session id.
    pub binding: SessionBinding,
    pub mode: LaunchMode,
    /// An opaque token naming this launch as the journal lease holder.
    pub holder: String,
}

/// Why a launch failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("conversation_exists: create refused, the journal already holds a conversation")]
    ConversationExists,
    #[error("no_conversation: restore refused, the journal holds no conversation")]
    NoConversation,
    #[error("incapable: the runtime lacks what its target declared: {}{}", .missing.join(", "), release_note(.release))]
    Incapable {
        missing: Vec<&'static str>,
        release: Option<RuntimeError>,
    },
    #[error("identity: the runtime runs under {got}, the binding names {expected}{}", release_note(.release))]
    Identity {
        expected: String,
        got: String,
        release: Option<RuntimeError>,
    },
    #[error("unknown_tenant: this target serves no runtime for tenant {0}")]
    UnknownTenant(TenantId),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("runtime: {0}")]
    Runtime(#[from] RuntimeError),
}

fn release_note(r: &Option<RuntimeError>) -> String {
    match r {
        None => String::new(),
        Some(e) => format!(" (and releasing it failed: {e})"),
    }
}

impl LaunchError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            LaunchError::ConversationExists => "conversation_exists",
            LaunchError::NoConversation => "no_conversation",
            LaunchError::Incapable { .. } => "incapable",
            LaunchError::Identity { .. } => "identity",
            LaunchError::UnknownTenant(_) => "unknown_tenant",
            LaunchError::Store(_) => "store",
            LaunchError::Runtime(_) => "runtime",
        }
    }
}

/// Something a Host can launch sessions of.
#[async_trait::async_trait]
pub trait LaunchTarget: Send + Sync {
    /// What this target declares about its runtimes.
    fn capabilities(&self) -> Capabilities;
    /// The runtime build; restore refuses a journal created under another.
    fn compatibility(&self) -> CompatibilityId;
    /// Launches (creates or restores) a session's runtime.
    async fn launch(&self, request: LaunchRequest) -> Result<Runtime, LaunchError>;
}

/// Launches through `target` and verifies the result: the runtime must run under the
/// binding's runtime session id and offer every recovery capability its target declared.
/// A runtime that fails either check is released (abandoned when it can be) before the
/// refusal is returned; a failed release is reported inside the refusal.
pub async fn launch_verified(
    target: &dyn LaunchTarget,
    request: LaunchRequest,
) -> Result<Runtime, LaunchError> {
    let declared = target.capabilities().recovery;
    let expected = request.binding.runtime_session_id;
    let runtime = target.launch(request).await?;
    if runtime.runtime_session != expected {
        let release = runtime.stop().await.err();
        return Err(LaunchError::Identity {
            expected: expected.to_string(),
            got: runtime.runtime_session.to_string(),
            release,
        });
    }
    let mut missing = Vec::new();
    if declared.attempt_closer && runtime.closer.is_none() {
        missing.push("declared attempt_closer absent");
    }
    if declared.persistence_faults && runtime.faults.is_none() {
        missing.push("declared persistence_faults absent");
    }
    if !missing.is_empty() {
        let release = runtime.stop().await.err();
        return Err(LaunchError::Incapable { missing, release });
    }
    Ok(runtime)
}
