//! Trace export for `hostd serve`: the `[trace]` options ([`TraceOptions`], off unless an OTLP
//! endpoint is given), the OpenTelemetry pipeline they build (a ratio sampler that follows a
//! caller's sampled flag, the resource naming this Host, the OTLP exporter of the
//! `opentelemetry-otlp` crate, over gRPC or HTTP/protobuf, behind the bounded queue of the
//! `trace-export` crate), and the
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

/// The OTLP transport (`[trace] otlp_protocol`, `--otlp-protocol`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP/gRPC: the endpoint is the collector's gRPC address (`http://host:4317`).
    #[default]
    #[serde(rename = "grpc")]
    #[value(name = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies: spans are posted to `<endpoint>/v1/traces`
    /// (`http://host:4318`).
    #[serde(rename = "http/protobuf", alias = "http-protobuf")]
    #[value(name = "http/protobuf", alias = "http-protobuf")]
    HttpProtobuf,
}

/// `[trace]`: OpenTelemetry trace export over OTLP (gRPC or HTTP/protobuf).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TraceOptions {
    /// The OTLP collector (`http://host:4317` for gRPC, `http://host:4318` for
    /// HTTP/protobuf); no endpoint, no export.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// How spans travel to the collector.
    pub otlp_protocol: OtlpProtocol,
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
            otlp_protocol: OtlpProtocol::Grpc,
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
            && !e.starts_with("http://")
        {
            // Neither exporter is built with a TLS client: an https:// endpoint would fail at
            // every export, so it is refused at start instead.
            bail!(
                "otlp_endpoint must be an http:// URL (the exporter has no TLS client; send to a collector agent beside the Host)"
            );
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
        protocol: match options.otlp_protocol {
            OtlpProtocol::Grpc => trace_export::Protocol::Grpc,
            OtlpProtocol::HttpProtobuf => trace_export::Protocol::HttpProtobuf,
        },
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

#[cfg(test)]
mod tests {
    use super::{OtlpProtocol, TraceOptions};

    fn with_endpoint(endpoint: &str) -> TraceOptions {
        TraceOptions {
            otlp_endpoint: Some(endpoint.into()),
            ..TraceOptions::default()
        }
    }

    #[test]
    fn an_https_endpoint_is_refused_at_start_since_no_exporter_has_a_tls_client() {
        let e = with_endpoint("https://collector:4317")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("http://"), "{e}");
        with_endpoint("http://collector:4317").validate().unwrap();
    }

    #[test]
    fn the_protocol_reads_as_the_opentelemetry_spelling_in_a_file() {
        let o: TraceOptions = toml::from_str("otlp_protocol = \"http/protobuf\"").unwrap();
        assert_eq!(o.otlp_protocol, OtlpProtocol::HttpProtobuf);
        let o: TraceOptions = toml::from_str("").unwrap();
        assert_eq!(o.otlp_protocol, OtlpProtocol::Grpc);
        assert!(toml::from_str::<TraceOptions>("otlp_protocol = \"udp\"").is_err());
    }
}
