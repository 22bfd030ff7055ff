//! JWT connection tokens: reading a token's header and claims (without trusting them), the
//! keys a tenant's tokens are checked with, and the claim rules. Owns the decision whether a
//! presented JWT acts for a tenant and, when it does not, the reason (for the log and the
//! metrics, never for the peer). Signatures are checked by the `jsonwebtoken` crate; this
//! module writes no cryptography.
//!
//! The checks, in order: the token reads as a JWT (three base64url parts, a JSON header and
//! JSON claims); its `exp` (when present) has not passed, leeway included; the header's `alg`
//! is the one the tenant's key allows (`none` never is); the key (by `kid` for a JWKS) verifies
//! the signature; then the claims: `sub` a non-empty string, the tenant claim equal to the
//! link's tenant, `exp` present unless the tenant allows none, `nbf` and `iat` not in the
//! future, `aud` and `iss` as configured. Expiry is checked first on purpose: whether a token
//! has expired is readable by anyone holding it, so answering it differently (Centrifuge's
//! "token expired", which makes an SDK fetch a fresh token) says nothing about the key, the
//! tenant or the audience.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use wire_enum::wire_enum;

/// The claim that names the tenant a token acts for.
pub const TENANT_CLAIM: &str = "tenant";

/// The longest token read at all (a longer one is refused as malformed before decoding).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// The leeway when a credential line gives none, in seconds.
pub const DEFAULT_LEEWAY_SECS: u64 = 5;

/// The largest leeway a credential line may give, in seconds.
pub const MAX_LEEWAY_SECS: u64 = 300;

/// The shortest HS256 secret accepted, in bytes (the hash's size, as RFC 7518 asks).
pub const MIN_HS256_SECRET_BYTES: usize = 32;

wire_enum! {
    /// Why a credential was refused: logged and counted, never sent to the peer.
    pub enum RefusalReason {
        /// The link's tenant has no credential here.
        UnknownTenant = "unknown_tenant",
        /// An opaque token that is not the tenant's.
        WrongToken = "wrong_token",
        /// Not a JWT: the parts, the base64url or the JSON do not read.
        Malformed = "malformed",
        /// The header's `alg` is not the one the tenant's key allows (`none` included).
        AlgorithmNotAllowed = "algorithm_not_allowed",
        /// No key of the tenant's JWKS has the header's `kid`.
        UnknownKey = "unknown_key",
        /// The signature does not verify with the tenant's key.
        BadSignature = "bad_signature",
        /// `exp`, leeway included, has passed.
        Expired = "expired",
        /// `nbf` or `iat` lies in the future beyond the leeway.
        NotYetValid = "not_yet_valid",
        /// `exp` is missing and the tenant requires it.
        MissingExpiry = "missing_expiry",
        /// `sub` is missing or empty.
        MissingSubject = "missing_subject",
        /// The tenant claim is missing or names another tenant.
        WrongTenant = "wrong_tenant",
        /// `aud` does not include the configured audience.
        WrongAudience = "wrong_audience",
        /// `iss` is not the configured issuer.
        WrongIssuer = "wrong_issuer",
    }
    kind = "credential_refusal_reason";
}

/// The algorithms a tenant's key may allow.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum JwtAlgorithm {
    Hs256,
    Rs256,
    Es256,
}

impl JwtAlgorithm {
    /// The algorithm a credential line's kind (or `hostd token mint --alg`) names.
    pub fn from_kind(kind: &str) -> Option<JwtAlgorithm> {
        match kind {
            "hs256" => Some(JwtAlgorithm::Hs256),
            "rs256" => Some(JwtAlgorithm::Rs256),
            "es256" => Some(JwtAlgorithm::Es256),
            _ => None,
        }
    }

    /// The header's `alg` for it.
    pub fn as_str(self) -> &'static str {
        match self {
            JwtAlgorithm::Hs256 => "HS256",
            JwtAlgorithm::Rs256 => "RS256",
            JwtAlgorithm::Es256 => "ES256",
        }
    }

    fn library(self) -> Algorithm {
        match self {
            JwtAlgorithm::Hs256 => Algorithm::HS256,
            JwtAlgorithm::Rs256 => Algorithm::RS256,
            JwtAlgorithm::Es256 => Algorithm::ES256,
        }
    }
}

/// A token's header, as read (not trusted).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Header {
    pub alg: String,
    #[serde(default)]
    pub kid: Option<String>,
    #[serde(default)]
    pub typ: Option<String>,
}

/// `aud`: one string or several.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn contains(&self, wanted: &str) -> bool {
        match self {
            Audience::One(a) => a == wanted,
            Audience::Many(all) => all.iter().any(|a| a == wanted),
        }
    }
}

/// The claims HostLink reads, as read (not trusted). Other claims are ignored.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Claims {
    #[serde(default)]
    pub sub: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub exp: Option<u64>,
    #[serde(default)]
    pub nbf: Option<u64>,
    #[serde(default)]
    pub iat: Option<u64>,
    #[serde(default)]
    pub aud: Option<Audience>,
    #[serde(default)]
    pub iss: Option<String>,
}

/// A token read without verifying anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unverified {
    pub header: Header,
    pub claims: Claims,
    /// The header as JSON text, for an operator to read.
    pub header_json: String,
    /// The claims as JSON text, for an operator to read.
    pub claims_json: String,
}

/// Why a token did not read as a JWT.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("not a JWT: {0}")]
pub struct DecodeError(&'static str);

/// Whether `token` looks like a JWT at all (two dots), so an opaque token is never read as one.
pub fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
}

fn part_json(part: &str, what: &'static str) -> Result<String, DecodeError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part.as_bytes())
        .map_err(|_| DecodeError(what))?;
    String::from_utf8(bytes).map_err(|_| DecodeError(what))
}

/// Reads a token's header and claims without checking its signature or any claim. For the
/// checks, [`JwtVerifier::verify`]; for an operator's look, `hostd token inspect`.
pub fn decode_unverified(token: &str) -> Result<Unverified, DecodeError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(DecodeError("the token is too long"));
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(DecodeError("a JWT has three dot-separated parts"));
    };
    let header_json = part_json(header, "the header is not base64url UTF-8")?;
    let claims_json = part_json(claims, "the claims are not base64url UTF-8")?;
    // Each part is read as a whole JSON value first, so a member the typed read would skip
    // (a number no JSON reader can hold, say) refuses the token here rather than surprising
    // whoever shows the text later.
    let header = serde_json::from_str::<serde_json::Value>(&header_json)
        .ok()
        .and_then(|v| Header::deserialize(&v).ok())
        .ok_or(DecodeError(
            "the header is not a JSON object with a string alg",
        ))?;
    let claims = serde_json::from_str::<serde_json::Value>(&claims_json)
        .ok()
        .and_then(|v| Claims::deserialize(&v).ok())
        .ok_or(DecodeError(
            "the claims are not a JSON object of the expected types",
        ))?;
    Ok(Unverified {
        header,
        claims,
        header_json,
        claims_json,
    })
}

/// What a verified token grants.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct JwtGrant {
    /// `sub`: the principal, recorded as the actor.
    pub subject: String,
    /// `exp` in Unix seconds, when the token has one.
    pub expires_at: Option<u64>,
}

/// The claim rules of one tenant's tokens (a credential line's options).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JwtRules {
    pub audience: Option<String>,
    pub issuer: Option<String>,
    /// Whether a token without `exp` is refused (the default).
    pub require_expiry: bool,
    pub leeway_secs: u64,
}

impl Default for JwtRules {
    fn default() -> Self {
        JwtRules {
            audience: None,
            issuer: None,
            require_expiry: true,
            leeway_secs: DEFAULT_LEEWAY_SECS,
        }
    }
}

/// The key or keys a tenant's tokens are signed with.
#[derive(Clone)]
pub enum JwtKeys {
    /// One key, for one algorithm.
    Single(JwtAlgorithm, DecodingKey),
    /// A JWKS: each key by its `kid`, with the algorithm its type gives.
    Set(Vec<(Option<String>, JwtAlgorithm, DecodingKey)>),
}

impl fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JwtKeys::Single(alg, _) => write!(f, "JwtKeys::Single({})", alg.as_str()),
            JwtKeys::Set(keys) => write!(f, "JwtKeys::Set({} keys)", keys.len()),
        }
    }
}

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key file {path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error("key file {path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// The largest key file read (a JWKS of many keys fits; a device or a wrong path does not).
pub const MAX_KEY_FILE_BYTES: u64 = 1024 * 1024;

fn read_key_file(path: &Path) -> Result<Vec<u8>, KeyError> {
    use std::io::Read;
    let io = |error| KeyError::Io {
        path: path.display().to_string(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(MAX_KEY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > MAX_KEY_FILE_BYTES {
        return Err(invalid(
            path,
            format!("larger than {MAX_KEY_FILE_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

fn invalid(path: &Path, reason: impl Into<String>) -> KeyError {
    KeyError::Invalid {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

impl JwtKeys {
    /// An HS256 secret: the file's bytes, less one trailing newline (`\n` or `\r\n`).
    pub fn hs256_file(path: &Path) -> Result<JwtKeys, KeyError> {
        let secret = read_secret(path)?;
        Ok(JwtKeys::Single(
            JwtAlgorithm::Hs256,
            DecodingKey::from_secret(&secret),
        ))
    }

    /// A PEM public key for RS256 or ES256 (SPKI `PUBLIC KEY`; RS256 also `RSA PUBLIC KEY`).
    pub fn pem_file(alg: JwtAlgorithm, path: &Path) -> Result<JwtKeys, KeyError> {
        let pem = read_key_file(path)?;
        let key = match alg {
            JwtAlgorithm::Rs256 => DecodingKey::from_rsa_pem(&pem),
            JwtAlgorithm::Es256 => DecodingKey::from_ec_pem(&pem),
            JwtAlgorithm::Hs256 => return Err(invalid(path, "HS256 takes a secret, not a PEM")),
        }
        .map_err(|e| invalid(path, format!("not a {} public key: {e}", alg.as_str())))?;
        Ok(JwtKeys::Single(alg, key))
    }

    /// A JWKS (`{"keys": [...]}`) of RSA keys (RS256) and P-256 keys (ES256). A key whose
    /// `alg` names another algorithm, a symmetric key and a repeated `kid` are refused.
    pub fn jwks_file(path: &Path) -> Result<JwtKeys, KeyError> {
        let text = read_key_file(path)?;
        let set: JwkSet =
            serde_json::from_slice(&text).map_err(|e| invalid(path, format!("not a JWKS: {e}")))?;
        if set.keys.is_empty() {
            return Err(invalid(path, "the JWKS has no keys"));
        }
        let mut keys = Vec::with_capacity(set.keys.len());
        for (index, jwk) in set.keys.iter().enumerate() {
            let n = index + 1;
            let alg = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => JwtAlgorithm::Rs256,
                AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
                    JwtAlgorithm::Es256
                }
                _ => {
                    return Err(invalid(
                        path,
                        format!("key {n}: only RSA and P-256 public keys are accepted"),
                    ));
                }
            };
            if let Some(named) = jwk.common.key_algorithm {
                let named = format!("{named:?}");
                if named != alg.as_str() {
                    return Err(invalid(
                        path,
                        format!("key {n}: alg {named} does not fit its key type"),
                    ));
                }
            }
            let kid = jwk.common.key_id.clone();
            if kid.is_some() && keys.iter().any(|(k, _, _)| *k == kid) {
                return Err(invalid(path, format!("key {n}: the kid is repeated")));
            }
            let key =
                DecodingKey::from_jwk(jwk).map_err(|e| invalid(path, format!("key {n}: {e}")))?;
            keys.push((kid, alg, key));
        }
        Ok(JwtKeys::Set(keys))
    }

    /// The key for a header, if the header's `alg` is allowed.
    fn key_for(&self, header: &Header) -> Result<(JwtAlgorithm, &DecodingKey), RefusalReason> {
        match self {
            JwtKeys::Single(alg, key) => {
                if header.alg == alg.as_str() {
                    Ok((*alg, key))
                } else {
                    Err(RefusalReason::AlgorithmNotAllowed)
                }
            }
            JwtKeys::Set(keys) => {
                let found = match &header.kid {
                    Some(kid) => keys.iter().find(|(k, _, _)| k.as_deref() == Some(kid)),
                    None if keys.len() == 1 => keys.first(),
                    None => None,
                };
                let Some((_, alg, key)) = found else {
                    // An `alg` no key of the set allows is that, not an unknown key.
                    return Err(if keys.iter().any(|(_, a, _)| a.as_str() == header.alg) {
                        RefusalReason::UnknownKey
                    } else {
                        RefusalReason::AlgorithmNotAllowed
                    });
                };
                if header.alg == alg.as_str() {
                    Ok((*alg, key))
                } else {
                    Err(RefusalReason::AlgorithmNotAllowed)
                }
            }
        }
    }
}

/// Reads an HS256 secret file: its bytes, less one trailing newline, at least
/// [`MIN_HS256_SECRET_BYTES`].
fn read_secret(path: &Path) -> Result<Vec<u8>, KeyError> {
    let mut secret = read_key_file(path)?;
    if secret.ends_with(b"\n") {
        secret.pop();
        if secret.ends_with(b"\r") {
            secret.pop();
        }
    }
    if secret.len() < MIN_HS256_SECRET_BYTES {
        return Err(invalid(
            path,
            format!("an HS256 secret needs at least {MIN_HS256_SECRET_BYTES} bytes"),
        ));
    }
    Ok(secret)
}

/// A key to sign tokens with (for operators and tests: a Host only verifies).
pub struct SigningKey {
    alg: JwtAlgorithm,
    key: jsonwebtoken::EncodingKey,
    kid: Option<String>,
}

impl SigningKey {
    /// The HS256 secret file, or the PEM private key (PKCS#8; RS256 also PKCS#1) for RS256 or
    /// ES256; `kid` is put in each token's header (to pick a key of a JWKS).
    pub fn from_file(
        alg: JwtAlgorithm,
        path: &Path,
        kid: Option<String>,
    ) -> Result<SigningKey, KeyError> {
        let key = match alg {
            JwtAlgorithm::Hs256 => jsonwebtoken::EncodingKey::from_secret(&read_secret(path)?),
            JwtAlgorithm::Rs256 => {
                jsonwebtoken::EncodingKey::from_rsa_pem(&read_key_file(path)?)
                    .map_err(|e| invalid(path, format!("not an RSA private key: {e}")))?
            }
            JwtAlgorithm::Es256 => jsonwebtoken::EncodingKey::from_ec_pem(&read_key_file(path)?)
                .map_err(|e| invalid(path, format!("not a P-256 private key: {e}")))?,
        };
        Ok(SigningKey { alg, key, kid })
    }

    /// A token for `tenant` and `subject`, issued now and expiring after `ttl_secs`, with the
    /// audience and issuer when given.
    pub fn mint(
        &self,
        tenant: &str,
        subject: &str,
        ttl_secs: u64,
        audience: Option<&str>,
        issuer: Option<&str>,
    ) -> Result<String, KeyError> {
        let now = unix_now();
        let mut claims = serde_json::Map::new();
        claims.insert("sub".into(), subject.into());
        claims.insert(TENANT_CLAIM.into(), tenant.into());
        claims.insert("iat".into(), now.into());
        claims.insert("exp".into(), now.saturating_add(ttl_secs).into());
        if let Some(aud) = audience {
            claims.insert("aud".into(), aud.into());
        }
        if let Some(iss) = issuer {
            claims.insert("iss".into(), iss.into());
        }
        let mut header = jsonwebtoken::Header::new(self.alg.library());
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, &claims, &self.key).map_err(|e| KeyError::Invalid {
            path: "the signing key".into(),
            reason: e.to_string(),
        })
    }
}

/// A tenant's JWT credential: its keys, its rules, and the files they came from.
#[derive(Clone, Debug)]
pub struct JwtVerifier {
    pub keys: JwtKeys,
    pub rules: JwtRules,
    /// The key file, for reloading on change.
    pub key_file: PathBuf,
}

/// Whether a token read without verifying has expired at `now` (Unix seconds) with `leeway`:
/// from `exp` on (RFC 7519: not accepted "on or after" it), leeway added.
pub fn expired_at(claims: &Claims, now: u64, leeway_secs: u64) -> bool {
    claims
        .exp
        .is_some_and(|exp| exp.saturating_add(leeway_secs) <= now)
}

impl JwtVerifier {
    /// Checks `token` for `tenant` at `now` (Unix seconds), in the order of the module
    /// documentation.
    pub fn verify(&self, tenant: &str, token: &str, now: u64) -> Result<JwtGrant, RefusalReason> {
        self.verify_for(Some(tenant), token, now)
    }

    /// The same checks for a token that acts for no tenant (an operator's): its tenant claim
    /// must be absent, so no tenant's token passes here.
    pub fn verify_untenanted(&self, token: &str, now: u64) -> Result<JwtGrant, RefusalReason> {
        self.verify_for(None, token, now)
    }

    fn verify_for(
        &self,
        tenant: Option<&str>,
        token: &str,
        now: u64,
    ) -> Result<JwtGrant, RefusalReason> {
        let read = decode_unverified(token).map_err(|_| RefusalReason::Malformed)?;
        let rules = &self.rules;
        if expired_at(&read.claims, now, rules.leeway_secs) {
            return Err(RefusalReason::Expired);
        }
        let (alg, key) = self.keys.key_for(&read.header)?;
        let Some((signing_input, signature)) = token.rsplit_once('.') else {
            return Err(RefusalReason::Malformed);
        };
        match jsonwebtoken::crypto::verify(signature, signing_input.as_bytes(), key, alg.library())
        {
            Ok(true) => {}
            Ok(false) | Err(_) => return Err(RefusalReason::BadSignature),
        }
        let claims = read.claims;
        let subject = match claims.sub {
            Some(s) if !s.is_empty() => s,
            _ => return Err(RefusalReason::MissingSubject),
        };
        if claims.tenant.as_deref() != tenant {
            return Err(RefusalReason::WrongTenant);
        }
        if claims.exp.is_none() && rules.require_expiry {
            return Err(RefusalReason::MissingExpiry);
        }
        let future = |t: Option<u64>| t.is_some_and(|t| t > now.saturating_add(rules.leeway_secs));
        if future(claims.nbf) || future(claims.iat) {
            return Err(RefusalReason::NotYetValid);
        }
        if let Some(wanted) = &rules.audience
            && !claims.aud.as_ref().is_some_and(|a| a.contains(wanted))
        {
            return Err(RefusalReason::WrongAudience);
        }
        if let Some(wanted) = &rules.issuer
            && claims.iss.as_deref() != Some(wanted.as_str())
        {
            return Err(RefusalReason::WrongIssuer);
        }
        Ok(JwtGrant {
            subject,
            expires_at: claims.exp,
        })
    }
}

/// The present time in Unix seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header as LibHeader, encode};
    use serde_json::json;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test";

    fn hs_verifier(rules: JwtRules) -> JwtVerifier {
        JwtVerifier {
            keys: JwtKeys::Single(JwtAlgorithm::Hs256, DecodingKey::from_secret(SECRET)),
            rules,
            key_file: PathBuf::from("secret"),
        }
    }

    fn hs_token(claims: serde_json::Value) -> String {
        encode(
            &LibHeader::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(SECRET),
        )
        .unwrap()
    }

    const NOW: u64 = 1_800_000_000;

    fn good() -> serde_json::Value {
        json!({"sub": "alice", "tenant": "acme", "exp": NOW + 60, "iat": NOW})
    }

    #[test]
    fn a_signed_token_for_the_tenant_grants_its_subject_and_expiry() {
        let v = hs_verifier(JwtRules::default());
        let grant = v.verify("acme", &hs_token(good()), NOW).unwrap();
        assert_eq!(grant.subject, "alice");
        assert_eq!(grant.expires_at, Some(NOW + 60));
    }

    #[test]
    fn every_claim_mismatch_is_refused_with_its_own_logged_reason() {
        let rules = JwtRules {
            audience: Some("hostlink".into()),
            issuer: Some("issuer-a".into()),
            ..JwtRules::default()
        };
        let v = hs_verifier(rules);
        let with = |patch: serde_json::Value| {
            let mut c = good();
            c["aud"] = json!(["other", "hostlink"]);
            c["iss"] = json!("issuer-a");
            for (k, val) in patch.as_object().unwrap() {
                if val.is_null() {
                    c.as_object_mut().unwrap().remove(k);
                } else {
                    c[k] = val.clone();
                }
            }
            hs_token(c)
        };
        assert!(v.verify("acme", &with(json!({})), NOW).is_ok());
        let cases = [
            (json!({"tenant": "other"}), RefusalReason::WrongTenant),
            (json!({"tenant": null}), RefusalReason::WrongTenant),
            (json!({"aud": "elsewhere"}), RefusalReason::WrongAudience),
            (json!({"aud": null}), RefusalReason::WrongAudience),
            (json!({"iss": "issuer-b"}), RefusalReason::WrongIssuer),
            (json!({"exp": NOW - 5}), RefusalReason::Expired),
            (json!({"exp": null}), RefusalReason::MissingExpiry),
            (json!({"nbf": NOW + 6}), RefusalReason::NotYetValid),
            (json!({"iat": NOW + 60}), RefusalReason::NotYetValid),
            (json!({"sub": ""}), RefusalReason::MissingSubject),
            (json!({"sub": null}), RefusalReason::MissingSubject),
        ];
        for (patch, reason) in cases {
            assert_eq!(
                v.verify("acme", &with(patch.clone()), NOW),
                Err(reason),
                "{patch}"
            );
        }
        // Within the leeway an expired or early token still passes.
        assert!(
            v.verify("acme", &with(json!({"exp": NOW - 4, "nbf": NOW + 5})), NOW)
                .is_ok()
        );
    }

    #[test]
    fn alg_none_a_wrong_key_and_garbage_are_refused() {
        let v = hs_verifier(JwtRules::default());
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
        let claims = URL_SAFE_NO_PAD.encode(good().to_string());
        assert_eq!(
            v.verify("acme", &format!("{header}.{claims}."), NOW),
            Err(RefusalReason::AlgorithmNotAllowed)
        );
        let other = encode(
            &LibHeader::new(Algorithm::HS256),
            &good(),
            &EncodingKey::from_secret(b"another secret of enough length, surely"),
        )
        .unwrap();
        assert_eq!(
            v.verify("acme", &other, NOW),
            Err(RefusalReason::BadSignature)
        );
        for garbage in ["", "a.b", "a.b.c", "..", "a.b.c.d", "%%%.%%%.%%%"] {
            assert_eq!(
                v.verify("acme", garbage, NOW),
                Err(RefusalReason::Malformed)
            );
        }
        let mut tampered = hs_token(good());
        tampered.push('A');
        assert_eq!(
            v.verify("acme", &tampered, NOW),
            Err(RefusalReason::BadSignature)
        );
    }

    #[test]
    fn a_tenant_may_allow_tokens_without_expiry() {
        let v = hs_verifier(JwtRules {
            require_expiry: false,
            ..JwtRules::default()
        });
        let grant = v
            .verify(
                "acme",
                &hs_token(json!({"sub": "svc", "tenant": "acme"})),
                NOW,
            )
            .unwrap();
        assert_eq!(grant.expires_at, None);
    }

    #[test]
    fn an_unverified_read_shows_header_and_claims_and_refuses_what_is_not_a_jwt() {
        let read = decode_unverified(&hs_token(good())).unwrap();
        assert_eq!(read.header.alg, "HS256");
        assert_eq!(read.claims.sub.as_deref(), Some("alice"));
        assert!(read.claims_json.contains("\"tenant\":\"acme\""));
        assert!(decode_unverified("x").is_err());
        assert!(decode_unverified(&"a".repeat(MAX_TOKEN_BYTES + 1)).is_err());
        assert!(!looks_like_jwt("opaque-token_without-dots"));
    }

    #[test]
    fn a_part_holding_json_no_reader_can_hold_is_not_a_jwt() {
        // Found by the `jwt` fuzz target: claims with a member the typed read skips, whose
        // number overflows every JSON reader (`{"alg":2e6056}`). The token was read, and its
        // claims text then failed to parse wherever it was shown.
        let part = |json: &str| URL_SAFE_NO_PAD.encode(json);
        let token = format!(
            "{}.{}.false",
            part(r#"{"alg":"n"}"#),
            part(r#"{"alg":2e6056}"#)
        );
        assert_eq!(
            decode_unverified(&token).unwrap_err().to_string(),
            "not a JWT: the claims are not a JSON object of the expected types"
        );
        let header = format!("{}.{}.x", part(r#"{"alg":"HS256","x":1e999}"#), part("{}"));
        assert!(decode_unverified(&header).is_err());
    }
}
