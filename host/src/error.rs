//! Host refusals. Owns the stable codes a controller branches on (the HostLink error codes)
//! and the internal failure that carries what could not be given back. Never carries bodies
//! or secrets.

/// A refusal or failure of a Host operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The Host is draining, or the isolation class forbids this tenant.
    #[error("not_admitting: {0}")]
    NotAdmitting(String),
    /// The Host has not been started: a caller error (start it first), not a placement
    /// outcome. Over HostLink it cannot happen (no link is accepted before start).
    #[error("not_started: the Host has not started")]
    NotStarted,
    /// The session is being released here; wait and re-place it.
    #[error("releasing: the session is being released")]
    Releasing,
    /// Not enough admission weight left.
    #[error("no_capacity: needs {needed}, {free} free")]
    NoCapacity { needed: u32, free: u32 },
    /// Another holder has the residency (or the bind named another epoch).
    #[error("epoch_mismatch: the residency is at epoch {current_lease_epoch}")]
    EpochMismatch { current_lease_epoch: u64 },
    /// This Host runs another build (or agent) than the session needs.
    #[error("runtime_mismatch: this Host runs {runtime_compatibility_id}")]
    RuntimeMismatch { runtime_compatibility_id: String },
    /// This Host cannot run this session (deliberately uninformative to clients).
    #[error("runtime_unavailable: {0}")]
    RuntimeUnavailable(String),
    /// The request itself is invalid.
    #[error("invalid: {0}")]
    Invalid(String),
    /// Anything else (retry is safe); `unreleased` names what an unwound attach could not
    /// give back.
    #[error("internal: {reason}{}", unreleased_note(.unreleased))]
    Internal {
        reason: String,
        unreleased: Vec<String>,
    },
}

fn unreleased_note(v: &[String]) -> String {
    if v.is_empty() {
        String::new()
    } else {
        format!(" (not released: {})", v.join("; "))
    }
}

impl HostError {
    /// The stable code (a HostLink error code, or `not_started`), or `None` for an internal
    /// failure.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            HostError::NotAdmitting(_) => Some("not_admitting"),
            HostError::NotStarted => Some("not_started"),
            HostError::Releasing => Some("releasing"),
            HostError::NoCapacity { .. } => Some("no_capacity"),
            HostError::EpochMismatch { .. } => Some("epoch_mismatch"),
            HostError::RuntimeMismatch { .. } => Some("runtime_mismatch"),
            HostError::RuntimeUnavailable(_) => Some("runtime_unavailable"),
            HostError::Invalid(_) => Some("invalid"),
            HostError::Internal { .. } => None,
        }
    }

    pub(crate) fn internal(reason: impl Into<String>) -> HostError {
        HostError::Internal {
            reason: reason.into(),
            unreleased: Vec::new(),
        }
    }
}

impl From<sessionstore::StoreError> for HostError {
    fn from(e: sessionstore::StoreError) -> Self {
        HostError::internal(format!("store: {e}"))
    }
}
