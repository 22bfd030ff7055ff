//! Tenant authentication for HostLink. Owns the [`AuthVerifier`] seam, the default
//! [`CredentialStore`] (tenant credentials kept only as SHA-256 digests, compared in constant
//! time) and minting a credential for a first start. Never logs, stores or returns a
//! presented token, and never says whether a refusal was an unknown tenant or a wrong token.
//!
//! ## Credential file
//!
//! One credential per line: `<tenant> <sha256hex>`, separated by spaces or tabs; blank lines
//! and lines starting with `#` are ignored. `<tenant>` is percent-encoded (`%20` for a space,
//! `%25` for `%`, `%23` for a leading `#`), so every valid tenant id can be written;
//! `<sha256hex>` is the 64-digit hex SHA-256 of the token's UTF-8 bytes. A tenant listed
//! twice, or a line that does not parse, is refused with its line number.
//!
//! ## Environment variable
//!
//! [`CREDENTIALS_ENV`] (`HOST_TENANT_CREDENTIALS`) holds `tenant=sha256hex` entries separated
//! by commas (spaces around entries ignored), the tenant percent-encoded as above (`%2C` for
//! `,`, `%3D` for `=`). Entries are numbered from 1 in refusals.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sessionstore::TenantId;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// The environment variable the default credential store reads.
pub const CREDENTIALS_ENV: &str = "HOST_TENANT_CREDENTIALS";

/// A refused credential. Deliberately says nothing more.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("the tenant credential was refused")]
pub struct AuthRefused;

/// Verifies the credential a link presents for the tenant in its path.
#[async_trait]
pub trait AuthVerifier: Send + Sync {
    /// `Ok` when `token` acts for `tenant`; an unknown tenant and a wrong token are the same
    /// refusal.
    async fn verify(&self, tenant: &TenantId, token: &str) -> Result<(), AuthRefused>;
}

/// Why a credential source could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("credential source {source_name}: entry {entry}: {reason}")]
    Entry {
        source_name: String,
        entry: usize,
        reason: String,
    },
    #[error(
        "credential source {source_name}: entry {entry}: the tenant is already listed (entry {first} of {first_source})"
    )]
    Duplicate {
        source_name: String,
        entry: usize,
        first_source: String,
        first: usize,
    },
    #[error("credential file {path}: {error}")]
    Io { path: String, error: std::io::Error },
}

/// Tenant credentials as SHA-256 digests.
pub struct CredentialStore {
    digests: HashMap<TenantId, [u8; 32]>,
    origins: HashMap<TenantId, (String, usize)>,
}

impl fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialStore")
            .field("tenants", &self.digests.len())
            .finish()
    }
}

/// A digest no token hashes to in practice; an unknown tenant is compared against it so it
/// takes the same path as a wrong token.
const DECOY_DIGEST: [u8; 32] = [0x5a; 32];

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .ok_or_else(|| "a % escape needs two hex digits".to_owned())?;
            let hex = std::str::from_utf8(hex).map_err(|_| "a bad % escape".to_owned())?;
            let b = u8::from_str_radix(hex, 16).map_err(|_| "a bad % escape".to_owned())?;
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the tenant is not UTF-8 after % decoding".to_owned())
}

fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    if text.len() != 64 {
        return Err("the digest must be 64 hex digits".into());
    }
    let mut digest = [0u8; 32];
    hex::decode_to_slice(text, &mut digest).map_err(|_| "the digest is not hex".to_owned())?;
    Ok(digest)
}

fn parse_tenant(text: &str) -> Result<TenantId, String> {
    let decoded = percent_decode(text)?;
    TenantId::new(decoded).map_err(|e| e.to_string())
}

impl CredentialStore {
    /// A store with no tenants (refuses everything).
    pub fn empty() -> CredentialStore {
        CredentialStore {
            digests: HashMap::new(),
            origins: HashMap::new(),
        }
    }

    /// How many tenants have a credential.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no tenant has a credential.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The tenants with a credential here.
    pub fn tenants(&self) -> Vec<TenantId> {
        self.digests.keys().cloned().collect()
    }

    fn insert(
        &mut self,
        source_name: &str,
        entry: usize,
        tenant: TenantId,
        digest: [u8; 32],
    ) -> Result<(), CredentialError> {
        if let Some((first_source, first)) = self.origins.get(&tenant) {
            return Err(CredentialError::Duplicate {
                source_name: source_name.to_owned(),
                entry,
                first_source: first_source.clone(),
                first: *first,
            });
        }
        self.origins
            .insert(tenant.clone(), (source_name.to_owned(), entry));
        self.digests.insert(tenant, digest);
        Ok(())
    }

    /// Adds a tenant's digest (as [`mint_credential`] gives it).
    pub fn add(&mut self, tenant: TenantId, sha256_hex: &str) -> Result<(), CredentialError> {
        let entry = self.digests.len() + 1;
        let digest = parse_digest(sha256_hex).map_err(|reason| CredentialError::Entry {
            source_name: "added".into(),
            entry,
            reason,
        })?;
        self.insert("added", entry, tenant, digest)
    }

    /// Adds the credentials of a file's text (the format in the module documentation).
    pub fn add_file_text(&mut self, source_name: &str, text: &str) -> Result<(), CredentialError> {
        for (index, line) in text.lines().enumerate() {
            let entry = index + 1;
            let bad = |reason: String| CredentialError::Entry {
                source_name: source_name.to_owned(),
                entry,
                reason,
            };
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let mut fields = trimmed.split([' ', '\t']).filter(|f| !f.is_empty());
            let (tenant, digest) = match (fields.next(), fields.next(), fields.next()) {
                (Some(t), Some(d), None) => (t, d),
                _ => return Err(bad("expected `<tenant> <sha256hex>`".into())),
            };
            let tenant = parse_tenant(tenant).map_err(bad)?;
            let digest = parse_digest(digest).map_err(bad)?;
            self.insert(source_name, entry, tenant, digest)?;
        }
        Ok(())
    }

    /// Adds the credentials of a file.
    pub fn add_file(&mut self, path: &Path) -> Result<(), CredentialError> {
        let text = std::fs::read_to_string(path).map_err(|error| CredentialError::Io {
            path: path.display().to_string(),
            error,
        })?;
        self.add_file_text(&path.display().to_string(), &text)
    }

    /// Adds the credentials of an environment variable's value (the format in the module
    /// documentation). An empty value adds nothing.
    pub fn add_env_value(&mut self, value: &str) -> Result<(), CredentialError> {
        if value.trim().is_empty() {
            return Ok(());
        }
        for (index, item) in value.split(',').enumerate() {
            let entry = index + 1;
            let bad = |reason: String| CredentialError::Entry {
                source_name: CREDENTIALS_ENV.to_owned(),
                entry,
                reason,
            };
            let (tenant, digest) = item
                .trim()
                .split_once('=')
                .ok_or_else(|| bad("expected `tenant=sha256hex`".into()))?;
            let tenant = parse_tenant(tenant).map_err(bad)?;
            let digest = parse_digest(digest).map_err(bad)?;
            self.insert(CREDENTIALS_ENV, entry, tenant, digest)?;
        }
        Ok(())
    }

    /// Loads from a file and/or the environment variable's value; a tenant listed in both is
    /// refused.
    pub fn load(
        file: Option<&Path>,
        env_value: Option<&str>,
    ) -> Result<CredentialStore, CredentialError> {
        let mut store = CredentialStore::empty();
        if let Some(path) = file {
            store.add_file(path)?;
        }
        if let Some(value) = env_value {
            store.add_env_value(value)?;
        }
        Ok(store)
    }

    /// The synchronous check [`AuthVerifier::verify`] runs: the same work for a known and an
    /// unknown tenant, compared in constant time.
    pub fn check(&self, tenant: &TenantId, token: &str) -> Result<(), AuthRefused> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let (expected, known) = match self.digests.get(tenant) {
            Some(d) => (d, 1u8),
            None => (&DECOY_DIGEST, 0u8),
        };
        let matches = presented.ct_eq(expected);
        let known = subtle::Choice::from(known);
        let accepted = u8::conditional_select(&0, &1, matches & known);
        if accepted == 1 {
            Ok(())
        } else {
            Err(AuthRefused)
        }
    }
}

#[async_trait]
impl AuthVerifier for CredentialStore {
    async fn verify(&self, tenant: &TenantId, token: &str) -> Result<(), AuthRefused> {
        self.check(tenant, token)
    }
}

/// A freshly minted token. It has no `Display`, and its `Debug` is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretToken(String);

impl SecretToken {
    /// The token text, to hand to the one party that should hold it.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretToken(<redacted>)")
    }
}

/// The hex SHA-256 digest a credential store keeps for `token`.
pub fn credential_digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Mints a credential: 32 random bytes as unpadded base64url, and its hex SHA-256 digest
/// (what the store keeps). A token never begins with `-`, so `--token $T` on a command line
/// is never read as another flag (base64url would begin one in 64 tokens with it).
pub fn mint_credential() -> (SecretToken, String) {
    let mut bytes = [0u8; 32];
    let token = loop {
        rand::rng().fill_bytes(&mut bytes);
        let token = URL_SAFE_NO_PAD.encode(bytes);
        if !token.starts_with('-') {
            break token;
        }
    };
    let digest = credential_digest_hex(&token);
    (SecretToken(token), digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    #[test]
    fn a_minted_token_never_begins_with_a_dash_so_a_command_line_reads_it_as_a_value() {
        // Without the rule about one token in 64 would begin with `-`: 2,000 draws would
        // all miss it with a chance of about e^-31.
        for _ in 0..2000 {
            let (token, _) = mint_credential();
            assert!(!token.expose_secret().starts_with('-'));
        }
    }

    #[test]
    fn a_minted_credential_verifies_for_its_tenant_only() {
        let (token, digest) = mint_credential();
        assert_eq!(token.expose_secret().len(), 43);
        assert_eq!(format!("{token:?}"), "SecretToken(<redacted>)");
        let mut store = CredentialStore::empty();
        store.add(t("acme"), &digest).unwrap();
        assert_eq!(store.check(&t("acme"), token.expose_secret()), Ok(()));
        assert_eq!(store.check(&t("acme"), "wrong"), Err(AuthRefused));
        assert_eq!(
            store.check(&t("other"), token.expose_secret()),
            Err(AuthRefused)
        );
        assert_eq!(store.check(&t("acme"), ""), Err(AuthRefused));
    }

    #[test]
    fn the_file_format_reads_comments_blanks_and_percent_encoded_tenants() {
        let d1 = credential_digest_hex("one");
        let d2 = credential_digest_hex("two");
        let text = format!(
            "# credentials\n\n acme {d1}\nspace%20y%25\t{}\n",
            d2.to_uppercase()
        );
        let mut store = CredentialStore::empty();
        store.add_file_text("creds", &text).unwrap();
        assert_eq!(store.len(), 2);
        assert!(store.check(&t("acme"), "one").is_ok());
        assert!(store.check(&t("space y%"), "two").is_ok());
    }

    #[test]
    fn bad_lines_and_duplicates_are_refused_with_their_line_number() {
        let d = credential_digest_hex("x");
        let cases = [
            (format!("a {d}\nb\n"), 2),
            (format!("a {d} extra\n"), 1),
            (format!("a {}\n", &d[..63]), 1),
            (format!("a {}\n", d.replace('a', "g")), 1),
            (format!("# c\na {d}\na {d}\n"), 3),
            (format!("%zz {d}\n"), 1),
            (format!("%00 {d}\n"), 1),
        ];
        for (text, line) in cases {
            let err = CredentialStore::empty()
                .add_file_text("f", &text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("entry {line}")), "{err} for {text:?}");
        }
    }

    #[test]
    fn a_credential_file_and_the_environment_load_together() {
        let (token, digest) = mint_credential();
        let path = std::env::temp_dir().join(format!("hostlink-creds-{}", uuid::Uuid::now_v7()));
        std::fs::write(&path, format!("# tenants\nacme {digest}\n")).unwrap();
        let other = credential_digest_hex("other-token");
        let store = CredentialStore::load(Some(&path), Some(&format!("beta={other}"))).unwrap();
        assert!(store.check(&t("acme"), token.expose_secret()).is_ok());
        assert!(store.check(&t("beta"), "other-token").is_ok());
        let dup = CredentialStore::load(Some(&path), Some(&format!("acme={other}")));
        assert!(matches!(dup, Err(CredentialError::Duplicate { .. })));
        std::fs::remove_file(&path).unwrap();
        let missing = CredentialStore::load(Some(&path), None).unwrap_err();
        assert!(matches!(missing, CredentialError::Io { .. }));
    }

    #[test]
    fn the_environment_format_reads_entries_and_refuses_duplicates_across_sources() {
        let d = credential_digest_hex("x");
        let mut store = CredentialStore::empty();
        store
            .add_env_value(&format!("a={d}, b%2Cc%3D={d}"))
            .unwrap();
        assert!(store.check(&t("b,c="), "x").is_ok());
        let err = store.add_file_text("f", &format!("a {d}")).unwrap_err();
        assert!(matches!(err, CredentialError::Duplicate { .. }), "{err}");
        assert!(CredentialStore::empty().add_env_value("a").is_err());
        assert!(
            CredentialStore::empty()
                .add_env_value(&format!("a={d},,"))
                .is_err()
        );
        assert!(CredentialStore::empty().add_env_value("  ").is_ok());
    }
}
