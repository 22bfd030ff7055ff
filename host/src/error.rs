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
    /// The Host's stop has begun (or it was stopped without ever starting): it cannot start
    /// again or take a session. A caller error, not a placement outcome.
    #[error("disposed: the Host has been stopped and cannot start again")]
    Disposed,
    /// The session is being released here; wait and re-place it.
    #[error("releasing: the session is being released")]
    Releasing,
    /// Not enough admission weight left.
    #[error("no_capacity: needs {needed}, {free} free")]
    NoCapacity { needed: u32, free: u32 },
    /// Another holder has the residency (or the bind named another epoch). The epoch is the
    /// other holder's when it could be read, never this Host's.
    #[error("epoch_mismatch: the residency is at epoch {}", epoch_note(.current_lease_epoch))]
    EpochMismatch { current_lease_epoch: Option<u64> },
    /// This Host runs another build (or agent) than the session needs.
    #[error("runtime_mismatch: this Host runs {runtime_compatibility_id}")]
    RuntimeMismatch { runtime_compatibility_id: String },
    /// This Host cannot run this session (deliberately uninformative to clients).
    #[error("runtime_unavailable: {0}")]
    RuntimeUnavailable(String),
    /// The request itself is invalid.
    #[error("invalid: {0}")]
    Invalid(String),
    /// Anything else (retry is safe): not a placement outcome, so it has no code. `step`
    /// names where an attach failed (`lease`, `fence`, `hydrate`, `launch`, `register`) when
    /// it is known; `unreleased` names what the unwound attach could not give back.
    #[error("internal{}: {reason}{}", step_note(.step), unreleased_note(.unreleased))]
    Internal {
        step: Option<&'static str>,
        reason: String,
        unreleased: Vec<String>,
    },
    /// A refusal (with its code, kept) after which the unwound attach could not give
    /// everything back: the code still tells the controller what to do, `unreleased` tells
    /// the operator what is left over.
    #[error("{refusal}{}", unreleased_note(.unreleased))]
    Unwound {
        refusal: Box<HostError>,
        unreleased: Vec<String>,
    },
}

fn step_note(step: &Option<&'static str>) -> String {
    step.map(|s| format!(" at {s}")).unwrap_or_default()
}

fn epoch_note(e: &Option<u64>) -> String {
    e.map_or_else(|| "(unreadable)".to_string(), |e| e.to_string())
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
            HostError::Disposed => Some("disposed"),
            HostError::Releasing => Some("releasing"),
            HostError::NoCapacity { .. } => Some("no_capacity"),
            HostError::EpochMismatch { .. } => Some("epoch_mismatch"),
            HostError::RuntimeMismatch { .. } => Some("runtime_mismatch"),
            HostError::RuntimeUnavailable(_) => Some("runtime_unavailable"),
            HostError::Invalid(_) => Some("invalid"),
            HostError::Internal { .. } => None,
            HostError::Unwound { refusal, .. } => refusal.code(),
        }
    }

    /// Where an attach failed, when it failed inside the Host rather than being refused.
    pub fn step(&self) -> Option<&'static str> {
        match self {
            HostError::Internal { step, .. } => *step,
            HostError::Unwound { refusal, .. } => refusal.step(),
            _ => None,
        }
    }

    /// What an unwound attach could not give back (empty when everything was).
    pub fn unreleased(&self) -> &[String] {
        match self {
            HostError::Internal { unreleased, .. } | HostError::Unwound { unreleased, .. } => {
                unreleased
            }
            _ => &[],
        }
    }

    pub(crate) fn internal(reason: impl Into<String>) -> HostError {
        HostError::Internal {
            step: None,
            reason: reason.into(),
            unreleased: Vec::new(),
        }
    }

    /// Names the attach step of an internal failure that does not name one yet; a refusal
    /// is returned as it is (its code says what happened).
    pub(crate) fn at(self, at: &'static str) -> HostError {
        match self {
            HostError::Internal {
                step: None,
                reason,
                unreleased,
            } => HostError::Internal {
                step: Some(at),
                reason,
                unreleased,
            },
            other => other,
        }
    }

    /// Adds what an unwound attach could not give back, keeping a refusal's code.
    pub(crate) fn with_unreleased(self, more: Vec<String>) -> HostError {
        if more.is_empty() {
            return self;
        }
        match self {
            HostError::Internal {
                step,
                reason,
                mut unreleased,
            } => {
                unreleased.extend(more);
                HostError::Internal {
                    step,
                    reason,
                    unreleased,
                }
            }
            HostError::Unwound {
                refusal,
                mut unreleased,
            } => {
                unreleased.extend(more);
                HostError::Unwound {
                    refusal,
                    unreleased,
                }
            }
            refusal => HostError::Unwound {
                refusal: Box::new(refusal),
                unreleased: more,
            },
        }
    }
}

impl From<sessionstore::StoreError> for HostError {
    fn from(e: sessionstore::StoreError) -> Self {
        HostError::internal(format!("store: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::HostError;

    #[test]
    fn a_refusal_whose_unwind_left_something_keeps_its_code_and_names_what_is_left() {
        let e = HostError::EpochMismatch {
            current_lease_epoch: Some(7),
        }
        .with_unreleased(vec!["residency lease: store closed".into()]);
        assert_eq!(e.code(), Some("epoch_mismatch"));
        assert_eq!(
            e.unreleased(),
            ["residency lease: store closed".to_string()]
        );
        assert!(
            e.to_string().contains("not released: residency lease"),
            "{e}"
        );
        // Nothing left over: the refusal is returned unchanged.
        assert_eq!(
            HostError::Releasing.with_unreleased(Vec::new()),
            HostError::Releasing
        );
    }

    #[test]
    fn an_internal_failure_names_the_first_step_it_was_placed_at_and_has_no_code() {
        let e = HostError::internal("disk on fire")
            .at("launch")
            .at("register");
        assert_eq!(e.step(), Some("launch"));
        assert_eq!(e.code(), None);
        assert_eq!(e.to_string(), "internal at launch: disk on fire");
        // A refusal is not given a step: its code says what happened.
        assert_eq!(HostError::Releasing.at("lease").step(), None);
    }
}
