//! Connect rate: links per second, each a TCP connect, the WebSocket upgrade, the `connect`
//! command and its reply, then the close, over loopback against the real HostLink router.
//! Opaque tokens (a SHA-256 digest compare), JWT HS256 and JWT ES256 (keys generated with
//! `openssl` at start) in the same run, each sequentially and with 8 links connecting at once;
//! printed with each JWT kind's ratio to opaque. `HOSTLINK_CONNECT_N` links per measurement
//! (default 400).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use hostlink::auth::{AuthVerifier, CredentialStore, credential_digest_hex};
use hostlink::jwt::{JwtAlgorithm, SigningKey};
use hostlink::records::{
    AttachRequest, BindRequest, DrainObservation, DrainRequest, RegistryObservation, UnbindRequest,
};
use hostlink_server::backend::{LinkBackend, LinkCtx, Refusal, SessionFeed};
use hostlink_server::{LinkOptions, hostlink_router};
use sessionstore::{CommandId, SessionId, TenantId};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message;

/// A backend that only authenticates: the bench measures the handshake.
struct AuthOnly {
    auth: CredentialStore,
    invalidations: broadcast::Sender<(TenantId, SessionId)>,
}

#[async_trait]
impl LinkBackend for AuthOnly {
    fn server_version(&self) -> String {
        "bench".into()
    }
    fn capability_tokens(&self) -> Vec<String> {
        Vec::new()
    }
    fn accepting_links(&self) -> bool {
        true
    }
    fn auth(&self) -> &dyn AuthVerifier {
        &self.auth
    }
    async fn attach(&self, _: &LinkCtx, _: AttachRequest) -> Result<RegistryObservation, Refusal> {
        Err(Refusal::BadRequest)
    }
    async fn bind(&self, _: &LinkCtx, _: BindRequest) -> Result<SessionFeed, Refusal> {
        Err(Refusal::BadRequest)
    }
    async fn unbind(&self, _: &LinkCtx, _: UnbindRequest) -> Result<(), Refusal> {
        Err(Refusal::BadRequest)
    }
    async fn drain(&self, _: &LinkCtx, _: DrainRequest) -> Result<DrainObservation, Refusal> {
        Err(Refusal::BadRequest)
    }
    async fn drain_status(
        &self,
        _: &LinkCtx,
        _: DrainRequest,
    ) -> Result<DrainObservation, Refusal> {
        Err(Refusal::BadRequest)
    }
    async fn deliver(&self, _: &LinkCtx, _: &SessionId, _: &CommandId) -> Result<(), Refusal> {
        Err(Refusal::BadRequest)
    }
    fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.invalidations.subscribe()
    }
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let status = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl {args:?}");
}

/// One link: connect, handshake, close.
async fn one_link(url: &str, token: &str) {
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade");
    let connect = format!(
        r#"{{"id":1,"connect":{{"token":"{token}","data":{{"supported_versions":[1]}}}}}}"#
    );
    ws.send(Message::text(connect)).await.expect("send");
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                assert!(t.as_str().contains("\"connect\""), "refused: {t}");
                break;
            }
            Some(Ok(_)) => continue,
            other => panic!("the link ended: {other:?}"),
        }
    }
    let _ = ws.close(None).await;
}

/// Links per second for `n` links, `parallel` at a time.
async fn rate(url: &str, token: &str, n: usize, parallel: usize) -> f64 {
    let started = Instant::now();
    let per = n / parallel;
    let mut tasks = Vec::new();
    for _ in 0..parallel {
        let (url, token) = (url.to_owned(), token.to_owned());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per {
                one_link(&url, &token).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("a connecting task");
    }
    (per * parallel) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("HOSTLINK_CONNECT_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let dir = std::env::temp_dir().join(format!("hostlink-connect-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("hs.secret"),
        "a bench secret of at least thirty-two bytes",
    )
    .unwrap();
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
    let opaque_token = "an opaque bench token of a realistic length, 43 chars";
    let mut store = CredentialStore::empty();
    store
        .add_file_text_in(
            "bench",
            &format!(
                "opaque {}\nhs jwt hs256 hs.secret\nes jwt es256 es.pub\n",
                credential_digest_hex(opaque_token)
            ),
            Some(&dir),
        )
        .unwrap();
    let hs = SigningKey::from_file(JwtAlgorithm::Hs256, &dir.join("hs.secret"), None)
        .unwrap()
        .mint("hs", "bench", 3600, None, None)
        .unwrap();
    let es = SigningKey::from_file(JwtAlgorithm::Es256, &dir.join("es.key"), None)
        .unwrap()
        .mint("es", "bench", 3600, None, None)
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let backend = Arc::new(AuthOnly {
        auth: store,
        invalidations: broadcast::channel(4).0,
    });
    let options = LinkOptions {
        max_tenant_links: 100_000,
        ..LinkOptions::default()
    };
    let (router, _handle) = hostlink_router(backend, options.validate().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let kinds = [
        ("opaque", "opaque", opaque_token.to_owned()),
        ("HS256", "hs", hs),
        ("ES256", "es", es),
    ];
    // Warm up every path once.
    for (_, tenant, token) in &kinds {
        rate(&format!("ws://{addr}/hostlink/{tenant}"), token, 50, 1).await;
    }
    // The kinds take turns in rounds (a different one first each round), so the machine's
    // drift while the bench runs falls on all of them alike; each kind's rate is its links
    // over its own time summed across the rounds.
    const ROUNDS: usize = 5;
    for parallel in [1, 8] {
        let mut spent = [Duration::ZERO; 3];
        let mut done = [0usize; 3];
        for round in 0..ROUNDS {
            for turn in 0..kinds.len() {
                let k = (round + turn) % kinds.len();
                let (_, tenant, token) = &kinds[k];
                let url = format!("ws://{addr}/hostlink/{tenant}");
                let per_round = (n / ROUNDS).max(parallel);
                let r = rate(&url, token, per_round, parallel).await;
                let links = per_round / parallel * parallel;
                spent[k] += Duration::from_secs_f64(links as f64 / r);
                done[k] += links;
            }
        }
        let rates: Vec<f64> = (0..kinds.len())
            .map(|k| done[k] as f64 / spent[k].as_secs_f64())
            .collect();
        println!(
            "connect rate, {parallel} at a time: opaque {:.0} links/s",
            rates[0]
        );
        for k in 1..kinds.len() {
            println!(
                "connect rate, {parallel} at a time: JWT {} {:.0} links/s ({:.2} of opaque)",
                kinds[k].0,
                rates[k],
                rates[k] / rates[0]
            );
        }
    }
}
