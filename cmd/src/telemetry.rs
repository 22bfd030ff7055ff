//! Trace export for `hostd serve`: the `[trace]` options ([`TraceOptions`], off unless an OTLP
//! endpoint is given), the OpenTelemetry pipeline they build (a ratio sampler that follows a
//! caller's sampled flag, the resource naming this Host, the OTLP/gRPC exporter of the
//! `opentelemetry-otlp` crate behind the bounded queue of the `trace-export` crate), and the
//! format that puts trace ids on log lines. A slow or absent collector costs
//! dropped spans, counted for `/metrics`, never a slower command. This module writes no
//! exporter and owns no span: the crates that do the work name their spans.

pub mod log_ids;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use timing::duration_text;
use trace_export::ExportConfig;
pub use trace_export::TraceExport;

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

/// `/metrics` reads the pipeline's own counts.
pub struct ExportSeries(pub Arc<trace_export::ExportCounts>);

impl host::metrics::TraceExportSource for ExportSeries {
    fn dropped(&self) -> u64 {
        self.0.dropped()
    }

    fn exported(&self) -> u64 {
        self.0.exported()
    }
}

/// Starts the export pipeline `options` describe for the Host `host_id`; `None` when no
/// endpoint is set. Call inside the tokio runtime.
pub fn start(options: &TraceOptions, host_id: &str) -> Result<Option<TraceExport>> {
    let Some(endpoint) = &options.otlp_endpoint else {
        return Ok(None);
    };
    let export = TraceExport::start(&ExportConfig {
        endpoint: endpoint.clone(),
        sampling_ratio: options.sampling_ratio,
        service_name: options.service_name.clone(),
        instance: host_id.to_owned(),
        queue_size: options.queue_size,
        export_batch: options.export_batch,
        export_timeout: options.export_timeout,
    })
    .map_err(|e| anyhow::anyhow!("{e} [{}]", e.code()))?;
    Ok(Some(export))
}
