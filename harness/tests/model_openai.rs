//! `OpenAiModel` against a real HTTP server on 127.0.0.1 that serves scripted answers.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use futures::stream::BoxStream;
use futures::{StreamExt, stream};
use harness::model::{
    ChatMessage, FinishReason, Model, ModelError, ModelEvent, ModelRequest, OpenAiConfig,
    OpenAiModel, TokenUsage, ToolCall, ToolSpec,
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-very-secret-4242";

/// How a scripted answer's body ends after its chunks.
#[derive(Clone, Copy)]
enum End {
    /// The body ends normally.
    Close,
    /// The server sends nothing more and keeps the connection open.
    Stall,
    /// The server breaks the connection mid-body.
    Abort,
}

#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    /// Waited before the answer's headers are sent.
    header_delay: Duration,
    chunks: Vec<Vec<u8>>,
    /// Waited before each chunk.
    gap: Duration,
    end: End,
}

impl Reply {
    fn sse(body: impl Into<String>) -> Self {
        Self::chunks(vec![body.into().into_bytes()])
    }

    fn chunks(chunks: Vec<Vec<u8>>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type", "text/event-stream".into())],
            header_delay: Duration::ZERO,
            chunks,
            gap: Duration::from_millis(2),
            end: End::Close,
        }
    }

    fn status(status: u16, body: &str) -> Self {
        Reply {
            status,
            headers: vec![("content-type", "application/json".into())],
            header_delay: Duration::ZERO,
            chunks: vec![body.as_bytes().to_vec()],
            gap: Duration::ZERO,
            end: End::Close,
        }
    }

    /// Sets a header, replacing one of the same name.
    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name, value.into()));
        self
    }

    fn ending(mut self, end: End) -> Self {
        self.end = end;
        self
    }
}

struct Received {
    at: Instant,
    headers: HeaderMap,
    body: Value,
}

#[derive(Default)]
struct Shared {
    /// Answers in order; the last one is repeated.
    replies: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
}

struct TestServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl TestServer {
    async fn start(replies: Vec<Reply>) -> Self {
        let shared = Arc::new(Shared {
            replies: Mutex::new(replies.into()),
            received: Mutex::default(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        TestServer { addr, shared }
    }

    fn config(&self) -> OpenAiConfig {
        let mut config = OpenAiConfig::new(format!("http://{}/v1/", self.addr), KEY, "test-model");
        config.options.connect_timeout = Duration::from_millis(200);
        config.options.request_timeout = Duration::from_millis(300);
        config.options.idle_timeout = Duration::from_millis(60);
        config.options.max_retries = 2;
        config.options.backoff_initial = Duration::from_millis(2);
        config.options.backoff_max = Duration::from_millis(10);
        config
    }

    fn model(&self) -> OpenAiModel {
        OpenAiModel::new(self.config()).unwrap()
    }

    fn request_count(&self) -> usize {
        self.shared.received.lock().unwrap().len()
    }
}

async fn answer(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    shared.received.lock().unwrap().push(Received {
        at: Instant::now(),
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    });
    let reply = {
        let mut replies = shared.replies.lock().unwrap();
        if replies.len() > 1 {
            replies.pop_front().unwrap()
        } else {
            replies.front().cloned().unwrap()
        }
    };
    tokio::time::sleep(reply.header_delay).await;
    let gap = reply.gap;
    let chunks = stream::iter(reply.chunks).then(move |chunk| async move {
        tokio::time::sleep(gap).await;
        Ok::<Bytes, std::io::Error>(Bytes::from(chunk))
    });
    let body: BoxStream<'static, Result<Bytes, std::io::Error>> = match reply.end {
        End::Close => chunks.boxed(),
        End::Stall => chunks.chain(stream::pending()).boxed(),
        End::Abort => chunks
            .chain(stream::once(async move {
                // Let the chunks before it leave the server first.
                tokio::time::sleep(Duration::from_millis(20)).await;
                Err(std::io::Error::other("server gave up"))
            }))
            .boxed(),
    };
    let mut response = Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
    for (name, value) in reply.headers {
        response = response.header(name, value);
    }
    response.body(Body::from_stream(body)).unwrap()
}

fn data(chunk: Value) -> String {
    format!("data: {chunk}\n\n")
}

fn text(content: &str) -> String {
    data(json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}],
    }))
}

fn finish(reason: &str) -> String {
    data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
}

const DONE: &str = "data: [DONE]\n\n";

fn hello() -> ModelRequest {
    ModelRequest {
        messages: vec![ChatMessage::User {
            text: "hello".into(),
        }],
        tools: vec![],
    }
}

async fn collect(
    model: &OpenAiModel,
    request: ModelRequest,
) -> Vec<Result<ModelEvent, ModelError>> {
    model.stream(request).await.unwrap().collect().await
}

fn delta(text: &str) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::TextDelta(text.into()))
}

fn finished(reason: FinishReason) -> Result<ModelEvent, ModelError> {
    Ok(ModelEvent::Finished(reason))
}

#[tokio::test]
async fn text_deltas_stream_in_order_past_comments_and_crlf_and_finish_with_stop() {
    let body = [
        ": keep-alive\n\n".to_string(),
        data(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})),
        text("Hel"),
        text("lo").replace('\n', "\r\n"),
        "event: message\nid: 7\n".to_string(),
        text(" wörld"),
        finish("stop"),
        DONE.to_string(),
    ]
    .concat();
    let server = TestServer::start(vec![Reply::sse(body)]).await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(
        events,
        vec![
            delta("Hel"),
            delta("lo"),
            delta(" wörld"),
            finished(FinishReason::Stop)
        ]
    );
}

#[tokio::test]
async fn tool_call_fragments_split_across_chunks_become_one_call_per_index() {
    let fragment = |index: u64, head: Option<(&str, &str)>, arguments: &str| {
        let mut call = json!({"index": index, "function": {"arguments": arguments}});
        if let Some((id, name)) = head {
            call["id"] = json!(id);
            call["type"] = json!("function");
            call["function"]["name"] = json!(name);
        }
        data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
    };
    let body = [
        text("Let me look."),
        fragment(0, Some(("call_a", "read_file")), ""),
        fragment(0, None, "{\"pa"),
        fragment(1, Some(("call_b", "search")), "{\"q\":"),
        fragment(0, None, "th\": \"café/"),
        fragment(1, None, " \"x y\"}"),
        fragment(0, None, "menu.txt\"}"),
        finish("tool_calls"),
        DONE.to_string(),
    ]
    .concat()
    .into_bytes();
    // Cut the body at awkward places: inside "data:", inside JSON strings, inside the two
    // bytes of "é", and between the two line feeds of an event boundary.
    let e_acute = body.windows(2).position(|w| w == "é".as_bytes()).unwrap();
    let mut cuts = vec![3, 40, e_acute + 1, body.len() - 4];
    cuts.extend((60..body.len() - 10).step_by(37));
    cuts.sort_unstable();
    cuts.dedup();
    let mut chunks = Vec::new();
    let mut start = 0;
    for cut in cuts {
        chunks.push(body[start..cut].to_vec());
        start = cut;
    }
    chunks.push(body[start..].to_vec());
    let server = TestServer::start(vec![Reply::chunks(chunks)]).await;

    let events = collect(&server.model(), hello()).await;
    assert_eq!(
        events,
        vec![
            delta("Let me look."),
            Ok(ModelEvent::ToolCall(ToolCall::new(
                "call_a",
                "read_file",
                json!({"path": "café/menu.txt"}),
            ))),
            Ok(ModelEvent::ToolCall(ToolCall::new(
                "call_b",
                "search",
                json!({"q": "x y"}),
            ))),
            finished(FinishReason::ToolCalls),
        ]
    );
}

#[tokio::test]
async fn the_request_carries_auth_stream_flag_and_mapped_messages_and_tools() {
    let server = TestServer::start(vec![Reply::sse(finish("stop") + DONE)]).await;
    let mut config = server.config();
    config.options.max_tokens = Some(256);
    config.options.temperature = Some(0.2);
    let model = OpenAiModel::new(config).unwrap();
    let request = ModelRequest {
        messages: vec![
            ChatMessage::System {
                text: "Be brief.".into(),
            },
            ChatMessage::User {
                text: "Read a.txt".into(),
            },
            ChatMessage::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall::new(
                    "call_1",
                    "read_file",
                    json!({"path": "a.txt"}),
                )],
            },
            ChatMessage::Tool {
                call_id: "call_1".into(),
                name: "read_file".into(),
                content: "hi there".into(),
            },
            ChatMessage::Assistant {
                text: "It says hi.".into(),
                tool_calls: vec![],
            },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
    };
    let events = collect(&model, request).await;
    assert_eq!(events, vec![finished(FinishReason::Stop)]);

    let received = server.shared.received.lock().unwrap();
    assert_eq!(received.len(), 1);
    let seen = &received[0];
    assert_eq!(
        seen.headers.get("authorization").unwrap(),
        &format!("Bearer {KEY}")
    );
    assert_eq!(
        seen.headers.get("content-type").unwrap(),
        "application/json"
    );
    assert_eq!(
        seen.body,
        json!({
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Read a.txt"},
                {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"},
                }]},
                {"role": "tool", "tool_call_id": "call_1", "content": "hi there"},
                {"role": "assistant", "content": "It says hi."},
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{
                "type": "function",
                "function": {
                    "name": "read_file",
                    "description": "Reads a file.",
                    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
                },
            }],
            "max_tokens": 256,
            "temperature": 0.2,
        })
    );
}

#[tokio::test]
async fn a_request_without_tools_sends_no_tools_field_and_an_empty_key_sends_no_auth() {
    let server = TestServer::start(vec![Reply::sse(finish("stop") + DONE)]).await;
    let mut config = server.config();
    config.api_key = String::new();
    let events = collect(&OpenAiModel::new(config).unwrap(), hello()).await;
    assert_eq!(events, vec![finished(FinishReason::Stop)]);
    let received = server.shared.received.lock().unwrap();
    let body = received[0].body.as_object().unwrap();
    assert!(!body.contains_key("tools"));
    assert!(!body.contains_key("max_tokens"));
    assert!(!body.contains_key("temperature"));
    assert!(received[0].headers.get("authorization").is_none());
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_once_after_the_capped_wait() {
    let server = TestServer::start(vec![
        Reply::status(429, r#"{"error":{"message":"slow down"}}"#).header("retry-after", "1"),
        Reply::sse(text("ok") + &finish("stop") + DONE),
    ])
    .await;
    let mut config = server.config();
    config.options.backoff_initial = Duration::from_millis(1);
    config.options.backoff_max = Duration::from_millis(80);
    let events = collect(&OpenAiModel::new(config).unwrap(), hello()).await;
    assert_eq!(events, vec![delta("ok"), finished(FinishReason::Stop)]);

    let received = server.shared.received.lock().unwrap();
    assert_eq!(received.len(), 2);
    // Retry-After (1 s) capped at backoff_max (80 ms); plain backoff would wait about 1 ms.
    let waited = received[1].at - received[0].at;
    assert!(
        waited >= Duration::from_millis(75) && waited < Duration::from_millis(900),
        "{waited:?}"
    );
}

#[tokio::test]
async fn two_500s_then_success_is_retried_to_success() {
    let server = TestServer::start(vec![
        Reply::status(500, "boom"),
        Reply::status(503, "busy"),
        Reply::sse(text("fine") + &finish("stop") + DONE),
    ])
    .await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events, vec![delta("fine"), finished(FinishReason::Stop)]);
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn server_errors_beyond_max_retries_give_an_http_error_with_the_endpoint_message() {
    let server = TestServer::start(vec![Reply::status(
        500,
        r#"{"error":{"message":"model overloaded","type":"server_error"}}"#,
    )])
    .await;
    let err = server.model().stream(hello()).await.err().unwrap();
    assert_eq!(
        err,
        ModelError::Http {
            status: 500,
            message: "model overloaded".into()
        }
    );
    assert_eq!(
        server.request_count(),
        3,
        "first attempt and max_retries = 2"
    );
}

#[tokio::test]
async fn a_400_is_not_retried_and_its_long_body_is_truncated() {
    let long = format!("bad request: {}", "x".repeat(20_000));
    let server = TestServer::start(vec![Reply::status(400, &long)]).await;
    let err = server.model().stream(hello()).await.err().unwrap();
    let ModelError::Http { status, message } = err else {
        panic!("expected an HTTP error, got {err:?}");
    };
    assert_eq!(status, 400);
    assert!(message.starts_with("bad request: xxx"), "{message}");
    assert!(message.chars().count() <= 301, "{}", message.len());
    assert!(!message.contains("hello"), "the request is never echoed");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn a_server_that_stalls_mid_stream_hits_the_idle_timeout() {
    let server = TestServer::start(vec![Reply::sse(text("partial")).ending(End::Stall)]).await;
    let started = Instant::now();
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events, vec![delta("partial"), Err(ModelError::Timeout(60))]);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        server.request_count(),
        1,
        "never re-sent once streaming began"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_request_timeout_without_retry() {
    let mut reply = Reply::sse(finish("stop") + DONE);
    reply.header_delay = Duration::from_secs(30);
    let server = TestServer::start(vec![reply]).await;
    let err = server.model().stream(hello()).await.err().unwrap();
    assert_eq!(err, ModelError::Timeout(300));
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn a_stream_that_ends_without_done_or_finish_reason_is_a_protocol_error() {
    let server = TestServer::start(vec![Reply::sse(text("half an ans"))]).await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events.len(), 2);
    assert_eq!(events[0], delta("half an ans"));
    assert!(
        matches!(&events[1], Err(ModelError::Protocol(m)) if m.contains("without a finish reason")),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_connection_broken_mid_stream_is_a_transport_error() {
    let server = TestServer::start(vec![Reply::sse(text("so far")).ending(End::Abort)]).await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], delta("so far"));
    assert!(
        matches!(&events[1], Err(ModelError::Transport(_))),
        "{events:?}"
    );
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn done_ends_the_step_even_if_the_server_keeps_the_stream_open() {
    let server = TestServer::start(vec![
        Reply::sse(text("x") + &finish("length") + DONE).ending(End::Stall),
    ])
    .await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events, vec![delta("x"), finished(FinishReason::Length)]);
}

#[tokio::test]
async fn a_finish_reason_then_a_clean_end_without_done_still_finishes() {
    let server = TestServer::start(vec![Reply::sse(text("x") + &finish("content_filter"))]).await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(
        events,
        vec![
            delta("x"),
            finished(FinishReason::Other("content_filter".into()))
        ]
    );
}

#[tokio::test]
async fn an_oversized_sse_line_is_a_protocol_error() {
    let line = format!("data: {{\"pad\":\"{}\"}}\n\n", "a".repeat(1024 * 1024 + 16));
    let chunks = line
        .into_bytes()
        .chunks(64 * 1024)
        .map(<[u8]>::to_vec)
        .collect();
    let mut reply = Reply::chunks(chunks);
    reply.gap = Duration::ZERO;
    let server = TestServer::start(vec![reply]).await;
    let events = collect(&server.model(), hello()).await;
    assert!(
        matches!(&events[..], [Err(ModelError::Protocol(m))] if m.contains("longer than")),
        "{:?}",
        events
            .iter()
            .map(|e| e.as_ref().map_err(ModelError::code))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn invalid_tool_arguments_give_a_call_that_carries_the_error_and_the_step_still_finishes() {
    let call = json!({"index": 0, "id": "c", "function": {"name": "f", "arguments": "{\"a\": "}});
    let good = json!({"index": 1, "id": "d", "function": {"name": "g", "arguments": "{}"}});
    let body = data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call, good]}}]}))
        + &finish("tool_calls")
        + DONE;
    let server = TestServer::start(vec![Reply::sse(body)]).await;
    let events = collect(&server.model(), hello()).await;
    let [
        Ok(ModelEvent::ToolCall(bad)),
        Ok(ModelEvent::ToolCall(fine)),
        Ok(ModelEvent::Finished(FinishReason::ToolCalls)),
    ] = &events[..]
    else {
        panic!("{events:?}");
    };
    assert_eq!((bad.id.as_str(), bad.name.as_str()), ("c", "f"));
    assert_eq!(bad.arguments, json!({}));
    let problem = bad.arguments_error.as_deref().unwrap();
    assert!(problem.contains("not valid JSON"), "{problem}");
    assert!(
        problem.contains("{\"a\":"),
        "quotes what the model wrote: {problem}"
    );
    assert_eq!(fine, &ToolCall::new("d", "g", json!({})));
}

#[tokio::test]
async fn an_error_object_in_the_stream_is_a_provider_error_with_its_message() {
    let body = text("a")
        + &data(json!({"error": {"message": "context too long", "type": "invalid_request_error"}}));
    let server = TestServer::start(vec![Reply::sse(body)]).await;
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events[0], delta("a"));
    let Err(err) = &events[1] else {
        panic!("{events:?}")
    };
    assert_eq!(err.code(), "provider", "{err:?}");
    assert!(
        matches!(err, ModelError::Provider(m) if m.contains("context too long") && m.contains("invalid_request_error")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_200_with_a_json_completion_instead_of_a_stream_says_what_came_back() {
    let completion = json!({
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    });
    let server = TestServer::start(vec![Reply::status(200, &completion.to_string())]).await;
    let err = server.model().stream(hello()).await.err().unwrap();
    let ModelError::Protocol(message) = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("application/json"), "{message}");
    assert!(message.contains("chat.completion"), "{message}");
    assert!(!message.contains("ended without"), "{message}");
    assert_eq!(server.request_count(), 1, "a 200 is not retried");
}

#[tokio::test]
async fn a_200_with_a_json_error_body_is_a_provider_error() {
    let body = json!({"error": {"message": "model overloaded, try later", "code": 529}});
    let server = TestServer::start(vec![Reply::status(200, &body.to_string())]).await;
    let err = server.model().stream(hello()).await.err().unwrap();
    assert!(
        matches!(&err, ModelError::Provider(m) if m.contains("model overloaded") && m.contains("529")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_200_with_html_names_the_type_and_an_event_stream_with_parameters_is_read() {
    let server = TestServer::start(vec![
        Reply::status(200, "<html><body>Sign in</body></html>")
            .header("content-type", "text/html; charset=utf-8"),
        Reply::sse(text("ok") + &finish("stop") + DONE)
            .header("content-type", "Text/Event-Stream; charset=utf-8"),
    ])
    .await;
    let err = server.model().stream(hello()).await.err().unwrap();
    assert!(
        matches!(&err, ModelError::Protocol(m) if m.contains("text/html") && m.contains("Sign in")),
        "{err:?}"
    );
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events, vec![delta("ok"), finished(FinishReason::Stop)]);
}

#[tokio::test]
async fn a_refused_connection_is_retried_then_reported_as_transport() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let mut config = OpenAiConfig::new(format!("http://{addr}/v1"), KEY, "m");
    config.options.max_retries = 2;
    config.options.backoff_initial = Duration::from_millis(20);
    config.options.backoff_max = Duration::from_millis(40);
    let started = Instant::now();
    let err = OpenAiModel::new(config)
        .unwrap()
        .stream(hello())
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), "transport", "{err:?}");
    assert!(!err.to_string().contains(KEY));
    // Two backoffs of at least half of 20 ms and 40 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn debug_of_the_config_and_model_never_shows_the_key() {
    let config = OpenAiConfig::new("http://127.0.0.1:9/v1", KEY, "m");
    let shown = format!("{config:?} {config:#?}");
    assert!(!shown.contains(KEY), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");
    let model = OpenAiModel::new(config).unwrap();
    let shown = format!("{model:?}");
    assert!(!shown.contains(KEY), "{shown}");
}

#[test]
fn validate_names_the_offending_field() {
    let good = OpenAiConfig::new("https://api.example.test/v1", KEY, "m");
    assert_eq!(good.validate(), Ok(()));
    type Breaker = Box<dyn Fn(&mut OpenAiConfig)>;
    let cases: Vec<(&str, Breaker)> = vec![
        ("model", Box::new(|c| c.model = "  ".into())),
        (
            "endpoint",
            Box::new(|c| c.endpoint = "ftp://host/v1".into()),
        ),
        ("endpoint", Box::new(|c| c.endpoint = "not a url".into())),
        (
            "endpoint",
            Box::new(|c| c.endpoint = "http://h/v1?x=1".into()),
        ),
        ("api_key", Box::new(|c| c.api_key = "line\nbreak".into())),
        (
            "connect_timeout",
            Box::new(|c| c.options.connect_timeout = Duration::ZERO),
        ),
        (
            "request_timeout",
            Box::new(|c| c.options.request_timeout = Duration::ZERO),
        ),
        (
            "idle_timeout",
            Box::new(|c| c.options.idle_timeout = Duration::ZERO),
        ),
        (
            "backoff_initial",
            Box::new(|c| c.options.backoff_initial = Duration::ZERO),
        ),
        (
            "backoff_max",
            Box::new(|c| c.options.backoff_max = Duration::from_millis(1)),
        ),
        (
            "request_timeout",
            Box::new(|c| c.options.request_timeout = Duration::MAX),
        ),
        (
            "backoff_max",
            Box::new(|c| c.options.backoff_max = Duration::from_secs(90_000)),
        ),
        ("max_retries", Box::new(|c| c.options.max_retries = 11)),
        ("max_tokens", Box::new(|c| c.options.max_tokens = Some(0))),
        (
            "temperature",
            Box::new(|c| c.options.temperature = Some(f32::NAN)),
        ),
        (
            "temperature",
            Box::new(|c| c.options.temperature = Some(2.5)),
        ),
    ];
    for (field, break_it) in cases {
        let mut config = good.clone();
        break_it(&mut config);
        match config.validate() {
            Err(ModelError::Config(message)) => {
                assert!(message.starts_with(field), "{field}: {message}");
                assert!(!message.contains(KEY));
            }
            other => panic!("{field}: expected a config error, got {other:?}"),
        }
        assert!(OpenAiModel::new(config).is_err(), "{field}");
    }
}

#[tokio::test]
async fn the_first_body_byte_is_awaited_up_to_the_request_timeout_not_the_idle_timeout() {
    let server = TestServer::start(vec![Reply::chunks(vec![]).ending(End::Stall)]).await;
    let started = Instant::now();
    let events = collect(&server.model(), hello()).await;
    assert_eq!(events, vec![Err(ModelError::Timeout(300))]);
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn the_token_usage_a_provider_reports_at_the_end_of_its_stream_is_passed_on_before_the_finish()
 {
    let usage = data(json!({
        "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }));
    let server = TestServer::start(vec![Reply::sse(
        text("ok") + &finish("stop") + &usage + DONE,
    )])
    .await;
    let events = collect(&OpenAiModel::new(server.config()).unwrap(), hello()).await;
    assert_eq!(
        events,
        vec![
            delta("ok"),
            Ok(ModelEvent::Usage(TokenUsage {
                input_tokens: Some(12),
                output_tokens: Some(3),
            })),
            finished(FinishReason::Stop),
        ]
    );
    let received = server.shared.received.lock().unwrap();
    assert_eq!(
        received[0].body["stream_options"],
        json!({"include_usage": true})
    );
}

#[tokio::test]
async fn with_stream_usage_off_no_stream_options_are_sent_and_a_stream_without_usage_has_none() {
    let server = TestServer::start(vec![Reply::sse(text("ok") + &finish("stop") + DONE)]).await;
    let mut config = server.config();
    config.options.stream_usage = false;
    let events = collect(&OpenAiModel::new(config).unwrap(), hello()).await;
    assert_eq!(events, vec![delta("ok"), finished(FinishReason::Stop)]);
    let received = server.shared.received.lock().unwrap();
    assert!(
        !received[0]
            .body
            .as_object()
            .unwrap()
            .contains_key("stream_options")
    );
}
