//! Orchestration for Host: local multi-service *flows* (a dependency graph of native
//! processes started in order, probed for readiness, supervised and torn down in reverse
//! layers). Later issues add runnables and workflow runs beside `flow`.
//!
//! This crate owns nothing of a running Host: it must never depend on `host` or reach a
//! session store.

#![forbid(unsafe_code)]

pub mod flow;
pub mod runnable;
pub mod yaml;
