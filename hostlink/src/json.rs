//! JSON building blocks shared by the frame codec and the records. Owns the writer that emits
//! objects with a fixed member order and the one-line rule of outbound text; names the raw
//! strict object ([`RawObject`]), read by the store's one strict reader with every member kept
//! as the exact bytes it arrived as. Never interprets a member: callers do.

use serde_json::value::RawValue;
use sessionstore::wire::StrictObject;

/// A JSON object whose members are kept as raw JSON text, in order: the store's one strict
/// object reader ([`StrictObject`]: one object, duplicate members refused, no trailing data)
/// keeping every member's exact bytes.
pub type RawObject = StrictObject<Box<RawValue>>;

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
