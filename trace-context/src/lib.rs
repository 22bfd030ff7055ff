//! W3C trace context (<https://www.w3.org/TR/trace-context/>) as every Host crate carries it:
//! [`TraceParent`] and [`TraceState`], parsed strictly from their header text (a malformed
//! value is refused whole, never half-read), [`TraceContext`] (the pair), and in [`span`] the
//! bridge that makes a `tracing` span continue a caller's trace or report the context a callee
//! should receive. This crate owns no exporter and no subscriber (the binary installs those);
//! it must never depend on another crate of the workspace, so that the protocol, the store and
//! the runtimes can all use the one parser.

#![forbid(unsafe_code)]

mod parent;
pub mod span;
mod state;

pub use parent::TraceParent;
pub use state::TraceState;

/// Why a trace header was refused. The code is stable; the text says which rule failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct TraceContextError {
    /// `traceparent` or `tracestate`.
    pub field: &'static str,
    pub reason: &'static str,
}

impl TraceContextError {
    /// The stable machine-readable code of every trace header refusal.
    pub const CODE: &'static str = "invalid_trace_context";

    pub fn code(&self) -> &'static str {
        Self::CODE
    }

    pub(crate) fn parent(reason: &'static str) -> TraceContextError {
        TraceContextError {
            field: "traceparent",
            reason,
        }
    }

    pub(crate) fn state(reason: &'static str) -> TraceContextError {
        TraceContextError {
            field: "tracestate",
            reason,
        }
    }
}

/// A caller's trace: where the work continues from, and the vendors' state passed along.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TraceContext {
    pub parent: TraceParent,
    pub state: Option<TraceState>,
}

impl TraceContext {
    /// From the two header values as they arrive: a `tracestate` without a `traceparent` is
    /// refused (it would describe no trace), as is either one malformed.
    pub fn from_headers(
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> Result<Option<TraceContext>, TraceContextError> {
        match (traceparent, tracestate) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(TraceContextError::state("given without a traceparent")),
            (Some(p), s) => Ok(Some(TraceContext {
                parent: p.parse()?,
                state: s.map(str::parse).transpose()?,
            })),
        }
    }

    /// The same pair from already parsed parts (a `tracestate` alone is refused).
    pub fn from_parts(
        parent: Option<TraceParent>,
        state: Option<TraceState>,
    ) -> Result<Option<TraceContext>, TraceContextError> {
        match (parent, state) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(TraceContextError::state("given without a traceparent")),
            (Some(parent), state) => Ok(Some(TraceContext { parent, state })),
        }
    }

    /// The trace id as 32 lower-case hex digits.
    pub fn trace_id_hex(&self) -> String {
        self.parent.trace_id_hex()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_tracestate_alone_is_refused() {
        let e = TraceContext::from_headers(None, Some("a=b")).unwrap_err();
        assert_eq!(e.field, "tracestate");
        assert_eq!(e.code(), "invalid_trace_context");
    }

    #[test]
    fn the_pair_is_read_whole_or_not_at_all() {
        assert_eq!(TraceContext::from_headers(None, None), Ok(None));
        let both = TraceContext::from_headers(Some(P), Some("rojo=00f067aa0ba902b7"))
            .unwrap()
            .unwrap();
        assert_eq!(both.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(both.state.unwrap().as_str(), "rojo=00f067aa0ba902b7");
        // A good parent with a broken state is refused, not kept without its state.
        assert!(TraceContext::from_headers(Some(P), Some("=x")).is_err());
    }
}
