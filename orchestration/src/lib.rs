//! Orchestration for Host: local multi-service *flows* (a dependency graph of native
//! processes started in order, probed for readiness, supervised and torn down in reverse
//! layers) and *runnables* (typed, versioned finite operations: declared, packaged under a
//! digest, invoked with honest outcome classes, offered to agents as tools). `yaml` is the one
//! YAML loader both read their files with. Workflow runs come later beside them.
//!
//! This crate owns nothing of a running Host: it must never depend on `host` or reach a
//! session store.

#![forbid(unsafe_code)]

pub mod flow;
pub mod runnable;
pub mod yaml;
