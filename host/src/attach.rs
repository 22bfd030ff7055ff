//! What asks for a session to be made resident on this Host: the attach request, as HostLink's
//! `attach`, the reconcile loop (for a session the fleet assigned here) and direct callers of
//! `Service::attach` give it. Plain data; the attach itself is the composition's (`service`).

use department::LaunchMode;
use sessionstore::{AgentId, CompatibilityId, SessionId, TenantId};

/// An attach request (what `hostlink.attach` carries, minus the transport's checks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachRequest {
    pub tenant: TenantId,
    pub session: SessionId,
    pub agent: AgentId,
    /// The runtime build the caller expects, if it says: it must then equal the agent's and
    /// a resident session's.
    pub compatibility: Option<CompatibilityId>,
    /// A create starts a conversation or, when the journal holds one, restores it; a restore
    /// requires one and is refused `runtime_unavailable` (`restore_without_state`) otherwise.
    pub mode: LaunchMode,
    pub actor: Option<String>,
    pub trace: Option<String>,
}
