//! The Host's own Prometheus registry. Owns every series name and help text (named here once)
//! and the rendering of `/metrics`; nothing else registers a series. Never exports process or
//! controller series: only this Host's local state.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

pub const SESSIONS: &str = "host_sessions";
pub const SESSIONS_GATE_WAITING: &str = "host_sessions_gate_waiting";
pub const SESSIONS_COMMAND_BLOCKED: &str = "host_sessions_command_blocked";
pub const ADMISSION_WEIGHT_CONSUMED: &str = "host_admission_weight_consumed";
pub const ADMISSION_WEIGHT_CAPACITY: &str = "host_admission_weight_capacity";
pub const COMMAND_LAG: &str = "host_command_lag";
pub const COMMAND_QUEUE_DEPTH: &str = "host_command_queue_depth";
pub const RELEASE_FAILURES: &str = "host_release_failures_total";
pub const ATTACH_SECONDS: &str = "host_attach_seconds";
pub const COMMAND_APPLY_SECONDS: &str = "host_command_apply_seconds";

/// The residency states `host_sessions` is labelled with.
pub const SESSION_STATES: [&str; 3] = ["attaching", "resident", "releasing"];

/// The Host's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub sessions: IntGaugeVec,
    pub gate_waiting: IntGauge,
    pub command_blocked: IntGauge,
    pub weight_consumed: IntGauge,
    pub weight_capacity: IntGauge,
    pub command_lag: IntGauge,
    pub queue_depth: IntGauge,
    pub release_failures: IntCounter,
    pub attach_seconds: HistogramVec,
    pub apply_seconds: HistogramVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Registering a fixed, distinct set of series into a fresh registry cannot collide; should a
/// future edit make it do so, the error names the series.
#[derive(Debug, thiserror::Error)]
#[error("metrics registry: {0}")]
pub struct MetricsError(String);

fn reg<T: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    c: T,
) -> Result<T, MetricsError> {
    r.register(Box::new(c.clone()))
        .map_err(|e| MetricsError(e.to_string()))?;
    Ok(c)
}

fn m<T>(r: prometheus::Result<T>) -> Result<T, MetricsError> {
    r.map_err(|e| MetricsError(e.to_string()))
}

impl Metrics {
    /// A fresh registry with every series at zero.
    pub fn new() -> Result<Metrics, MetricsError> {
        let r = Registry::new();
        let sessions = reg(
            &r,
            m(IntGaugeVec::new(
                Opts::new(SESSIONS, "Sessions on this Host by residency state."),
                &["state"],
            ))?,
        )?;
        for s in SESSION_STATES {
            sessions.with_label_values(&[s]).set(0);
        }
        let latency = vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        Ok(Metrics {
            sessions,
            gate_waiting: reg(
                &r,
                m(IntGauge::new(
                    SESSIONS_GATE_WAITING,
                    "Resident sessions parked at one or more open gates.",
                ))?,
            )?,
            command_blocked: reg(
                &r,
                m(IntGauge::new(
                    SESSIONS_COMMAND_BLOCKED,
                    "Resident sessions whose next command cannot progress on this Host (non-zero is a fault to look at).",
                ))?,
            )?,
            weight_consumed: reg(
                &r,
                m(IntGauge::new(
                    ADMISSION_WEIGHT_CONSUMED,
                    "Admission weight held by resident and attaching sessions.",
                ))?,
            )?,
            weight_capacity: reg(
                &r,
                m(IntGauge::new(
                    ADMISSION_WEIGHT_CAPACITY,
                    "Admission weight this Host offers.",
                ))?,
            )?,
            command_lag: reg(
                &r,
                m(IntGauge::new(
                    COMMAND_LAG,
                    "Commands admitted to resident sessions and not yet consumed, as of each session's last pass.",
                ))?,
            )?,
            queue_depth: reg(
                &r,
                m(IntGauge::new(
                    COMMAND_QUEUE_DEPTH,
                    "Wake-ups queued for resident sessions' command consumers.",
                ))?,
            )?,
            release_failures: reg(
                &r,
                m(IntCounter::new(
                    RELEASE_FAILURES,
                    "Releases (warm or drain) whose runtime release was refused or failed.",
                ))?,
            )?,
            attach_seconds: reg(
                &r,
                m(HistogramVec::new(
                    HistogramOpts::new(ATTACH_SECONDS, "Attach latency, by launch mode.")
                        .buckets(latency.clone()),
                    &["mode"],
                ))?,
            )?,
            apply_seconds: reg(
                &r,
                m(HistogramVec::new(
                    HistogramOpts::new(
                        COMMAND_APPLY_SECONDS,
                        "Command application latency (claim to cursor), by kind.",
                    )
                    .buckets(latency),
                    &["kind"],
                ))?,
            )?,
            registry: r,
        })
    }

    /// The text exposition of this registry.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if encoder.encode(&self.registry.gather(), &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// The content type of [`Metrics::render`].
    pub fn content_type(&self) -> String {
        TextEncoder::new().format_type().to_owned()
    }
}
