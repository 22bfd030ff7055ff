//! Orchestration for Host: local multi-service *flows* (a dependency graph of native
//! processes started in order, probed for readiness, supervised and torn down in reverse
//! layers), *runnables* (typed, versioned finite operations: declared, packaged under a
//! digest, invoked with honest outcome classes, offered to agents as tools) and workflow
//! *runs* (durable programs of steps, validated whole and driven by replay). `yaml` is the one
//! YAML loader they read their files with.
//!
//! This crate owns nothing of a running Host: it must never depend on `host`. It reaches the
//! session store only through the run driver's seam (`run::RunJournal`, which has no way to
//! create an answer) and the store's record types.

#![forbid(unsafe_code)]

pub mod flow;
pub mod run;
pub mod runnable;
pub mod yaml;
