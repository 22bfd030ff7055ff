//! Log lines written inside a traced span carry that span's `trace_id` and `span_id`, so a
//! line found in the logs leads to its trace and back. [`WithTraceIds`] wraps the usual event
//! format: a JSON line gains the two members, a human line ends with `trace_id=… span_id=…`.
//! With no exporting layer (or outside any span) lines are unchanged.

use std::fmt;

use opentelemetry::trace::TraceContextExt;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// An event format that adds the current span's trace ids to each line.
pub struct WithTraceIds<F> {
    inner: F,
}

impl<F> WithTraceIds<F> {
    pub fn new(inner: F) -> WithTraceIds<F> {
        WithTraceIds { inner }
    }
}

/// The current span's ids as hex, when a tracing layer records it.
fn current_ids<S>(
    ctx: &FmtContext<'_, S, impl for<'a> FormatFields<'a> + 'static>,
) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let span = ctx.lookup_current()?;
    let id = span.id();
    drop(span);
    let cx = tracing::dispatcher::get_default(|d| tracing_opentelemetry::get_otel_context(&id, d))?;
    let sc = cx.span().span_context().clone();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = current_ids(ctx) else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.trim_end_matches('\n');
        if body.ends_with('}') && body.starts_with('{') {
            let open = &body[..body.len() - 1];
            writeln!(
                writer,
                "{open},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            )
        } else {
            writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}")
        }
    }
}
