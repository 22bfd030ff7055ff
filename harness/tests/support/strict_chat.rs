//! A local OpenAI-compatible chat-completions server that is strict about history, as the real
//! API and the strictest chat templates are. A request whose messages break a rule is answered
//! 400 with an OpenAI-style error (and remembered); any other gets a streamed reply computed
//! from the conversation alone.
//!
//! Rules enforced:
//! - roles are `system`, `user`, `assistant` or `tool`; `system` only before everything else;
//! - the first message after the system prompt is a user message;
//! - every `tool_calls` id of an assistant message is answered by exactly one `role: "tool"`
//!   message before any other message, and a tool message answers a call that is waiting;
//! - tool-call ids are non-empty and their `arguments` are a JSON text;
//! - user and assistant alternate: no two user messages in a row, no user message straight
//!   after tool results, no two assistant messages in a row;
//! - the conversation ends with a user message or tool results (it is the model's turn).
//!
//! Replies: the last user message is a script, steps separated by ` then `; the model's k-th
//! step since that message runs the k-th part (past the end, it reports the latest tool result):
//! - `call <name> <arguments as sent, JSON or not>`: one tool call; several joined by ` also `
//!   are one step with several calls;
//! - `say <text>`: a text reply;
//! - `fail <message>`: a text delta, then an error object inside the stream;
//! - `repeat <part>`: this part for this step and every later one;
//! - a message that is not a script: `ok: <text>`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use harness::model::{OpenAiConfig, OpenAiModel};
use serde_json::{Value, json};

#[derive(Default)]
struct Shared {
    /// Every request's `messages`, in order.
    requests: Mutex<Vec<Value>>,
    /// Why requests were refused, in order.
    refusals: Mutex<Vec<String>>,
    next_call: AtomicU64,
}

/// A running strict server (it stops with the test's runtime).
#[derive(Clone)]
pub struct StrictChat {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl StrictChat {
    pub async fn start() -> StrictChat {
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a local port");
        let addr = listener.local_addr().expect("a bound address");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StrictChat { addr, shared }
    }

    /// A client of this server (no retries: a refusal is final).
    pub fn model(&self) -> OpenAiModel {
        let mut config = OpenAiConfig::new(format!("http://{}/v1", self.addr), "", "strict");
        config.options.max_retries = 0;
        OpenAiModel::new(config).expect("a valid configuration")
    }

    /// Why requests were refused so far.
    pub fn refusals(&self) -> Vec<String> {
        self.shared
            .refusals
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// The messages of the last request.
    pub fn last_request(&self) -> Value {
        self.shared
            .requests
            .lock()
            .ok()
            .and_then(|r| r.last().cloned())
            .unwrap_or(Value::Null)
    }
}

async fn answer(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let messages = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|b| b.get("messages").cloned())
        .unwrap_or(Value::Null);
    if let Ok(mut r) = shared.requests.lock() {
        r.push(messages.clone());
    }
    if let Err(why) = check_history(&messages) {
        if let Ok(mut r) = shared.refusals.lock() {
            r.push(why.clone());
        }
        let error = json!({"error": {
            "message": why,
            "type": "invalid_request_error",
            "param": "messages",
            "code": null,
        }});
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .header("content-type", "application/json")
            .body(Body::from(error.to_string()))
            .unwrap_or_default();
    }
    let sse = reply(&messages, &shared.next_call);
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .body(Body::from(sse))
        .unwrap_or_default()
}

#[derive(Debug)]
enum Expect {
    /// Nothing but system messages so far.
    Start,
    /// After a user message: the assistant speaks.
    Assistant,
    /// These call ids wait for their tool messages.
    Results(Vec<String>),
    /// After tool results: the assistant speaks.
    AssistantAfterTools,
    /// After an assistant reply: the user speaks.
    User,
}

/// The history rules; `Err` says which one the request breaks.
pub fn check_history(messages: &Value) -> Result<(), String> {
    let list = messages.as_array().ok_or("`messages` must be an array")?;
    let mut expect = Expect::Start;
    for (at, m) in list.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content");
        match (&mut expect, role) {
            (Expect::Start, "system") => {}
            (_, "system") => {
                return Err(format!("messages[{at}]: a system message after the start"));
            }
            (Expect::Start | Expect::User, "user") => {
                if !content.is_some_and(Value::is_string) {
                    return Err(format!("messages[{at}]: a user message needs text content"));
                }
                expect = Expect::Assistant;
            }
            (Expect::Assistant | Expect::AssistantAfterTools, "assistant") => {
                let calls = m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                let text_ok = match content {
                    Some(Value::String(_)) => true,
                    Some(Value::Null) | None => !calls.is_empty(),
                    _ => false,
                };
                if !text_ok {
                    return Err(format!(
                        "messages[{at}]: an assistant message needs content or tool_calls"
                    ));
                }
                let mut ids = Vec::new();
                for call in &calls {
                    let id = call.get("id").and_then(Value::as_str).unwrap_or("");
                    if id.is_empty() {
                        return Err(format!("messages[{at}]: a tool call without an id"));
                    }
                    let arguments = call
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .ok_or(format!("messages[{at}]: tool call {id} has no arguments"))?;
                    if serde_json::from_str::<Value>(arguments).is_err() {
                        return Err(format!(
                            "messages[{at}]: the arguments of tool call {id} are not JSON"
                        ));
                    }
                    ids.push(id.to_string());
                }
                expect = if ids.is_empty() {
                    Expect::User
                } else {
                    Expect::Results(ids)
                };
            }
            (Expect::Results(waiting), "tool") => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                let Some(pos) = waiting.iter().position(|w| w == id) else {
                    return Err(format!(
                        "messages[{at}]: a tool message for {id:?}, which no call waits for"
                    ));
                };
                if !content.is_some_and(Value::is_string) {
                    return Err(format!("messages[{at}]: a tool message needs text content"));
                }
                waiting.remove(pos);
                if waiting.is_empty() {
                    expect = Expect::AssistantAfterTools;
                }
            }
            (Expect::Results(waiting), other) => {
                return Err(format!(
                    "messages[{at}]: an assistant message with 'tool_calls' must be followed by \
                     tool messages responding to each 'tool_call_id' (still waiting: {}); got \
                     {other:?}",
                    waiting.join(", ")
                ));
            }
            (Expect::Assistant, "user") => {
                return Err(format!("messages[{at}]: two user messages in a row"));
            }
            (Expect::AssistantAfterTools, "user") => {
                return Err(format!(
                    "messages[{at}]: a user message straight after tool results"
                ));
            }
            (Expect::User, "assistant") => {
                return Err(format!("messages[{at}]: two assistant messages in a row"));
            }
            (_, "tool") => {
                return Err(format!(
                    "messages[{at}]: a tool message must answer a preceding 'tool_calls'"
                ));
            }
            (_, other) => return Err(format!("messages[{at}]: unknown role {other:?}")),
        }
    }
    match expect {
        Expect::Assistant | Expect::AssistantAfterTools => Ok(()),
        Expect::Results(waiting) => Err(format!(
            "the conversation ends with unanswered tool calls: {}",
            waiting.join(", ")
        )),
        Expect::Start => Err("the conversation has no user message".into()),
        Expect::User => Err("the conversation ends with the assistant".into()),
    }
}

/// The streamed reply to a well-formed conversation.
fn reply(messages: &Value, next_call: &AtomicU64) -> String {
    let list = messages.as_array().cloned().unwrap_or_default();
    let user_at = list.iter().rposition(|m| m["role"] == "user").unwrap_or(0);
    let script = list
        .get(user_at)
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    let after = &list[user_at + 1..];
    let step = after.iter().filter(|m| m["role"] == "assistant").count();
    let latest_result = after
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("nothing")
        .to_string();
    let parts: Vec<&str> = script.split(" then ").collect();
    let is_script = parts.iter().all(|p| {
        ["call ", "say ", "fail ", "repeat "]
            .iter()
            .any(|k| p.starts_with(k))
    });
    if !is_script {
        return text_reply(&format!("ok: {script}"));
    }
    let part = match parts.get(step) {
        Some(p) => *p,
        None => match parts.last() {
            Some(last) if last.starts_with("repeat ") => last,
            _ => return text_reply(&format!("seen: {latest_result}")),
        },
    };
    let part = part.strip_prefix("repeat ").unwrap_or(part);
    if part.starts_with("call ") {
        let calls: Vec<(String, &str, &str)> = part
            .split(" also ")
            .map(|c| {
                let rest = c.strip_prefix("call ").unwrap_or(c);
                let (name, arguments) = rest.split_once(' ').unwrap_or((rest, "{}"));
                let id = format!("call_{}", next_call.fetch_add(1, Ordering::SeqCst));
                (id, name, arguments)
            })
            .collect();
        return calls_reply(&calls);
    }
    if let Some(rest) = part.strip_prefix("fail ") {
        return [
            chunk(json!({"delta": {"content": "Working"}})),
            data(&json!({"error": {"message": rest, "type": "server_error"}})),
        ]
        .concat();
    }
    text_reply(part.strip_prefix("say ").unwrap_or(part))
}

fn data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn chunk(choice: Value) -> String {
    let mut choice = choice;
    choice["index"] = json!(0);
    data(&json!({"object": "chat.completion.chunk", "choices": [choice]}))
}

fn text_reply(text: &str) -> String {
    [
        chunk(json!({"delta": {"role": "assistant", "content": text}})),
        chunk(json!({"delta": {}, "finish_reason": "stop"})),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat()
}

fn calls_reply(calls: &[(String, &str, &str)]) -> String {
    let calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(index, (id, name, arguments))| {
            json!({"index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    [
        chunk(json!({"delta": {"role": "assistant", "tool_calls": calls}})),
        chunk(json!({"delta": {}, "finish_reason": "tool_calls"})),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(t: &str) -> Value {
        json!({"role": "user", "content": t})
    }
    fn calls(ids: &[&str]) -> Value {
        let calls: Vec<Value> = ids
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "f", "arguments": "{}"}}))
            .collect();
        json!({"role": "assistant", "content": null, "tool_calls": calls})
    }
    fn tool(id: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": "r"})
    }
    fn said(t: &str) -> Value {
        json!({"role": "assistant", "content": t})
    }

    #[test]
    fn the_rules_accept_a_well_formed_history_and_refuse_each_break() {
        let ok = json!([{"role": "system", "content": "s"}, user("a"), calls(&["1", "2"]),
            tool("2"), tool("1"), said("x"), user("b")]);
        assert_eq!(check_history(&ok), Ok(()));
        let broken = [
            json!([user("a"), calls(&["1"]), user("b")]),
            json!([
                user("a"),
                calls(&["1", "2"]),
                tool("1"),
                said("x"),
                user("b")
            ]),
            json!([user("a"), user("b")]),
            json!([user("a"), calls(&["1"]), tool("1"), user("b")]),
            json!([user("a"), said("x"), said("y"), user("b")]),
            json!([user("a"), said("x"), tool("1"), user("b")]),
            json!([
                user("a"),
                calls(&["1"]),
                tool("1"),
                tool("1"),
                said("x"),
                user("b")
            ]),
            json!([user("a"), said("x")]),
            json!([said("x"), user("a")]),
            json!([user("a"), calls(&["1"])]),
        ];
        for b in broken {
            assert!(check_history(&b).is_err(), "{b}");
        }
    }
}
