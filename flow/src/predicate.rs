//! The readiness vocabulary: the named predicates a started service must pass (lifecycle,
//! runner, tcp-connect, http-status, grpc-health, listener, completion) and the verdict of the
//! first one that did not hold. Readiness probes with them, the supervisor and events report
//! them, and a flow error carries the verdict.
//!
//! This module owns those two types only. It must never probe, wait or decide anything.

use wire_enum::wire_enum;

wire_enum! {
    /// A named readiness requirement.
    pub enum Predicate {
        /// The service's Start action returned successfully.
        Lifecycle = "lifecycle",
        /// The started process is still alive (or, for a service with no endpoints, exited 0).
        Runner = "runner",
        /// The endpoint accepts a TCP connection.
        TcpConnect = "tcp-connect",
        /// The endpoint's declared health path answers without a server error (5xx).
        HttpStatus = "http-status",
        /// The endpoint's `grpc.health.v1` service reports SERVING (or is unimplemented).
        GrpcHealth = "grpc-health",
        /// Whatever answers on the endpoint's port is a process of the service's own process
        /// group, not a squatter that took the port.
        Listener = "listener",
        /// A one-shot job exited with status 0.
        Completion = "completion",
    }
    kind = "predicate";
}

/// The first requirement that did not hold, with the last error it gave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {predicate} failed: {last_error}", service, endpoint.as_ref().map(|e| format!("/{e}")).unwrap_or_default())]
pub struct ReadinessFailure {
    pub service: String,
    pub endpoint: Option<String>,
    pub predicate: Predicate,
    pub last_error: String,
}
