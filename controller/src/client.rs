//! The HostLink client a controller uses: one WebSocket link to one Host for one tenant,
//! speaking the Centrifuge JSON client protocol. Owns the link's reader and writer tasks, the
//! table of requests in flight, application ping/pong and the routing of pushes to
//! subscriptions. It never decides placement: the controller does.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use sessionstore::{CommandId, SessionId, TenantId};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use hostlink::channel::session_channel;
use hostlink::records::{
    AttachRequest, BindRequest, Delivery, DrainObservation, DrainRequest, EnduringPublication,
    EphemeralPublication, HostLinkError, RegistryObservation, SubscribeOptions, UnbindRequest, V1,
};

/// How long a request waits for its reply, unless [`ClientOptions`] say otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connect (TCP, WebSocket upgrade and the connect reply together) may take, unless
/// [`ClientOptions`] say otherwise.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest either timeout may be.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// A client's timeouts. A Host that is frozen (its socket accepts, nothing answers) costs a
/// caller at most `connect_timeout` per dial and `request_timeout` per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: CONNECT_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

/// A client option refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid option {field}: {reason}")]
pub struct ClientOptionsError {
    pub field: &'static str,
    pub reason: String,
}

impl ClientOptions {
    /// Refuses a zero timeout or one above [`MAX_TIMEOUT`].
    pub fn validate(&self) -> Result<(), ClientOptionsError> {
        for (field, d) in [
            ("connect_timeout", self.connect_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() || d > MAX_TIMEOUT {
                return Err(ClientOptionsError {
                    field,
                    reason: format!("is {d:?}; must be positive and at most {MAX_TIMEOUT:?}"),
                });
            }
        }
        Ok(())
    }
}
/// How many pushes a subscription buffers before the link treats it as gone.
pub const SUBSCRIPTION_BUFFER: usize = 4096;

/// Why a client call failed (the transport, not the Host's refusal).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("connect: {0}")]
    Connect(String),
    #[error("the Host closed the link: code {code}: {reason}")]
    Disconnected { code: u16, reason: String },
    #[error("the Host answered error {code}: {message}")]
    Reply { code: u32, message: String },
    #[error("the Host's answer was not understood: {0}")]
    Protocol(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl ClientError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ClientError::Connect(_) => "connect",
            ClientError::Disconnected { .. } => "disconnected",
            ClientError::Reply { .. } => "reply",
            ClientError::Protocol(_) => "protocol",
            ClientError::Timeout(_) => "timeout",
        }
    }
}

/// A push on a session channel.
#[derive(Debug, Clone)]
pub enum Publication {
    Enduring(EnduringPublication),
    Ephemeral(EphemeralPublication),
    /// A step event on a run's channel.
    Run(hostlink::runs::RunEvent),
}

type Pending = Arc<Mutex<HashMap<u32, oneshot::Sender<Result<Value, ClientError>>>>>;
type Subscriptions = Arc<Mutex<HashMap<String, mpsc::Sender<Publication>>>>;

/// One link to a Host.
pub struct HostLinkClient {
    out: mpsc::UnboundedSender<String>,
    pending: Pending,
    subscriptions: Subscriptions,
    next_id: AtomicU32,
    closed: CancellationToken,
    close_reason: Arc<Mutex<Option<ClientError>>>,
    /// The connect reply's `hostlink_methods`.
    pub methods: Vec<String>,
    /// The connect reply's `client` id.
    pub client_id: String,
    /// The Host's build.
    pub server_version: String,
    tenant: TenantId,
    request_timeout: Duration,
}

impl std::fmt::Debug for HostLinkClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLinkClient")
            .field("tenant", &self.tenant)
            .field("client_id", &self.client_id)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// The tenant's HostLink address under a Host's base endpoint.
pub fn hostlink_url(base: &str, tenant: &TenantId) -> String {
    let mut escaped = String::new();
    for b in tenant.as_str().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            escaped.push(b as char);
        } else {
            escaped.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{}/hostlink/{escaped}", base.trim_end_matches('/'))
}

impl HostLinkClient {
    /// Dials `base` (`ws://host:port`) for `tenant`, presenting `token`, with the default
    /// timeouts.
    pub async fn connect(
        base: &str,
        tenant: &TenantId,
        token: &str,
        name: &str,
    ) -> Result<HostLinkClient, ClientError> {
        Self::connect_with(base, tenant, token, name, ClientOptions::default()).await
    }

    /// Dials `base` for `tenant` with `options`' timeouts: the whole connect (TCP, upgrade,
    /// connect reply) within `connect_timeout`, each later request within `request_timeout`.
    pub async fn connect_with(
        base: &str,
        tenant: &TenantId,
        token: &str,
        name: &str,
        options: ClientOptions,
    ) -> Result<HostLinkClient, ClientError> {
        let bound = options.connect_timeout;
        tokio::time::timeout(bound, Self::dial(base, tenant, token, name, options))
            .await
            .map_err(|_| ClientError::Timeout(bound))?
    }

    async fn dial(
        base: &str,
        tenant: &TenantId,
        token: &str,
        name: &str,
        options: ClientOptions,
    ) -> Result<HostLinkClient, ClientError> {
        let url = hostlink_url(base, tenant);
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        let (mut sink, mut stream) = ws.split();
        let connect = json!({
            "id": 1,
            "connect": {
                "token": token,
                "data": {"supported_versions": [1]},
                "name": name,
                "version": env!("CARGO_PKG_VERSION"),
            }
        });
        sink.send(Message::Text(connect.to_string().into()))
            .await
            .map_err(|e| ClientError::Connect(e.to_string()))?;
        // The first answer must be the connect reply.
        let reply = loop {
            let msg = stream.next().await;
            match msg {
                Some(Ok(Message::Text(t))) => {
                    let line = t.lines().next().unwrap_or("").to_owned();
                    break serde_json::from_str::<Value>(&line)
                        .map_err(|e| ClientError::Protocol(e.to_string()))?;
                }
                Some(Ok(Message::Close(frame))) => {
                    let (code, reason) = frame
                        .map(|f| (u16::from(f.code), f.reason.to_string()))
                        .unwrap_or((1005, String::new()));
                    return Err(ClientError::Disconnected { code, reason });
                }
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(ClientError::Connect(e.to_string())),
                None => {
                    return Err(ClientError::Disconnected {
                        code: 1006,
                        reason: "closed before the connect reply".into(),
                    });
                }
            }
        };
        if let Some(err) = reply.get("error") {
            return Err(reply_error(err));
        }
        let result = reply
            .get("connect")
            .ok_or_else(|| ClientError::Protocol(format!("not a connect reply: {reply}")))?;
        let methods = result
            .pointer("/data/hostlink_methods")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|m| m.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let client_id = result
            .get("client")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let server_version = result
            .get("version")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();

        let (out, mut out_rx) = mpsc::unbounded_channel::<String>();
        let pending: Pending = Arc::default();
        let subscriptions: Subscriptions = Arc::default();
        let closed = CancellationToken::new();
        let close_reason: Arc<Mutex<Option<ClientError>>> = Arc::default();
        // Writer.
        let w_closed = closed.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = w_closed.cancelled() => break,
                    m = out_rx.recv() => match m {
                        Some(text) => {
                            if sink.send(Message::Text(text.into())).await.is_err() {
                                w_closed.cancel();
                                break;
                            }
                        }
                        None => break,
                    }
                }
            }
            let _ = sink.close().await;
        });
        // Reader.
        let r_pending = pending.clone();
        let r_subs = subscriptions.clone();
        let r_closed = closed.clone();
        let r_reason = close_reason.clone();
        let r_out = out.clone();
        tokio::spawn(async move {
            let end = |reason: ClientError| {
                *lock(&r_reason) = Some(reason.clone());
                for (_, tx) in lock(&r_pending).drain() {
                    let _ = tx.send(Err(reason.clone()));
                }
                lock(&r_subs).clear();
                r_closed.cancel();
            };
            loop {
                let msg = tokio::select! {
                    _ = r_closed.cancelled() => break,
                    m = stream.next() => m,
                };
                match msg {
                    Some(Ok(Message::Text(t))) => {
                        for line in t.split('\n').filter(|l| !l.trim().is_empty()) {
                            handle_line(line, &r_pending, &r_subs, &r_out);
                        }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        let (code, reason) = frame
                            .map(|f| (u16::from(f.code), f.reason.to_string()))
                            .unwrap_or((1005, String::new()));
                        end(ClientError::Disconnected { code, reason });
                        break;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        end(ClientError::Disconnected {
                            code: 1006,
                            reason: e.to_string(),
                        });
                        break;
                    }
                    None => {
                        end(ClientError::Disconnected {
                            code: 1006,
                            reason: "the connection closed".into(),
                        });
                        break;
                    }
                }
            }
        });
        Ok(HostLinkClient {
            out,
            pending,
            subscriptions,
            next_id: AtomicU32::new(2),
            closed,
            close_reason,
            methods,
            client_id,
            server_version,
            tenant: tenant.clone(),
            request_timeout: options.request_timeout,
        })
    }

    /// The tenant this link authenticated as.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }

    /// True once the link has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Why the link ended, if it has.
    pub fn close_reason(&self) -> Option<ClientError> {
        lock(&self.close_reason).clone()
    }

    async fn request(&self, method: &str, body: Value) -> Result<Value, ClientError> {
        if let Some(reason) = self.close_reason() {
            return Err(reason);
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        lock(&self.pending).insert(id, tx);
        let mut cmd = serde_json::Map::new();
        cmd.insert("id".into(), Value::from(id));
        cmd.insert(method.into(), body);
        if self.out.send(Value::Object(cmd).to_string()).is_err() {
            lock(&self.pending).remove(&id);
            return Err(self.close_reason().unwrap_or(ClientError::Disconnected {
                code: 1006,
                reason: "the link is closed".into(),
            }));
        }
        match tokio::time::timeout(self.request_timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(self
                .close_reason()
                .unwrap_or(ClientError::Protocol("no reply".into()))),
            Err(_) => {
                lock(&self.pending).remove(&id);
                Err(ClientError::Timeout(self.request_timeout))
            }
        }
    }

    /// An RPC whose data is a HostLink record or a HostLink error record.
    async fn rpc(
        &self,
        method: &str,
        data: &str,
    ) -> Result<Result<Value, HostLinkError>, ClientError> {
        let data: Value =
            serde_json::from_str(data).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let reply = self
            .request("rpc", json!({"method": method, "data": data}))
            .await?;
        let data = reply.get("data").cloned().unwrap_or(Value::Null);
        if data.get("code").is_some() {
            let bytes = data.to_string();
            return HostLinkError::decode(bytes.as_bytes())
                .map(Err)
                .map_err(|e| ClientError::Protocol(e.to_string()));
        }
        Ok(Ok(data))
    }

    /// A `run.*` RPC (served by a Host advertising `hostlink.run`): the reply's data as JSON
    /// text, to decode as `hostlink::runs::RunReply`.
    pub async fn run_rpc(&self, method: &str, data: &Value) -> Result<String, ClientError> {
        let reply = self
            .request("rpc", json!({"method": method, "data": data}))
            .await?;
        Ok(reply
            .get("data")
            .cloned()
            .unwrap_or(Value::Null)
            .to_string())
    }

    /// `hostlink.attach`.
    pub async fn attach(
        &self,
        req: &AttachRequest,
    ) -> Result<Result<RegistryObservation, HostLinkError>, ClientError> {
        match self.rpc("hostlink.attach", &req.encode()).await? {
            Err(e) => Ok(Err(e)),
            Ok(v) => RegistryObservation::decode(v.to_string().as_bytes())
                .map(Ok)
                .map_err(|e| ClientError::Protocol(e.to_string())),
        }
    }

    /// `hostlink.bind`.
    pub async fn bind(&self, req: &BindRequest) -> Result<Result<(), HostLinkError>, ClientError> {
        Ok(self.rpc("hostlink.bind", &req.encode()).await?.map(|_| ()))
    }

    /// `hostlink.unbind`.
    pub async fn unbind(
        &self,
        req: &UnbindRequest,
    ) -> Result<Result<(), HostLinkError>, ClientError> {
        Ok(self
            .rpc("hostlink.unbind", &req.encode())
            .await?
            .map(|_| ()))
    }

    /// `hostlink.drain`.
    pub async fn drain(
        &self,
        req: &DrainRequest,
    ) -> Result<Result<DrainObservation, HostLinkError>, ClientError> {
        self.drain_call("hostlink.drain", req).await
    }

    /// `hostlink.drain_status`.
    pub async fn drain_status(
        &self,
        req: &DrainRequest,
    ) -> Result<Result<DrainObservation, HostLinkError>, ClientError> {
        self.drain_call("hostlink.drain_status", req).await
    }

    async fn drain_call(
        &self,
        method: &str,
        req: &DrainRequest,
    ) -> Result<Result<DrainObservation, HostLinkError>, ClientError> {
        match self.rpc(method, &req.encode()).await? {
            Err(e) => Ok(Err(e)),
            Ok(v) => DrainObservation::decode(v.to_string().as_bytes())
                .map(Ok)
                .map_err(|e| ClientError::Protocol(e.to_string())),
        }
    }

    /// A delivery: publishes `{"command_id":...}` on the session channel (the link must hold
    /// the bind).
    pub async fn deliver(
        &self,
        session: &SessionId,
        command: &CommandId,
    ) -> Result<(), ClientError> {
        self.deliver_traced(session, command, None).await
    }

    /// A delivery carrying the caller's W3C trace context, when it has one.
    pub async fn deliver_traced(
        &self,
        session: &SessionId,
        command: &CommandId,
        trace: Option<&trace_context::TraceContext>,
    ) -> Result<(), ClientError> {
        let channel = session_channel(&self.tenant, session);
        let mut delivery = Delivery::of(command.clone());
        if let Some(t) = trace {
            delivery.traceparent = Some(t.parent);
            delivery.tracestate = t.state.clone();
        }
        let data: Value = serde_json::from_str(&delivery.encode())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.request("publish", json!({"channel": channel, "data": data}))
            .await
            .map(|_| ())
    }

    /// Subscribes to a bound session's channel; `previews` opts into live text.
    pub async fn subscribe(
        &self,
        session: &SessionId,
        previews: bool,
    ) -> Result<mpsc::Receiver<Publication>, ClientError> {
        let channel = session_channel(&self.tenant, session);
        let (tx, rx) = mpsc::channel(SUBSCRIPTION_BUFFER);
        lock(&self.subscriptions).insert(channel.clone(), tx);
        let data: Value = serde_json::from_str(
            &SubscribeOptions {
                version: V1,
                ephemeral: previews,
                ..SubscribeOptions::default()
            }
            .encode(),
        )
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if let Err(e) = self
            .request("subscribe", json!({"channel": channel, "data": data}))
            .await
        {
            lock(&self.subscriptions).remove(&channel);
            return Err(e);
        }
        Ok(rx)
    }

    /// Subscribes to a run's channel of step events (live only: `run.status` holds the
    /// journal). Another tenant's run and an unknown run are refused alike.
    pub async fn subscribe_run(
        &self,
        run: &sessionstore::RunId,
    ) -> Result<mpsc::Receiver<Publication>, ClientError> {
        let channel = hostlink::runs::run_channel(&self.tenant, run);
        let (tx, rx) = mpsc::channel(SUBSCRIPTION_BUFFER);
        lock(&self.subscriptions).insert(channel.clone(), tx);
        if let Err(e) = self.request("subscribe", json!({"channel": channel})).await {
            lock(&self.subscriptions).remove(&channel);
            return Err(e);
        }
        Ok(rx)
    }

    /// Closes the link.
    pub fn close(&self) {
        self.closed.cancel();
    }
}

impl Drop for HostLinkClient {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

/// The typed error of a reply's `error` member (`code`, `message`).
fn reply_error(err: &Value) -> ClientError {
    ClientError::Reply {
        code: err.get("code").and_then(Value::as_u64).unwrap_or(0) as u32,
        message: err
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    }
}

fn handle_line(
    line: &str,
    pending: &Pending,
    subs: &Subscriptions,
    out: &mpsc::UnboundedSender<String>,
) {
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        tracing::warn!("an undecodable line from the Host was ignored");
        return;
    };
    let Some(obj) = v.as_object() else { return };
    if obj.is_empty() {
        // The Host's ping: answer with a pong.
        let _ = out.send("{}".to_owned());
        return;
    }
    if let Some(id) = obj.get("id").and_then(Value::as_u64) {
        let Some(tx) = lock(pending).remove(&(id as u32)) else {
            return;
        };
        let result = if let Some(err) = obj.get("error") {
            Err(reply_error(err))
        } else {
            // The one member besides `id` is the method's result.
            Ok(obj
                .iter()
                .find(|(k, _)| k.as_str() != "id")
                .map(|(_, v)| v.clone())
                .unwrap_or(Value::Null))
        };
        let _ = tx.send(result);
        return;
    }
    let Some(push) = obj.get("push") else { return };
    let Some(channel) = push.get("channel").and_then(Value::as_str) else {
        return;
    };
    let Some(data) = push.pointer("/pub/data") else {
        return;
    };
    let bytes = data.to_string();
    let publication = if channel.starts_with(hostlink::runs::RUN_CHANNEL_PREFIX) {
        match serde_json::from_str(&bytes) {
            Ok(e) => Publication::Run(e),
            Err(e) => {
                tracing::warn!(error = %e, "a run event was not understood");
                return;
            }
        }
    } else if data.get("journal_seq").is_some() {
        match EnduringPublication::decode(bytes.as_bytes()) {
            Ok(p) => Publication::Enduring(p),
            Err(e) => {
                tracing::warn!(error = %e, "an enduring publication was not understood");
                return;
            }
        }
    } else {
        match EphemeralPublication::decode(bytes.as_bytes()) {
            Ok(p) => Publication::Ephemeral(p),
            Err(_) => return,
        }
    };
    let tx = lock(subs).get(channel).cloned();
    if let Some(tx) = tx
        && tx.try_send(publication).is_err()
    {
        lock(subs).remove(channel);
    }
}

/// A fresh idempotency key.
pub fn idempotency_key() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A non-zero u64 from a value known to be positive (epochs and generations are ≥ 1).
pub fn nonzero(v: u64) -> NonZeroU64 {
    NonZeroU64::new(v).unwrap_or(NonZeroU64::MIN)
}
