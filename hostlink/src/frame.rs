//! Centrifuge client protocol v2, JSON encoding: framing. Owns decoding one inbound WebSocket
//! text frame into commands and encoding replies, pushes and the server ping. Never
//! interprets a command's `data` (the records do) and never decides what a command means
//! (the link does).
//!
//! Inbound: one JSON object per line (`\n`-separated batching, as the SDKs send it; one
//! trailing newline tolerated), at most [`MAX_COMMANDS_PER_FRAME`] lines and the link's
//! maximum frame bytes. A line is `{"id":N,"<method>":{...}}` with exactly one method member
//! whose value is an object, `id` a `u32` of at least 1 (`send` alone may omit it), or `{}`,
//! the client's pong. Inside a method's request the members of Centrifuge's protocol schema
//! are accepted (what the official SDKs send: connect `token`, `data`, `name`, `version`,
//! `subs`, `headers`, `flag`; subscribe `channel`, `token`, `data`, `recover`, `offset`,
//! `epoch`, `positioned`, `recoverable`, `join_leave`, `delta`, `tf`, `flag`, ...) and type
//! checked; any other member, a duplicate, a `null` (except as `data`, which is the
//! application's to judge), or trailing data makes the whole frame undecodable. Decoding is all or nothing: a frame with one bad line yields no command.
//!
//! Outbound: each reply or push is its own WebSocket message, never several lines joined into
//! one frame (the official JavaScript SDK reorders the lines of one frame against the next
//! frame; see `docs/decisions/2026-11-30-hostlink-recoverable-streams.md`). Every message is
//! still one line (raw JSON handed in is put on one line by turning its insignificant line
//! breaks into spaces): the SDKs split every message they receive on line feeds. Replies (`{"id":N,"<method>":{...}}` or `{"id":N,"error":{...}}`), pushes
//! (`{"push":{"channel":"...","pub":{"data":...}}}`), the server ping `{}`. On a WebSocket,
//! protocol v2 sends a disconnect as the close frame's code and reason, never as a push (as
//! Centrifuge's Go server does), so there is no disconnect encoder here.

use serde_json::value::RawValue;

use super::codes::ReplyError;
use super::json::{ObjectWriter, RawObject, is_null, one_line, push_json_string};

/// The default largest inbound frame (Centrifuge's default read limit).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 64 * 1024;
/// The largest value `max_frame_bytes` may be configured to.
pub const MAX_FRAME_BYTES_CEILING: usize = 16 * 1024 * 1024;
/// The most commands one inbound frame may carry.
pub const MAX_COMMANDS_PER_FRAME: usize = 128;
/// The most bytes the link joins into one outbound frame.
pub const MAX_OUTBOUND_BATCH_BYTES: usize = 64 * 1024;
/// The most messages the link joins into one outbound frame.
pub const MAX_OUTBOUND_BATCH_MESSAGES: usize = 64;

/// Why a frame is not decodable (every variant is Centrifuge's bad request, or a size limit).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum FrameError {
    #[error("the frame is {0} bytes; more than the limit")]
    TooLarge(usize),
    #[error("the frame carries more than {MAX_COMMANDS_PER_FRAME} commands")]
    TooManyCommands,
    #[error("the frame is empty")]
    Empty,
    #[error("the frame is not UTF-8 text")]
    NotText,
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

/// One decoded inbound line.
#[derive(Debug)]
pub enum Inbound {
    /// `{}`: the answer to a server ping.
    Pong,
    /// A command.
    Command(Command),
}

/// A command: its id (0 only for `send`) and request.
#[derive(Debug)]
pub struct Command {
    pub id: u32,
    pub request: Request,
}

/// The request a command carries. Members HostLink never uses are checked and dropped.
#[derive(Debug)]
pub enum Request {
    Connect(ConnectRequest),
    Rpc(RpcRequest),
    Subscribe(SubscribeRequest),
    Unsubscribe {
        channel: String,
    },
    Publish(PublishRequest),
    /// A fresh connection token (never log it).
    Refresh {
        token: String,
    },
    SubRefresh {
        channel: String,
    },
    Presence {
        channel: String,
    },
    PresenceStats {
        channel: String,
    },
    History(HistoryRequest),
    Send,
}

impl Request {
    /// The method name (the command's member name).
    pub fn method(&self) -> &'static str {
        match self {
            Request::Connect(_) => "connect",
            Request::Rpc(_) => "rpc",
            Request::Subscribe(_) => "subscribe",
            Request::Unsubscribe { .. } => "unsubscribe",
            Request::Publish(_) => "publish",
            Request::Refresh { .. } => "refresh",
            Request::SubRefresh { .. } => "sub_refresh",
            Request::Presence { .. } => "presence",
            Request::PresenceStats { .. } => "presence_stats",
            Request::History(_) => "history",
            Request::Send => "send",
        }
    }
}

/// A connect request. The token is the tenant credential: never log it.
pub struct ConnectRequest {
    pub token: Option<String>,
    pub data: Option<Box<RawValue>>,
    pub name: Option<String>,
    pub version: Option<String>,
}

impl std::fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("data", &self.data)
            .field("name", &self.name)
            .field("version", &self.version)
            .finish()
    }
}

/// An RPC request.
#[derive(Debug)]
pub struct RpcRequest {
    pub method: String,
    pub data: Option<Box<RawValue>>,
}

/// A position in a channel's stream (Centrifuge's `StreamPosition`): the offset of the last
/// publication seen and the epoch of the stream it belongs to.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct StreamPosition {
    pub offset: u64,
    pub epoch: String,
}

/// A subscribe request.
#[derive(Debug)]
pub struct SubscribeRequest {
    pub channel: String,
    pub data: Option<Box<RawValue>>,
    /// `recover: true` with the client's last position (an absent `offset` is 0 and an absent
    /// `epoch` is empty, as Centrifuge's JSON leaves zero values out); `None` without
    /// `recover`, whatever `offset` and `epoch` say.
    pub recover: Option<StreamPosition>,
}

impl SubscribeRequest {
    /// Decodes a subscribe command's request object (the value of its `subscribe` member),
    /// exactly as [`decode_frame`] does for a subscribe line.
    pub fn decode(bytes: &[u8]) -> Result<SubscribeRequest, RequestError> {
        let raw = request_object(bytes)?;
        subscribe_request(&raw).map_err(RequestError)
    }
}

/// A history request: at most `limit` publications of `channel` (Centrifuge: 0 asks for the
/// stream position only, a negative limit for as many as the server gives), after `since`
/// when given, newest first when `reverse`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct HistoryRequest {
    pub channel: String,
    pub limit: i64,
    pub since: Option<StreamPosition>,
    pub reverse: bool,
}

impl HistoryRequest {
    /// Decodes a history command's request object (the value of its `history` member),
    /// exactly as [`decode_frame`] does for a history line.
    pub fn decode(bytes: &[u8]) -> Result<HistoryRequest, RequestError> {
        let raw = request_object(bytes)?;
        history_request(&raw).map_err(RequestError)
    }
}

/// Why a request object does not decode (the frame carrying it is a bad request).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{0}")]
pub struct RequestError(pub String);

fn request_object(bytes: &[u8]) -> Result<Box<RawValue>, RequestError> {
    let text = std::str::from_utf8(bytes).map_err(|_| RequestError("not UTF-8".into()))?;
    let raw: Box<RawValue> =
        serde_json::from_str(text).map_err(|e| RequestError(format!("not JSON: {e}")))?;
    if !raw.get().starts_with('{') {
        return Err(RequestError("the request must be an object".into()));
    }
    Ok(raw)
}

fn subscribe_request(raw: &RawValue) -> Result<SubscribeRequest, String> {
    let mut c = Checked::new(raw, SUBSCRIBE_MEMBERS)?;
    let recover = match c.boolean("recover")? {
        Some(true) => Some(StreamPosition {
            offset: c.unsigned("offset")?.unwrap_or(0),
            epoch: c.string("epoch")?.unwrap_or_default(),
        }),
        _ => None,
    };
    Ok(SubscribeRequest {
        channel: c.required_string("channel")?,
        data: c.take("data"),
        recover,
    })
}

fn history_request(raw: &RawValue) -> Result<HistoryRequest, String> {
    let c = Checked::new(raw, HISTORY_MEMBERS)?;
    let since = match c.obj.get("since") {
        None => None,
        Some(raw) => {
            let p = Checked::new(raw, POSITION_MEMBERS)?;
            Some(StreamPosition {
                offset: p.unsigned("offset")?.unwrap_or(0),
                epoch: p.string("epoch")?.unwrap_or_default(),
            })
        }
    };
    Ok(HistoryRequest {
        channel: c.required_string("channel")?,
        limit: c.integer("limit")?.unwrap_or(0),
        since,
        reverse: c.boolean("reverse")?.unwrap_or(false),
    })
}

/// A publish request.
#[derive(Debug)]
pub struct PublishRequest {
    pub channel: String,
    pub data: Option<Box<RawValue>>,
}

const METHODS: [&str; 12] = [
    "connect",
    "subscribe",
    "unsubscribe",
    "publish",
    "presence",
    "presence_stats",
    "history",
    "ping",
    "send",
    "rpc",
    "refresh",
    "sub_refresh",
];

/// How a request member must look.
#[derive(Clone, Copy)]
enum Kind {
    Str,
    Bool,
    Unsigned,
    Int,
    Object,
    Array,
    /// Any JSON (Centrifuge's `bytes` members carry raw JSON); it belongs to the application,
    /// so a `null` there is the record decoder's to refuse (107), not the frame's.
    Json,
}

const CONNECT_MEMBERS: &[(&str, Kind)] = &[
    ("token", Kind::Str),
    ("data", Kind::Json),
    ("subs", Kind::Object),
    ("name", Kind::Str),
    ("version", Kind::Str),
    ("headers", Kind::Object),
    ("flag", Kind::Int),
];
const SUBSCRIBE_MEMBERS: &[(&str, Kind)] = &[
    ("channel", Kind::Str),
    ("token", Kind::Str),
    ("recover", Kind::Bool),
    ("epoch", Kind::Str),
    ("offset", Kind::Unsigned),
    ("data", Kind::Json),
    ("positioned", Kind::Bool),
    ("recoverable", Kind::Bool),
    ("join_leave", Kind::Bool),
    ("delta", Kind::Str),
    ("tf", Kind::Object),
    ("flag", Kind::Int),
    ("type", Kind::Int),
    ("phase", Kind::Int),
    ("cursor", Kind::Str),
    ("limit", Kind::Int),
    ("asc", Kind::Bool),
];
const PUBLISH_MEMBERS: &[(&str, Kind)] = &[
    ("channel", Kind::Str),
    ("data", Kind::Json),
    ("type", Kind::Int),
    ("key", Kind::Str),
    ("removed", Kind::Bool),
];
const RPC_MEMBERS: &[(&str, Kind)] = &[("method", Kind::Str), ("data", Kind::Json)];
const CHANNEL_MEMBERS: &[(&str, Kind)] = &[("channel", Kind::Str)];
const REFRESH_MEMBERS: &[(&str, Kind)] = &[("token", Kind::Str)];
const SUB_REFRESH_MEMBERS: &[(&str, Kind)] = &[
    ("channel", Kind::Str),
    ("token", Kind::Str),
    ("items", Kind::Array),
    ("untrack_keys", Kind::Array),
    ("type", Kind::Int),
    ("signature", Kind::Str),
];
const HISTORY_MEMBERS: &[(&str, Kind)] = &[
    ("channel", Kind::Str),
    ("limit", Kind::Int),
    ("since", Kind::Object),
    ("reverse", Kind::Bool),
];
const POSITION_MEMBERS: &[(&str, Kind)] = &[("offset", Kind::Unsigned), ("epoch", Kind::Str)];
const SEND_MEMBERS: &[(&str, Kind)] = &[("data", Kind::Json)];
const NO_MEMBERS: &[(&str, Kind)] = &[];

/// A method's request object, checked against its schema.
struct Checked {
    obj: RawObject,
}

impl Checked {
    fn new(raw: &RawValue, schema: &[(&str, Kind)]) -> Result<Checked, String> {
        let obj = RawObject::parse(raw.get().as_bytes()).map_err(|e| e.0)?;
        for (key, value) in obj.members() {
            let kind = schema
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, kind)| *kind)
                .ok_or_else(|| format!("unknown member {key:?}"))?;
            check_kind(key, value, kind)?;
        }
        Ok(Checked { obj })
    }

    fn string(&self, key: &str) -> Result<Option<String>, String> {
        match self.obj.get(key) {
            None => Ok(None),
            Some(raw) => serde_json::from_str::<String>(raw.get())
                .map(Some)
                .map_err(|_| format!("{key} must be a string")),
        }
    }

    fn boolean(&self, key: &str) -> Result<Option<bool>, String> {
        match self.obj.get(key) {
            None => Ok(None),
            Some(raw) => serde_json::from_str::<bool>(raw.get())
                .map(Some)
                .map_err(|_| format!("{key} must be a boolean")),
        }
    }

    fn unsigned(&self, key: &str) -> Result<Option<u64>, String> {
        match self.obj.get(key) {
            None => Ok(None),
            Some(raw) => serde_json::from_str::<u64>(raw.get())
                .map(Some)
                .map_err(|_| format!("{key} must be an unsigned integer")),
        }
    }

    fn integer(&self, key: &str) -> Result<Option<i64>, String> {
        match self.obj.get(key) {
            None => Ok(None),
            Some(raw) => serde_json::from_str::<i64>(raw.get())
                .map(Some)
                .map_err(|_| format!("{key} must be an integer")),
        }
    }

    fn required_string(&self, key: &str) -> Result<String, String> {
        self.string(key)?.ok_or_else(|| format!("missing {key}"))
    }

    fn take(&mut self, key: &str) -> Option<Box<RawValue>> {
        self.obj.take(key)
    }
}

fn check_kind(key: &str, raw: &RawValue, kind: Kind) -> Result<(), String> {
    let text = raw.get();
    if is_null(raw) && !matches!(kind, Kind::Json) {
        return Err(format!("{key} must not be null"));
    }
    let first = text.as_bytes().first().copied().unwrap_or(b' ');
    let ok = match kind {
        Kind::Str => first == b'"',
        Kind::Bool => text == "true" || text == "false",
        Kind::Unsigned => serde_json::from_str::<u64>(text).is_ok(),
        Kind::Int => serde_json::from_str::<i64>(text).is_ok(),
        Kind::Object => first == b'{',
        Kind::Array => first == b'[',
        Kind::Json => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{key} has the wrong type"))
    }
}

fn decode_line(line: &[u8]) -> Result<Inbound, String> {
    let mut envelope = RawObject::parse(line).map_err(|e| e.0)?;
    if envelope.is_empty() {
        return Ok(Inbound::Pong);
    }
    let id = match envelope.take("id") {
        None => 0,
        Some(raw) => serde_json::from_str::<u32>(raw.get())
            .map_err(|_| "id must be an unsigned 32-bit integer".to_owned())?,
    };
    let mut methods = envelope.members().iter().map(|(k, _)| k.as_str());
    let method = match (methods.next(), methods.next()) {
        (Some(m), None) => m.to_owned(),
        (None, _) => return Err("a command names no method".into()),
        (Some(_), Some(_)) => return Err("a command names more than one method".into()),
    };
    if !METHODS.contains(&method.as_str()) {
        return Err(format!("unknown method {method:?}"));
    }
    if id == 0 && method != "send" {
        return Err("a command other than send needs an id of at least 1".into());
    }
    let raw = envelope
        .take(&method)
        .ok_or_else(|| "a command names no method".to_owned())?;
    if !raw.get().starts_with('{') {
        return Err(format!("{method} must be an object"));
    }
    let request = match method.as_str() {
        "connect" => {
            let mut c = Checked::new(&raw, CONNECT_MEMBERS)?;
            Request::Connect(ConnectRequest {
                token: c.string("token")?,
                name: c.string("name")?,
                version: c.string("version")?,
                data: c.take("data"),
            })
        }
        "rpc" => {
            let mut c = Checked::new(&raw, RPC_MEMBERS)?;
            Request::Rpc(RpcRequest {
                method: c.required_string("method")?,
                data: c.take("data"),
            })
        }
        "subscribe" => Request::Subscribe(subscribe_request(&raw)?),
        "publish" => {
            let mut c = Checked::new(&raw, PUBLISH_MEMBERS)?;
            Request::Publish(PublishRequest {
                channel: c.required_string("channel")?,
                data: c.take("data"),
            })
        }
        "unsubscribe" => Request::Unsubscribe {
            channel: Checked::new(&raw, CHANNEL_MEMBERS)?.required_string("channel")?,
        },
        "presence" => Request::Presence {
            channel: Checked::new(&raw, CHANNEL_MEMBERS)?.required_string("channel")?,
        },
        "presence_stats" => Request::PresenceStats {
            channel: Checked::new(&raw, CHANNEL_MEMBERS)?.required_string("channel")?,
        },
        "history" => Request::History(history_request(&raw)?),
        "sub_refresh" => Request::SubRefresh {
            channel: Checked::new(&raw, SUB_REFRESH_MEMBERS)?.required_string("channel")?,
        },
        "refresh" => Request::Refresh {
            // Centrifuge sends an empty token when its `getToken` gave none: refused later.
            token: Checked::new(&raw, REFRESH_MEMBERS)?
                .string("token")?
                .unwrap_or_default(),
        },
        "send" => {
            Checked::new(&raw, SEND_MEMBERS)?;
            Request::Send
        }
        // "ping" is protocol v1's; v2 clients answer pings with `{}`.
        _ => {
            Checked::new(&raw, NO_MEMBERS)?;
            return Err("ping is not a protocol v2 command".into());
        }
    };
    Ok(Inbound::Command(Command { id, request }))
}

/// Decodes one inbound frame, all or nothing.
pub fn decode_frame(bytes: &[u8], max_frame_bytes: usize) -> Result<Vec<Inbound>, FrameError> {
    if bytes.len() > max_frame_bytes {
        return Err(FrameError::TooLarge(bytes.len()));
    }
    if std::str::from_utf8(bytes).is_err() {
        return Err(FrameError::NotText);
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.is_empty() {
        return Err(FrameError::Empty);
    }
    let mut out = Vec::new();
    for (index, line) in body.split(|&b| b == b'\n').enumerate() {
        if index >= MAX_COMMANDS_PER_FRAME {
            return Err(FrameError::TooManyCommands);
        }
        let inbound = decode_line(line).map_err(|reason| FrameError::Line {
            line: index + 1,
            reason,
        })?;
        out.push(inbound);
    }
    Ok(out)
}

/// The server's application ping.
pub const PING: &str = "{}";

/// A reply to command `id` whose result is the JSON object `result` under `method`.
pub fn encode_reply(id: u32, method: &str, result: &str) -> String {
    ObjectWriter::new()
        .number("id", u64::from(id))
        .raw(method, result)
        .finish()
}

/// An RPC reply carrying `data` (raw JSON, put on one line: see [`one_line`]).
pub fn encode_rpc_reply(id: u32, data: &str) -> String {
    let result = ObjectWriter::new().raw("data", &one_line(data)).finish();
    encode_reply(id, "rpc", &result)
}

/// An error reply to command `id`.
pub fn encode_error(id: u32, error: &ReplyError) -> String {
    let mut e = ObjectWriter::new();
    e.number("code", u64::from(error.code))
        .string("message", error.message);
    if error.temporary {
        e.boolean("temporary", true);
    }
    let e = e.finish();
    ObjectWriter::new()
        .number("id", u64::from(id))
        .raw("error", &e)
        .finish()
}

/// The connect result.
pub struct ConnectResult<'a> {
    pub client: &'a str,
    pub version: &'a str,
    /// Raw JSON.
    pub data: &'a str,
    pub ping_secs: u32,
    pub pong: bool,
    /// Seconds until the connection token expires (`expires: true, ttl`): the SDK asks its
    /// `getToken` for a fresh one then and sends `refresh`. `None`: it never expires.
    pub ttl_secs: Option<u64>,
}

/// The reply to the connect command.
pub fn encode_connect_reply(id: u32, result: &ConnectResult<'_>) -> String {
    let mut body = ObjectWriter::new();
    body.string("client", result.client)
        .string("version", result.version)
        .raw("data", result.data)
        .number("ping", u64::from(result.ping_secs))
        .boolean("pong", result.pong);
    if let Some(ttl) = result.ttl_secs {
        body.boolean("expires", true).number("ttl", ttl);
    }
    encode_reply(id, "connect", &body.finish())
}

/// The reply to a `refresh` that was accepted: the client, the server's version and, for a
/// token that expires, when (as in the connect reply).
pub fn encode_refresh_reply(id: u32, client: &str, version: &str, ttl_secs: Option<u64>) -> String {
    let mut body = ObjectWriter::new();
    body.string("client", client).string("version", version);
    if let Some(ttl) = ttl_secs {
        body.boolean("expires", true).number("ttl", ttl);
    }
    encode_reply(id, "refresh", &body.finish())
}

/// A Centrifuge publication carrying `data` (raw JSON, put on one line: see [`one_line`]),
/// its stream `offset` when it has one (an enduring record; a preview has none) and, when
/// given, publication tags.
pub fn encode_publication(data: &str, offset: Option<u64>, tags: &[(&str, &str)]) -> String {
    let mut publication = ObjectWriter::new();
    publication.raw("data", &one_line(data));
    if let Some(offset) = offset {
        publication.number("offset", offset);
    }
    if !tags.is_empty() {
        let mut t = ObjectWriter::new();
        for (k, v) in tags {
            t.string(k, v);
        }
        publication.raw("tags", &t.finish());
    }
    publication.finish()
}

/// A publication push on `channel` carrying `data` (raw JSON, put on one line: see
/// [`one_line`]) and, when given, Centrifuge publication tags; no offset.
pub fn encode_publication_push(channel: &str, data: &str, tags: &[(&str, &str)]) -> String {
    encode_push(channel, &encode_publication(data, None, tags))
}

/// A push on `channel` of one publication encoded by [`encode_publication`].
pub fn encode_push(channel: &str, publication: &str) -> String {
    let push = ObjectWriter::new()
        .string("channel", channel)
        .raw("pub", publication)
        .finish();
    ObjectWriter::new().raw("push", &push).finish()
}

/// The result of a subscribe to a stream whose position is known.
pub struct SubscribeResult<'a> {
    /// The stream's epoch and current offset.
    pub position: &'a StreamPosition,
    /// Publications recovered after the client's position, each encoded by
    /// [`encode_publication`], in offset order.
    pub publications: &'a [String],
    /// The client asked to recover.
    pub was_recovering: bool,
    /// Everything after the client's position is in `publications` (no gap).
    pub recovered: bool,
}

/// The reply to a subscribe on a recoverable stream (Centrifuge's `SubscribeResult`:
/// `recoverable`, `epoch`, `offset`, and when recovering `publications`, `recovered`,
/// `was_recovering`).
pub fn encode_subscribe_reply(id: u32, result: &SubscribeResult<'_>) -> String {
    let mut body = ObjectWriter::new();
    body.boolean("recoverable", true)
        .string("epoch", &result.position.epoch)
        .number("offset", result.position.offset);
    if !result.publications.is_empty() {
        body.raw("publications", &json_array(result.publications));
    }
    if result.was_recovering {
        body.boolean("recovered", result.recovered)
            .boolean("was_recovering", true);
    }
    encode_reply(id, "subscribe", &body.finish())
}

/// The reply to a history request: publications (each encoded by [`encode_publication`]) and
/// the stream's epoch and current offset.
pub fn encode_history_reply(id: u32, publications: &[String], position: &StreamPosition) -> String {
    let mut body = ObjectWriter::new();
    body.raw("publications", &json_array(publications))
        .string("epoch", &position.epoch)
        .number("offset", position.offset);
    encode_reply(id, "history", &body.finish())
}

fn json_array(items: &[String]) -> String {
    let mut out = String::with_capacity(2 + items.iter().map(|i| i.len() + 1).sum::<usize>());
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
    out
}

/// An unsubscribe push: the server ended the client's subscription to `channel` (Centrifuge
/// code 2000, "server unsubscribe": the SDKs do not resubscribe by themselves).
pub fn encode_unsubscribe_push(channel: &str, code: u32, reason: &str) -> String {
    let mut unsubscribe = ObjectWriter::new();
    unsubscribe.number("code", u64::from(code));
    let mut r = String::new();
    push_json_string(&mut r, reason);
    unsubscribe.raw("reason", &r);
    let unsubscribe = unsubscribe.finish();
    let push = ObjectWriter::new()
        .string("channel", channel)
        .raw("unsubscribe", &unsubscribe)
        .finish();
    ObjectWriter::new().raw("push", &push).finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_frame(&bytes, DEFAULT_MAX_FRAME_BYTES);
        }

        #[test]
        fn generated_batches_decode_to_their_ids_in_order(
            ids in proptest::collection::vec(1u32..=u32::MAX, 1..20),
            method in "[a-z._]{1,20}",
            trailing_newline in any::<bool>(),
        ) {
            let mut text = ids
                .iter()
                .map(|id| format!(r#"{{"id":{id},"rpc":{{"method":"{method}","data":{{"k":[1,"\n"]}}}}}}"#))
                .collect::<Vec<_>>()
                .join("\n");
            if trailing_newline {
                text.push('\n');
            }
            let decoded = decode_frame(text.as_bytes(), usize::MAX).unwrap();
            let got: Vec<u32> = decoded
                .iter()
                .map(|i| match i {
                    Inbound::Command(c) => c.id,
                    Inbound::Pong => 0,
                })
                .collect();
            prop_assert_eq!(got, ids);
        }

        #[test]
        fn mutated_commands_never_panic_the_decoder(
            at in 0usize..120,
            byte in any::<u8>(),
            cut in 0usize..120,
        ) {
            let good = br#"{"id":7,"subscribe":{"channel":"hostlink.v1.YQ.Yg","data":{"version":1,"ephemeral":true},"flag":1}}"#;
            let mut bytes = good.to_vec();
            let at = at % bytes.len();
            bytes[at] = byte;
            let _ = decode_frame(&bytes, DEFAULT_MAX_FRAME_BYTES);
            let _ = decode_frame(&good[..cut.min(good.len())], DEFAULT_MAX_FRAME_BYTES);
        }
    }

    fn one(text: &str) -> Result<Inbound, FrameError> {
        let mut v = decode_frame(text.as_bytes(), DEFAULT_MAX_FRAME_BYTES)?;
        assert_eq!(v.len(), 1);
        Ok(v.remove(0))
    }

    #[test]
    fn what_the_js_sdk_sends_on_connect_decodes() {
        let text = r#"{"connect":{"token":"tok","data":{"supported_versions":[1]},"name":"js","version":"1.0","headers":{"a":"b"}},"id":1}"#;
        match one(text).unwrap() {
            Inbound::Command(Command {
                id: 1,
                request: Request::Connect(c),
            }) => {
                assert_eq!(c.token.as_deref(), Some("tok"));
                assert_eq!(c.data.unwrap().get(), r#"{"supported_versions":[1]}"#);
                assert_eq!(c.name.as_deref(), Some("js"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_batch_of_lines_with_a_trailing_newline_decodes_in_order() {
        let text = "{\"id\":2,\"rpc\":{\"method\":\"m\",\"data\":{\"a\":1}}}\n{}\n{\"id\":3,\"subscribe\":{\"channel\":\"c\",\"flag\":1}}\n";
        let v = decode_frame(text.as_bytes(), DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(v.len(), 3);
        assert!(
            matches!(&v[0], Inbound::Command(Command { id: 2, request: Request::Rpc(r) }) if r.method == "m")
        );
        assert!(matches!(v[1], Inbound::Pong));
        assert!(
            matches!(&v[2], Inbound::Command(Command { id: 3, request: Request::Subscribe(s) }) if s.channel == "c")
        );
    }

    #[test]
    fn envelope_violations_make_the_frame_undecodable() {
        for bad in [
            "",
            "\n",
            "\n\n",
            "{}\n\n{}",
            r#"{"id":1}"#,
            r#"{"id":0,"rpc":{"method":"m"}}"#,
            r#"{"rpc":{"method":"m"}}"#,
            r#"{"id":-1,"rpc":{"method":"m"}}"#,
            r#"{"id":4294967296,"rpc":{"method":"m"}}"#,
            r#"{"id":1.5,"rpc":{"method":"m"}}"#,
            r#"{"id":"1","rpc":{"method":"m"}}"#,
            r#"{"id":null,"rpc":{"method":"m"}}"#,
            r#"{"id":1,"rpc":{"method":"m"},"publish":{"channel":"c"}}"#,
            r#"{"id":1,"bogus":{}}"#,
            r#"{"id":1,"rpc":null}"#,
            r#"{"id":1,"rpc":[]}"#,
            r#"{"id":1,"rpc":{"method":"m","extra":1}}"#,
            r#"{"id":1,"rpc":{"method":5}}"#,
            r#"{"id":1,"rpc":{"method":"m","method":"n"}}"#,
            r#"{"id":1,"rpc":{"data":{}}}"#,
            r#"{"id":1,"id":2,"rpc":{"method":"m"}}"#,
            r#"{"id":1,"subscribe":{"channel":"c","offset":-1}}"#,
            r#"{"id":1,"ping":{}}"#,
            r#"{"id":1,"rpc":{"method":"m"}} x"#,
            r#"{"id":1,"rpc":{"method":"m"}"#,
            "[1]",
            "null",
        ] {
            assert!(
                decode_frame(bad.as_bytes(), DEFAULT_MAX_FRAME_BYTES).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn frames_over_the_limits_are_refused() {
        let big = format!(r#"{{"id":1,"rpc":{{"method":"{}"}}}}"#, "m".repeat(100));
        assert_eq!(
            decode_frame(big.as_bytes(), 50).unwrap_err(),
            FrameError::TooLarge(big.len())
        );
        let many = vec!["{}"; MAX_COMMANDS_PER_FRAME + 1].join("\n");
        assert_eq!(
            decode_frame(many.as_bytes(), usize::MAX).unwrap_err(),
            FrameError::TooManyCommands
        );
        let exactly = vec!["{}"; MAX_COMMANDS_PER_FRAME].join("\n");
        assert!(decode_frame(exactly.as_bytes(), usize::MAX).is_ok());
        assert_eq!(
            decode_frame(b"{\"a\xff\":1}", 100).unwrap_err(),
            FrameError::NotText
        );
    }

    #[test]
    fn a_recovering_subscribe_carries_its_position_and_a_plain_one_none() {
        let text = r#"{"id":4,"subscribe":{"channel":"c","recover":true,"offset":17,"epoch":"ab12","data":{"version":1},"flag":1}}"#;
        match one(text).unwrap() {
            Inbound::Command(Command {
                request: Request::Subscribe(s),
                ..
            }) => {
                assert_eq!(
                    s.recover,
                    Some(StreamPosition {
                        offset: 17,
                        epoch: "ab12".into()
                    })
                );
                assert_eq!(s.data.unwrap().get(), r#"{"version":1}"#);
            }
            other => panic!("{other:?}"),
        }
        // Centrifuge leaves zero values out: recover alone is offset 0 in no epoch.
        let s = SubscribeRequest::decode(br#"{"channel":"c","recover":true}"#).unwrap();
        assert_eq!(s.recover, Some(StreamPosition::default()));
        // An offset without recover asks for nothing.
        let s = SubscribeRequest::decode(br#"{"channel":"c","offset":3,"epoch":"e"}"#).unwrap();
        assert_eq!(s.recover, None);
        for bad in [
            r#"{"channel":"c","recover":1}"#,
            r#"{"channel":"c","recover":true,"offset":-1}"#,
            r#"{"channel":"c","recover":true,"offset":1.5}"#,
            r#"{"channel":"c","recover":true,"epoch":7}"#,
            r#"{"channel":"c","recover":true,"recover":false}"#,
            r#"{"recover":true}"#,
            r#"[]"#,
            r#"{"channel":"c"} {}"#,
        ] {
            assert!(SubscribeRequest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_history_request_decodes_limit_since_and_reverse_strictly() {
        let h = HistoryRequest::decode(
            br#"{"channel":"c","limit":10,"since":{"offset":5,"epoch":"e1"},"reverse":true}"#,
        )
        .unwrap();
        assert_eq!(
            h,
            HistoryRequest {
                channel: "c".into(),
                limit: 10,
                since: Some(StreamPosition {
                    offset: 5,
                    epoch: "e1".into()
                }),
                reverse: true
            }
        );
        let h = HistoryRequest::decode(br#"{"channel":"c"}"#).unwrap();
        assert_eq!((h.limit, h.since, h.reverse), (0, None, false));
        let h = HistoryRequest::decode(br#"{"channel":"c","limit":-1,"since":{}}"#).unwrap();
        assert_eq!((h.limit, h.since), (-1, Some(StreamPosition::default())));
        for bad in [
            r#"{"channel":"c","limit":"1"}"#,
            r#"{"channel":"c","limit":1e3}"#,
            r#"{"channel":"c","since":{"offset":1,"extra":1}}"#,
            r#"{"channel":"c","since":{"offset":-1}}"#,
            r#"{"channel":"c","since":{"offset":1,"offset":2}}"#,
            r#"{"channel":"c","since":null}"#,
            r#"{"channel":"c","since":[]}"#,
            r#"{"channel":"c","reverse":"yes"}"#,
            r#"{"limit":1}"#,
        ] {
            assert!(HistoryRequest::decode(bad.as_bytes()).is_err(), "{bad}");
            let line = format!(r#"{{"id":1,"history":{bad}}}"#);
            assert!(
                decode_frame(line.as_bytes(), DEFAULT_MAX_FRAME_BYTES).is_err(),
                "{line}"
            );
        }
    }

    #[test]
    fn subscribe_and_history_results_have_the_centrifuge_shape() {
        let position = StreamPosition {
            offset: 9,
            epoch: "ep".into(),
        };
        let p = encode_publication(r#"{"x":1}"#, Some(8), &[("record", "r")]);
        assert_eq!(p, r#"{"data":{"x":1},"offset":8,"tags":{"record":"r"}}"#);
        assert_eq!(
            encode_subscribe_reply(
                2,
                &SubscribeResult {
                    position: &position,
                    publications: &[],
                    was_recovering: false,
                    recovered: false
                }
            ),
            r#"{"id":2,"subscribe":{"recoverable":true,"epoch":"ep","offset":9}}"#
        );
        assert_eq!(
            encode_subscribe_reply(
                2,
                &SubscribeResult {
                    position: &position,
                    publications: std::slice::from_ref(&p),
                    was_recovering: true,
                    recovered: true
                }
            ),
            format!(
                r#"{{"id":2,"subscribe":{{"recoverable":true,"epoch":"ep","offset":9,"publications":[{p}],"recovered":true,"was_recovering":true}}}}"#
            )
        );
        assert_eq!(
            encode_history_reply(3, &[p.clone(), p.clone()], &position),
            format!(r#"{{"id":3,"history":{{"publications":[{p},{p}],"epoch":"ep","offset":9}}}}"#)
        );
        assert_eq!(
            encode_push("ch", &p),
            format!(r#"{{"push":{{"channel":"ch","pub":{p}}}}}"#)
        );
    }

    #[test]
    fn a_send_may_omit_its_id() {
        assert!(matches!(
            one(r#"{"send":{"data":{"x":1}}}"#).unwrap(),
            Inbound::Command(Command {
                id: 0,
                request: Request::Send
            })
        ));
    }

    #[test]
    fn replies_and_pushes_have_the_centrifuge_shape() {
        assert_eq!(
            encode_rpc_reply(3, r#"{"a":1}"#),
            r#"{"id":3,"rpc":{"data":{"a":1}}}"#
        );
        assert_eq!(
            encode_reply(4, "subscribe", "{}"),
            r#"{"id":4,"subscribe":{}}"#
        );
        assert_eq!(
            encode_error(5, &ReplyError::BAD_REQUEST),
            r#"{"id":5,"error":{"code":107,"message":"bad request"}}"#
        );
        assert_eq!(
            encode_error(5, &ReplyError::INTERNAL),
            r#"{"id":5,"error":{"code":100,"message":"internal server error","temporary":true}}"#
        );
        assert_eq!(
            encode_publication_push("ch", r#"{"x":1}"#, &[]),
            r#"{"push":{"channel":"ch","pub":{"data":{"x":1}}}}"#
        );
        assert_eq!(
            encode_publication_push("ch", "{}", &[("record", "r")]),
            r#"{"push":{"channel":"ch","pub":{"data":{},"tags":{"record":"r"}}}}"#
        );
        assert_eq!(
            encode_unsubscribe_push("ch", 2000, "binding dropped"),
            r#"{"push":{"channel":"ch","unsubscribe":{"code":2000,"reason":"binding dropped"}}}"#
        );
        assert_eq!(
            encode_connect_reply(
                1,
                &ConnectResult {
                    client: "c",
                    version: "v",
                    data: "{}",
                    ping_secs: 25,
                    pong: true,
                    ttl_secs: None,
                }
            ),
            r#"{"id":1,"connect":{"client":"c","version":"v","data":{},"ping":25,"pong":true}}"#
        );
        assert_eq!(
            encode_connect_reply(
                2,
                &ConnectResult {
                    client: "c",
                    version: "v",
                    data: "{}",
                    ping_secs: 25,
                    pong: true,
                    ttl_secs: Some(30),
                }
            ),
            r#"{"id":2,"connect":{"client":"c","version":"v","data":{},"ping":25,"pong":true,"expires":true,"ttl":30}}"#
        );
        assert_eq!(
            encode_refresh_reply(3, "c", "v", Some(7)),
            r#"{"id":3,"refresh":{"client":"c","version":"v","expires":true,"ttl":7}}"#
        );
    }
}
