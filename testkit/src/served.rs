//! A composed Host behind its real listener on a free loopback port (HostLink, probes and
//! metrics over real sockets), with tenant credentials minted for the test, and a minimal
//! HTTP GET for the probes.

use controller::Controller as Factory;
use host::Host;
use host::{Options, Service};
use hostlink::auth::{AuthVerifier, CredentialStore, credential_digest_hex, mint_credential};
use hostlink_server::LinkOptions;
use sessionstore::testing::TestStore;
use sessionstore::{AgentId, CommandId, CompatibilityId, SessionId, TenantId};
use tokio::net::TcpListener;

use crate::fixture::{AGENT, BUILD, options, started};

pub struct Served {
    pub service: Service,
    pub server: Host,
    pub base: String,
    pub tokens: Vec<(TenantId, String)>,
}

impl Served {
    pub fn token(&self, tenant: &str) -> String {
        self.tokens
            .iter()
            .find(|(t, _)| t.as_str() == tenant)
            .map(|(_, k)| k.clone())
            .expect("a token for the tenant")
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.local_addr())
    }
}

/// A started Host serving HostLink and its probes on a free loopback port, with
/// credentials for tenants `acme` and `globex`.
pub async fn serve(ts: &TestStore, host: &str, adjust: impl FnOnce(&mut Options)) -> Served {
    serve_with_link(ts, host, adjust, LinkOptions::default()).await
}

/// [`serve`] with the given HostLink options.
pub async fn serve_with_link(
    ts: &TestStore,
    host: &str,
    adjust: impl FnOnce(&mut Options),
    link: LinkOptions,
) -> Served {
    let tokens = ["acme", "globex"]
        .into_iter()
        .map(|t| {
            let (token, _) = mint_credential();
            (TenantId::new(t).unwrap(), token.expose_secret().to_owned())
        })
        .collect();
    serve_with_tokens(ts, host, adjust, link, tokens).await
}

/// [`serve_with_link`] accepting the given tenant tokens (a fleet's Hosts share a tenant's
/// credential: pass another Host's `tokens`).
pub async fn serve_with_tokens(
    ts: &TestStore,
    host: &str,
    adjust: impl FnOnce(&mut Options),
    link: LinkOptions,
    tokens: Vec<(TenantId, String)>,
) -> Served {
    let mut creds = CredentialStore::empty();
    for (tenant, token) in &tokens {
        creds
            .add(tenant.clone(), &credential_digest_hex(token))
            .unwrap();
    }
    serve_with_verifier(ts, host, adjust, link, Box::new(creds), tokens).await
}

/// [`serve_with_link`] checking links with `auth` (e.g. JWT credentials from a file); `tokens`
/// are what [`Served::token`] hands out (a controller's credential for each tenant).
pub async fn serve_with_verifier(
    ts: &TestStore,
    host: &str,
    adjust: impl FnOnce(&mut Options),
    link: LinkOptions,
    auth: Box<dyn AuthVerifier>,
    tokens: Vec<(TenantId, String)>,
) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut opts = options(host);
    opts.internal_endpoint = Some(format!("ws://{addr}"));
    adjust(&mut opts);
    let (service, _) = started(ts, opts).await;
    let link = link.validate().unwrap();
    let server = Host::builder(service.clone())
        .auth(auth)
        .link(link)
        .serve(listener)
        .await
        .unwrap();
    Served {
        service,
        server,
        base: format!("ws://{addr}"),
        tokens,
    }
}

pub async fn get(url: &str) -> (u16, String) {
    get_with(url, &[]).await
}

/// [`get`] with extra request headers (`("Accept", "application/json")`).
pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    // A minimal HTTP/1.1 GET over a real socket (no client library needed).
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (authority, path) = rest
        .split_once('/')
        .map(|(a, p)| (a, format!("/{p}")))
        .unwrap();
    let mut s = tokio::net::TcpStream::connect(authority).await.unwrap();
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {authority}\r\n{extra}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// A controller for `tenant` on the served Host.
pub fn factory(ts: &TestStore, s: &Served, tenant: &str) -> Factory {
    Factory::new(
        ts.store.clone(),
        TenantId::new(tenant).unwrap(),
        s.token(tenant),
    )
}

/// Creates `session` for the test agent (idempotent), optionally with a first message.
pub async fn create(f: &Factory, session: &SessionId, first: Option<String>, create: &str) {
    f.create_session(
        session.clone(),
        AgentId::new(AGENT).unwrap(),
        CompatibilityId::new(BUILD).unwrap(),
        first,
        CommandId::new(create).unwrap(),
    )
    .await
    .unwrap();
}

pub fn sid(name: &str) -> SessionId {
    SessionId::new(format!("{name}-{}", uuid::Uuid::now_v7())).unwrap()
}
