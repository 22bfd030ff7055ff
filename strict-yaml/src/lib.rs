//! YAML loading for every file the flow, runnable and workflow crates read (`flow.yaml`,
//! `service.yaml`, `runnable.yaml`, run programs). Owns the one parser (`saphyr-parser`, YAML 1.2) and the rules every
//! document is held to: a single document; scalar keys only; a key given twice in one
//! mapping is refused naming both lines; aliases are expanded under a node budget; only the
//! core-schema tags are understood. Each node keeps its line and column, and each scalar keeps
//! the exact text the author wrote beside the value it resolves to (`1.10` stays `1.10`).
//!
//! It must never interpret a document's meaning (which keys exist, which types they take):
//! the readers of each file format do that over [`Node`] (or over [`Value`], the plain tree
//! the flow manifest walks).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

/// The most nodes one document may hold, aliases expanded (a bound against alias bombs).
pub const MAX_NODES: usize = 100_000;
/// The deepest nesting of collections a document may have.
pub const MAX_DEPTH: usize = 64;

/// Why a document was refused. `line` is 1-based, `column` 1-based.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct YamlError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// A node of a loaded document, with where it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    /// 1-based line of the node's first character.
    pub line: usize,
    /// 1-based column of the node's first character.
    pub column: usize,
}

/// What a node is.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Scalar(Scalar),
    Sequence(Vec<Node>),
    /// Entries in document order; keys are scalars and unique.
    Mapping(Vec<(Node, Node)>),
}

/// A scalar: the text as written (after quoting and escapes are undone) and what YAML 1.2's
/// core schema resolves it to.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub text: String,
    pub resolved: Resolved,
}

/// The core-schema type of a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resolved {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    /// A string: any quoted or block scalar, and any plain scalar that is nothing else.
    Str,
}

impl Node {
    /// The scalar, if this node is one.
    pub fn scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            NodeKind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// The text of a scalar that resolved to a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar(Scalar {
                text,
                resolved: Resolved::Str,
            }) => Some(text),
            _ => None,
        }
    }

    /// True for a null scalar (`~`, `null` or nothing).
    pub fn is_null(&self) -> bool {
        matches!(
            self.kind,
            NodeKind::Scalar(Scalar {
                resolved: Resolved::Null,
                ..
            })
        )
    }

    /// The entries, if this node is a mapping.
    pub fn entries(&self) -> Option<&[(Node, Node)]> {
        match &self.kind {
            NodeKind::Mapping(m) => Some(m),
            _ => None,
        }
    }

    /// The items, if this node is a sequence.
    pub fn items(&self) -> Option<&[Node]> {
        match &self.kind {
            NodeKind::Sequence(s) => Some(s),
            _ => None,
        }
    }

    /// The value of key `key` of a mapping (keys are compared by their text).
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entries()?
            .iter()
            .find(|(k, _)| k.scalar().is_some_and(|s| s.text == key))
            .map(|(_, v)| v)
    }

    /// A short description of the node's type, for messages ("a mapping", "the number 3").
    pub fn describe(&self) -> String {
        match &self.kind {
            NodeKind::Sequence(_) => "a list".into(),
            NodeKind::Mapping(_) => "a mapping".into(),
            NodeKind::Scalar(s) => match s.resolved {
                Resolved::Null => "null".into(),
                Resolved::Bool(b) => format!("the boolean {b}"),
                Resolved::Int(_) | Resolved::Float(_) => format!("the number {}", s.text),
                Resolved::Str => format!("the string {:?}", s.text),
            },
        }
    }
}

/// Loads one YAML document. An empty stream is a null node at line 1.
pub fn load(text: &str) -> Result<Node, YamlError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    let mut documents = 0usize;
    for next in &mut parser {
        let (event, span) = next.map_err(|e| YamlError {
            line: e.marker().line(),
            column: e.marker().col() + 1,
            message: e.info().to_owned(),
        })?;
        match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(at(
                        span,
                        "a file holds one YAML document; found a second `---`",
                    ));
                }
            }
            Event::Alias(id) => builder.alias(id, span)?,
            Event::Scalar(value, style, anchor, tag) => {
                let node = scalar_node(&value, style, tag.as_deref(), span)?;
                builder.push(node, anchor, span)?;
            }
            Event::SequenceStart(anchor, tag) => {
                check_collection_tag(tag.as_deref(), "seq", span)?;
                builder.open(Open::Sequence(Vec::new()), anchor, span)?;
            }
            Event::MappingStart(anchor, tag) => {
                check_collection_tag(tag.as_deref(), "map", span)?;
                builder.open(Open::Mapping(Vec::new(), None), anchor, span)?;
            }
            Event::SequenceEnd | Event::MappingEnd => builder.close(span)?,
        }
    }
    Ok(builder.root.unwrap_or(Node {
        kind: NodeKind::Scalar(Scalar {
            text: String::new(),
            resolved: Resolved::Null,
        }),
        line: 1,
        column: 1,
    }))
}

fn at(span: Span, message: impl Into<String>) -> YamlError {
    YamlError {
        line: span.start.line(),
        column: span.start.col() + 1,
        message: message.into(),
    }
}

enum Open {
    Sequence(Vec<Node>),
    /// Entries so far and a key waiting for its value.
    Mapping(Vec<(Node, Node)>, Option<Node>),
}

struct Frame {
    open: Open,
    anchor: usize,
    line: usize,
    column: usize,
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    root: Option<Node>,
    nodes: usize,
}

impl Builder {
    fn count(&mut self, n: usize, span: Span) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(n);
        if self.nodes > MAX_NODES {
            return Err(at(
                span,
                format!("the document holds more than {MAX_NODES} nodes (aliases expanded)"),
            ));
        }
        Ok(())
    }

    fn open(&mut self, open: Open, anchor: usize, span: Span) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(at(
                span,
                format!("collections nest deeper than {MAX_DEPTH} levels"),
            ));
        }
        self.count(1, span)?;
        self.stack.push(Frame {
            open,
            anchor,
            line: span.start.line(),
            column: span.start.col() + 1,
        });
        Ok(())
    }

    fn close(&mut self, span: Span) -> Result<(), YamlError> {
        let Some(frame) = self.stack.pop() else {
            return Err(at(span, "a collection ends that never started"));
        };
        let kind = match frame.open {
            Open::Sequence(items) => NodeKind::Sequence(items),
            Open::Mapping(entries, None) => NodeKind::Mapping(entries),
            Open::Mapping(_, Some(key)) => {
                return Err(YamlError {
                    line: key.line,
                    column: key.column,
                    message: "a key has no value".into(),
                });
            }
        };
        let node = Node {
            kind,
            line: frame.line,
            column: frame.column,
        };
        self.place(node, frame.anchor)
    }

    fn push(&mut self, node: Node, anchor: usize, span: Span) -> Result<(), YamlError> {
        self.count(1, span)?;
        self.place(node, anchor)
    }

    fn alias(&mut self, id: usize, span: Span) -> Result<(), YamlError> {
        let Some(target) = self.anchors.get(&id).cloned() else {
            return Err(at(
                span,
                "an alias names an anchor that is not defined before it",
            ));
        };
        self.count(size(&target), span)?;
        let node = relocate(target, span.start.line(), span.start.col() + 1);
        self.place(node, 0)
    }

    fn place(&mut self, node: Node, anchor: usize) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some(Frame {
                open: Open::Sequence(items),
                ..
            }) => {
                items.push(node);
                Ok(())
            }
            Some(Frame {
                open: Open::Mapping(entries, pending),
                ..
            }) => match pending.take() {
                Some(key) => {
                    entries.push((key, node));
                    Ok(())
                }
                None => {
                    let Some(key) = node.scalar() else {
                        return Err(YamlError {
                            line: node.line,
                            column: node.column,
                            message: "a mapping key must be a plain value, not a list or mapping"
                                .into(),
                        });
                    };
                    if let Some((first, _)) = entries
                        .iter()
                        .find(|(k, _)| k.scalar().is_some_and(|s| same_key(s, key)))
                    {
                        return Err(YamlError {
                            line: node.line,
                            column: node.column,
                            message: format!(
                                "duplicate key `{}` (first given on line {})",
                                key.text, first.line
                            ),
                        });
                    }
                    *pending = Some(node);
                    Ok(())
                }
            },
        }
    }
}

fn same_key(a: &Scalar, b: &Scalar) -> bool {
    match (a.resolved, b.resolved) {
        (Resolved::Str, Resolved::Str) => a.text == b.text,
        (Resolved::Null, Resolved::Null) => true,
        (Resolved::Bool(x), Resolved::Bool(y)) => x == y,
        (Resolved::Int(x), Resolved::Int(y)) => x == y,
        (Resolved::Float(x), Resolved::Float(y)) => x == y,
        _ => false,
    }
}

fn size(node: &Node) -> usize {
    match &node.kind {
        NodeKind::Scalar(_) => 1,
        NodeKind::Sequence(items) => 1 + items.iter().map(size).sum::<usize>(),
        NodeKind::Mapping(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| size(k) + size(v))
                .sum::<usize>()
        }
    }
}

/// An alias's copy reports the alias's own position at its top.
fn relocate(mut node: Node, line: usize, column: usize) -> Node {
    node.line = line;
    node.column = column;
    node
}

fn core_tag(tag: &Tag) -> Option<&str> {
    if tag.is_yaml_core_schema() {
        Some(tag.suffix.as_str())
    } else {
        None
    }
}

fn check_collection_tag(tag: Option<&Tag>, expected: &str, span: Span) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        Some(t) if core_tag(t) == Some(expected) => Ok(()),
        Some(t) => Err(at(span, format!("the tag `{t}` is not supported here"))),
    }
}

fn scalar_node(
    value: &str,
    style: ScalarStyle,
    tag: Option<&Tag>,
    span: Span,
) -> Result<Node, YamlError> {
    let text = value.to_owned();
    let resolved = match tag {
        None if style == ScalarStyle::Plain => resolve_plain(&text),
        None => Resolved::Str,
        Some(t) => match core_tag(t) {
            Some("str") => Resolved::Str,
            Some(kind @ ("int" | "float" | "bool" | "null")) => {
                let r = resolve_plain(&text);
                let fits = matches!(
                    (kind, r),
                    ("int", Resolved::Int(_))
                        | ("float", Resolved::Float(_) | Resolved::Int(_))
                        | ("bool", Resolved::Bool(_))
                        | ("null", Resolved::Null)
                );
                if !fits {
                    return Err(at(span, format!("`{text}` is not a valid !!{kind}")));
                }
                match (kind, r) {
                    ("float", Resolved::Int(i)) => Resolved::Float(i as f64),
                    _ => r,
                }
            }
            _ => return Err(at(span, format!("the tag `{t}` is not supported"))),
        },
    };
    Ok(Node {
        kind: NodeKind::Scalar(Scalar { text, resolved }),
        line: span.start.line(),
        column: span.start.col() + 1,
    })
}

/// YAML 1.2 core-schema resolution of a plain scalar.
fn resolve_plain(text: &str) -> Resolved {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "true" | "True" | "TRUE" => return Resolved::Bool(true),
        "false" | "False" | "FALSE" => return Resolved::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    if let Some(oct) = text.strip_prefix("0o") {
        if !oct.is_empty() && oct.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return i64::from_str_radix(oct, 8).map_or(Resolved::Str, Resolved::Int);
        }
        return Resolved::Str;
    }
    if let Some(hex) = text.strip_prefix("0x") {
        if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return i64::from_str_radix(hex, 16).map_or(Resolved::Str, Resolved::Int);
        }
        return Resolved::Str;
    }
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return match text.parse::<i64>() {
            Ok(i) => Resolved::Int(i),
            Err(_) => text.parse::<f64>().map_or(Resolved::Str, Resolved::Float),
        };
    }
    if is_float(digits) {
        return text.parse::<f64>().map_or(Resolved::Str, Resolved::Float);
    }
    Resolved::Str
}

/// `( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?` without the sign.
fn is_float(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => {
            int.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
                && (!int.is_empty() || !frac.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
    };
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['-', '+']).unwrap_or(e);
        !e.is_empty() && e.bytes().all(|b| b.is_ascii_digit())
    });
    mantissa_ok && exponent_ok && (mantissa.contains('.') || exponent.is_some())
}

// ---- the plain tree ---------------------------------------------------------------------

/// A loaded document without positions: the shape the flow manifest walks.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Sequence(Vec<Value>),
    Mapping(Mapping),
}

/// A number as written, with its value.
#[derive(Debug, Clone, PartialEq)]
pub struct Number {
    text: String,
    value: NumberValue,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum NumberValue {
    Int(i64),
    Float(f64),
}

impl Number {
    /// The value, if it is a whole number that fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self.value {
            NumberValue::Int(i) => u64::try_from(i).ok(),
            NumberValue::Float(_) => None,
        }
    }

    /// The value, if it is a whole number.
    pub fn as_i64(&self) -> Option<i64> {
        match self.value {
            NumberValue::Int(i) => Some(i),
            NumberValue::Float(_) => None,
        }
    }

    pub fn as_f64(&self) -> f64 {
        match self.value {
            NumberValue::Int(i) => i as f64,
            NumberValue::Float(f) => f,
        }
    }
}

/// Shows the number exactly as the author wrote it.
impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A mapping in document order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Mapping {
    entries: Vec<(Value, Value)>,
}

impl Mapping {
    /// The value of the string key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries
            .iter()
            .find(|(k, _)| matches!(k, Value::String(s) if s == key))
            .map(|(_, v)| v)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Value> {
        self.entries.iter().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Value, &Value)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl<'a> IntoIterator for &'a Mapping {
    type Item = (&'a Value, &'a Value);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (Value, Value)>,
        fn(&'a (Value, Value)) -> (&'a Value, &'a Value),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter().map(|(k, v)| (k, v))
    }
}

impl From<&Node> for Value {
    fn from(node: &Node) -> Value {
        match &node.kind {
            NodeKind::Scalar(s) => match s.resolved {
                Resolved::Null => Value::Null,
                Resolved::Bool(b) => Value::Bool(b),
                Resolved::Int(i) => Value::Number(Number {
                    text: s.text.clone(),
                    value: NumberValue::Int(i),
                }),
                Resolved::Float(f) => Value::Number(Number {
                    text: s.text.clone(),
                    value: NumberValue::Float(f),
                }),
                Resolved::Str => Value::String(s.text.clone()),
            },
            NodeKind::Sequence(items) => Value::Sequence(items.iter().map(Value::from).collect()),
            NodeKind::Mapping(entries) => Value::Mapping(Mapping {
                entries: entries
                    .iter()
                    .map(|(k, v)| (Value::from(k), Value::from(v)))
                    .collect(),
            }),
        }
    }
}

/// Loads one document as a plain [`Value`] tree.
pub fn load_value(text: &str) -> Result<Value, YamlError> {
    load(text).map(|n| Value::from(&n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duplicate_key_is_refused_naming_both_lines() {
        let err = load("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.line, 3);
        assert!(err.message.contains("duplicate key `a`"), "{err}");
        assert!(err.message.contains("line 1"), "{err}");
    }

    #[test]
    fn a_duplicate_key_inside_a_nested_flow_mapping_is_refused() {
        let err = load("outer:\n  inner: {x: 1, x: 2}\n").unwrap_err();
        assert_eq!(err.line, 2);
    }

    #[test]
    fn plain_scalars_keep_their_text_beside_what_they_resolve_to() {
        let doc = load("version: 1.10\nname: no\nport: 0x1F\nq: '7'\n").unwrap();
        let v = doc.get("version").unwrap().scalar().unwrap();
        assert_eq!(v.text, "1.10");
        assert!(matches!(v.resolved, Resolved::Float(_)));
        assert_eq!(doc.get("name").unwrap().as_str(), Some("no"));
        assert!(matches!(
            doc.get("port").unwrap().scalar().unwrap().resolved,
            Resolved::Int(31)
        ));
        assert_eq!(doc.get("q").unwrap().as_str(), Some("7"));
    }

    #[test]
    fn nodes_carry_one_based_lines_and_columns() {
        let doc = load("a:\n  b: [1, 2]\n").unwrap();
        let b = doc.get("a").unwrap().get("b").unwrap();
        assert_eq!((b.line, b.column), (2, 6));
    }

    #[test]
    fn a_second_document_is_refused() {
        assert!(load("a: 1\n---\nb: 2\n").is_err());
    }

    #[test]
    fn a_syntax_error_carries_its_position() {
        let err = load("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(err.line >= 1, "{err}");
    }

    #[test]
    fn aliases_expand_under_a_budget() {
        let doc = load("base: &b {x: 1}\nuse: *b\n").unwrap();
        assert_eq!(
            doc.get("use")
                .unwrap()
                .get("x")
                .unwrap()
                .scalar()
                .unwrap()
                .text,
            "1"
        );
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for c in 'b'..='h' {
            bomb.push_str(&format!(
                "{c}: &{c} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = c;
        }
        let err = load(&bomb).unwrap_err();
        assert!(err.message.contains("nodes"), "{err}");
    }

    #[test]
    fn unknown_tags_are_refused_and_core_tags_apply() {
        assert!(load("a: !custom x\n").is_err());
        let doc = load("a: !!str 12\n").unwrap();
        assert_eq!(doc.get("a").unwrap().as_str(), Some("12"));
        assert!(load("a: !!int nope\n").is_err());
    }

    #[test]
    fn the_plain_tree_shows_numbers_as_written() {
        let v = load_value("n: 1.10\nm: 3\n").unwrap();
        let Value::Mapping(m) = v else { panic!() };
        let Some(Value::Number(n)) = m.get("n") else {
            panic!()
        };
        assert_eq!(n.to_string(), "1.10");
        let Some(Value::Number(m3)) = m.get("m") else {
            panic!()
        };
        assert_eq!(m3.as_u64(), Some(3));
    }

    #[test]
    fn core_schema_resolution() {
        for (t, want) in [
            ("~", Resolved::Null),
            ("", Resolved::Null),
            ("True", Resolved::Bool(true)),
            ("yes", Resolved::Str),
            ("-12", Resolved::Int(-12)),
            ("1e3", Resolved::Float(1000.0)),
            ("1.", Resolved::Float(1.0)),
            (".5", Resolved::Float(0.5)),
            ("1.2.3", Resolved::Str),
            ("0o17", Resolved::Int(15)),
            ("12abc", Resolved::Str),
        ] {
            assert_eq!(resolve_plain(t), want, "{t:?}");
        }
    }
}
