//! Operator credentials for the console, kept apart from tenant credentials: a tenant token
//! opens nothing here. Owns the credential file format, the roles and the check of a presented
//! token (SHA-256 digests only, compared in constant time against every entry, so the time
//! taken says nothing about which entry or whether any matched).
//!
//! ## Credential file
//!
//! One operator per line: `<name> <role> <sha256hex>`, separated by spaces or tabs; blank
//! lines and lines starting with `#` are ignored. `<name>` is 1–64 characters of letters,
//! digits, `-`, `_` and `.`; `<role>` is `read` (sees everything, changes nothing) or
//! `operate` (also answers gates, acts on runs and drains this Host); `<sha256hex>` is the
//! 64-digit hex SHA-256 of the token's UTF-8 bytes. A name listed twice, a digest listed twice
//! or a line that does not parse is refused with its line number.

use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use wire_enum::wire_enum;

wire_enum! {
    /// What an operator may do, as the credential file and the API spell it.
    pub enum Role {
        /// Sees every view; changes nothing.
        Read = "read",
        /// Also answers gates, retries or skips runs, and drains this Host.
        Operate = "operate",
    }
    kind = "role";
    serde;
}

/// An authenticated operator.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Operator {
    pub name: String,
    pub role: Role,
}

impl Operator {
    /// How the operator is named where an action is attributed (a command's principal, a
    /// run answer's answerer).
    pub fn principal(&self) -> String {
        format!("operator:{}", self.name)
    }
}

/// Why the credential file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialFileError {
    #[error("console credentials {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("console credentials {path}: line {line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("console credentials {path}: no operator is listed")]
    Empty { path: String },
}

impl CredentialFileError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            CredentialFileError::Read { .. } => "console_credentials_unreadable",
            CredentialFileError::Line { .. } => "console_credentials_invalid",
            CredentialFileError::Empty { .. } => "console_credentials_empty",
        }
    }
}

struct Entry {
    operator: Operator,
    digest: [u8; 32],
}

/// The operators allowed in, by digest.
pub struct Operators {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Operators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operators")
            .field("count", &self.entries.len())
            .finish()
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl Operators {
    /// Reads the credential file at `path`.
    pub fn load(path: &Path) -> Result<Operators, CredentialFileError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CredentialFileError::Read {
            path: name.clone(),
            source,
        })?;
        Operators::parse(&name, &text)
    }

    /// Parses credential file text (`path` names it in refusals).
    pub fn parse(path: &str, text: &str) -> Result<Operators, CredentialFileError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |reason: &str| CredentialFileError::Line {
                path: path.to_owned(),
                line: i + 1,
                reason: reason.to_owned(),
            };
            let parts: Vec<&str> = line.split_whitespace().collect();
            let [name, role, digest] = parts[..] else {
                return Err(bad("expected `<name> <role> <sha256hex>`"));
            };
            if !valid_name(name) {
                return Err(bad(
                    "the name must be 1-64 letters, digits, '-', '_' or '.'",
                ));
            }
            let role =
                Role::from_wire(role).map_err(|_| bad("the role must be read or operate"))?;
            let bytes = hex::decode(digest)
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| bad("the digest must be 64 hex digits (SHA-256)"))?;
            if entries.iter().any(|e| e.operator.name == name) {
                return Err(bad("this name is already listed"));
            }
            if entries.iter().any(|e| e.digest == bytes) {
                return Err(bad("this digest is already listed"));
            }
            entries.push(Entry {
                operator: Operator {
                    name: name.to_owned(),
                    role,
                },
                digest: bytes,
            });
        }
        if entries.is_empty() {
            return Err(CredentialFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Operators { entries })
    }

    /// The operator `token` belongs to. Every entry is compared, in constant time.
    pub fn check(&self, token: &str) -> Option<Operator> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for e in &self.entries {
            if bool::from(presented.ct_eq(&e.digest)) {
                found = Some(e.operator.clone());
            }
        }
        found
    }
}

/// One credential file line for `name` with `role` and the digest of its token.
pub fn credential_line(name: &str, role: Role, digest_hex: &str) -> String {
    format!("{name} {} {digest_hex}", role.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest(token: &str) -> String {
        hex::encode(Sha256::digest(token.as_bytes()))
    }

    #[test]
    fn a_listed_token_names_its_operator_and_role_and_anything_else_is_nobody() {
        let text = format!(
            "# operators\n\nalice operate {}\nbob\tread {}\n",
            digest("a-token"),
            digest("b-token")
        );
        let ops = Operators::parse("f", &text).unwrap();
        assert_eq!(
            ops.check("a-token"),
            Some(Operator {
                name: "alice".into(),
                role: Role::Operate
            })
        );
        assert_eq!(ops.check("b-token").map(|o| o.role), Some(Role::Read));
        assert_eq!(ops.check("c-token"), None);
        assert_eq!(ops.check(""), None);
        assert_eq!(ops.check("a-token").unwrap().principal(), "operator:alice");
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number_and_a_stable_code() {
        let d = digest("x");
        for (text, line) in [
            (format!("alice operate {d}\nbob admin {d}"), 2),
            (format!("alice operate {d}\nalice read {}", digest("y")), 2),
            (format!("alice operate {d}\nbob read {d}"), 2),
            ("alice operate abc".to_string(), 1),
            (format!("\n\nal ice operate {d}"), 3),
            (format!("al/ice operate {d}"), 1),
        ] {
            let e = Operators::parse("f", &text).err().unwrap();
            assert_eq!(e.code(), "console_credentials_invalid", "{text}");
            assert!(e.to_string().contains(&format!("line {line}")), "{e}");
        }
        let e = Operators::parse("f", "# nobody\n").err().unwrap();
        assert_eq!(e.code(), "console_credentials_empty");
    }
}
