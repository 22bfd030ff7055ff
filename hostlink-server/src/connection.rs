//! One link from accept to close: the connect handshake, then every command in order. Owns
//! the fixed check order of each method (decode → foreign tenant → link bounds and bindings
//! → backend), the link's bindings and subscriptions, its replies, and its credential: the
//! deadline an expiring token sets (3005 if no `refresh` moves it), `refresh`, and the check
//! again whenever the credentials change (4502 when the token no longer passes). Never answers a
//! foreign tenant differently from an unknown session, never dispatches a capability token,
//! and never lets a backend call see a tenant other than the link's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::ws::WebSocket;
use futures::StreamExt;
use serde_json::value::RawValue;
use sessionstore::{RunId, SessionId, TenantId};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tokio_util::task::task_tracker::TaskTrackerToken;
use trace_context::TraceContext;
use tracing::Instrument;

use super::Core;
use super::closer::Closer;
use super::encode::{EnduringEncoder, history_reply, subscribe_reply};
use super::pump::{Pump, TokenBucket};
use super::transport::{Heartbeat, Outbound, WriterTiming, read_loop, write_loop};
use crate::backend::{
    ExtensionReply, FeedItem, LinkBackend, LinkCtx, LinkId, Refusal, RunEvents, StreamPublication,
};
use hostlink::auth::Grant;
use hostlink::channel::{parse_session_channel, session_channel};
use hostlink::codes::{Disconnect, ReplyError};
use hostlink::frame::{
    Command, ConnectRequest, ConnectResult, HistoryRequest, MAX_COMMANDS_PER_FRAME, PublishRequest,
    Request, RpcRequest, StreamPosition, SubscribeRequest, encode_connect_reply, encode_error,
    encode_publication_push, encode_refresh_reply, encode_reply, encode_rpc_reply,
    encode_unsubscribe_push,
};
use hostlink::json::ObjectWriter;
use hostlink::jwt::unix_now;
use hostlink::records::{
    AttachRequest, BindRequest, ConnectData, Delivery, DrainRequest, HostLinkError,
    SubscribeOptions, UnbindRequest, WIRE_VERSION,
};
use hostlink::runs::parse_run_channel;

/// The five reserved methods, in the documented order.
pub const RESERVED_METHODS: [&str; 5] = [
    "hostlink.bind",
    "hostlink.unbind",
    "hostlink.attach",
    "hostlink.drain",
    "hostlink.drain_status",
];

/// The Centrifuge unsubscribe code a dropped binding is announced with ("server
/// unsubscribe": the SDKs do not resubscribe by themselves).
pub const UNSUBSCRIBE_BINDING_DROPPED: u32 = 2000;

/// The Centrifuge unsubscribe code a dropped binding is announced with when its subscription
/// carried its bind (Centrifuge's "insufficient state": the SDKs resubscribe by themselves,
/// recovering from their last offset, with the bind their `getData` gives then).
pub const RESUBSCRIBE_BINDING_DROPPED: u32 = 2500;

/// A binding held on this link.
struct LinkBinding {
    /// The receiver taken at bind. The first subscription takes what it holds (records
    /// committed since the bind); a later one starts from the moment it subscribes (the
    /// client re-reads the durable journal for what it missed while unsubscribed).
    feed: broadcast::Receiver<FeedItem>,
    subscribed_before: bool,
    subscription: Option<CancellationToken>,
    /// The live subscription was made by a subscribe carrying its bind: the client can bind
    /// again by resubscribing, so a dropped binding asks it to.
    carries_bind: bool,
}

/// Why a command ends the link.
type Flow = Result<(), Disconnect>;

/// Why a bind was not made.
enum BindRefused {
    /// A bound of the link or the tenant (Centrifuge error 106).
    Limit,
    Backend(Refusal),
}

/// Why a history request was not answered with publications.
enum HistoryRefused {
    /// `since` names another epoch, or an offset the stream never reached (Centrifuge 112).
    Unrecoverable,
    Backend(Refusal),
}

impl From<Refusal> for HistoryRefused {
    fn from(r: Refusal) -> Self {
        HistoryRefused::Backend(r)
    }
}

/// Where a new subscription starts.
struct SubscriptionStart {
    position: StreamPosition,
    /// The records recovered after the client's position, in offset order.
    recovered: Vec<Arc<StreamPublication>>,
    /// Recovery asked for and complete: no gap after the client's position.
    complete: bool,
    /// Records up to this offset are not pushed (they are in the reply, or precede a
    /// recovery that could not be made: the client reloads from its new position).
    sent_through: u64,
}

/// Whether a client's position is in the stream at `position`: the same epoch, or the very
/// start (offset 0 with no epoch: a client that has seen nothing yet).
fn same_stream(from: &StreamPosition, position: &StreamPosition) -> bool {
    from.epoch == position.epoch || (from.offset == 0 && from.epoch.is_empty())
}

/// A refused bind on a subscribe: the HostLink code as a Centrifuge error, as a delivery
/// carries it. Every placement refusal is marked temporary — the session may be moving
/// (a drain, a failover) and the SDK resubscribes by itself with backoff, calling its
/// `getData` again for fresh bind parameters and reconnecting when the link closes — except
/// `runtime_mismatch`, which no retry against this Host's build can overcome.
fn subscribe_refusal(e: &HostLinkError) -> ReplyError {
    let mut error = ReplyError::hostlink(e.code());
    error.temporary = !matches!(e, HostLinkError::RuntimeMismatch { .. });
    error
}

/// The credential a link holds: the token it last presented (kept only to verify it again
/// when the credentials change; never logged) and when the link must have refreshed it.
struct LinkCredential {
    token: String,
    /// `exp` plus the leeway, as an instant; `None`: the token never expires.
    close_at: Option<Instant>,
}

impl LinkCredential {
    fn new(token: String, grant: &Grant) -> LinkCredential {
        let close_at = grant.expires_at.map(|exp| {
            let end = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(exp.saturating_add(grant.leeway_secs));
            let left = end
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            Instant::now() + left
        });
        LinkCredential { token, close_at }
    }
}

/// The `ttl` a connect or refresh reply carries for `grant`: whole seconds until `exp`.
fn ttl_secs(grant: &Grant) -> Option<u64> {
    grant.expires_at.map(|exp| exp.saturating_sub(unix_now()))
}

/// Waits until `at`, or forever.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for the next change of the credentials, or forever (none will come).
async fn next_change(changes: &mut Option<watch::Receiver<u64>>) {
    match changes {
        Some(rx) => {
            if rx.changed().await.is_err() {
                // The source of changes went away: no change will come.
                *changes = None;
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

struct Link<B: LinkBackend> {
    core: Arc<Core>,
    backend: Arc<B>,
    ctx: LinkCtx,
    closer: Arc<Closer>,
    out: mpsc::Sender<Outbound>,
    bindings: HashMap<SessionId, LinkBinding>,
    /// Live subscriptions to run channels, by channel.
    run_subscriptions: HashMap<String, CancellationToken>,
    bucket: Arc<Mutex<TokenBucket>>,
    capability_tokens: Vec<String>,
    credential: LinkCredential,
}

/// Runs one accepted WebSocket to its end.
pub(crate) async fn run_link<B: LinkBackend>(
    core: Arc<Core>,
    backend: Arc<B>,
    socket: WebSocket,
    tenant: TenantId,
    _tracked: TaskTrackerToken,
) {
    let link_id = LinkId::mint();
    let span = tracing::info_span!(
        target: trace_context::span::LONG_LIVED,
        "hostlink_link",
        tenant = %tenant,
        link = %link_id
    );
    run_link_inner(core, backend, socket, tenant, link_id)
        .instrument(span)
        .await
}

async fn run_link_inner<B: LinkBackend>(
    core: Arc<Core>,
    backend: Arc<B>,
    socket: WebSocket,
    tenant: TenantId,
    link_id: LinkId,
) {
    let options = core.config.options().clone();
    let closer = Arc::new(Closer::new());
    if let Some(d) = core.registry.register_live(link_id, closer.clone()) {
        closer.close(d);
    }
    let (sink, stream) = socket.split();
    let (out_tx, out_rx) = mpsc::channel::<Outbound>(options.outbound_queue);
    let (cmd_tx, mut cmd_rx) = mpsc::channel::<Command>(MAX_COMMANDS_PER_FRAME);
    let heartbeat = Arc::new(Heartbeat::new());
    let reader_done = CancellationToken::new();
    let stop_reader = CancellationToken::new();
    {
        let closer = closer.clone();
        let heartbeat = heartbeat.clone();
        let reader_done = reader_done.clone();
        let stop_reader = stop_reader.clone();
        let max = options.max_frame_bytes;
        core.tracker.spawn(
            async move {
                read_loop(stream, cmd_tx, closer, heartbeat, max, stop_reader).await;
                reader_done.cancel();
            }
            .in_current_span(),
        );
    }
    core.tracker.spawn(
        write_loop(
            sink,
            out_rx,
            closer.clone(),
            heartbeat.clone(),
            WriterTiming {
                ping_interval: options.ping_interval,
                pong_timeout: options.pong_timeout,
                slow_consumer_timeout: options.slow_consumer_timeout,
            },
            reader_done,
            stop_reader,
        )
        .in_current_span(),
    );

    let wake = Arc::new(Notify::new());
    // Taken before the credential is checked: a change after that check is seen by the link.
    let mut changes = backend.auth().changes();
    let first = tokio::select! {
        biased;
        _ = closer.closed() => None,
        c = timeout(options.handshake_timeout, cmd_rx.recv()) => match c {
            Ok(c) => c,
            Err(_) => {
                closer.close(Disconnect::STALE);
                None
            }
        },
    };
    let connected = match first {
        Some(Command {
            id,
            request: Request::Connect(connect),
        }) => {
            // The connect span continues the link's trace when its data names one (read
            // strictly again, and refused if malformed, by the handshake).
            let span = tracing::info_span!(
                parent: None,
                "hostlink.connect",
                tenant = %tenant,
                link = %link_id,
                otel.status_code = tracing::field::Empty,
                otel.status_description = tracing::field::Empty,
            );
            let link_trace = connect
                .data
                .as_deref()
                .and_then(|raw| ConnectData::decode(raw.get().as_bytes()).ok())
                .and_then(|d| d.trace());
            trace_context::span::continue_if(&span, link_trace.as_ref());
            // A closing link stops waiting for the credential check too.
            async {
                tokio::select! {
                    biased;
                    _ = closer.closed() => None,
                    connected = handshake(
                        &core, &backend, &closer, &out_tx, &heartbeat, &wake, link_id, &tenant,
                        id, connect,
                    ) => connected,
                }
            }
            .instrument(span)
            .await
        }
        Some(_) => {
            tracing::debug!("the first command is not connect");
            closer.close(Disconnect::BAD_REQUEST);
            None
        }
        None => None,
    };

    if let Some((ctx, capability_tokens, credential)) = connected {
        let mut link = Link {
            core: core.clone(),
            backend,
            ctx,
            closer: closer.clone(),
            out: out_tx,
            bindings: HashMap::new(),
            run_subscriptions: HashMap::new(),
            bucket: Arc::new(Mutex::new(TokenBucket::new(
                options.preview_rate_bytes_per_sec,
                options.preview_burst_bytes,
            ))),
            capability_tokens,
            credential,
        };
        link.serve(&mut cmd_rx, &wake, &mut changes).await;
        for binding in link.bindings.values() {
            if let Some(s) = &binding.subscription {
                s.cancel();
            }
        }
    }
    closer.close(Disconnect::CONNECTION_CLOSED);
    core.registry.remove_link(link_id);
    tracing::debug!(reason = %closer.reason(), "link ended");
}

/// The backend's tokens, without reserved methods and repeats.
fn capability_tokens<B: LinkBackend>(backend: &B) -> Vec<String> {
    let mut tokens: Vec<String> = Vec::new();
    for token in backend.capability_tokens() {
        if !RESERVED_METHODS.contains(&token.as_str()) && !tokens.contains(&token) {
            tokens.push(token);
        }
    }
    tokens
}

#[allow(clippy::too_many_arguments)]
async fn handshake<B: LinkBackend>(
    core: &Arc<Core>,
    backend: &Arc<B>,
    closer: &Arc<Closer>,
    out: &mpsc::Sender<Outbound>,
    heartbeat: &Arc<Heartbeat>,
    wake: &Arc<Notify>,
    link_id: LinkId,
    tenant: &TenantId,
    id: u32,
    connect: ConnectRequest,
) -> Option<(LinkCtx, Vec<String>, LinkCredential)> {
    let token = connect.token.unwrap_or_default();
    let grant = match backend.auth().verify(tenant, &token).await {
        Ok(grant) => grant,
        Err(refused) if refused.expired() => {
            span_failed(refused.reason().as_str());
            // Centrifuge's way: the SDK asks its `getToken` for a fresh token and reconnects.
            tracing::info!(
                reason = refused.reason().as_str(),
                "the connection token has expired"
            );
            let _ = out.try_send(Outbound::Message(encode_error(
                id,
                &ReplyError::TOKEN_EXPIRED,
            )));
            closer.close(Disconnect::EXPIRED);
            return None;
        }
        Err(refused) => {
            span_failed(refused.reason().as_str());
            tracing::info!(
                reason = refused.reason().as_str(),
                "the tenant credential was refused"
            );
            closer.close(Disconnect::AUTHENTICATION_FAILED);
            return None;
        }
    };
    let data = match connect.data.as_deref() {
        Some(raw) => ConnectData::decode(raw.get().as_bytes()),
        None => ConnectData::decode(b""),
    };
    let link_trace = match data {
        Ok(d) if d.offers_wire_version() => d.trace(),
        Ok(_) => {
            span_failed("unsupported_wire_version");
            closer.close(Disconnect::UNSUPPORTED_WIRE_VERSION);
            return None;
        }
        Err(e) => {
            span_failed("bad_request");
            tracing::debug!(error = %e, "malformed connect data");
            closer.close(Disconnect::BAD_REQUEST);
            return None;
        }
    };
    match core
        .registry
        .admit(link_id, tenant.clone(), closer.clone(), wake.clone())
    {
        Ok(None) => {}
        Ok(Some(evicted)) => {
            tracing::info!("evicted the least-recently-used idle link");
            evicted.close(Disconnect::IDLE_LINK_EVICTED);
        }
        Err(()) => {
            tracing::info!("max_tenant_links reached and every link holds bindings");
            closer.close(Disconnect::LINK_LIMIT);
            return None;
        }
    }
    let tokens = capability_tokens(backend.as_ref());
    let data = ObjectWriter::new()
        .number("version", WIRE_VERSION)
        .strings(
            "hostlink_methods",
            RESERVED_METHODS
                .iter()
                .copied()
                .chain(tokens.iter().map(String::as_str)),
        )
        .finish();
    let client = link_id.to_string();
    let version = backend.server_version();
    let reply = encode_connect_reply(
        id,
        &ConnectResult {
            client: &client,
            version: &version,
            data: &data,
            ping_secs: core.config.advertised_ping_secs(),
            pong: core.config.heartbeat(),
            ttl_secs: ttl_secs(&grant),
        },
    );
    heartbeat.set_connected();
    let queued = timeout(core.config.options().slow_consumer_timeout, async {
        out.send(Outbound::Message(reply)).await.is_ok()
            && out.send(Outbound::StartHeartbeat).await.is_ok()
    })
    .await;
    if !matches!(queued, Ok(true)) {
        closer.close(Disconnect::SLOW);
        return None;
    }
    tracing::debug!("link connected");
    let credential = LinkCredential::new(token, &grant);
    let ctx = LinkCtx {
        link: link_id,
        tenant: tenant.clone(),
        principal: grant.principal,
        client_name: connect.name,
        client_version: connect.version,
        trace: link_trace,
    };
    Some((ctx, tokens, credential))
}

/// A foreign tenant's request is answered exactly like an unknown session.
fn foreign_or_unknown() -> Refusal {
    Refusal::HostLink(HostLinkError::RuntimeUnavailable)
}

/// Names the session a request is about on the current (`rpc`) span.
fn record_session(session: &SessionId) {
    tracing::Span::current().record("session", tracing::field::display(session));
}

/// Marks the current span failed with a stable code (its OpenTelemetry status).
fn span_failed(code: &str) {
    let span = tracing::Span::current();
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", code);
}

/// The trace context a request's data names, read before the request is decoded so that its
/// span can continue it. Only data that mentions a trace member is looked at; a malformed
/// context is an error here and the request is refused (107) before anything runs.
fn peek_trace(data: &[u8]) -> Result<Option<TraceContext>, ()> {
    #[derive(serde::Deserialize)]
    struct TraceMembers<'a> {
        #[serde(borrow, default)]
        traceparent: Option<&'a str>,
        #[serde(borrow, default)]
        tracestate: Option<&'a str>,
    }
    if !contains(data, b"tracepa") && !contains(data, b"tracest") {
        return Ok(None);
    }
    let m: TraceMembers<'_> = serde_json::from_slice(data).map_err(|_| ())?;
    TraceContext::from_headers(m.traceparent, m.tracestate).map_err(|_| ())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn data_bytes(data: &Option<Box<RawValue>>) -> &[u8] {
    data.as_deref().map(|r| r.get().as_bytes()).unwrap_or(b"")
}

impl<B: LinkBackend> Link<B> {
    async fn serve(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        wake: &Notify,
        changes: &mut Option<watch::Receiver<u64>>,
    ) {
        loop {
            let close_at = self.credential.close_at;
            let flow = tokio::select! {
                biased;
                _ = self.closer.closed() => return,
                _ = until(close_at) => {
                    tracing::info!("the connection token expired and was not refreshed");
                    Err(Disconnect::EXPIRED)
                }
                _ = next_change(changes) => self.verify_again().await,
                _ = wake.notified() => self.apply_invalidations().await,
                command = commands.recv() => match command {
                    None => return,
                    Some(command) => {
                        self.core.registry.touch(self.ctx.link);
                        let closer = self.closer.clone();
                        // A closing link stops waiting for the backend (see LinkBackend).
                        tokio::select! {
                            biased;
                            _ = closer.closed() => return,
                            flow = async {
                                self.apply_invalidations().await?;
                                self.handle(command).await
                            } => flow,
                        }
                    }
                },
            };
            if let Err(disconnect) = flow {
                self.closer.close(disconnect);
                return;
            }
        }
    }

    /// Queues one message, waiting at most the slow-consumer timeout for room.
    async fn send(&self, message: String) -> Flow {
        match timeout(
            self.core.config.options().slow_consumer_timeout,
            self.out.send(Outbound::Message(message)),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Disconnect::CONNECTION_CLOSED),
            Err(_) => Err(Disconnect::SLOW),
        }
    }

    async fn reply_error(&self, id: u32, error: &ReplyError) -> Flow {
        span_failed(error.message);
        self.send(encode_error(id, error)).await
    }

    /// Answers an RPC from the backend's result.
    async fn reply_rpc(&self, id: u32, result: Result<String, Refusal>) -> Flow {
        match result {
            Ok(data) => self.send(encode_rpc_reply(id, &data)).await,
            Err(Refusal::HostLink(e)) => {
                span_failed(e.code().as_str());
                self.send(encode_rpc_reply(id, &e.encode())).await
            }
            Err(Refusal::Internal(detail)) => {
                span_failed("internal");
                tracing::warn!(detail = %detail, "the backend failed a request");
                self.reply_error(id, &ReplyError::INTERNAL).await
            }
            Err(Refusal::BadRequest) => self.reply_error(id, &ReplyError::BAD_REQUEST).await,
        }
    }

    /// The credentials changed: the link's token must still act for its tenant, or the link
    /// closes (its token was removed or replaced). An expired token is left to the deadline.
    async fn verify_again(&mut self) -> Flow {
        match self
            .backend
            .auth()
            .verify(&self.ctx.tenant, &self.credential.token)
            .await
        {
            Ok(grant) => {
                let token = std::mem::take(&mut self.credential.token);
                self.credential = LinkCredential::new(token, &grant);
                Ok(())
            }
            Err(refused) if refused.expired() => Ok(()),
            Err(refused) => {
                tracing::info!(
                    reason = refused.reason().as_str(),
                    "the link's credential was revoked"
                );
                Err(Disconnect::CREDENTIAL_REVOKED)
            }
        }
    }

    /// `refresh`: a fresh token for the same tenant and principal extends the link (its
    /// bindings and subscriptions carry on); any other ends it as a refused credential.
    async fn refresh(&mut self, id: u32, token: String) -> Flow {
        let grant = match self.backend.auth().verify(&self.ctx.tenant, &token).await {
            Ok(grant) => grant,
            Err(refused) => {
                tracing::info!(
                    reason = refused.reason().as_str(),
                    "a refresh token was refused"
                );
                return Err(Disconnect::AUTHENTICATION_FAILED);
            }
        };
        if grant.principal != self.ctx.principal {
            tracing::info!("a refresh token names another principal");
            return Err(Disconnect::AUTHENTICATION_FAILED);
        }
        let ttl = ttl_secs(&grant);
        self.credential = LinkCredential::new(token, &grant);
        tracing::debug!(ttl, "the connection token was refreshed");
        let client = self.ctx.link.to_string();
        let version = self.backend.server_version();
        self.send(encode_refresh_reply(id, &client, &version, ttl))
            .await
    }

    /// Cleans up bindings the registry dropped (route invalidation, a feed that ended).
    async fn apply_invalidations(&mut self) -> Flow {
        for session in self.core.registry.take_invalidated(self.ctx.link) {
            tracing::debug!(session = %session, "binding dropped");
            self.forget_binding(&session, false).await?;
        }
        Ok(())
    }

    /// Removes a binding locally; a live subscription is ended with an unsubscribe push.
    /// Removes a binding locally; a live subscription is ended with an unsubscribe push, one
    /// that asks the client to resubscribe when it carried its bind and the client did not
    /// ask for the unbind itself.
    async fn forget_binding(&mut self, session: &SessionId, asked: bool) -> Flow {
        if let Some(binding) = self.bindings.remove(session)
            && let Some(subscription) = binding.subscription
        {
            subscription.cancel();
            let channel = session_channel(&self.ctx.tenant, session);
            let (code, reason) = if binding.carries_bind && !asked {
                (RESUBSCRIBE_BINDING_DROPPED, "binding dropped: resubscribe")
            } else {
                (UNSUBSCRIBE_BINDING_DROPPED, "binding dropped")
            };
            self.send(encode_unsubscribe_push(&channel, code, reason))
                .await?;
        }
        Ok(())
    }

    async fn handle(&mut self, command: Command) -> Flow {
        let id = command.id;
        match command.request {
            Request::Connect(_) => {
                tracing::debug!("a second connect");
                Err(Disconnect::BAD_REQUEST)
            }
            Request::Rpc(rpc) => self.rpc(id, rpc).await,
            Request::Subscribe(s) => self.subscribe(id, s).await,
            Request::Unsubscribe { channel } => self.unsubscribe(id, &channel).await,
            Request::Publish(p) => self.publish(id, p).await,
            Request::Send => {
                tracing::debug!("an asynchronous message ignored");
                Ok(())
            }
            Request::Refresh { token } => self.refresh(id, token).await,
            Request::SubRefresh { .. }
            | Request::Presence { .. }
            | Request::PresenceStats { .. } => {
                self.reply_error(id, &ReplyError::NOT_AVAILABLE).await
            }
            Request::History(h) => self.history(id, h).await,
        }
    }

    async fn rpc(&mut self, id: u32, rpc: RpcRequest) -> Flow {
        let Ok(trace) = peek_trace(data_bytes(&rpc.data)) else {
            return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
        };
        // Each call is a span of its own trace: the request's context, else the link's, else
        // a new one (never the link's long-lived span, which would make one trace of a link).
        let span = tracing::info_span!(
            parent: None,
            "hostlink.rpc",
            otel.name = %rpc.method,
            method = %rpc.method,
            tenant = %self.ctx.tenant,
            link = %self.ctx.link,
            session = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        trace_context::span::continue_if(&span, trace.as_ref().or(self.ctx.trace.as_ref()));
        self.rpc_in_span(id, rpc).instrument(span).await
    }

    async fn rpc_in_span(&mut self, id: u32, rpc: RpcRequest) -> Flow {
        let data = data_bytes(&rpc.data);
        match rpc.method.as_str() {
            "hostlink.attach" => {
                let Ok(req) = AttachRequest::decode(data) else {
                    return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
                };
                record_session(&req.session_id);
                let result = if req.tenant_id != self.ctx.tenant {
                    Err(foreign_or_unknown())
                } else {
                    self.backend
                        .attach(&self.ctx, req)
                        .await
                        .map(|o| o.encode())
                };
                self.reply_rpc(id, result).await
            }
            "hostlink.bind" => {
                let Ok(req) = BindRequest::decode(data) else {
                    return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
                };
                record_session(&req.session_id);
                self.bind(id, req).await
            }
            "hostlink.unbind" => {
                let Ok(req) = UnbindRequest::decode(data) else {
                    return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
                };
                record_session(&req.session_id);
                if req.tenant_id != self.ctx.tenant {
                    return self.reply_rpc(id, Err(foreign_or_unknown())).await;
                }
                let session = req.session_id.clone();
                match self.backend.unbind(&self.ctx, req).await {
                    Ok(()) => {
                        self.core
                            .registry
                            .drop_binding(self.ctx.link, &self.ctx.tenant, &session);
                        self.forget_binding(&session, true).await?;
                        self.reply_rpc(id, Ok("{}".to_owned())).await
                    }
                    Err(r) => self.reply_rpc(id, Err(r)).await,
                }
            }
            "hostlink.drain" | "hostlink.drain_status" => {
                let Ok(req) = DrainRequest::decode(data) else {
                    return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
                };
                if let Some(scope) = &req.scope {
                    record_session(&scope.session_id);
                }
                // No scope is the whole Host, which no tenant link may drain or observe; a
                // scope naming another tenant is foreign. Both before any lookup.
                let in_scope = req
                    .scope
                    .as_ref()
                    .is_some_and(|s| s.tenant_id == self.ctx.tenant);
                let result = if !in_scope {
                    Err(foreign_or_unknown())
                } else if rpc.method == "hostlink.drain" {
                    self.backend.drain(&self.ctx, req).await.map(|o| o.encode())
                } else {
                    self.backend
                        .drain_status(&self.ctx, req)
                        .await
                        .map(|o| o.encode())
                };
                self.reply_rpc(id, result).await
            }
            method if self.capability_tokens.iter().any(|t| t == method) => {
                self.reply_error(id, &ReplyError::METHOD_NOT_FOUND).await
            }
            method => {
                match self
                    .backend
                    .extension_rpc(&self.ctx, method, rpc.data.as_deref())
                    .await
                {
                    ExtensionReply::NotFound => {
                        self.reply_error(id, &ReplyError::METHOD_NOT_FOUND).await
                    }
                    ExtensionReply::Done(result) => {
                        self.reply_rpc(id, result.map(|raw| raw.get().to_owned()))
                            .await
                    }
                }
            }
        }
    }

    async fn bind(&mut self, id: u32, req: BindRequest) -> Flow {
        match self.try_bind(req).await {
            Ok(()) => self.reply_rpc(id, Ok("{}".to_owned())).await,
            Err(BindRefused::Limit) => self.reply_error(id, &ReplyError::LIMIT_EXCEEDED).await,
            Err(BindRefused::Backend(r)) => self.reply_rpc(id, Err(r)).await,
        }
    }

    /// `hostlink.bind`'s checks and effect, whichever command asked for it (the RPC, or a
    /// subscribe carrying its bind).
    async fn try_bind(&mut self, req: BindRequest) -> Result<(), BindRefused> {
        if req.tenant_id != self.ctx.tenant {
            return Err(BindRefused::Backend(foreign_or_unknown()));
        }
        let session = req.session_id.clone();
        if self.bindings.contains_key(&session) {
            // Already bound here: the backend re-checks; the running feed is kept.
            return self
                .backend
                .bind(&self.ctx, req)
                .await
                .map(|_| ())
                .map_err(BindRefused::Backend);
        }
        if let Err(limit) = self.core.registry.reserve_binding(self.ctx.link) {
            tracing::info!(?limit, session = %session, "bind refused by a link bound");
            return Err(BindRefused::Limit);
        }
        match self.backend.bind(&self.ctx, req).await {
            Ok(feed) => {
                if self
                    .core
                    .registry
                    .commit_binding(self.ctx.link, &self.ctx.tenant, &session)
                {
                    self.bindings.insert(
                        session,
                        LinkBinding {
                            feed: feed.into_receiver(),
                            subscribed_before: false,
                            subscription: None,
                            carries_bind: false,
                        },
                    );
                }
                Ok(())
            }
            Err(r) => {
                self.core
                    .registry
                    .release_reservation(self.ctx.link, &self.ctx.tenant);
                Err(BindRefused::Backend(r))
            }
        }
    }

    /// A subscription to a run's channel: the run's step events, live only (no history, no
    /// recovery: `run.status` holds the journal). Another tenant's run is refused exactly
    /// like an unknown one.
    async fn subscribe_run(
        &mut self,
        id: u32,
        channel: String,
        tenant: TenantId,
        run: RunId,
    ) -> Flow {
        if tenant != self.ctx.tenant {
            return self.reply_error(id, &ReplyError::PERMISSION_DENIED).await;
        }
        if self
            .run_subscriptions
            .get(&channel)
            .is_some_and(|t| !t.is_cancelled())
        {
            return self.reply_error(id, &ReplyError::ALREADY_SUBSCRIBED).await;
        }
        let mut rx = match self.backend.run_events(&self.ctx, &run).await {
            RunEvents::Live(rx) => rx,
            RunEvents::Unknown => {
                return self.reply_error(id, &ReplyError::PERMISSION_DENIED).await;
            }
            RunEvents::NotHosted => return self.reply_error(id, &ReplyError::NOT_AVAILABLE).await,
            RunEvents::Failed(detail) => {
                tracing::warn!(detail = %detail, "a run subscription's check failed");
                return self.reply_error(id, &ReplyError::INTERNAL).await;
            }
        };
        let stop = self.closer.child_token();
        self.run_subscriptions.insert(channel.clone(), stop.clone());
        self.send(encode_reply(id, "subscribe", "{}")).await?;
        let out = self.out.clone();
        let slow = self.core.config.options().slow_consumer_timeout;
        let closer = self.closer.clone();
        let wanted = run.to_string();
        let span = tracing::debug_span!("run_subscription", run = %run);
        self.core.tracker.spawn(
            async move {
                loop {
                    let event = tokio::select! {
                        _ = stop.cancelled() => return,
                        e = rx.recv() => e,
                    };
                    let event = match event {
                        Ok(e) => e,
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            // Live only: the client re-reads `run.status` for what it missed.
                            tracing::info!(missed = n, "a run subscription fell behind");
                            continue;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    };
                    if event.run_id != wanted {
                        continue;
                    }
                    let Ok(data) = serde_json::to_string(&event) else {
                        continue;
                    };
                    let push = encode_publication_push(&channel, &data, &[]);
                    match timeout(slow, out.send(Outbound::Message(push))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => return,
                        Err(_) => {
                            closer.close(Disconnect::SLOW);
                            return;
                        }
                    }
                }
            }
            .instrument(span),
        );
        Ok(())
    }

    async fn subscribe(&mut self, id: u32, s: SubscribeRequest) -> Flow {
        if let Some((tenant, run)) = parse_run_channel(&s.channel) {
            return self.subscribe_run(id, s.channel, tenant, run).await;
        }
        let Ok((tenant, session)) = parse_session_channel(&s.channel) else {
            return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
        };
        let options = match s.data.as_deref() {
            None => SubscribeOptions::default(),
            Some(raw) => match SubscribeOptions::decode(raw.get().as_bytes()) {
                Ok(o) => o,
                Err(_) => return self.reply_error(id, &ReplyError::BAD_REQUEST).await,
            },
        };
        if let Some(bind) = options.bind.clone() {
            // The bind must name the channel's own session.
            if bind.tenant_id != tenant || bind.session_id != session {
                return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
            }
            let bound_here = self
                .bindings
                .get(&session)
                .is_some_and(|b| b.subscription.is_some());
            if tenant == self.ctx.tenant && bound_here {
                return self.reply_error(id, &ReplyError::ALREADY_SUBSCRIBED).await;
            }
            match self.try_bind(bind).await {
                Ok(()) => {}
                Err(BindRefused::Limit) => {
                    return self.reply_error(id, &ReplyError::LIMIT_EXCEEDED).await;
                }
                Err(BindRefused::Backend(Refusal::HostLink(e))) => {
                    tracing::debug!(code = %e.code(), "a subscribe's bind was refused");
                    return self.reply_error(id, &subscribe_refusal(&e)).await;
                }
                Err(BindRefused::Backend(Refusal::Internal(detail))) => {
                    tracing::warn!(detail = %detail, "the backend failed a subscribe's bind");
                    return self.reply_error(id, &ReplyError::INTERNAL).await;
                }
                Err(BindRefused::Backend(Refusal::BadRequest)) => {
                    return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
                }
            }
        }
        if tenant != self.ctx.tenant || !self.core.registry.is_bound(self.ctx.link, &session) {
            return self.reply_error(id, &ReplyError::PERMISSION_DENIED).await;
        }
        let Some(binding) = self.bindings.get_mut(&session) else {
            return self.reply_error(id, &ReplyError::PERMISSION_DENIED).await;
        };
        if binding.subscription.is_some() {
            return self.reply_error(id, &ReplyError::ALREADY_SUBSCRIBED).await;
        }
        // The live receiver is taken before the durable read: whatever the read misses is in
        // the feed, and the pump drops what the read already gave (no gap, no duplicate).
        let fresh = binding.feed.resubscribe();
        let feed = if binding.subscribed_before {
            fresh
        } else {
            binding.subscribed_before = true;
            std::mem::replace(&mut binding.feed, fresh)
        };
        let (reply, sent_through) = match self.position(&session, s.recover.as_ref()).await {
            Ok(Some(start)) => {
                let reply = subscribe_reply(
                    id,
                    &EnduringEncoder::publication(&self.ctx.tenant, &session),
                    &start.position,
                    &start.recovered,
                    s.recover.is_some().then_some(start.complete),
                );
                (reply, start.sent_through)
            }
            Ok(None) => (encode_reply(id, "subscribe", "{}"), 0),
            Err(Refusal::HostLink(e)) => {
                return self.reply_error(id, &subscribe_refusal(&e)).await;
            }
            Err(Refusal::Internal(detail)) => {
                tracing::warn!(detail = %detail, "reading the stream for a subscribe failed");
                return self.reply_error(id, &ReplyError::INTERNAL).await;
            }
            Err(Refusal::BadRequest) => {
                return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
            }
        };
        let Some(binding) = self.bindings.get_mut(&session) else {
            return self.reply_error(id, &ReplyError::PERMISSION_DENIED).await;
        };
        let stop = self.closer.child_token();
        binding.subscription = Some(stop.clone());
        binding.carries_bind = options.bind.is_some();
        self.send(reply).await?;
        let options_ = self.core.config.options();
        let pump = Pump {
            link: self.ctx.link,
            tenant: self.ctx.tenant.clone(),
            session: session.clone(),
            channel: s.channel,
            feed,
            previews: options.ephemeral,
            reasoning: options.reasoning,
            tool_steps: options.tool_steps,
            out: self.out.clone(),
            closer: self.closer.clone(),
            registry: self.core.registry.clone(),
            bucket: self.bucket.clone(),
            flush_interval: options_.preview_flush_interval,
            max_pending_bytes: options_.preview_burst_bytes,
            slow_consumer_timeout: options_.slow_consumer_timeout,
            sent_through,
            stop,
        };
        let span = tracing::debug_span!("subscription", session = %session);
        self.core.tracker.spawn(pump.run().instrument(span));
        Ok(())
    }

    /// Where a new subscription starts: the stream's position, and for a client recovering
    /// from its last position every committed record after it (within the recovery window).
    /// `None`: the backend keeps no durable stream.
    async fn position(
        &self,
        session: &SessionId,
        recover: Option<&StreamPosition>,
    ) -> Result<Option<SubscriptionStart>, Refusal> {
        let window = self.core.config.options().recovery_window as u64;
        // A client recovering gets its first page in the same read as the stream's position
        // (one store read, not two); anyone else reads the position alone.
        let (first_after, first_limit) = match recover {
            Some(from) => (from.offset, usize::try_from(window).unwrap_or(usize::MAX)),
            None => (0, 0),
        };
        let Some(head) = self
            .backend
            .stream_read(&self.ctx, session, first_after, first_limit)
            .await?
        else {
            return Ok(None);
        };
        let top = head.top;
        let position = StreamPosition {
            offset: top,
            epoch: head.epoch,
        };
        let recoverable = recover.filter(|from| {
            same_stream(from, &position) && from.offset <= top && top - from.offset <= window
        });
        let Some(from) = recoverable else {
            return Ok(Some(SubscriptionStart {
                position,
                recovered: Vec::new(),
                complete: false,
                sent_through: if recover.is_some() { top } else { 0 },
            }));
        };
        // Every record after the client's position up to the top read above: the first page
        // came with the position, the rest page by page.
        let mut recovered = Vec::with_capacity((top - from.offset) as usize);
        let mut after = from.offset;
        if let Some(last) = head.records.last() {
            after = last.offset.min(top);
            recovered.extend(head.records.into_iter().take_while(|p| p.offset <= top));
        }
        while after < top {
            let want = usize::try_from(top - after).unwrap_or(usize::MAX);
            let Some(page) = self
                .backend
                .stream_read(&self.ctx, session, after, want)
                .await?
            else {
                return Ok(None);
            };
            let Some(last) = page.records.last() else {
                return Err(Refusal::Internal(format!(
                    "the stream ended at offset {after}, below its top {top}"
                )));
            };
            after = last.offset;
            recovered.extend(page.records.into_iter().take_while(|p| p.offset <= top));
        }
        Ok(Some(SubscriptionStart {
            position,
            recovered,
            complete: true,
            sent_through: top,
        }))
    }

    async fn history(&mut self, id: u32, h: HistoryRequest) -> Flow {
        let Ok((tenant, session)) = parse_session_channel(&h.channel) else {
            return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
        };
        let span = tracing::debug_span!("history", session = %session);
        self.history_in_span(id, tenant, session, h)
            .instrument(span)
            .await
    }

    async fn history_in_span(
        &mut self,
        id: u32,
        tenant: TenantId,
        session: SessionId,
        h: HistoryRequest,
    ) -> Flow {
        let unavailable = ReplyError::hostlink(HostLinkError::RuntimeUnavailable.code());
        // A foreign tenant is refused before any lookup, exactly like an unknown session.
        if tenant != self.ctx.tenant {
            return self.reply_error(id, &unavailable).await;
        }
        match self.read_history(&session, &h).await {
            Ok(Some((publications, position))) => {
                let encoder = EnduringEncoder::publication(&tenant, &session);
                self.send(history_reply(id, &encoder, &publications, &position))
                    .await
            }
            Ok(None) => self.reply_error(id, &ReplyError::NOT_AVAILABLE).await,
            Err(HistoryRefused::Unrecoverable) => {
                self.reply_error(id, &ReplyError::UNRECOVERABLE_POSITION)
                    .await
            }
            Err(HistoryRefused::Backend(Refusal::HostLink(e))) => {
                self.reply_error(id, &ReplyError::hostlink(e.code())).await
            }
            Err(HistoryRefused::Backend(Refusal::Internal(detail))) => {
                tracing::warn!(detail = %detail, "a history read failed");
                self.reply_error(id, &ReplyError::INTERNAL).await
            }
            Err(HistoryRefused::Backend(Refusal::BadRequest)) => {
                self.reply_error(id, &ReplyError::BAD_REQUEST).await
            }
        }
    }

    /// The publications a history request asks for, oldest first unless `reverse`, at most
    /// the history limit, and the stream's position.
    async fn read_history(
        &self,
        session: &SessionId,
        h: &HistoryRequest,
    ) -> Result<Option<(Vec<Arc<StreamPublication>>, StreamPosition)>, HistoryRefused> {
        let Some(head) = self.backend.stream_read(&self.ctx, session, 0, 0).await? else {
            return Ok(None);
        };
        let top = head.top;
        let position = StreamPosition {
            offset: top,
            epoch: head.epoch,
        };
        if let Some(since) = &h.since
            && (!same_stream(since, &position) || since.offset > top)
        {
            return Err(HistoryRefused::Unrecoverable);
        }
        let bound = self.core.config.options().history_limit as u64;
        let limit = match u64::try_from(h.limit) {
            Ok(n) => n.min(bound),
            // Centrifuge: a negative limit asks for everything the server gives.
            Err(_) => bound,
        };
        // The offsets (lo, hi] to read.
        let (lo, hi) = if h.reverse {
            let hi = match &h.since {
                Some(since) => since.offset.saturating_sub(1),
                None => top,
            };
            (hi.saturating_sub(limit), hi)
        } else {
            let lo = h.since.as_ref().map_or(0, |s| s.offset);
            (lo, lo.saturating_add(limit).min(top))
        };
        let mut records = Vec::new();
        let mut after = lo;
        while after < hi {
            let want = usize::try_from(hi - after).unwrap_or(usize::MAX);
            let Some(page) = self
                .backend
                .stream_read(&self.ctx, session, after, want)
                .await?
            else {
                return Ok(None);
            };
            let Some(last) = page.records.last() else {
                break;
            };
            after = last.offset;
            records.extend(page.records.into_iter().take_while(|p| p.offset <= hi));
        }
        if h.reverse {
            records.reverse();
        }
        Ok(Some((records, position)))
    }

    async fn unsubscribe(&mut self, id: u32, channel: &str) -> Flow {
        if parse_run_channel(channel).is_some() {
            if let Some(stop) = self.run_subscriptions.remove(channel) {
                stop.cancel();
            }
            return self.send(encode_reply(id, "unsubscribe", "{}")).await;
        }
        let Ok((tenant, session)) = parse_session_channel(channel) else {
            return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
        };
        if tenant == self.ctx.tenant
            && let Some(binding) = self.bindings.get_mut(&session)
            && let Some(stop) = binding.subscription.take()
        {
            stop.cancel();
        }
        self.send(encode_reply(id, "unsubscribe", "{}")).await
    }

    async fn publish(&mut self, id: u32, p: PublishRequest) -> Flow {
        let Ok((tenant, session)) = parse_session_channel(&p.channel) else {
            return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
        };
        let Ok(delivery) = Delivery::decode(data_bytes(&p.data)) else {
            return self.reply_error(id, &ReplyError::BAD_REQUEST).await;
        };
        let span = tracing::info_span!(
            parent: None,
            "hostlink.delivery",
            tenant = %self.ctx.tenant,
            link = %self.ctx.link,
            session = %session,
            command = %delivery.command_id,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        trace_context::span::continue_if(
            &span,
            delivery.trace().as_ref().or(self.ctx.trace.as_ref()),
        );
        self.deliver(id, tenant, session, delivery)
            .instrument(span)
            .await
    }

    async fn deliver(
        &mut self,
        id: u32,
        tenant: TenantId,
        session: SessionId,
        delivery: Delivery,
    ) -> Flow {
        let unavailable = ReplyError::hostlink(HostLinkError::RuntimeUnavailable.code());
        if tenant != self.ctx.tenant || !self.core.registry.is_bound(self.ctx.link, &session) {
            return self.reply_error(id, &unavailable).await;
        }
        match self
            .backend
            .deliver(&self.ctx, &session, &delivery.command_id)
            .await
        {
            Ok(()) => self.send(encode_reply(id, "publish", "{}")).await,
            Err(Refusal::HostLink(e)) => {
                self.reply_error(id, &ReplyError::hostlink(e.code())).await
            }
            Err(Refusal::Internal(detail)) => {
                tracing::warn!(detail = %detail, "the backend failed a delivery");
                self.reply_error(id, &ReplyError::INTERNAL).await
            }
            Err(Refusal::BadRequest) => self.reply_error(id, &ReplyError::BAD_REQUEST).await,
        }
    }
}
