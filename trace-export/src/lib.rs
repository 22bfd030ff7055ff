//! The OpenTelemetry trace export pipeline a Host process installs ([`TraceExport::start`]):
//! spans go through the bounded [`queue::DroppingQueue`] to the OTLP/gRPC exporter of the
//! `opentelemetry-otlp` crate, sampled by a ratio that follows a caller's sampled flag, under
//! a resource naming the service and the Host. A slow or absent collector costs dropped
//! spans, counted in [`ExportCounts`], never a slower command. This crate writes no exporter,
//! owns no option parsing (the binary's config does) and installs no subscriber.

#![forbid(unsafe_code)]

pub mod queue;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanExporter as _};

use self::queue::{DroppingQueue, QueueOptions};

/// What the pipeline is built from (validated by whoever owns the options).
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConfig {
    /// The OTLP/gRPC collector, `http://host:port`.
    pub endpoint: String,
    /// The share of new traces recorded (0 to 1).
    pub sampling_ratio: f64,
    /// `service.name`.
    pub service_name: String,
    /// `service.instance.id`: the host id.
    pub instance: String,
    /// The most finished spans waiting for export.
    pub queue_size: usize,
    /// The most spans in one export request.
    pub export_batch: usize,
    /// How long one export request may take.
    pub export_timeout: Duration,
}

/// Why the pipeline could not be built.
#[derive(Debug, thiserror::Error)]
#[error("the OTLP exporter: {0}")]
pub struct ExportError(String);

impl ExportError {
    pub fn code(&self) -> &'static str {
        "trace_export"
    }
}

/// Spans the export queue dropped and exported.
#[derive(Debug, Default)]
pub struct ExportCounts {
    pub(crate) dropped: AtomicU64,
    pub(crate) exported: AtomicU64,
}

impl ExportCounts {
    /// Finished spans given up: the queue was full, or their export failed or timed out.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Finished spans a collector accepted.
    pub fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }
}

/// The running export pipeline: its provider (to flush at exit) and its counts.
pub struct TraceExport {
    provider: SdkTracerProvider,
    pub counts: Arc<ExportCounts>,
}

impl TraceExport {
    /// Builds the pipeline; call inside a tokio runtime (the exporter's channel and the
    /// queue's task live on it).
    pub fn start(config: &ExportConfig) -> Result<TraceExport, ExportError> {
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new(
                "service.instance.id",
                config.instance.clone(),
            ))
            .build();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(config.endpoint.clone())
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| ExportError(e.to_string()))?;
        // The queue owns the exporter from here on, so it learns the resource now.
        exporter.set_resource(&resource);
        let counts = Arc::new(ExportCounts::default());
        let queue = DroppingQueue::start(
            exporter,
            QueueOptions {
                capacity: config.queue_size,
                batch: config.export_batch,
                timeout: config.export_timeout,
            },
            counts.clone(),
        );
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sampling_ratio,
            ))))
            .with_resource(resource)
            .build();
        Ok(TraceExport { provider, counts })
    }

    /// The tracer a `tracing` layer records into.
    pub fn tracer(&self) -> opentelemetry_sdk::trace::Tracer {
        self.provider.tracer("hostd")
    }

    /// Exports what is queued (bounded by the export timeout), then stops. Call outside the
    /// runtime's tasks: it waits for the exporting task.
    pub fn shutdown(self) {
        let _ = self.provider.shutdown();
    }
}
