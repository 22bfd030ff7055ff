//! The exit statuses `hostd`'s client commands end with, and the coded errors that choose
//! them. Owns the mapping from an error anywhere in a chain (ours, the store's, the
//! controller's, the HostLink client's) to a stable code and a status; never prints (the
//! output module does).
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done (a command: applied) |
//! | 1 | refused or failed before anything was admitted (nothing to retry carefully) |
//! | 2 | the command line itself is wrong (usage) |
//! | 3 | the command ended without being applied (`rejected`, `not_applied`, `expired`): its outcome is known |
//! | 4 | the command was admitted, its outcome is not yet known: resend it with `--command-id` |

use std::process::ExitCode;

use controller::ControllerError;
use controller::client::ClientError;
use sessionstore::StoreError;

/// Refused or failed, nothing admitted.
pub const FAILED: u8 = 1;
/// The command line is wrong.
pub const USAGE: u8 = 2;
/// The command ended without being applied.
pub const NOT_APPLIED: u8 = 3;
/// Admitted; its outcome is not yet known.
pub const ADMITTED_PENDING: u8 = 4;

/// An error of `hostd`'s own, with the stable code a script can match.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Refused before anything was read or admitted.
    #[error("{message}")]
    Refused { code: &'static str, message: String },
    /// The command line asks for something the command cannot do (code `usage`, status 2,
    /// as for a command line clap refuses).
    #[error("{message}")]
    Usage { message: String },
    /// A command was admitted but its outcome is not known yet: the Host has not applied it
    /// (yet). It stays in the session's inbox; resending it with the same command id is
    /// idempotent and waits for its outcome.
    #[error(
        "command {command} admitted, not yet applied: {cause}. It stays in the session's inbox \
         until a Host applies it or its deadline passes; to wait for its outcome, resend it \
         (idempotent, never applied twice): {resend}"
    )]
    AdmittedPending {
        command: String,
        cause: String,
        resend: String,
    },
    /// A command ended without being applied.
    #[error("command {command} ended {state}{reason}")]
    NotApplied {
        command: String,
        state: String,
        reason: String,
    },
}

impl CliError {
    pub fn refused(code: &'static str, message: impl Into<String>) -> CliError {
        CliError::Refused {
            code,
            message: message.into(),
        }
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage {
            message: message.into(),
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            CliError::Refused { code, .. } => code,
            CliError::Usage { .. } => "usage",
            CliError::AdmittedPending { .. } => "admitted_not_applied",
            CliError::NotApplied { .. } => "not_applied",
        }
    }

    pub fn status(&self) -> u8 {
        match self {
            CliError::Refused { .. } => FAILED,
            CliError::Usage { .. } => USAGE,
            CliError::AdmittedPending { .. } => ADMITTED_PENDING,
            CliError::NotApplied { .. } => NOT_APPLIED,
        }
    }

    /// The command id this error is about, if any.
    pub fn command_id(&self) -> Option<&str> {
        match self {
            CliError::Refused { .. } | CliError::Usage { .. } => None,
            CliError::AdmittedPending { command, .. } | CliError::NotApplied { command, .. } => {
                Some(command)
            }
        }
    }
}

/// How an error ends the process: its code, its status and the command id it concerns.
pub struct Classified<'a> {
    pub code: &'a str,
    pub status: u8,
    pub command_id: Option<&'a str>,
}

/// The first coded error in the chain decides; anything else is `error` with status 1.
pub fn classify(e: &anyhow::Error) -> Classified<'_> {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CliError>() {
            return Classified {
                code: c.code(),
                status: c.status(),
                command_id: c.command_id(),
            };
        }
        if let Some(s) = cause.downcast_ref::<StoreError>() {
            return failed(s.code().as_str());
        }
        if let Some(c) = cause.downcast_ref::<ControllerError>() {
            return failed(controller_code(c));
        }
        if let Some(c) = cause.downcast_ref::<ClientError>() {
            return failed(c.code());
        }
    }
    failed("error")
}

fn failed(code: &str) -> Classified<'_> {
    Classified {
        code,
        status: FAILED,
        command_id: None,
    }
}

/// A controller error's stable code.
pub fn controller_code(e: &ControllerError) -> &'static str {
    match e {
        ControllerError::Store(s) => s.code().as_str(),
        ControllerError::Link(c) => c.code(),
        ControllerError::Refused(r) => r.code().as_str(),
        ControllerError::NoHost(_) => "no_host",
        ControllerError::Journal(_) => "journal",
        ControllerError::Invalid(_) => "invalid",
    }
}

/// The process exit code for a status.
pub fn code(status: u8) -> ExitCode {
    ExitCode::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_admitted_command_of_unknown_outcome_has_its_own_status_and_carries_its_id() {
        let e = anyhow::Error::from(CliError::AdmittedPending {
            command: "input-1".into(),
            cause: "no Host answers".into(),
            resend: "hostd session send s 'x' --command-id input-1".into(),
        })
        .context("sending");
        let c = classify(&e);
        assert_eq!(c.status, ADMITTED_PENDING);
        assert_eq!(c.code, "admitted_not_applied");
        assert_eq!(c.command_id, Some("input-1"));
        assert_ne!(ADMITTED_PENDING, FAILED);
        assert_ne!(ADMITTED_PENDING, NOT_APPLIED);
    }

    #[test]
    fn an_error_without_a_code_is_a_plain_failure() {
        let plain = anyhow::anyhow!("something");
        let c = classify(&plain);
        assert_eq!((c.code, c.status), ("error", FAILED));
        let coded = anyhow::Error::from(CliError::refused("not_found", "no session"));
        let c = classify(&coded);
        assert_eq!((c.code, c.status), ("not_found", FAILED));
    }
}
