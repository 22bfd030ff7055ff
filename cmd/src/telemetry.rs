//! Trace export for `hostd serve`: the `[trace]` options ([`TraceOptions`], off unless an OTLP
//! endpoint is given), the OpenTelemetry pipeline they build (a ratio sampler that follows a
//! caller's sampled flag, the resource naming this Host, the OTLP/gRPC exporter of the
//! `opentelemetry-otlp` crate behind the bounded [`queue::DroppingQueue`]), and the layer that
//! turns the process's `tracing` spans into exported spans. A slow or absent collector costs
//! dropped spans, counted for `/metrics`, never a slower command. This module writes no
//! exporter and owns no span: the crates that do the work name their spans.

pub mod log_ids;
pub mod queue;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanExporter as _};
use serde::{Deserialize, Serialize};
use timing::duration_text;

use self::queue::{DroppingQueue, QueueOptions};

/// `[trace]`: OpenTelemetry trace export over OTLP/gRPC.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceOptions {
    /// The OTLP/gRPC collector (`http://host:4317`); no endpoint, no export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// The share of new traces recorded (0 to 1); a caller's sampled flag decides for its own.
    pub sampling_ratio: f64,
    /// `service.name` on every exported span.
    pub service_name: String,
    /// The most finished spans waiting for export; past it new ones are dropped and counted.
    pub queue_size: usize,
    /// The most spans in one export request.
    pub export_batch: usize,
    /// How long one export request may take before it is given up (its spans are dropped).
    #[serde(with = "duration_text")]
    pub export_timeout: Duration,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            otlp_endpoint: None,
            sampling_ratio: 1.0,
            service_name: "hostd".into(),
            queue_size: 4096,
            export_batch: 512,
            export_timeout: Duration::from_secs(5),
        }
    }
}

impl TraceOptions {
    /// Checks every bound; the message names the option.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            bail!("sampling_ratio must be between 0 and 1");
        }
        if self.service_name.trim().is_empty() || self.service_name.len() > 256 {
            bail!("service_name must be 1 to 256 characters");
        }
        if !(1..=1_000_000).contains(&self.queue_size) {
            bail!("queue_size must be between 1 and 1000000");
        }
        if !(1..=self.queue_size).contains(&self.export_batch) {
            bail!("export_batch must be between 1 and queue_size");
        }
        if self.export_timeout < Duration::from_millis(10)
            || self.export_timeout > Duration::from_secs(300)
        {
            bail!("export_timeout must be between 10ms and 5m");
        }
        if let Some(e) = &self.otlp_endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            bail!("otlp_endpoint must be an http:// or https:// URL");
        }
        Ok(())
    }
}

/// Spans the export queue dropped and exported; shared with `/metrics`.
#[derive(Debug, Default)]
pub struct ExportCounts {
    pub dropped: AtomicU64,
    pub exported: AtomicU64,
}

impl host::metrics::TraceExportSource for ExportCounts {
    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn exported(&self) -> u64 {
        self.exported.load(Ordering::Relaxed)
    }
}

/// The running export pipeline: its provider (to flush at exit) and its counts.
pub struct TraceExport {
    provider: SdkTracerProvider,
    pub counts: Arc<ExportCounts>,
}

impl TraceExport {
    /// Builds the pipeline; call inside the tokio runtime (the exporter's channel and the
    /// queue's task live on it). `None` when no endpoint is set.
    pub fn start(options: &TraceOptions, host_id: &str) -> Result<Option<TraceExport>> {
        let Some(endpoint) = &options.otlp_endpoint else {
            return Ok(None);
        };
        let resource = Resource::builder()
            .with_service_name(options.service_name.clone())
            .with_attribute(KeyValue::new("service.instance.id", host_id.to_owned()))
            .build();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(options.export_timeout)
            .build()
            .context("the OTLP exporter")?;
        // The queue owns the exporter from here on, so it learns the resource now.
        exporter.set_resource(&resource);
        let counts = Arc::new(ExportCounts::default());
        let queue = DroppingQueue::start(
            exporter,
            QueueOptions {
                capacity: options.queue_size,
                batch: options.export_batch,
                timeout: options.export_timeout,
            },
            counts.clone(),
        );
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                options.sampling_ratio,
            ))))
            .with_resource(resource)
            .build();
        Ok(Some(TraceExport { provider, counts }))
    }

    /// The tracer the `tracing` layer records into.
    pub fn tracer(&self) -> opentelemetry_sdk::trace::Tracer {
        self.provider.tracer("hostd")
    }

    /// Exports what is queued (bounded by the export timeout), then stops.
    pub fn shutdown(self) {
        let _ = self.provider.shutdown();
    }
}
