//! `OpenAiModel`: a client for OpenAI-compatible chat-completions endpoints (streaming).
//!
//! One step is one `POST {endpoint}/chat/completions` with `stream: true`. The answer is read as
//! server-sent events: text deltas are passed on as they arrive; tool-call fragments are gathered
//! by `index` and emitted, one `ToolCall` per index, just before `Finished`.
//!
//! Timeouts: `connect_timeout` bounds the TCP/TLS connect; `request_timeout` bounds the time from
//! sending the request to the first byte of the streamed body (headers included); `idle_timeout`
//! bounds every later gap between body chunks.
//!
//! Retries: 429, 5xx and connect failures are retried with exponential backoff and jitter, and
//! only before the endpoint answered with a success status, so a request is never re-sent once
//! its stream began. Other failures are returned at once. The timeouts, retries, back-off and
//! sampling bounds are [`OpenAiOptions`].
//!
//! What came back: a success answer whose content type is neither absent nor
//! `text/event-stream` is not read as a stream; its start is read instead and reported (a
//! `Provider` error when it is an error object, else a `Protocol` error naming the type and
//! quoting the body). An error object inside the stream is a `Provider` error with the
//! provider's message. Tool-call arguments that are not JSON do not fail the step: the call is
//! emitted with `arguments_error` set, for the turn to answer.
//!
//! SSE as read here: lines end in LF or CRLF; blank lines, comments (`:`) and fields other than
//! `data` are skipped; every `data:` line carries one whole JSON chunk or `[DONE]`. A step ends
//! at `[DONE]`, or at the end of the body if a finish reason was seen; a body that ends with
//! neither is a `Protocol` error. A line longer than [`MAX_SSE_LINE_BYTES`], tool calls above
//! [`MAX_TOOL_CALLS`] or tool ids, names and arguments above [`MAX_TOOL_CALL_BYTES`] in total
//! are `Protocol` errors too.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::{
    ChatMessage, FinishReason, Model, ModelError, ModelEvent, ModelRequest, ModelStream,
    OpenAiOptions, TokenUsage, ToolCall, ToolSpec,
};

use super::openai_options::OpenAiOptionsError;
pub use super::openai_options::{MAX_DURATION, MAX_RETRIES_LIMIT};

/// The longest SSE line accepted (bytes, line ending excluded).
pub const MAX_SSE_LINE_BYTES: usize = 1024 * 1024;
/// The most tool calls one step may carry.
pub const MAX_TOOL_CALLS: usize = 128;
/// The most bytes of tool-call ids, names and arguments one step may accumulate.
pub const MAX_TOOL_CALL_BYTES: usize = 4 * 1024 * 1024;
/// How much of an error answer's body is read to describe it.
const ERROR_BODY_LIMIT: usize = 8 * 1024;
/// How many characters of an error answer end up in `ModelError::Http::message`.
const ERROR_MESSAGE_CHARS: usize = 300;
/// How many characters of a transport error end up in a message.
const TRANSPORT_MESSAGE_CHARS: usize = 500;
/// How many characters of unparseable tool-call arguments are quoted back to the model.
const ARGUMENTS_EXCERPT_CHARS: usize = 200;

/// How to reach an OpenAI-compatible endpoint, and how to talk to it. `Debug` never shows
/// the API key.
#[derive(Clone, PartialEq)]
pub struct OpenAiConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080/v1`; `/chat/completions` is appended.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer <key>`; an empty key sends no `Authorization` header.
    pub api_key: String,
    /// The model name sent with each request.
    pub model: String,
    /// Timeouts, retries and sampling bounds.
    pub options: OpenAiOptions,
}

impl OpenAiConfig {
    /// A configuration with the default [`OpenAiOptions`].
    pub fn new(
        endpoint: impl Into<String>,
        api_key: impl Into<String>,
        model: impl Into<String>,
    ) -> Self {
        Self {
            endpoint: endpoint.into(),
            api_key: api_key.into(),
            model: model.into(),
            options: OpenAiOptions::default(),
        }
    }

    /// The same configuration with `options`.
    pub fn with_options(mut self, options: OpenAiOptions) -> Self {
        self.options = options;
        self
    }

    /// Checks every field; the error names the first field that is wrong.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.chat_url()?;
        if self.model.trim().is_empty() {
            return Err(config_error("model", "must not be empty"));
        }
        if !self.api_key.is_empty()
            && HeaderValue::from_str(&format!("Bearer {}", self.api_key)).is_err()
        {
            return Err(config_error(
                "api_key",
                "contains characters not allowed in an HTTP header",
            ));
        }
        self.options.validate().map_err(ModelError::from)
    }

    /// `{endpoint}/chat/completions`, after checking the endpoint.
    fn chat_url(&self) -> Result<Url, ModelError> {
        let base = self.endpoint.trim();
        let url = Url::parse(base)
            .map_err(|err| config_error("endpoint", &format!("is not a URL ({err})")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(config_error("endpoint", "must be an http or https URL"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(config_error("endpoint", "has no host"));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(config_error(
                "endpoint",
                "must not have a query or a fragment",
            ));
        }
        let joined = format!("{}/chat/completions", base.trim_end_matches('/'));
        Url::parse(&joined)
            .map_err(|err| config_error("endpoint", &format!("is not a URL ({err})")))
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.api_key.is_empty() {
            "<empty>"
        } else {
            "<redacted>"
        };
        f.debug_struct("OpenAiConfig")
            .field("endpoint", &self.endpoint)
            .field("api_key", &key)
            .field("model", &self.model)
            .field("options", &self.options)
            .finish()
    }
}

fn config_error(field: &str, problem: &str) -> ModelError {
    ModelError::Config(format!("{field} {problem}"))
}

impl From<OpenAiOptionsError> for ModelError {
    fn from(err: OpenAiOptionsError) -> Self {
        ModelError::Config(format!(
            "{} {} ({})",
            err.field,
            err.reason,
            err.code.as_str()
        ))
    }
}

/// A streaming client for one OpenAI-compatible endpoint and model.
#[derive(Clone, Debug)]
pub struct OpenAiModel {
    config: OpenAiConfig,
    url: Url,
    client: reqwest::Client,
    name: String,
}

impl OpenAiModel {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        config.validate()?;
        let url = config.chat_url()?;
        let client = reqwest::Client::builder()
            .connect_timeout(config.options.connect_timeout)
            .build()
            .map_err(|err| {
                ModelError::Transport(format!(
                    "could not build the HTTP client: {}",
                    describe_error(err)
                ))
            })?;
        let name = format!("openai:{}", config.model);
        Ok(Self {
            config,
            url,
            client,
            name,
        })
    }

    /// The configuration this model was built with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The JSON body of a chat-completions request for `request`.
    fn request_body(&self, request: &ModelRequest) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), Value::String(self.config.model.clone()));
        body.insert(
            "messages".into(),
            Value::Array(request.messages.iter().map(message_json).collect()),
        );
        body.insert("stream".into(), Value::Bool(true));
        if self.config.options.stream_usage {
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        if !request.tools.is_empty() {
            body.insert(
                "tools".into(),
                Value::Array(request.tools.iter().map(tool_json).collect()),
            );
        }
        if let Some(max_tokens) = self.config.options.max_tokens {
            body.insert("max_tokens".into(), json!(max_tokens));
        }
        if let Some(temperature) = self.config.options.temperature {
            // Through the shortest decimal form, so 0.2f32 is sent as 0.2.
            let value = temperature
                .to_string()
                .parse::<f64>()
                .unwrap_or(f64::from(temperature));
            body.insert("temperature".into(), json!(value));
        }
        Value::Object(body)
    }

    /// Sends the request, retrying as configured, until a success answer's headers arrive.
    async fn open(&self, body: &Value) -> Result<(reqwest::Response, Instant), ModelError> {
        let mut attempt: u32 = 0;
        loop {
            let deadline = Instant::now() + self.config.options.request_timeout;
            let wait = match self.send_once(body, deadline).await {
                Ok(response) if response.status().is_success() => return Ok((response, deadline)),
                Ok(response) => {
                    let status = response.status();
                    let retryable =
                        status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
                    if !retryable || attempt >= self.config.options.max_retries {
                        let message =
                            error_message(response, self.config.options.idle_timeout).await;
                        return Err(ModelError::Http {
                            status: status.as_u16(),
                            message,
                        });
                    }
                    let retry_after = if status == StatusCode::TOO_MANY_REQUESTS {
                        retry_after(response.headers())
                    } else {
                        None
                    };
                    drop(response);
                    let wait = match retry_after {
                        Some(wait) => wait.min(self.config.options.backoff_max),
                        None => self.backoff(attempt),
                    };
                    tracing::warn!(
                        model = %self.config.model,
                        status = status.as_u16(),
                        attempt = attempt + 1,
                        wait_ms = millis(wait),
                        "model endpoint answered with a retryable status; retrying"
                    );
                    wait
                }
                Err(SendError::Connect(err)) => {
                    if attempt >= self.config.options.max_retries {
                        return Err(err);
                    }
                    let wait = self.backoff(attempt);
                    tracing::warn!(
                        model = %self.config.model,
                        error = %err,
                        attempt = attempt + 1,
                        wait_ms = millis(wait),
                        "could not connect to the model endpoint; retrying"
                    );
                    wait
                }
                Err(SendError::Fatal(err)) => return Err(err),
            };
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// One attempt: the answer once its headers arrived, or why there is none.
    async fn send_once(
        &self,
        body: &Value,
        deadline: Instant,
    ) -> Result<reqwest::Response, SendError> {
        let mut builder = self
            .client
            .post(self.url.clone())
            .header(ACCEPT, "text/event-stream")
            .json(body);
        // The endpoint sees the model call's span as its caller.
        if let Some(trace) = trace_context::span::current_for_callee(None) {
            builder = builder.header("traceparent", trace.parent.to_string());
            if let Some(state) = &trace.state {
                builder = builder.header("tracestate", state.as_str());
            }
        }
        if !self.config.api_key.is_empty() {
            builder = builder.bearer_auth(&self.config.api_key);
        }
        match tokio::time::timeout_at(deadline, builder.send()).await {
            Err(_) => Err(SendError::Fatal(ModelError::Timeout(millis(
                self.config.options.request_timeout,
            )))),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(err)) if err.is_connect() => Err(SendError::Connect(if err.is_timeout() {
                ModelError::Timeout(millis(self.config.options.connect_timeout))
            } else {
                ModelError::Transport(format!(
                    "could not connect to the model endpoint: {}",
                    describe_error(err)
                ))
            })),
            Ok(Err(err)) if err.is_timeout() => Err(SendError::Fatal(ModelError::Timeout(millis(
                self.config.options.request_timeout,
            )))),
            Ok(Err(err)) => Err(SendError::Fatal(ModelError::Transport(format!(
                "request to the model endpoint failed: {}",
                describe_error(err)
            )))),
        }
    }

    /// The wait before the retry after attempt `attempt` (0-based): a uniform pick between
    /// half and all of `min(initial * 2^attempt, max)`.
    fn backoff(&self, attempt: u32) -> Duration {
        self.config.options.backoff().wait(attempt)
    }
}

enum SendError {
    /// The connection could not be made: worth retrying.
    Connect(ModelError),
    /// Anything else: returned as is.
    Fatal(ModelError),
}

#[async_trait::async_trait]
impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let body = self.request_body(&request);
        let (response, first_byte_deadline) = self.open(&body).await?;
        if let Some(kind) = media_type(response.headers())
            && kind != "text/event-stream"
        {
            return Err(not_a_stream(response, &kind, self.config.options.idle_timeout).await);
        }
        let chunks = response
            .bytes_stream()
            .map(|chunk| chunk.map_err(body_error));
        let reader = StepReader::new(
            Box::pin(chunks),
            first_byte_deadline,
            self.config.options.request_timeout,
            self.config.options.idle_timeout,
        );
        Ok(Box::pin(reader.into_stream()))
    }
}

/// `ChatMessage` in OpenAI's message format.
fn message_json(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::System { text } => json!({ "role": "system", "content": text }),
        ChatMessage::User { text } => json!({ "role": "user", "content": text }),
        ChatMessage::Assistant { text, tool_calls } => {
            let mut out = Map::new();
            out.insert("role".into(), json!("assistant"));
            let content = if text.is_empty() && !tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(text.clone())
            };
            out.insert("content".into(), content);
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|call| {
                        json!({
                            "id": call.id,
                            "type": "function",
                            "function": {
                                "name": call.name,
                                "arguments": call.arguments.to_string(),
                            },
                        })
                    })
                    .collect();
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(out)
        }
        ChatMessage::Tool {
            call_id, content, ..
        } => json!({ "role": "tool", "tool_call_id": call_id, "content": content }),
    }
}

/// `ToolSpec` in OpenAI's function-tool format.
fn tool_json(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    })
}

/// Reads one step from a body stream of byte chunks.
struct StepReader<S> {
    body: S,
    lines: LineDecoder,
    step: StepAssembler,
    /// Events decoded but not yet yielded; an error, if any, is last.
    queue: VecDeque<Result<ModelEvent, ModelError>>,
    /// Until the first chunk arrived, the deadline for it.
    first_byte_deadline: Option<Instant>,
    request_timeout: Duration,
    idle_timeout: Duration,
    /// Nothing more is read once set: the step ended, well or badly.
    done: bool,
}

impl<S, B> StepReader<S>
where
    S: Stream<Item = Result<B, ModelError>> + Unpin + Send + 'static,
    B: AsRef<[u8]>,
{
    fn new(
        body: S,
        first_byte_deadline: Instant,
        request_timeout: Duration,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            body,
            lines: LineDecoder::default(),
            step: StepAssembler::default(),
            queue: VecDeque::new(),
            first_byte_deadline: Some(first_byte_deadline),
            request_timeout,
            idle_timeout,
            done: false,
        }
    }

    fn into_stream(self) -> impl Stream<Item = Result<ModelEvent, ModelError>> + Send + 'static {
        futures::stream::unfold(self, |mut reader| async move {
            loop {
                if let Some(event) = reader.queue.pop_front() {
                    return Some((event, reader));
                }
                if reader.done {
                    return None;
                }
                reader.pump().await;
            }
        })
    }

    /// Reads one chunk and queues what it completes.
    async fn pump(&mut self) {
        let next = match self.first_byte_deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.body.next())
                .await
                .map_err(|_| ModelError::Timeout(millis(self.request_timeout))),
            None => tokio::time::timeout(self.idle_timeout, self.body.next())
                .await
                .map_err(|_| ModelError::Timeout(millis(self.idle_timeout))),
        };
        match next {
            Err(err) | Ok(Some(Err(err))) => self.fail(err),
            Ok(Some(Ok(chunk))) => {
                let chunk = chunk.as_ref();
                if !chunk.is_empty() {
                    self.first_byte_deadline = None;
                }
                match self.lines.push(chunk) {
                    Ok(lines) => {
                        for line in lines {
                            self.line(&line);
                            if self.done {
                                break;
                            }
                        }
                    }
                    Err(err) => self.fail(err),
                }
            }
            Ok(None) => {
                match self.lines.finish() {
                    Ok(Some(line)) => self.line(&line),
                    Ok(None) => {}
                    Err(err) => self.fail(err),
                }
                if !self.done {
                    if self.step.finish_reason.is_some() {
                        self.end();
                    } else {
                        self.fail(ModelError::Protocol(
                            "the stream ended without a finish reason or [DONE]".into(),
                        ));
                    }
                }
            }
        }
    }

    /// Handles one SSE line.
    fn line(&mut self, line: &str) {
        if line.is_empty() || line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field != "data" {
            return;
        }
        if value.trim() == "[DONE]" {
            self.end();
            return;
        }
        let mut events = Vec::new();
        match self.step.apply(value, &mut events) {
            Ok(()) => self.queue.extend(events.into_iter().map(Ok)),
            Err(err) => {
                self.queue.extend(events.into_iter().map(Ok));
                self.fail(err);
            }
        }
    }

    /// The step completed: queue its tool calls and `Finished`.
    fn end(&mut self) {
        self.done = true;
        match self.step.finish() {
            Ok(events) => self.queue.extend(events.into_iter().map(Ok)),
            Err(err) => self.queue.push_back(Err(err)),
        }
    }

    fn fail(&mut self, err: ModelError) {
        self.done = true;
        self.queue.push_back(Err(err));
    }
}

/// Splits bytes into lines (LF or CRLF), however the bytes were cut into chunks.
#[derive(Default)]
struct LineDecoder {
    buf: Vec<u8>,
    /// `buf[..scanned]` holds no line feed.
    scanned: usize,
}

impl LineDecoder {
    /// Adds `bytes`; returns the lines they complete.
    fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, ModelError> {
        self.buf.extend_from_slice(bytes);
        let mut lines = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(offset) = self.buf[from..].iter().position(|b| *b == b'\n') {
            let end = from + offset;
            lines.push(decode_line(&self.buf[start..end])?);
            start = end + 1;
            from = start;
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_SSE_LINE_BYTES {
            return Err(line_too_long());
        }
        Ok(lines)
    }

    /// The body ended: the unterminated last line, if any.
    fn finish(&mut self) -> Result<Option<String>, ModelError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let rest = std::mem::take(&mut self.buf);
        self.scanned = 0;
        decode_line(&rest).map(Some)
    }
}

fn decode_line(line: &[u8]) -> Result<String, ModelError> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() > MAX_SSE_LINE_BYTES {
        return Err(line_too_long());
    }
    String::from_utf8(line.to_vec())
        .map_err(|_| ModelError::Protocol("an SSE line is not valid UTF-8".into()))
}

fn line_too_long() -> ModelError {
    ModelError::Protocol(format!(
        "an SSE line is longer than {MAX_SSE_LINE_BYTES} bytes"
    ))
}

/// One `data:` chunk of a chat-completions stream (only the fields used).
#[derive(Deserialize)]
struct ChunkWire {
    choices: Option<Vec<ChoiceWire>>,
    error: Option<Value>,
    /// The step's token counts (the last chunk, when the provider reports them).
    usage: Option<UsageWire>,
}

#[derive(Deserialize)]
struct UsageWire {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ChoiceWire {
    index: Option<u64>,
    delta: Option<DeltaWire>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct DeltaWire {
    content: Option<String>,
    /// Visible reasoning, as OpenAI-compatible servers that stream it name it.
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<ToolCallDeltaWire>>,
}

#[derive(Deserialize)]
struct ToolCallDeltaWire {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionDeltaWire>,
}

#[derive(Deserialize)]
struct FunctionDeltaWire {
    name: Option<String>,
    arguments: Option<String>,
}

/// A tool call being put together from fragments.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// What one step has said so far: the pending tool calls and the finish reason.
#[derive(Default)]
struct StepAssembler {
    calls: BTreeMap<u64, PartialCall>,
    call_bytes: usize,
    finish_reason: Option<FinishReason>,
}

impl StepAssembler {
    /// Applies one JSON chunk; text deltas go to `events` at once.
    fn apply(&mut self, payload: &str, events: &mut Vec<ModelEvent>) -> Result<(), ModelError> {
        let chunk: ChunkWire = serde_json::from_str(payload).map_err(|err| {
            ModelError::Protocol(format!("a stream chunk is not the expected JSON: {err}"))
        })?;
        if let Some(error) = chunk.error {
            return Err(provider_error(&error));
        }
        if let Some(usage) = chunk.usage {
            events.push(ModelEvent::Usage(TokenUsage {
                input_tokens: usage.prompt_tokens,
                output_tokens: usage.completion_tokens,
            }));
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                if let Some(thought) = delta.reasoning_content.or(delta.reasoning)
                    && !thought.is_empty()
                {
                    events.push(ModelEvent::ReasoningDelta(thought));
                }
                if let Some(text) = delta.content
                    && !text.is_empty()
                {
                    events.push(ModelEvent::TextDelta(text));
                }
                for (position, fragment) in
                    delta.tool_calls.unwrap_or_default().into_iter().enumerate()
                {
                    self.add_fragment(position, fragment)?;
                }
            }
            if let Some(reason) = choice.finish_reason
                && self.finish_reason.is_none()
            {
                self.finish_reason = Some(match reason.as_str() {
                    "stop" => FinishReason::Stop,
                    "tool_calls" => FinishReason::ToolCalls,
                    "length" => FinishReason::Length,
                    _ => FinishReason::Other(reason),
                });
            }
        }
        Ok(())
    }

    fn add_fragment(
        &mut self,
        position: usize,
        fragment: ToolCallDeltaWire,
    ) -> Result<(), ModelError> {
        let index = fragment
            .index
            .unwrap_or(u64::try_from(position).unwrap_or(u64::MAX));
        if !self.calls.contains_key(&index) && self.calls.len() >= MAX_TOOL_CALLS {
            return Err(ModelError::Protocol(format!(
                "the step has more than {MAX_TOOL_CALLS} tool calls"
            )));
        }
        let (name, arguments) = match fragment.function {
            Some(function) => (function.name, function.arguments),
            None => (None, None),
        };
        let added = fragment.id.as_ref().map_or(0, String::len)
            + name.as_ref().map_or(0, String::len)
            + arguments.as_ref().map_or(0, String::len);
        self.call_bytes = self.call_bytes.saturating_add(added);
        if self.call_bytes > MAX_TOOL_CALL_BYTES {
            return Err(ModelError::Protocol(format!(
                "the step's tool calls are larger than {MAX_TOOL_CALL_BYTES} bytes"
            )));
        }
        let call = self.calls.entry(index).or_default();
        if let Some(id) = fragment.id
            && call.id.is_empty()
        {
            call.id = id;
        }
        if let Some(name) = name
            && call.name.is_empty()
        {
            call.name = name;
        }
        if let Some(arguments) = arguments {
            call.arguments.push_str(&arguments);
        }
        Ok(())
    }

    /// The events that close the step: one `ToolCall` per index, then `Finished`. Without a
    /// finish reason (the stream said only `[DONE]`) the reason is `ToolCalls` if there are
    /// tool calls, else `Stop`.
    fn finish(&mut self) -> Result<Vec<ModelEvent>, ModelError> {
        let calls = std::mem::take(&mut self.calls);
        let mut events = Vec::with_capacity(calls.len() + 1);
        for (index, call) in calls {
            if call.name.is_empty() {
                return Err(ModelError::Protocol(format!(
                    "tool call {index} has no name"
                )));
            }
            let raw = call.arguments.trim();
            let (arguments, arguments_error) = if raw.is_empty() {
                (Value::Object(Map::new()), None)
            } else {
                match serde_json::from_str(raw) {
                    Ok(value) => (value, None),
                    // Not the step's failure: the turn answers the call with this text and
                    // the model may try again.
                    Err(err) => (
                        Value::Object(Map::new()),
                        Some(format!(
                            "The arguments of this call are not valid JSON ({err}); nothing \
                             was run. They began: {}",
                            truncate_chars(raw, ARGUMENTS_EXCERPT_CHARS)
                        )),
                    ),
                }
            };
            let id = if call.id.is_empty() {
                format!("call-{}", uuid::Uuid::now_v7())
            } else {
                call.id
            };
            events.push(ModelEvent::ToolCall(ToolCall {
                id,
                name: call.name,
                arguments,
                arguments_error,
            }));
        }
        let reason = self.finish_reason.take().unwrap_or(if events.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        });
        events.push(ModelEvent::Finished(reason));
        Ok(events)
    }
}

/// A body read failure as a model error.
fn body_error(err: reqwest::Error) -> ModelError {
    ModelError::Transport(format!(
        "reading the model stream failed: {}",
        describe_error(err)
    ))
}

/// The start of an answer's body: at most [`ERROR_BODY_LIMIT`] bytes, read for at most `limit`.
async fn body_start(response: reqwest::Response, limit: Duration) -> Vec<u8> {
    let mut chunks = response.bytes_stream();
    let mut body: Vec<u8> = Vec::new();
    let read = async {
        while let Some(Ok(chunk)) = chunks.next().await {
            body.extend_from_slice(&chunk);
            if body.len() >= ERROR_BODY_LIMIT {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(limit, read).await;
    body.truncate(ERROR_BODY_LIMIT);
    body
}

/// Text on one line: every run of whitespace becomes one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A short description of an error answer, from the start of its body.
async fn error_message(response: reqwest::Response, limit: Duration) -> String {
    let status = response.status();
    let body = body_start(response, limit).await;
    let text = match serde_json::from_slice::<Value>(&body) {
        Ok(value) => error_text(&value),
        Err(_) => String::from_utf8_lossy(&body).into_owned(),
    };
    let text = one_line(&text);
    if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("no message")
            .to_string()
    } else {
        truncate_chars(&text, ERROR_MESSAGE_CHARS)
    }
}

/// The media type of an answer (lower case, parameters dropped), if it has one.
fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(CONTENT_TYPE)?;
    let text = String::from_utf8_lossy(value.as_bytes());
    let essence = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    Some(essence)
}

/// A success answer that is not an event stream: what it said instead.
async fn not_a_stream(response: reqwest::Response, kind: &str, limit: Duration) -> ModelError {
    let body = body_start(response, limit).await;
    if let Ok(value) = serde_json::from_slice::<Value>(&body)
        && let Some(error) = value.get("error").filter(|e| !e.is_null())
    {
        return provider_error(error);
    }
    let shown = one_line(&String::from_utf8_lossy(&body));
    let shown = if shown.is_empty() {
        "an empty body".to_string()
    } else {
        format!(
            "a body beginning {}",
            truncate_chars(&shown, ERROR_MESSAGE_CHARS)
        )
    };
    let kind = if kind.is_empty() {
        "an empty content type"
    } else {
        kind
    };
    ModelError::Protocol(format!(
        "the endpoint answered with {kind} instead of an event stream: {shown}"
    ))
}

/// An error object the provider sent: its message, with its type and code when given.
fn provider_error(error: &Value) -> ModelError {
    let mut text = one_line(&error_text(error));
    let inner = error.get("error").unwrap_or(error);
    let labels: Vec<String> = ["type", "code"]
        .iter()
        .filter_map(|key| match inner.get(*key) {
            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        })
        .collect();
    if !labels.is_empty() {
        text = format!("{text} [{}]", labels.join(", "));
    }
    ModelError::Provider(truncate_chars(&text, ERROR_MESSAGE_CHARS))
}

/// The message inside an OpenAI-style error value (`{"error":{"message":..}}` and kin).
fn error_text(value: &Value) -> String {
    let inner = value.get("error").unwrap_or(value);
    match inner {
        Value::String(text) => text.clone(),
        _ => match inner.get("message").and_then(Value::as_str) {
            Some(text) => text.to_string(),
            None => inner.to_string(),
        },
    }
}

/// The seconds of a `Retry-After` header, if it holds a number of seconds.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    let seconds: f64 = text.parse().ok()?;
    if seconds.is_finite() && seconds >= 0.0 {
        Duration::try_from_secs_f64(seconds).ok()
    } else {
        None
    }
}

/// An error and its sources, joined, without the URL, bounded.
fn describe_error(err: reqwest::Error) -> String {
    use std::error::Error as _;
    let err = err.without_url();
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    truncate_chars(&text, TRANSPORT_MESSAGE_CHARS)
}

fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_body() -> Vec<u8> {
        [
            ": keep-alive\r\n\r\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Grüß \"}}]}\r\n\r\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",",
            "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"k\\\":\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,",
            "\"function\":{\"arguments\":\"\\\"ü\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: [DONE]\n\n",
        ]
        .concat()
        .into_bytes()
    }

    fn expected() -> Vec<Result<ModelEvent, ModelError>> {
        vec![
            Ok(ModelEvent::TextDelta("Grüß ".into())),
            Ok(ModelEvent::ToolCall(ToolCall::new(
                "c1",
                "f",
                json!({"k": "ü"}),
            ))),
            Ok(ModelEvent::Finished(FinishReason::ToolCalls)),
        ]
    }

    async fn read(chunks: Vec<Vec<u8>>) -> Vec<Result<ModelEvent, ModelError>> {
        let body = futures::stream::iter(chunks.into_iter().map(Ok::<_, ModelError>));
        let second = Duration::from_secs(1);
        StepReader::new(body, Instant::now() + second, second, second)
            .into_stream()
            .collect()
            .await
    }

    #[tokio::test]
    async fn streamed_reasoning_under_either_name_is_a_reasoning_delta_before_the_answer() {
        let body = [
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think \"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"more\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n",
        ]
        .concat()
        .into_bytes();
        assert_eq!(
            read(vec![body]).await,
            vec![
                Ok(ModelEvent::ReasoningDelta("think ".into())),
                Ok(ModelEvent::ReasoningDelta("more".into())),
                Ok(ModelEvent::TextDelta("ok".into())),
                Ok(ModelEvent::Finished(FinishReason::Stop)),
            ]
        );
    }

    #[tokio::test]
    async fn every_way_of_cutting_the_body_in_two_or_into_bytes_gives_the_same_events() {
        let body = sample_body();
        for cut in 0..=body.len() {
            let events = read(vec![body[..cut].to_vec(), body[cut..].to_vec()]).await;
            assert_eq!(events, expected(), "cut at {cut}");
        }
        let bytes = body.iter().map(|b| vec![*b]).collect();
        assert_eq!(read(bytes).await, expected());
    }

    #[test]
    fn the_line_decoder_keeps_partial_lines_and_strips_crlf() {
        let mut lines = LineDecoder::default();
        assert_eq!(lines.push(b"ab").unwrap(), Vec::<String>::new());
        assert_eq!(lines.push(b"c\r").unwrap(), Vec::<String>::new());
        assert_eq!(lines.push(b"\n\nd\ne").unwrap(), vec!["abc", "", "d"]);
        assert_eq!(lines.finish().unwrap(), Some("e".to_string()));
        assert_eq!(lines.finish().unwrap(), None);
    }

    #[test]
    fn a_partial_line_over_the_cap_is_refused_before_its_end_arrives() {
        let mut lines = LineDecoder::default();
        let piece = vec![b'a'; MAX_SSE_LINE_BYTES / 2];
        assert!(lines.push(&piece).is_ok());
        assert!(lines.push(&piece).is_ok());
        assert!(matches!(lines.push(b"a"), Err(ModelError::Protocol(_))));
    }

    #[test]
    fn more_tool_calls_than_the_cap_are_refused() {
        let mut step = StepAssembler::default();
        let mut events = Vec::new();
        for index in 0..MAX_TOOL_CALLS {
            let chunk = json!({"choices":[{"delta":{"tool_calls":[
                {"index": index, "id": "x", "function": {"name": "f", "arguments": "{}"}}
            ]}}]});
            assert!(step.apply(&chunk.to_string(), &mut events).is_ok());
        }
        let chunk = json!({"choices":[{"delta":{"tool_calls":[{"index": MAX_TOOL_CALLS}]}}]});
        assert!(matches!(
            step.apply(&chunk.to_string(), &mut events),
            Err(ModelError::Protocol(m)) if m.contains("tool calls")
        ));
    }

    #[test]
    fn tool_arguments_beyond_the_byte_cap_are_refused() {
        let mut step = StepAssembler::default();
        let mut events = Vec::new();
        let piece = "a".repeat(512 * 1024);
        let chunk = json!({"choices":[{"delta":{"tool_calls":[
            {"index": 0, "function": {"arguments": piece}}
        ]}}]})
        .to_string();
        let mut result = Ok(());
        for _ in 0..=(MAX_TOOL_CALL_BYTES / piece.len()) {
            result = step.apply(&chunk, &mut events);
            if result.is_err() {
                break;
            }
        }
        assert!(matches!(result, Err(ModelError::Protocol(m)) if m.contains("larger than")));
    }

    #[test]
    fn a_tool_call_without_an_id_gets_one_and_without_arguments_gets_an_empty_object() {
        let mut step = StepAssembler::default();
        let mut events = Vec::new();
        let chunk = json!({"choices":[{"delta":{"tool_calls":[{"function": {"name": "now"}}]}}]});
        step.apply(&chunk.to_string(), &mut events).unwrap();
        let events = step.finish().unwrap();
        let [
            ModelEvent::ToolCall(call),
            ModelEvent::Finished(FinishReason::ToolCalls),
        ] = &events[..]
        else {
            panic!("{events:?}");
        };
        assert!(
            call.id.starts_with("call-") && call.id.len() > 10,
            "{}",
            call.id
        );
        assert_eq!(call.arguments, json!({}));
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_between_half_and_full() {
        let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", "", "m");
        config.options.backoff_initial = Duration::from_millis(100);
        config.options.backoff_max = Duration::from_millis(1000);
        let model = OpenAiModel::new(config).unwrap();
        for (attempt, full_ms) in [
            (0, 100),
            (1, 200),
            (2, 400),
            (3, 800),
            (4, 1000),
            (40, 1000),
        ] {
            for _ in 0..20 {
                let wait = model.backoff(attempt);
                let full = Duration::from_millis(full_ms);
                assert!(wait >= full / 2 && wait <= full, "{attempt}: {wait:?}");
            }
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_ignores_dates() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
