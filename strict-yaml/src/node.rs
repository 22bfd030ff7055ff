//! The loaded document: nodes with their 1-based line and column, scalars with the exact text
//! the author wrote beside what YAML 1.2's core schema resolves them to.
//!
//! This module owns the shape of a loaded document and the plain questions about one node
//! (is it a mapping, what is under a key, how to name its type in a message). It must never
//! parse text, and it must never judge a value against a file format.

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
            .find(|(k, _)| k.key_text() == key)
            .map(|(_, v)| v)
    }

    /// The text of a mapping key as written (every key is a scalar; anything else is "").
    pub fn key_text(&self) -> &str {
        self.scalar().map(|s| s.text.as_str()).unwrap_or_default()
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
