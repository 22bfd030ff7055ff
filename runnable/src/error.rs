//! The typed refusals of runnables, each with a stable machine-readable code; the
//! declaration problems a load reports all at once (file, line, column, code), with how the
//! YAML reader's problems map onto them; and the violations an input or output check lists.
//!
//! This module owns the vocabulary of refusal only. It must never decide anything, and no
//! caller may branch on the human text: branch on [`RunnableError::code`],
//! [`DeclarationProblem::code`] or [`Violation::rule`].

use std::fmt;
use std::path::{Path, PathBuf};

use strict_yaml::read::{Problem, ProblemKind};

/// One problem in one declaration file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeclarationProblem {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is about the file as a whole (unreadable, missing).
    pub line: usize,
    pub column: usize,
    /// A stable code, `declaration.<class>`.
    pub code: &'static str,
    /// The key path the problem is at (`input.properties.qty`), empty for the file itself.
    pub path: String,
    pub message: String,
}

impl fmt::Display for DeclarationProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        write!(f, ": [{}] ", self.code)?;
        if !self.path.is_empty() {
            write!(f, "`{}`: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl DeclarationProblem {
    /// A problem the YAML reader found in `file`, under the declaration's code for its kind
    /// and in the declaration's words.
    pub(crate) fn read(file: &Path, problem: Problem) -> DeclarationProblem {
        let (code, message) = match &problem.kind {
            ProblemKind::WrongType { .. } => (codes::WRONG_TYPE, problem.message()),
            ProblemKind::UnknownKey { .. } => (codes::UNKNOWN_KEY, problem.message()),
            ProblemKind::MissingKey { .. } => (codes::MISSING_KEY, problem.message()),
            ProblemKind::Duration { text, reason } => (
                codes::INVALID_VALUE,
                format!("`{text}` is not a positive duration like 500ms, 30s or 2m ({reason})"),
            ),
            ProblemKind::Format { code, message } => (*code, message.clone()),
        };
        DeclarationProblem {
            file: file.to_path_buf(),
            line: problem.line,
            column: problem.column,
            code,
            path: problem.path,
            message,
        }
    }
}

/// The declaration problem classes (the `code` of a [`DeclarationProblem`]).
pub mod codes {
    /// The file cannot be read, or a runnable folder has no `runnable.yaml`.
    pub const UNREADABLE: &str = "declaration.unreadable";
    /// Not YAML, a duplicate key, an unsupported tag.
    pub const SYNTAX: &str = "declaration.syntax";
    /// A key the format does not have, at any depth.
    pub const UNKNOWN_KEY: &str = "declaration.unknown_key";
    /// A required key is absent.
    pub const MISSING_KEY: &str = "declaration.missing_key";
    /// A value of the wrong YAML type (a list where a mapping belongs, a null for a list).
    pub const WRONG_TYPE: &str = "declaration.wrong_type";
    /// A value of the right type that breaks a rule (a bad name, `effect: safe`, `timeout: 0s`).
    pub const INVALID_VALUE: &str = "declaration.invalid_value";
    /// A schema keyword outside the bounded profile (`oneOf`, `$ref`, `pattern`, …).
    pub const SCHEMA_KEYWORD: &str = "declaration.schema_keyword";
    /// A schema that breaks a structural rule (`required` naming an undeclared property, an
    /// array without `items`, a node without `type`).
    pub const SCHEMA_STRUCTURE: &str = "declaration.schema_structure";
    /// Two dependencies that map to one environment variable.
    pub const ENV_COLLISION: &str = "declaration.env_collision";
    /// A path that leaves the runnable's folder (`..`, absolute, a symlink out).
    pub const PATH_ESCAPE: &str = "declaration.path_escape";
    /// Two declarations of one `name@version` in one workspace.
    pub const DUPLICATE: &str = "declaration.duplicate";
}

/// One way a value breaks a schema.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Violation {
    /// Where: `$` for the value itself, else a path like `items[2].qty`.
    pub path: String,
    /// The rule broken: `type`, `required`, `null`, `additional`, `enum`, `minimum`,
    /// `maximum`, `min_length`, `max_length`, `min_items`, `max_items`, `more`.
    pub rule: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: [{}] {}", self.path, self.rule, self.message)
    }
}

/// A handler's own failure statement.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandlerError {
    pub code: String,
    pub message: String,
}

/// Every refusal of the runnable subsystem.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RunnableError {
    /// One or more declarations do not load; every problem is listed.
    #[error("{} declaration problem(s):\n{}", problems.len(), problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
    Declaration { problems: Vec<DeclarationProblem> },

    /// The folder given is not usable as a workspace.
    #[error("{path}: {reason}")]
    Workspace { path: PathBuf, reason: String },

    /// A reference that does not parse.
    #[error("`{reference}`: {reason}")]
    BadReference { reference: String, reason: String },

    /// Nothing matches the reference.
    #[error("no runnable `{reference}`{}", if available.is_empty() { String::new() } else { format!("; releases of that name: {}", available.join(", ")) })]
    NotFound {
        reference: String,
        available: Vec<String>,
    },

    /// More than one release matches and nothing chooses between them.
    #[error("`{reference}` names {} releases; choose one with name@version: {}", candidates.len(), candidates.join(", "))]
    Ambiguous {
        reference: String,
        candidates: Vec<String>,
    },

    /// The same identity with a different digest.
    #[error(
        "{identity} is already recorded with digest {recorded}; this content has digest {offered}. A version is an immutable release: give the changed content a new version"
    )]
    Conflict {
        identity: String,
        recorded: String,
        offered: String,
    },

    /// Bytes that do not match the digest that names them.
    #[error("integrity: {what}: {reason}")]
    Integrity { what: String, reason: String },

    /// A build that would change or follow something it must not.
    #[error("{path}: {reason}")]
    Build { path: PathBuf, reason: String },

    /// The input breaks the input schema; every violation is listed.
    #[error("the input of {identity} is invalid:\n{}", violations.iter().map(|v| format!("  {v}")).collect::<Vec<_>>().join("\n"))]
    InvalidInput {
        identity: String,
        violations: Vec<Violation>,
    },

    /// A dependency that cannot be given an address now.
    #[error("{identity}: dependency {dependency}: {reason}")]
    Dependency {
        identity: String,
        dependency: String,
        reason: String,
    },

    /// The handler could not be started (nothing ran).
    #[error("{identity}: cannot start `{command}`: {reason}")]
    Spawn {
        identity: String,
        command: String,
        reason: String,
    },

    /// A runnable that cannot be offered as an agent tool.
    #[error("{identity} cannot be a tool: {reason}")]
    NotATool { identity: String, reason: String },

    /// A file or folder operation failed.
    #[error("{path}: {reason}")]
    Io { path: PathBuf, reason: String },
}

impl RunnableError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            RunnableError::Declaration { .. } => "invalid",
            RunnableError::Workspace { .. } => "workspace",
            RunnableError::BadReference { .. } => "bad_reference",
            RunnableError::NotFound { .. } => "not_found",
            RunnableError::Ambiguous { .. } => "ambiguous",
            RunnableError::Conflict { .. } => "conflict",
            RunnableError::Integrity { .. } => "integrity",
            RunnableError::Build { .. } => "build",
            RunnableError::InvalidInput { .. } => "invalid_input",
            RunnableError::Dependency { .. } => "unresolved_dependency",
            RunnableError::Spawn { .. } => "spawn",
            RunnableError::NotATool { .. } => "not_a_tool",
            RunnableError::Io { .. } => "io",
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, e: impl fmt::Display) -> RunnableError {
        RunnableError::Io {
            path: path.into(),
            reason: e.to_string(),
        }
    }

    /// A machine-readable document of this refusal (`{"code", "message", ...details}`).
    pub fn to_json(&self) -> serde_json::Value {
        let mut doc = serde_json::json!({
            "code": self.code(),
            "message": self.to_string(),
        });
        let extra = match self {
            RunnableError::Declaration { problems } => {
                serde_json::json!({ "problems": problems })
            }
            RunnableError::NotFound { available, .. } => {
                serde_json::json!({ "available": available })
            }
            RunnableError::Ambiguous { candidates, .. } => {
                serde_json::json!({ "candidates": candidates })
            }
            RunnableError::Conflict {
                recorded, offered, ..
            } => serde_json::json!({ "recorded": recorded, "offered": offered }),
            RunnableError::InvalidInput { violations, .. } => {
                serde_json::json!({ "violations": violations })
            }
            _ => serde_json::json!({}),
        };
        if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                d.insert(k.clone(), v.clone());
            }
        }
        doc
    }
}
