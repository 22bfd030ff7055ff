//! JWT connection tokens on real links: the connect reply's `expires`/`ttl`, `refresh`
//! extending a link without dropping its subscription, a link closed `expired` (3005) when no
//! refresh comes, an expired token answered "token expired" (109), every other refusal the
//! same close (4500), and credentials reloaded from their files while links are up: the links
//! whose token no longer acts for their tenant closed (4502), the others untouched.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hostlink::auth::{AuthVerifier, credential_digest_hex};
use hostlink::jwt::{RefusalReason, unix_now};
use hostlink::live_credentials::LiveCredentials;
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};
use support::*;

const SECRET_A: &str = "the first shared secret, 32 bytes or more";
const SECRET_B: &str = "the second shared secret, also long enough";

struct Files {
    dir: PathBuf,
}

impl Files {
    fn new() -> Files {
        let dir = std::env::temp_dir().join(format!("hostlink-jwt-links-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        // Replace whole (as an editor's save or `mv` does): a reader never sees half a file.
        let temp = self.dir.join(format!(".{name}.new"));
        std::fs::write(&temp, text).unwrap();
        std::fs::rename(&temp, &path).unwrap();
        path
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn hs256(secret: &str, claims: Value) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap()
}

fn token(secret: &str, tenant: &str, sub: &str, ttl: u64) -> String {
    hs256(
        secret,
        json!({"sub": sub, "tenant": tenant, "exp": unix_now() + ttl, "aud": "hostlink"}),
    )
}

/// A server whose credentials are a file: `acme` on JWTs (HS256, audience `hostlink`, no
/// leeway), `beta` on an opaque token.
async fn jwt_server(files: &Files) -> (TestServer, Arc<LiveCredentials>) {
    files.write("acme.secret", SECRET_A);
    let creds = files.write(
        "credentials",
        &format!(
            "acme jwt hs256 acme.secret aud=hostlink leeway=0\nbeta {}\n",
            credential_digest_hex(&token_of("beta"))
        ),
    );
    let live = Arc::new(LiveCredentials::load(Some(creds), None).unwrap());
    let backend = TestBackend::new(&[]).with_credentials(live.clone());
    (TestServer::start(backend, quiet_options()).await, live)
}

async fn dial_with(s: &TestServer, tenant: &str, token: &str) -> (Client, Value) {
    let mut c = s.dial(&format!("/hostlink/{tenant}"), None).await.unwrap();
    let reply = c.handshake(token).await;
    (c, reply)
}

#[tokio::test]
async fn a_jwt_link_is_told_its_ttl_and_a_refresh_extends_it_without_dropping_its_subscription() {
    let files = Files::new();
    let (s, _) = jwt_server(&files).await;
    let (mut c, reply) = dial_with(&s, "acme", &token(SECRET_A, "acme", "alice", 3)).await;
    assert_eq!(reply["connect"]["expires"], true, "{reply}");
    let ttl = reply["connect"]["ttl"].as_u64().unwrap();
    assert!((2..=3).contains(&ttl), "{reply}");
    attach_and_bind(&mut c, "acme", "s1").await;
    subscribe(&mut c, "acme", "s1", None).await;
    s.backend.publish("acme", "s1", 1, r#"{"n":1}"#).unwrap();
    assert_eq!(c.push().await["pub"]["offset"], 1);

    let fresh = token(SECRET_A, "acme", "alice", 60);
    let r = c
        .command("refresh", &format!(r#"{{"token":"{fresh}"}}"#))
        .await;
    assert_eq!(r["refresh"]["expires"], true, "{r}");
    assert!(r["refresh"]["ttl"].as_u64().unwrap() >= 58, "{r}");
    assert_eq!(r["refresh"]["client"], reply["connect"]["client"]);

    // Past the first token's expiry the link and its subscription carry on.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    s.backend.publish("acme", "s1", 2, r#"{"n":2}"#).unwrap();
    assert_eq!(c.push().await["pub"]["offset"], 2);
}

#[tokio::test]
async fn a_link_that_does_not_refresh_is_closed_expired_and_its_token_is_then_answered_token_expired()
 {
    let files = Files::new();
    let (s, _) = jwt_server(&files).await;
    let stale = token(SECRET_A, "acme", "alice", 1);
    let (mut c, reply) = dial_with(&s, "acme", &stale).await;
    assert_eq!(reply["connect"]["expires"], true, "{reply}");
    let started = std::time::Instant::now();
    assert_eq!(c.close_code().await, (3005, "expired".into()));
    assert!(started.elapsed() < Duration::from_secs(3));

    // Connecting again with the expired token: "token expired", so an SDK fetches a new one.
    let (mut again, reply) = dial_with(&s, "acme", &stale).await;
    assert_eq!(reply["error"]["code"], 109, "{reply}");
    assert_eq!(reply["error"]["message"], "token expired");
    assert_eq!(again.close_code().await.0, 3005);
}

#[tokio::test]
async fn a_refresh_with_a_refused_token_or_another_principal_ends_the_link_as_refused() {
    let files = Files::new();
    let (s, _) = jwt_server(&files).await;
    for bad in [
        "not-a-token".to_owned(),
        String::new(),
        token(SECRET_B, "acme", "alice", 60),
        token(SECRET_A, "acme", "mallory", 60),
    ] {
        let (mut c, _) = dial_with(&s, "acme", &token(SECRET_A, "acme", "alice", 60)).await;
        let id = c.id();
        c.send_text(&format!(r#"{{"id":{id},"refresh":{{"token":"{bad}"}}}}"#))
            .await;
        assert_eq!(
            c.close_code().await,
            (4500, "service authentication failed".into())
        );
    }
}

fn unsigned(claims: Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#);
    format!("{header}.{}.", URL_SAFE_NO_PAD.encode(claims.to_string()))
}

#[tokio::test]
async fn alg_none_a_wrong_key_a_wrong_tenant_and_a_wrong_audience_are_refused_identically() {
    let files = Files::new();
    let (s, live) = jwt_server(&files).await;
    let exp = unix_now() + 60;
    let good = json!({"sub": "alice", "tenant": "acme", "exp": exp, "aud": "hostlink"});
    let mut wrong_tenant = good.clone();
    wrong_tenant["tenant"] = json!("beta");
    let mut wrong_aud = good.clone();
    wrong_aud["aud"] = json!("elsewhere");
    let mut early = good.clone();
    early["nbf"] = json!(exp);
    let refused = [
        unsigned(good.clone()),
        hs256(SECRET_B, good.clone()),
        hs256(SECRET_A, wrong_tenant),
        hs256(SECRET_A, wrong_aud),
        hs256(SECRET_A, early),
        token_of("beta"),
    ];
    for t in &refused {
        let mut c = s.dial("/hostlink/acme", None).await.unwrap();
        c.send_text(&format!(
            r#"{{"id":1,"connect":{{"token":"{t}","data":{{"supported_versions":[1]}}}}}}"#
        ))
        .await;
        // No reply at all: the close alone, the same for each.
        assert_eq!(
            c.next().await,
            Seen::Close(4500, "service authentication failed".into())
        );
    }
    // The log and the metrics know which check failed.
    let counts: std::collections::HashMap<_, _> = live.refusal_counts().into_iter().collect();
    for reason in [
        RefusalReason::AlgorithmNotAllowed,
        RefusalReason::BadSignature,
        RefusalReason::WrongTenant,
        RefusalReason::WrongAudience,
        RefusalReason::NotYetValid,
        RefusalReason::WrongToken,
    ] {
        assert_eq!(counts[&reason], 1, "{reason:?}");
    }
    // And the token that passes every check connects.
    let (_c, reply) = dial_with(&s, "acme", &hs256(SECRET_A, good)).await;
    assert!(reply.get("connect").is_some(), "{reply}");
}

async fn is_open(c: &mut Client) -> bool {
    let id = c.id();
    c.send_text(&format!(
        r#"{{"id":{id},"rpc":{{"method":"no.such.method"}}}}"#
    ))
    .await;
    loop {
        match c.next().await {
            Seen::Json(v) if v["id"] == id => return true,
            Seen::Json(_) => continue,
            _ => return false,
        }
    }
}

#[tokio::test]
async fn replacing_a_tenants_key_closes_only_the_links_that_used_it_and_a_broken_file_changes_nothing()
 {
    let files = Files::new();
    let (s, live) = jwt_server(&files).await;
    tokio::spawn(live.clone().follow(Duration::from_millis(200)));
    let (mut a1, _) = dial_with(&s, "acme", &token(SECRET_A, "acme", "alice", 600)).await;
    let (mut a2, _) = dial_with(&s, "acme", &token(SECRET_A, "acme", "bob", 600)).await;
    let (mut b, _) = s.connect("beta").await;
    assert!(is_open(&mut a1).await && is_open(&mut b).await);

    // The key file is replaced while the links are up.
    files.write("acme.secret", SECRET_B);
    let started = std::time::Instant::now();
    assert_eq!(a1.close_code().await, (4502, "credential revoked".into()));
    assert_eq!(a2.close_code().await.0, 4502);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert!(is_open(&mut b).await, "another tenant's link stays up");
    let (mut a3, reply) = dial_with(&s, "acme", &token(SECRET_B, "acme", "alice", 600)).await;
    assert!(reply.get("connect").is_some(), "{reply}");

    // A broken credentials file is refused whole: what is in force stays, no link closes.
    let before = files.path("credentials");
    let kept = std::fs::read_to_string(&before).unwrap();
    files.write("credentials", &format!("{kept}gamma not-a-digest\n"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(is_open(&mut a3).await && is_open(&mut b).await);
    assert!(live.reload().unwrap_err().to_string().contains("entry 3"));

    // Removing a tenant's line closes its links.
    files.write(
        "credentials",
        "acme jwt hs256 acme.secret aud=hostlink leeway=0\n",
    );
    assert_eq!(b.close_code().await.0, 4502);
    assert!(is_open(&mut a3).await);
}
