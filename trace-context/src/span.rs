//! The bridge between a [`TraceContext`] and a `tracing` span. A span made to
//! [`continue_trace`] becomes a child of the caller's span in the caller's trace; [`of`] gives
//! the context a callee should receive (a runnable's `TRACEPARENT`, a model call's
//! `traceparent` header) naming the span itself. Both work through the OpenTelemetry layer the
//! binary installs; with no such layer they do nothing and [`of`] answers `None`, so library
//! code calls them unconditionally.

use std::str::FromStr;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState as OtelTraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{TraceContext, TraceParent, TraceState};

/// The target of a span that lives as long as a task (a link, a session's consumer or gate
/// publisher): it gives log lines their fields but is never exported, since a trace is one
/// piece of work. Such a span is made with `parent: None`, so what runs inside it starts or
/// continues traces of its own instead of hanging off whatever created the task.
pub const LONG_LIVED: &str = "hostd::long_lived";

/// The OpenTelemetry context that names the caller's span as a remote parent.
pub fn otel_context(ctx: &TraceContext) -> opentelemetry::Context {
    let state = ctx
        .state
        .as_ref()
        .and_then(|s| OtelTraceState::from_str(s.as_str()).ok())
        .unwrap_or_default();
    let remote = SpanContext::new(
        TraceId::from_bytes(ctx.parent.trace_id()),
        SpanId::from_bytes(ctx.parent.parent_id()),
        TraceFlags::new(ctx.parent.flags()),
        true,
        state,
    );
    opentelemetry::Context::new().with_remote_span_context(remote)
}

/// Makes `span` (not yet entered) a child of the caller's span. Without a tracing layer, or
/// for a span already started, this changes nothing: the work still runs, untraced.
pub fn continue_trace(span: &tracing::Span, ctx: &TraceContext) {
    let _ = span.set_parent(otel_context(ctx));
}

/// Makes `span` continue `ctx` when there is one.
pub fn continue_if(span: &tracing::Span, ctx: Option<&TraceContext>) {
    if let Some(ctx) = ctx {
        continue_trace(span, ctx);
    }
}

/// The context that names `span` as the parent, when a tracing layer gives it one.
pub fn of(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    let parent = TraceParent::new(
        sc.trace_id().to_bytes(),
        sc.span_id().to_bytes(),
        sc.is_sampled(),
    )
    .ok()?;
    let header = sc.trace_state().header();
    let state = if header.is_empty() {
        None
    } else {
        header.parse::<TraceState>().ok()
    };
    Some(TraceContext { parent, state })
}

/// What a callee of `span` should receive: the span's own context, or, where no tracing
/// layer records spans, the caller's context passed on unchanged (`fallback`).
pub fn for_callee(span: &tracing::Span, fallback: Option<&TraceContext>) -> Option<TraceContext> {
    of(span).or_else(|| fallback.cloned())
}

/// The context of the current span for a callee (see [`for_callee`]).
pub fn current_for_callee(fallback: Option<&TraceContext>) -> Option<TraceContext> {
    for_callee(&tracing::Span::current(), fallback)
}
