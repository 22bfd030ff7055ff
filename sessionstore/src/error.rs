//! Store errors. Owns the one error type every store call returns and its stable codes; callers
//! branch on [`ErrorCode`], never on message text. Never carries bodies or secrets.

use wire_enum::{UnknownValue, wire_enum};

/// The store URLs an `unsupported_store` refusal names as accepted, as an operator would type
/// them. Which URL is which store is the rule of `location` (`StoreLocation::parse`); this is
/// only the text the refusal shows.
pub const STORE_SCHEMES: &str = "sqlite://PATH, postgres://… or postgresql://…, or a plain path";

wire_enum! {
    /// A stable, machine-readable error code.
    pub enum ErrorCode {
        NotFound = "not_found",
        Conflict = "conflict",
        Epoch = "epoch",
        ClaimHeld = "claim_held",
        ClaimLost = "claim_lost",
        Deadline = "deadline",
        Terminal = "terminal",
        State = "state",
        CommandMismatch = "command_mismatch",
        Evidence = "evidence",
        Unroutable = "unroutable",
        Invalid = "invalid",
        Integrity = "integrity",
        Unavailable = "unavailable",
        UnsupportedStore = "unsupported_store",
    }
    kind = "error_code";
}

/// Every refusal and failure of the session store.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The named record does not exist (for this tenant).
    #[error("not_found: {entity} {key}")]
    NotFound { entity: &'static str, key: String },

    /// A conditional write lost a race; `current` is the record's revision now.
    #[error("conflict: {entity} revision is {current}, expected {expected}")]
    Conflict {
        entity: &'static str,
        expected: u64,
        current: u64,
    },

    /// A write under a strictly lower epoch than the record's mark.
    #[error("epoch: {field} mark is {mark}, the write carried {offered}")]
    Epoch {
        field: &'static str,
        mark: u64,
        offered: u64,
    },

    /// A live claim (or lease) is held by someone else.
    #[error("claim_held: {field} is held at epoch {epoch} until {expires_at_ms} ms")]
    ClaimHeld {
        field: &'static str,
        epoch: u64,
        expires_at_ms: i64,
    },

    /// The caller's claim (or lease) lapsed or was taken over.
    #[error("claim_lost: {field}: {reason}")]
    ClaimLost {
        field: &'static str,
        reason: &'static str,
    },

    /// The command's apply deadline has passed.
    #[error("deadline: apply deadline {deadline_ms} ms has passed")]
    Deadline { deadline_ms: i64 },

    /// The record is terminal and cannot move.
    #[error("terminal: command is {state}")]
    Terminal { state: String },

    /// The transition is not allowed from the record's state.
    #[error("state: {entity} is {state}: {reason}")]
    State {
        entity: &'static str,
        state: String,
        reason: String,
    },

    /// An admission retry differs from the recorded command.
    #[error("command_mismatch: {field} differs from the recorded command")]
    CommandMismatch { field: &'static str },

    /// The runtime's journal holds no (or no single, matching) disposition for the attempt.
    #[error("evidence: {reason}")]
    Evidence { reason: String },

    /// No evidence reader is routed for the session's storage binding.
    #[error("unroutable: no journal is routed for storage binding {storage_binding}")]
    Unroutable { storage_binding: String },

    /// Input refused at the edge.
    #[error("invalid: {field} {reason}")]
    Invalid { field: &'static str, reason: String },

    /// Stored data failed verification (corrupt row, digest mismatch, undecodable record).
    #[error("integrity: {entity}: {reason}")]
    Integrity {
        entity: &'static str,
        reason: String,
    },

    /// The store cannot be reached or is closed. `transient` when the failure is of the kind
    /// that passes on its own (a reset or refused connection, the server shutting down or
    /// restarting, a serialization failure or deadlock, a pool timeout, a busy SQLite file): the
    /// same operation may be tried again. A closed store, a full disk or an I/O error on the
    /// database file are not transient.
    #[error("unavailable: {reason}")]
    Unavailable { reason: String, transient: bool },

    /// The store URL names no backend this build has (`given` is its scheme, never the
    /// whole URL).
    #[error("unsupported_store: `{given}` is not a store; give {}", STORE_SCHEMES)]
    UnsupportedStore { given: String },
}

impl StoreError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::NotFound { .. } => ErrorCode::NotFound,
            StoreError::Conflict { .. } => ErrorCode::Conflict,
            StoreError::Epoch { .. } => ErrorCode::Epoch,
            StoreError::ClaimHeld { .. } => ErrorCode::ClaimHeld,
            StoreError::ClaimLost { .. } => ErrorCode::ClaimLost,
            StoreError::Deadline { .. } => ErrorCode::Deadline,
            StoreError::Terminal { .. } => ErrorCode::Terminal,
            StoreError::State { .. } => ErrorCode::State,
            StoreError::CommandMismatch { .. } => ErrorCode::CommandMismatch,
            StoreError::Evidence { .. } => ErrorCode::Evidence,
            StoreError::Unroutable { .. } => ErrorCode::Unroutable,
            StoreError::Invalid { .. } => ErrorCode::Invalid,
            StoreError::Integrity { .. } => ErrorCode::Integrity,
            StoreError::Unavailable { .. } => ErrorCode::Unavailable,
            StoreError::UnsupportedStore { .. } => ErrorCode::UnsupportedStore,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        StoreError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    pub(crate) fn integrity(entity: &'static str, reason: impl Into<String>) -> Self {
        StoreError::Integrity {
            entity,
            reason: reason.into(),
        }
    }

    pub(crate) fn unavailable(reason: impl Into<String>) -> Self {
        StoreError::Unavailable {
            reason: reason.into(),
            transient: false,
        }
    }

    pub(crate) fn transient(reason: impl Into<String>) -> Self {
        StoreError::Unavailable {
            reason: reason.into(),
            transient: true,
        }
    }

    /// True when the same operation may succeed if tried again shortly: only a transient
    /// `unavailable`. Every other error is definite.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable {
                transient: true,
                ..
            }
        )
    }

    pub(crate) fn not_found(entity: &'static str, key: impl Into<String>) -> Self {
        StoreError::NotFound {
            entity,
            key: key.into(),
        }
    }

    pub(crate) fn state(
        entity: &'static str,
        state: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        StoreError::State {
            entity,
            state: state.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn evidence(reason: impl Into<String>) -> Self {
        StoreError::Evidence {
            reason: reason.into(),
        }
    }

    /// The fencing mark carried by an `epoch` error, if this is one.
    pub fn mark(&self) -> Option<u64> {
        match self {
            StoreError::Epoch { mark, .. } => Some(*mark),
            StoreError::ClaimHeld { epoch, .. } => Some(*epoch),
            _ => None,
        }
    }
}

/// A row holding a text that names no value of its enum: the store's data is not what this
/// build wrote (`integrity`).
impl From<UnknownValue> for StoreError {
    fn from(e: UnknownValue) -> Self {
        StoreError::integrity(e.kind, format!("unknown value {:?}", e.value))
    }
}

/// Shorthand for store results.
pub type StoreResult<T> = Result<T, StoreError>;
