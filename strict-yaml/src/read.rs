//! The typed reader every file format reads a loaded [`Node`] tree with: a mapping checked
//! against the keys a format allows and requires, and typed accessors (a string as written,
//! any scalar as written, a boolean, a bounded integer, a finite number, a duration, a list,
//! a mapping, "absent or null"). A read that does not fit gives a typed [`Problem`] with the
//! line, column and key path of the node it is about.
//!
//! A problem says what happened, typed; each format maps it to its own codes and words (a
//! wrong-type problem carries the format's own sentence for what belongs there). Formats that
//! report every problem of a file hand them to their [`Report`]; formats that stop at the
//! first turn the first into their own error.
//!
//! This module must never know a format's keys, codes or wording, and it must never decide
//! whether a format stops at the first problem or collects them all.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::node::{Node, Resolved, Scalar};

/// Where a wrong-type sentence names what was found instead (`must be a list, not {found}`).
pub const FOUND: &str = "{found}";

/// One way a node does not fit what a format reads it as.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {}{}", if path.is_empty() { String::new() } else { format!("`{path}`: ") }, self.message())]
pub struct Problem {
    /// 1-based line of the node the problem is about.
    pub line: usize,
    /// 1-based column of that node.
    pub column: usize,
    /// The key path the reader was given for the node (`input.properties.qty`, `args[2]`),
    /// empty for the document itself.
    pub path: String,
    pub kind: ProblemKind,
}

/// What went wrong, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProblemKind {
    /// A value of the wrong YAML type: a list where a mapping belongs, a null where a list
    /// belongs. `expected` is the reading format's own sentence; a [`FOUND`] in it stands for
    /// `found`, the description of what is there ([`Node::describe`]).
    WrongType {
        expected: &'static str,
        found: String,
    },
    /// A key the mapping may not have; the problem is at the key.
    UnknownKey {
        key: String,
        allowed: &'static [&'static str],
    },
    /// A key the mapping must have; the problem is at the mapping.
    MissingKey { key: String },
    /// Text that is not a duration (humantime's syntax: `500ms`, `30s`, `2m`).
    Duration { text: String, reason: String },
    /// A rule only the reading format knows, under that format's own code.
    Format { code: &'static str, message: String },
}

impl Problem {
    /// A problem about `node`, at its position.
    pub fn at(node: &Node, path: impl Into<String>, kind: ProblemKind) -> Problem {
        Problem {
            line: node.line,
            column: node.column,
            path: path.into(),
            kind,
        }
    }

    /// `node` is not what `expected` (the format's sentence) says belongs at `path`.
    pub fn wrong_type(node: &Node, path: impl Into<String>, expected: &'static str) -> Problem {
        Problem::at(
            node,
            path,
            ProblemKind::WrongType {
                expected,
                found: node.describe(),
            },
        )
    }

    /// `node` breaks a rule of the reading format, named by the format's own `code`.
    pub fn format(
        node: &Node,
        path: impl Into<String>,
        code: &'static str,
        message: impl Into<String>,
    ) -> Problem {
        Problem::at(
            node,
            path,
            ProblemKind::Format {
                code,
                message: message.into(),
            },
        )
    }

    /// The same problem filed under a code of the reading format, in the same words (for a
    /// format that files, say, every problem of one block under that block's code).
    pub fn under(self, code: &'static str) -> Problem {
        let message = self.message();
        Problem {
            kind: ProblemKind::Format { code, message },
            ..self
        }
    }

    /// The problem in words, without its position or path. A wrong type reads as the
    /// format's sentence; the other kinds have plain default words a format may replace.
    pub fn message(&self) -> String {
        match &self.kind {
            ProblemKind::WrongType { expected, found } => expected.replace(FOUND, found),
            ProblemKind::UnknownKey { allowed, .. } => {
                format!("unknown key (allowed: {})", allowed.join(", "))
            }
            ProblemKind::MissingKey { key } => format!("the required member `{key}` is missing"),
            ProblemKind::Duration { text, reason } => {
                format!("`{text}` is not a duration like 500ms, 30s or 2m ({reason})")
            }
            ProblemKind::Format { message, .. } => message.clone(),
        }
    }
}

/// Where a format that reports every problem of a file at once collects them.
pub trait Report {
    fn report(&mut self, problem: Problem);

    /// The value of a read that fitted; the problem of one that did not is reported.
    fn keep<T>(&mut self, read: Result<T, Problem>) -> Option<T>
    where
        Self: Sized,
    {
        match read {
            Ok(value) => Some(value),
            Err(problem) => {
                self.report(problem);
                None
            }
        }
    }
}

impl Report for Vec<Problem> {
    fn report(&mut self, problem: Problem) {
        self.push(problem);
    }
}

/// `path.key`, or `key` at the top.
pub fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

/// `path[index]`.
pub fn index(path: &str, index: usize) -> String {
    format!("{path}[{index}]")
}

/// A mapping being read, with the key path it was read at.
#[derive(Debug, Clone)]
pub struct Map<'n> {
    node: &'n Node,
    entries: &'n [(Node, Node)],
    path: String,
}

/// Reads `node` as a mapping.
pub fn mapping<'n>(node: &'n Node, path: &str, expected: &'static str) -> Result<Map<'n>, Problem> {
    match node.entries() {
        Some(entries) => Ok(Map {
            node,
            entries,
            path: path.to_owned(),
        }),
        None => Err(Problem::wrong_type(node, path, expected)),
    }
}

impl<'n> Map<'n> {
    /// The mapping node itself.
    pub fn node(&self) -> &'n Node {
        self.node
    }

    /// The key path the mapping was read at.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The key path of one of its keys.
    pub fn path_of(&self, key: &str) -> String {
        join(&self.path, key)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries (key node, value node) in document order.
    pub fn entries(&self) -> impl Iterator<Item = (&'n Node, &'n Node)> + use<'n> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    /// The value under `key`, a null included.
    pub fn get(&self, key: &str) -> Option<&'n Node> {
        self.node.get(key)
    }

    /// The value under `key` unless it is absent or null, for formats where a null means
    /// "not given". (Formats that refuse a null where a list belongs use [`Map::get`].)
    pub fn given(&self, key: &str) -> Option<&'n Node> {
        self.get(key).filter(|v| !v.is_null())
    }

    /// The value under `key`, which must be there.
    pub fn require(&self, key: &str) -> Result<&'n Node, Problem> {
        self.get(key).ok_or_else(|| self.missing_key(key))
    }

    /// Every key not in `allowed`, in document order, each a problem at the key.
    pub fn unknown(&self, allowed: &'static [&'static str]) -> impl Iterator<Item = Problem> + '_ {
        self.unknown_keys(allowed).map(move |(node, key)| {
            Problem::at(
                node,
                self.path_of(key),
                ProblemKind::UnknownKey {
                    key: key.to_owned(),
                    allowed,
                },
            )
        })
    }

    /// Every key not in `allowed`, in document order, as the key node and its text (for a
    /// format that words each place's refusal its own way).
    pub fn unknown_keys<'a>(
        &self,
        allowed: &'a [&'a str],
    ) -> impl Iterator<Item = (&'n Node, &'n str)> + use<'a, 'n> {
        let entries = self.entries;
        entries.iter().filter_map(move |(k, _)| {
            let key = k.key_text();
            (!allowed.contains(&key)).then_some((k, key))
        })
    }

    /// Every key of `required` that is absent, in the order given, each a problem at the
    /// mapping.
    pub fn missing<'a>(&'a self, required: &'a [&'a str]) -> impl Iterator<Item = Problem> + 'a {
        required
            .iter()
            .filter(|key| self.get(key).is_none())
            .map(|key| self.missing_key(key))
    }

    fn missing_key(&self, key: &str) -> Problem {
        Problem::at(
            self.node,
            self.path_of(key),
            ProblemKind::MissingKey {
                key: key.to_owned(),
            },
        )
    }
}

/// Reads `node` as a list.
pub fn sequence<'n>(
    node: &'n Node,
    path: &str,
    expected: &'static str,
) -> Result<&'n [Node], Problem> {
    node.items()
        .ok_or_else(|| Problem::wrong_type(node, path, expected))
}

/// Reads `node` as a string, the text as written (`'7'` is "7"; a plain `7` is a number, not
/// a string).
pub fn string<'n>(node: &'n Node, path: &str, expected: &'static str) -> Result<&'n str, Problem> {
    node.as_str()
        .ok_or_else(|| Problem::wrong_type(node, path, expected))
}

/// Reads `node` as any scalar but null (a string, number or boolean), kept as written:
/// `version: 1.10` stays `1.10`.
pub fn text<'n>(node: &'n Node, path: &str, expected: &'static str) -> Result<&'n Scalar, Problem> {
    match node.scalar() {
        Some(s) if s.resolved != Resolved::Null => Ok(s),
        _ => Err(Problem::wrong_type(node, path, expected)),
    }
}

/// Reads `node` as `true` or `false`.
pub fn boolean(node: &Node, path: &str, expected: &'static str) -> Result<bool, Problem> {
    match node.scalar().map(|s| s.resolved) {
        Some(Resolved::Bool(b)) => Ok(b),
        _ => Err(Problem::wrong_type(node, path, expected)),
    }
}

/// Reads `node` as a whole number within `range`; one outside it is refused like any other
/// wrong value, so `expected` should name the range.
pub fn integer(
    node: &Node,
    path: &str,
    range: RangeInclusive<i64>,
    expected: &'static str,
) -> Result<i64, Problem> {
    match node.scalar().map(|s| s.resolved) {
        Some(Resolved::Int(i)) if range.contains(&i) => Ok(i),
        _ => Err(Problem::wrong_type(node, path, expected)),
    }
}

/// Reads `node` as a finite number, whole or not.
pub fn number(node: &Node, path: &str, expected: &'static str) -> Result<f64, Problem> {
    match node.scalar().map(|s| s.resolved) {
        Some(Resolved::Int(i)) => Ok(i as f64),
        Some(Resolved::Float(f)) if f.is_finite() => Ok(f),
        _ => Err(Problem::wrong_type(node, path, expected)),
    }
}

/// Parses `text`, read from `node` by the format's own rule for which scalars may hold a
/// duration, as a duration (`0`, `500ms`, `30s`, `1h 30m`).
pub fn duration(node: &Node, path: &str, text: &str) -> Result<Duration, Problem> {
    humantime::parse_duration(text).map_err(|e| {
        Problem::at(
            node,
            path,
            ProblemKind::Duration {
                text: text.to_owned(),
                reason: e.to_string(),
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::load;

    fn doc(text: &str) -> Node {
        load(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_mapping_names_its_unknown_keys_at_the_key_and_its_missing_keys_at_itself() {
        let d = doc("name: a\ncolour: red\n");
        let map = mapping(&d, "", "must be a mapping").unwrap();
        let unknown: Vec<Problem> = map.unknown(&["name", "size"]).collect();
        assert_eq!(unknown.len(), 1);
        assert_eq!((unknown[0].line, unknown[0].column), (2, 1));
        assert_eq!(unknown[0].path, "colour");
        assert_eq!(unknown[0].message(), "unknown key (allowed: name, size)");
        let missing: Vec<Problem> = map.missing(&["name", "size"]).collect();
        assert_eq!(missing.len(), 1);
        assert_eq!((missing[0].line, missing[0].path.as_str()), (1, "size"));
        assert!(matches!(&missing[0].kind, ProblemKind::MissingKey { key } if key == "size"));
    }

    #[test]
    fn a_wrong_type_reads_as_the_format_sentence_naming_what_was_found() {
        let d = doc("args: ~\n");
        let args = d.get("args").unwrap();
        let err = sequence(args, "args", "must be a list, not {found}").unwrap_err();
        assert_eq!(err.message(), "must be a list, not null");
        assert_eq!(
            err.to_string(),
            "line 1, column 7: `args`: must be a list, not null"
        );
        let err = sequence(args, "args", "must be a list").unwrap_err();
        assert_eq!(err.message(), "must be a list");
    }

    #[test]
    fn absent_and_null_are_both_not_given_but_only_absent_is_missing() {
        let d = doc("a: ~\nb: 1\n");
        let map = mapping(&d, "top", "").unwrap();
        assert!(map.given("a").is_none() && map.get("a").is_some());
        assert!(map.given("b").is_some());
        assert_eq!(map.require("c").unwrap_err().path, "top.c");
    }

    #[test]
    fn scalars_are_read_as_written_and_typed() {
        let d = doc("v: 1.10\ns: '7'\nn: 7\nb: true\nf: .inf\nneg: -1\nt: 250ms\n");
        let get = |k: &str| d.get(k).unwrap();
        assert_eq!(text(get("v"), "v", "").unwrap().text, "1.10");
        assert_eq!(string(get("s"), "s", "").unwrap(), "7");
        assert!(string(get("n"), "n", "").is_err());
        assert!(boolean(get("b"), "b", "").unwrap());
        assert!(number(get("f"), "f", "").is_err());
        assert_eq!(number(get("n"), "n", "").unwrap(), 7.0);
        assert!(integer(get("neg"), "neg", 0..=10, "").is_err());
        assert_eq!(integer(get("n"), "n", 0..=10, "").unwrap(), 7);
        assert_eq!(
            duration(get("t"), "t", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        let err = duration(get("s"), "s", "soon").unwrap_err();
        assert!(matches!(err.kind, ProblemKind::Duration { .. }), "{err}");
    }

    #[test]
    fn a_report_keeps_the_value_of_a_fitting_read_and_the_problem_of_another() {
        let d = doc("a: x\n");
        let mut problems: Vec<Problem> = Vec::new();
        let a = d.get("a").unwrap();
        assert_eq!(problems.keep(string(a, "a", "")), Some("x"));
        assert_eq!(
            problems.keep(boolean(a, "a", "must be true or false")),
            None
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a.b");
        assert_eq!(index("a", 2), "a[2]");
    }
}
