//! The bounded export queue between finished spans and the OTLP exporter. A span ends on
//! whatever thread ran it; [`DroppingQueue::on_end`] only tries to put it in a bounded channel
//! and, when the channel is full (a slow or absent collector), drops it and counts the drop.
//! One task on the runtime takes spans in batches and exports each batch under a timeout; a
//! batch that fails or times out is dropped and counted too. So exporting never waits on a
//! command and never grows memory past the bound.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;

use crate::ExportCounts;

/// The queue's bounds.
#[derive(Clone, Copy, Debug)]
pub struct QueueOptions {
    /// Finished spans waiting for export, at most.
    pub capacity: usize,
    /// Spans in one export request, at most.
    pub batch: usize,
    /// How long one export request may take.
    pub timeout: Duration,
}

/// How long the exporting task lets a batch fill before it sends a partial one.
const FILL_WINDOW: Duration = Duration::from_millis(200);

/// A span processor that hands finished spans to one exporting task through a bounded
/// channel, dropping (and counting) what does not fit.
#[derive(Debug)]
pub struct DroppingQueue {
    spans: mpsc::Sender<SpanData>,
    flush: mpsc::UnboundedSender<std::sync::mpsc::SyncSender<()>>,
    counts: Arc<ExportCounts>,
    timeout: Duration,
}

impl DroppingQueue {
    /// Starts the exporting task on the current tokio runtime.
    /// `resources`: a new resource for the exporter (a Host generation issued later).
    pub fn start<E: SpanExporter + 'static>(
        exporter: E,
        resources: mpsc::UnboundedReceiver<Resource>,
        options: QueueOptions,
        counts: Arc<ExportCounts>,
    ) -> DroppingQueue {
        let (spans, rx) = mpsc::channel(options.capacity.max(1));
        let (flush, flush_rx) = mpsc::unbounded_channel();
        tokio::spawn(export_loop(
            exporter,
            rx,
            flush_rx,
            resources,
            options,
            counts.clone(),
        ));
        DroppingQueue {
            spans,
            flush,
            counts,
            timeout: options.timeout,
        }
    }
}

/// Exports `batch`, counting it as exported or dropped.
async fn export<E: SpanExporter>(
    exporter: &E,
    batch: Vec<SpanData>,
    timeout: Duration,
    counts: &ExportCounts,
) {
    let n = batch.len() as u64;
    if n == 0 {
        return;
    }
    match tokio::time::timeout(timeout, exporter.export(batch)).await {
        Ok(Ok(())) => counts.exported.fetch_add(n, Ordering::Relaxed),
        _ => counts.dropped.fetch_add(n, Ordering::Relaxed),
    };
}

async fn export_loop<E: SpanExporter>(
    mut exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::UnboundedReceiver<std::sync::mpsc::SyncSender<()>>,
    mut resources: mpsc::UnboundedReceiver<Resource>,
    options: QueueOptions,
    counts: Arc<ExportCounts>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(options.batch);
    let mut resources_open = true;
    loop {
        tokio::select! {
            resource = resources.recv(), if resources_open => match resource {
                Some(r) => exporter.set_resource(&r),
                None => resources_open = false,
            },
            first = spans.recv() => {
                let Some(first) = first else { break };
                batch.push(first);
                let window = tokio::time::sleep(FILL_WINDOW);
                tokio::pin!(window);
                while batch.len() < options.batch {
                    tokio::select! {
                        next = spans.recv() => match next {
                            Some(s) => batch.push(s),
                            None => break,
                        },
                        () = &mut window => break,
                    }
                }
                export(&exporter, std::mem::take(&mut batch), options.timeout, &counts).await;
            }
            done = flushes.recv() => {
                let Some(done) = done else { break };
                while let Ok(s) = spans.try_recv() {
                    batch.push(s);
                    if batch.len() >= options.batch {
                        export(&exporter, std::mem::take(&mut batch), options.timeout, &counts)
                            .await;
                    }
                }
                export(&exporter, std::mem::take(&mut batch), options.timeout, &counts).await;
                let _ = done.send(());
            }
        }
    }
}

impl SpanProcessor for DroppingQueue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Exports what is queued; waits at most the export timeout (twice: the queue, then one
    /// request). Never call it from inside the runtime's own task.
    fn force_flush(&self) -> OTelSdkResult {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        self.flush
            .send(done)
            .map_err(|_| OTelSdkError::AlreadyShutdown)?;
        wait.recv_timeout(self.timeout * 2)
            .map_err(|_| OTelSdkError::Timeout(self.timeout * 2))
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.force_flush()
    }
}
