//! Loading: one YAML text through the one parser (`saphyr-parser`, YAML 1.2) into a [`Node`]
//! tree, holding it to the rules every document of Host obeys: a single document; scalar keys
//! only; a key given twice in one mapping is refused naming both lines; aliases are expanded
//! under a node budget; collections nest no deeper than a bound; only the core-schema tags are
//! understood, and plain scalars resolve by the core schema.
//!
//! This module owns the parser and those rules. It must never know which keys a file format
//! has or what type they take: that is the typed reader's and the formats' business.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

use crate::node::{Node, NodeKind, Resolved, Scalar};

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
