//! Test support: an in-memory [`LinkBackend`] (this crate's own behaviour is what the suite
//! tests; the Host's real backend is tested in `host`), a real axum server on 127.0.0.1:0 and a
//! real WebSocket client (tokio-tungstenite).

#![allow(dead_code)]

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use hostlink::auth::{AuthVerifier, CredentialStore, credential_digest_hex};
use hostlink::live_credentials::LiveCredentials;
use hostlink::records::{
    AttachRequest, BindRequest, DrainObservation, DrainRequest, DrainState, EnduringPublication,
    EphemeralPublication, HostLinkError, PreviewStream, RegistryObservation, SessionScope,
    UnbindRequest, V1,
};
use hostlink::timestamp::Timestamp;
use hostlink_server::backend::{
    ExtensionReply, FeedItem, LinkBackend, LinkCtx, Refusal, SessionFeed,
};
use hostlink_server::{HostLinkHandle, LinkOptions, StreamPublication, hostlink_router};
use serde_json::Value;
use serde_json::value::RawValue;
use sessionstore::{
    AgentId, CommandId, CompatibilityId, EventId, HostId, Placement, ResidencyState, SessionId,
    TenantId,
};
use tokio::net::TcpStream;
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Message, http};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const HOST: &str = "host-1";
pub const BUILD: &str = "build-1";
pub const GENERATION: u64 = 1;
pub const FIXED_SESSION: &str = "fixed";
pub const TOKENS: [&str; 4] = [
    "hostlink.command.gate_response",
    "hostlink.attribution.principal",
    "hostlink.payload.reference",
    "hostlink.run",
];

pub fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}
pub fn session(s: &str) -> SessionId {
    SessionId::new(s).unwrap()
}
/// The credential every test tenant uses: its name with a suffix.
pub fn token_of(tenant: &str) -> String {
    format!("secret-of-{tenant}")
}

struct Resident {
    epoch: u64,
    agent: String,
    feed: broadcast::Sender<FeedItem>,
}

#[derive(Default)]
struct State {
    residents: HashMap<(TenantId, SessionId), Resident>,
    deliveries: Vec<(TenantId, SessionId, CommandId)>,
    drain: Option<(SessionScope, u64)>,
    next_epoch: u64,
}

/// An in-memory Host: sessions become resident on attach, bind hands out broadcast
/// receivers, a delivery is recorded and (if asked) answered with enduring publications.
pub struct TestBackend {
    credentials: Arc<LiveCredentials>,
    accepting: AtomicBool,
    state: Mutex<State>,
    invalidations: broadcast::Sender<(TenantId, SessionId)>,
    pub feed_capacity: usize,
    /// On each delivery, publish this many enduring records echoing the command id.
    pub echo_deliveries: u64,
}

impl TestBackend {
    pub fn new(tenants: &[&str]) -> TestBackend {
        let mut credentials = CredentialStore::empty();
        for t in tenants {
            credentials
                .add(tenant(t), &credential_digest_hex(&token_of(t)))
                .unwrap();
        }
        TestBackend {
            credentials: Arc::new(LiveCredentials::fixed(credentials)),
            accepting: AtomicBool::new(true),
            state: Mutex::new(State {
                next_epoch: 7,
                ..State::default()
            }),
            invalidations: broadcast::channel(64).0,
            feed_capacity: 256,
            echo_deliveries: 0,
        }
    }

    /// The same backend checking links against `credentials` (e.g. a file it reloads).
    pub fn with_credentials(mut self, credentials: Arc<LiveCredentials>) -> TestBackend {
        self.credentials = credentials;
        self
    }

    pub fn set_accepting(&self, accepting: bool) {
        self.accepting.store(accepting, Ordering::SeqCst);
    }

    pub fn deliveries(&self) -> Vec<(TenantId, SessionId, CommandId)> {
        self.state.lock().unwrap().deliveries.clone()
    }

    pub fn epoch(&self, t: &str, s: &str) -> u64 {
        self.state.lock().unwrap().residents[&(tenant(t), session(s))].epoch
    }

    /// Makes a session resident without going through a link.
    pub fn make_resident(&self, t: &str, s: &str) -> u64 {
        let mut st = self.state.lock().unwrap();
        st.next_epoch += 1;
        let epoch = st.next_epoch;
        st.residents.insert(
            (tenant(t), session(s)),
            Resident {
                epoch,
                agent: "agent-1".into(),
                feed: broadcast::channel(self.feed_capacity).0,
            },
        );
        epoch
    }

    fn sender(&self, t: &str, s: &str) -> broadcast::Sender<FeedItem> {
        self.state.lock().unwrap().residents[&(tenant(t), session(s))]
            .feed
            .clone()
    }

    pub fn receivers(&self, t: &str, s: &str) -> usize {
        self.sender(t, s).receiver_count()
    }

    /// Publishes an enduring record; `Err` when no link holds the feed any more.
    pub fn publish(&self, t: &str, s: &str, seq: u64, body: &str) -> Result<usize, ()> {
        let record = enduring(t, s, seq, body);
        self.sender(t, s)
            .send(FeedItem::Enduring(Arc::new(StreamPublication {
                offset: seq,
                record,
            })))
            .map_err(|_| ())
    }

    pub fn preview(&self, t: &str, s: &str, text: &str) {
        let p = EphemeralPublication::delta(tenant(t), session(s), PreviewStream::Text, text);
        let _ = self.sender(t, s).send(FeedItem::Ephemeral(Arc::new(p)));
    }

    /// Offers any preview (reasoning, tool step) on the session's feed.
    pub fn preview_record(&self, t: &str, s: &str, p: EphemeralPublication) {
        let _ = self.sender(t, s).send(FeedItem::Ephemeral(Arc::new(p)));
    }

    /// The session's tail ended: its feed is dropped and its routes invalidated.
    pub fn end_tail(&self, t: &str, s: &str) {
        self.state
            .lock()
            .unwrap()
            .residents
            .remove(&(tenant(t), session(s)));
        let _ = self.invalidations.send((tenant(t), session(s)));
    }

    fn check_host(&self, host: &HostId, generation: NonZeroU64) -> Result<(), Refusal> {
        if host.as_str() != HOST || generation.get() != GENERATION {
            return Err(HostLinkError::RuntimeUnavailable.into());
        }
        Ok(())
    }
}

pub fn enduring(t: &str, s: &str, seq: u64, body: &str) -> EnduringPublication {
    EnduringPublication::new(
        tenant(t),
        session(s),
        EventId::new(format!("event-{seq}")).unwrap(),
        NonZeroU64::new(seq).unwrap(),
        seq,
        RawValue::from_string(body.to_owned()).unwrap(),
    )
    .unwrap()
}

#[async_trait]
impl LinkBackend for TestBackend {
    fn server_version(&self) -> String {
        "host-test-0.1".into()
    }

    fn capability_tokens(&self) -> Vec<String> {
        let mut v: Vec<String> = TOKENS.iter().map(|s| s.to_string()).collect();
        v.push("hostlink.bind".into()); // a reserved name is never advertised twice
        v
    }

    fn accepting_links(&self) -> bool {
        self.accepting.load(Ordering::SeqCst)
    }

    fn auth(&self) -> &dyn AuthVerifier {
        self.credentials.as_ref()
    }

    async fn attach(
        &self,
        link: &LinkCtx,
        req: AttachRequest,
    ) -> Result<RegistryObservation, Refusal> {
        assert_eq!(
            req.tenant_id, link.tenant,
            "the link checks the tenant first"
        );
        self.check_host(&req.host_id, req.host_generation)?;
        if req
            .runtime_compatibility_id
            .as_ref()
            .is_some_and(|b| b.as_str() != BUILD)
        {
            return Err(HostLinkError::RuntimeMismatch {
                runtime_compatibility_id: CompatibilityId::new(BUILD).unwrap(),
            }
            .into());
        }
        if req.agent_id.as_str() == "hang" {
            std::future::pending::<()>().await;
        }
        if req.agent_id.as_str() == "explode" {
            return Err(Refusal::Internal("the test backend failed".into()));
        }
        let mut st = self.state.lock().unwrap();
        let key = (req.tenant_id.clone(), req.session_id.clone());
        if !st.residents.contains_key(&key) {
            st.next_epoch += 1;
            let epoch = st.next_epoch;
            st.residents.insert(
                key.clone(),
                Resident {
                    epoch,
                    agent: req.agent_id.as_str().to_owned(),
                    feed: broadcast::channel(self.feed_capacity).0,
                },
            );
        }
        let r = &st.residents[&key];
        Ok(RegistryObservation {
            version: V1,
            tenant_id: req.tenant_id,
            session_id: req.session_id,
            host_id: req.host_id,
            host_generation: req.host_generation,
            agent_id: AgentId::new(r.agent.clone()).unwrap(),
            runtime_compatibility_id: CompatibilityId::new(BUILD).unwrap(),
            placement: Placement::Dedicated,
            internal_endpoint: "ws://127.0.0.1:1".into(),
            residency: ResidencyState::Resident,
            accepting: true,
            lease_epoch: NonZeroU64::new(r.epoch).unwrap(),
            observed_at: Timestamp::from_unix_millis(1_700_000_000_000).unwrap(),
            expires_at: Timestamp::from_unix_millis(1_700_000_020_000).unwrap(),
        })
    }

    async fn bind(&self, link: &LinkCtx, req: BindRequest) -> Result<SessionFeed, Refusal> {
        assert_eq!(
            req.tenant_id, link.tenant,
            "the link checks the tenant first"
        );
        self.check_host(&req.host_id, req.host_generation)?;
        let st = self.state.lock().unwrap();
        let Some(r) = st
            .residents
            .get(&(req.tenant_id.clone(), req.session_id.clone()))
        else {
            return Err(HostLinkError::RuntimeUnavailable.into());
        };
        if req.runtime_compatibility_id.as_str() != BUILD {
            return Err(HostLinkError::RuntimeMismatch {
                runtime_compatibility_id: CompatibilityId::new(BUILD).unwrap(),
            }
            .into());
        }
        if req.lease_epoch.get() != r.epoch {
            return Err(HostLinkError::EpochMismatch {
                current_lease_epoch: NonZeroU64::new(r.epoch),
            }
            .into());
        }
        Ok(SessionFeed::new(r.feed.subscribe()))
    }

    async fn unbind(&self, link: &LinkCtx, req: UnbindRequest) -> Result<(), Refusal> {
        assert_eq!(req.tenant_id, link.tenant);
        self.check_host(&req.host_id, req.host_generation)
    }

    async fn drain(&self, link: &LinkCtx, req: DrainRequest) -> Result<DrainObservation, Refusal> {
        self.check_host(&req.host_id, req.host_generation)?;
        let scope = req
            .scope
            .clone()
            .expect("the link refuses an unscoped drain");
        assert_eq!(scope.tenant_id, link.tenant);
        let mut st = self.state.lock().unwrap();
        let holds = scope.session_id.as_str() == FIXED_SESSION
            && st
                .residents
                .contains_key(&(scope.tenant_id.clone(), scope.session_id.clone()));
        if !holds {
            return Err(HostLinkError::RuntimeUnavailable.into());
        }
        if st.drain.is_none() {
            st.drain = Some((scope.clone(), 1));
        }
        Ok(DrainObservation {
            host_id: req.host_id,
            host_generation: req.host_generation,
            drain_generation: NonZeroU64::new(1).unwrap(),
            state: DrainState::Draining,
            scope: Some(scope),
        })
    }

    async fn drain_status(
        &self,
        link: &LinkCtx,
        req: DrainRequest,
    ) -> Result<DrainObservation, Refusal> {
        self.check_host(&req.host_id, req.host_generation)?;
        let scope = req
            .scope
            .clone()
            .expect("the link refuses an unscoped drain");
        assert_eq!(scope.tenant_id, link.tenant);
        let st = self.state.lock().unwrap();
        match &st.drain {
            Some((begun, generation)) if *begun == scope => Ok(DrainObservation {
                host_id: req.host_id,
                host_generation: req.host_generation,
                drain_generation: NonZeroU64::new(*generation).unwrap(),
                state: DrainState::Draining,
                scope: Some(scope),
            }),
            _ => Err(HostLinkError::RuntimeUnavailable.into()),
        }
    }

    async fn deliver(
        &self,
        link: &LinkCtx,
        s: &SessionId,
        command: &CommandId,
    ) -> Result<(), Refusal> {
        let sender = {
            let mut st = self.state.lock().unwrap();
            let key = (link.tenant.clone(), s.clone());
            let Some(r) = st.residents.get(&key) else {
                return Err(HostLinkError::RuntimeUnavailable.into());
            };
            let sender = r.feed.clone();
            st.deliveries
                .push((link.tenant.clone(), s.clone(), command.clone()));
            sender
        };
        for i in 1..=self.echo_deliveries {
            let body = format!(r#"{{"kind":"applied","command_id":"{}","n":{i}}}"#, command);
            let record = enduring(link.tenant.as_str(), s.as_str(), i, &body);
            let _ = sender.send(FeedItem::Enduring(Arc::new(StreamPublication {
                offset: i,
                record,
            })));
        }
        Ok(())
    }

    fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.invalidations.subscribe()
    }

    async fn extension_rpc(
        &self,
        link: &LinkCtx,
        method: &str,
        _data: Option<&RawValue>,
    ) -> ExtensionReply {
        if method == "run.ps" {
            let body = format!(r#"{{"tenant":"{}","runs":[]}}"#, link.tenant);
            return ExtensionReply::Done(Ok(RawValue::from_string(body).unwrap()));
        }
        ExtensionReply::NotFound
    }
}

/// A HostLink server on a real socket.
pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub backend: Arc<TestBackend>,
    pub handle: HostLinkHandle,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Options with a quiet heartbeat (tests that need pings set their own).
pub fn quiet_options() -> LinkOptions {
    LinkOptions {
        ping_interval: Duration::from_secs(60),
        pong_timeout: Duration::from_secs(30),
        max_frame_bytes: hostlink::frame::DEFAULT_MAX_FRAME_BYTES,
        ..LinkOptions::default()
    }
}

impl TestServer {
    pub async fn start(backend: TestBackend, options: LinkOptions) -> TestServer {
        let backend = Arc::new(backend);
        let (router, handle) = hostlink_router(backend.clone(), options.validate().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        TestServer {
            addr,
            backend,
            handle,
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("ws://{}{}", self.addr, path)
    }

    pub fn tenant_url(&self, tenant: &str) -> String {
        self.url(&format!("/hostlink/{tenant}"))
    }

    /// Opens a WebSocket, or gives the HTTP status it was refused with.
    pub async fn dial(&self, path: &str, subprotocol: Option<&str>) -> Result<Client, u16> {
        let mut request = self.url(path).into_client_request().unwrap();
        if let Some(p) = subprotocol {
            request.headers_mut().insert(
                "Sec-WebSocket-Protocol",
                http::HeaderValue::from_str(p).unwrap(),
            );
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((ws, response)) => Ok(Client {
                ws,
                selected_protocol: response
                    .headers()
                    .get("Sec-WebSocket-Protocol")
                    .map(|v| v.to_str().unwrap().to_owned()),
                queued: Vec::new(),
                next_id: 0,
            }),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                Err(response.status().as_u16())
            }
            Err(e) => panic!("dial failed: {e}"),
        }
    }

    /// Dials and completes the connect handshake as `tenant` with its credential.
    pub async fn connect(&self, tenant: &str) -> (Client, Value) {
        let mut c = self
            .dial(&format!("/hostlink/{tenant}"), None)
            .await
            .unwrap();
        let reply = c.handshake(&token_of(tenant)).await;
        (c, reply)
    }
}

/// What the server did to a client.
#[derive(Debug, PartialEq)]
pub enum Seen {
    Json(Value),
    Close(u16, String),
    Ended,
}

pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    pub selected_protocol: Option<String>,
    queued: Vec<String>,
    next_id: u32,
}

pub const WAIT: Duration = Duration::from_secs(5);

/// Asks `pred` every 20 ms until it holds, failing after 20 s with `what` (the test kit's wait;
/// this crate's tests build no Host and so no test kit).
pub async fn wait_until(what: &str, mut pred: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !pred() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Client {
    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text.to_owned())).await.unwrap();
    }

    pub async fn send_binary(&mut self, bytes: &[u8]) {
        self.ws.send(Message::binary(bytes.to_vec())).await.unwrap();
    }

    /// The next raw line the server sent (a batched frame is split into its lines), or how
    /// the link ended.
    pub async fn next_line(&mut self) -> Result<String, Seen> {
        if !self.queued.is_empty() {
            return Ok(self.queued.remove(0));
        }
        loop {
            let m = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("the server said nothing in time");
            match m {
                None | Some(Err(_)) => return Err(Seen::Ended),
                Some(Ok(Message::Text(t))) => {
                    let mut lines: Vec<String> =
                        t.as_str().split('\n').map(str::to_owned).collect();
                    let first = lines.remove(0);
                    self.queued.extend(lines);
                    return Ok(first);
                }
                Some(Ok(Message::Close(frame))) => {
                    return Err(match frame {
                        Some(CloseFrame { code, reason }) => {
                            Seen::Close(u16::from(code), reason.as_str().to_owned())
                        }
                        None => Seen::Close(1005, String::new()),
                    });
                }
                Some(Ok(_)) => continue,
            }
        }
    }

    /// The next reply, push or ping, or the close.
    pub async fn next(&mut self) -> Seen {
        match self.next_line().await {
            Ok(line) => {
                Seen::Json(serde_json::from_str(&line).expect("the server sent JSON lines"))
            }
            Err(seen) => seen,
        }
    }

    pub async fn json(&mut self) -> Value {
        match self.next().await {
            Seen::Json(v) => v,
            other => panic!("expected JSON, got {other:?}"),
        }
    }

    /// Reads until the close frame, skipping anything before it, then keeps reading (which
    /// sends the client's close frame in answer) until the server ends the connection.
    pub async fn close_code(&mut self) -> (u16, String) {
        let closed = loop {
            match self.next().await {
                Seen::Json(_) => continue,
                Seen::Close(code, reason) => break (code, reason),
                Seen::Ended => return (1006, String::new()),
            }
        };
        let drained = tokio::time::timeout(WAIT, async {
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
        assert!(
            drained.is_ok(),
            "the server kept the connection open after closing"
        );
        closed
    }

    pub async fn handshake(&mut self, token: &str) -> Value {
        self.send_text(&format!(
            r#"{{"id":1,"connect":{{"token":"{token}","data":{{"supported_versions":[1]}},"name":"rust-test","version":"0"}}}}"#
        ))
        .await;
        self.next_id = 1;
        self.json().await
    }

    pub fn id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends an RPC and returns the reply with its id checked.
    pub async fn rpc(&mut self, method: &str, data: &str) -> Value {
        let id = self.id();
        self.send_text(&format!(
            r#"{{"id":{id},"rpc":{{"method":"{method}","data":{data}}}}}"#
        ))
        .await;
        self.reply(id).await
    }

    pub async fn command(&mut self, method: &str, body: &str) -> Value {
        let id = self.id();
        self.send_text(&format!(r#"{{"id":{id},"{method}":{body}}}"#))
            .await;
        self.reply(id).await
    }

    /// The reply to `id`, skipping pushes and pings (which are kept for later).
    pub async fn reply(&mut self, id: u32) -> Value {
        let mut skipped = Vec::new();
        loop {
            let line = match self.next_line().await {
                Ok(line) => line,
                Err(seen) => panic!("expected the reply to {id}, got {seen:?}"),
            };
            let v: Value = serde_json::from_str(&line).expect("the server sent JSON lines");
            if v["id"] == id {
                let mut rest = std::mem::take(&mut self.queued);
                skipped.append(&mut rest);
                self.queued = skipped;
                return v;
            }
            skipped.push(line);
        }
    }

    /// The next push (skipping pings).
    pub async fn push(&mut self) -> Value {
        loop {
            let v = self.json().await;
            if v.get("push").is_some() {
                return v["push"].clone();
            }
        }
    }
}

pub fn attach_data(t: &str, s: &str) -> String {
    format!(
        r#"{{"version":1,"tenant_id":"{t}","session_id":"{s}","host_id":"{HOST}","host_generation":{GENERATION},"agent_id":"agent-1","runtime_compatibility_id":"{BUILD}","mode":"create","actor_id":"actor-1","idempotency_key":"k-{s}"}}"#
    )
}

pub fn bind_data(t: &str, s: &str, epoch: u64) -> String {
    format!(
        r#"{{"version":1,"tenant_id":"{t}","session_id":"{s}","host_id":"{HOST}","host_generation":{GENERATION},"lease_epoch":{epoch},"runtime_compatibility_id":"{BUILD}","idempotency_key":"b-{s}"}}"#
    )
}

pub fn unbind_data(t: &str, s: &str, epoch: u64) -> String {
    format!(
        r#"{{"version":1,"tenant_id":"{t}","session_id":"{s}","host_id":"{HOST}","host_generation":{GENERATION},"lease_epoch":{epoch},"idempotency_key":"u-{s}"}}"#
    )
}

pub fn drain_data(scope: Option<(&str, &str)>) -> String {
    match scope {
        None => format!(
            r#"{{"version":1,"host_id":"{HOST}","host_generation":{GENERATION},"idempotency_key":"d"}}"#
        ),
        Some((t, s)) => format!(
            r#"{{"version":1,"host_id":"{HOST}","host_generation":{GENERATION},"idempotency_key":"d","tenant_id":"{t}","session_id":"{s}"}}"#
        ),
    }
}

pub fn channel(t: &str, s: &str) -> String {
    hostlink::channel::session_channel(&tenant(t), &session(s))
}

/// Attaches and binds `s` for `t` on `c`, returning the lease epoch.
pub async fn attach_and_bind(c: &mut Client, t: &str, s: &str) -> u64 {
    let attach = c.rpc("hostlink.attach", &attach_data(t, s)).await;
    let epoch = attach["rpc"]["data"]["lease_epoch"]
        .as_u64()
        .unwrap_or_else(|| panic!("attach failed: {attach}"));
    let bind = c.rpc("hostlink.bind", &bind_data(t, s, epoch)).await;
    assert_eq!(bind["rpc"]["data"], serde_json::json!({}), "{bind}");
    epoch
}

pub async fn subscribe(c: &mut Client, t: &str, s: &str, data: Option<&str>) -> Value {
    let body = match data {
        None => format!(r#"{{"channel":"{}"}}"#, channel(t, s)),
        Some(d) => format!(r#"{{"channel":"{}","data":{d}}}"#, channel(t, s)),
    };
    c.command("subscribe", &body).await
}
