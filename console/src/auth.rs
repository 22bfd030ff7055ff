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
//!
//! In place of the digest a line may say `jwt <kind> <key-file> [option=value ...]`, as a
//! tenant's line does (`hostlink::auth`): the operator then presents a JWT connection token
//! whose `sub` is the operator's name and which carries **no** tenant claim (so no tenant's
//! token opens the console, even one signed with the same key). A relative key file is read
//! from the credential file's folder.

use std::path::Path;

use hostlink::auth::parse_jwt_line;
use hostlink::jwt::{JwtVerifier, looks_like_jwt, unix_now};

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
    credential: Credential,
}

enum Credential {
    Digest([u8; 32]),
    Jwt(Box<JwtVerifier>),
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
        Operators::parse_in(&name, &text, path.parent())
    }

    /// Parses credential file text (`path` names it in refusals); a relative key file is read
    /// from the working folder.
    pub fn parse(path: &str, text: &str) -> Result<Operators, CredentialFileError> {
        Operators::parse_in(path, text, None)
    }

    /// Parses credential file text, reading relative key files from `base`.
    pub fn parse_in(
        path: &str,
        text: &str,
        base: Option<&Path>,
    ) -> Result<Operators, CredentialFileError> {
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
            let (name, role, rest) = match parts[..] {
                [name, role, ref rest @ ..] if !rest.is_empty() => (name, role, rest),
                _ => return Err(bad("expected `<name> <role> <sha256hex>`")),
            };
            if !valid_name(name) {
                return Err(bad(
                    "the name must be 1-64 letters, digits, '-', '_' or '.'",
                ));
            }
            let role =
                Role::from_wire(role).map_err(|_| bad("the role must be read or operate"))?;
            let credential = match rest {
                ["jwt", fields @ ..] => Credential::Jwt(Box::new(
                    parse_jwt_line(fields.iter().copied(), base).map_err(|r| bad(&r))?,
                )),
                [digest] => {
                    let bytes = hex::decode(digest)
                        .ok()
                        .and_then(|b| <[u8; 32]>::try_from(b).ok())
                        .ok_or_else(|| bad("the digest must be 64 hex digits (SHA-256)"))?;
                    if entries
                        .iter()
                        .any(|e| matches!(e.credential, Credential::Digest(d) if d == bytes))
                    {
                        return Err(bad("this digest is already listed"));
                    }
                    Credential::Digest(bytes)
                }
                _ => {
                    return Err(bad(
                        "expected `<name> <role> <sha256hex>` or `<name> <role> jwt <kind> <key-file> ...`",
                    ));
                }
            };
            if entries.iter().any(|e| e.operator.name == name) {
                return Err(bad("this name is already listed"));
            }
            entries.push(Entry {
                operator: Operator {
                    name: name.to_owned(),
                    role,
                },
                credential,
            });
        }
        if entries.is_empty() {
            return Err(CredentialFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Operators { entries })
    }

    /// The operator `token` belongs to. Every digest entry is compared, in constant time; a
    /// JWT is checked against the entries with a key, and must name the operator as `sub`.
    pub fn check(&self, token: &str) -> Option<Operator> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let jwt = looks_like_jwt(token);
        let now = unix_now();
        let mut found = None;
        for e in &self.entries {
            let matched = match &e.credential {
                Credential::Digest(d) => bool::from(presented.ct_eq(d)),
                Credential::Jwt(v) => {
                    jwt && v
                        .verify_untenanted(token, now)
                        .is_ok_and(|grant| grant.subject == e.operator.name)
                }
            };
            if matched {
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

    #[test]
    fn an_operator_line_may_take_jwts_naming_the_operator_and_no_tenant() {
        use hostlink::jwt::{JwtAlgorithm, SigningKey};
        let dir = std::env::temp_dir().join(format!("console-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("ops.secret");
        std::fs::write(&secret, "the operators' shared secret, long enough").unwrap();
        let text = format!(
            "carol operate jwt hs256 ops.secret aud=console\ndave read {}\n",
            digest("d-token")
        );
        let ops = Operators::parse_in("f", &text, Some(&dir)).unwrap();
        let key = SigningKey::from_file(JwtAlgorithm::Hs256, &secret, None).unwrap();
        // A tenant's token (it carries a tenant claim) opens nothing, even signed right.
        let tenant_token = key
            .mint("acme", "carol", 60, Some("console"), None)
            .unwrap();
        assert_eq!(ops.check(&tenant_token), None);
        assert_eq!(
            ops.check("d-token").map(|o| o.name),
            Some("dave".to_owned())
        );
        let signed = |sub: &str, aud: &str| {
            let claims = serde_json::json!({"sub": sub, "aud": aud, "exp": unix_now() + 60});
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &claims,
                &jsonwebtoken::EncodingKey::from_secret(
                    b"the operators' shared secret, long enough",
                ),
            )
            .unwrap()
        };
        let carol = ops.check(&signed("carol", "console")).unwrap();
        assert_eq!((carol.name.as_str(), carol.role), ("carol", Role::Operate));
        assert_eq!(
            ops.check(&signed("dave", "console")),
            None,
            "sub must be the line's name"
        );
        assert_eq!(
            ops.check(&signed("carol", "elsewhere")),
            None,
            "the audience is checked"
        );
        assert!(Operators::parse_in("f", "erin read jwt hs256 missing", Some(&dir)).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
