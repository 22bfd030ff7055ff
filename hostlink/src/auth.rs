//! Tenant authentication for HostLink. Owns the [`AuthVerifier`] seam, the default
//! [`CredentialStore`] (tenant credentials kept only as SHA-256 digests, compared in constant
//! time) and minting a credential for a first start. Never logs, stores or returns a
//! presented token, and never says whether a refusal was an unknown tenant or a wrong token.
//!
//! ## Credential file
//!
//! One credential per line, fields separated by spaces or tabs; blank lines and lines
//! starting with `#` are ignored. `<tenant>` is percent-encoded (`%20` for a space, `%25` for
//! `%`, `%23` for a leading `#`), so every valid tenant id can be written. A line is either
//!
//! - `<tenant> <sha256hex>`: an opaque token, kept as the 64-digit hex SHA-256 of its UTF-8
//!   bytes; or
//! - `<tenant> jwt <kind> <key-file> [option=value ...]`: JWT connection tokens (see
//!   [`crate::jwt`]), `<kind>` one of `hs256` (the file holds the shared secret, at least 32
//!   bytes), `rs256` or `es256` (a PEM public key) or `jwks` (a JSON Web Key Set of RSA and
//!   P-256 public keys, chosen by `kid`). A relative `<key-file>` is read from the credential
//!   file's folder. Options: `aud=<audience>` and `iss=<issuer>` (checked when given),
//!   `exp=optional` (tokens without `exp` are accepted; `exp=required` is the default) and
//!   `leeway=<seconds>` (for `exp`, `nbf` and `iat`; default 5, at most 300).
//!
//! A tenant listed twice, a line that does not parse and a key file that cannot be read or
//! used are refused with the line number.
//!
//! ## Environment variable
//!
//! [`CREDENTIALS_ENV`] (`HOST_TENANT_CREDENTIALS`) holds `tenant=sha256hex` entries separated
//! by commas (spaces around entries ignored), the tenant percent-encoded as above (`%2C` for
//! `,`, `%3D` for `=`). Entries are numbered from 1 in refusals.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sessionstore::TenantId;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tokio::sync::watch;

use crate::jwt::{
    self, DEFAULT_LEEWAY_SECS, JwtAlgorithm, JwtKeys, JwtRules, JwtVerifier, MAX_LEEWAY_SECS,
    RefusalReason,
};

/// The environment variable the default credential store reads.
pub const CREDENTIALS_ENV: &str = "HOST_TENANT_CREDENTIALS";

/// A refused credential. Its text deliberately says nothing more; the reason is for the log
/// and the metrics, never for the peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("the tenant credential was refused")]
pub struct AuthRefused {
    reason: RefusalReason,
}

impl AuthRefused {
    /// A refusal for `reason`.
    pub fn new(reason: RefusalReason) -> AuthRefused {
        AuthRefused { reason }
    }

    /// Why (log it, count it; never send it).
    pub fn reason(&self) -> RefusalReason {
        self.reason
    }

    /// The token's own `exp` has passed: the one refusal answered differently (Centrifuge's
    /// "token expired"), since anyone holding the token can read its expiry.
    pub fn expired(&self) -> bool {
        self.reason == RefusalReason::Expired
    }
}

/// What an accepted credential grants a link.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Grant {
    /// The principal a JWT names (`sub`), recorded as the actor; `None` for an opaque token.
    pub principal: Option<String>,
    /// When the credential expires, in Unix seconds; `None` never.
    pub expires_at: Option<u64>,
    /// How long past `expires_at` the credential is still honoured (the tenant's leeway): a
    /// link that has not refreshed by then is closed.
    pub leeway_secs: u64,
}

impl Grant {
    /// The actor what this credential does is attributed to: the principal a JWT names, else
    /// `tenant:<tenant>` (an opaque token stands for its tenant as a whole and names nobody
    /// within it).
    pub fn actor(&self, tenant: &TenantId) -> String {
        actor_of(tenant, self.principal.as_deref())
    }
}

/// The actor of a caller authenticated for `tenant` whose credential names `principal`: the
/// principal itself, else `tenant:<tenant>`. One spelling for every record that keeps an actor.
pub fn actor_of(tenant: &TenantId, principal: Option<&str>) -> String {
    match principal {
        Some(p) => p.to_owned(),
        None => format!("tenant:{tenant}"),
    }
}

/// Verifies the credential a link presents for the tenant in its path.
#[async_trait]
pub trait AuthVerifier: Send + Sync {
    /// What `token` grants when it acts for `tenant`; an unknown tenant and a wrong token
    /// are the same refusal to the peer.
    async fn verify(&self, tenant: &TenantId, token: &str) -> Result<Grant, AuthRefused>;

    /// Changes each time the credentials in force change (a reload): a link then verifies
    /// its token again and closes if it no longer acts for its tenant. `None`: they never
    /// change.
    fn changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// Refusals counted so far, by reason (for the metrics); empty when not counted.
    fn refusal_counts(&self) -> Vec<(RefusalReason, u64)> {
        Vec::new()
    }
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

/// One tenant's credential.
#[derive(Clone, Debug)]
enum Credential {
    /// An opaque token's SHA-256 digest.
    Opaque([u8; 32]),
    /// JWT connection tokens.
    Jwt(Box<JwtVerifier>),
}

/// Tenant credentials: opaque tokens as SHA-256 digests, JWT keys and rules.
#[derive(Clone)]
pub struct CredentialStore {
    credentials: HashMap<TenantId, Credential>,
    origins: HashMap<TenantId, (String, usize)>,
    /// Every key file read, for a reload on change.
    key_files: Vec<PathBuf>,
}

impl fmt::Debug for CredentialStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialStore")
            .field("tenants", &self.credentials.len())
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

/// The rules of a `jwt` line's `option=value` fields.
fn parse_jwt_rules<'a>(options: impl Iterator<Item = &'a str>) -> Result<JwtRules, String> {
    let mut rules = JwtRules::default();
    for option in options {
        let (name, value) = option
            .split_once('=')
            .ok_or_else(|| format!("`{option}` is not `option=value`"))?;
        if value.is_empty() {
            return Err(format!("option {name} has no value"));
        }
        match name {
            "aud" => rules.audience = Some(value.to_owned()),
            "iss" => rules.issuer = Some(value.to_owned()),
            "exp" => {
                rules.require_expiry = match value {
                    "required" => true,
                    "optional" => false,
                    _ => return Err("exp is `required` or `optional`".into()),
                }
            }
            "leeway" => {
                let secs: u64 = value
                    .strip_suffix('s')
                    .unwrap_or(value)
                    .parse()
                    .map_err(|_| "leeway is a whole number of seconds".to_owned())?;
                if secs > MAX_LEEWAY_SECS {
                    return Err(format!("leeway is at most {MAX_LEEWAY_SECS} seconds"));
                }
                rules.leeway_secs = secs;
            }
            _ => return Err(format!("unknown option {name} (aud, iss, exp, leeway)")),
        }
    }
    Ok(rules)
}

/// A `jwt` line's credential: `<kind> <key-file> [option=value ...]` after `jwt` (the format
/// in the module documentation; also the console's operator lines), a relative key file read
/// from `base`.
pub fn parse_jwt_line<'a>(
    mut fields: impl Iterator<Item = &'a str>,
    base: Option<&Path>,
) -> Result<JwtVerifier, String> {
    const USAGE: &str =
        "expected `<tenant> jwt hs256|rs256|es256|jwks <key-file> [option=value ...]`";
    let (Some(kind), Some(file)) = (fields.next(), fields.next()) else {
        return Err(USAGE.into());
    };
    let rules = parse_jwt_rules(fields)?;
    let file = PathBuf::from(percent_decode(file)?);
    let key_file = match base {
        Some(dir) if file.is_relative() => dir.join(file),
        _ => file,
    };
    let keys = match kind {
        "hs256" => JwtKeys::hs256_file(&key_file),
        "rs256" => JwtKeys::pem_file(JwtAlgorithm::Rs256, &key_file),
        "es256" => JwtKeys::pem_file(JwtAlgorithm::Es256, &key_file),
        "jwks" => JwtKeys::jwks_file(&key_file),
        _ => return Err(USAGE.into()),
    }
    .map_err(|e| e.to_string())?;
    Ok(JwtVerifier {
        keys,
        rules,
        key_file,
    })
}

impl CredentialStore {
    /// A store with no tenants (refuses everything).
    pub fn empty() -> CredentialStore {
        CredentialStore {
            credentials: HashMap::new(),
            origins: HashMap::new(),
            key_files: Vec::new(),
        }
    }

    /// How many tenants have a credential.
    pub fn len(&self) -> usize {
        self.credentials.len()
    }

    /// Whether no tenant has a credential.
    pub fn is_empty(&self) -> bool {
        self.credentials.is_empty()
    }

    /// The tenants with a credential here.
    pub fn tenants(&self) -> Vec<TenantId> {
        self.credentials.keys().cloned().collect()
    }

    /// Every key file a `jwt` line named (read when the store was loaded).
    pub fn key_files(&self) -> &[PathBuf] {
        &self.key_files
    }

    fn insert(
        &mut self,
        source_name: &str,
        entry: usize,
        tenant: TenantId,
        credential: Credential,
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
        if let Credential::Jwt(v) = &credential {
            self.key_files.push(v.key_file.clone());
        }
        self.credentials.insert(tenant, credential);
        Ok(())
    }

    /// Adds a tenant's digest (as [`mint_credential`] gives it).
    pub fn add(&mut self, tenant: TenantId, sha256_hex: &str) -> Result<(), CredentialError> {
        let entry = self.credentials.len() + 1;
        let digest = parse_digest(sha256_hex).map_err(|reason| CredentialError::Entry {
            source_name: "added".into(),
            entry,
            reason,
        })?;
        self.insert("added", entry, tenant, Credential::Opaque(digest))
    }

    /// Adds a tenant whose links present JWTs checked with `verifier`.
    pub fn add_jwt(
        &mut self,
        tenant: TenantId,
        verifier: JwtVerifier,
    ) -> Result<(), CredentialError> {
        let entry = self.credentials.len() + 1;
        self.insert("added", entry, tenant, Credential::Jwt(Box::new(verifier)))
    }

    /// Adds the credentials of a file's text (the format in the module documentation); a
    /// relative key file is read from the working folder.
    pub fn add_file_text(&mut self, source_name: &str, text: &str) -> Result<(), CredentialError> {
        self.add_file_text_in(source_name, text, None)
    }

    /// Adds the credentials of a file's text, reading relative key files from `base`.
    pub fn add_file_text_in(
        &mut self,
        source_name: &str,
        text: &str,
        base: Option<&Path>,
    ) -> Result<(), CredentialError> {
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
            let credential = match (fields.next(), fields.next()) {
                (Some(tenant), Some("jwt")) => {
                    let tenant = parse_tenant(tenant).map_err(bad)?;
                    let verifier = parse_jwt_line(fields, base).map_err(bad)?;
                    (tenant, Credential::Jwt(Box::new(verifier)))
                }
                (Some(tenant), Some(digest)) if fields.next().is_none() => {
                    let tenant = parse_tenant(tenant).map_err(bad)?;
                    let digest = parse_digest(digest).map_err(bad)?;
                    (tenant, Credential::Opaque(digest))
                }
                _ => {
                    return Err(bad(
                        "expected `<tenant> <sha256hex>` or `<tenant> jwt <kind> <key-file> ...`"
                            .into(),
                    ));
                }
            };
            self.insert(source_name, entry, credential.0, credential.1)?;
        }
        Ok(())
    }

    /// Adds the credentials of a file.
    pub fn add_file(&mut self, path: &Path) -> Result<(), CredentialError> {
        let text = std::fs::read_to_string(path).map_err(|error| CredentialError::Io {
            path: path.display().to_string(),
            error,
        })?;
        self.add_file_text_in(&path.display().to_string(), &text, path.parent())
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
            self.insert(CREDENTIALS_ENV, entry, tenant, Credential::Opaque(digest))?;
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

    /// The synchronous check [`AuthVerifier::verify`] runs, at the present time.
    pub fn check(&self, tenant: &TenantId, token: &str) -> Result<Grant, AuthRefused> {
        self.check_at(tenant, token, jwt::unix_now())
    }

    /// The check at `now` (Unix seconds). An opaque token takes the same work for a known and
    /// an unknown tenant, compared in constant time. A token that reads as a JWT whose own
    /// `exp` has passed is refused as expired before anything else is looked at (see
    /// [`crate::jwt`]).
    pub fn check_at(&self, tenant: &TenantId, token: &str, now: u64) -> Result<Grant, AuthRefused> {
        let credential = self.credentials.get(tenant);
        if jwt::looks_like_jwt(token) {
            let leeway = match credential {
                Some(Credential::Jwt(v)) => v.rules.leeway_secs,
                _ => DEFAULT_LEEWAY_SECS,
            };
            if let Ok(read) = jwt::decode_unverified(token)
                && jwt::expired_at(&read.claims, now, leeway)
            {
                return Err(AuthRefused::new(RefusalReason::Expired));
            }
            if let Some(Credential::Jwt(v)) = credential {
                return v
                    .verify(tenant.as_str(), token, now)
                    .map(|g| Grant {
                        principal: Some(g.subject),
                        expires_at: g.expires_at,
                        leeway_secs: v.rules.leeway_secs,
                    })
                    .map_err(AuthRefused::new);
            }
        }
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let (expected, known) = match credential {
            Some(Credential::Opaque(d)) => (d, 1u8),
            _ => (&DECOY_DIGEST, 0u8),
        };
        let matches = presented.ct_eq(expected);
        let known = subtle::Choice::from(known);
        let accepted = u8::conditional_select(&0, &1, matches & known);
        if accepted == 1 {
            Ok(Grant::default())
        } else if credential.is_none() {
            Err(AuthRefused::new(RefusalReason::UnknownTenant))
        } else {
            Err(AuthRefused::new(RefusalReason::WrongToken))
        }
    }
}

#[async_trait]
impl AuthVerifier for CredentialStore {
    async fn verify(&self, tenant: &TenantId, token: &str) -> Result<Grant, AuthRefused> {
        self.check(tenant, token)
    }
}

#[async_trait]
impl<T: AuthVerifier + ?Sized> AuthVerifier for Arc<T> {
    async fn verify(&self, tenant: &TenantId, token: &str) -> Result<Grant, AuthRefused> {
        (**self).verify(tenant, token).await
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        (**self).changes()
    }

    fn refusal_counts(&self) -> Vec<(RefusalReason, u64)> {
        (**self).refusal_counts()
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
        assert_eq!(
            store.check(&t("acme"), token.expose_secret()),
            Ok(Grant::default())
        );
        let refused = |r| Err(AuthRefused::new(r));
        assert_eq!(
            store.check(&t("acme"), "wrong"),
            refused(RefusalReason::WrongToken)
        );
        assert_eq!(
            store.check(&t("other"), token.expose_secret()),
            refused(RefusalReason::UnknownTenant)
        );
        assert_eq!(
            store.check(&t("acme"), ""),
            refused(RefusalReason::WrongToken)
        );
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

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hostlink-jwt-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn openssl(dir: &Path, args: &[&str]) {
        let status = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl {args:?}");
    }

    fn signed(
        alg: jsonwebtoken::Algorithm,
        key: &jsonwebtoken::EncodingKey,
        tenant: &str,
    ) -> String {
        let claims = serde_json::json!({
            "sub": "svc", "tenant": tenant, "exp": jwt::unix_now() + 60,
        });
        jsonwebtoken::encode(&jsonwebtoken::Header::new(alg), &claims, key).unwrap()
    }

    #[test]
    fn jwt_lines_beside_opaque_lines_verify_hs256_rs256_and_es256_with_relative_key_files() {
        use jsonwebtoken::{Algorithm, EncodingKey};
        let dir = temp_dir();
        std::fs::write(
            dir.join("hs.secret"),
            "a shared secret of at least 32 bytes!\n",
        )
        .unwrap();
        openssl(
            &dir,
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "rs.key",
            ],
        );
        openssl(
            &dir,
            &["pkey", "-in", "rs.key", "-pubout", "-out", "rs.pub"],
        );
        openssl(
            &dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                "es.key",
            ],
        );
        openssl(
            &dir,
            &["pkey", "-in", "es.key", "-pubout", "-out", "es.pub"],
        );
        let d = credential_digest_hex("opaque");
        let file = dir.join("credentials");
        std::fs::write(
            &file,
            format!(
                "old {d}\nhs jwt hs256 hs.secret aud=hostlink leeway=2s\nrs jwt rs256 rs.pub\nes\tjwt es256 es.pub exp=optional\n"
            ),
        )
        .unwrap();
        let store = CredentialStore::load(Some(&file), None).unwrap();
        assert_eq!(store.len(), 4);
        assert_eq!(store.key_files().len(), 3);
        assert!(store.check(&t("old"), "opaque").is_ok());
        let rs = EncodingKey::from_rsa_pem(&std::fs::read(dir.join("rs.key")).unwrap()).unwrap();
        let es = EncodingKey::from_ec_pem(&std::fs::read(dir.join("es.key")).unwrap()).unwrap();
        let grant = store
            .check(&t("rs"), &signed(Algorithm::RS256, &rs, "rs"))
            .unwrap();
        assert_eq!(grant.principal.as_deref(), Some("svc"));
        assert!(grant.expires_at.is_some());
        assert!(
            store
                .check(&t("es"), &signed(Algorithm::ES256, &es, "es"))
                .is_ok()
        );
        // The RSA key does not act for the EC tenant, nor a token for one tenant for another.
        let refused =
            |tenant: &str, token: &str| store.check(&t(tenant), token).unwrap_err().reason();
        assert_eq!(
            refused("es", &signed(Algorithm::RS256, &rs, "es")),
            RefusalReason::AlgorithmNotAllowed
        );
        assert_eq!(
            refused("rs", &signed(Algorithm::RS256, &rs, "es")),
            RefusalReason::WrongTenant
        );
        // The audience rule applies: the HS256 tenant's tokens must name it.
        let hs = EncodingKey::from_secret(b"a shared secret of at least 32 bytes!");
        assert_eq!(
            refused("hs", &signed(Algorithm::HS256, &hs, "hs")),
            RefusalReason::WrongAudience
        );
        // A JWT for an opaque tenant and an opaque token for a JWT tenant are wrong tokens.
        assert_eq!(
            refused("old", &signed(Algorithm::RS256, &rs, "old")),
            RefusalReason::WrongToken
        );
        assert_eq!(refused("rs", "opaque"), RefusalReason::WrongToken);
        assert_eq!(
            refused("nobody", &signed(Algorithm::RS256, &rs, "nobody")),
            RefusalReason::UnknownTenant
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The output of `openssl args...` run in `dir`.
    fn openssl_text(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn a_jwks_line_picks_the_key_by_kid_and_refuses_an_unknown_or_missing_kid() {
        use jsonwebtoken::{Algorithm, EncodingKey, Header};
        let dir = temp_dir();
        openssl(
            &dir,
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "rs.key",
            ],
        );
        openssl(
            &dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                "es.key",
            ],
        );
        // The public keys as JWKs: the RSA modulus, and the EC point's coordinates.
        let modulus = openssl_text(&dir, &["rsa", "-in", "rs.key", "-noout", "-modulus"]);
        let n = hex::decode(modulus.trim().trim_start_matches("Modulus=")).unwrap();
        let text = openssl_text(&dir, &["ec", "-in", "es.key", "-noout", "-text"]);
        let point: String = text
            .split("pub:")
            .nth(1)
            .unwrap()
            .split("ASN1")
            .next()
            .unwrap()
            .chars()
            .filter(|c| c.is_ascii_hexdigit())
            .collect();
        let point = hex::decode(point).unwrap();
        assert_eq!((point.len(), point[0]), (65, 4));
        let jwks = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r1", "alg": "RS256", "use": "sig",
             "n": URL_SAFE_NO_PAD.encode(&n), "e": "AQAB"},
            {"kty": "EC", "kid": "e1", "crv": "P-256",
             "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])},
        ]});
        std::fs::write(dir.join("keys.jwks"), jwks.to_string()).unwrap();
        let file = dir.join("credentials");
        std::fs::write(&file, "acme jwt jwks keys.jwks\n").unwrap();
        let store = CredentialStore::load(Some(&file), None).unwrap();
        let rs = EncodingKey::from_rsa_pem(&std::fs::read(dir.join("rs.key")).unwrap()).unwrap();
        let es = EncodingKey::from_ec_pem(&std::fs::read(dir.join("es.key")).unwrap()).unwrap();
        let claims =
            serde_json::json!({"sub": "svc", "tenant": "acme", "exp": jwt::unix_now() + 60});
        let sign = |alg, kid: Option<&str>, key: &EncodingKey| {
            let mut header = Header::new(alg);
            header.kid = kid.map(str::to_owned);
            jsonwebtoken::encode(&header, &claims, key).unwrap()
        };
        let check = |token: String| store.check(&t("acme"), &token).map_err(|e| e.reason());
        assert!(check(sign(Algorithm::RS256, Some("r1"), &rs)).is_ok());
        assert!(check(sign(Algorithm::ES256, Some("e1"), &es)).is_ok());
        assert_eq!(
            check(sign(Algorithm::RS256, Some("r9"), &rs)),
            Err(RefusalReason::UnknownKey)
        );
        assert_eq!(
            check(sign(Algorithm::RS256, None, &rs)),
            Err(RefusalReason::UnknownKey)
        );
        assert_eq!(
            check(sign(Algorithm::RS256, Some("e1"), &rs)),
            Err(RefusalReason::AlgorithmNotAllowed)
        );
        assert_eq!(
            check(sign(Algorithm::ES256, Some("r1"), &es)),
            Err(RefusalReason::AlgorithmNotAllowed)
        );
        // A symmetric key in a JWKS is refused with the line.
        std::fs::write(
            dir.join("oct.jwks"),
            r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#,
        )
        .unwrap();
        let err = CredentialStore::empty()
            .add_file_text_in("f", "acme jwt jwks oct.jwks", Some(&dir))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("entry 1") && err.contains("RSA and P-256"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_jwt_line_that_cannot_be_used_is_refused_with_its_line_number() {
        let dir = temp_dir();
        std::fs::write(dir.join("short"), "too short").unwrap();
        std::fs::write(dir.join("long"), "x".repeat(40)).unwrap();
        std::fs::write(dir.join("not.pem"), "garbage").unwrap();
        std::fs::write(dir.join("empty.jwks"), r#"{"keys":[]}"#).unwrap();
        std::fs::write(dir.join("huge"), vec![b'x'; 1024 * 1024 + 1]).unwrap();
        let cases = [
            "a jwt hs256 missing-file",
            "a jwt hs256 short",
            "a jwt rs256 not.pem",
            "a jwt es256 not.pem",
            "a jwt jwks empty.jwks",
            "a jwt jwks not.pem",
            "a jwt hs256 huge",
            "a jwt hs512 long",
            "a jwt hs256",
            "a jwt hs256 long aud",
            "a jwt hs256 long color=blue",
            "a jwt hs256 long exp=sometimes",
            "a jwt hs256 long leeway=301",
            "a jwt hs256 long leeway=ten",
        ];
        for line in cases {
            let text = format!("# first\n{line}\n");
            let err = CredentialStore::empty()
                .add_file_text_in("f", &text, Some(&dir))
                .unwrap_err()
                .to_string();
            assert!(err.contains("entry 2"), "{err} for {line:?}");
        }
        let mut ok = CredentialStore::empty();
        ok.add_file_text_in(
            "f",
            "a jwt hs256 long leeway=300 exp=required iss=me",
            Some(&dir),
        )
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
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
