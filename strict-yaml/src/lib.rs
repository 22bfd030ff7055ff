//! YAML for every file the flow, runnable and workflow crates read (`flow.yaml`,
//! `service.yaml`, `runnable.yaml`, workflow programs and their answer schemas).
//!
//! It owns three things, one module each:
//! - the loaded document ([`node`]): every node with its line and column, every scalar with
//!   the exact text written beside what it resolves to, so `1.10` stays `1.10`;
//! - the one parser and the rules every document is held to ([`load`](mod@load)): a single
//!   document, scalar keys only, a key given twice in one mapping refused naming both lines,
//!   aliases expanded under a node budget, bounded nesting, core-schema tags only;
//! - the typed reader every format reads a document with ([`read`]): a mapping checked
//!   against the keys a format allows and requires, typed accessors, and typed problems with
//!   line, column and key path that each format maps to its own codes and words.
//!
//! It must never know any file format: which keys exist, what they mean, which codes and
//! words a refusal uses, or whether a format stops at its first problem. Those belong to the
//! readers in `flow`, `runnable` and `workflow`.

#![forbid(unsafe_code)]

pub mod load;
pub mod node;
pub mod read;

pub use load::{MAX_DEPTH, MAX_NODES, YamlError, load};
pub use node::{Node, NodeKind, Resolved, Scalar};
pub use read::{Map, Problem, ProblemKind, Report};
