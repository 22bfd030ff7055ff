//! JSON building blocks shared by the frame codec and the records. Owns the raw strict object
//! reader (one object, duplicate members refused, no trailing data, every member kept as the
//! exact bytes it arrived as) and the writer that emits objects with a fixed member order.
//! Never interprets a member: callers do.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object whose members are kept as raw JSON text, in order.
#[derive(Debug)]
pub struct RawObject {
    members: Vec<(String, Box<RawValue>)>,
}

struct RawObjectVisitor;

impl<'de> Visitor<'de> for RawObjectVisitor {
    type Value = RawObject;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawObject, A::Error> {
        let mut members: Vec<(String, Box<RawValue>)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if members.iter().any(|(k, _)| *k == key) {
                return Err(de::Error::custom(format!("duplicate member {key:?}")));
            }
            let value: Box<RawValue> = map.next_value()?;
            members.push((key, value));
        }
        Ok(RawObject { members })
    }
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RawObjectVisitor)
    }
}

/// Why bytes are not one strict JSON object.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("{0}")]
pub struct RawObjectError(pub String);

impl RawObject {
    /// Parses exactly one JSON object (whitespace around it allowed, nothing else).
    pub fn parse(bytes: &[u8]) -> Result<RawObject, RawObjectError> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        let obj = RawObject::deserialize(&mut de)
            .map_err(|e| RawObjectError(format!("not a single JSON object: {e}")))?;
        de.end()
            .map_err(|_| RawObjectError("trailing data after the object".into()))?;
        Ok(obj)
    }

    /// Parses one JSON object from raw JSON text.
    pub fn from_raw(raw: &RawValue) -> Result<RawObject, RawObjectError> {
        RawObject::parse(raw.get().as_bytes())
    }

    /// The members, in order.
    pub fn members(&self) -> &[(String, Box<RawValue>)] {
        &self.members
    }

    /// Whether the object has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The raw value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&RawValue> {
        self.members
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_ref())
    }

    /// Takes the raw value of `key` out of the object.
    pub fn take(&mut self, key: &str) -> Option<Box<RawValue>> {
        let at = self.members.iter().position(|(k, _)| k == key)?;
        Some(self.members.remove(at).1)
    }

    /// The first member not in `known`, if any.
    pub fn first_unknown(&self, known: &[&str]) -> Option<&str> {
        self.members
            .iter()
            .map(|(k, _)| k.as_str())
            .find(|k| !known.contains(k))
    }
}

/// JSON text on one line. The SDKs split every message they receive on line feeds (Centrifuge
/// JSON batching), so an outbound message must not contain a raw line feed, even though the
/// Host sends each message alone. In valid JSON a raw line feed or carriage return can
/// only be insignificant whitespace (inside a string it must be escaped), so each becomes a
/// space: the value, member order and every other byte are kept.
pub fn one_line(json: &str) -> std::borrow::Cow<'_, str> {
    if json.contains(['\n', '\r']) {
        std::borrow::Cow::Owned(json.replace(['\n', '\r'], " "))
    } else {
        std::borrow::Cow::Borrowed(json)
    }
}

/// Whether raw JSON text is the literal `null`.
pub fn is_null(raw: &RawValue) -> bool {
    raw.get() == "null"
}

/// Appends `text` as a JSON string literal.
pub fn push_json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Writes one JSON object with members in the order they are added.
pub struct ObjectWriter {
    out: String,
    empty: bool,
}

impl Default for ObjectWriter {
    fn default() -> Self {
        ObjectWriter::new()
    }
}

impl ObjectWriter {
    /// An empty object under construction.
    pub fn new() -> ObjectWriter {
        ObjectWriter {
            out: String::from("{"),
            empty: true,
        }
    }

    fn key(&mut self, key: &str) {
        if !self.empty {
            self.out.push(',');
        }
        self.empty = false;
        push_json_string(&mut self.out, key);
        self.out.push(':');
    }

    /// A string member.
    pub fn string(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        push_json_string(&mut self.out, value);
        self
    }

    /// An unsigned integer member.
    pub fn number(&mut self, key: &str, value: u64) -> &mut Self {
        self.key(key);
        self.out.push_str(&value.to_string());
        self
    }

    /// A boolean member.
    pub fn boolean(&mut self, key: &str, value: bool) -> &mut Self {
        self.key(key);
        self.out.push_str(if value { "true" } else { "false" });
        self
    }

    /// A member whose value is already JSON text (emitted byte for byte).
    pub fn raw(&mut self, key: &str, json: &str) -> &mut Self {
        self.key(key);
        self.out.push_str(json);
        self
    }

    /// An array of strings.
    pub fn strings<'a>(
        &mut self,
        key: &str,
        values: impl IntoIterator<Item = &'a str>,
    ) -> &mut Self {
        self.key(key);
        self.out.push('[');
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            push_json_string(&mut self.out, v);
        }
        self.out.push(']');
        self
    }

    /// An array of unsigned integers.
    pub fn numbers(&mut self, key: &str, values: impl IntoIterator<Item = u64>) -> &mut Self {
        self.key(key);
        self.out.push('[');
        for (i, v) in values.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(&v.to_string());
        }
        self.out.push(']');
        self
    }

    /// The finished object.
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.out);
        out.push('}');
        self.empty = true;
        self.out.push('{');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn members_keep_their_exact_bytes_and_order() {
        let obj = RawObject::parse(br#" {"b": {"z":1, "a" :2}, "a":[1 ,2]} "#).unwrap();
        let keys: Vec<&str> = obj.members().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "a"]);
        assert_eq!(obj.get("b").unwrap().get(), r#"{"z":1, "a" :2}"#);
    }

    #[test]
    fn duplicates_trailing_data_and_non_objects_are_refused() {
        for bad in [
            &br#"{"a":1,"a":2}"#[..],
            br#"{"a":1} {}"#,
            br#"{"a":1}x"#,
            b"[]",
            b"null",
            b"",
            b"{",
        ] {
            assert!(
                RawObject::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_writer_emits_members_in_order_with_escaped_strings() {
        let text = ObjectWriter::new()
            .string("s", "a\"b\\c\n\u{1}é")
            .number("n", 7)
            .boolean("t", true)
            .raw("r", r#"{"x" : 1}"#)
            .strings("l", ["p", "q"])
            .finish();
        assert_eq!(
            text,
            r#"{"s":"a\"b\\c\n\u0001é","n":7,"t":true,"r":{"x" : 1},"l":["p","q"]}"#
        );
    }

    #[test]
    fn one_line_keeps_the_value_and_every_other_byte() {
        let pretty = "{\n  \"a\": \"x\\ny\",\r\n  \"b\": [1,\n2]\n}";
        let flat = one_line(pretty);
        assert!(!flat.contains('\n') && !flat.contains('\r'));
        assert_eq!(flat.len(), pretty.len());
        let a: serde_json::Value = serde_json::from_str(pretty).unwrap();
        let b: serde_json::Value = serde_json::from_str(&flat).unwrap();
        assert_eq!(a, b);
        assert!(matches!(one_line("{}"), std::borrow::Cow::Borrowed(_)));
    }

    proptest! {
        #[test]
        fn escaped_strings_parse_back_to_themselves(text in any::<String>()) {
            let mut out = String::new();
            push_json_string(&mut out, &text);
            let back: String = serde_json::from_str(&out).unwrap();
            prop_assert_eq!(back, text);
        }
    }
}
