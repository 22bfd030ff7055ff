//! Run hosting's series, registered into the Host's own registry (so `/metrics` renders them
//! beside the Host's). Owns every run series name and help text; nothing else names them.

use host::metrics::{Metrics, MetricsError};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts};

pub const RUNS_DRIVING: &str = "host_runs_driving";
pub const RUNS_ENDED: &str = "host_runs_ended_total";
pub const RUN_STEP_SECONDS: &str = "host_run_step_seconds";

/// The run hosting series.
#[derive(Clone)]
pub struct RunMetrics {
    pub driving: IntGauge,
    pub ended: IntCounterVec,
    pub step_seconds: HistogramVec,
}

fn m<T>(r: prometheus::Result<T>) -> Result<T, MetricsError> {
    r.map_err(|e| MetricsError(e.to_string()))
}

impl RunMetrics {
    /// Registers the run hosting series in `metrics` (once per registry).
    pub fn register(metrics: &Metrics) -> Result<RunMetrics, MetricsError> {
        Ok(RunMetrics {
            driving: metrics.register(m(IntGauge::new(
                RUNS_DRIVING,
                "Workflow runs this Host drives now (running, parked included).",
            ))?)?,
            ended: metrics.register(m(IntCounterVec::new(
                Opts::new(
                    RUNS_ENDED,
                    "Run drivers that ended on this Host, by how: completed, failed, needs_attention, cancelled, fenced, stopped, error.",
                ),
                &["state"],
            ))?)?,
            step_seconds: metrics.register(m(HistogramVec::new(
                HistogramOpts::new(
                    RUN_STEP_SECONDS,
                    "Run step latency (start to journaled result or park), by step kind.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0,
                ]),
                &["kind"],
            ))?)?,
        })
    }
}
