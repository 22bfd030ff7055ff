//! `cargo bench -p host --bench fanout`
//!
//! How fast one session's enduring publications reach its bound subscribers over HostLink,
//! against a raw axum + tokio-tungstenite broadcast of the very same bytes, measured in the
//! same run. For 1 and for 100 subscribers: a real `hostlink_router` on 127.0.0.1 (TCP_NODELAY
//! on accepted sockets, as the Host's listener sets it) with an in-bench backend whose bind
//! hands each link a receiver of one `broadcast` feed; N WebSocket subscribers each connect
//! with a token, `hostlink.bind` and subscribe to the session channel; then M publications
//! (an assistant_message body) are sent as fast as the feed takes them, and the clock stops
//! when every subscriber holds all M. The raw path: an axum WebSocket route that forwards each
//! publication's wire text from a `broadcast` channel to its socket (flushing after what is
//! ready, up to 64 messages), no protocol at all; the same clients count the same lines.
//!
//! Every subscriber checks the journal sequence of each push it receives (1, 2, … M, nothing
//! missing or reordered); the first subscriber also decodes each push in full. The feed holds
//! all M publications, so the figures are throughput, never drops; a subscriber the Host
//! disconnected (e.g. 3008 slow) is reported. Rounds alternate between the two paths; the
//! medians are printed. No assertion on timing.
//!
//! Every push carries its stream offset. Then recovery: a session journal of
//! `RECOVERY_RECORDS` public records (with a private control record after every fourth, as a
//! runtime writes them) in a real store (SQLite, and PostgreSQL when
//! `HOST_TEST_DATABASE_URL` is set); a client binds and subscribes with `recover` from offset
//! 0 and the clock stops when it holds the reply with every record (then decoded and checked:
//! offsets 1..N; the rate including the client's decoding is printed too). The baseline: a
//! plain public journal read of the same records from the same store (`journal_public_page`,
//! page by page). Both warm (the Host's reader keeps what it learned of the session); medians
//! of `RECOVERY_ROUNDS` alternating rounds.

use std::net::SocketAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::Router;
use axum::extract::State;
use axum::extract::ws::{Message as ServerMessage, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use axum::routing::get;
use axum::serve::ListenerExt as _;
use futures::{SinkExt, StreamExt};
use host::stream::StreamReader;
use hostlink::auth::{AuthVerifier, CredentialStore, credential_digest_hex};
use hostlink::channel::session_channel;
use hostlink::codes::Disconnect;
use hostlink::frame::{PING, encode_publication, encode_push};
use hostlink::public_journal::stream_epoch;
use hostlink::records::{
    AttachRequest, BindRequest, DrainObservation, DrainRequest, EnduringPublication, HostLinkError,
    RegistryObservation, UnbindRequest,
};
use hostlink_server::backend::{
    FeedItem, LinkBackend, LinkCtx, Refusal, SessionFeed, StreamPublication,
};
use hostlink_server::{ENDURING_RECORD, RECORD_TAG};
use hostlink_server::{LinkOptions, StreamPage, hostlink_router};
use serde_json::Value;
use serde_json::value::RawValue;
use sessionstore::testing::{TestBackend, TestStore};
use sessionstore::{
    AgentId, CommandId, CompatibilityId, EventId, JournalEntry, NewSession, RuntimeSessionId,
    SessionBinding, SessionId, TenantId, local_binding,
};
use testkit::bench::{median, runtime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::broadcast;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// (subscribers, publications per round).
const SETS: [(usize, u64); 2] = [(1, 200_000), (100, 30_000)];
const ROUNDS: usize = 5;
/// The raw path flushes after at most this many messages, as HostLink batches at most
/// `MAX_OUTBOUND_BATCH_MESSAGES` per frame.
const RAW_FLUSH_EVERY: usize = 64;
const TENANT: &str = "bench";
const SESSION: &str = "fanout";
const TOKEN: &str = "bench-token";
const HOST_ID: &str = "host-bench";
const BUILD: &str = "build-bench";
/// Public records a resubscribing client replays in the recovery measurement.
const RECOVERY_RECORDS: u64 = 1000;
const RECOVERY_ROUNDS: usize = 7;
/// A stalled round fails instead of hanging the bench.
const ROUND_LIMIT: Duration = Duration::from_secs(60);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

fn tenant() -> TenantId {
    TenantId::new(TENANT).unwrap()
}

fn session() -> SessionId {
    SessionId::new(SESSION).unwrap()
}

/// A realistic committed event body (~390 bytes).
fn assistant_message(seq: u64) -> String {
    format!(
        concat!(
            r#"{{"type":"assistant_message","message_id":"msg-{seq:08}","turn":{turn},"#,
            r#""role":"assistant","content":[{{"type":"text","text":"The build finished: 214 "#,
            r#"tests passed and 3 were skipped. I changed the relay so that a slow link is "#,
            r#"closed instead of buffering without bound, and next I will rerun the fan-out "#,
            r#"benchmark to compare."}}],"model":"assistant-large","stop_reason":"end_turn","#,
            r#""usage":{{"input_tokens":1873,"output_tokens":64}}}}"#
        ),
        seq = seq,
        turn = seq / 4 + 1,
    )
}

/// The publications of one round, built before the clock starts (as the Host builds each
/// once, whatever the number of links).
fn publications(m: u64) -> Vec<Arc<StreamPublication>> {
    (1..=m)
        .map(|seq| {
            let body = RawValue::from_string(assistant_message(seq)).unwrap();
            let record = EnduringPublication::new(
                tenant(),
                session(),
                EventId::new(format!("event-{seq}")).unwrap(),
                NonZeroU64::new(seq).unwrap(),
                seq,
                body,
            )
            .unwrap();
            // Offsets on: each push carries its stream offset.
            Arc::new(StreamPublication {
                offset: seq,
                record,
            })
        })
        .collect()
}

/// The text HostLink puts on the wire for `p` (the pump's own encoder and tags).
fn wire_text(channel: &str, p: &StreamPublication) -> String {
    encode_push(
        channel,
        &encode_publication(
            &p.record.encode(),
            Some(p.offset),
            &[(RECORD_TAG, ENDURING_RECORD)],
        ),
    )
}

/// One resident session whose feed every bind subscribes to. Attach is not needed: the link
/// lets a client bind directly.
struct FanoutBackend {
    credentials: CredentialStore,
    feed: broadcast::Sender<FeedItem>,
    invalidations: broadcast::Sender<(TenantId, SessionId)>,
    /// The session's durable stream, for the recovery measurement.
    streams: Option<StreamReader>,
}

impl FanoutBackend {
    fn new(feed: broadcast::Sender<FeedItem>) -> FanoutBackend {
        let mut credentials = CredentialStore::empty();
        credentials
            .add(tenant(), &credential_digest_hex(TOKEN))
            .unwrap();
        FanoutBackend {
            credentials,
            feed,
            invalidations: broadcast::channel(4).0,
            streams: None,
        }
    }
}

fn unavailable() -> Refusal {
    Refusal::HostLink(HostLinkError::RuntimeUnavailable)
}

#[async_trait]
impl LinkBackend for FanoutBackend {
    fn server_version(&self) -> String {
        "fanout-bench".into()
    }

    fn capability_tokens(&self) -> Vec<String> {
        Vec::new()
    }

    fn accepting_links(&self) -> bool {
        true
    }

    fn auth(&self) -> &dyn AuthVerifier {
        &self.credentials
    }

    async fn attach(&self, _: &LinkCtx, _: AttachRequest) -> Result<RegistryObservation, Refusal> {
        Err(unavailable())
    }

    async fn bind(&self, _: &LinkCtx, req: BindRequest) -> Result<SessionFeed, Refusal> {
        if req.session_id != session() || req.host_id.as_str() != HOST_ID {
            return Err(unavailable());
        }
        Ok(SessionFeed::new(self.feed.subscribe()))
    }

    async fn unbind(&self, _: &LinkCtx, _: UnbindRequest) -> Result<(), Refusal> {
        Ok(())
    }

    async fn drain(&self, _: &LinkCtx, _: DrainRequest) -> Result<DrainObservation, Refusal> {
        Err(unavailable())
    }

    async fn drain_status(
        &self,
        _: &LinkCtx,
        _: DrainRequest,
    ) -> Result<DrainObservation, Refusal> {
        Err(unavailable())
    }

    async fn deliver(&self, _: &LinkCtx, _: &SessionId, _: &CommandId) -> Result<(), Refusal> {
        Err(unavailable())
    }

    fn route_invalidations(&self) -> broadcast::Receiver<(TenantId, SessionId)> {
        self.invalidations.subscribe()
    }

    async fn stream_read(
        &self,
        link: &LinkCtx,
        session: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Option<StreamPage>, Refusal> {
        let Some(streams) = &self.streams else {
            return Ok(None);
        };
        streams
            .read(&link.tenant, session, after, limit)
            .await
            .map(Some)
            .map_err(|e| Refusal::Internal(e.to_string()))
    }
}

/// Serves `router` on 127.0.0.1 with TCP_NODELAY on every accepted socket.
async fn serve(router: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (addr, task)
}

async fn dial(url: String) -> Ws {
    let (ws, _) = tokio_tungstenite::connect_async_with_config(url, None, true)
        .await
        .expect("dial");
    ws
}

/// Sends one command and waits for its reply (nothing else can arrive before publishing).
async fn request(ws: &mut Ws, id: u64, command: String) -> Value {
    ws.send(Message::text(command)).await.expect("send");
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) => {
                for line in text.as_str().split('\n') {
                    let v: Value = serde_json::from_str(line).expect("a JSON reply");
                    if v["id"] == id {
                        return v;
                    }
                }
            }
            Some(Ok(Message::Close(frame))) => panic!("closed during setup: {frame:?}"),
            Some(Ok(_)) => {}
            other => panic!("the link ended during setup: {other:?}"),
        }
    }
}

/// A HostLink subscriber: connect with the tenant token, bind the session, subscribe.
async fn hostlink_subscriber(addr: SocketAddr, channel: String) -> Ws {
    let mut ws = dial(format!("ws://{addr}/hostlink/{TENANT}")).await;
    let connect = request(
        &mut ws,
        1,
        format!(
            r#"{{"id":1,"connect":{{"token":"{TOKEN}","data":{{"supported_versions":[1]}},"name":"fanout-bench","version":"0"}}}}"#
        ),
    )
    .await;
    assert!(connect.get("connect").is_some(), "connect: {connect}");
    let bind = request(
        &mut ws,
        2,
        format!(
            r#"{{"id":2,"rpc":{{"method":"hostlink.bind","data":{{"version":1,"tenant_id":"{TENANT}","session_id":"{SESSION}","host_id":"{HOST_ID}","host_generation":1,"lease_epoch":1,"runtime_compatibility_id":"{BUILD}","idempotency_key":"bind"}}}}}}"#
        ),
    )
    .await;
    assert_eq!(bind["rpc"]["data"], serde_json::json!({}), "bind: {bind}");
    let subscribe = request(
        &mut ws,
        3,
        format!(r#"{{"id":3,"subscribe":{{"channel":"{channel}"}}}}"#),
    )
    .await;
    assert!(
        subscribe.get("subscribe").is_some(),
        "subscribe: {subscribe}"
    );
    ws
}

/// The `journal_seq` of a push line, read without decoding the rest.
fn journal_seq(line: &str) -> Option<u64> {
    const KEY: &str = "\"journal_seq\":";
    let at = line.find(KEY)? + KEY.len();
    let digits = &line[at..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// Decodes one push in full and checks it is the enduring record `seq` on `channel`.
fn check_push(line: &str, channel: &str, seq: u64) -> Result<(), String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let push = &v["push"];
    let data = &push["pub"]["data"];
    let ok = push["channel"] == channel
        && push["pub"]["tags"][RECORD_TAG] == ENDURING_RECORD
        && data["tenant_id"] == TENANT
        && data["session_id"] == SESSION
        && data["journal_seq"] == seq
        && data["body"]["type"] == "assistant_message";
    if ok {
        Ok(())
    } else {
        Err(format!("unexpected push for {seq}: {line}"))
    }
}

/// What one subscriber saw.
struct Received {
    done: Instant,
    first_line: Option<String>,
    ws: Ws,
}

/// Counts pushes until all `m` arrived, in order. With `full_check`, decodes every push.
async fn receive(mut ws: Ws, m: u64, full_check: Option<String>) -> Result<Received, String> {
    let mut next = 1u64;
    let mut first_line = None;
    while next <= m {
        let text = match ws.next().await {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(frame))) => {
                return Err(match frame {
                    Some(f) => format!("disconnected {} {}", u16::from(f.code), f.reason),
                    None => "disconnected".to_owned(),
                });
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(format!("socket failed: {e}")),
            None => return Err("the connection ended".to_owned()),
        };
        for line in text.as_str().split('\n') {
            if line == PING {
                ws.send(Message::text(PING))
                    .await
                    .map_err(|e| e.to_string())?;
                continue;
            }
            let seq = journal_seq(line).ok_or_else(|| format!("not a publication: {line}"))?;
            if seq != next {
                return Err(format!("expected publication {next}, got {seq}"));
            }
            if let Some(channel) = &full_check {
                check_push(line, channel, seq)?;
                if seq == 1 {
                    first_line = Some(line.to_owned());
                }
            }
            next += 1;
        }
    }
    Ok(Received {
        done: Instant::now(),
        first_line,
        ws,
    })
}

/// One measured round.
struct Round {
    elapsed: Duration,
    completed: usize,
    failures: Vec<String>,
    first_line: Option<String>,
}

impl Round {
    fn deliveries_per_sec(&self, m: u64) -> f64 {
        (m * self.completed as u64) as f64 / self.elapsed.as_secs_f64()
    }
}

/// Starts every subscriber's reader, runs `publish`, and waits for all of them.
async fn measure(subscribers: Vec<Ws>, m: u64, channel: &str, publish: impl FnOnce()) -> Round {
    let readers: Vec<_> = subscribers
        .into_iter()
        .enumerate()
        .map(|(i, ws)| {
            let check = (i == 0).then(|| channel.to_owned());
            tokio::spawn(receive(ws, m, check))
        })
        .collect();
    let start = Instant::now();
    publish();
    let mut last = start;
    let mut completed = 0;
    let mut failures = Vec::new();
    let mut first_line = None;
    let mut sockets = Vec::new();
    for reader in readers {
        match tokio::time::timeout(ROUND_LIMIT, reader).await {
            Ok(Ok(Ok(r))) => {
                completed += 1;
                last = last.max(r.done);
                first_line = first_line.or(r.first_line);
                sockets.push(r.ws);
            }
            Ok(Ok(Err(e))) => failures.push(e),
            Ok(Err(e)) => failures.push(format!("reader panicked: {e}")),
            Err(_) => failures.push("no completion within the round limit".to_owned()),
        }
    }
    drop(sockets);
    Round {
        elapsed: last - start,
        completed,
        failures,
        first_line,
    }
}

async fn hostlink_round(n: usize, pubs: &[Arc<StreamPublication>], channel: &str) -> Round {
    let (feed, _) = broadcast::channel(pubs.len());
    let backend = Arc::new(FanoutBackend::new(feed.clone()));
    let options = LinkOptions {
        // 100 links of one tenant, each holding its binding.
        max_tenant_links: 256,
        ..LinkOptions::default()
    };
    let (router, handle) = hostlink_router(backend, options.validate().expect("options"));
    let (addr, server) = serve(router).await;
    let subscribers =
        futures::future::join_all((0..n).map(|_| hostlink_subscriber(addr, channel.to_owned())))
            .await;
    // Each link holds its pump's receiver (and keeps one for a later resubscribe).
    assert!(
        feed.receiver_count() >= n,
        "every subscriber holds the feed"
    );
    let batch: Vec<FeedItem> = pubs.iter().cloned().map(FeedItem::Enduring).collect();
    let round = measure(subscribers, pubs.len() as u64, channel, || {
        for item in batch {
            let _ = feed.send(item);
        }
    })
    .await;
    handle.close_all(Disconnect::SHUTDOWN);
    let _ = tokio::time::timeout(Duration::from_secs(10), handle.wait()).await;
    server.abort();
    round
}

/// The raw path: one WebSocket, one receiver, bytes out as they come.
async fn raw_link(mut socket: WebSocket, mut feed: broadcast::Receiver<Utf8Bytes>) {
    loop {
        let first = match feed.recv().await {
            Ok(text) => text,
            Err(_) => break,
        };
        if socket.feed(ServerMessage::Text(first)).await.is_err() {
            return;
        }
        for _ in 1..RAW_FLUSH_EVERY {
            match feed.try_recv() {
                Ok(text) => {
                    if socket.feed(ServerMessage::Text(text)).await.is_err() {
                        return;
                    }
                }
                Err(_) => break,
            }
        }
        if socket.flush().await.is_err() {
            return;
        }
    }
    let _ = socket.close().await;
}

async fn raw_accept(
    State(feed): State<broadcast::Sender<Utf8Bytes>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    let receiver = feed.subscribe();
    upgrade.on_upgrade(move |socket| raw_link(socket, receiver))
}

async fn raw_round(n: usize, wire: &[Utf8Bytes], channel: &str) -> Round {
    let (feed, _) = broadcast::channel::<Utf8Bytes>(wire.len());
    let router = Router::new()
        .route("/raw", get(raw_accept))
        .with_state(feed.clone());
    let (addr, server) = serve(router).await;
    let subscribers =
        futures::future::join_all((0..n).map(|_| dial(format!("ws://{addr}/raw")))).await;
    assert_eq!(feed.receiver_count(), n, "every subscriber holds the feed");
    let batch: Vec<Utf8Bytes> = wire.to_vec();
    let round = measure(subscribers, wire.len() as u64, channel, || {
        for text in batch {
            let _ = feed.send(text);
        }
    })
    .await;
    drop(feed);
    server.abort();
    round
}

fn rounds_text(v: &[f64]) -> String {
    v.iter()
        .map(|r| format!("{r:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn bench_set(n: usize, m: u64) -> (f64, f64) {
    let channel = session_channel(&tenant(), &session());
    let pubs = publications(m);
    let wire: Vec<Utf8Bytes> = pubs
        .iter()
        .map(|p| Utf8Bytes::from(wire_text(&channel, p)))
        .collect();
    let mut hostlink = Vec::new();
    let mut raw = Vec::new();
    let mut failures = (0usize, 0usize);
    // One unmeasured round of each first (connections, allocator, caches).
    let warm = (m / 4).max(1) as usize;
    let _ = hostlink_round(n, &pubs[..warm], &channel).await;
    let _ = raw_round(n, &wire[..warm], &channel).await;
    for _ in 0..ROUNDS {
        let h = hostlink_round(n, &pubs, &channel).await;
        if let Some(line) = &h.first_line {
            assert_eq!(
                line.as_str(),
                wire[0].as_str(),
                "the raw path sends what HostLink sends"
            );
        }
        for f in &h.failures {
            println!("fanout: {n} subscribers: hostlink subscriber failed: {f}");
        }
        failures.0 += h.failures.len();
        hostlink.push(h.deliveries_per_sec(m));
        let r = raw_round(n, &wire, &channel).await;
        for f in &r.failures {
            println!("fanout: {n} subscribers: raw subscriber failed: {f}");
        }
        failures.1 += r.failures.len();
        raw.push(r.deliveries_per_sec(m));
    }
    let h = median(hostlink.clone());
    let r = median(raw.clone());
    let nf = n as f64;
    println!(
        "fanout: {n} subscriber(s), {m} publications of {} bytes per round, median of {ROUNDS} rounds",
        wire[0].len()
    );
    println!(
        "fanout:   hostlink: {:>9.0} publications/s  {h:>9.0} deliveries/s  (rounds: {})",
        h / nf,
        rounds_text(&hostlink)
    );
    println!(
        "fanout:   raw:      {:>9.0} publications/s  {r:>9.0} deliveries/s  (rounds: {})",
        r / nf,
        rounds_text(&raw)
    );
    println!("fanout:   hostlink / raw: {:.2}x", h / r);
    println!(
        "fanout:   subscribers disconnected or failed: hostlink {}, raw {}",
        failures.0, failures.1
    );
    (h, r)
}

/// A store holding the bench session with `RECOVERY_RECORDS` public records.
async fn recovery_store(backend: TestBackend) -> Option<(TestStore, RuntimeSessionId)> {
    let ts = TestStore::open(backend).await?;
    let rs = RuntimeSessionId::mint();
    ts.store
        .create_session(NewSession {
            tenant: tenant(),
            session: session(),
            agent: AgentId::new("assistant").unwrap(),
            compatibility: CompatibilityId::new(BUILD).unwrap(),
            binding: SessionBinding {
                runtime_session_id: rs,
                storage_binding_id: local_binding(),
                binding_version: 1,
            },
        })
        .await
        .unwrap();
    let mut lease = ts
        .store
        .journal_acquire(&tenant(), rs, "bench", Duration::from_secs(60))
        .await
        .unwrap();
    let mut entries = Vec::new();
    for seq in 1..=RECOVERY_RECORDS {
        entries.push(JournalEntry::Event {
            event: EventId::new(format!("event-{seq}")).unwrap(),
            public_body: assistant_message(seq).into_bytes(),
            private_body: None,
            cause: None,
        });
        if seq % 4 == 0 {
            entries.push(JournalEntry::Control {
                body: b"{\"checkpoint\":true}".to_vec(),
                cause: None,
            });
        }
        if entries.len() >= 500 || seq == RECOVERY_RECORDS {
            lease.tip = ts
                .store
                .journal_append(&lease, std::mem::take(&mut entries))
                .await
                .unwrap();
        }
    }
    Some((ts, rs))
}

/// The baseline: every public record read from the store, page by page.
async fn plain_read(ts: &TestStore, rs: RuntimeSessionId) -> Duration {
    let start = Instant::now();
    let mut after = 0;
    let mut pinned = None;
    let mut read = 0u64;
    loop {
        let page = ts
            .store
            .journal_public_page(&tenant(), rs, after, pinned, 1000)
            .await
            .unwrap();
        read += page.events.len() as u64;
        pinned = Some(page.tip);
        after = page.next_after;
        if page.is_complete() {
            break;
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(read, RECOVERY_RECORDS);
    elapsed
}

/// One resubscribe from offset 0: the time until the client holds the reply with every
/// record, and the time until it has also decoded it into a JSON tree (the client's own
/// cost, which the plain read does not pay: it hands back the bodies undecoded).
async fn recovery_round(addr: SocketAddr, channel: &str, epoch: &str) -> (Duration, Duration) {
    let mut ws = dial(format!("ws://{addr}/hostlink/{TENANT}")).await;
    let connect = request(
        &mut ws,
        1,
        format!(
            r#"{{"id":1,"connect":{{"token":"{TOKEN}","data":{{"supported_versions":[1]}}}}}}"#
        ),
    )
    .await;
    assert!(connect.get("connect").is_some(), "connect: {connect}");
    let bind = request(
        &mut ws,
        2,
        format!(
            r#"{{"id":2,"rpc":{{"method":"hostlink.bind","data":{{"version":1,"tenant_id":"{TENANT}","session_id":"{SESSION}","host_id":"{HOST_ID}","host_generation":1,"lease_epoch":1,"runtime_compatibility_id":"{BUILD}","idempotency_key":"bind"}}}}}}"#
        ),
    )
    .await;
    assert_eq!(bind["rpc"]["data"], serde_json::json!({}), "bind: {bind}");
    let start = Instant::now();
    ws.send(Message::text(format!(
        r#"{{"id":3,"subscribe":{{"channel":"{channel}","recover":true,"offset":0,"epoch":"{epoch}"}}}}"#
    )))
    .await
    .expect("send");
    // Nothing but the reply can arrive before it (no publication is made meanwhile).
    let text = loop {
        match ws.next().await {
            Some(Ok(Message::Text(text))) if text.as_str().starts_with(r#"{"id":3,"#) => {
                break text;
            }
            Some(Ok(Message::Close(frame))) => panic!("closed during recovery: {frame:?}"),
            Some(Ok(_)) => {}
            other => panic!("the link ended during recovery: {other:?}"),
        }
    };
    let received = start.elapsed();
    let reply: Value = serde_json::from_str(text.as_str()).expect("a JSON reply");
    let decoded = start.elapsed();
    let result = &reply["subscribe"];
    assert_eq!(result["recovered"], true, "{reply}");
    let pubs = result["publications"].as_array().expect("publications");
    assert_eq!(pubs.len() as u64, RECOVERY_RECORDS);
    for (i, p) in pubs.iter().enumerate() {
        assert_eq!(p["offset"], i as u64 + 1);
    }
    let _ = ws.close(None).await;
    (received, decoded)
}

async fn bench_recovery(label: &str, backend: TestBackend) {
    let Some((ts, rs)) = recovery_store(backend).await else {
        println!("recovery: {label}: not available here");
        return;
    };
    let (feed, _) = broadcast::channel(16);
    let mut backend = FanoutBackend::new(feed);
    backend.streams = Some(StreamReader::new(ts.store.clone(), 4));
    let options = LinkOptions {
        recovery_window: RECOVERY_RECORDS as usize,
        ..LinkOptions::default()
    };
    let (router, handle) = hostlink_router(Arc::new(backend), options.validate().expect("options"));
    let (addr, server) = serve(router).await;
    let channel = session_channel(&tenant(), &session());
    let epoch = stream_epoch(rs);
    // Warm both paths once.
    let _ = plain_read(&ts, rs).await;
    let _ = recovery_round(addr, &channel, &epoch).await;
    let mut recovery = Vec::new();
    let mut decoded = Vec::new();
    let mut plain = Vec::new();
    let rate = |d: Duration| RECOVERY_RECORDS as f64 / d.as_secs_f64();
    for _ in 0..RECOVERY_ROUNDS {
        let (received, parsed) = recovery_round(addr, &channel, &epoch).await;
        recovery.push(rate(received));
        decoded.push(rate(parsed));
        plain.push(rate(plain_read(&ts, rs).await));
    }
    let r = median(recovery.clone());
    let d = median(decoded.clone());
    let p = median(plain.clone());
    println!(
        "recovery: {label}: {RECOVERY_RECORDS} public records (with private records between), median of {RECOVERY_ROUNDS} rounds"
    );
    println!(
        "recovery:   resubscribe with recover from offset 0: {r:>9.0} records/s  (rounds: {})",
        rounds_text(&recovery)
    );
    println!(
        "recovery:   the same, including the client's decoding of the reply into a JSON tree: {d:>9.0} records/s  (rounds: {}; {:.2}x the plain read)",
        rounds_text(&decoded),
        d / p
    );
    println!(
        "recovery:   plain journal read of the same records: {p:>9.0} records/s  (rounds: {})",
        rounds_text(&plain)
    );
    println!(
        "recovery:   recovery / plain read: {:.2}x (goal >= 0.50x: {})",
        r / p,
        if r / p >= 0.5 { "met" } else { "missed" }
    );
    handle.close_all(Disconnect::SHUTDOWN);
    let _ = tokio::time::timeout(Duration::from_secs(10), handle.wait()).await;
    server.abort();
}

fn main() {
    // `cargo bench` passes `--bench`. A filter argument `recovery` runs only the recovery
    // measurement; any other filter is accepted and ignored.
    let only_recovery = std::env::args().skip(1).any(|a| a == "recovery");
    let rt = runtime();
    let started = Instant::now();
    let mut at_many = None;
    let sets: &[(usize, u64)] = if only_recovery { &[] } else { &SETS };
    for &(n, m) in sets {
        let (h, r) = rt.block_on(bench_set(n, m));
        at_many = Some(h / r);
    }
    if let Some(ratio) = at_many {
        println!(
            "fanout: goal at {} subscribers: >= 0.70x raw; measured {ratio:.2}x ({})",
            SETS[SETS.len() - 1].0,
            if ratio >= 0.7 { "met" } else { "missed" }
        );
    }
    rt.block_on(bench_recovery("SQLite", TestBackend::Sqlite));
    rt.block_on(bench_recovery("PostgreSQL", TestBackend::Postgres));
    println!("fanout: total {:.1} s", started.elapsed().as_secs_f64());
}
