//! The OpenTelemetry trace export pipeline a Host process installs ([`TraceExport::start`]):
//! spans go through the bounded [`queue::DroppingQueue`] to the OTLP exporter of the
//! `opentelemetry-otlp` crate (gRPC, or HTTP with protobuf bodies: [`Protocol`]), sampled by a ratio that follows a caller's sampled flag, under
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

/// How spans travel to the collector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (a collector's port 4317).
    #[default]
    Grpc,
    /// OTLP/HTTP with protobuf bodies, `POST <endpoint>/v1/traces` (a collector's port 4318);
    /// plain `http://` only.
    HttpProtobuf,
}

/// The path OTLP/HTTP serves traces on.
pub const HTTP_TRACES_PATH: &str = "/v1/traces";

/// What the pipeline is built from (validated by whoever owns the options).
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConfig {
    /// The collector, `http://host:port`: for gRPC the service address, for HTTP the base
    /// that [`HTTP_TRACES_PATH`] is added to (unless the endpoint already ends with it).
    pub endpoint: String,
    pub protocol: Protocol,
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
    /// Names the Host generation on the exported resource once it is issued.
    pub incarnation: Incarnation,
}

/// Sets the Host generation on the resource spans are exported under (the generation is
/// issued when the Host starts, after the pipeline is built). Cloneable; cheap.
#[derive(Clone, Debug)]
pub struct Incarnation {
    service_name: String,
    instance: String,
    updates: tokio::sync::mpsc::UnboundedSender<Resource>,
}

impl Incarnation {
    /// From now on every export names `hostd.host.generation` = `generation` beside
    /// `service.name` and `service.instance.id` (spans still queued are exported with it
    /// too: they come from the same incarnation).
    pub fn set_generation(&self, generation: u64) {
        let _ = self.updates.send(resource(
            &self.service_name,
            &self.instance,
            Some(generation),
        ));
    }
}

/// The URL OTLP/HTTP traces are posted to: `endpoint` with [`HTTP_TRACES_PATH`] added, unless
/// it already ends with it.
pub fn http_traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with(HTTP_TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{HTTP_TRACES_PATH}")
    }
}

/// The resource spans are exported under.
fn resource(service_name: &str, instance: &str, generation: Option<u64>) -> Resource {
    let mut builder = Resource::builder()
        .with_service_name(service_name.to_owned())
        .with_attribute(KeyValue::new("service.instance.id", instance.to_owned()));
    if let Some(g) = generation {
        builder = builder.with_attribute(KeyValue::new(
            "hostd.host.generation",
            i64::try_from(g).unwrap_or(i64::MAX),
        ));
    }
    builder.build()
}

impl TraceExport {
    /// Builds the pipeline; call inside a tokio runtime (the exporter's channel and the
    /// queue's task live on it).
    pub fn start(config: &ExportConfig) -> Result<TraceExport, ExportError> {
        let resource = resource(&config.service_name, &config.instance, None);
        let built = match config.protocol {
            Protocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .with_timeout(config.export_timeout)
                .build(),
            Protocol::HttpProtobuf => opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(http_traces_url(&config.endpoint))
                .with_timeout(config.export_timeout)
                .build(),
        };
        let mut exporter = built.map_err(|e| ExportError(e.to_string()))?;
        // The queue owns the exporter from here on, so it learns the resource now.
        exporter.set_resource(&resource);
        let counts = Arc::new(ExportCounts::default());
        let (updates, resources) = tokio::sync::mpsc::unbounded_channel();
        let incarnation = Incarnation {
            service_name: config.service_name.clone(),
            instance: config.instance.clone(),
            updates,
        };
        let queue = DroppingQueue::start(
            exporter,
            resources,
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
        Ok(TraceExport {
            provider,
            counts,
            incarnation,
        })
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

#[cfg(test)]
mod tests {
    use super::http_traces_url;

    #[test]
    fn the_http_traces_path_is_added_to_a_base_endpoint_once() {
        assert_eq!(http_traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(http_traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            http_traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(http_traces_url("http://c/otel"), "http://c/otel/v1/traces");
    }
}
