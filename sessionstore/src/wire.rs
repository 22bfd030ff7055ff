//! Wire vocabulary: the command bodies a controller admits, and the one strict JSON object
//! reader ([`StrictObject`]) every decoder of untrusted objects uses, here and in `hostlink`. Owns the rule that separates a body no Host could
//! ever apply (`Malformed`: reject it) from one only a newer Host could (`UnknownField`,
//! `UnsupportedVersion`: block it). Never performs I/O.
//!
//! Bodies are JSON objects with `"version": 1`:
//!
//! | kind | members |
//! |---|---|
//! | `create` | `version`, `text`? (the optional first message) |
//! | `restore` | `version` |
//! | `input` | `version`, `text` |
//! | `interrupt` | `version` |
//! | `gate_response` | `version`, `gate_id` (a UUID), `action`, `text`?, `expected_gate_seq`? |
//!
//! Every kind also accepts `session_id` and `command_id`; when present they must name the
//! command's own session and command (a body naming another is rejected).
//!
//! The reference Host's bodies are read too, so a controller written against it is not blocked:
//! `blocks` (an array of `{"type":"text","text":...}` content blocks) in place of `text` on
//! `create` (optional) and `input` (required, at least one block); `principal` (a string) and
//! `metadata` (an object) as body members on every kind; and `expected_open_seq` for the
//! gate version on `gate_response`. Each alternative is exclusive with its counterpart only
//! when they disagree: a body carrying both `text` and `blocks`, or two different gate
//! versions, is malformed. A block of another `type` is from a newer writer (blocked).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::ids::{CommandId, SessionId};
use crate::model::CommandKind;

/// The one body version this build reads.
pub const BODY_VERSION: u64 = 1;

/// Why a record could not be decoded.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DecodeError {
    /// No reader of any version could use it: reject.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A member this build does not know (a newer writer's): block, do not reject.
    #[error("unknown_field: {0}")]
    UnknownField(String),
    /// A version this build does not read: block, do not reject.
    #[error("unsupported_version: {0}")]
    UnsupportedVersion(u64),
}

impl DecodeError {
    /// True when only a newer reader could use the record (block rather than reject).
    pub fn is_from_the_future(&self) -> bool {
        matches!(
            self,
            DecodeError::UnknownField(_) | DecodeError::UnsupportedVersion(_)
        )
    }

    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            DecodeError::Malformed(_) => "malformed",
            DecodeError::UnknownField(_) => "unknown_field",
            DecodeError::UnsupportedVersion(_) => "unsupported_version",
        }
    }
}

/// A JSON object read strictly: exactly one object (whitespace around it allowed, nothing
/// else), duplicate members refused, members kept in the order they came. Each member is kept
/// as a `V`: a [`Value`] (the default), or a `Box<RawValue>` where a decoder must keep the exact
/// bytes a member arrived as. This is the one strict object reader: every decoder of untrusted
/// JSON objects (command bodies here, HostLink frames in `hostlink`) reads through it.
#[derive(Clone, Debug, PartialEq)]
pub struct StrictObject<V = Value> {
    members: Vec<(String, V)>,
}

/// Why bytes are not one strict JSON object. The text is what a decoder reports as is.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotStrictObject(pub String);

impl From<NotStrictObject> for DecodeError {
    fn from(e: NotStrictObject) -> Self {
        DecodeError::Malformed(e.0)
    }
}

struct StrictVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for StrictVisitor<V> {
    type Value = StrictObject<V>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictObject<V>, A::Error> {
        let mut members: Vec<(String, V)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if members.iter().any(|(k, _)| *k == key) {
                return Err(de::Error::custom(format!("duplicate member {key:?}")));
            }
            let value: V = map.next_value()?;
            members.push((key, value));
        }
        Ok(StrictObject { members })
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for StrictObject<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(StrictVisitor(PhantomData))
    }
}

impl<V: DeserializeOwned> StrictObject<V> {
    /// Parses `bytes` as exactly one JSON object (no trailing data, no duplicate members).
    pub fn parse(bytes: &[u8]) -> Result<StrictObject<V>, NotStrictObject> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let obj = StrictObject::deserialize(&mut de)
            .map_err(|e| NotStrictObject(format!("not a single JSON object: {e}")))?;
        de.end()
            .map_err(|_| NotStrictObject("trailing data after the object".into()))?;
        Ok(obj)
    }
}

impl<V> StrictObject<V> {
    /// The members, in order.
    pub fn members(&self) -> &[(String, V)] {
        &self.members
    }

    /// Whether the object has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&V> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Takes the value of `key` out of the object.
    pub fn take(&mut self, key: &str) -> Option<V> {
        let at = self.members.iter().position(|(k, _)| k == key)?;
        Some(self.members.remove(at).1)
    }

    /// The first member (in order) not in `known`, if any.
    pub fn first_unknown(&self, known: &[&str]) -> Option<&str> {
        self.members
            .iter()
            .map(|(k, _)| k.as_str())
            .find(|k| !known.contains(k))
    }
}

impl StrictObject {
    /// Builds from an already-parsed value (duplicates were lost by the parser; prefer
    /// [`StrictObject::parse`] for untrusted bytes).
    pub fn from_value(v: Value) -> Result<StrictObject, DecodeError> {
        match v {
            Value::Object(map) => Ok(StrictObject {
                members: map.into_iter().collect(),
            }),
            _ => Err(DecodeError::Malformed("expected a JSON object".into())),
        }
    }

    /// Refuses any member not in `known` (as `UnknownField`: a newer writer may send it).
    pub fn only(&self, known: &[&str]) -> Result<(), DecodeError> {
        match self.first_unknown(known) {
            Some(k) => Err(DecodeError::UnknownField(k.to_owned())),
            None => Ok(()),
        }
    }

    /// The `version` member: required, a positive integer, and one this build reads.
    pub fn version(&self, supported: u64) -> Result<u64, DecodeError> {
        let v = self
            .get("version")
            .ok_or_else(|| DecodeError::Malformed("missing version".into()))?;
        let n = v
            .as_u64()
            .ok_or_else(|| DecodeError::Malformed("version must be a positive integer".into()))?;
        if n == 0 {
            return Err(DecodeError::Malformed("version must be at least 1".into()));
        }
        if n > supported {
            return Err(DecodeError::UnsupportedVersion(n));
        }
        Ok(n)
    }

    /// A required string member.
    pub fn string(&self, key: &str) -> Result<String, DecodeError> {
        self.opt_string(key)?
            .ok_or_else(|| DecodeError::Malformed(format!("missing {key}")))
    }

    /// An optional string member (`null` is refused: omit the member instead).
    pub fn opt_string(&self, key: &str) -> Result<Option<String>, DecodeError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(DecodeError::Malformed(format!("{key} must be a string"))),
        }
    }

    /// A required positive integer member.
    pub fn positive(&self, key: &str) -> Result<u64, DecodeError> {
        self.opt_positive(key)?
            .ok_or_else(|| DecodeError::Malformed(format!("missing {key}")))
    }

    /// An optional positive integer member (`null` and 0 refused).
    pub fn opt_positive(&self, key: &str) -> Result<Option<u64>, DecodeError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(DecodeError::Malformed(format!(
                    "{key} must be a positive integer"
                ))),
            },
        }
    }

    /// An optional boolean member.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, DecodeError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(DecodeError::Malformed(format!("{key} must be a boolean"))),
        }
    }

    /// A member of any JSON type (`null` refused).
    pub fn opt_value(&self, key: &str) -> Result<Option<Value>, DecodeError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Null) => Err(DecodeError::Malformed(format!("{key} must not be null"))),
            Some(v) => Ok(Some(v.clone())),
        }
    }
}

/// A gate answer's action.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct GateAnswer {
    /// The gate (harness gate ids are UUIDs).
    pub gate_id: Uuid,
    /// The action chosen (`approve`, `deny`, `answer`, ...). Whether the gate offers it is the
    /// runtime's decision.
    pub action: String,
    /// Free text (the answer of an `ask_user` gate).
    pub text: Option<String>,
    /// The journal sequence of the gate's opening the answerer saw, if it says.
    pub expected_gate_seq: Option<u64>,
}

/// A decoded command body.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum CommandBodyV1 {
    Create { text: Option<String> },
    Restore,
    Input { text: String },
    Interrupt,
    GateResponse(GateAnswer),
}

/// Attribution a body may carry as members (the reference Host's shape). The admission's own
/// columns are authoritative; see [`Attribution::reconcile`].
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Attribution {
    pub principal: Option<String>,
    /// A JSON object.
    pub metadata: Option<serde_json::Map<String, Value>>,
}

impl Attribution {
    /// Principal and metadata (object text) for the runtime: the admission's columns when set,
    /// else the body's members. A body that names a different principal or different metadata
    /// than its admission recorded is malformed.
    pub fn reconcile(
        &self,
        principal: Option<&str>,
        metadata: Option<&str>,
    ) -> Result<(Option<String>, Option<String>), DecodeError> {
        let principal = match (principal, &self.principal) {
            (Some(col), Some(body)) if col != body => {
                return Err(DecodeError::Malformed(
                    "the body names another principal than its admission".into(),
                ));
            }
            (Some(col), _) => Some(col.to_owned()),
            (None, body) => body.clone(),
        };
        let metadata = match (metadata, &self.metadata) {
            (Some(col), Some(body)) => {
                let recorded: Value = serde_json::from_str(col).map_err(|e| {
                    DecodeError::Malformed(format!("the admission's metadata is not JSON: {e}"))
                })?;
                if recorded != Value::Object(body.clone()) {
                    return Err(DecodeError::Malformed(
                        "the body carries other metadata than its admission".into(),
                    ));
                }
                Some(col.to_owned())
            }
            (Some(col), None) => Some(col.to_owned()),
            (None, Some(body)) => Some(Value::Object(body.clone()).to_string()),
            (None, None) => None,
        };
        Ok((principal, metadata))
    }
}

/// A decoded command: its body and the attribution members it carried.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DecodedCommand {
    pub body: CommandBodyV1,
    pub attribution: Attribution,
}

/// The largest text a body may carry (a message or an answer).
pub const MAX_BODY_TEXT_BYTES: usize = 8 * 1024 * 1024;

fn check_text(key: &str, text: &str) -> Result<(), DecodeError> {
    if text.len() > MAX_BODY_TEXT_BYTES {
        return Err(DecodeError::Malformed(format!("{key} is too large")));
    }
    Ok(())
}

/// Decodes a command body strictly, for the command `command` of session `session`.
pub fn decode_command_body(
    kind: CommandKind,
    bytes: &[u8],
    session: &SessionId,
    command: &CommandId,
) -> Result<CommandBodyV1, DecodeError> {
    decode_command(kind, bytes, session, command).map(|d| d.body)
}

/// The message of a `text` member or a `blocks` array (never both); `None` when neither.
fn message(obj: &StrictObject) -> Result<Option<String>, DecodeError> {
    let text = obj.opt_string("text")?;
    let blocks = obj.opt_value("blocks")?;
    let message = match (text, blocks) {
        (Some(_), Some(_)) => {
            return Err(DecodeError::Malformed(
                "a body carries text or blocks, not both".into(),
            ));
        }
        (Some(t), None) => Some(t),
        (None, Some(b)) => Some(blocks_text(&b)?),
        (None, None) => None,
    };
    if let Some(t) = &message {
        check_text("text", t)?;
    }
    Ok(message)
}

/// The text of a `blocks` array: its text blocks joined by newlines. An empty array is no
/// message at all; a block of another type is a newer writer's (blocked, not rejected).
fn blocks_text(blocks: &Value) -> Result<String, DecodeError> {
    let Value::Array(items) = blocks else {
        return Err(DecodeError::Malformed("blocks must be an array".into()));
    };
    if items.is_empty() {
        return Err(DecodeError::Malformed("blocks must not be empty".into()));
    }
    let mut parts = Vec::with_capacity(items.len());
    let mut future = None;
    for (i, item) in items.iter().enumerate() {
        let block = StrictObject::from_value(item.clone())
            .map_err(|_| DecodeError::Malformed(format!("blocks[{i}] must be an object")))?;
        let ty = block.string("type")?;
        if ty != "text" {
            future
                .get_or_insert_with(|| DecodeError::UnknownField(format!("blocks[{i}].type={ty}")));
            continue;
        }
        parts.push(block.string("text")?);
        if let Err(e) = block.only(&["type", "text"]) {
            future.get_or_insert(e);
        }
    }
    // Broken blocks are rejected before a newer writer's block blocks.
    if let Some(e) = future {
        return Err(e);
    }
    Ok(parts.join("\n"))
}

/// Decodes a command body strictly, with the attribution members it carries.
pub fn decode_command(
    kind: CommandKind,
    bytes: &[u8],
    session: &SessionId,
    command: &CommandId,
) -> Result<DecodedCommand, DecodeError> {
    let obj: StrictObject = StrictObject::parse(bytes)?;
    obj.version(BODY_VERSION)?;
    let common = [
        "version",
        "session_id",
        "command_id",
        "principal",
        "metadata",
    ];
    let known: Vec<&str> = match kind {
        CommandKind::Create => [&common[..], &["text", "blocks"]].concat(),
        CommandKind::Input => [&common[..], &["text", "blocks"]].concat(),
        CommandKind::Restore | CommandKind::Interrupt => common.to_vec(),
        CommandKind::GateResponse => [
            &common[..],
            &[
                "gate_id",
                "action",
                "text",
                "expected_gate_seq",
                "expected_open_seq",
            ],
        ]
        .concat(),
    };
    // Type errors in known members are malformed; an unknown member only blocks. Known
    // members are checked first so a body that is both broken and extended is rejected.
    if let Some(s) = obj.opt_string("session_id")?
        && s != session.as_str()
    {
        return Err(DecodeError::Malformed(
            "the body names another session".into(),
        ));
    }
    if let Some(c) = obj.opt_string("command_id")?
        && c != command.as_str()
    {
        return Err(DecodeError::Malformed(
            "the body names another command".into(),
        ));
    }
    let principal = obj.opt_string("principal")?;
    if principal.as_ref().is_some_and(|p| p.is_empty()) {
        return Err(DecodeError::Malformed("principal must not be empty".into()));
    }
    let metadata = match obj.opt_value("metadata")? {
        None => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(DecodeError::Malformed("metadata must be an object".into())),
    };
    let body = match kind {
        CommandKind::Create => CommandBodyV1::Create {
            text: match obj.opt_value("blocks")? {
                // An empty `blocks` is a bare create in the reference's shape.
                Some(Value::Array(a)) if a.is_empty() && obj.opt_string("text")?.is_none() => None,
                _ => message(&obj)?,
            },
        },
        CommandKind::Restore => CommandBodyV1::Restore,
        CommandKind::Input => CommandBodyV1::Input {
            text: message(&obj)?
                .ok_or_else(|| DecodeError::Malformed("missing text or blocks".into()))?,
        },
        CommandKind::Interrupt => CommandBodyV1::Interrupt,
        CommandKind::GateResponse => {
            let gate = obj.string("gate_id")?;
            let gate_id = Uuid::try_parse(&gate)
                .ok()
                .filter(|u| !u.is_nil())
                .ok_or_else(|| DecodeError::Malformed("gate_id must be a non-nil UUID".into()))?;
            let action = obj.string("action")?;
            if action.is_empty() || action.len() > 64 {
                return Err(DecodeError::Malformed("action must be 1-64 bytes".into()));
            }
            let text = obj.opt_string("text")?;
            if let Some(t) = &text {
                check_text("text", t)?;
            }
            let expected_gate_seq = match (
                obj.opt_positive("expected_gate_seq")?,
                obj.opt_positive("expected_open_seq")?,
            ) {
                (Some(a), Some(b)) if a != b => {
                    return Err(DecodeError::Malformed(
                        "expected_gate_seq and expected_open_seq disagree".into(),
                    ));
                }
                (a, b) => a.or(b),
            };
            CommandBodyV1::GateResponse(GateAnswer {
                gate_id,
                action,
                text,
                expected_gate_seq,
            })
        }
    };
    obj.only(&known)?;
    Ok(DecodedCommand {
        body,
        attribution: Attribution {
            principal,
            metadata,
        },
    })
}

/// Encodes a body (what a controller admits).
pub fn encode_command_body(body: &CommandBodyV1) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    map.insert("version".into(), Value::from(BODY_VERSION));
    match body {
        CommandBodyV1::Create { text } => {
            if let Some(t) = text {
                map.insert("text".into(), Value::from(t.clone()));
            }
        }
        CommandBodyV1::Restore | CommandBodyV1::Interrupt => {}
        CommandBodyV1::Input { text } => {
            map.insert("text".into(), Value::from(text.clone()));
        }
        CommandBodyV1::GateResponse(a) => {
            map.insert(
                "gate_id".into(),
                Value::from(a.gate_id.hyphenated().to_string()),
            );
            map.insert("action".into(), Value::from(a.action.clone()));
            if let Some(t) = &a.text {
                map.insert("text".into(), Value::from(t.clone()));
            }
            if let Some(s) = a.expected_gate_seq {
                map.insert("expected_gate_seq".into(), Value::from(s));
            }
        }
    }
    serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
}

impl CommandBodyV1 {
    /// The kind this body belongs to.
    pub fn kind(&self) -> CommandKind {
        match self {
            CommandBodyV1::Create { .. } => CommandKind::Create,
            CommandBodyV1::Restore => CommandKind::Restore,
            CommandBodyV1::Input { .. } => CommandKind::Input,
            CommandBodyV1::Interrupt => CommandKind::Interrupt,
            CommandBodyV1::GateResponse(_) => CommandKind::GateResponse,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;

    #[test]
    fn a_raw_strict_object_keeps_each_members_exact_bytes_in_order() {
        let obj = StrictObject::<Box<RawValue>>::parse(br#" {"b": {"z":1, "a" :2}, "a":[1 ,2]} "#)
            .unwrap();
        let keys: Vec<&str> = obj.members().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(obj.get("b").unwrap().get(), r#"{"z":1, "a" :2}"#);
        assert_eq!(obj.first_unknown(&["b"]), Some("a"));
    }

    #[test]
    fn duplicates_trailing_data_and_non_objects_are_not_one_strict_object() {
        for bad in [
            &br#"{"a":1,"a":2}"#[..],
            br#"{"a":1} {}"#,
            br#"{"a":1}x"#,
            b"[]",
            b"null",
            b"",
            b"{",
        ] {
            let raw = StrictObject::<Box<RawValue>>::parse(bad).unwrap_err();
            let value = StrictObject::<Value>::parse(bad).unwrap_err();
            assert_eq!(raw, value, "{:?}", String::from_utf8_lossy(bad));
        }
        assert_eq!(
            StrictObject::<Value>::parse(br#"{"a":1} {}"#)
                .unwrap_err()
                .0,
            "trailing data after the object"
        );
        let dup = StrictObject::<Value>::parse(br#"{"a":1,"a":2}"#)
            .unwrap_err()
            .0;
        assert!(
            dup.starts_with("not a single JSON object: duplicate member \"a\""),
            "{dup}"
        );
    }

    fn s() -> SessionId {
        SessionId::new("s1").unwrap()
    }
    fn c() -> CommandId {
        CommandId::new("c1").unwrap()
    }

    #[test]
    fn every_kind_round_trips() {
        for body in [
            CommandBodyV1::Create { text: None },
            CommandBodyV1::Create {
                text: Some("hi".into()),
            },
            CommandBodyV1::Restore,
            CommandBodyV1::Input { text: "hi".into() },
            CommandBodyV1::Interrupt,
            CommandBodyV1::GateResponse(GateAnswer {
                gate_id: Uuid::now_v7(),
                action: "approve".into(),
                text: None,
                expected_gate_seq: Some(4),
            }),
        ] {
            let bytes = encode_command_body(&body);
            assert_eq!(
                decode_command_body(body.kind(), &bytes, &s(), &c()).unwrap(),
                body
            );
        }
    }

    #[test]
    fn an_unknown_member_blocks_but_a_broken_one_rejects() {
        let e = decode_command_body(
            CommandKind::Input,
            br#"{"version":1,"text":"a","extra":1}"#,
            &s(),
            &c(),
        )
        .unwrap_err();
        assert!(e.is_from_the_future());
        let e = decode_command_body(
            CommandKind::Input,
            br#"{"version":1,"text":5,"extra":1}"#,
            &s(),
            &c(),
        )
        .unwrap_err();
        assert_eq!(e.code(), "malformed");
    }

    #[test]
    fn a_gate_response_with_a_member_from_the_future_blocks() {
        let gate = Uuid::now_v7();
        let e = decode_command_body(
            CommandKind::GateResponse,
            format!(r#"{{"version":1,"gate_id":"{gate}","action":"approve","later":true}}"#)
                .as_bytes(),
            &s(),
            &c(),
        )
        .unwrap_err();
        assert!(e.is_from_the_future(), "{e:?}");
        let e = decode_command_body(
            CommandKind::GateResponse,
            format!(r#"{{"version":1,"gate_id":"{gate}","action":""}}"#).as_bytes(),
            &s(),
            &c(),
        )
        .unwrap_err();
        assert_eq!(e.code(), "malformed");
    }

    #[test]
    fn a_newer_version_blocks_and_a_zero_version_rejects() {
        let e = decode_command_body(CommandKind::Interrupt, br#"{"version":2}"#, &s(), &c())
            .unwrap_err();
        assert_eq!(e, DecodeError::UnsupportedVersion(2));
        let e = decode_command_body(CommandKind::Interrupt, br#"{"version":0}"#, &s(), &c())
            .unwrap_err();
        assert_eq!(e.code(), "malformed");
    }

    #[test]
    fn duplicates_trailing_data_and_nulls_are_malformed() {
        for bad in [
            &br#"{"version":1,"version":1}"#[..],
            br#"{"version":1} {}"#,
            br#"{"version":1,"text":null}"#,
            br#"[1]"#,
            b"\xff\xfe",
            b"",
        ] {
            let e = decode_command_body(CommandKind::Create, bad, &s(), &c()).unwrap_err();
            assert_eq!(e.code(), "malformed", "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_body_naming_another_session_or_command_is_malformed() {
        let e = decode_command_body(
            CommandKind::Interrupt,
            br#"{"version":1,"session_id":"other"}"#,
            &s(),
            &c(),
        )
        .unwrap_err();
        assert_eq!(e.code(), "malformed");
        let e = decode_command_body(
            CommandKind::Interrupt,
            br#"{"version":1,"command_id":"c2"}"#,
            &s(),
            &c(),
        )
        .unwrap_err();
        assert_eq!(e.code(), "malformed");
        decode_command_body(
            CommandKind::Interrupt,
            br#"{"version":1,"session_id":"s1","command_id":"c1"}"#,
            &s(),
            &c(),
        )
        .unwrap();
    }

    #[test]
    fn a_gate_id_that_is_not_a_uuid_is_malformed() {
        for gate in ["nope", "00000000-0000-0000-0000-000000000000"] {
            let body = format!(r#"{{"version":1,"gate_id":"{gate}","action":"approve"}}"#);
            let e = decode_command_body(CommandKind::GateResponse, body.as_bytes(), &s(), &c())
                .unwrap_err();
            assert_eq!(e.code(), "malformed");
        }
    }
    #[test]
    fn the_reference_hosts_shapes_decode_to_the_same_commands() {
        let d = decode_command(
            CommandKind::Input,
            br#"{"version":1,"blocks":[{"type":"text","text":"hello"},{"type":"text","text":"world"}],"principal":"user:7","metadata":{"trace":"t1"}}"#,
            &s(),
            &c(),
        )
        .unwrap();
        assert_eq!(
            d.body,
            CommandBodyV1::Input {
                text: "hello\nworld".into()
            }
        );
        assert_eq!(d.attribution.principal.as_deref(), Some("user:7"));
        assert_eq!(
            d.attribution.metadata.as_ref().and_then(|m| m.get("trace")),
            Some(&Value::from("t1"))
        );
        for (bytes, text) in [
            (
                &br#"{"version":1,"blocks":[{"type":"text","text":"hi"}]}"#[..],
                Some("hi"),
            ),
            (br#"{"version":1,"blocks":[]}"#, None),
            (br#"{"version":1}"#, None),
        ] {
            assert_eq!(
                decode_command_body(CommandKind::Create, bytes, &s(), &c()).unwrap(),
                CommandBodyV1::Create {
                    text: text.map(str::to_owned)
                }
            );
        }
        let gate = Uuid::now_v7();
        let body = format!(
            r#"{{"version":1,"gate_id":"{gate}","action":"approve","expected_open_seq":9,"principal":"user:7"}}"#
        );
        assert_eq!(
            decode_command_body(CommandKind::GateResponse, body.as_bytes(), &s(), &c()).unwrap(),
            CommandBodyV1::GateResponse(GateAnswer {
                gate_id: gate,
                action: "approve".into(),
                text: None,
                expected_gate_seq: Some(9),
            })
        );
    }

    #[test]
    fn contradictory_or_broken_reference_members_reject_and_newer_blocks_block() {
        let gate = Uuid::now_v7();
        let contradictions = [
            (
                CommandKind::Input,
                r#"{"version":1,"text":"a","blocks":[{"type":"text","text":"a"}]}"#.to_owned(),
            ),
            (
                CommandKind::Input,
                r#"{"version":1,"blocks":[]}"#.to_owned(),
            ),
            (
                CommandKind::Input,
                r#"{"version":1,"blocks":"a"}"#.to_owned(),
            ),
            (
                CommandKind::Input,
                r#"{"version":1,"blocks":[{"type":"text"}]}"#.to_owned(),
            ),
            (
                CommandKind::Input,
                r#"{"version":1,"blocks":[{"type":"image"},{"type":"text","text":5}]}"#.to_owned(),
            ),
            (
                CommandKind::Interrupt,
                r#"{"version":1,"metadata":[1]}"#.to_owned(),
            ),
            (
                CommandKind::Interrupt,
                r#"{"version":1,"principal":""}"#.to_owned(),
            ),
            (
                CommandKind::GateResponse,
                format!(
                    r#"{{"version":1,"gate_id":"{gate}","action":"approve","expected_gate_seq":3,"expected_open_seq":4}}"#
                ),
            ),
        ];
        for (kind, body) in contradictions {
            let e = decode_command_body(kind, body.as_bytes(), &s(), &c()).unwrap_err();
            assert_eq!(e.code(), "malformed", "{body}");
        }
        for body in [
            r#"{"version":1,"blocks":[{"type":"image","url":"x"}]}"#,
            r#"{"version":1,"blocks":[{"type":"text","text":"a","cache":true}]}"#,
        ] {
            let e =
                decode_command_body(CommandKind::Input, body.as_bytes(), &s(), &c()).unwrap_err();
            assert!(e.is_from_the_future(), "{body}: {e}");
        }
    }

    #[test]
    fn the_admissions_attribution_wins_and_a_body_contradicting_it_is_malformed() {
        let body = Attribution {
            principal: Some("user:7".into()),
            metadata: serde_json::from_str(r#"{"a":1}"#).unwrap(),
        };
        assert_eq!(
            body.reconcile(None, None).unwrap(),
            (Some("user:7".into()), Some(r#"{"a":1}"#.into()))
        );
        assert_eq!(
            body.reconcile(Some("user:7"), Some(r#"{ "a" : 1 }"#))
                .unwrap(),
            (Some("user:7".into()), Some(r#"{ "a" : 1 }"#.into()))
        );
        assert_eq!(
            Attribution::default()
                .reconcile(Some("user:1"), Some("{}"))
                .unwrap(),
            (Some("user:1".into()), Some("{}".into()))
        );
        assert!(body.reconcile(Some("user:8"), None).is_err());
        assert!(body.reconcile(None, Some(r#"{"a":2}"#)).is_err());
    }
}
