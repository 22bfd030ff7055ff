//! Where each part of a JSON text lies: a small scanner that records the byte span of every
//! value and object member, so a projection can remove a member and keep every other byte of
//! the text (spacing, escapes, number spelling, member order). It reads text that has already
//! been parsed as JSON; on anything it does not understand it answers `None` and the caller
//! falls back to re-serialising.

use std::ops::Range;

/// One value of a JSON text, by span.
#[derive(Debug)]
pub enum Node {
    Object {
        span: Range<usize>,
        members: Vec<Member>,
    },
    Array {
        span: Range<usize>,
        items: Vec<Node>,
    },
    /// A string, with the span of its quotes included.
    String { span: Range<usize> },
    /// A number, `true`, `false` or `null`.
    Scalar { span: Range<usize> },
}

/// One object member: the key's span (quotes included) and its value.
#[derive(Debug)]
pub struct Member {
    pub key: Range<usize>,
    pub value: Node,
}

impl Node {
    pub fn span(&self) -> Range<usize> {
        match self {
            Node::Object { span, .. }
            | Node::Array { span, .. }
            | Node::String { span }
            | Node::Scalar { span } => span.clone(),
        }
    }
}

/// Scans one JSON document; `None` if it is not one.
pub fn scan(text: &str) -> Option<Node> {
    let mut s = Scanner {
        b: text.as_bytes(),
        i: 0,
        depth: 0,
    };
    let node = s.value()?;
    s.ws();
    (s.i == s.b.len()).then_some(node)
}

/// How deep a document may nest before the scanner gives up (serde_json's own limit).
const MAX_DEPTH: usize = 128;

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    depth: usize,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn value(&mut self) -> Option<Node> {
        self.ws();
        match self.peek()? {
            b'{' => self.object(),
            b'[' => self.array(),
            b'"' => self.string().map(|span| Node::String { span }),
            _ => self.scalar(),
        }
    }

    fn string(&mut self) -> Option<Range<usize>> {
        let start = self.i;
        self.i += 1;
        loop {
            match self.peek()? {
                b'"' => {
                    self.i += 1;
                    return Some(start..self.i);
                }
                b'\\' => self.i += 2,
                _ => self.i += 1,
            }
        }
    }

    fn scalar(&mut self) -> Option<Node> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || matches!(c, b'-' | b'+' | b'.') {
                self.i += 1;
            } else {
                break;
            }
        }
        (self.i > start).then_some(Node::Scalar {
            span: start..self.i,
        })
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    fn object(&mut self) -> Option<Node> {
        self.enter()?;
        let start = self.i;
        self.i += 1;
        let mut members = Vec::new();
        self.ws();
        if self.peek()? == b'}' {
            self.i += 1;
        } else {
            loop {
                self.ws();
                if self.peek()? != b'"' {
                    return None;
                }
                let key = self.string()?;
                self.ws();
                if self.peek()? != b':' {
                    return None;
                }
                self.i += 1;
                let value = self.value()?;
                members.push(Member { key, value });
                self.ws();
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => {
                        self.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(Node::Object {
            span: start..self.i,
            members,
        })
    }

    fn array(&mut self) -> Option<Node> {
        self.enter()?;
        let start = self.i;
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
        } else {
            loop {
                items.push(self.value()?);
                self.ws();
                match self.peek()? {
                    b',' => self.i += 1,
                    b']' => {
                        self.i += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.depth -= 1;
        Some(Node::Array {
            span: start..self.i,
            items,
        })
    }
}

/// The bytes to cut to remove member `i` of `members` and keep the object valid: the member
/// and the comma that separated it from a neighbour.
pub fn member_removal(members: &[Member], i: usize) -> Range<usize> {
    let this = &members[i];
    if members.len() == 1 {
        this.key.start..this.value.span().end
    } else if i + 1 < members.len() {
        this.key.start..members[i + 1].key.start
    } else {
        members[i - 1].value.span().end..this.value.span().end
    }
}

/// `text` with each range removed (ranges must not overlap).
pub fn cut(text: &str, mut ranges: Vec<Range<usize>>) -> String {
    ranges.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for r in ranges {
        out.push_str(&text[last..r.start]);
        last = r.end;
    }
    out.push_str(&text[last..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remove(text: &str, key: &str) -> String {
        let Some(Node::Object { members, .. }) = scan(text) else {
            panic!("not an object: {text}")
        };
        let i = members
            .iter()
            .position(|m| text[m.key.clone()] == format!("\"{key}\""))
            .unwrap();
        cut(text, vec![member_removal(&members, i)])
    }

    #[test]
    fn removing_a_member_keeps_every_other_byte_wherever_it_stands() {
        let text = "{ \"a\" : 1.50 ,\n \"b\":[true, \"x\\\"y\"],  \"c\":{}}";
        assert_eq!(remove(text, "a"), "{ \"b\":[true, \"x\\\"y\"],  \"c\":{}}");
        assert_eq!(remove(text, "b"), "{ \"a\" : 1.50 ,\n \"c\":{}}");
        assert_eq!(
            remove(text, "c"),
            "{ \"a\" : 1.50 ,\n \"b\":[true, \"x\\\"y\"]}"
        );
        assert_eq!(remove("{ \"only\": null }", "only"), "{  }");
    }

    #[test]
    fn what_is_not_one_json_document_is_not_scanned() {
        for bad in ["", "{", "{\"a\" 1}", "[1,", "{} {}", "\"open"] {
            assert!(scan(bad).is_none(), "{bad}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(scan(&deep).is_none());
    }
}
